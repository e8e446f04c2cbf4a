"""Hostile clients, session 43: what a client could still do to the server's other clients.
Each test failed on the code before its fix."""
from __future__ import annotations

import json
import random
import threading
import time

import pytest
import requests

from treadle.runtime.server import protocol
from treadle.runtime.server.testing import sse_events, wait_idle

T = 120


@pytest.fixture(scope="module")
def srv(limited_server):  # conftest's shared server of 4 running / 8 queued: left idle
    return limited_server


def no_leak(srv) -> dict:
    """Once idle, every KV slot is free or held by the prefix cache alone."""
    info = wait_idle(srv.url)
    assert info["protected_slots"] == 0 and info["free_slots"] + info["evictable_slots"] == info["total_slots"], info
    return info


def abort_once_running(srv, rid: str) -> None:
    """Abort request `rid` as soon as the scheduler runs a request (its prompt's prefill)."""
    deadline = time.monotonic() + T
    while requests.get(srv.url + "/get_server_info", timeout=T).json()["num_running"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = requests.post(srv.url + "/abort_request", json={"rid": rid}, timeout=T)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- a large body holds the GIL


def _c_spans(monkeypatch) -> list[int]:
    """Record the characters each call of json's C parser reads (json.loads, and the scanner
    protocol.loads_in_pieces reads one value with) while the test runs."""
    spans: list[int] = []
    loads = json.loads

    def counted_loads(s, *a, **kw):
        spans.append(len(s))
        return loads(s, *a, **kw)

    monkeypatch.setattr(json, "loads", counted_loads)
    scan = getattr(protocol, "_scan_once", None)
    if scan is not None:
        def counted_scan(s, at):
            value, end = scan(s, at)
            spans.append(end - at)
            return value, end

        monkeypatch.setattr(protocol, "_scan_once", counted_scan)
    return spans


def test_a_large_body_is_parsed_in_short_pieces(monkeypatch):
    """json's C parser holds the GIL for a whole call: one json.loads over a 40 MB body
    (/detokenize of 8M ids) stopped every thread of the server's HTTP process, the event loop's
    included, for a second (every stream's next chunk and /health waited; measured: /health
    1.3 s -> 0.16 s). A body of PIECEWISE_PARSE_BYTES or more is now read in pieces of at most
    PARSE_PIECE_CHARS characters: the same value, the same errors."""
    rng = random.Random(0)
    ids = [rng.randrange(49152) for _ in range(300_000)]
    body = {"input_ids": [ids[:5000], ids[5000:9000]], "rid": ["a", "b\u00e9\\\""],
            "sampling_params": [{"max_new_tokens": 3, "stop": ["x", "\U0001F600"], "temperature": 0.5}, {}],
            "tokens": ids, "floats": [0.5, -1e-3, 2e300, -0.0] * 10_000, "nested": [[[1, [2]], {"k": [3]}]] * 50}
    raw = json.dumps(body, indent=1).encode()
    assert len(raw) >= 1 << 20
    spans = _c_spans(monkeypatch)
    assert protocol.parse_json_object(raw) == body
    assert max(spans) <= 70_000, f"one C call read {max(spans):,} characters"
    # invalid bodies: a 400 as json.loads words it (its message, its position)
    for bad in [b'{"tokens": [1, 2,, 3]}', b'{"tokens": [1, 2, 3}', b'{"a": 1,}', b'{"a": [1e5, -]}', b'{"a": 1} x',
                b'{"a": [1, 2 3]}', b'{"a" 1}', b'[1, 2]', b'\xef\xbb\xbf{"a": [01]}']:
        padded = bad[:3] + b" " * (1 << 20) + bad[3:]  # parsed in pieces
        with pytest.raises(protocol.APIError) as e:
            protocol.parse_json_object(padded)
        try:
            json.loads(padded)
            want = "must be a JSON object, got list"
        except json.JSONDecodeError as d:
            want = str(d)
        assert e.value.status == 400 and want in e.value.message, (e.value.message, want)
    with pytest.raises(protocol.APIError, match="nests too deeply"):
        protocol.parse_json_object(b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}" + b" " * (1 << 20))
    with pytest.raises(protocol.APIError, match="tokens: an integer of more than"):
        protocol.parse_json_object(b'{"tokens": [1, ' + b"9" * 5000 + b"]}" + b" " * (1 << 20))


def test_a_long_string_in_a_reply_is_written_in_pieces():
    """/detokenize of 8M ids replies with a 40 MB string, which one json.dumps call wrote in
    0.4 s with the GIL held; it is written JSON_PIECE_CHARS characters at a time."""
    text = "a\"\\\u00e9\n\U0001F600 redu" * 20_000
    for ascii_only in (False, True):
        pieces = protocol.json_pieces({"prompt": text}, ensure_ascii=ascii_only)
        assert "".join(pieces) == json.dumps({"prompt": text}, ensure_ascii=ascii_only, separators=(",", ":"))
        assert max(map(len, pieces)) <= 6 * (1 << 16), max(map(len, pieces))
    assert protocol.ReplyJSON({"p": "\ud800" * 100_000}).body == b'{"p":"' + b"\\ud800" * 100_000 + b'"}'


def test_tool_call_arguments_are_read_and_written_in_pieces(monkeypatch):
    """An assistant message's tool call arguments (a client's JSON text) are read and written
    again for the prompt: one json.loads and one json.dumps call over 15 MB of arguments held
    the GIL, and every other client, for 1.5 s (/health during it: 1.5 s -> 0.3 s), though
    the request was then refused as too long. Now both go in pieces; the prompt is the same."""
    from treadle.runtime.server import tool_calls

    value = {"a": [1, 2.5, None, True] * 80_000, **{f"k{i}\u00e9": [i, "x\U0001F600"] for i in range(20_000)}}
    args = json.dumps(value)
    assert len(args) > 1 << 20
    want = json.dumps({"name": "f", "arguments": value}, ensure_ascii=False)
    spans = _c_spans(monkeypatch)
    encode = json.JSONEncoder.encode

    def counted_encode(self, o):
        text = encode(self, o)
        spans.append(len(text))
        return text

    monkeypatch.setattr(json.JSONEncoder, "encode", counted_encode)
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": args}}
    msgs = tool_calls.render_messages([{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "", "tool_calls": [call]}], None, False)
    assert msgs[1]["content"] == f"{tool_calls.OPEN}\n{want}\n{tool_calls.CLOSE}"
    assert max(spans) <= 70_000, f"one C call read or wrote {max(spans):,} characters"


def test_chat_template_kwargs_reach_the_renderer_only_when_the_template_reads_them(monkeypatch):
    """chat_template_kwargs are template variables: each call of the renderer (transformers'
    apply_chat_template, its Jinja renderer, Jinja's render) copies them in C with the GIL held,
    and 500,000 of them stopped every other client of the server for 0.3 s a copy (1.2 s of
    rendering). Only those the template reads reach it now; the prompt is the same."""
    import copy
    import shutil

    from treadle.runtime import tokenizer as tok_mod
    from treadle.runtime.engine_args import EngineArgs
    from treadle.runtime.model_source import resolve_model_source
    from treadle.runtime.server.ipc import IpcPaths
    from treadle.runtime.server.metrics import ServerMetrics
    from treadle.runtime.server.tokenizer_manager import TokenizerManager, template_variables

    tokenizer = tok_mod.load_tokenizer(resolve_model_source(None))
    paths = IpcPaths.create()
    tm = TokenizerManager(EngineArgs(), tokenizer, {"vocab_size": 49152, "context_len": 8192, "num_slots": 8192,
                                                    "max_running": 4}, paths, ServerMetrics())
    try:
        passed: list[int] = []
        render = tok_mod.apply_chat_template

        def counted(*a, **kw):
            passed.append(len(kw))
            return render(*a, **kw)

        monkeypatch.setattr(tok_mod, "apply_chat_template", counted)
        messages = [{"role": "user", "content": "hi"}]
        plain = tm.chat_prompt(messages, None, None, True, False)
        many = {f"v{i}": i for i in range(50_000)}
        assert tm.chat_prompt(messages, None, many, True, False) == plain
        assert passed[1] <= passed[0] + len(template_variables(tok_mod.get_chat_template(tokenizer))), passed
        with pytest.raises(protocol.APIError, match="argument of the chat template renderer"):
            tm.chat_prompt(messages, None, {**many, "tokenize": True}, True, False)
        # a variable the template reads still reaches it
        tm.tokenizer = copy.copy(tokenizer)
        tm.tokenizer.chat_template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                                      "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
        assert tm.chat_prompt(messages, None, {**many, "enable_thinking": False}, True, False) == "hi<think></think>"
    finally:
        tm.close()
        shutil.rmtree(paths.root, ignore_errors=True)
    # what a template reads: its context's names, {% generation %} and {% break %} parsed
    names = template_variables("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}"
                               "{% if x %}{% break %}{% endif %}{% endfor %}{{ enable_thinking }}")
    assert names == {"messages", "x", "enable_thinking"}
    assert template_variables("{% if") is None  # not parsed here: every variable is passed


def test_a_prompt_far_past_the_context_is_refused_from_its_start(monkeypatch):
    """A 650 KB prompt of words (under the character bound, which assumes the longest tokens)
    was tokenized whole, 0.9 s of a builder thread, to be refused for its ~300,000 tokens: 8
    clients sending such prompts held all 4 builders, and every other request waited 5-7 s to
    be built (0.1 s before; measured). A prompt is now counted by its first
    PROBE_CHARS_PER_TOKEN x context characters first; /tokenize still counts the whole text."""
    import shutil

    from treadle.runtime import tokenizer as tok_mod
    from treadle.runtime.engine_args import EngineArgs
    from treadle.runtime.model_source import resolve_model_source
    from treadle.runtime.server.ipc import IpcPaths
    from treadle.runtime.server.metrics import ServerMetrics
    from treadle.runtime.server.tokenizer_manager import TokenizerManager

    tokenizer = tok_mod.load_tokenizer(resolve_model_source(None))
    paths = IpcPaths.create()
    tm = TokenizerManager(EngineArgs(), tokenizer, {"vocab_size": 49152, "context_len": 8192, "num_slots": 8192,
                                                    "max_running": 4}, paths, ServerMetrics())
    try:
        chars: list[int] = []
        encode = tokenizer.encode
        monkeypatch.setattr(tokenizer, "encode", lambda text, *a, **kw: chars.append(len(text)) or encode(text, *a, **kw))
        rng = random.Random(0)
        words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(2, 9)))
                 for _ in range(5000)]
        text = " ".join(rng.choice(words) for _ in range(120_000))[:650_000]
        assert len(text) < tm.max_prompt_chars
        with pytest.raises(protocol.APIError, match="more than the context length 8192") as e:
            tm.encode(text, "prompt")
        assert e.value.status == 400 and e.value.param == "prompt"
        assert sum(chars) <= 8 * 8192, chars  # its start alone
        chars.clear()
        assert len(tm.encode(text, "prompt", must_fit=False)) > 8192 and chars == [len(text)]  # /tokenize
        short = " ".join(words[:2000])
        assert tm.encode(short, "prompt") == tok_mod.encode_prompt(tokenizer, short)
    finally:
        tm.close()
        shutil.rmtree(paths.root, ignore_errors=True)


