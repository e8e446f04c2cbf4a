"""Hostile clients against a real server (session 40): each test is a way a client broke or
stalled the server, fixed; the server is the embedded SmolLM2 on the CPU."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, wait_idle

T = 120


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: left idle (the hold test starts its own)
    return plain_server


def raw_exchange(srv, data: bytes) -> tuple[int, dict, bytes]:
    """Send `data` on a fresh connection; the status, headers and body of the reply."""
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=T) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize("headers", [b"X-Big: " + b"x" * 40_000, b"".join(b"X-H%d: %s\r\n" % (i, b"y" * 90)
                                                                       for i in range(400))], ids=["one", "many"])
def test_headers_too_large_are_a_json_431(srv, headers):
    """Headers past what the HTTP parser buffers (16 KiB; sent without their end, so the
    server answers before reading more): a 431 in the OpenAI error shape saying what to do.
    Before: uvicorn's plain-text 400 'Invalid HTTP request received.'"""
    request = b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + headers
    status, reply_headers, body = raw_exchange(srv, request)
    assert status == 431 and reply_headers["content-type"] == "application/json", (status, reply_headers, body)
    err = json.loads(body)["error"]
    assert err["code"] == "request_header_fields_too_large" and "headers are too large" in err["message"], err


def test_a_malformed_header_line_is_a_json_400(srv):
    status, headers, body = raw_exchange(srv, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n")
    assert status == 400 and headers["content-type"] == "application/json", (status, headers, body)
    err = json.loads(body)["error"]
    assert err["code"] == "invalid_http_request" and "header" in err["message"], err
    ok = requests.post(srv.url + "/generate", timeout=T, json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200, ok.text
    wait_idle(srv.url)


def test_json_pieces_write_json_dumps_text_in_bounded_pieces():
    """A reply is encoded in pieces (protocol.json_pieces) whose text is json.dumps's, none
    long: one json.dumps call over a 50 MB reply held the GIL, and with it the event loop and
    every other client, for seconds (ReplyJSON now writes its pieces on a builder thread)."""
    import random

    from treadle.runtime.server.protocol import ReplyJSON, json_pieces

    rng = random.Random(0)

    def value(depth: int = 0):
        c = rng.random()
        if depth > 3 or c < 0.3:
            return rng.choice([1, -2.5, None, True, "a\u00e9\"\\", "\ud800x", 1e300, [], {}, ()])
        if c < 0.6:
            return [value(depth + 1) for _ in range(rng.randrange(12))]
        if c < 0.7:
            return tuple(value(depth + 1) for _ in range(rng.randrange(5)))
        return {f"k{i}\u00e9": value(depth + 1) for i in range(rng.randrange(5))}

    for _ in range(300):
        v = value()
        for ascii_only in (False, True):
            want = json.dumps(v, ensure_ascii=ascii_only, allow_nan=False, separators=(",", ":"))
            assert "".join(json_pieces(v, ensure_ascii=ascii_only)) == want, v
    with pytest.raises(ValueError):
        json_pieces([[float("nan")], [1.0]])
    # n samples with top-20 logprobs: 1.1 MB of JSON, no piece over 32 KB
    reply = [{"text": "x", "meta_info": {"output_top_logprobs": [[(-1.5, i, "tok") for i in range(20)]] * 300,
                                         "output_token_logprobs": [(-0.1, 5, None)] * 300}}] * 8
    pieces = json_pieces(reply)
    assert "".join(pieces) == json.dumps(reply, separators=(",", ":")) and max(map(len, pieces)) < 32_000
    assert ReplyJSON({"s": "\ud800"}).body == b'{"s":"\\ud800"}'


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
def test_a_reply_too_large_for_the_event_loop_is_made_whole(srv, path):
    """n samples with top-20 logprobs, a reply past INLINE_REPLY_ENTRIES: made and encoded on a
    builder thread, and whole (every sample, every position's 20 top logprobs)."""
    from treadle.runtime.server.http_server import INLINE_REPLY_ENTRIES

    n, m = 8, 130
    assert n * m * 21 > INLINE_REPLY_ENTRIES
    if path == "/generate":
        body = {"text": "Once upon a time", "return_logprob": True, "top_logprobs_num": 20,
                "return_text_in_logprobs": True,
                "sampling_params": {"max_new_tokens": m, "n": n, "temperature": 1.0, "ignore_eos": True}}
    else:
        body = {"model": "default", "prompt": "Once upon a time", "max_tokens": m, "n": n, "logprobs": 20,
                "temperature": 1.0, "ignore_eos": True}
    r = requests.post(srv.url + path, json=body, timeout=600)
    assert r.status_code == 200, r.text[:500]
    if path == "/generate":
        results = r.json()
        assert len(results) == n
        for res in results:
            tops = res["meta_info"]["output_top_logprobs"]
            assert len(tops) == m and all(len(t) == 20 and t[0][2] is not None for t in tops)
    else:
        choices = r.json()["choices"]
        assert len(choices) == n and all(len(c["logprobs"]["top_logprobs"]) == m for c in choices)
    wait_idle(srv.url)


def test_large_bodies_wait_for_each_other_not_small_requests(tmp_path):
    """Four /tokenize bodies of over a megabyte each (as many as there are builder threads)
    whose tokenizing is held (runtime/fault_injection.py: until the test makes a file): a
    small /generate and a small /tokenize are still built and answered meanwhile, as the large
    ones run on their own bulk thread, one after another; then the large ones are answered.
    Before, the four held every builder thread, and every other request waited for them (64 MiB
    bodies of million-character texts: minutes of tokenizing each)."""
    from concurrent.futures import ThreadPoolExecutor

    from treadle.runtime.fault_injection import HOLD_ENV, HOLD_MARKER
    from treadle.runtime.server.tokenizer_manager import BUILD_THREADS, BULK_BODY_BYTES

    release = str(tmp_path / "release")
    with ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning"], env={HOLD_ENV: release}) as s:
        # four texts of 300,000 characters (each under the most a prompt may have), the first held
        texts = [HOLD_MARKER + " " + "word " * 60_000] + ["word " * 60_000] * 3
        assert len(json.dumps(texts)) > BULK_BODY_BYTES
        with ThreadPoolExecutor(BUILD_THREADS) as pool:
            large = [pool.submit(requests.post, s.url + "/tokenize", json={"prompt": texts}, timeout=600)
                     for _ in range(BUILD_THREADS)]
            deadline = time.monotonic() + 120
            while not os.path.exists(release + ".held"):  # the first large one is held
                assert time.monotonic() < deadline and not any(f.done() for f in large)
                time.sleep(0.05)
            try:
                small = requests.post(s.url + "/generate", timeout=60,
                                      json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
                assert small.status_code == 200, small.text
                tok = requests.post(s.url + "/tokenize", json={"prompt": "Hello there"}, timeout=60)
                assert tok.status_code == 200 and tok.json()["count"] > 0, tok.text
                assert not any(f.done() for f in large)  # still held
            finally:
                open(release, "w").close()
            for f in large:
                r = f.result()
                assert r.status_code == 200 and r.json()["count"][1] >= 60_000, r.text[:300]
