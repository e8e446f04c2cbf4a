"""Hostile clients against a real server (session 40): each test is a way a client broke or
stalled the server, fixed; the server is the embedded SmolLM2 on the CPU."""
from __future__ import annotations

import json
import socket

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, wait_idle

T = 120


@pytest.fixture(scope="module")
def srv():
    with ServerProcess(["--max-total-tokens", "16384", "--log-level", "warning"]) as s:
        yield s


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
