"""A token index built lazily: a regex's byte automaton, its token masks computed on demand.

outlines-core's ``Index`` walks every token of the vocabulary from every state of the regex's
DFA before the first token is generated: for a grammar of tens of thousands of positions
(a real Kubernetes or CloudFormation schema) that is tens of seconds and gigabytes, most of
it for states no output ever reaches. Here the compile step only parses the regex into a
byte-level Thompson NFA (linear in the regex, milliseconds to a second), and the rest
happens when a matcher gets somewhere:

* DFA states are sets of NFA states, made on demand (subset construction), one byte
  transition at a time, and memoised;
* a state's allowed tokens (``get_allowed_tokens``) are found by running the whole
  vocabulary through the DFA at once, in numpy, one byte column at a time: a state that
  loops on a set of bytes (inside a string, a run of digits) lets every token made only of
  those bytes stay where it is, which is decided per byte set once and shared by every
  state with that loop; the other tokens are walked byte by byte, the distinct
  (state, byte) pairs of a column computed in Python;
* NFA states from which the end cannot be reached are removed first, so every non-empty
  DFA state can still complete, and a token is allowed exactly when it leads to one.

The interface is the part of outlines-core's ``Index`` the matchers use
(``get_initial_state``, ``get_next_state``, ``get_allowed_tokens``, ``is_final_state``), with
the same meaning: the tests compare the two state by state over the whole vocabulary.

The regex dialect is what treadle's translators write (regex_text.py): literals, classes
with ranges and escapes, ``.``, ``(?:...)`` and plain groups, ``|``, ``? * +``, ``{m}``,
``{m,}``, ``{m,n}``, and the ordered-members node of the JSON-schema translator (members.py,
index_markers.py), built as a linear automaton: states A_k (nothing written yet, entries k..
left) and B_k (something written): A_k -eps-> A_k+1 for an optional entry, A_k -E_k-> B_k+1,
B_k -eps-> B_k+1 for an optional entry, B_k -sep E_k-> B_k+1; A_N accepts when the empty
sequence is allowed, B_N accepts. Each entry is built once (both ways in lead to it, and it
leads on to B_k+1 either way), where its spelt-out regex repeats it once per optional entry
before it. Anything else (``\\d \\w \\s`` and their Unicode meanings, anchors,
lookaround, flags, nested classes) raises ``LazyUnsupported``, and the compiler builds
outlines-core's index for that regex as before.

Importing this module does not import torch.
"""

from __future__ import annotations

import re
import sys
import threading
from array import array
from typing import Any

import numpy as np

from treadle.constrained.index.index_markers import (MEMBER_OPTIONAL, MEMBER_REQUIRED, MEMBERS_CLOSE, MEMBERS_OPEN,
                                               MEMBERS_OPEN_NONEMPTY)

__all__ = ["LazyIndex", "LazyIndexExhausted", "LazyNFA", "LazyUnsupported", "TokenArrays", "build_nfa", "nfa_of",
           "parse_regex"]

MAX_CODE = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


class LazyUnsupported(ValueError):
    """The regex uses a construct the lazy index does not read (the caller falls back)."""


# ---------------------------------------------------------------------------- parsing

# AST nodes: ("lit", ranges) a set of code points as sorted disjoint (lo, hi) ranges;
# ("seq", [nodes]); ("alt", [nodes]); ("rep", node, min, max or None);
# ("members", sep node, [(entry node, required)], allow_empty): ordered members (see above)

_STOPS = "|)" + MEMBER_REQUIRED + MEMBER_OPTIONAL + MEMBERS_CLOSE  # where a sequence ends

_SIMPLE_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07}


