"""Hostile and sloppy clients against a real server (session 39): each request here went wrong
before its fix (a hang of the whole server, a 500, a stream a line reader could not read, a
stream that sent nothing, a 4 KB error message, an abort reaching other clients' batches);
tests/test_server_hostile_s39_units.py checks the same fixes where they are made. Every test
ends with the KV pool whole."""
from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, sse_events, wait_idle

pytestmark = pytest.mark.slow
T = 120
CONTEXT = 512


@pytest.fixture(scope="module")
def srv():
    # a KV pool no larger than the context: a prompt near the context fills it
    s = ServerProcess(["--context-length", str(CONTEXT), "--max-total-tokens", str(CONTEXT), "--log-level", "warning"])
    yield s
    s.close()


def assert_pool_whole(srv) -> None:
    i = wait_idle(srv.url)
    assert i["protected_slots"] == 0, i
    assert i["free_slots"] + i["evictable_slots"] == i["total_slots"], i


def post(srv, path: str, body: dict, **kw) -> requests.Response:
    return requests.post(srv.url + path, json=body, timeout=kw.pop("timeout", T), **kw)


def test_a_prompt_one_short_of_the_context_without_max_new_tokens_hangs_nothing(srv):
    """/generate of context - 1 tokens, max_new_tokens left out (128): the context allows one
    token, and it is answered with one. The scheduler reserved room for 128 and never admitted
    it, and every request after it waited too: the server answered no generation again."""
    ids = [100 + i % 50 for i in range(CONTEXT - 1)]
    edge: list = []
    t = threading.Thread(target=lambda: edge.append(post(srv, "/generate", {
        "input_ids": ids, "sampling_params": {"ignore_eos": True, "temperature": 0}})))
    t.start()
    deadline = time.monotonic() + 60
    while not edge and requests.get(srv.url + "/get_server_info", timeout=T).json()["num_in_flight"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = post(srv, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 3}}, timeout=60)
    assert r.status_code == 200, r.text
    t.join(T)
    assert edge and edge[0].status_code == 200, edge
    meta = edge[0].json()["meta_info"]
    assert meta["completion_tokens"] == 1 and meta["finish_reason"]["type"] == "length", meta
    assert_pool_whole(srv)


def test_a_tool_call_whose_arguments_nest_too_deeply_is_a_400(srv):
    """An earlier assistant turn whose tool call's arguments (JSON text) nest 100,000 levels:
    reading them for the prompt raised RecursionError, a 500 on /v1/chat/completions and on
    /tokenize. A 400 naming messages now; arguments that nest reasonably still render."""
    def body(arguments: str) -> dict:
        return {"messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": None, "tool_calls": [
                                 {"id": "1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
                             {"role": "tool", "content": "ok", "tool_call_id": "1"}]}

    deep = "[" * 100_000 + "]" * 100_000
    for path, extra in (("/v1/chat/completions", {"max_tokens": 1}), ("/tokenize", {})):
        r = post(srv, path, {**body(deep), **extra})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "messages" and "nest too deeply" in err["message"], err
        assert post(srv, path, {**body('{"a": [[1, 2], {"b": 3}]}'), **extra}).status_code == 200
    assert_pool_whole(srv)


SEPARATORS = "a\u2028b\x85c\u2029d"


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "Say it", "stream": True, "sampling_params": {"max_new_tokens": 16, "choices": [SEPARATORS]}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say it"}], "stream": True, "max_tokens": 16,
                              "choices": [SEPARATORS]}),
    ("/v1/completions", {"prompt": "Say it", "stream": True, "max_tokens": 16, "choices": [SEPARATORS], "n": 2,
                         "logprobs": 1}),
])
def test_a_stream_of_line_separators_reads_line_by_line(srv, path, body):
    """A reply holding U+2028, U+0085 or U+2029, streamed: treadle's own sse_events (requests'
    iter_lines(decode_unicode=True)) split each event at them, and json.loads failed on both
    halves. The characters are escaped in the events now, and the reply is whole."""
    r = post(srv, path, body, stream=True)
    assert r.status_code == 200, r.text
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    if path == "/generate":
        text = events[-2]["text"]
    elif path == "/v1/chat/completions":
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    else:
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"][0]["index"] == 1)
    assert text == SEPARATORS
    assert_pool_whole(srv)


