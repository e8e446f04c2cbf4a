"""The native HTTP API (/generate and the admin endpoints) against a real server subprocess
running the embedded SmolLM2."""
from __future__ import annotations

import json

import time

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, sse_events, wait_idle

pytestmark = pytest.mark.slow
T = 120  # generous per-request timeout: CI machines are shared and slow
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def url():
    # chunks of what is new (the default, all so far, is checked in test_lang_http.py)
    srv = ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning", "--incremental-streaming-output"])
    yield srv.url
    srv.close()


def gen(url: str, body: dict, status: int = 200):
    r = requests.post(url + "/generate", json=body, timeout=T)
    assert r.status_code == status, r.text
    return r.json()


def greedy(n: int = 8, **extra) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **extra}



def test_generate_single(url):
    out = gen(url, {"text": PROMPT, "sampling_params": greedy(8)})
    meta = out["meta_info"]
    assert out["text"].strip()
    assert len(out["output_ids"]) == meta["completion_tokens"] == 8
    assert meta["prompt_tokens"] > 0 and meta["finish_reason"]["type"] == "length"
    t0 = time.monotonic()
    again = gen(url, {"text": PROMPT, "sampling_params": greedy(8)})
    assert again["text"] == out["text"]  # greedy is stable
    assert 0 < again["meta_info"]["e2e_latency"] <= time.monotonic() - t0  # as SGLang's meta_info


def test_generate_batch_matches_single(url):
    prompts = [PROMPT, "One, two, three,"]
    outs = gen(url, {"text": prompts, "sampling_params": greedy(6)})
    assert isinstance(outs, list) and len(outs) == 2
    for p, o in zip(prompts, outs):
        assert o["text"] == gen(url, {"text": p, "sampling_params": greedy(6)})["text"]


def test_logprob_options_per_prompt(url):
    """As SGLang: return_logprob / logprob_start_len / top_logprobs_num take one value per prompt."""
    outs = gen(url, {"text": [PROMPT, "One, two, three,"], "sampling_params": greedy(3),
                     "return_logprob": [True, False], "top_logprobs_num": [2, 0], "logprob_start_len": [1, -1]})
    first, second = (o["meta_info"] for o in outs)
    assert len(first["output_token_logprobs"]) == 3 and all(len(t) == 2 for t in first["output_top_logprobs"])
    assert len(first["input_token_logprobs"]) == first["prompt_tokens"] - 1
    assert "output_token_logprobs" not in second and "input_token_logprobs" not in second
    bad = requests.post(url + "/generate", json={"text": [PROMPT, PROMPT], "return_logprob": [True]}, timeout=T)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "return_logprob"
    assert "1 values of return_logprob for 2 prompts" in bad.json()["error"]["message"]


def test_generate_input_ids(url):
    first = gen(url, {"text": PROMPT, "sampling_params": greedy(4)})
    ids = first["output_ids"]
    out = gen(url, {"input_ids": ids, "sampling_params": greedy(3)})
    assert out["meta_info"]["prompt_tokens"] == len(ids) and len(out["output_ids"]) == 3
    batch = gen(url, {"input_ids": [ids, ids[:2]], "sampling_params": [greedy(2), greedy(3)]})
    assert [len(o["output_ids"]) for o in batch] == [2, 3]


def test_generate_n_samples(url):
    outs = gen(url, {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "n": 2, "seed": 1}})
    assert isinstance(outs, list) and len(outs) == 2


def test_generate_stream_equals_non_stream(url):
    body = {"text": PROMPT, "sampling_params": greedy(10)}
    full = gen(url, body)
    with requests.post(url + "/generate", json={**body, "stream": True}, stream=True, timeout=T) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]" and len(events) >= 3
    chunks = events[:-1]
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert [t for c in chunks for t in c["output_ids"]] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_logprobs(url):
    out = gen(url, {"text": PROMPT, "sampling_params": greedy(5), "return_logprob": True,
                    "top_logprobs_num": 3, "logprob_start_len": 0})
    meta = out["meta_info"]
    # SGLang's shapes: [logprob, token_id, text] entries, text null unless asked for
    lps = meta["output_token_logprobs"]
    assert [tid for _, tid, _ in lps] == out["output_ids"]
    assert all(lp <= 0 and text is None for lp, _, text in lps)
    tops = meta["output_top_logprobs"]
    assert len(tops) == 5 and all(len(t) == 3 and all(len(e) == 3 for e in t) for t in tops)
    assert [t[0][1] for t in tops] == out["output_ids"]  # greedy picks the top-1 token
    inp = meta["input_token_logprobs"]
    assert len(inp) == meta["prompt_tokens"] and inp[0][0] is None
    assert all(lp <= 0 for lp, _, _ in inp[1:])
    assert meta["input_top_logprobs"][0] is None and all(len(t) == 3 for t in meta["input_top_logprobs"][1:])
    ids = [tid for _, tid, _ in inp]  # the prompt's own tokens, in order
    again = gen(url, {"input_ids": ids, "sampling_params": greedy(5)})
    assert again["output_ids"] == out["output_ids"]