def _normalize(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE:
        out.append((nxt, MAX_CODE))
    return tuple(out)


# a run of characters that stand for themselves (atom's last case): none of the regex syntax,
# the ordered-members markers or the sequence stops
_PLAIN_RUN = re.compile("[^" + re.escape("\\()[.^$*+?{|" + MEMBERS_OPEN + MEMBERS_OPEN_NONEMPTY + _STOPS) + "]+")
# a class's body: escapes and other characters, up to the first unescaped ']'
_CLASS_BODY = re.compile(r"(?:[^\\\]]|\\.)*", re.DOTALL)
_CHAR_LITS: dict[str, tuple] = {}


def _char_lit(c: str) -> tuple:
    """The literal node of one character (shared: a long regex repeats few characters)."""
    node = _CHAR_LITS.get(c)
    if node is None:
        node = _CHAR_LITS[c] = ("lit", ((ord(c), ord(c)),))
    return node


# what the scan for matching parentheses skips: escapes and classes (as ``cls`` reads them)
_GROUP_TOKENS = re.compile(r"\\.|\[\^?\]?(?:[^\\\]]|\\.)*\]|(\()|(\))", re.DOTALL)
# a group's text of this many characters or more is remembered (a translated schema repeats
# its string, number and date-time groups thousands of times), up to this many
_MEMO_GROUP_MIN, _MEMO_GROUP_MAX = 24, 200_000


class _Tree(tuple):
    """A parse tree's root node, with the ids of the group nodes it holds more than once
    (``shared``): the builder builds each of those once and copies its states after."""

    shared: frozenset = frozenset()


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self._classes: dict[str, tuple] = {}  # a class's text -> its ranges (schemas repeat a few)
        # a group's text (its hash and length) -> where it was first read and its node (the same
        # object each time); the text itself is compared, not kept
        self._groups: dict[tuple[int, int], tuple[int, int, tuple]] = {}
        self.shared: set[int] = set()
        self._close = self._matching_parens() if len(text) >= 4 * _MEMO_GROUP_MIN else {}

    def _matching_parens(self) -> dict[int, int]:
        """Each '(' -> its ')' as the scan pairs them (a hint only: a group is remembered
        when its parse ends exactly there)."""
        close: dict[int, int] = {}
        stack: list[int] = []
        for m in _GROUP_TOKENS.finditer(self.s):
            k = m.lastindex
            if k == 1:
                stack.append(m.start())
            elif k == 2 and stack:
                a = stack.pop()
                if m.start() - a >= _MEMO_GROUP_MIN:
                    close[a] = m.start()
        return close

    def fail(self, what: str) -> LazyUnsupported:
        return LazyUnsupported(f"{what} at offset {self.i}")

    def parse(self) -> tuple:
        node = self.alt()
        if self.i != len(self.s):
            raise self.fail(f"unexpected {self.s[self.i]!r}")
        return node

    def alt(self) -> tuple:
        branches = [self.seq()]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            branches.append(self.seq())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def seq(self) -> tuple:
        items: list[tuple] = []
        s = self.s
        while self.i < len(s) and s[self.i] not in _STOPS:
            m = _PLAIN_RUN.match(s, self.i)
            if m is not None:  # a run of plain characters, each its own literal, read at once
                end = m.end()
                if end < len(s) and s[end] in "*+?{":
                    end -= 1  # the last one is a quantifier's atom: read below
                if end > self.i:
                    items.extend(map(_char_lit, s[self.i:end]))
                    self.i = end
                    continue
            atom = self.atom()
            while self.i < len(s) and s[self.i] in "*+?{":
                atom = self.quantifier(atom)
            items.append(atom)
        return items[0] if len(items) == 1 else ("seq", items)

    def quantifier(self, atom: tuple) -> tuple:
        s = self.s
        c = s[self.i]
        if c == "{":
            j = s.find("}", self.i)
            body = s[self.i + 1:j] if j > 0 else ""
            lo_text, comma, hi_text = body.partition(",")
            if not lo_text.isdigit() or (hi_text and not hi_text.isdigit()):
                raise self.fail("a '{' that is not a counted repetition")
            lo = int(lo_text)
            hi = None if comma and not hi_text else (int(hi_text) if comma else lo)
            if hi is not None and hi < lo:
                raise self.fail("a repetition {m,n} with n < m")
            self.i = j + 1
        else:
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            self.i += 1
        if self.i < len(s) and s[self.i] in "?+":
            raise self.fail("a lazy or possessive quantifier")
        return ("rep", atom, lo, hi)

    def atom(self) -> tuple:
        s = self.s
        c = s[self.i]
        if c == "(":
            j = self._close.get(self.i)
            key = None
            if j is not None and j - self.i <= _MEMO_GROUP_MAX:
                text = s[self.i:j + 1]
                key = (hash(text), j - self.i)
                seen = self._groups.get(key)
                if seen is not None and s[seen[0]:seen[1] + 1] == text:  # this very text parsed
                    self.i = j + 1                                        # before: the same node
                    self.shared.add(id(seen[2]))
                    return seen[2]
                if seen is not None:
                    key = None  # another text of that hash: parsed as it comes
            start = self.i
            self.i += 1
            if s.startswith("?:", self.i):
                self.i += 2
            elif self.i < len(s) and s[self.i] == "?":
                raise self.fail("a group with flags, a name or lookaround")
            node = self.alt()
            if self.i >= len(s) or s[self.i] != ")":
                raise self.fail("an unclosed group")
            self.i += 1
            if key is not None and self.i == j + 1 and node[0] != "lit":
                self._groups[key] = (start, j, node)
            return node
        if c == "[":
            return ("lit", self.cls())
        if c == MEMBERS_OPEN or c == MEMBERS_OPEN_NONEMPTY:
            return self.members()
        if c == ".":
            self.i += 1
            return ("lit", _normalize([(0, 0x09), (0x0B, MAX_CODE)]))
        if c == "\\":
            cp = self.escape()
            return ("lit", ((cp, cp),))
        if c in "^$":
            raise self.fail("an anchor")
        if c in "*+?{":
            raise self.fail(f"a quantifier {c!r} with nothing before it")
        self.i += 1
        return ("lit", ((ord(c), ord(c)),))

    def members(self) -> tuple:
        """``OPEN sep (REQUIRED|OPTIONAL entry)+ CLOSE`` (index_markers.py)."""
        s = self.s
        allow_empty = s[self.i] == MEMBERS_OPEN
        self.i += 1
        sep = self.alt()
        entries = []
        while self.i < len(s) and s[self.i] in (MEMBER_REQUIRED, MEMBER_OPTIONAL):
            required = s[self.i] == MEMBER_REQUIRED
            self.i += 1
            entries.append((self.alt(), required))
        if self.i >= len(s) or s[self.i] != MEMBERS_CLOSE or not entries:
            raise self.fail("a malformed ordered-members node")
        self.i += 1
        return ("members", sep, entries, allow_empty)

    def escape(self) -> int:
        """One escaped code point at ``\\``; classes (\\d ...) are not read here."""
        s = self.s
        self.i += 1
        if self.i >= len(s):
            raise self.fail("a trailing backslash")
        c = s[self.i]
        self.i += 1
        if c in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[c]
        if c == "x":
            if s.startswith("{", self.i):
                return self._braced()
            return self._hex(2)
        if c == "u":
            if s.startswith("{", self.i):
                return self._braced()
            return self._hex(4)
        if c == "U":
            if s.startswith("{", self.i):
                return self._braced()
            return self._hex(8)
        if c.isascii() and not c.isalnum() and c != " " or not c.isascii():
            return ord(c)  # escaped punctuation (or a raw non-ASCII character) stands for itself
        raise self.fail(f"the escape \\{c}")

    def _hex(self, n: int) -> int:
        digits = self.s[self.i:self.i + n]
        if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.fail("a malformed hex escape")
        self.i += n
        return self._code(int(digits, 16))

    def _braced(self) -> int:
        j = self.s.find("}", self.i)
        digits = self.s[self.i + 1:j] if j > 0 else ""
        if not digits or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.fail("a malformed hex escape")
        self.i = j + 1
        return self._code(int(digits, 16))

    def _code(self, cp: int) -> int:
        if cp > MAX_CODE or _SURROGATES[0] <= cp <= _SURROGATES[1]:
            raise self.fail(f"the code point U+{cp:X}")
        return cp

    def cls(self) -> tuple[tuple[int, int], ...]:
        s = self.s
        start = self.i
        j = start + 1 + (s.startswith("^", start + 1))
        j += s.startswith("]", j)
        j = _CLASS_BODY.match(s, j).end()  # to the first unescaped ']' (or the end: _cls says what is wrong)
        text = s[start:j + 1]
        hit = self._classes.get(text)
        if hit is not None:
            self.i = j + 1
            return hit
        out = self._cls()
        if self.i == j + 1:
            self._classes[text] = out
        return out

    def _cls(self) -> tuple[tuple[int, int], ...]:
        s = self.s
        self.i += 1
        negate = self.i < len(s) and s[self.i] == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.i >= len(s):
                raise self.fail("an unclosed class")
            c = s[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "[" or s.startswith(("&&", "--", "~~"), self.i):
                raise self.fail("a nested class or class set operation")
            lo = self._class_char()
            if self.i + 1 < len(s) and s[self.i] == "-" and s[self.i + 1] != "]":
                self.i += 1
                if s[self.i] == "[":
                    raise self.fail("a nested class")
                hi = self._class_char()
                if hi < lo:
                    raise self.fail("a class range out of order")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        out = _normalize(ranges)
        return _complement(out) if negate else out

    def _class_char(self) -> int:
        c = self.s[self.i]
        if c == "\\":
            return self.escape()
        self.i += 1
        return ord(c)


# ---------------------------------------------------------------------------- UTF-8

def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


_LENGTH_SPANS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODE))


