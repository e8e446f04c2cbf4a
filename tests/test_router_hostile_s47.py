"""Session 47: the router against careless or hostile clients, with one replica started with
--api-key (this module's own) behind one router."""
from __future__ import annotations

import pytest
import requests

from test_router import RouterProcess
import json
import socket
import time

from treadle.runtime.server.testing import ServerProcess

pytestmark = pytest.mark.slow
T = 120
KEY = "sk-s47-router"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_TIMEOUT_S = 1.0


def idle(srv: ServerProcess, timeout_s: float = 60) -> dict:
    """The replica's /get_server_info once it holds no request (its KV back)."""
    deadline = time.monotonic() + timeout_s
    while True:
        i = requests.get(srv.url + "/get_server_info", headers=AUTH, timeout=T).json()
        if i["num_in_flight"] == 0 and i["num_running"] == 0 and i["num_waiting"] == 0:
            return i
        assert time.monotonic() < deadline, i
        time.sleep(0.1)


@pytest.fixture(scope="module")
def keyed():
    srv = ServerProcess(["--max-total-tokens", "2048", "--log-level", "warning", "--api-key", KEY])
    router = RouterProcess([srv.url], "cache_aware", ["--request-body-timeout-s", str(BODY_TIMEOUT_S),
                                                      "--stream-write-timeout-s", "0.5"])
    yield srv, router
    router.close()
    srv.close()


def test_unknown_response_id_hears_the_replicas_api_key_check(keyed):
    """A stored-response id the router does not know went unanswered by any replica: the
    router said 404 itself, so a client without (or with a wrong) API key learned "not found"
    instead of the 401 it gets for every other request. Now a replica answers it: its 401,
    or, with the key, its own 404 / 400."""
    srv, router = keyed
    for path, method in (("/v1/responses/resp_nope", "GET"), ("/v1/responses/resp_nope", "DELETE"),
                         ("/v1/responses/resp_nope/input_items", "GET"), ("/v1/responses/resp_nope/cancel", "POST")):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = requests.request(method, router.url + path, headers=headers, timeout=T)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
        r = requests.request(method, router.url + path, headers=AUTH, timeout=T)
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found", (path, r.text)
    body = {"model": "default", "input": "hi", "max_output_tokens": 2, "previous_response_id": "resp_nope"}
    r = requests.post(router.url + "/v1/responses", json=body, timeout=T)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
    for stream in (False, True):
        r = requests.post(router.url + "/v1/responses", json={**body, "stream": stream}, headers=AUTH, timeout=T)
        assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found", r.text
    idle(srv)


def test_an_integer_of_too_many_digits_is_the_replicas_400(keyed):
    """A JSON integer of more than 4,300 digits makes Python's json.loads raise a ValueError
    that is no JSONDecodeError: the router answered 500 "Internal Server Error" (a plain text
    body) on every forwarded path, where the replica names the field in a 400."""
    srv, router = keyed
    huge = "1" * 5000
    for path, body in (("/generate", '{"text": "hi", "sampling_params": {"max_new_tokens": %s}}' % huge),
                       ("/v1/completions", '{"model": "default", "prompt": "hi", "max_tokens": %s}' % huge),
                       ("/v1/chat/completions", '{"model": "default", "messages": [], "seed": %s}' % huge),
                       ("/v1/responses", '{"model": "default", "input": "hi", "top_logprobs": %s}' % huge),
                       ("/tokenize", '{"prompt": "hi", "x": %s}' % huge)):
        r = requests.post(router.url + path, data=body, headers={**AUTH, "Content-Type": "application/json"},
                          timeout=T)
        assert r.status_code == 400 and "4300 digits" in r.json()["error"]["message"], (path, r.text)
    idle(srv)