def test_generate_logprobs_with_token_texts(url):
    out = gen(url, {"text": PROMPT, "sampling_params": greedy(5), "return_logprob": True, "top_logprobs_num": 2,
                    "logprob_start_len": 2, "return_text_in_logprobs": True})
    meta = out["meta_info"]
    assert "".join(text for _, _, text in meta["output_token_logprobs"]) == out["text"]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] - 2
    assert all(isinstance(text, str) and lp <= 0 for lp, _, text in meta["input_token_logprobs"])
    assert all(isinstance(e[2], str) for t in meta["output_top_logprobs"] for e in t)
    plain = gen(url, {"text": PROMPT, "sampling_params": greedy(5), "return_logprob": True})["meta_info"]
    # SGLang's default (logprob_start_len -1): the last prompt token's entry
    assert len(plain["input_token_logprobs"]) == 1 and "output_top_logprobs" not in plain
    bad = requests.post(url + "/generate", json={"text": PROMPT, "return_logprob": True,
                                                 "return_text_in_logprobs": "yes"}, timeout=T)
    assert bad.status_code == 400 and "return_text_in_logprobs" in bad.json()["error"]["message"]


@pytest.mark.parametrize("body,needle", [
    ({"text": PROMPT, "sampling_params": {"tempurature": 0.5}}, "tempurature"),
    ({"text": PROMPT, "sampling_params": {"temperature": -1}}, "temperature"),
    ({"text": PROMPT, "sampling_params": {"top_p": 2}}, "top_p"),
    ({"text": PROMPT, "sampling_params": {"max_new_tokens": "ten"}}, "max_new_tokens"),
    ({"text": PROMPT, "sampling_params": {"max_new_tokens": 100000}}, "max_new_tokens"),
    ({"text": "hello " * 9000, "sampling_params": {"max_new_tokens": 4}}, "context length"),
    ({"text": "x" * 2_000_000}, "in any tokenization"),  # refused before tokenizing
    ({"text": "a\ud83db"}, "lone surrogate (U+D83D) at character 1"),  # JSON's escape for half an emoji: a 500
    ({"text": PROMPT, "sampling_params": {"max_new_tokens": 8190}}, "exceed the context length 8192"),
    ({"text": PROMPT, "return_logprob": True, "logprob_start_len": -5}, "logprob_start_len must be -1"),
    ({"text": PROMPT, "return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num must be in [0, 20]"),
    ({"text": PROMPT, "return_logprob": "yes"}, "return_logprob must be a boolean"),
    ({"text": PROMPT, "return_logprob": True, "top_logprobs_num": True}, "top_logprobs_num must be an integer"),
    ({"text": PROMPT, "input_ids": [1, 2]}, "exactly one"),
    ({"input_ids": [1, "x"]}, "input_ids"),
    ({"input_ids": []}, "the prompt is empty"),
    ({"text": PROMPT, "colour": 1}, "colour"),
    ({"text": PROMPT, "sampling_params": {"regex": "(unclosed", "max_new_tokens": 4}}, "regex"),
    ({"text": PROMPT, "sampling_params": {"ebnf": 'root ::= "a" item', "max_new_tokens": 4}}, "'item'"),
    ({"text": PROMPT, "sampling_params": {"ebnf": 'root ::= "a"', "regex": "a"}}, "at most one"),
    ({"text": PROMPT, "sampling_params": {"structural_tag": {
        "structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<b"]}}}, "does not start with"),
    ({"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "structural_tag": {
        "structures": [{"begin": "<a>", "schema": {"type": "number", "multipleOf": 0.3}, "end": "</a>"}],
        "triggers": ["<a"]}}},
     "'multipleOf' at $.structures[0].schema"),
])
def test_bad_input_is_400_naming_the_problem(url, body, needle):
    err = gen(url, body, status=400)["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"
    if needle.startswith(("logprob_start_len", "top_logprobs_num", "return_logprob")):  # the field is named in `param` too
        assert err["param"] == needle.split()[0]
    # also where the scheduler's checks or the grammar compiler find the problem
    param = {"context length": "text", "in any tokenization": "text", "lone surrogate (U+D83D) at character 1": "text",
             "'item'": "ebnf", "regex": "regex",
             "input_ids": "input_ids", "the prompt is empty": "input_ids"}.get(needle)
    assert param is None or err["param"] == param, err
    assert requests.get(url + "/health", timeout=T).status_code == 200


def test_generate_with_an_ebnf_grammar(url):
    grammar = 'root ::= answer "."\nanswer ::= "Paris" | "London" | "Rome"'
    out = gen(url, {"text": "The capital of France is", "sampling_params": {
        "ebnf": grammar, "max_new_tokens": 8, "temperature": 0}})
    assert out["text"] in ("Paris.", "London.", "Rome.") and out["meta_info"]["finish_reason"]["type"] == "stop"


def test_generate_with_a_structural_tag(url):
    """Free text, and the segment the trigger opens follows its schema: after " Par" the rest
    of the begin is forced, then a value of the enum, then the end."""
    tag = {"structures": [{"begin": " Paris is ", "schema": {"enum": ["big", "old"]}, "end": "!"}],
           "triggers": [" Par"]}
    out = gen(url, {"text": "The capital of France is", "sampling_params": {
        "structural_tag": tag, "max_new_tokens": 12, "temperature": 0}})
    assert out["text"].startswith(' Paris is "big"!') or out["text"].startswith(' Paris is "old"!'), out["text"]


def test_malformed_json_and_bad_stream_grammar(url):
    r = requests.post(url + "/generate", data=b"{not json", timeout=T)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = requests.post(url + "/generate", data=b"[" * 100_000, timeout=T)  # was a 500 (RecursionError)
    assert r.status_code == 400 and "nests too deeply" in r.json()["error"]["message"]
    r = requests.post(url + "/generate", json={"text": "x", "stream": True,
                                               "sampling_params": {"regex": "(", "max_new_tokens": 2}}, timeout=T)
    assert r.status_code == 400 and "regex" in r.json()["error"]["message"]
    assert requests.get(url + "/health_generate", timeout=T).status_code == 200


def _metric(url: str, series: str) -> float:
    for line in requests.get(url + "/metrics", timeout=T).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_a_request_whose_client_left_is_counted(url):
    """A stream whose client hangs up is aborted and still counted in /metrics (it was not:
    its finished output arrived after the handler had gone)."""
    series = 'treadle_requests_total{finish_reason="abort"}'
    before, tokens_before = _metric(url, series), _metric(url, "treadle_prompt_tokens_total")
    with requests.post(url + "/generate", json={"text": PROMPT, "stream": True, "sampling_params": greedy(3000)},
                       stream=True, timeout=T) as r:
        next(line for line in r.iter_lines(decode_unicode=True) if line.startswith("data: "))
    wait_idle(url, timeout_s=30)
    deadline = time.time() + 10
    while _metric(url, series) < before + 1 and time.time() < deadline:
        time.sleep(0.1)
    assert _metric(url, series) == before + 1 and _metric(url, "treadle_prompt_tokens_total") > tokens_before


def test_abort_request_ends_a_stream(url):
    body = {"text": PROMPT, "rid": "abort-me", "stream": True, "sampling_params": greedy(3000)}
    with requests.post(url + "/generate", json=body, stream=True, timeout=T) as r:
        lines = r.iter_lines(decode_unicode=True)
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["meta_info"]["id"] == "abort-me"
        ok = requests.post(url + "/abort_request", json={"rid": "abort-me"}, timeout=T).json()
        assert ok["success"] is True
        rest = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert rest and rest[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert rest[-1]["meta_info"]["completion_tokens"] < 3000


def test_abort_request_ends_that_request_and_its_parts_only(url):
    """/abort_request {"rid": "job"} ends "job", the parts of a batch or of n samples sent as
    one rid ("batch-0-1", ...), and nothing else: another client's "job-7" runs on (it used
    to end too, its rid beginning with "job-")."""
    import concurrent.futures as cf
    import time

    def run(body):
        return requests.post(url + "/generate", json=body, timeout=T).json()

    def running(n):
        for _ in range(400):
            if requests.get(url + "/get_server_info", timeout=T).json()["num_running"] == n:
                return True
            time.sleep(0.05)
        return False

    long = greedy(1300)  # six of them fit the 8192-slot pool at once: all admitted without waiting
    bodies = {"job": {"text": PROMPT, "rid": "job", "sampling_params": long},
              "job-7": {"text": PROMPT, "rid": "job-7", "sampling_params": long},
              "batch": {"text": [PROMPT, "Hi"], "rid": "batch", "sampling_params": {**long, "n": 2}}}
    with cf.ThreadPoolExecutor(3) as ex:
        futs = {k: ex.submit(run, b) for k, b in bodies.items()}
        assert running(6)
        for name in ("job", "batch"):
            assert requests.post(url + "/abort_request", json={"rid": name}, timeout=T).json()["success"] is True
        assert running(1)  # job-7 alone
        job = futs["job"].result(timeout=T)
        assert futs["batch"].result(timeout=T) and not futs["job-7"].done()
        assert requests.post(url + "/abort_request", json={"rid": "batch-0-1"}, timeout=T).json()["success"] is False
        assert requests.post(url + "/abort_request", json={"rid": "job-7"}, timeout=T).json()["success"] is True
        out = {"job": job, "batch": futs["batch"].result(), "job-7": futs["job-7"].result(timeout=T)}
    assert out["job"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert [o["meta_info"]["finish_reason"]["type"] for o in out["batch"]] == ["abort"] * 4
    assert out["job-7"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["job-7"]["meta_info"]["completion_tokens"] > out["job"]["meta_info"]["completion_tokens"]


def test_abort_request_while_the_shared_prompt_is_warmed(url):
    """n samples of a long prompt first prefill it once (a warm-up request of its own): an
    /abort_request by the request's rid in that phase ends the warm-up and all samples,
    unsent (it used to answer success: false, and the samples then ran to the end)."""
    import concurrent.futures as cf
    import time

    prompt = " ".join(f"item{i} is number {i * 7919 % 1000}." for i in range(160))  # ~1,300 tokens, uncached
    body = {"text": prompt, "rid": "warm-job", "sampling_params": {**greedy(64), "n": 3}}
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(lambda: requests.post(url + "/generate", json=body, timeout=T).json())
        for _ in range(400):  # held from arrival (warm-up first, then the samples)
            if requests.get(url + "/get_server_info", timeout=T).json()["num_in_flight"] >= 1:
                break
            time.sleep(0.02)
        ok = requests.post(url + "/abort_request", json={"rid": "warm-job"}, timeout=T).json()
        out = fut.result(timeout=T)
    assert ok["success"] is True
    assert [o["meta_info"]["finish_reason"]["type"] for o in out] == ["abort"] * 3
    assert all(o["meta_info"]["completion_tokens"] < 64 for o in out)
    wait_idle(url, timeout_s=30)


def test_metrics_time_first_tokens_and_count_refusals_not_probes(url):
    """TTFT is when the scheduler made the first token (a request that is not streamed gets
    its whole output at the end: its TTFT was its e2e latency); refused requests are counted
    by route and status; health probes are not requests."""
    ttft, e2e = "treadle_time_to_first_token_seconds_sum", "treadle_e2e_request_latency_seconds_sum"
    t0, e0 = _metric(url, ttft), _metric(url, e2e)
    gen(url, {"text": PROMPT, "sampling_params": greedy(64)})
    t1, e1 = _metric(url, ttft), _metric(url, e2e)
    assert 0 < t1 - t0 < (e1 - e0) / 2, (t1 - t0, e1 - e0)
    refused = 'treadle_http_responses_total{route="/generate",status="400"}'
    missing = 'treadle_http_responses_total{route="/v1/chat/completions",status="404"}'
    r0, m0 = _metric(url, refused), _metric(url, missing)
    gen(url, {"text": PROMPT, "sampling_params": {"temperature": -1}}, status=400)
    r = requests.post(url + "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user",
                                                                                           "content": "hi"}]},
                      timeout=T)
    assert r.status_code == 404
    assert _metric(url, refused) == r0 + 1 and _metric(url, missing) == m0 + 1
    finished = 'treadle_requests_total{finish_reason="length"}'
    before = _metric(url, finished)
    assert requests.get(url + "/health_generate", timeout=T).status_code == 200
    assert _metric(url, finished) == before


def test_admin_endpoints(url):
    info = requests.get(url + "/get_model_info", timeout=T).json()
    assert info["vocab_size"] > 0 and info["context_length"] == 8192
    assert requests.post(url + "/flush_cache", timeout=T).json()["success"] is True
    si = requests.get(url + "/get_server_info", timeout=T).json()
    assert si["free_slots"] == si["total_slots"] == 8192  # flushed and idle
    assert set(si["pids"]) == {"server", "scheduler", "detokenizer"}
    gen(url, {"text": PROMPT, "sampling_params": greedy(2)})
    metrics = requests.get(url + "/metrics", timeout=T).text
    for name in ("treadle_time_to_first_token_seconds_count", "treadle_num_running_requests",
                 "treadle_generation_tokens_total", "treadle_cache_hit_rate", "treadle_token_usage"):
        assert name in metrics
    assert requests.get(url + "/health_generate", timeout=T).status_code == 200


def test_no_cors_headers_without_an_api_key(url):
    """A server without --api-key sends no CORS headers unless --allowed-origins asks for
    them: any page a user opens could otherwise drive it and read its answers (with a key,
    the default is any origin, see test_server_openai.py)."""
    origin = {"Origin": "http://app.example"}
    r = requests.options(url + "/generate", headers={**origin, "Access-Control-Request-Method": "POST"}, timeout=T)
    assert "access-control-allow-origin" not in r.headers, r.headers
    r = requests.get(url + "/v1/models", headers=origin, timeout=T)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers, r.headers
