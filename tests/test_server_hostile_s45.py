"""Hostile and careless HTTP clients against a real server (session 45): a client that
half-closes its socket, tool-call arguments a model wrote with non-JSON numbers, the API key's
check."""
from __future__ import annotations

import http.client
import json
import re
import socket
import time

import pytest
import requests

from treadle.runtime.server.http_server import authorized
from treadle.runtime.server.testing import wait_idle
from treadle.runtime.server.tool_calls import plan_tools

T = 60


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: left idle
    return plain_server


def _no_leaked_kv(url: str) -> dict:
    info = wait_idle(url)
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"], info
    assert info["protected_slots"] == 0, info
    return info


def test_a_client_that_half_closes_after_its_request_gets_the_reply(srv):
    """shutdown(SHUT_WR) once the request is sent (some proxies and scripted clients do): the
    reply was never sent, the request aborted as if the client were gone. It comes now (after
    interim 100s while it is made, which http.client skips), those of requests it pipelined
    before too, and a client that closes its socket outright is still noticed as gone: its
    request is aborted, its KV freed."""
    body = json.dumps({"text": "Count to ten:", "sampling_params": {"max_new_tokens": 16, "temperature": 0,
                                                                   "ignore_eos": True}})
    # beside it, the same over HTTP/1.0, which gets no interim 100 (RFC 9110 15.2)
    old = socket.create_connection(("127.0.0.1", srv.port), timeout=T)
    old.sendall(f"POST /generate HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                f"{body}".encode())
    old.shutdown(socket.SHUT_WR)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=T)
    try:
        conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
        conn.sock.shutdown(socket.SHUT_WR)
        r = conn.getresponse()
        assert r.status == 200
        assert json.loads(r.read())["meta_info"]["completion_tokens"] == 16
    finally:
        conn.close()
    with old:
        reply = b""
        while chunk := old.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and json.loads(reply.split(b"\r\n\r\n", 1)[1])["output_ids"], reply
    one = json.dumps({"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
    post = (f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(one)}\r\n\r\n{one}").encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=T) as s:  # pipelined, then half-closed
        s.sendall(post * 2)
        s.shutdown(socket.SHUT_WR)
        replies = b""
        while chunk := s.recv(65536):  # each answered, then the server closes
            replies += chunk
    assert replies.count(b"HTTP/1.1 200 OK\r\n") == 2, replies
    before = _no_leaked_kv(srv.url)["generated_tokens"]
    long = json.dumps({"text": "Count forever:", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}})
    with socket.create_connection(("127.0.0.1", srv.port), timeout=T) as s:
        s.sendall(f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(long)}\r\n\r\n{long}".encode())
        s.shutdown(socket.SHUT_WR)
        time.sleep(0.3)  # then hangs up for good
    assert _no_leaked_kv(srv.url)["generated_tokens"] - before < 2000


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "array"}}}}}]


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_tool_call_arguments_parse_as_strict_json(choice):
    """Every way a reply's calls are read (a free reply's <tool_call> blocks and Llama-style
    object, arguments written as a JSON string, a `required` array whole or cut short): NaN /
    Infinity / -Infinity (JavaScript's words, which json.loads takes but JSON has not) came back
    in the arguments as they are (`{"x":NaN}`); a block with them is no call now (it stays the
    reply's text), and a number past a double's range (1e999: valid JSON, inf to Python; written
back as `Infinity`) as the model wrote it. Over HTTP (forced with `regex` beside tools) the
chat reply's arguments were `{"x":NaN}`; ToolPlan.parse is what makes them."""
    plan = plan_tools({"tools": TOOLS, "tool_choice": choice})
    for lit in ("NaN", "Infinity", "-Infinity"):
        if choice == "auto":  # (a `required` reply's grammar writes JSON numbers only)
            for text in (f'<tool_call>\n{{"name": "f", "arguments": {{"x": {lit}}}}}\n</tool_call>',
                         f'{{"name": "f", "arguments": {{"x": [1, {lit}]}}}}',
                         f'{{"name": "f", "arguments": "{{\\"x\\": {lit}}}"}}'):
                reply = plan.parse(text, "stop")
                assert reply.calls == () and reply.content == text, (text, reply)
    big = ('{"x": 1e999, "y": [-2.5E+400, 1.5, "\ue000", {"z": 1E+309}], "w": "1e999"}')
    texts = ([f"<tool_call>\n{{\"name\": \"f\", \"arguments\": {big}}}\n</tool_call>"] if choice == "auto" else
             [f'[{{"name": "f", "arguments": {big}}}]', f'[{{"name": "f", "arguments": {big}}}, {{"name": "f", "ar'])
    for text in texts:
        calls = plan.parse(text, "stop").calls
        assert calls and calls[0].arguments == '{"x":1e999,"y":[-2.5E+400,1.5,"\ue000",{"z":1E+309}],"w":"1e999"}'
        json.loads(calls[0].arguments, parse_constant=lambda name: pytest.fail(name))


