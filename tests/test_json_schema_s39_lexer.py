"""The JSON byte lexer that unique keys (json_keys.py) and unique string items (unique_items.py)
share (constrained/decode/json_lexer.py): both checks follow one output the same way (the same
containers open, the same string state, a reasoning block left at ``</think>``), each keeping
its own frames, and each finds the repeats Python's JSON parser finds, however the text is cut
into tokens."""

from __future__ import annotations

import json
import random

import pytest

from treadle.constrained.decode.json_keys import START, _THINKING, feed
from treadle.constrained.decode.unique_items import feed_items, items_start
from treadle.constrained.schema.unique_strings import ANY_KEY, ITEM, ROOT

PIECES = [b'{', b'}', b'[', b']', b'"', b'a', b'b', b'ab', b':', b',', b'1', b'a"', b'b"', b'ab"', b'":', b'"a"',
          b'"b":', b',"a":', b'","', b'"a":1,"a":', b'},"a"', b'\\', b'"a":1,"b"', b'x', b'"ab"', b'["', b'"]',
          b'\\u0061', b'</think>', b'<think>', b'</th', b'ink>', b'<', b' ', b'\\"', b'["a","a"]', b'{"k":["', b'"k"',
          b'[[', b'null', b'\n', b'\xc3\xa9', b'"\\', b'"],"k":["']


def _kinds(frames: tuple) -> list[str]:
    return ["object" if isinstance(f, tuple) else "array" for f in frames]


@pytest.mark.parametrize("reasoning", ["", "open", "maybe"])
def test_both_checks_follow_the_same_structure(reasoning):
    rng = random.Random(len(reasoning))
    slots = frozenset({"k", ROOT, ITEM})
    for _ in range(2000):
        keys = _THINKING[reasoning] if reasoning else START
        items = items_start(slots, reasoning)
        for _ in range(rng.randrange(1, 20)):
            data = b"".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 4)))
            keys, _ = feed(keys, data)
            items, _ = feed_items(items, data)
            assert keys[1] == items[1]  # outside / inside a string, after a backslash, before the JSON
            assert _kinds(keys[0]) == _kinds(items[0])
            assert items[3] is slots  # the items check's own part of its state, carried as it is
            if keys[1] < 3:  # a key is captured by both (the items check keeps its last key too)
                top = keys[0][-1] if keys[0] else None
                if isinstance(top, tuple) and keys[2] is not None:
                    assert items[2] == keys[2]


def _run(fn, state, text: bytes, cut: int):
    rep = False
    for i in range(0, len(text), cut):
        state, r = fn(state, text[i:i + cut])
        rep |= r
    return state, rep


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 100])
def test_repeats_match_the_parser(cut):
    texts = ['{"a":["x","y"],"b":{"a":1}}', '{"a":["x","x"]}', '{"a":1,"a":2}', '[["p","q"],["p","p"]]',
             '{"k":["\\u0061","a"]}', '{"k":["a\\"b","a\\"b"]}', '{"m":{"k":["z"],"k2":["z"]},"k":["z","y"]}',
             '["é","é"]', '{"":1,"":2}', '{"a":"[\\"x\\",\\"x\\"]"}']
    for t in texts:
        pairs: list[bool] = []
        json.loads(t, object_pairs_hook=lambda kv: pairs.append(len({k for k, _ in kv}) < len(kv)) or dict(kv))
        assert _run(feed, START, t.encode(), cut)[1] == any(pairs), t

        def dup_items(v) -> bool:  # a list of strings repeating one, anywhere (every array checked here)
            if isinstance(v, dict):
                return any(dup_items(x) for x in v.values())
            if isinstance(v, list):
                strs = [x for x in v if isinstance(x, str)]
                return len(set(strs)) < len(strs) or any(dup_items(x) for x in v)
            return False

        every = frozenset({ROOT, ITEM, ANY_KEY})
        assert _run(feed_items, items_start(every), t.encode(), cut)[1] == dup_items(json.loads(t)), t


def test_reasoning_block_is_skipped_to_its_end():
    for cut in (1, 3, 100):
        state, rep = _run(feed, _THINKING["open"], b'thinking {"a":1,"a":2} </think>{"a":1,"a":2}', cut)
        assert rep and state[1] == 0
        state, rep = _run(feed, _THINKING["open"], b'{"a":1,"a":2} </thi', cut)
        assert not rep and state[1] == 3
        state, rep = _run(feed_items, items_start(frozenset({ROOT}), "maybe"), b'["a","a"]', cut)
        assert rep  # no block: the JSON from the first byte
