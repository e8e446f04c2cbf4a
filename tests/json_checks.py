"""Checks shared by the any-JSON and the schema-hole tests: an independent viable-prefix
oracle for compact JSON under the regex backend's lexical rules (the same rules json_any.py's
pushdown automaton implements), and a random walk through a matcher's masks."""

from __future__ import annotations

import random

import numpy as np

__all__ = ["Oracle", "allowed_ids", "live_states", "random_walk"]

_CLOSING = (b"}", b"]", b'"', b",", b"0")


def live_states(fsm) -> set:
    """The states of an interegular FSM from which a final state can still be reached."""
    rev: dict = {}
    for s, edges in fsm.map.items():
        for t in edges.values():
            rev.setdefault(t, set()).add(s)
    live, todo = set(fsm.finals), list(fsm.finals)
    while todo:
        for p in rev.get(todo.pop(), ()):
            if p not in live:
                live.add(p)
                todo.append(p)
    return live


def allowed_ids(row: np.ndarray) -> set[int]:
    """Token ids set in an int32 bitmask row."""
    return set(np.flatnonzero(np.unpackbits(np.ascontiguousarray(row).view(np.uint8), bitorder="little")).tolist())


def random_walk(m, bitmask, table: list, eos: int, rng: random.Random, *, steps: int, stop_p: float,
                free_steps: int, steer_after: int) -> bytes:
    """Sample allowed tokens from a fresh matcher ``m`` until it takes EOS (taken with chance
    ``stop_p`` while allowed in the first ``free_steps`` steps, always after; past
    ``steer_after`` closing tokens are preferred) or ``steps`` run out; returns the text.
    Every step: the mask is not empty (no dead end), a token outside it is refused and
    changes nothing, and the sampled one is accepted."""
    out = b""
    refusable = [i for i in range(3, len(table), 97) if table[i]]
    for step in range(steps):
        m.fill_next_token_bitmask(bitmask, 0)
        allowed_set = allowed_ids(bitmask[0].numpy())
        allowed = sorted(allowed_set)
        assert allowed, out
        if eos in allowed_set and rng.random() < (stop_p if step < free_steps else 1.0):
            tok = eos
        else:
            pick = allowed
            if step > steer_after:
                pick = [a for a in allowed if a != eos and table[a][:1] in _CLOSING] or allowed
            tok = rng.choice(pick)
        banned = rng.choice([i for i in refusable if i not in allowed_set])
        before = m.state
        assert not m.accept_token(banned) and m.state == before, (out, table[banned])
        assert m.accept_token(tok), (out, table[tok])
        if tok == eos:
            break
        out += table[tok]
    return out


