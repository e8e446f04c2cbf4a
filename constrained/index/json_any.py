"""Any JSON value (or any object / array), as a pushdown automaton over bytes: unbounded nesting.

A regular grammar cannot nest without bound, and the regex for "any JSON value" grows with
every level allowed (``json_schema: {}`` took 34 s to build, three levels of ``json_object``
25 s). The schemas that say nothing but "JSON" (``{}``, ``true``, ``{"type": "object"}``,
``{"type": "array"}``, with annotations at most) are served here instead, with no build:

* the **lexer** is a byte-level DFA whose transitions depend on the state, the byte and the
  top of the bracket stack ("context": empty, object, array); ``NEXT`` / ``ACT`` tables
  give the next state and the stack action (push object / push array / pop);
* the **stack** holds the open containers;
* a **mask** (tokens allowed next) is computed for all tokens at once with numpy: every
  token's bytes run through the tables in lock-step, each token with a stack of its own
  (pushes kept as bits, pops below them read from the real stack). A mask depends only on
  the state and the top K+1 stack entries, K being the most closing brackets any token
  holds, so it is cached on that key and shared by every request of the vocabulary.

Lexical rules match the regex backend's (``json_schema.py``): compact (no whitespace),
integers of at most 16 digits, fractions of at most 16, exponents of at most 2, string
escapes ``\\"\\\\/bfnrt``, ``\\uXXXX`` in values (no lone surrogates), well-formed UTF-8.
Keys take the same characters and simple escapes, not ``\\u``.

Importing this module does not import torch; the matcher does.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["JsonPushdown", "JsonAnyGrammar", "json_any_root"]

# stack entries / contexts
EMPTY, OBJ, ARR = 0, 1, 2
# stack actions
NONE, PUSH_OBJ, PUSH_ARR, POP = 0, 1, 2, 3
# at most this many containers opened by one token beyond its own closes (bits of an int64)
_LOCAL_DEPTH = 62
_ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "examples", "default",
                          "deprecated", "readOnly", "writeOnly"})
_MASK_CACHE = 4096  # masks kept per vocabulary (a row is vocab/8 bytes)


def json_any_root(schema: Any) -> str | None:
    """"value", "object" or "array" when ``schema`` constrains nothing beyond that, else None."""
    if schema is True:
        return "value"
    if not isinstance(schema, dict):
        return None
    rest = {k: v for k, v in schema.items() if k not in _ANNOTATIONS}
    kind = rest.pop("type", None)
    if kind is None:
        return None if rest else "value"
    if kind == "object" and rest.pop("additionalProperties", True) in (True, {}) and not rest:
        return "object"
    if kind == "array" and rest.pop("items", True) in (True, {}) and not rest:
        return "array"
    return None



# a number's exponent digits (as regex_numbers.NUMBER): 3 made -4.800e892, -inf to a double reader
EXP_DIGITS = 2

class _Tables:
    """The lexer: states, NEXT[ctx, state, byte] and ACT[ctx, state, byte]."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ids: dict[str, int] = {}
        for name in ("DEAD", "VALUE", "ROOT_OBJ", "ROOT_ARR", "ARR_FIRST", "OBJ_FIRST", "OBJ_KEY", "COLON",
                     "AFTER", "MINUS", "ZERO", "DOT", "EXP0", "EXP_SIGN"):
            self._state(name)
        for k in range(1, 17):
            self._state(f"INT{k}")
            self._state(f"FRAC{k}")
        for k in range(1, EXP_DIGITS + 1):
            self._state(f"EXP{k}")
        self.literals = {"t": "true", "f": "false", "n": "null"}
        for word in self.literals.values():
            for i in range(1, len(word)):
                self._state(f"LIT_{word}{i}")
        for v in ("K", "V"):
            for name in ("STR", "ESC", "C1", "C2", "C3", "E0", "ED", "F0", "F4"):
                self._state(f"{name}_{v}")
        for name in ("U0", "H3", "H2", "H1", "UD", "HS2", "HS1", "LS_BS", "LS_U", "LS_D", "LS_C"):
            self._state(name)
        S = len(self.names)
        self.num_states = S
        # -1: "no own edge" while building; completed states then borrow AFTER's edges
        self.next = np.full((3, S, 256), -1, dtype=np.int32)
        self.act = np.zeros((3, S, 256), dtype=np.int8)
        self._build()
        self.next[self.next < 0] = 0  # DEAD
        self.complete = frozenset(self.ids[n] for n in ["ZERO", "AFTER"] + [f"INT{k}" for k in range(1, 17)]
                                  + [f"FRAC{k}" for k in range(1, 17)] + [f"EXP{k}" for k in range(1, EXP_DIGITS + 1)])
        # forced text (jump-forward): the rest of a literal
        self.forced = {self.ids[f"LIT_{w}{i}"]: w[i:] for w in self.literals.values() for i in range(1, len(w))}

    def _state(self, name: str) -> int:
        self.ids[name] = len(self.names)
        self.names.append(name)
        return self.ids[name]

    def _edge(self, src: str, chars: Any, dst: str, act: int = NONE, ctx: tuple[int, ...] = (EMPTY, OBJ, ARR)) -> None:
        s, d = self.ids[src], self.ids[dst]
        for b in _bytes(chars):
            for c in ctx:
                self.next[c, s, b] = d
                self.act[c, s, b] = act

    def _value_edges(self, src: str) -> None:
        self._edge(src, "{", "OBJ_FIRST", PUSH_OBJ)
        self._edge(src, "[", "ARR_FIRST", PUSH_ARR)
        self._edge(src, '"', "STR_V")
        self._edge(src, "-", "MINUS")
        self._edge(src, "0", "ZERO")
        self._edge(src, "123456789", "INT1")
        for first, word in self.literals.items():
            self._edge(src, first, f"LIT_{word}1")

    def _build(self) -> None:
        e = self._edge
        digits, hexd = "0123456789", "0123456789abcdefABCDEF"
        self._value_edges("VALUE")
        self._value_edges("ARR_FIRST")
        e("ARR_FIRST", "]", "AFTER", POP, (ARR,))
        e("ROOT_OBJ", "{", "OBJ_FIRST", PUSH_OBJ)
        e("ROOT_ARR", "[", "ARR_FIRST", PUSH_ARR)
        e("OBJ_FIRST", '"', "STR_K")
        e("OBJ_FIRST", "}", "AFTER", POP, (OBJ,))
        e("OBJ_KEY", '"', "STR_K")
        e("COLON", ":", "VALUE")
        e("AFTER", ",", "OBJ_KEY", NONE, (OBJ,))
        e("AFTER", "}", "AFTER", POP, (OBJ,))
        e("AFTER", ",", "VALUE", NONE, (ARR,))
        e("AFTER", "]", "AFTER", POP, (ARR,))
        # numbers: -?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,2})?
        e("MINUS", "0", "ZERO")
        e("MINUS", "123456789", "INT1")
        for src in ["ZERO"] + [f"INT{k}" for k in range(1, 17)]:
            e(src, ".", "DOT")
        for src in ["ZERO"] + [f"INT{k}" for k in range(1, 17)] + [f"FRAC{k}" for k in range(1, 17)]:
            e(src, "eE", "EXP0")
        for k in range(1, 16):
            e(f"INT{k}", digits, f"INT{k + 1}")
            e(f"FRAC{k}", digits, f"FRAC{k + 1}")
        e("DOT", digits, "FRAC1")
        e("EXP0", "+-", "EXP_SIGN")
        e("EXP0", digits, "EXP1")
        e("EXP_SIGN", digits, "EXP1")
        for k in range(1, EXP_DIGITS):
            e(f"EXP{k}", digits, f"EXP{k + 1}")
        for word in self.literals.values():
            for i in range(1, len(word)):
                e(f"LIT_{word}{i}", word[i], f"LIT_{word}{i + 1}" if i + 1 < len(word) else "AFTER")
        # strings ("K" keys, "V" values): [^"\\\x00-\x1f] as UTF-8, and escapes
        for v in ("K", "V"):
            s = f"STR_{v}"
            e(s, [b for b in range(0x20, 0x80) if b not in (0x22, 0x5C)], s)
            e(s, '"', "COLON" if v == "K" else "AFTER")
            e(s, "\\", f"ESC_{v}")
            e(s, range(0xC2, 0xE0), f"C1_{v}")
            e(s, [0xE0], f"E0_{v}")
            e(s, [*range(0xE1, 0xED), 0xEE, 0xEF], f"C2_{v}")
            e(s, [0xED], f"ED_{v}")
            e(s, [0xF0], f"F0_{v}")
            e(s, range(0xF1, 0xF4), f"C3_{v}")
            e(s, [0xF4], f"F4_{v}")
            cont = range(0x80, 0xC0)
            e(f"C1_{v}", cont, s)
            e(f"C2_{v}", cont, f"C1_{v}")
            e(f"C3_{v}", cont, f"C2_{v}")
            e(f"E0_{v}", range(0xA0, 0xC0), f"C1_{v}")
            e(f"ED_{v}", range(0x80, 0xA0), f"C1_{v}")
            e(f"F0_{v}", range(0x90, 0xC0), f"C2_{v}")
            e(f"F4_{v}", range(0x80, 0x90), f"C2_{v}")
            e(f"ESC_{v}", '"\\/bfnrt', s)
        # \u escapes (values): no lone surrogates
        e("ESC_V", "u", "U0")
        e("U0", "0123456789abcABCeEfF", "H3")
        e("U0", "dD", "UD")
        e("UD", "01234567", "H2")
        e("UD", "89abAB", "HS2")
        e("H3", hexd, "H2")
        e("H2", hexd, "H1")
        e("H1", hexd, "STR_V")
        e("HS2", hexd, "HS1")
        e("HS1", hexd, "LS_BS")
        e("LS_BS", "\\", "LS_U")
        e("LS_U", "u", "LS_D")
        e("LS_D", "dD", "LS_C")
        e("LS_C", "cdefCDEF", "H2")
        # a finished number ends where the next byte is what may follow a value
        after = self.ids["AFTER"]
        for n in ["ZERO"] + [f"INT{k}" for k in range(1, 17)] + [f"FRAC{k}" for k in range(1, 17)] + \
                 [f"EXP{k}" for k in range(1, EXP_DIGITS + 1)]:
            s = self.ids[n]
            own = self.next[:, s, :] < 0
            self.next[:, s, :][own] = self.next[:, after, :][own]
            self.act[:, s, :][own] = self.act[:, after, :][own]


