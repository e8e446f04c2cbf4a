"""HTTP-level odd requests against a real server (session 42)."""
from __future__ import annotations

import gzip
import http.client
import json

import pytest

from treadle.runtime.server.testing import wait_idle

T = 60
BODY = json.dumps({"model": "default", "prompt": "Hi", "max_tokens": 1}).encode()


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: left idle
    return plain_server


def _post(srv, codings: list[str], body: bytes) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=T)
    try:
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        for c in codings:  # one header line each
            conn.putheader("Content-Encoding", c)
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), json.loads(r.read())
    finally:
        conn.close()


def test_a_compressed_body_is_a_415_whichever_content_encoding_line_says_so(srv):
    # a second Content-Encoding line was not read: the gzip body was parsed as JSON text (a 400
    # "not valid JSON: 'utf-8' codec can't decode byte 0x8b"), not refused for its coding
    for codings in (["identity", "gzip"], ["gzip"], ["identity, br"]):
        status, headers, body = _post(srv, codings, gzip.compress(BODY))
        assert status == 415, (codings, status, body)
        assert body["error"]["code"] == "unsupported_content_encoding", body
        assert headers.get("accept-encoding") == "identity", headers
    assert "'identity, gzip'" in _post(srv, ["identity", "gzip"], BODY)[2]["error"]["message"]
    # identity, on any number of lines, is no coding at all
    for codings in (["identity"], ["identity", "Identity"], ["identity, identity"], []):
        status, _, body = _post(srv, codings, BODY)
        assert status == 200 and body["choices"][0]["finish_reason"] == "length", (codings, status, body)
    wait_idle(srv.url)
