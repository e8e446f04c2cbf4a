"""Hostile streaming clients: one that opens a stream and never reads it, and ones that go away
mid-stream. Whatever they do, the request ends, its KV is freed, and the server carries on.
test_unread_stream_is_aborted_and_its_kv_freed failed on the code before its fix (the stream
was held, and the request generated, until the client closed the socket)."""
from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, wait_idle

pytestmark = pytest.mark.slow
T = 120
WRITE_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def srv():
    s = ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning",
                       "--stream-write-timeout-s", str(WRITE_TIMEOUT_S)])
    yield s
    s.close()


def info(srv) -> dict:
    return requests.get(srv.url + "/get_server_info", timeout=T).json()


def assert_pool_whole(srv) -> None:
    i = wait_idle(srv.url)
    assert i["protected_slots"] == 0, i
    assert i["free_slots"] + i["evictable_slots"] == i["total_slots"], i


def raw_post(srv, path: str, body: dict, rcvbuf: int = 4096) -> socket.socket:
    """Send a POST on a socket with a small receive buffer, and read nothing of the answer."""
    data = json.dumps(body).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", srv.port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
    return s


def test_unread_stream_is_aborted_and_its_kv_freed(srv):
    """Every chunk of this stream carries ~300 KB (prompt logprobs, top 20, repeated in each
    chunk): a client that reads none of it fills the socket buffers in a few dozen tokens.
    The request was generated to its 2,000 tokens while its chunks queued in memory, and the
    connection held as long as the client liked. Now the connection is closed once nothing
    could be written for --stream-write-timeout-s, and the request is aborted."""
    prompt = " ".join(f"word{i % 50}" for i in range(150))
    s = raw_post(srv, "/generate", {
        "text": prompt, "stream": True, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 20,
        "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}})
    try:
        deadline = time.monotonic() + 150
        started = False
        while True:
            i = info(srv)
            started = started or i["num_running"] > 0
            if started and i["num_in_flight"] == 0 and i["num_running"] == 0:
                break
            assert time.monotonic() < deadline, f"the unread stream is still generating: {i}"
            time.sleep(0.5)
        # the server closed its side: reading what was buffered ends at EOF (or a reset)
        s.settimeout(30)
        try:
            while s.recv(1 << 20):
                pass
        except (ConnectionResetError, socket.timeout) as e:
            assert isinstance(e, ConnectionResetError), "the server kept the connection open"
    finally:
        s.close()
    assert_pool_whole(srv)
    r = requests.post(srv.url + "/generate", timeout=T, json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200


def test_a_slow_but_reading_stream_is_not_cut(srv):
    """A client that reads, slowly, keeps its stream: the bound is on a stalled write."""
    r = requests.post(srv.url + "/generate", stream=True, timeout=T, json={
        "text": "Once upon a time", "stream": True,
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
    chunks = []
    for line in r.iter_lines():
        if line.startswith(b"data: "):
            chunks.append(line)
            time.sleep(0.5)
    assert chunks[-1] == b"data: [DONE]" and len(chunks) >= 2
    assert_pool_whole(srv)


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "Once upon a time", "stream": True,
                   "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True, "n": 2}}),
    ("/v1/completions", {"prompt": "Once upon a time", "stream": True, "max_tokens": 400, "n": 3,
                         "temperature": 0.8, "seed": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell a long story"}], "stream": True,
                              "max_tokens": 400, "n": 2, "temperature": 0.8, "logprobs": True, "top_logprobs": 3}),
])
def test_disconnect_mid_stream_frees_kv(srv, path, body):
    r = requests.post(srv.url + path, json=body, stream=True, timeout=T)
    assert r.status_code == 200, r.text
    got = 0
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            got += 1
            if got == 4:
                break
    r.close()
    assert got == 4
    assert_pool_whole(srv)
