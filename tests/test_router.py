"""The data-parallel router against two real replica servers (embedded SmolLM2): cache-aware
placement, round robin, streaming relay, disconnect abort, and losing a replica.

The replica killed in the last test is the module fixture's second one, so that test
runs last (pytest keeps file order)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from treadle.runtime.router_policy import CacheAwarePolicy, TextPrefixTree
from treadle.runtime.server.testing import ServerProcess, free_port, sse_events, wait_idle

pytestmark = pytest.mark.slow
T = 120
HEADER = "X-Treadle-Replica"
# two long shared prefixes (~400 chars each) so the prefix, not the question, dominates
PREFIX_A = "You are a careful geography tutor. Answer in one word. " * 7
PREFIX_B = "Translate the following English words into French, lowercase only. " * 6


class RouterProcess:
    def __init__(self, workers: list[str], policy: str, extra: list[str] | None = None,
                 startup_timeout_s: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="treadle-router-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "treadle.runtime.router", "--port", str(self.port), "--policy", policy,
               "--health-interval-s", "0.5", *[a for w in workers for a in ("--worker", w)], *(extra or [])]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"router exited: {self.tail()}"
            try:
                requests.get(self.url + "/health", timeout=2)
                return  # listening (503 is fine too: that is the no-replica test)
            except requests.RequestException:
                time.sleep(0.2)
        self.close()
        raise TimeoutError(f"router not up: {self.tail()}")

    def tail(self) -> str:
        with open(self.log.name) as f:
            return f.read()[-3000:]

    def info(self) -> dict:
        r = requests.get(self.url + "/get_server_info", timeout=T)
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="module")
def replicas(plain_server):
    # the first is the plain server other modules share (conftest.py); the second, which
    # test_killed_replica_loses_no_request kills, is this module's own, of the same flags
    srv = ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning"])
    yield [plain_server, srv]
    srv.close()


@pytest.fixture
def router(request, replicas):
    r = RouterProcess([s.url for s in replicas], request.param)
    yield r
    r.close()


def generate(url: str, text: str, n: int = 2, **extra) -> requests.Response:
    body = {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}, **extra}
    return requests.post(url + "/generate", json=body, timeout=T)



def test_prefix_tree_match_insert_evict():
    t = TextPrefixTree(max_chars=40)
    t.insert("hello world")
    t.insert("hello there")
    assert (t.match("hello wor"), t.match("hello thx"), t.match("bye"), t.size) == (9, 8, 0, 16)
    t.insert("x" * 30)  # 46 > 40: the least recently used leaves go, "world" (older) before "there"
    assert t.size <= 40 and t.match("x" * 30) == 30 and t.match("hello world") == 6


def test_cache_aware_policy_prefers_match_unless_imbalanced():
    p = CacheAwarePolicy(2)
    p.on_routed(1, PREFIX_A + "Q1")
    assert p.choose(PREFIX_A + "Q2", [0, 1], [0, 0])[0] == 1
    assert p.choose(PREFIX_A + "Q2", [0, 1], [0, 9])[0] == 0  # spread 9 > 4: least loaded wins
    assert p.choose(PREFIX_B, [0, 1], [0, 0])[0] == 0  # no match: the emptier tree


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
def test_cache_aware_groups_prefixes_on_one_replica(router, replicas):
    placed: dict[str, set[str]] = {"A": set(), "B": set()}
    cached = []
    for i in range(3):
        for name, prefix in (("A", PREFIX_A), ("B", PREFIX_B)):
            r = generate(router.url, prefix + f"Question {i}: what is item {i}?")
            assert r.status_code == 200, r.text
            placed[name].add(r.headers[HEADER])
            cached.append(r.json()["meta_info"]["cached_tokens"])
    assert len(placed["A"]) == 1 and len(placed["B"]) == 1, placed
    assert placed["A"] != placed["B"], "two prefix groups on an idle pair should spread out"
    assert all(c > 50 for c in cached[2:]), cached  # every repeat reuses its group's prefix on the replica
    info = router.info()
    assert info["router"]["policy"] == "cache_aware"
    assert sorted(x["routed"] for x in info["replicas"]) == [3, 3]
    assert all(x["prefix_match_rate"] > 0.5 for x in info["replicas"])
    assert info["cached_tokens"] >= sum(cached) and info["prompt_tokens"] > 0


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
def test_cache_aware_places_concurrent_same_prefix_together(router, replicas):
    # the placement is recorded when routed, not when answered: requests in flight together
    # with a new prefix still land on one replica
    prefix = "Summarize the following note in three words, then stop. " * 8
    with ThreadPoolExecutor(4) as pool:
        rs = list(pool.map(lambda i: generate(router.url, prefix + f"Note {i}: the sky is blue."), range(4)))
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
    assert len({r.headers[HEADER] for r in rs}) == 1


@pytest.mark.parametrize("router", ["round_robin"], indirect=True)
def test_round_robin_alternates(router, replicas):
    seen = []
    for i in range(4):
        r = generate(router.url, PREFIX_A + f"Round {i}?", n=1)
        assert r.status_code == 200, r.text
        seen.append(r.headers[HEADER])
    assert seen[0] != seen[1] and seen[0::2] == [seen[0]] * 2 and seen[1::2] == [seen[1]] * 2, seen
    assert {x["routed"] for x in router.info()["replicas"]} == {2}
    metrics = requests.get(router.url + "/metrics", timeout=T).text
    for rep in replicas:
        assert f'treadle_router_requests_total{{replica="{rep.url}",status="200"}} 2.0' in metrics, metrics
        assert f'treadle_router_replica_healthy{{replica="{rep.url}"}} 1.0' in metrics
        assert f'treadle_router_replica_in_flight_requests{{replica="{rep.url}"}} 0.0' in metrics
    assert "treadle_router_no_replica_total 0.0" in metrics


def test_body_limit_and_cors(replicas):
    """The router refuses a body past --max-request-bytes with a 413 before a replica sees it
    (declared or chunked), sends CORS headers only for the origins it is given, and serves a
    browser page's POST only from those."""
    page = {"Origin": "http://app.example"}
    preflight = {**page, "Access-Control-Request-Method": "POST"}
    plain = RouterProcess([s.url for s in replicas], "round_robin")
    try:
        r = requests.options(plain.url + "/generate", headers=preflight, timeout=T)
        assert "access-control-allow-origin" not in r.headers, r.headers
        resp = requests.post(plain.url + "/generate", headers=page, timeout=T,
                             json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
        # refused as a keyless replica refuses it (test_server_hostile_s48): a page's POST that
        # needs no preflight would run here otherwise
        assert resp.status_code == 403 and "access-control-allow-origin" not in resp.headers, resp.headers
        assert resp.json()["error"]["code"] == "origin_not_allowed" and HEADER not in resp.headers, resp.text
    finally:
        plain.close()
    r = RouterProcess([s.url for s in replicas], "round_robin",
                      ["--max-request-bytes", "100000", "--allowed-origins", "http://app.example"])
    try:
        for body in (json.dumps({"text": "x" * 200_000}).encode(),  # declared length
                     iter([b'{"text": "', b"x" * 150_000, b'"}'])):  # chunked, no length
            resp = requests.post(r.url + "/generate", data=body, headers={"Content-Type": "application/json"},
                                 timeout=T)
            assert resp.status_code == 413, resp.text
            assert resp.json()["error"]["code"] == "request_too_large", resp.text
            assert HEADER not in resp.headers  # no replica was asked
        assert {x["routed"] for x in r.info()["replicas"]} == {0}
        pre = requests.options(r.url + "/v1/chat/completions", headers=preflight, timeout=T)
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://app.example"
        ok = requests.post(r.url + "/generate", headers=page, timeout=T,
                           json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example", ok.text
        other = requests.options(r.url + "/generate", headers={**preflight, "Origin": "http://evil.example"},
                                 timeout=T)
        assert other.headers.get("access-control-allow-origin") != "http://evil.example"
    finally:
        r.close()


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
def test_streaming_through_router(router, replicas):
    with requests.post(router.url + "/generate", stream=True, timeout=T, json={
            "text": "Count: one, two,", "stream": True,
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    chunks = [e for e in events if e != "[DONE]"]
    assert len(chunks) >= 2 and len(chunks[-1]["output_ids"]) == 5  # cumulative, as SGLang streams
    with requests.post(router.url + "/v1/chat/completions", stream=True, timeout=T, json={
            "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0,
            "stream": True}) as r:
        assert r.status_code == 200, r.text
        events = sse_events(r)
    assert events[-1] == "[DONE]" and all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    models = requests.get(router.url + "/v1/models", timeout=T)
    assert models.status_code == 200 and models.json()["data"]
    name = models.json()["data"][0]["id"]
    assert requests.get(router.url + "/v1/models/" + name, timeout=T).json()["id"] == name
    assert requests.get(router.url + "/v1/models/no-such-model", timeout=T).status_code == 404
    bad = requests.post(router.url + "/v1/completions", json={"prompt": "x", "max_tokens": -3}, timeout=T)
    assert bad.status_code == 400 and "error" in bad.json()  # the replica's 400 comes back as is


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
def test_dsl_through_router(router, replicas):
    """A DSL program pointed at the router: select tokenizes through the forwarded /tokenize,
    and a streamed gen reads the replicas' /generate stream as their model info says."""
    from treadle.lang import RuntimeEndpoint, function, gen, select

    @function
    def prog(s):
        s += "The capital of France is "
        s += select("city", ["Paris", "London", "banana"])
        s += ". Count: one, two,"
        s += gen("more", max_tokens=6, temperature=0)

    be = RuntimeEndpoint(router.url)
    st = prog.run(backend=be, stream=True)
    pieces = list(st.text_iter("more"))
    assert st["city"] == "Paris" and "".join(pieces) == st["more"] and st["more"]
    assert requests.post(router.url + "/detokenize", json={"tokens": be.encode(["Hi there"])[0]},
                         timeout=T).json()["prompt"] == "Hi there"


def test_response_homes_are_bounded_as_the_replicas_stores():
    from treadle.runtime.router_responses import STORE_CAPACITY, ResponseHomes, stored_response_id
    from treadle.runtime.server.responses_api import STORE_CAPACITY as REPLICA_STORE_CAPACITY

    assert STORE_CAPACITY == REPLICA_STORE_CAPACITY
    homes = ResponseHomes(2)
    homes.put("a", 0)
    homes.put("b", 1)
    assert homes.get("a") == 0  # named: kept longer than b
    homes.put("c", 1)
    assert (homes.get("a"), homes.get("b"), homes.get("c")) == (0, None, 1)
    homes.forget_replica(1)
    assert (len(homes), homes.get("a")) == (1, 0)
    first = {"type": "response.created", "response": {"id": "resp_1", "object": "response", "store": True}}
    assert stored_response_id(b'event: response.created\ndata: ' + json.dumps(first).encode() + b"\n\nevent: x",
                              True) == "resp_1"
    assert stored_response_id(json.dumps({**first["response"], "store": False}).encode(), False) is None
    assert stored_response_id(b"data: [DONE]\n\n", True) is None


@pytest.mark.parametrize("router", ["round_robin"], indirect=True)
def test_responses_api_through_router(router, replicas):
    """The Responses API through the router (it was a 404): a stored response lives on the
    replica that made it, so a continuation and GET / DELETE / input_items / cancel of its id
    go there, where round robin would send the next request to the other replica."""
    import openai

    client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=T)
    raw = client.responses.with_raw_response.create(model="default", input="Say hi.", max_output_tokens=2,
                                                    temperature=0)
    first, home = raw.parse(), raw.headers[HEADER]
    for _ in range(2):  # whichever replica round robin is at: the one holding `first`
        raw = client.responses.with_raw_response.create(model="default", input="Again.", max_output_tokens=2,
                                                        previous_response_id=first.id)
        assert raw.headers[HEADER] == home and raw.parse().previous_response_id == first.id
    with client.responses.create(model="default", input="Count: one,", max_output_tokens=2, stream=True) as st:
        events = list(st)
    streamed = events[0].response.id  # the router read it from the first event it relayed
    assert events[-1].response.id == streamed and events[-1].type in ("response.completed", "response.incomplete")
    raw = client.responses.with_raw_response.retrieve(streamed)
    assert raw.parse().id == streamed and raw.headers[HEADER] in {s.url for s in replicas}
    assert [i.type for i in client.responses.input_items.list(first.id).data] == ["message"]
    with pytest.raises(openai.BadRequestError, match="only a background response can be cancelled"):
        client.responses.cancel(first.id)  # the replica's answer: it holds it
    client.responses.delete(first.id)
    for call in (lambda: client.responses.retrieve(first.id), lambda: client.responses.retrieve("resp_unknown"),
                 lambda: client.responses.delete("resp_unknown")):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert info.value.body["code"] == "response_not_found" and info.value.body["param"] == "response_id"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="default", input="x", max_output_tokens=2, previous_response_id=first.id)
    assert info.value.body["code"] == "previous_response_not_found", info.value.body
    for s in replicas:
        wait_idle(s.url)


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
def test_stream_disconnect_aborts_on_replica(router, replicas):
    r = requests.post(router.url + "/generate", stream=True, timeout=T, json={
        "text": "Write a very long story about a dragon.", "stream": True,
        "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200
    replica = r.headers[HEADER]
    next(r.iter_lines())  # generation has started on the replica
    r.close()
    info = wait_idle(replica, timeout_s=30)
    assert info["generated_tokens"] < 2000
    assert all(x["in_flight"] == 0 for x in router.info()["replicas"])


STORY = "Write a very long story about a castle."
LONG = {"temperature": 0, "ignore_eos": True}


def _busy_replica(router: RouterProcess, timeout_s: float = 60) -> str:
    """The URL of the replica the router has a request in flight on, once it is decoding."""
    deadline = time.monotonic() + timeout_s
    while True:
        for x in router.info()["replicas"]:
            if x["in_flight"] == 1 and (x["server_info"] or {}).get("num_running") == 1:
                return x["url"]
        assert time.monotonic() < deadline, "the request never started on a replica"
        time.sleep(0.2)


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": STORY, "sampling_params": {"max_new_tokens": 2000, **LONG}}),
    ("/v1/completions", {"prompt": STORY, "max_tokens": 2000, **LONG}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": STORY}], "max_tokens": 2000, **LONG}),
], ids=["generate", "completions", "chat"])
def test_non_streamed_disconnect_aborts_on_replica(router, replicas, path, body):
    """A client that hangs up on a non-streamed request while the replica generates: the
    router closes the upstream request, so the replica aborts it and the router's in-flight
    count drops (it used to notice only at the replica's response headers, which a
    non-streamed answer sends at the end: the replica generated every token)."""
    before = {x["url"]: x["server_info"]["generated_tokens"] for x in router.info()["replicas"]}
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", router.port), timeout=T) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        replica = _busy_replica(router)
        time.sleep(1.0)  # the client waits a little, then hangs up
    info = wait_idle(replica, timeout_s=20)  # 2000 tokens take far longer on this CPU model
    assert info["generated_tokens"] - before[replica] < 2000
    deadline = time.monotonic() + 5
    while any(x["in_flight"] for x in router.info()["replicas"]):
        assert time.monotonic() < deadline, router.info()["replicas"]
        time.sleep(0.1)


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
def test_flush_cache_names_the_replica_that_refused(router, replicas):
    """/flush_cache is broadcast: idle replicas flush (200); while one still runs a request
    it refuses, and the router's 400 says which replica and why (it was a bare
    {"success": false})."""
    ok = requests.post(router.url + "/flush_cache", timeout=T)
    assert ok.status_code == 200 and ok.json() == {"success": True}
    with requests.post(router.url + "/generate", stream=True, timeout=T, json={
            "text": STORY, "stream": True, "sampling_params": {"max_new_tokens": 2000, **LONG}}) as r:
        assert r.status_code == 200
        busy = _busy_replica(router)
        refused = requests.post(router.url + "/flush_cache", timeout=T)
    assert refused.status_code == 400 and refused.json()["success"] is False
    message = refused.json()["message"]
    assert busy in message and "still running" in message, message
    assert [u for u in (s.url for s in replicas) if u != busy][0] not in message  # the idle one flushed
    wait_idle(busy, timeout_s=30)
    assert requests.post(router.url + "/flush_cache", timeout=T).status_code == 200


def test_sigterm_closes_open_streams_after_the_grace(replicas):
    """SIGTERM with a stream open and its client reading: the router closes it once
    --shutdown-grace-s has passed and exits (it used to relay on for as long as the client
    read), and the replica aborts the request whose client went."""
    router = RouterProcess([replicas[0].url], "round_robin", ["--shutdown-grace-s", "1"])
    try:
        r = requests.post(router.url + "/generate", stream=True, timeout=T, json={
            "text": "Write a very long story about a knight.", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}})
        lines = r.iter_lines(decode_unicode=True)
        next(lines)  # generation has started on the replica
        waiting = ThreadPoolExecutor(1).submit(requests.post, router.url + "/generate", timeout=T, json={
            "text": "Another long story.", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}})
        time.sleep(1.0)  # the non-streamed request is on its replica
        t0 = time.monotonic()
        router.proc.send_signal(signal.SIGTERM)
        tail = []
        for line in lines:  # the client reads on until the router ends the stream
            assert time.monotonic() - t0 < 60, "the router kept the stream open"
            if line:
                tail = (tail + [line])[-2:]
        # ended as a stream ends: an error event, then [DONE] (it was cut mid-stream)
        assert tail[-1] == "data: [DONE]" and "the router is shutting down" in tail[0], tail
        late = waiting.result(timeout=T)
        assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"], late.text
        router.proc.wait(timeout=30)
        assert time.monotonic() - t0 < 30
        assert "Exception in ASGI application" not in router.tail(), router.tail()
        wait_idle(replicas[0].url, timeout_s=30)  # the replica aborted the requests whose client went
    finally:
        router.close()


def test_no_healthy_replica_is_503():
    dead = f"http://127.0.0.1:{free_port()}"
    r = RouterProcess([dead], "cache_aware")
    try:
        assert requests.get(r.url + "/health", timeout=T).status_code == 503
        resp = generate(r.url, "hi")
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "no_healthy_replica"
        metrics = requests.get(r.url + "/metrics", timeout=T).text
        assert "treadle_router_no_replica_total 1.0" in metrics
        assert f'treadle_router_replica_healthy{{replica="{dead}"}} 0.0' in metrics
    finally:
        r.close()


def test_router_errors_are_shaped_as_a_replicas():
    """What the router answers itself: a body nesting past the parser's depth (was a bare 500
    from a RecursionError), a bad /abort_request body (was 200 {"success": false}), a flush
    with no replica to flush (was 200 success), unknown paths and methods (were {"detail"})."""
    r = RouterProcess([f"http://127.0.0.1:{free_port()}"], "cache_aware")
    try:
        deep = b'{"text": ' + b"[" * 100000 + b"]" * 100000 + b"}"
        for path in ("/generate", "/v1/chat/completions"):
            resp = requests.post(r.url + path, data=deep, headers={"content-type": "application/json"}, timeout=T)
            assert resp.status_code == 400 and "nests too deeply" in resp.json()["error"]["message"], resp.text
        for body, says in ((b"{bad", "not valid JSON"), (b'{"rid": 123}', "rid must be a string"),
                           (b"{}", "rid must be a string"), (b"[1]", "must be a JSON object")):
            resp = requests.post(r.url + "/abort_request", data=body, timeout=T)
            assert resp.status_code == 400 and says in resp.json()["error"]["message"], (body, resp.text)
        resp = requests.post(r.url + "/flush_cache", timeout=T)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_healthy_replica", resp.text
        resp = requests.get(r.url + "/no/such/path", timeout=T)
        assert resp.status_code == 404 and resp.json()["error"]["type"] == "not_found_error", resp.text
        resp = requests.get(r.url + "/generate", timeout=T)
        assert resp.status_code == 405 and "error" in resp.json(), resp.text
        assert "Traceback" not in r.tail(), r.tail()
    finally:
        r.close()


class _CutStreamReplica:
    """A fake replica (this test isolates the router's relay): healthy, and every stream it
    starts breaks off in the middle of an SSE event (a chunked body that never ends)."""

    def __init__(self) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in (b'data: {"text": "one"}\n\n', b'data: {"text": "one tw'):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.flush()
                    time.sleep(0.2)
                self.close_connection = True  # cut: no last chunk

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_stream_cut_inside_an_event_ends_with_a_whole_error_event():
    """The router's error event after a replica broke off mid-event was written straight after
    the half event (`... "one twdata: {"error": ...}`): clients failed to parse it. The
    router's metrics count such failures (they counted the 502 it made as a relayed 200)."""
    fake = _CutStreamReplica()
    r = RouterProcess([fake.url], "round_robin")
    try:
        with requests.post(r.url + "/generate", json={"text": "x", "stream": True}, stream=True, timeout=T) as resp:
            assert resp.status_code == 200
            raw = resp.raw.read().decode()
        events = [e for e in raw.split("\n\n") if e.strip()]
        assert events[0] == 'data: {"text": "one"}' and events[-1] == "data: [DONE]", raw
        error = json.loads(events[-2][len("data: "):])["error"]
        assert error["code"] == "replica_failed" and "mid-stream" in error["message"], raw
        assert events[1] == 'data: {"text": "one tw', raw  # the broken event stands apart
        # unstreamed, the same cut is a 502; both count as the replica's failures in the
        # router's metrics, the stream under the 200 its client got, the other under 502
        resp = requests.post(r.url + "/generate", json={"text": "x"}, timeout=T)
        assert resp.status_code == 502 and fake.url in resp.json()["error"]["message"], resp.text
        (rep,) = r.info()["replicas"]
        assert rep["failures"] == 2 and rep["routed"] == 2, rep
        metrics = requests.get(r.url + "/metrics", timeout=T).text
        for line in (f'treadle_router_replica_failures_total{{replica="{fake.url}"}} 2.0',
                     f'treadle_router_requests_total{{replica="{fake.url}",status="200"}} 1.0',
                     f'treadle_router_requests_total{{replica="{fake.url}",status="502"}} 1.0'):
            assert line in metrics.splitlines(), (line, metrics)
    finally:
        r.close()
        fake.close()


def test_killed_replica_loses_no_request(replicas):
    victim, survivor = replicas[1], replicas[0]
    # a long poll interval: the router learns of the death only by failing to connect
    router = RouterProcess([s.url for s in replicas], "round_robin", ["--health-interval-s", "60"])
    try:
        victim.kill()  # SIGKILL
        for i in range(4):
            r = generate(router.url, f"After the crash, request {i}:", n=1)
            assert r.status_code == 200, r.text
            assert r.headers[HEADER] == survivor.url
        info = router.info()
        by_url = {x["url"]: x for x in info["replicas"]}
        assert by_url[victim.url]["connect_failures"] == 1  # tried once, then out of rotation
        assert by_url[victim.url]["healthy"] is False and by_url[survivor.url]["routed"] == 4
        assert info["router"]["num_healthy"] == 1
        assert requests.get(router.url + "/health", timeout=T).status_code == 200
    finally:
        router.close()


def test_launch_replicas_serves_and_cleans_up(replicas):
    # runs after the kill above, so at most two model servers are alive at once
    router = RouterProcess([], "cache_aware", ["--launch-replicas", "1", "--max-total-tokens", "2048"],
                           startup_timeout_s=300)
    try:
        r = generate(router.url, "Hello there,", n=2)
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 2, r.text
        (rep,) = router.info()["replicas"]
        assert rep["server_info"]["engine_args"]["max_total_tokens"] == 2048  # the server flag reached it
        pid = rep["server_info"]["pids"]["server"]
        router.proc.send_signal(signal.SIGTERM)  # graceful: the router stops its replicas
        router.proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        assert not _alive(pid), "the launched replica outlived its router"
    finally:
        router.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_broadcasts_carry_the_clients_api_key():
    """/abort_request, /flush_cache and /get_server_info go to every replica: without the
    client's Authorization header, replicas started with --api-key refused them (401), so an
    abort did nothing, a flush failed, and server info showed every replica as idle."""
    key = {"Authorization": "Bearer sk-router-test"}
    srv = ServerProcess(["--max-total-tokens", "2048", "--log-level", "warning", "--api-key", "sk-router-test"])
    router = RouterProcess([srv.url], "cache_aware")
    try:
        info = requests.get(router.url + "/get_server_info", headers=key, timeout=T).json()
        assert info["replicas"][0]["server_info"] is not None, info
        flush = requests.post(router.url + "/flush_cache", headers=key, timeout=T)
        assert flush.status_code == 200 and flush.json()["success"], flush.text
        with requests.post(router.url + "/generate", headers=key, stream=True, timeout=T, json={
                "text": STORY, "stream": True, "rid": "keyed-story",
                "sampling_params": {"max_new_tokens": 2000, **LONG}}) as r:
            assert r.status_code == 200
            lines = r.iter_lines(decode_unicode=True)
            next(lines)  # generating
            ab = requests.post(router.url + "/abort_request", headers=key, json={"rid": "keyed-story"}, timeout=T)
            assert ab.status_code == 200 and ab.json()["success"] is True, ab.text
            events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["meta_info"]["finish_reason"]["type"] == "abort"
        deadline = time.monotonic() + 30
        while True:  # the replica ends idle (its /get_server_info needs the key too)
            rep = requests.get(router.url + "/get_server_info", headers=key, timeout=T).json()["replicas"][0]
            if rep["server_info"]["num_running"] == 0 and rep["server_info"]["num_waiting"] == 0:
                break
            assert time.monotonic() < deadline, rep
            time.sleep(0.2)
    finally:
        router.close()
        srv.close()
