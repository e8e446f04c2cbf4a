"""Per-request grammar state: accept tokens, fill the next-token bitmask, roll back, jump.

A matcher is cheap to create (a few fields) and owned by one request; everything heavy
lives in the shared compiled grammar. ``MatcherBase`` is the contract (EOS, rollback
history); ``GrammarMatcher`` follows a regex grammar (``CompiledGrammar``) by its token-FSM
state, from which the grammar also reads the forced text of jump-forward. ``HoleMatcher``
adds the holes of a schema regex (json_holes.py): any-JSON values
run on the pushdown automaton. ``JsonAnyMatcher`` follows that automaton alone
(``JsonAnyGrammar``). A matcher of a JSON grammar also keeps the keys each open object has
had, and its mask leaves out tokens that would repeat one (json_keys.py); one whose schema
asks for unique free strings (``set[str]``) keeps each array's string items, and its mask
leaves out tokens that would repeat one (unique_items.py).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from treadle.constrained.compile.grammar import CompiledGrammar
from treadle.constrained.index.json_any import JsonAnyGrammar
from treadle.constrained.decode.json_keys import START, KeyIndex, KeyState, feed, key_index, unique_keys_start
from treadle.constrained.decode.unique_items import ItemIndex, ItemState, feed_items, item_index, unique_items_start

__all__ = ["MatcherBase", "GrammarMatcher", "HoleMatcher", "JsonAnyMatcher", "write_mask_row"]


# The last bitmask's numpy view: making one costs more than filling a row. The entry keeps its
# tensor alive, so no other tensor can take that address while the entry stands.
_view_cache: tuple[tuple, torch.Tensor, np.ndarray] | None = None


def _numpy_view(bitmask: torch.Tensor, words: int) -> np.ndarray | None:
    """The bitmask as a numpy array (None on a device); checks its shape once per tensor."""
    global _view_cache
    hit = _view_cache
    if hit is not None and hit[1] is bitmask and hit[0][0] == bitmask.data_ptr():
        return hit[2]  # the same tensor object, same storage (a resize that reallocates moves it)
    key = (bitmask.data_ptr(), bitmask.shape, bitmask.stride())
    if hit is not None and hit[0] == key:
        return hit[2]
    if bitmask.dim() != 2 or bitmask.shape[1] < words or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be [batch, >= {words}] int32, got {tuple(bitmask.shape)} {bitmask.dtype}")
    if bitmask.device.type != "cpu":
        return None
    arr = bitmask.numpy()
    _view_cache = (key, bitmask, arr)
    return arr


def write_mask_row(bitmask: torch.Tensor, row: int, words: int, src: np.ndarray | None, eos: frozenset[int]) -> None:
    """Write ``src`` (an int32 mask row of ``words`` words) into ``bitmask[row]``, zeroing the
    rest of the row; ``src=None`` (a terminated matcher) allows only the ``eos`` ids, so padded
    decode steps stay harmless."""
    arr = _numpy_view(bitmask, words)  # None for a device tensor
    if src is None:
        target = bitmask[row]
        target.zero_()
        for e in eos:
            if e < words * 32:
                word = (1 << (e % 32)) if e % 32 < 31 else -(1 << 31)
                target[e // 32] |= word
        return
    if arr is not None:
        # A numpy view skips torch's dispatch overhead: this is the per-token hot path.
        dst = arr[row]
        dst[:words] = src
        if arr.shape[1] > words:
            dst[words:] = 0
    else:
        bitmask[row, :words].copy_(torch.from_numpy(src), non_blocking=True)
        bitmask[row, words:].zero_()


class MatcherBase:
    """The matcher contract both grammar engines share (xgrammar-style): EOS is accepted only
    where the text so far is complete, and terminates the matcher; a rejected token changes
    nothing; the last ``max_rollback`` tokens can be undone. Subclasses keep their own state
    and provide ``can_terminate``, ``find_jump_forward_string``, ``_advance`` (a non-EOS
    token: check it, call ``_push()`` and move, or return False), ``_mask`` (the allowed-token
    row of the current state), ``_snapshot`` / ``_restore`` and ``_words`` (bitmask width).

    With a ``KeyIndex`` (a JSON grammar, json_keys.py) the matcher also follows the keys of
    the open objects: the mask leaves out the tokens that would repeat one, and
    ``accept_token`` refuses the same tokens."""

    __slots__ = ("_eos", "_terminated", "_history", "_num_accepted", "_key_index", "_keys", "_item_index", "_items")

    def _init_base(self, eos_token_ids: tuple[int, ...], max_rollback: int, keys: KeyIndex | None = None,
                   keys_start: KeyState = START, items: ItemIndex | None = None,
                   items_start: ItemState | None = None) -> None:
        if max_rollback < 0:
            raise ValueError(f"max_rollback must be >= 0, got {max_rollback}")
        self._eos = frozenset(eos_token_ids)
        self._terminated = False
        # a snapshot taken *before* each accepted token: (*_snapshot(), keys, items, terminated)
        self._history: deque[tuple] = deque(maxlen=max_rollback)
        self._num_accepted = 0
        self._key_index = keys
        self._keys = keys_start
        self._item_index = items
        self._items = items_start

    @property
    def num_accepted(self) -> int:
        """Tokens accepted so far (including a final EOS), net of rollbacks."""
        return self._num_accepted

    def is_terminated(self) -> bool:
        """True once an EOS token has been accepted."""
        return self._terminated

    def accept_token(self, token_id: int) -> bool:
        """Advance by ``token_id`` if the grammar allows it; return whether it did."""
        if self._terminated:
            return False
        token_id = int(token_id)
        if token_id in self._eos:
            if not self.can_terminate():
                return False
            self._push()
            self._terminated = True
            return True
        items, unique = self._items, self._item_index
        if unique is not None:
            data = unique.table[token_id] if 0 <= token_id < len(unique.table) else None
            items, repeated = feed_items(items, data) if data else (items, False)
            if repeated:  # a string item its array already has: never (unique_items.py)
                return False
        keys, index = self._keys, self._key_index
        if index is not None:
            data = index.table[token_id] if 0 <= token_id < len(index.table) else None
            keys, repeated = feed(keys, data) if data else (keys, False)
            if repeated and index.refuses(self._keys, self._unique_row(), token_id):
                return False
        if not self._advance(token_id):
            return False
        self._keys, self._items = keys, items
        return True

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (overwriting the row).

        Requires an int32 bitmask of shape [batch, >= ceil(vocab_size/32)]; bit ``t % 32``
        of word ``t // 32`` set means token t is allowed. A terminated matcher allows only
        EOS so padded decode steps stay harmless.
        """
        if self._terminated:
            write_mask_row(bitmask, row, self._words(), None, self._eos)
            return
        mask = self._unique_row()  # unique items first: they never give way; unique keys give way to both
        index = self._key_index
        if index is not None and (self._keys[0] or index.two_keys):  # an open container, or a token that opens one
            mask = index.filter(self._keys, mask)
        write_mask_row(bitmask, row, self._words(), mask, self._eos)

    def _unique_row(self) -> np.ndarray:
        """The grammar's row less the tokens that would repeat a string item (unique_items.py)."""
        mask = self._mask()
        return mask if self._item_index is None else self._item_index.filter(self._items, mask)

    @property
    def keys_unique(self) -> bool:
        """Whether the mask leaves out tokens that would repeat an object's key (json_keys.py)."""
        return self._key_index is not None

    @property
    def max_rollback(self) -> int:
        """How many of the last accepted tokens `rollback` can undo."""
        return self._history.maxlen or 0

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (requires <= the retained history)."""
        if num_tokens < 0 or num_tokens > len(self._history):
            raise ValueError(
                f"cannot roll back {num_tokens} tokens: only {len(self._history)} are retained "
                f"(max_rollback={self._history.maxlen})"
            )
        if num_tokens == 0:
            return
        for _ in range(num_tokens - 1):
            self._history.pop()
        *snap, self._keys, self._items, self._terminated = self._history.pop()
        self._restore(snap)
        self._num_accepted -= num_tokens

    def reset(self) -> None:
        """Return to the initial state and forget the history."""
        self.__init__(self._g, self._history.maxlen or 0)  # type: ignore[misc,attr-defined]

    def _push(self) -> None:
        self._history.append((*self._snapshot(), self._keys, self._items, self._terminated))
        self._num_accepted += 1


class GrammarMatcher(MatcherBase):
    """Grammar state of one request under a regex grammar (``CompiledGrammar``): the token-FSM
    state."""

    __slots__ = ("_g", "_state")

    def __new__(cls, grammar: CompiledGrammar, max_rollback: int = 64) -> GrammarMatcher:
        # a grammar with holes needs their matcher, however it is asked for
        if cls is GrammarMatcher and getattr(grammar, "holes", None) is not None:
            cls = HoleMatcher
        return object.__new__(cls)

    def __init__(self, grammar: CompiledGrammar, max_rollback: int = 64) -> None:
        start = unique_keys_start(grammar)
        keys = key_index(grammar.token_bytes, grammar.num_tokens) if start is not None else None
        items_start = unique_items_start(grammar)
        items = item_index(grammar.token_bytes, grammar.num_tokens) if items_start is not None else None
        self._init_base(grammar.eos_token_ids, max_rollback, keys, start or START, items, items_start)
        self._g = grammar
        self._state: int = grammar.initial_state

    @property
    def grammar(self) -> CompiledGrammar:
        return self._g

    @property
    def state(self) -> int:
        """Current token-FSM (outlines Index) state."""
        return self._state

    def can_terminate(self) -> bool:
        """True when the text so far is a full match (EOS would be accepted)."""
        return self._g.is_final(self._state)

    def find_jump_forward_string(self) -> str:
        """Text the grammar forces from here (longer than one character), else "".
        Nothing is forced in the middle of a multi-byte character."""
        if self._terminated:
            return ""
        text = self._g.jump_string(self._state)
        return text if len(text) > 1 else ""

    # ------------------------------------------------------------------ internals

    def _advance(self, token_id: int) -> bool:
        if not 0 <= token_id < self._g.num_tokens or token_id in self._g.reserved_tokens:
            return False
        nxt = self._g.index.get_next_state(self._state, token_id)
        if nxt is None:
            return False
        self._push()
        self._state = nxt
        return True

    def _mask(self) -> np.ndarray:
        return self._g.mask_row(self._state)  # numpy int32 [words], cached per state

    def _words(self) -> int:
        return self._g.bitmask_words

    def _snapshot(self) -> tuple:
        return (self._state,)

    def _restore(self, snap: list) -> None:
        (self._state,) = snap


class HoleMatcher(GrammarMatcher):
    """Grammar state of one request under a regex grammar with holes or calls
    (json_holes.py): the set of configurations (token-FSM state, open hole, open calls) the
    text so far can be read as, most often one."""

    __slots__ = ("_configs",)

    def __init__(self, grammar: CompiledGrammar, max_rollback: int = 64) -> None:
        super().__init__(grammar, max_rollback)
        self._configs = grammar.holes.start()

    @property
    def state(self) -> frozenset:
        """The configurations (json_holes.Config) the text so far can be read as."""
        return self._configs

    @property
    def in_hole(self) -> bool:
        return any(c[1] is not None for c in self._configs)

    @property
    def call_depth(self) -> int:
        """Open calls of recursive definitions (the deepest reading)."""
        return max(len(c[2]) for c in self._configs)

    def can_terminate(self) -> bool:
        return self._g.holes.is_final(self._configs)

    def find_jump_forward_string(self) -> str:
        """With one reading: outside a hole, the regex's forced text up to the next hole or
        call (inside a call, up to where its value could end); inside a hole, the rest of a
        literal (``t`` -> ``rue``). With more, nothing."""
        if self._terminated or len(self._configs) != 1:
            return ""
        ((state, hole, _),) = self._configs
        if hole is None:
            text = self._g.jump_string(state)
        else:
            text = self._g.holes.pda.tables.forced.get(hole[0], "")
        return text if len(text) > 1 else ""

    def _advance(self, token_id: int) -> bool:
        g = self._g
        if not 0 <= token_id < g.num_tokens:
            return False
        data = g.token_bytes[token_id]
        if not data:
            return False
        nxt = g.holes.advance(self._configs, token_id, data)
        if not nxt:
            return False
        self._push()
        self._configs = nxt
        return True

    def _mask(self) -> np.ndarray:
        return self._g.holes.row(self._configs)

    def _snapshot(self) -> tuple:
        return (self._configs,)

    def _restore(self, snap: list) -> None:
        (self._configs,) = snap


class JsonAnyMatcher(MatcherBase):
    """Grammar state of one request under a ``JsonAnyGrammar`` (constrained/index/json_any.py): the
    lexer state and the stack of open containers."""

    __slots__ = ("_g", "_pda", "_state", "_stack")

    def __init__(self, grammar: JsonAnyGrammar, max_rollback: int = 64) -> None:
        start = unique_keys_start(grammar)
        keys = key_index(grammar.pda.token_bytes, grammar.num_tokens) if start is not None else None
        self._init_base(grammar.eos_token_ids, max_rollback, keys, start or START)
        self._g = grammar
        self._pda = grammar.pda
        self._state = grammar.initial
        self._stack: tuple[int, ...] = ()

    @property
    def grammar(self) -> JsonAnyGrammar:
        return self._g

    @property
    def state(self) -> tuple[int, tuple[int, ...]]:
        """(lexer state, open containers)."""
        return self._state, self._stack

    def can_terminate(self) -> bool:
        return self._pda.is_final(self._state, self._stack)

    def find_jump_forward_string(self) -> str:
        """The rest of a literal (``t`` -> ``rue``); nothing else is forced in compact JSON
        but single characters."""
        if self._terminated:
            return ""
        text = self._pda.tables.forced.get(self._state, "")
        return text if len(text) > 1 else ""

    def _advance(self, token_id: int) -> bool:
        if not 0 <= token_id < self._pda.num_tokens:
            return False
        data = self._pda.token_bytes[token_id]
        if not data:
            return False
        state, stack = self._pda.run(self._state, self._stack, data)
        if state == 0:
            return False
        self._push()
        self._state, self._stack = state, stack
        return True

    def _mask(self) -> np.ndarray:
        return self._pda.mask(self._state, self._stack)

    def _words(self) -> int:
        return self._pda.bitmask_words

    def _snapshot(self) -> tuple:
        return self._state, self._stack

    def _restore(self, snap: list) -> None:
        self._state, self._stack = snap