def test_a_stream_of_invalid_bytes_streams(srv, smollm2_tokenizer):
    """logit_bias forcing the token of the byte 0x80, never valid UTF-8: the detokenizer held
    the text as a character still to come, so the stream sent nothing until its end (and
    decoded the whole held tail again at every token). Now the text streams as it comes,
    U+FFFD for each byte, and adds up to the unstreamed reply."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tid = smollm2_tokenizer.convert_tokens_to_ids(bytes_to_unicode()[0x80])
    sp = {"max_new_tokens": 40, "ignore_eos": True, "logit_bias": {str(tid): 100}}
    r = post(srv, "/generate", {"text": "Hi", "stream": True, "sampling_params": sp}, stream=True)
    events = [e for e in sse_events(r) if e != "[DONE]"]
    assert len(events) >= 2
    assert any(e["text"] for e in events if e["meta_info"]["finish_reason"] is None), "nothing streamed before the end"
    assert events[-1]["text"] == "\ufffd" * 40
    assert post(srv, "/generate", {"text": "Hi", "sampling_params": sp}).json()["text"] == "\ufffd" * 40
    assert_pool_whole(srv)


@pytest.mark.parametrize("path,body,param", [
    ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": "BIG"}, "top_logprobs_num"),
    ("/generate", {"text": "Hi", "return_logprob": True, "logprob_start_len": "-BIG"}, "logprob_start_len"),
    ("/generate", {"input_ids": [1, "BIG"]}, "input_ids"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": "BIG"}}, "max_new_tokens"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": "BIG"}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": "BIG"},
     "max_completion_tokens"),
])
def test_a_4000_digit_integer_is_quoted_by_its_first_digits(srv, path, body, param):
    """Integers of up to 4,300 digits parse; the errors of these fields quoted one whole (a
    4 KB message, the bound on any message) instead of its first digits and digit count."""
    raw = json.dumps(body).replace('"-BIG"', "-" + "9" * 4000).replace('"BIG"', "9" * 4000)
    r = requests.post(srv.url + path, data=raw, headers={"Content-Type": "application/json"}, timeout=T)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert len(err["message"]) < 500 and "4,000 digits" in err["message"], err["message"][:300]
    assert err["param"] == param, err


def test_an_abort_of_the_empty_rid_reaches_no_batch(srv):
    """A batch sent with rid "" has no name (its parts get their own, as without a rid), but
    "" was kept as the batch's name: /abort_request {"rid": ""}, from anyone, ended every
    such batch."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(post(srv, "/generate", {
        "text": ["Count to fifty:", "Name thirty animals:"], "rid": "",
        "sampling_params": {"max_new_tokens": 64, "ignore_eos": True, "temperature": 0}})))
    t.start()
    deadline = time.monotonic() + 60
    while not out and requests.get(srv.url + "/get_server_info", timeout=T).json()["num_running"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert post(srv, "/abort_request", {"rid": ""}).json() == {"success": False}
    t.join(T)
    assert out and out[0].status_code == 200, out
    assert [x["meta_info"]["finish_reason"]["type"] for x in out[0].json()] == ["length", "length"]
    assert_pool_whole(srv)


def test_a_stream_that_fell_behind_sends_what_queued_as_one_chunk(srv):
    """/generate streams cumulative chunks: with prompt logprobs (top 20) every chunk repeats
    them, here ~300 KB. A client that reads slowly let the outputs queue, and then each one was
    rendered (on the event loop every client shares) and sent, however far behind: a stream of
    n tokens cost n renders of the whole. Now the outputs that queued meanwhile come as one
    chunk, whose content (cumulative) is what the last of them would have had."""
    import socket

    ids = [100 + (i * 7) % 300 for i in range(400)]
    body = {"input_ids": ids, "stream": True, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 20,
            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0}}
    data = json.dumps(body).encode()
    before = requests.get(srv.url + "/get_server_info", timeout=T).json()["generated_tokens"]
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", srv.port))
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    try:
        deadline = time.monotonic() + T  # read nothing until the request is done generating
        while True:
            i = requests.get(srv.url + "/get_server_info", timeout=T).json()
            if i["num_in_flight"] == 0 and i["generated_tokens"] >= before + 40:  # finished, unread
                break
            assert time.monotonic() < deadline, i
            time.sleep(0.2)
        s.settimeout(T)
        raw = b""
        while not raw.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
            part = s.recv(1 << 20)
            assert part, raw[-300:]
            raw += part
    finally:
        s.close()
    body_bytes, rest = b"", raw.split(b"\r\n\r\n", 1)[1]
    while True:  # undo the chunked transfer coding
        size, rest = rest.split(b"\r\n", 1)
        if int(size, 16) == 0:
            break
        body_bytes, rest = body_bytes + rest[:int(size, 16)], rest[int(size, 16) + 2:]
    events = [json.loads(line[6:]) for line in body_bytes.split(b"\n") if line.startswith(b"data: {")]
    assert len(events) < 20, f"{len(events)} chunks for 40 tokens"
    last = events[-1]
    meta = last["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and len(last["output_ids"]) == 40
    assert len(meta["output_token_logprobs"]) == 40 and len(meta["input_token_logprobs"]) == len(ids)
    whole = post(srv, "/generate", {**body, "stream": False}).json()
    assert last["text"] == whole["text"] and last["output_ids"] == whole["output_ids"]
    assert_pool_whole(srv)



@pytest.mark.parametrize("path", ["/health", "/v1/models", "/v1/models/default", "/version", "/get_model_info",
                                  "/metrics"])
def test_head_is_answered_wherever_get_is(srv, path):
    """`curl -I` and monitors that probe with HEAD got a 405 from every route: HTTP servers
    must answer HEAD where they answer GET (RFC 9110 9.1), with GET's status and headers and
    no body."""
    import socket

    got = requests.get(srv.url + path, timeout=T)
    head = requests.head(srv.url + path, timeout=T)
    assert head.status_code == got.status_code == 200, (head.status_code, head.text)
    assert head.headers.get("content-type") == got.headers.get("content-type")
    # no body on the wire: a GET after it on the same connection reads as its own response
    with socket.create_connection(("127.0.0.1", srv.port), timeout=T) as s:
        s.sendall(b"HEAD %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                  % path.encode())
        raw = b""
        while not raw.endswith(b"}"):
            part = s.recv(1 << 16)
            assert part, raw
            raw += part
    first, second = raw.split(b"\r\n\r\n", 1)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200"), raw[:500]
    assert second.endswith(b'\r\n\r\n' + requests.get(srv.url + "/version", timeout=T).content)


def test_head_of_a_post_route_is_still_a_405(srv):
    r = requests.head(srv.url + "/generate", timeout=T)
    assert r.status_code == 405 and "POST" in r.headers.get("allow", "")