def test_broadcasts_without_the_api_key_are_the_replicas_401(keyed):
    """GET /get_server_info and POST /flush_cache go to every replica: without the key, the
    router answered 200 with its own stats and the replica URLs (every replica's info null), and
    a 400 "not flushed on ...: HTTP 401", where a replica (and /abort_request) says 401."""
    srv, router = keyed
    for method, path in (("GET", "/get_server_info"), ("POST", "/flush_cache")):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = requests.request(method, router.url + path, headers=headers, timeout=T)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    assert requests.get(router.url + "/get_server_info", headers=AUTH, timeout=T).json()["replicas"][0]["server_info"]
    assert requests.post(router.url + "/flush_cache", headers=AUTH, timeout=T).json()["success"] is True


def test_head_is_answered_as_get(keyed):
    """`curl -I` and HEAD health monitors got a 405 from the router where a replica answers
    HEAD wherever it answers GET (RFC 9110)."""
    srv, router = keyed
    for path, headers, status in (("/health", {}, 200), ("/v1/models", AUTH, 200), ("/v1/models", {}, 401),
                                  ("/get_server_info", AUTH, 200)):
        assert requests.head(srv.url + path, headers=headers, timeout=T).status_code == status, path
        r = requests.head(router.url + path, headers=headers, timeout=T)
        assert r.status_code == status and r.content == b"", (path, r.status_code)


def test_a_body_that_never_arrives_is_a_408(keyed):
    """A client that sent its headers and a Content-Length, then part of the body or none
    (slowloris), held its router connection and handler forever (a replica answers 408 after
    --request-body-timeout-s); now the router does too, with the flag of the same name."""
    srv, router = keyed
    with socket.create_connection(("127.0.0.1", router.port)) as s:
        s.settimeout(30)
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"text\":")
        answer = b""
        while chunk := s.recv(4096):  # until the router closes the connection
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ") and b"--request-body-timeout-s" in answer, answer
    r = requests.post(router.url + "/generate", headers=AUTH, timeout=T,
                      json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200, r.text
    idle(srv)


def test_two_authorization_lines_are_refused_as_a_replica_refuses_them(keyed):
    """A replica takes exactly one Authorization line; the router kept only the last of
    several, so a request with a wrong key and then the right one passed the router where the
    replica itself says 401."""
    import http.client

    srv, router = keyed
    for url in (srv.url, router.url):
        for path, method, body in (("/generate", "POST", b'{"text": "hi", "sampling_params": {"max_new_tokens": 1}}'),
                                   ("/get_server_info", "GET", None)):
            conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=T)
            conn.putrequest(method, path)
            conn.putheader("Authorization", "Bearer wrong")
            conn.putheader("Authorization", f"Bearer {KEY}")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body or b"")))
            conn.endheaders(body)
            r = conn.getresponse()
            assert r.status == 401, (url, path, r.status, r.read())
            conn.close()


def _in_flight(router) -> int:
    return requests.get(router.url + "/get_server_info", headers=AUTH, timeout=T).json()["replicas"][0]["in_flight"]


def test_a_stream_its_client_does_not_read_is_ended(keyed):
    """A client that opened a stream and read none of it held the router's relay (blocked on
    its write), its in-flight count and the connection for as long as the socket stayed
    open; the replica's request ran on until its own write timeout. Now the router, as a
    replica, disconnects it after --stream-write-timeout-s, closing the upstream request."""
    srv, router = keyed
    body = json.dumps({"text": "word " * 300, "stream": True, "return_logprob": True, "logprob_start_len": 0,
                       "top_logprobs_num": 20, "return_text_in_logprobs": True,
                       "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}).encode()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer piles up at the router
        s.connect(("127.0.0.1", router.port))
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (KEY.encode(), len(body), body))
        deadline = time.monotonic() + 60
        while _in_flight(router) == 0:  # relayed
            assert time.monotonic() < deadline
            time.sleep(0.1)
        while _in_flight(router) != 0:  # the client reads nothing and keeps its socket open
            assert time.monotonic() < deadline, "the unread stream still holds the router"
            time.sleep(0.2)
        info = idle(srv)
    assert info["num_running"] == 0
