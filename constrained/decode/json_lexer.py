"""The JSON byte lexer that the matcher's output checks share: unique keys (json_keys.py) and
unique string items (unique_items.py).

It follows a grammar's output byte by byte, and keeps only what those checks need: the open
containers (innermost last), whether a string is open (and after its backslash), and the raw
bytes of the string being *captured* (a key, or an item of a checked array). A state is
``(frames, mode, buf, ...)`` (a check may keep more of its own after those three):

- ``frames``: one frame a container. An object's is a tuple ``(info, key_next)``: what the
  check keeps of it (the keys it has had, or its last key) and whether a key comes next (after
  ``{`` or ``,``, not after ``:``). An array's is anything but a tuple: a ``frozenset`` of the
  strings it has had where its items are checked, ``False`` where not;
- ``mode``: 0 outside a string, 1 in one, 2 after its backslash, 3 in a reasoning block before
  the JSON, 4 before a reasoning block or the JSON (reasoning_prefix.py: the JSON comes after
  ``</think>``, and cannot start with ``<``);
- ``buf``: the raw bytes of the string being captured, None when the string is not captured
  (or none is open); in a reasoning block, its last bytes.

A string opening where a key comes next, or as an item of a checked array (a ``frozenset``
frame), is captured; at its closing quote ``close_string`` decides whether it repeats one and
updates the frame. What a new object's and a new array's frames hold is the check's own
(``object_frame``, ``open_array``). Importing this module does not import torch.
"""

from __future__ import annotations

import re
from typing import Any

from treadle.constrained.ebnf.reasoning_prefix import CLOSE

__all__ = ["JsonLexer"]

_THINK_END = CLOSE.encode()
_TAIL = len(_THINK_END) - 1  # the bytes a reasoning block keeps: "</think>" may straddle tokens
_LT = ord("<")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN_OBJ, _OPEN_ARR, _CLOSE = ord("{"), ord("["), frozenset(b"}]")
_COLON, _COMMA = ord(":"), ord(",")
_structure = re.compile(rb'[{}\[\]":,]').search  # the bytes that change anything outside a string
_string_end = re.compile(rb'["\\]').search  # and inside one


class JsonLexer:
    """A check's lexer: subclasses say what a new object's frame is (``object_frame``), what a
    new array's is (``open_array``), and what closing a captured string does (``close_string``).
    A state may carry more after ``(frames, mode, buf)``: the check's own, kept as it is."""

    object_frame: tuple = (None, True)

    def open_array(self, stack: list, state: tuple) -> Any:
        """A new array's frame (not a tuple), ``stack`` the frames around it, ``state`` the state
        being fed."""
        return False

    def close_string(self, stack: list, raw: bytes) -> bool:
        """Close the captured string ``raw`` (a key where ``stack[-1]`` is a tuple, else an item of
        a checked array): update ``stack[-1]``; whether it repeats one its container had."""
        raise NotImplementedError

    def feed(self, state: tuple, data: bytes) -> tuple[tuple, bool]:
        """The state after ``data``, and whether ``data`` closed a captured string that repeats
        one."""
        mode = state[1]
        if mode == 0:
            if not _structure(data):  # the cheap cases first: most tokens change nothing
                return state, False
        elif mode == 1:
            if not _string_end(data):
                buf = state[2]
                return ((state[0], 1, buf + data) + state[3:] if buf is not None else state), False
        elif mode >= 3:
            buf = state[2]
            if mode == 4:
                if not data:
                    return state, False
                if data[0] != _LT:
                    return self.feed(((), 0, None) + state[3:], data)
                buf = b""
            seen = buf + data
            at = seen.find(_THINK_END)
            if at < 0:
                return ((), 3, seen[-_TAIL:]) + state[3:], False
            return self.feed(((), 0, None) + state[3:], seen[at + len(_THINK_END):])
        frames, buf = state[0], state[2]
        stack = list(frames)
        repeated = False
        start = 0  # where the captured string's bytes in ``data`` begin
        j = -1
        for b in data:
            j += 1
            if mode == 1:
                if b == _QUOTE:
                    mode = 0
                    if buf is not None:
                        repeated |= self.close_string(stack, buf + data[start:j])
                        buf = None
                elif b == _BACKSLASH:
                    mode = 2
            elif mode == 2:
                mode = 1
            elif b == _QUOTE:
                mode = 1
                if stack:  # captured: a key where one comes next, an item of a checked array
                    top = stack[-1]
                    if (top[1] if type(top) is tuple else top is not False):
                        buf, start = b"", j + 1
            elif b == _OPEN_OBJ:
                stack.append(self.object_frame)
            elif b == _OPEN_ARR:
                stack.append(self.open_array(stack, state))
            elif b in _CLOSE:
                if stack:
                    stack.pop()
            elif (b == _COLON or b == _COMMA) and stack and type(stack[-1]) is tuple:
                stack[-1] = (stack[-1][0], b == _COMMA)
        if buf is not None and mode != 0:
            buf += data[start:]
        return ((tuple(stack), mode, buf) if len(state) == 3 else (tuple(stack), mode, buf) + state[3:]), repeated
