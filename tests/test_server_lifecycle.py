"""Server lifecycle against real server subprocesses: many concurrent streams with
disconnects (no leaked KV), back-pressure (503), SIGTERM drain (exit 0), a dead
scheduler (the server exits non-zero within seconds), a failed batch step that does not
recur (no request hurt) and a broken model (a 500, then the server exits).

Tests run in file order: the SIGTERM test ends server A, after which server B starts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, free_port, wait_idle

pytestmark = pytest.mark.slow
T = 180


@pytest.fixture(scope="module")
def server_a():
    srv = ServerProcess(["--max-total-tokens", "8192", "--shutdown-grace-s", "60", "--log-level", "warning"])
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def server_b():
    srv = ServerProcess(["--max-total-tokens", "8192", "--max-running-requests", "1", "--max-queued-requests", "1",
                         "--log-level", "warning"])
    yield srv
    srv.close()


def info(url: str) -> dict:
    r = requests.get(url + "/get_server_info", timeout=T)
    assert r.status_code == 200, r.text
    return r.json()


def assert_no_leaked_kv(url: str) -> None:
    i = wait_idle(url)
    assert i["free_slots"] + i["evictable_slots"] == i["total_slots"], i
    assert i["protected_slots"] == 0, i


def stream(url: str, body: dict, stop_after: int | None = None) -> list[dict]:
    """Stream /generate; with stop_after, hang up after that many chunks."""
    chunks: list[dict] = []
    with requests.post(url + "/generate", json={**body, "stream": True}, stream=True, timeout=T) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if not line.startswith("data: {"):
                continue
            chunks.append(json.loads(line[6:]))
            if stop_after is not None and len(chunks) >= stop_after:
                break  # leaving the with-block closes the connection mid-stream
    return chunks


def test_child_failing_at_startup_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "treadle.runtime.launch_server", "--port", str(free_port()),
                           "--dtype", "bogus"], capture_output=True, text=True, timeout=T)
    assert proc.returncode == 1
    assert "scheduler process failed during start-up" in proc.stderr and "unknown dtype 'bogus'" in proc.stderr


def test_concurrent_streams_with_disconnects(server_a):
    url = server_a.url

    def client(i: int) -> tuple[int, list[dict]]:
        body = {"text": f"Client number {i} tells a story:", "sampling_params":
                {"max_new_tokens": 24, "temperature": 0.7, "seed": i, "ignore_eos": True}}
        return i, stream(url, body, stop_after=2 if i % 4 == 0 else None)

    with ThreadPoolExecutor(32) as pool:
        results = [f.result(timeout=T * 2) for f in [pool.submit(client, i) for i in range(32)]]
    for i, chunks in results:
        if i % 4 == 0:
            assert len(chunks) == 2
        else:
            last = chunks[-1]["meta_info"]
            assert last["finish_reason"]["type"] == "length" and last["completion_tokens"] == 24
            assert len(chunks[-1]["output_ids"]) == 24  # each chunk has all so far (SGLang's way)
            assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))
    assert_no_leaked_kv(url)
    assert info(url)["generated_tokens"] < 32 * 24  # the hung-up clients' requests were aborted
    assert requests.get(url + "/health_generate", timeout=T).status_code == 200


def test_non_stream_disconnect_aborts(server_a):
    url = server_a.url
    before = info(url)["generated_tokens"]
    with pytest.raises(requests.ReadTimeout):
        requests.post(url + "/generate", timeout=(10, 3), json={
            "text": "Count forever:", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}})
    assert_no_leaked_kv(url)
    assert info(url)["generated_tokens"] - before < 4000


def _environ(pid: int) -> dict[str, str]:
    """A process's environment, from /proc (Linux, as the server's tests)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def test_the_scheduler_and_detokenizer_threads_wait_passively(server_a):
    # their OpenMP threads sleep between parallel regions (launcher.CHILD_ENV): spinning ones held
    # the cores the other processes need for the same token (2x slower on a 2-core box); before
    # the SIGTERM test, which ends server A
    assert "OMP_WAIT_POLICY" not in os.environ or os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    pids = info(server_a.url)["pids"]
    children = [pids[name] for name in ("scheduler", "detokenizer")]
    assert all(_environ(pid).get("OMP_WAIT_POLICY") == "PASSIVE" for pid in children), pids


