"""Hostile clients, session 43: what a client could still do to the server's other clients.
Each test failed on the code before its fix."""
from __future__ import annotations

import json
import random

import pytest

from treadle.runtime.server import protocol


# ---------------------------------------------------------------- a large body holds the GIL


def _c_spans(monkeypatch) -> list[int]:
    """Record the characters each call of json's C parser reads (json.loads, and the scanner
    protocol.loads_in_pieces reads one value with) while the test runs."""
    spans: list[int] = []
    loads = json.loads

    def counted_loads(s, *a, **kw):
        spans.append(len(s))
        return loads(s, *a, **kw)

    monkeypatch.setattr(json, "loads", counted_loads)
    scan = getattr(protocol, "_scan_once", None)
    if scan is not None:
        def counted_scan(s, at):
            value, end = scan(s, at)
            spans.append(end - at)
            return value, end

        monkeypatch.setattr(protocol, "_scan_once", counted_scan)
    return spans


def test_a_large_body_is_parsed_in_short_pieces(monkeypatch):
    """json's C parser holds the GIL for a whole call: one json.loads over a 40 MB body
    (/detokenize of 8M ids) stopped every thread of the server's HTTP process, the event loop's
    included, for a second (every stream's next chunk and /health waited; measured: /health
    1.3 s -> 0.16 s). A body of PIECEWISE_PARSE_BYTES or more is now read in pieces of at most
    PARSE_PIECE_CHARS characters: the same value, the same errors."""
    rng = random.Random(0)
    ids = [rng.randrange(49152) for _ in range(300_000)]
    body = {"input_ids": [ids[:5000], ids[5000:9000]], "rid": ["a", "b\u00e9\\\""],
            "sampling_params": [{"max_new_tokens": 3, "stop": ["x", "\U0001F600"], "temperature": 0.5}, {}],
            "tokens": ids, "floats": [0.5, -1e-3, 2e300, -0.0] * 10_000, "nested": [[[1, [2]], {"k": [3]}]] * 50}
    raw = json.dumps(body, indent=1).encode()
    assert len(raw) >= 1 << 20
    spans = _c_spans(monkeypatch)
    assert protocol.parse_json_object(raw) == body
    assert max(spans) <= (1 << 16) + 2, f"one C call read {max(spans):,} characters"
    # invalid bodies: a 400 as json.loads words it (its message, its position)
    for bad in [b'{"tokens": [1, 2,, 3]}', b'{"tokens": [1, 2, 3}', b'{"a": 1,}', b'{"a": [1e5, -]}', b'{"a": 1} x',
                b'{"a": [1, 2 3]}', b'{"a" 1}', b'[1, 2]', b'\xef\xbb\xbf{"a": [01]}']:
        padded = bad[:3] + b" " * (1 << 20) + bad[3:]  # parsed in pieces
        with pytest.raises(protocol.APIError) as e:
            protocol.parse_json_object(padded)
        try:
            json.loads(padded)
            want = "must be a JSON object, got list"
        except json.JSONDecodeError as d:
            want = str(d)
        assert e.value.status == 400 and want in e.value.message, (e.value.message, want)
    with pytest.raises(protocol.APIError, match="nests too deeply"):
        protocol.parse_json_object(b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}" + b" " * (1 << 20))
    with pytest.raises(protocol.APIError, match="tokens: an integer of more than"):
        protocol.parse_json_object(b'{"tokens": [1, ' + b"9" * 5000 + b"]}" + b" " * (1 << 20))


def test_a_long_string_in_a_reply_is_written_in_pieces():
    """/detokenize of 8M ids replies with a 40 MB string, which one json.dumps call wrote in
    0.4 s with the GIL held; it is written JSON_PIECE_CHARS characters at a time."""
    text = "a\"\\\u00e9\n\U0001F600 redu" * 20_000
    for ascii_only in (False, True):
        pieces = protocol.json_pieces({"prompt": text}, ensure_ascii=ascii_only)
        assert "".join(pieces) == json.dumps({"prompt": text}, ensure_ascii=ascii_only, separators=(",", ":"))
        assert max(map(len, pieces)) <= 6 * (1 << 16), max(map(len, pieces))
    assert protocol.ReplyJSON({"p": "\ud800" * 100_000}).body == b'{"p":"' + b"\\ud800" * 100_000 + b'"}'
