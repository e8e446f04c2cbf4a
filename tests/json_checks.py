"""Checks shared by the any-JSON, schema-hole and EBNF tests: an independent viable-prefix
oracle for compact JSON under the regex backend's lexical rules (the same rules json_any.py's
pushdown automaton implements), one for regexes with holes and calls (``HoleOracle``), and a
random walk through a matcher's masks."""

from __future__ import annotations

import functools
import random

import interegular
import numpy as np
from interegular.fsm import anything_else

from treadle.constrained.index.json_holes import CALL_CHARS, CANARY_CHAR, ENTRY_CHAR, HOLE_CHARS, KINDS

__all__ = ["BYTE_TOKENS", "HoleOracle", "Oracle", "accepted_ids", "allowed_ids", "byte_walks", "compiled_walks",
           "live_states", "random_walk"]

_CLOSING = (b"}", b"]", b'"', b",", b"0")


def _byte_tokens():
    from treadle.constrained.index.lazy_index import TokenArrays
    return TokenArrays({b: bytes([b]) for b in range(256)})


BYTE_TOKENS = _byte_tokens()  # a vocabulary of the 256 single bytes


def byte_walks(regex: str, n: int, *, seed: int = 0, steps: int = 400, stop_p: float = 0.3,
               by_state: bool = False) -> list[bytes | None]:
    """n random walks of ``regex``'s automaton over single bytes (``BYTE_TOKENS``): each stops at
    an accepting state with probability stop_p, or where nothing can follow; None for a walk
    that reaches a dead end or runs `steps` bytes without ending in an accepting state. With
    ``by_state`` each step first picks one of the states the allowed bytes lead to, then a byte
    leading there (as ``sample_regex`` picks an edge of interegular's DFA: a '1' beside the
    many bytes that open a string is as likely as the string)."""
    from treadle.constrained.index.lazy_index import LazyIndex, build_nfa

    index = LazyIndex(build_nfa(regex), BYTE_TOKENS)
    rng, out = random.Random(seed), []
    for _ in range(n):
        s, text, ended = index.get_initial_state(), bytearray(), None
        for _ in range(steps):
            allowed = [int(t) for t in index.get_allowed_tokens(s)]
            if index.is_final_state(s) and (not allowed or rng.random() < stop_p):
                ended = bytes(text)
                break
            if not allowed:
                break
            if by_state:
                targets: dict = {}
                for b in allowed:
                    targets.setdefault(index.get_next_state(s, b), []).append(b)
                allowed = targets[rng.choice(list(targets))]
            text.append(rng.choice(allowed))
            s = index.get_next_state(s, text[-1])
        out.append(ended)
    return out


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


def accepted_ids(oracle, table: list, skip: tuple = ()) -> set[int]:
    """The ids ``i`` (not in ``skip``) whose non-empty bytes ``table[i]`` ``oracle`` (an
    ``Oracle`` or a ``HoleOracle``) can read from its state: exactly
    ``{i for i, tb in enumerate(table) if tb and i not in skip and oracle.copy().feed(tb)}``,
    since ``feed`` reads its bytes one at a time and fails at the first it cannot take. Here
    each distinct byte prefix of the vocabulary is fed once, on a copy of its parent prefix's
    state (a trie walk), so tokens that share a prefix share its work and every token under a
    dead prefix is refused without feeding. ``oracle`` itself is left as it was."""
    memo: dict[bytes, object] = {b"": oracle}  # prefix -> state after it, None where it died
    out = set()
    for i, tb in enumerate(table):
        if not tb or i in skip:
            continue
        k = len(tb)
        while tb[:k] not in memo:
            k -= 1
        state = memo[tb[:k]]
        while state is not None and k < len(tb):
            state = state.copy()
            if not state.feed(tb[k:k + 1]):
                state = None
            k += 1
            memo[tb[:k]] = state
        if state is not None:
            out.add(i)
    return out


_closing_tables: list = [None, None]  # the last table random_walk walked, and which of its ids start with a closer