def test_the_api_key_check():
    """The Authorization header against --api-key (the Gate's check): compared in constant
    time; the scheme's name in any case (RFC 9110 11.1: `bearer k` was a 401); a key of other
    than ASCII is matched by its UTF-8 (read as latin-1 text, it never matched); two header
    lines, none, garbage bytes: no key."""
    assert authorized([b"Bearer sk-1"], "sk-1")
    assert authorized([b"bearer sk-1"], "sk-1") and authorized([b"BEARER  sk-1"], "sk-1")
    assert authorized(["Bearer clé-ü".encode()], "clé-ü")
    for values in ([], [b""], [b"Bearer"], [b"Bearer "], [b"Bearer sk-"], [b"Bearer sk-12"], [b"Basic sk-1"],
                   [b"sk-1"], [b"Bearer sk-1", b"Bearer sk-1"], [b"\xff\xfe\x00"], ["Bearer clé-ü".encode("latin-1")]):
        assert not authorized(values, "sk-1" if values != ["Bearer clé-ü".encode("latin-1")] else "clé-ü"), values


def _exchange(port: int, data: bytes) -> bytes:
    """Send `data` on a connection of its own; everything the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_content_length_beside_transfer_encoding_is_a_400_that_closes(srv):
    """Both framings at once (RFC 9112 6.1: refuse it, or read the chunks and close): h11 read
    the chunks and kept the connection, so a request pipelined after the chunked body was served
    too (what a proxy framing by the length would not see: request smuggling), and a body sent by
    its length held the connection to the body's deadline (30 s). A 400 now, and the connection
    closes."""
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 1}}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for sent in (chunked, body):
        head = (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n" % len(sent))
        reply = _exchange(srv.port, head + sent)
        assert reply.startswith(b"HTTP/1.1 400 ") and reply.count(b"HTTP/1.1 ") == 1, reply
        err = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
        assert err["code"] == "invalid_http_request" and "Transfer-Encoding" in err["message"], err


def test_a_request_target_in_absolute_form_is_served(srv):
    """`POST http://host/generate HTTP/1.1` (RFC 9112 3.2.2: a server MUST accept the absolute
    form) was a 404 for every route: the whole URL was taken for the path. Its authority is
    the request's Host, so a keyless server's Host check still sees a foreign name."""
    body = json.dumps({"text": "Hi", "sampling_params": {"max_new_tokens": 1}}).encode()
    replies = {}
    for authority in (b"127.0.0.1:%d" % srv.port, b"rebound.example"):
        replies[authority] = _exchange(srv.port, b"POST http://%s/generate?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                       b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                                       b"Connection: close\r\n\r\n%s" % (authority, len(body), body))
    ok, foreign = replies.values()
    assert ok.startswith(b"HTTP/1.1 200 ") and json.loads(ok.split(b"\r\n\r\n", 1)[1])["output_ids"], ok
    assert foreign.startswith(b"HTTP/1.1 403 ") and b"host_not_allowed" in foreign, foreign


def _chunked(body: bytes, size: int) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
                    for i in range(0, len(body), size)) + b"0\r\n\r\n"


def test_a_body_of_tiny_chunks_is_refused_and_the_refusal_is_read(srv):
    """h11 makes an event of every chunk of a chunked body (13 us of the event loop each): a
    body sent a byte a chunk cost the loop 2 us a byte sent (6 MB of upload held it 13 s, other
    clients' /health taking 2 s). Past 4,096 chunks and one more a KiB it is a 400 naming the
    chunks, and the connection reads on a moment before it closes, so the client reads the
    refusal (closed at once, its unread input made the kernel reset the connection). A body
    in chunks of a KiB is read as before."""
    body = json.dumps({"prompt": "a" * 6000}).encode()
    head = (b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    fine = _exchange(srv.port, head + _chunked(body, 1024))
    assert fine.startswith(b"HTTP/1.1 200 "), fine[:300]
    refused = _exchange(srv.port, head + _chunked(body, 1))
    assert refused.startswith(b"HTTP/1.1 400 "), refused[:300]
    err = json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["code"] == "invalid_http_request" and "4101 chunks for 4101 bytes" in err["message"], err