def utf8_sequences(lo: int, hi: int) -> list[tuple[tuple[int, int], ...]]:
    """Byte-range sequences whose concatenations are exactly the UTF-8 encodings of the
    code points in [lo, hi] (surrogates excluded)."""
    out: list[tuple[tuple[int, int], ...]] = []
    stack = []
    for a, b in ((lo, min(hi, _SURROGATES[0] - 1)), (max(lo, _SURROGATES[1] + 1), hi)):
        if a > b:
            continue
        for s_lo, s_hi in _LENGTH_SPANS:
            x, y = max(a, s_lo), min(b, s_hi)
            if x <= y:
                stack.append((x, y))
    stack.reverse()
    while stack:
        a, b = stack.pop()
        n = len(_encode(a))
        split = False
        for i in range(1, n):
            m = (1 << (6 * i)) - 1
            if a & ~m != b & ~m:
                if a & m:
                    stack.append(((a | m) + 1, b))
                    stack.append((a, a | m))
                    split = True
                    break
                if b & m != m:
                    stack.append((b & ~m, b))
                    stack.append((a, (b & ~m) - 1))
                    split = True
                    break
        if not split:
            ea, eb = _encode(a), _encode(b)
            out.append(tuple(zip(ea, eb)))
    return out


# ---------------------------------------------------------------------------- the NFA