def test_sigterm_drains_in_flight_and_exits_zero(server_a):
    url = server_a.url
    box: dict = {}
    first = threading.Event()

    def long_stream() -> None:
        body = {"text": "Drain me:", "stream": True,
                "sampling_params": {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}}
        chunks = []
        with requests.post(url + "/generate", json=body, stream=True, timeout=T) as r:
            for line in r.iter_lines(decode_unicode=True):
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                    first.set()
        box["chunks"] = chunks

    t = threading.Thread(target=long_stream)
    t.start()
    assert first.wait(T)
    server_a.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # new work is refused while the old finishes
        r = requests.post(url + "/generate", json={"text": "late"}, timeout=T)
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "server_overloaded"
            break
        time.sleep(0.05)
    else:
        pytest.fail("no 503 while draining")
    t.join(T)
    assert not t.is_alive()
    last = box["chunks"][-1]["meta_info"]
    assert last["finish_reason"]["type"] == "length" and last["completion_tokens"] == 20
    assert server_a.proc.wait(timeout=60) == 0, server_a.log_tail()


def test_queue_full_is_503(server_b):
    url = server_b.url
    body = {"text": "Keep going:", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
    stop = threading.Event()

    def hold() -> None:  # a stream that stays open until the test is done with it
        with requests.post(url + "/generate", json={**body, "stream": True}, stream=True, timeout=T) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    break

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + T
        while info(url)["num_in_flight"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        r = requests.post(url + "/generate", json={"text": "one too many"}, timeout=T)
        assert r.status_code == 503 and "too many requests" in r.json()["error"]["message"]
        # the refusal is counted; a health probe waiting behind the busy batch sees the
        # others' tokens and answers 200 (it was a 503 after 30 s: a liveness probe would
        # have restarted a working server)
        assert 'treadle_http_responses_total{route="/generate",status="503"} 1.0' in \
            requests.get(url + "/metrics", timeout=T).text
        t0 = time.monotonic()
        assert requests.get(url + "/health_generate", timeout=T).status_code == 200
        assert time.monotonic() - t0 < 20
    finally:
        stop.set()
        for t in threads:
            t.join(T)
    assert_no_leaked_kv(url)


def test_a_burst_is_held_to_the_in_flight_limit(server_b):
    """10 requests at once against a limit of 2 in flight (1 running + 1 queued): exactly 2
    are taken, the rest get a 503. The limit is checked where requests are registered; the
    early check alone let a burst through (17 taken against a limit of 12)."""
    url = server_b.url
    body = {"text": "Keep going:", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
    with ThreadPoolExecutor(10) as ex:
        futs = [ex.submit(requests.post, url + "/generate", json={**body, "rid": f"burst-{i}"}, timeout=T)
                for i in range(10)]
        deadline = time.monotonic() + T
        while sum(f.done() for f in futs) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # a 9th answer would have come by now
        done = sum(f.done() for f in futs)
        for i in range(10):  # end the ones taken
            requests.post(url + "/abort_request", json={"rid": f"burst-{i}"}, timeout=T)
        codes = sorted(f.result().status_code for f in futs)
    assert done == 8 and codes == [200, 200] + [503] * 8, (done, codes)
    assert_no_leaked_kv(url)


def test_scheduler_death_exits_nonzero(server_b):
    pid = info(server_b.url)["pids"]["scheduler"]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    code = server_b.proc.wait(timeout=30)
    assert code != 0 and time.monotonic() - t0 < 10, (code, server_b.log_tail())


def test_a_hung_scheduler_is_killed_and_the_server_exits():
    """A scheduler that sends nothing for --watchdog-timeout seconds (here stopped with
    SIGSTOP, as a step stuck in a kernel or a collective would be) is killed, and the server
    exits non-zero, so an orchestrator restarts it (before, /health stayed 200 and requests
    hung forever). Meanwhile /metrics answers at once from the scheduler's last snapshot."""
    srv = ServerProcess(["--max-total-tokens", "4096", "--watchdog-timeout", "4", "--log-requests"])
    try:
        # --log-requests: a line per finished request, without its text
        body = {"text": "A secret prompt", "rid": "log-me", "sampling_params": {"max_new_tokens": 3}}
        assert requests.post(srv.url + "/generate", json=body, timeout=T).status_code == 200
        line = next(x for x in srv.log_tail().splitlines() if "request log-me:" in x)
        assert "generated, finish length" in line and "secret" not in srv.log_tail(), line
        pid = info(srv.url)["pids"]["scheduler"]
        time.sleep(1.0)  # a snapshot has come
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        r = requests.get(srv.url + "/metrics", timeout=T)
        assert r.status_code == 200 and "treadle_num_running_requests" in r.text and time.monotonic() - t0 < 3
        code = srv.proc.wait(timeout=60)
        assert code != 0 and time.monotonic() - t0 < 30, (code, srv.log_tail())
        assert "has sent nothing" in srv.log_tail()
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        srv.close()


def test_sigterm_during_a_long_step_ends_its_requests_as_aborted():
    """SIGTERM while the scheduler is in a long prefill (seconds on a CPU, longer than the
    grace period and the 5 s the drain waits for aborts): the request still gets a JSON
    answer, finish_reason "abort", and the server exits 0. It got uvicorn's plain-text 500
    (its handler cancelled mid-response), with tracebacks in the log."""
    # its first forward call (the prefill) takes 15 s (runtime/fault_injection.py)
    srv = ServerProcess(["--max-total-tokens", "8192", "--shutdown-grace-s", "0.5"],
                        env={"TREADLE_FAULT_SLOW_FORWARD": "1:15"})
    try:
        out: list = []
        t = threading.Thread(target=lambda: out.append(requests.post(
            srv.url + "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 4}}, timeout=T)))
        t.start()
        deadline = time.monotonic() + 30
        while info(srv.url)["num_in_flight"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # the prefill step has begun
        srv.proc.send_signal(signal.SIGTERM)
        t.join(T)
        r = out[0]
        assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "abort", (r.text, srv.log_tail())
        assert srv.proc.wait(timeout=60) == 0, srv.log_tail()
        assert "Traceback" not in srv.log_tail()
    finally:
        srv.close()


def test_a_failed_output_loop_fails_its_requests_and_exits_nonzero():
    """The server's loop that routes scheduler output to requests raises
    (runtime/fault_injection.py): the request waiting on it gets a 503 within seconds and the
    server exits non-zero (it used to leave every request waiting and serve on, deaf)."""
    srv = ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning"],
                        env={"TREADLE_FAULT_RECV_CALLS": "1"})
    try:
        t0 = time.monotonic()
        r = requests.post(srv.url + "/generate", timeout=T,
                          json={"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 503 and "output loop failed" in r.json()["error"]["message"], r.text
        assert srv.proc.wait(timeout=30) != 0
        assert time.monotonic() - t0 < 30, srv.log_tail()
    finally:
        srv.close()


def test_a_failed_batch_step_that_does_not_recur_costs_no_request():
    """Forward calls 2 and 12 of the real scheduler process raise (runtime/fault_injection.py),
    one in a plain request's decode, one in a streamed one's: each request is prefilled again
    (its output so far kept) and finishes with the text it gives with no fault, the stream
    with no error event; no KV slot is leaked. Before, each got a 500 (an SSE error event)."""
    srv = ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning"],
                        env={"TREADLE_FAULT_FORWARD_CALLS": "2,12"})
    try:
        body = {"text": "The capital of France is",
                "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
        # forward 1 prefill, 2 fails, 3 the canary, 4 the prefill again, 5-10 decode
        r = requests.post(srv.url + "/generate", json=body, timeout=T)
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8, r.text
        chunks = stream(srv.url, body)  # forward 11 prefill, 12 fails, 13 the canary, ...
        assert not any("error" in c for c in chunks) and chunks[-1]["text"] == r.json()["text"], chunks
        ok = requests.post(srv.url + "/generate", json=body, timeout=T)
        assert ok.status_code == 200 and ok.json()["text"] == r.json()["text"], ok.text
        assert_no_leaked_kv(srv.url)
        assert srv.proc.poll() is None
    finally:
        srv.close()


def test_a_broken_model_is_a_500_and_then_the_server_exits():
    """Every forward from call 3 on raises (a broken model or device): the canary forward run
    after a lone request's failed step fails too, so the failure is the server's: a 500 naming
    it, and after a few such failures in a row the scheduler stops and the server exits non-zero
    (a supervisor restarts it) instead of failing every request forever."""
    srv = ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning"],
                        env={"TREADLE_FAULT_FORWARD_CALLS": "3-"})
    try:
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        r = requests.post(srv.url + "/generate", json=body, timeout=T)
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["code"] == "internal_error" and "injected fault" in err["message"], err
        for _ in range(8):
            if srv.proc.poll() is not None:
                break
            try:
                r = requests.post(srv.url + "/generate", json=body, timeout=T)
            except requests.ConnectionError:
                break
            assert r.status_code in (500, 503), r.text
        assert srv.proc.wait(timeout=60) != 0, srv.log_tail()
    finally:
        srv.close()


def test_a_held_tokenization_holds_nothing_else_and_bodies_are_bounded(tmp_path):
    """Requests are parsed, tokenized and built on threads, not on the event loop. While one
    prompt's tokenization is held (runtime/fault_injection.py: until the test makes a file),
    a stream already running goes on to its end, /health answers, and other requests, by text
    and by input_ids, are served; then the held one is. Before, the event loop tokenized: a
    600k-character prompt held every stream, probe and request for the half second it took,
    and here everything would wait for the release. A body larger than --max-request-bytes
    is a 413 naming the limit, whether its length is declared or it comes in chunks; one just
    under it is served."""
    from treadle.runtime.fault_injection import HOLD_ENV, HOLD_MARKER

    release = tmp_path / "release"
    srv = ServerProcess(["--max-total-tokens", "8192", "--max-request-bytes", "100000", "--log-level", "warning"],
                        env={HOLD_ENV: str(release)})
    try:
        held: list = []
        waiter = threading.Thread(target=lambda: held.append(requests.post(
            srv.url + "/v1/completions", json={"prompt": f"{HOLD_MARKER}: once upon a time", "max_tokens": 4},
            timeout=T)))
        greedy = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
        chunks = []
        with requests.post(srv.url + "/generate", json={"text": "Count to ten:", "sampling_params": greedy,
                                                         "stream": True}, stream=True, timeout=T) as r:
            assert r.status_code == 200, r.text
            for line in r.iter_lines(decode_unicode=True):
                if not line.startswith("data: {"):
                    continue
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 1:  # the stream has begun: now hold a tokenization
                    waiter.start()
                    deadline = time.monotonic() + 60
                    while not (tmp_path / "release.held").exists():
                        assert time.monotonic() < deadline, srv.log_tail()
                        time.sleep(0.02)
        assert chunks[-1]["meta_info"]["completion_tokens"] == 24, chunks[-1]
        assert requests.get(srv.url + "/health", timeout=T).status_code == 200
        for prompt in ({"text": "Hello"}, {"input_ids": [1, 2, 3, 4]}):
            r = requests.post(srv.url + "/generate", json={**prompt, "sampling_params": {"max_new_tokens": 2}},
                              timeout=T)
            assert r.status_code == 200, r.text
        assert waiter.is_alive() and not held  # still tokenizing
        release.touch()
        waiter.join(T)
        assert held[0].status_code == 200 and held[0].json()["usage"]["completion_tokens"] == 4, held[0].text

        for body in (json.dumps({"text": "x" * 200_000}).encode(),  # declared length
                     iter([b'{"text": "', b"x" * 150_000, b'"}'])):  # chunked, no length
            r = requests.post(srv.url + "/generate", data=body, headers={"Content-Type": "application/json"},
                              timeout=T)
            assert r.status_code == 413, r.text
            err = r.json()["error"]
            assert err["code"] == "request_too_large" and "100000" in err["message"], err
        padded = json.dumps({"text": "Hi", "sampling_params": {"max_new_tokens": 1}}) + " " * 99_000
        r = requests.post(srv.url + "/generate", data=padded, headers={"Content-Type": "application/json"}, timeout=T)
        assert r.status_code == 200, r.text
        assert_no_leaked_kv(srv.url)
    finally:
        release.touch()
        srv.close()



def _group_alive(pgid: int) -> list[str]:
    """The live (not zombie) processes of process group `pgid`, as 'pid name'."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[0] != "Z" and int(rest[2]) == pgid:
            alive.append(f"{entry} {name}")
    return alive


def test_a_server_killed_outright_leaves_no_process_behind():
    """SIGKILL of the server process alone (no handler runs): its scheduler, detokenizer and
    grammar workers, forked by a fork server rather than by it, see it gone (a pipe only it held
    open reads EOF) and exit, as does the fork server; none is left holding the model or the
    KV pool. (The deadline is a hang guard: they are gone in about a second.)"""
    srv = ServerProcess(["--max-total-tokens", "2048", "--log-level", "warning"])
    try:
        pids = info(srv.url)["pids"]
        assert len(_group_alive(srv.proc.pid)) >= 3, _group_alive(srv.proc.pid)  # server, scheduler, detokenizer
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while _group_alive(srv.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group_alive(srv.proc.pid) == [], (pids, _group_alive(srv.proc.pid))
    finally:
        srv.close()