def _bytes(chars: Any) -> list[int]:
    if isinstance(chars, str):
        return list(chars.encode())
    return list(chars)


_TABLES_LOCK = threading.Lock()
_TABLES: _Tables | None = None


def _tables() -> _Tables:
    global _TABLES
    with _TABLES_LOCK:
        if _TABLES is None:
            _TABLES = _Tables()
        return _TABLES


class JsonPushdown:
    """The automaton bound to one vocabulary: the token byte matrix and the shared mask cache.

    ``token_bytes[i]`` is the text token i adds (None for special tokens, never allowed);
    ids >= ``num_tokens`` are padding; ``eos_token_ids`` are allowed once the value is done.
    Thread-safe.
    """

    def __init__(self, token_bytes: list[bytes | None], num_tokens: int, vocab_size: int,
                 eos_token_ids: tuple[int, ...]) -> None:
        t0 = time.perf_counter()
        self.tables = _tables()
        self.token_bytes = token_bytes
        self.num_tokens = int(num_tokens)
        self.vocab_size = int(vocab_size)
        self.eos_token_ids = tuple(int(e) for e in eos_token_ids)
        self.bitmask_words = (self.vocab_size + 31) // 32
        eos = set(self.eos_token_ids)
        ids = [i for i in range(self.num_tokens) if token_bytes[i] and i not in eos]
        ids.sort(key=lambda i: -len(token_bytes[i]))
        self.ids = np.asarray(ids, dtype=np.int64)
        lens = np.asarray([len(token_bytes[i]) for i in ids], dtype=np.int64)
        width = int(lens[0]) if len(ids) else 0
        self.matrix = np.zeros((len(ids), width), dtype=np.uint8)
        for row, i in enumerate(ids):
            b = token_bytes[i]
            self.matrix[row, :len(b)] = np.frombuffer(b, dtype=np.uint8)
        # tokens still running at byte t: a prefix of the rows (sorted by length, longest first)
        self.active = [int(np.count_nonzero(lens > t)) for t in range(width)]
        # the most closing brackets in one token: how deep into the real stack a token can pop
        self.k = max((token_bytes[i].count(b"]") + token_bytes[i].count(b"}") for i in ids), default=0)
        S = self.tables.num_states
        self._next = self.tables.next.reshape(-1)
        self._act = self.tables.act.reshape(-1)
        self._next_list = self._next.tolist()  # the scalar path (accepting one token)
        self._act_list = self._act.tolist()
        self._stride = (S * 256, 256)
        self._masks: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.build_s = time.perf_counter() - t0
        self.stats = {"mask_builds": 0, "mask_build_s": 0.0}

    # ------------------------------------------------------------------ scalar path

    def run(self, state: int, stack: tuple[int, ...], data: bytes) -> tuple[int, tuple[int, ...]]:
        """State and stack after ``data`` (state 0 = DEAD: ``data`` is not allowed)."""
        nxt, act = self._next_list, self._act_list
        cs, ss = self._stride
        st = list(stack)
        for b in data:
            ctx = st[-1] if st else EMPTY
            i = ctx * cs + state * ss + b
            state = nxt[i]
            if state == 0:
                return 0, stack
            a = act[i]
            if a == POP:
                st.pop()
            elif a:
                st.append(OBJ if a == PUSH_OBJ else ARR)
        return state, tuple(st)

    def is_final(self, state: int, stack: tuple[int, ...]) -> bool:
        return not stack and state in self.tables.complete

    # ------------------------------------------------------------------ masks

    def mask(self, state: int, stack: tuple[int, ...]) -> np.ndarray:
        """int32 row [bitmask_words] of the tokens allowed next (EOS included when final).
        Cached; read-only."""
        top = tuple(stack[-1 - i] if i < len(stack) else EMPTY for i in range(self.k + 1))
        key = (state, top)  # top[0] is EMPTY exactly when the stack is: finality is in the key
        with self._lock:
            row = self._masks.get(key)
            if row is not None:
                self._masks.move_to_end(key)
                return row
        t0 = time.perf_counter()
        row = self._build_mask(state, top)
        with self._lock:
            self.stats["mask_builds"] += 1
            self.stats["mask_build_s"] += time.perf_counter() - t0
            self._masks[key] = row
            while len(self._masks) > _MASK_CACHE:
                self._masks.popitem(last=False)
        return row

    def _build_mask(self, state: int, top: tuple[int, ...]) -> np.ndarray:
        final = top[0] == EMPTY and state in self.tables.complete
        n0 = len(self.ids)
        cs, ss = self._stride
        real = np.asarray(top, dtype=np.int64)
        s = np.full(n0, state, dtype=np.int64)
        depth = np.zeros(n0, dtype=np.int64)  # containers the token opened and has not closed
        bits = np.zeros(n0, dtype=np.int64)  # their kinds, bit d set = an object at depth d
        popped = np.zeros(n0, dtype=np.int64)  # real stack entries the token closed
        for t, n in enumerate(self.active):
            if n == 0:
                break
            st, dp, bt, pp = s[:n], depth[:n], bits[:n], popped[:n]
            local = dp > 0
            local_top = np.where((bt >> np.maximum(dp - 1, 0)) & 1 == 1, OBJ, ARR)
            ctx = np.where(local, local_top, real[np.minimum(pp, self.k)])
            flat = ctx * cs + st * ss + self.matrix[:n, t]
            act = self._act[flat]
            st[:] = self._next[flat]
            if not act.any():
                continue
            push = (act == PUSH_OBJ) | (act == PUSH_ARR)
            if push.any():
                bt[:] = np.where(act == PUSH_OBJ, bt | (1 << dp), np.where(push, bt & ~(1 << dp), bt))
                dp += push
                st[dp > _LOCAL_DEPTH] = 0
            pop = act == POP
            if pop.any():
                pp += pop & ~local
                dp -= pop & local
        allowed = np.zeros(self.bitmask_words * 32, dtype=np.bool_)
        allowed[self.ids[s != 0]] = True
        for e in self.eos_token_ids:
            if e < allowed.size:
                allowed[e] = final
        return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32)


@dataclass(eq=False)
class JsonAnyGrammar:
    """The compiled grammar of one root kind ("value", "object", "array") over a vocabulary;
    plays the part of ``CompiledGrammar`` for the scheduler (``matcher()``)."""

    pda: JsonPushdown
    root: str
    spec: Any = None
    compile_time_s: float = 0.0
    from_disk: bool = False
    initial: int = field(init=False)

    def __post_init__(self) -> None:
        ids = self.pda.tables.ids
        self.initial = {"value": ids["VALUE"], "object": ids["ROOT_OBJ"], "array": ids["ROOT_ARR"]}[self.root]

    @property
    def vocab_size(self) -> int:
        return self.pda.vocab_size

    @property
    def num_tokens(self) -> int:
        return self.pda.num_tokens

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.pda.eos_token_ids

    @property
    def bitmask_words(self) -> int:
        return self.pda.bitmask_words

    def matcher(self, max_rollback: int = 64) -> Any:
        """A new ``JsonAnyMatcher`` (constrained/decode/matcher.py) at the initial state (imports torch)."""
        from treadle.constrained.decode.matcher import JsonAnyMatcher

        return JsonAnyMatcher(self, max_rollback)