class LazyNFA:
    """A byte-level Thompson NFA: ``lo[q] <= byte <= hi[q]`` leads from q to ``dst[q]`` (a
    state with no byte edge has lo > hi), and ``eps_ptr/eps_dst`` list each state's epsilon
    moves (CSR). Compact arrays, so it pickles quickly from the compile worker."""

    __slots__ = ("start", "accept", "lo", "hi", "dst", "eps_ptr", "eps_dst", "regex_chars", "dead_ends", "narrowed")

    def __init__(self, start: int, accept: int, lo: array, hi: array, dst: array, eps_ptr: array,
                 eps_dst: array, regex_chars: int, dead_ends: bool = True) -> None:
        self.start, self.accept = start, accept
        self.lo, self.hi, self.dst = lo, hi, dst
        self.eps_ptr, self.eps_dst = eps_ptr, eps_dst
        self.regex_chars = regex_chars
        self.dead_ends = dead_ends  # False: every state reaches the accept state (Thompson, no empty class)
        self.narrowed = 0  # bounded repetitions build_nfa lowered to fit (0: the regex's exact language)

    def __getstate__(self) -> tuple:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state: tuple) -> None:
        self.narrowed = 0  # a pickle made before the field
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    @property
    def num_states(self) -> int:
        return len(self.lo)

    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for a in (self.lo, self.hi, self.dst, self.eps_ptr, self.eps_dst))


def _loop_tail(items: list, t: int) -> int:
    """m > 0 when ``items[t]`` is ``(S X)*`` (S not empty) and X is ``items[t-m:t]``: the JSON
    translator's list ``X(?:,X)*``, whose X is then built once instead of twice (each level of
    nested arrays would double the automaton)."""
    node = items[t]
    if node[0] != "rep" or node[2] != 0 or node[3] is not None or node[1][0] != "seq":
        return 0
    body = node[1][1]
    for m in range(min(len(body) - 1, t), 0, -1):
        if body[-m:] == items[t - m:t]:
            return m
    return 0