class Oracle:
    """Viable-prefix check for compact JSON under the regex backend's lexical rules, written
    as a plain recursive-descent-style state machine over bytes (independent of the tables)."""

    HEX = set(b"0123456789abcdefABCDEF")

    def __init__(self, root: str) -> None:
        self.stack: list[str] = []  # "{" / "["
        self.mode = {"value": "value", "object": "root{", "array": "root["}[root]
        self.buf = b""  # bytes of the token being lexed (number, literal, escape, UTF-8)
        self.key = False  # the current string is a key

    def copy(self) -> Oracle:
        o = Oracle.__new__(Oracle)
        o.stack, o.mode, o.buf, o.key = list(self.stack), self.mode, self.buf, self.key
        return o

    def feed(self, data: bytes) -> bool:
        for b in data:
            if not self._byte(b):
                return False
        return True

    def final(self) -> bool:
        return not self.stack and (self.mode == "done" or (self.mode == "number" and self._number_ok(self.buf)))

    @staticmethod
    def _number_ok(t: bytes) -> bool:
        import re
        return re.fullmatch(rb"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?", t) is not None

    @staticmethod
    def _number_prefix(t: bytes) -> bool:
        import re
        return re.fullmatch(rb"-?((0|[1-9][0-9]{0,15})((\.[0-9]{0,16})|(\.[0-9]{1,16})?([eE]([+-]?[0-9]{0,3})?)?)?)?",
                            t) is not None

    def _end_value(self) -> None:
        self.mode, self.buf = ("after" if self.stack else "done"), b""

    def _byte(self, b: int) -> bool:
        c = bytes([b])
        m = self.mode
        if m == "number":
            if self._number_prefix(self.buf + c):
                self.buf += c
                return True
            if not self._number_ok(self.buf):
                return False
            self._end_value()
            return self._byte(b)
        if m == "literal":
            self.buf += c
            if any(w.startswith(self.buf) for w in (b"true", b"false", b"null")):
                if self.buf in (b"true", b"false", b"null"):
                    self._end_value()
                return True
            return False
        if m in ("root{", "root["):
            if c != m[4:].encode():
                return False
            return self._open(c)
        if m in ("value", "first["):
            if m == "first[" and c == b"]":
                return self._close(c)
            if c in b"{[":
                return self._open(c)
            if c == b'"':
                self.mode, self.key = "string", False
                return True
            if c == b"-" or c.isdigit():
                self.mode, self.buf = "number", b""
                return self._byte(b)
            if c in b"tfn":
                self.mode, self.buf = "literal", c
                return True
            return False
        if m in ("first{", "key"):
            if c == b'"':
                self.mode, self.key = "string", True
                return True
            return m == "first{" and c == b"}" and self._close(c)
        if m == "colon":
            if c == b":":
                self.mode = "value"
                return True
            return False
        if m == "after":
            top = self.stack[-1]
            if c == b",":
                self.mode = "key" if top == "{" else "value"
                return True
            return c in b"}]" and self._close(c)
        if m == "done":
            return False
        if m == "string":
            return self._string(b)
        raise AssertionError(m)

    def _open(self, c: bytes) -> bool:
        self.stack.append(c.decode())
        self.mode = "first{" if c == b"{" else "first["
        return True

    def _close(self, c: bytes) -> bool:
        if not self.stack or {"}": "{", "]": "["}[c.decode()] != self.stack[-1]:
            return False
        self.stack.pop()
        self._end_value()
        return True

    def _string(self, b: int) -> bool:
        buf = self.buf + bytes([b])
        if not self.buf:
            if b == 0x22:
                self.mode = "colon" if self.key else ("after" if self.stack else "done")
                return True
            if b == 0x5C or b >= 0x80:
                self.buf = buf
                return self._partial_ok(buf)
            return b >= 0x20
        self.buf = buf
        if not self._partial_ok(buf):
            return False
        if self._complete(buf):
            self.buf = b""
        return True

    def _partial_ok(self, buf: bytes) -> bool:
        if buf[0] == 0x5C:
            esc = buf[1:]
            if not esc:
                return True
            if esc[:1] in [bytes([x]) for x in b'"\\/bfnrt']:
                return len(esc) == 1
            if esc[:1] != b"u" or self.key:
                return False
            hexes = esc[1:5]
            if not all(h in self.HEX for h in hexes):
                return False
            if len(hexes) >= 2 and hexes[:1] in (b"d", b"D"):
                if hexes[1] in b"01234567":
                    return len(esc) <= 5
                if hexes[1] not in b"89abAB":  # a lone low surrogate
                    return False
                if len(esc) <= 5:
                    return True
                low = esc[5:]  # \uDxxx must be followed by \uDC00-\uDFFF
                want = [b"\\", b"u", b"dD", b"cdefCDEF", None, None]
                for i, ch in enumerate(low):
                    w = want[i]
                    if w is None:
                        if ch not in self.HEX:
                            return False
                    elif bytes([ch]) not in [bytes([x]) for x in w]:
                        return False
                return len(low) <= 6
            return len(esc) <= 5
        try:  # a UTF-8 sequence: some completion must decode
            buf.decode("utf-8")
            return True
        except UnicodeDecodeError as e:
            return e.reason == "unexpected end of data"

    def _complete(self, buf: bytes) -> bool:
        if buf[0] == 0x5C:
            esc = buf[1:]
            if len(esc) == 1 and esc != b"u":
                return True
            if len(esc) == 5:
                return not (esc[1:2] in (b"d", b"D") and esc[2:3] in [bytes([x]) for x in b"89abAB"])
            return len(esc) == 11
        try:
            buf.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False