def random_walk(m, bitmask, table: list, eos: int, rng: random.Random, *, steps: int, stop_p: float,
                free_steps: int, steer_after: int) -> bytes:
    """Sample allowed tokens from a fresh matcher ``m`` until it takes EOS (taken with chance
    ``stop_p`` while allowed in the first ``free_steps`` steps, always after; past
    ``steer_after`` closing tokens are preferred) or ``steps`` run out; returns the text.
    Every step: the mask is not empty (no dead end), a token outside it is refused and
    changes nothing, and the sampled one is accepted."""
    out = b""
    refusable = [i for i in range(3, len(table), 97) if table[i]]
    if _closing_tables[0] is not table:  # which ids start with a closer: once per table
        _closing_tables[:] = [table, np.array([bool(tb) and tb[:1] in _CLOSING for tb in table] + [False], dtype=bool)]
    closing = _closing_tables[1]
    for step in range(steps):
        m.fill_next_token_bitmask(bitmask, 0)
        # allowed_ids' ids, kept as numpy's sorted array too (the steer below selects on it)
        ids = np.flatnonzero(np.unpackbits(np.ascontiguousarray(bitmask[0].numpy()).view(np.uint8),
                                           bitorder="little"))
        allowed = ids.tolist()
        allowed_set = set(allowed)
        assert allowed, out
        if eos in allowed_set and rng.random() < (stop_p if step < free_steps else 1.0):
            tok = eos
        else:
            pick = allowed
            if step > steer_after:
                near = ids[closing[np.minimum(ids, len(table))]]
                pick = near[near != eos].tolist() or allowed
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
        return re.fullmatch(rb"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,2})?", t) is not None

    @staticmethod
    def _number_prefix(t: bytes) -> bool:
        import re
        return re.fullmatch(rb"-?((0|[1-9][0-9]{0,15})((\.[0-9]{0,16})|(\.[0-9]{1,16})?([eE]([+-]?[0-9]{0,2})?)?)?)?",
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


class HoleOracle:
    """Viable-prefix NFA for a regex with holes and calls, independent of json_holes.py's
    walk: the regex runs on interegular's character DFA (bytes gathered into characters), a
    hole starts wherever the DFA can take its placeholder (and not the canary, which only a
    character class takes) and runs on ``Oracle``; a hole may end at any byte where its value
    is complete. A call placeholder pushes the state after it and goes, without reading, to
    where the DFA is after the entry and that call's placeholder (its definition's branch);
    where the definition's text is complete the call may return, also without reading.
    Configurations: (DFA state, pending bytes of a character, Oracle or None, return states)."""

    def __init__(self, regex: str) -> None:
        self.fsm, self.live, self.entries, self.memo = _hole_automaton(regex)
        self.configs = [(self.fsm.initial, b"", None, ())]

    @classmethod
    def _automaton(cls, regex: str) -> tuple:
        fsm = interegular.parse_pattern(regex).to_fsm()
        o = cls.__new__(cls)
        o.fsm, o.live, o.memo = fsm, live_states(fsm), {}
        e = o._step(fsm.initial, ENTRY_CHAR)
        return fsm, o.live, {c: o._step(e, c) if e is not None else None for c in CALL_CHARS}, o.memo

    def _sym(self, ch: str):
        return self.fsm.alphabet[ch] if ch in self.fsm.alphabet else self.fsm.alphabet[anything_else]

    def _step(self, q, ch: str):
        # memoized per automaton (``self.memo``, shared by every oracle of the regex): the DFA
        # never changes, and the same steps are taken millions of times
        key = (q, ch)
        try:
            return self.memo[key]
        except KeyError:
            pass
        t = self.fsm.map.get(q, {}).get(self._sym(ch))
        t = self.memo[key] = t if t in self.live else None
        return t

    def _some_char_starts(self, q, buf: bytes) -> bool:
        """Whether the DFA takes some character whose UTF-8 starts with ``buf`` (the characters
        the regex does not name share one symbol: those exist for any valid prefix). Never
        one of U+100000-U+10FFFF (lead byte 0xF4), which regex grammars never write."""
        if buf[0] == 0xF4:
            return False
        edges = self.fsm.map.get(q, {})
        if edges.get(self.fsm.alphabet[anything_else]) in self.live:
            return True
        return any(ch is not anything_else and ch.encode().startswith(buf) and self._real_step(q, ch) is not None
                   for ch in self.fsm.alphabet)

    def _real_step(self, q, ch: str):
        """A step on a character of the output: never a placeholder or marker (U+100000 on:
        regex grammars never write those, index_markers.py)."""
        if ord(ch) >= 0x100000:
            return None
        return self._step(q, ch)

    def _holes_at(self, q):
        key = ("holes", q)
        if key not in self.memo:
            self.memo[key] = [] if self._step(q, CANARY_CHAR) is not None else [
                (k, a) for k in KINDS if (a := self._step(q, HOLE_CHARS[k])) is not None]
        return self.memo[key]

    def _expand(self, q, calls) -> list:
        """(q, calls) and what calls and returns reach from it without reading."""
        out, todo, seen = [], [(q, calls)], set()
        while todo:
            q, calls = todo.pop()
            if (q, calls) in seen:
                continue
            seen.add((q, calls))
            out.append((q, calls))
            if calls and q in self.fsm.finals:
                todo.append((calls[-1], calls[:-1]))
            if len(calls) < 64:
                for entry, a in self._calls_at(q):
                    todo.append((entry, (*calls, a)))
        return out

    def _calls_at(self, q) -> list:
        """(entry state, return state) of each call the DFA can take at ``q`` (none where the
        canary goes on: only a character class takes it); memoized like ``_step``."""
        key = ("calls", q)
        if key not in self.memo:
            self.memo[key] = [] if self._step(q, CANARY_CHAR) is not None else [
                (self.entries[c], a) for c in CALL_CHARS
                if (a := self._step(q, c)) is not None and self.entries[c] is not None]
        return self.memo[key]

    def _outer(self, q0, pend: bytes, b: int, calls0, out: list) -> None:
        for q, calls in self._expand(q0, calls0) if not pend else [(q0, calls0)]:
            buf = pend + bytes([b])
            try:
                ch = buf.decode("utf-8")
                t = self._real_step(q, ch)
                if t is not None:
                    out.append((t, b"", None, calls))
            except UnicodeDecodeError as e:
                if e.reason == "unexpected end of data" and self._some_char_starts(q, buf):
                    out.append((q, buf, None, calls))
            if not pend:
                for kind, after in self._holes_at(q):
                    o = Oracle(kind)
                    if o.feed(bytes([b])):
                        out.append((after, b"", o, calls))

    def feed(self, data: bytes) -> bool:
        configs = self.configs
        for b in data:
            nxt: list = []
            for q, pend, o, calls in configs:
                if o is None:
                    self._outer(q, pend, b, calls, nxt)
                    continue
                o2 = o.copy()
                if o2.feed(bytes([b])):
                    nxt.append((q, b"", o2, calls))
                if o.final():
                    self._outer(q, b"", b, calls, nxt)
            configs = list(dict.fromkeys(nxt))  # an ambiguous grammar reaches one reading many ways
            if not configs:
                self.configs = []
                return False
        self.configs = configs
        return True

    def final(self) -> bool:
        return any(not pend and (o is None or o.final()) and any(q in self.fsm.finals and not c for q, c in
                                                                  self._expand(q0, calls))
                   for q0, pend, o, calls in self.configs)

    def copy(self) -> HoleOracle:
        c = HoleOracle.__new__(HoleOracle)
        c.fsm, c.live, c.entries, c.memo, c.configs = self.fsm, self.live, self.entries, self.memo, list(self.configs)
        return c


@functools.lru_cache(maxsize=64)
def _hole_automaton(regex: str) -> tuple:
    """A HoleOracle's DFA of ``regex``, its live states, its calls' entry states and the memo of
    its steps: built once per regex (tests build an oracle per string they check); the memo only
    records what the DFA gives, no oracle changes the rest."""
    return HoleOracle._automaton(regex)


_walk_tables: list = [None, None, None]  # the last FSM sample_regex walked, its live states, its keys' chars


def sample_regex(fsm, rng: random.Random, *, steps: int = 400, stop_p: float = 0.3) -> str | None:
    """A random string of an interegular FSM (a walk over its live states, stopping at a final
    state with chance ``stop_p``, always once ``steps`` are spent and a final state is
    reached); None when the walk cannot finish. ``anything_else`` is written as a character
    the alphabet does not list."""
    if _walk_tables[0] is not fsm:  # callers walk one FSM many times: its tables once
        by_key: dict = {}
        for ch, key in fsm.alphabet.items():
            by_key.setdefault(key, []).append(ch)
        _walk_tables[:] = [fsm, live_states(fsm), by_key]
    live, by_key = _walk_tables[1], _walk_tables[2]
    if fsm.initial not in live:
        return None
    other = next(c for c in "é€ж~ 界" if c not in fsm.alphabet)
    state, out = fsm.initial, []
    for step in range(steps * 2):
        if state in fsm.finals and (rng.random() < stop_p or step >= steps):
            return "".join(out)
        edges = [(k, t) for k, t in fsm.map.get(state, {}).items() if t in live]
        if not edges:
            return "".join(out) if state in fsm.finals else None
        if step >= steps:  # head for a final state: prefer edges into one
            near = [e for e in edges if e[1] in fsm.finals]
            edges = near or edges
        key, state = rng.choice(edges)
        chars = by_key.get(key, [])
        ch = rng.choice(chars) if chars else other
        out.append(other if ch is anything_else else ch)
    return "".join(out) if state in fsm.finals else None


def compiled_walks(tokenizer, schema: dict, check, *, walks: int, steps: int, seed: int, timeout_s: float = 60) -> int:
    """Compile ``schema`` with treadle's ``GrammarCompiler`` on ``tokenizer`` and walk its
    grammar at random ``walks`` times (benchmarks/grammar_walks.py): every finished walk's
    text must parse and have no error under ``check`` (a jsonschema validator). Returns how
    many walks finished."""
    import json
    import os
    import sys

    from test_lazy_index import EOS, V

    from treadle.constrained import GrammarCompiler, GrammarSpec, allocate_token_bitmask

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from grammar_walks import random_text

    done = 0
    with GrammarCompiler(tokenizer, [EOS], vocab_size=V, timeout_s=timeout_s) as compiler:
        g = compiler.compile(GrammarSpec.from_params(json_schema=schema))
        bitmask = allocate_token_bitmask(1, V)
        rng = random.Random(seed)
        for _ in range(walks):
            text = random_text(g.matcher(), bitmask, g.token_bytes, EOS, rng, steps=steps)
            if text is not None:
                errors = list(check.iter_errors(json.loads(text)))
                assert not errors, (text[:300], errors[0].message)
                done += 1
    return done