class _Builder:
    def __init__(self, max_states: int, narrow_to: int | None = None, watch: int | None = None) -> None:
        self.lo = array("i")
        self.hi = array("i")
        self.dst = array("i")
        self.esrc = array("i")  # epsilon moves esrc[i] -> edst[i], in the order they were made
        self.edst = array("i")
        self.max_states = max_states
        self._seq_cache: dict[tuple, list] = {}
        self.dead_ends = False  # an empty class was built: some states may not reach the end
        # narrowing (build_nfa): a bounded repetition whose copies would pass ``narrow_to`` states
        # keeps fewer of its optional copies; ``narrowed`` counts the repetitions it lowered
        self.narrow_to = narrow_to
        self.narrowed = 0
        # ``watch``: whether a build at narrow_to=watch would have lowered a repetition made so
        # far; until one would, that build makes these very states
        self.watch = watch
        self.would_narrow = False
        # nodes the parse tree holds more than once (_Tree.shared) -> where their first build
        # lies: (first state, states, first and last epsilon move, entry, exit, lowered)
        self.shared: frozenset = frozenset()
        self._built: dict[int, tuple] = {}

    def new(self) -> int:
        q = len(self.lo)
        if q >= self.max_states:
            raise LazyTooLarge(self.max_states)
        self.lo.append(1)
        self.hi.append(0)
        self.dst.append(-1)
        return q

    def eps(self, q: int, *targets: int) -> None:
        for t in targets:
            self.esrc.append(q)
            self.edst.append(t)

    def byte_edge(self, q: int, lo: int, hi: int, to: int) -> None:
        self.lo[q], self.hi[q], self.dst[q] = lo, hi, to

    def frag(self, node: tuple) -> tuple[int, int]:
        """(entry, exit) states of a fragment matching ``node``. A node the tree holds more
        than once is built once: its states again are a copy of its first build's, shifted
        (a fragment's states and moves are made together and stay among themselves), which
        is what building it again would make."""
        if id(node) in self.shared:
            hit = self._built.get(id(node))
            if hit is not None:
                return self._copy(*hit)
            base, e0, narrowed = len(self.lo), len(self.esrc), self.narrowed
            a, b = self._frag(node)
            self._built[id(node)] = (base, len(self.lo) - base, e0, len(self.esrc), a, b, self.narrowed - narrowed)
            return a, b
        return self._frag(node)

    def _copy(self, base: int, n: int, e0: int, e1: int, a: int, b: int, lowered: int) -> tuple[int, int]:
        off = len(self.lo) - base
        if len(self.lo) + n > self.max_states:
            raise LazyTooLarge(self.max_states)
        self.lo.extend(self.lo[base:base + n])
        self.hi.extend(self.hi[base:base + n])
        dst = np.frombuffer(self.dst, dtype=np.int32)[base:base + n].astype(np.int64)  # (copies: the
        self.dst.frombytes(np.where(dst >= 0, dst + off, -1).astype(np.int32).tobytes())  # arrays grow)
        if e1 > e0:
            src_e = (np.frombuffer(self.esrc, dtype=np.int32)[e0:e1] + off).tobytes()
            dst_e = (np.frombuffer(self.edst, dtype=np.int32)[e0:e1] + off).tobytes()
            self.esrc.frombytes(src_e)
            self.edst.frombytes(dst_e)
        self.narrowed += lowered
        return a + off, b + off

    def _frag(self, node: tuple) -> tuple[int, int]:
        kind = node[0]
        if kind == "lit":
            return self.lit(node[1])
        if kind == "seq":
            items = node[1]
            entry = cur = self.new()
            pos = [cur]  # pos[t]: the state after items[:t] (a fragment's exit has no edge of its own)
            for t, child in enumerate(items):
                m = _loop_tail(items, t)
                if m:  # X (S X)*: X built once, S leads back into it (what follows X is alike)
                    loop = self.new()
                    self.eps(cur, loop)
                    sep = child[1][1][:-m]
                    a, b = self.frag(sep[0] if len(sep) == 1 else ("seq", sep))
                    self.eps(loop, a)
                    self.eps(b, pos[t - m])
                    cur = loop
                else:
                    a, b = self.frag(child)
                    self.eps(cur, a)
                    cur = b
                pos.append(cur)
            return entry, cur
        if kind == "members":
            return self.members(node)
        if kind == "alt":
            entry, exit_ = self.new(), self.new()
            for child in node[1]:
                a, b = self.frag(child)
                self.eps(entry, a)
                self.eps(b, exit_)
            return entry, exit_
        _, body, lo, hi = node
        entry = cur = self.new()
        parts = self.copies(body, lo + (1 if hi is None else hi - lo), lo if hi is not None else None)
        for a, b in parts[:lo]:
            self.eps(cur, a)
            cur = b
        if hi is None:
            a, b = parts[lo]
            loop_exit = self.new()
            self.eps(cur, a, loop_exit)
            self.eps(b, a, loop_exit)
            return entry, loop_exit
        exit_ = self.new()
        for a, b in parts[lo:]:
            self.eps(cur, a, exit_)
            cur = b
        self.eps(cur, exit_)
        return entry, exit_

    def members(self, node: tuple) -> tuple[int, int]:
        """The linear automaton of ordered members (module docstring). A_k is needed up to the
        first required entry (past it something was written), B_k from the second entry on.
        Entry k is built once: A_k and B_k's separator both lead into it, and it leads to
        B_k+1 whichever way it was entered, so one copy accepts exactly what two would."""
        _, sep, entries, allow_empty = node
        n = len(entries)
        first_req = next((k for k, (_, req) in enumerate(entries) if req), n)
        a_last = min(first_req, n - 1)  # the last entry written from an A state
        exit_ = self.new()
        a = [self.new() for _ in range(a_last + 1)]  # A_0 .. A_a_last
        b = [-1] + [self.new() for _ in range(1, n + 1)]  # B_1 .. B_n
        self.eps(b[n], exit_)
        for k, (body, req) in enumerate(entries):
            e_in, e_out = self.frag(body)
            self.eps(e_out, b[k + 1])
            if k <= a_last:
                self.eps(a[k], e_in)
                if not req:  # A_k -eps-> A_k+1 (A_n: the empty sequence)
                    if k < a_last:
                        self.eps(a[k], a[k + 1])
                    elif allow_empty:  # k == n - 1, every entry optional
                        self.eps(a[k], exit_)
                    # else: no A_n (the empty sequence is not allowed), and A_k still leads into
                    # entry k: no state is made that cannot reach the end
            if k >= 1:
                s_in, s_out = self.frag(sep)
                self.eps(b[k], s_in)
                self.eps(s_out, e_in)
                if not req:
                    self.eps(b[k], b[k + 1])
        return a[0], exit_

    def copies(self, body: tuple, k: int, least: int | None = None) -> list[tuple[int, int]]:
        """``k`` fragments of ``body``: one built, the others copied from its states shifted
        (a fragment's edges stay within the states made while it was built), which keeps a
        counted repetition such as a string of maxLength 256 cheap to build. ``least`` (a
        bounded repetition's lower count): when narrowing and the copies would pass
        ``narrow_to`` states, only as many as fit are made, never fewer than ``least`` or 1."""
        if k <= 0:
            return []
        base, e0 = len(self.lo), len(self.esrc)
        a, b = self.frag(body)
        n, e1 = len(self.lo) - base, len(self.esrc)
        if least is not None and self.watch is not None and n * k > self.watch \
                and max(least, 1, self.watch // max(n, 1)) < k:
            self.would_narrow = True
        if least is not None and self.narrow_to is not None and n * k > self.narrow_to:
            fit = max(least, 1, self.narrow_to // max(n, 1))
            if fit < k:
                k = fit
                self.narrowed += 1
        out = [(a, b)]
        if k == 1:
            return out
        if len(self.lo) + (k - 1) * n > self.max_states:
            raise LazyTooLarge(self.max_states)
        # the k - 1 copies at once: copy i is the fragment's states shifted by i * n
        lo, hi = self.lo[base:], self.hi[base:]
        dst = np.frombuffer(self.dst, dtype=np.int32)[base:].astype(np.int64)
        offs = np.arange(n, n * k, n, dtype=np.int64)[:, None]
        self.lo.extend(lo * (k - 1))
        self.hi.extend(hi * (k - 1))
        self.dst.frombytes(np.where(dst >= 0, dst + offs, -1).astype(np.int32).tobytes())
        if e1 > e0:
            src_e = np.frombuffer(self.esrc, dtype=np.int32)[e0:e1].astype(np.int64)
            dst_e = np.frombuffer(self.edst, dtype=np.int32)[e0:e1].astype(np.int64)
            self.esrc.frombytes((src_e + offs).astype(np.int32).tobytes())
            self.edst.frombytes((dst_e + offs).astype(np.int32).tobytes())
        out.extend((a + off, b + off) for off in range(n, n * k, n))
        return out

    def lit(self, ranges: tuple[tuple[int, int], ...]) -> tuple[int, int]:
        seqs = self._seq_cache.get(ranges)
        if seqs is None:
            seqs = [seq for lo, hi in ranges for seq in utf8_sequences(lo, hi)]
            self._seq_cache[ranges] = seqs
        entry, exit_ = self.new(), self.new()
        if not seqs:  # an empty set: nothing gets through (the states before it are dead)
            self.dead_ends = True
            return entry, exit_
        if len(seqs) == 1 and len(seqs[0]) == 1:  # one byte range: one state
            self.byte_edge(entry, seqs[0][0][0], seqs[0][0][1], exit_)
            return entry, exit_
        # a small trie of the sequences (they share lead bytes), its leaves all at exit_
        trie: dict = {}
        for seq in seqs:
            t = trie
            for r in seq[:-1]:
                t = t.setdefault(r, {})
            t.setdefault(seq[-1], None)

        def emit(t: dict, at: int) -> None:
            for r, sub in t.items():
                q = self.new()
                self.eps(at, q)
                if sub is None:
                    self.byte_edge(q, r[0], r[1], exit_)
                else:
                    nxt = self.new()
                    self.byte_edge(q, r[0], r[1], nxt)
                    emit(sub, nxt)

        emit(trie, entry)
        return entry, exit_


class LazyIndexExhausted(ValueError):
    """A lazy index grew past its DFA state cap while requests explored it (a regex whose DFA
    is exponential, such as ``(a|b)*a(a|b){20}``): the request asking fails alone."""


class LazyTooLarge(LazyUnsupported):
    """The regex's NFA would exceed the state cap."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"its byte automaton passes {cap:,} states")
        self.cap = cap
        self.would_narrow = True  # nfa_of's ``watch``: unknown unless it watched


DEFAULT_MAX_NFA_STATES = 4_000_000
# DFA states one lazy index may make (~1 KB each in its transition table, plus its NFA-state set)
MAX_DFA_STATES = 200_000
_UNKNOWN = -2  # a DFA transition not computed yet


def build_nfa(regex: str, max_states: int = DEFAULT_MAX_NFA_STATES, narrow_to: int | None = None) -> LazyNFA:
    """Parse ``regex`` (the dialect above) into a byte-level NFA; ``LazyUnsupported`` for a
    construct outside the dialect, ``LazyTooLarge`` past ``max_states``.

    ``narrow_to``: a bounded repetition ``X{m,n}`` whose n copies of X would pass this many
    states is built as ``X{m,n'}`` with the largest n' (at least m, at least 1) that fits: an
    automaton for a subset of the regex's language (every text it accepts, the regex accepts),
    which the JSON-schema compile falls back to when the exact one is too large (compiler.py).
    The NFA's ``narrowed`` says how many repetitions were lowered."""
    return nfa_of(parse_regex(regex), len(regex), max_states, narrow_to)


def parse_regex(regex: str) -> tuple:
    """The parse tree of ``regex`` that ``nfa_of`` builds (``LazyUnsupported`` outside the
    dialect): parsed once, it can be built at several ``narrow_to`` (compiler.lazy_nfa)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        parser = _Parser(regex)
        tree = _Tree(parser.parse())
    finally:
        sys.setrecursionlimit(old)
    tree.shared = frozenset(parser.shared)
    return tree


def nfa_of(ast: tuple, regex_chars: int, max_states: int = DEFAULT_MAX_NFA_STATES,
           narrow_to: int | None = None, watch: int | None = None) -> LazyNFA:
    """``build_nfa`` from a ``parse_regex`` tree (of a regex of ``regex_chars`` characters).
    ``watch``: a ``LazyTooLarge`` raised says in ``would_narrow`` whether a build at
    ``narrow_to=watch`` would have lowered a repetition before the cap was reached (if not,
    that build makes the same states up to there, and passes the cap as well)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    b = _Builder(max_states, narrow_to, watch)
    b.shared = getattr(ast, "shared", frozenset())
    try:
        entry, exit_ = b.frag(ast)
    except LazyTooLarge as e:
        e.would_narrow = b.would_narrow
        raise
    finally:
        sys.setrecursionlimit(old)
    src = np.frombuffer(b.esrc, dtype=np.int32)
    order = np.argsort(src, kind="stable")
    flat = array("i", np.frombuffer(b.edst, dtype=np.int32)[order].tobytes())
    counts = np.bincount(src, minlength=len(b.lo))
    ptr = array("i", np.concatenate(([0], np.cumsum(counts))).astype(np.int32).tobytes())
    nfa = LazyNFA(entry, exit_, b.lo, b.hi, b.dst, ptr, flat, regex_chars, b.dead_ends)
    nfa.narrowed = b.narrowed
    return nfa


# ---------------------------------------------------------------------------- the vocabulary

class TokenArrays:
    """The vocabulary as numpy arrays, shared by every lazy index of one compiler: each
    token's id, length and bytes (a zero-padded matrix), plus per byte-set run lengths."""

    def __init__(self, tokens: dict[int, bytes]) -> None:
        items = sorted((i, b) for i, b in tokens.items() if b)
        self.ids = np.fromiter((i for i, _ in items), dtype=np.int64, count=len(items))
        self.lens = np.fromiter((len(b) for _, b in items), dtype=np.int64, count=len(items))
        width = int(self.lens.max()) if len(items) else 1
        self.mat = np.zeros((len(items), width + 1), dtype=np.uint8)
        for row, (_, b) in enumerate(items):
            self.mat[row, :len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.bytes_of: dict[int, bytes] = dict(items)
        self.single = np.zeros(256, dtype=bool)  # the bytes that are a token by themselves
        for _, b in items:
            if len(b) == 1:
                self.single[b[0]] = True
        self.rows = np.arange(len(items))
        self._runs: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()

    def covers(self, nfa: LazyNFA) -> bool:
        """Whether every byte edge of ``nfa`` (below 0xF4) takes some byte that is a token by
        itself. Then every live DFA state lets some token through (its transitions lead to
        live states), so no output can get stuck, which outlines-core's index checks while it
        is built. (0xF4 leads only the reserved code points, which real tokens never spell:
        index_markers.py.)"""
        lo = np.frombuffer(nfa.lo, dtype=np.int32).astype(np.int64)
        hi = np.frombuffer(nfa.hi, dtype=np.int32).astype(np.int64)
        edge = (lo <= hi) & (lo < 0xF4)
        lo, hi = lo[edge], np.minimum(hi[edge], 0xF3)
        count = np.concatenate(([0], np.cumsum(self.single)))  # count[b] = tokens among bytes < b
        return bool(np.all(count[hi + 1] - count[lo] > 0))

    def run_lengths(self, loop: np.ndarray) -> np.ndarray:
        """Per token, how many of its first bytes are in the byte set ``loop`` (bool[256])."""
        key = np.packbits(loop).tobytes()
        hit = self._runs.get(key)
        if hit is None:
            inside = loop[self.mat]  # padding byte 0 is outside unless 0 is in the set
            inside[self.rows, self.lens] = False
            hit = np.argmin(inside, axis=1)
            with self._lock:
                if len(self._runs) > 256:
                    self._runs.clear()
                self._runs[key] = hit
        return hit


# ---------------------------------------------------------------------------- the index

class LazyIndex:
    """outlines-core's ``Index`` interface over a ``LazyNFA``, DFA and masks made on demand."""

    def __init__(self, nfa: LazyNFA, tokens: TokenArrays, max_dfa_states: int | None = None) -> None:
        self.nfa = nfa
        self.max_dfa_states = MAX_DFA_STATES if max_dfa_states is None else max_dfa_states
        self.tokens = tokens
        # the NFA's compact arrays themselves (4 bytes an entry; indexing one gives a Python int)
        self._lo, self._hi, self._dst = nfa.lo, nfa.hi, nfa.dst
        self._eps_ptr, self._eps_flat = nfa.eps_ptr, nfa.eps_dst
        self._live = self._coreachable() if nfa.dead_ends else None
        self._closure: dict[int, frozenset[int]] = {}
        self._ids: dict[frozenset[int], int] = {}
        self._sets: list[frozenset[int]] = []
        self._table = np.full((64, 256), _UNKNOWN, dtype=np.int32)  # DFA state x byte -> state
        self._full: set[int] = set()  # states whose whole row is known
        self._lock = threading.RLock()
        start = self._close([nfa.start])
        self._initial = self._id(start) if start else -1

    # ------------------------------------------------------------ construction

    def _coreachable(self) -> bytearray:
        """1 for the NFA states from which the accept state can be reached."""
        n = len(self._lo)
        rev: list[list[int]] = [[] for _ in range(n)]
        ptr, flat = self._eps_ptr, self._eps_flat
        for q in range(n):
            if self._dst[q] >= 0:
                rev[self._dst[q]].append(q)
            for t in flat[ptr[q]:ptr[q + 1]]:
                rev[t].append(q)
        live = bytearray(n)
        stack = [self.nfa.accept]
        live[self.nfa.accept] = 1
        while stack:
            for p in rev[stack.pop()]:
                if not live[p]:
                    live[p] = 1
                    stack.append(p)
        return live

    def _close(self, seeds: Any) -> frozenset[int]:
        """The byte states and accept state reachable from ``seeds`` by epsilon moves (live only)."""
        out: set[int] = set()
        cache = self._closure
        for s in seeds:
            hit = cache.get(s)
            if hit is None:
                hit = self._close_one(s)
                cache[s] = hit
            out |= hit
        return frozenset(out)

    def _close_one(self, s: int) -> frozenset[int]:
        live, ptr, flat, lo, hi = self._live, self._eps_ptr, self._eps_flat, self._lo, self._hi
        accept = self.nfa.accept
        seen = {s}
        stack = [s]
        out = set()
        while stack:
            q = stack.pop()
            if live is not None and not live[q]:
                continue
            if lo[q] <= hi[q] or q == accept:
                out.add(q)
            for t in flat[ptr[q]:ptr[q + 1]]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(out)

    def _id(self, states: frozenset[int]) -> int:
        d = self._ids.get(states)
        if d is None:
            with self._lock:
                d = self._ids.get(states)
                if d is None:
                    d = len(self._sets)
                    if d >= self.max_dfa_states:
                        raise LazyIndexExhausted(
                            f"the grammar's automaton grew past {self.max_dfa_states:,} DFA states while this request "
                            "was generated (its regex determinizes exponentially); simplify the pattern")
                    self._sets.append(states)
                    if d >= len(self._table):  # grow the dense transition table
                        grown = np.full((2 * len(self._table), 256), _UNKNOWN, dtype=np.int32)
                        grown[:len(self._table)] = self._table
                        self._table = grown
                    self._ids[states] = d
        return d

    def step(self, d: int, b: int) -> int:
        """The DFA state after byte ``b`` from state ``d``; -1 when nothing can follow."""
        nxt = int(self._table[d, b])
        if nxt == _UNKNOWN:
            lo, hi, dst = self._lo, self._hi, self._dst
            targets = [dst[q] for q in self._sets[d] if lo[q] <= b <= hi[q]]
            if targets:
                closed = self._close(targets)
                nxt = self._id(closed) if closed else -1
            else:
                nxt = -1
            self._table[d, b] = nxt
        return nxt

    def _row(self, d: int) -> np.ndarray:
        """All 256 byte transitions of ``d`` (-1 dead), each computed once."""
        if d not in self._full:
            lo, hi = self._lo, self._hi
            live_bytes = set()
            for q in self._sets[d]:
                if lo[q] <= hi[q]:
                    live_bytes.update(range(lo[q], hi[q] + 1))
            for b in live_bytes:
                self.step(d, b)
            row = self._table[d]
            row[row == _UNKNOWN] = -1
            self._full.add(d)
        return self._table[d]

    # ------------------------------------------------------------ outlines-core's interface

    def get_initial_state(self) -> int:
        return self._initial

    def is_final_state(self, state: int) -> bool:
        return self.nfa.accept in self._sets[state]

    def get_next_state(self, state: int, token_id: int) -> int | None:
        data = self.tokens.bytes_of.get(int(token_id))
        if data is None or state < 0:
            return None
        d = state
        with self._lock:
            for b in data:
                d = self.step(d, b)
                if d < 0:
                    return None
        return d

    def get_allowed_tokens(self, state: int) -> np.ndarray:
        """Sorted ids of the tokens after which the text can still complete."""
        with self._lock:
            return self._allowed(state)

    def _allowed(self, d: int) -> np.ndarray:
        tok = self.tokens
        row = self._row(d)
        loop = row == d
        ok = np.zeros(len(tok.ids), dtype=bool)
        if loop.any():
            k = tok.run_lengths(loop)
            ok |= k == tok.lens  # the whole token loops on d
            rows = np.flatnonzero(k < tok.lens)
            pos = k[rows]
        else:
            rows = tok.rows
            pos = np.zeros(len(rows), dtype=np.int64)
        # the first byte outside the loop, from d itself
        states = row[tok.mat[rows, pos]].astype(np.int64)
        keep = states >= 0
        rows, pos, states = rows[keep], pos[keep] + 1, states[keep]
        lens, mat = tok.lens, tok.mat
        step = self.step
        while rows.size:
            done = pos == lens[rows]
            if done.any():
                ok[rows[done]] = True
                more = ~done
                rows, pos, states = rows[more], pos[more], states[more]
                if not rows.size:
                    break
            col = mat[rows, pos]
            nxt = self._table[states, col]
            unknown = nxt == _UNKNOWN
            if unknown.any():
                for key in np.unique(states[unknown] * 256 + col[unknown]).tolist():
                    step(key >> 8, key & 255)
                nxt = self._table[states, col]
            keep = nxt >= 0
            rows, pos, states = rows[keep], pos[keep] + 1, nxt[keep].astype(np.int64)
        return tok.ids[ok]  # sorted by id, each id once

    # ------------------------------------------------------------ bookkeeping

    @property
    def num_dfa_states(self) -> int:
        return len(self._sets)

    def memory_bytes(self) -> int:
        """An estimate of what this index holds now (it grows as matchers explore it): the NFA's
        arrays, the dense transition table, the DFA states' sets and the closures."""
        held = sum(len(c) for c in self._closure.values()) + sum(len(x) for x in self._sets)
        return self.nfa.nbytes() + self._table.nbytes + 64 * held + 200 * len(self._sets)

    def __reduce__(self) -> Any:
        raise TypeError("a LazyIndex is not pickled: pickle its nfa and rebuild it with the vocabulary")