# ---------------------------------------------------------------- echo + logprobs, aborted


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_aborted_while_its_prompt_is_scored(srv, stream):
    """/v1/completions with echo and logprobs scores its prompt 256 positions a step; aborted
    before the last of them, its reply echoed every prompt token but had scores for the first
    chunks only, and shaping it indexed past them: a 500 (IndexError) for a request the client
    had every right to abort. Now the unscored positions have no score (None) and the reply
    is whole; a bystander finishes and no KV slot is left held."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 360  # ~3,600 tokens: 15 chunks
    rid = f"echo-abort-{stream}"
    out: dict = {}

    def run() -> None:
        r = requests.post(srv.url + "/v1/completions", timeout=T, stream=stream,
                          json={"prompt": prompt, "max_tokens": 4, "echo": True, "logprobs": 2, "rid": rid,
                                "stream": stream})
        out["status"] = r.status_code
        out["body"] = sse_events(r) if stream and r.status_code == 200 else r.json()

    t = threading.Thread(target=run)
    t.start()
    abort_once_running(srv, rid)
    t.join(T)
    by = requests.post(srv.url + "/v1/completions", timeout=T, json={"prompt": "One, two,", "max_tokens": 3})
    assert by.status_code == 200 and by.json()["choices"][0]["finish_reason"] == "length", by.text
    assert out["status"] == 200, out["body"]
    if stream:
        choices = [c for e in out["body"] if e != "[DONE]" for c in e["choices"]]
        assert not [e for e in out["body"] if "error" in e] and out["body"][-1] == "[DONE]", out["body"]
    else:
        choices = out["body"]["choices"]
    assert choices[-1]["finish_reason"] == "abort", choices[-1]["finish_reason"]
    lp = next(c["logprobs"] for c in choices if c["logprobs"])
    n = len(lp["tokens"])
    assert n > 3000 and len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    scored = [k for k, x in enumerate(lp["token_logprobs"]) if x is not None]
    assert 0 < len(scored) < n - 1, len(scored)  # aborted part way
    assert scored == list(range(1, len(scored) + 1))  # the first chunks, the first token unscored
    assert all((x is None) == (top is None) for x, top in zip(lp["token_logprobs"], lp["top_logprobs"]))
    assert "".join(c.get("text", "") for c in choices).startswith(prompt)
    no_leak(srv)


def test_native_prompt_logprobs_aborted_part_way_pair_each_score_with_its_token(srv):
    """/generate with logprob_start_len 0, aborted while its prompt was scored in chunks: its
    input_token_logprobs paired the first positions' scores with the prompt's LAST ids (the
    accumulator took the scores to end the prompt), so each score came with another token's id
    and text. They are now the prompt's ids from logprob_start_len on, as far as scored."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 360
    ids = requests.post(srv.url + "/tokenize", json={"prompt": prompt}, timeout=T).json()["tokens"]
    out: dict = {}

    def run() -> None:
        out["r"] = requests.post(srv.url + "/generate", timeout=T, json={
            "input_ids": ids, "rid": "native-abort", "sampling_params": {"max_new_tokens": 4},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2, "return_text_in_logprobs": True})

    t = threading.Thread(target=run)
    t.start()
    abort_once_running(srv, "native-abort")
    t.join(T)
    r = out["r"]
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
    triples = meta["input_token_logprobs"]
    assert 1 < len(triples) < len(ids), len(triples)  # aborted part way
    assert [t[1] for t in triples] == ids[:len(triples)]
    assert triples[0][0] is None and triples[0][2] == "The" and triples[1][2] == " quick"
    assert len(meta["input_top_logprobs"]) == len(triples)
    no_leak(srv)
