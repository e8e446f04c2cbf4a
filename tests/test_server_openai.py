"""The OpenAI-compatible API through the real `openai` client, against a real server
subprocess (with an API key) running the embedded SmolLM2."""
from __future__ import annotations

import json
import re
import uuid

from typing import Optional

import openai
import pytest
import requests
from pydantic import BaseModel

from treadle.runtime.server.testing import ServerProcess

pytestmark = pytest.mark.slow
KEY = "sk-treadle-test"
T = 300  # a hang guard, not a speed check: n=6 structural-tag samples took past 120 s on a loaded 2-core box
MSGS = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(["--max-total-tokens", "8192", "--api-key", KEY, "--served-model-name", "smol",
                         "--log-level", "warning", "--reasoning-parser", "think"])
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=T, max_retries=0)


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["smol"]


def test_chat(client):
    r = client.chat.completions.create(model="smol", messages=MSGS, max_tokens=12, temperature=0)
    c = r.choices[0]
    assert r.object == "chat.completion" and c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_stream(client):
    kw = dict(model="smol", messages=MSGS, max_completion_tokens=12, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content
    stream = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    parts, reasons, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert "".join(parts) == full
    assert reasons[-1] in ("stop", "length") and usage is not None and usage.completion_tokens > 0


@pytest.mark.parametrize("slots", [100_000, 240])
def test_default_max_tokens_fills_the_context(slots):
    """Left out, max_tokens is what the context (or the KV pool) holds after the prompt, as in
    vLLM: a 231-token prompt in a 256-token context gets 25, as an explicit 25 does (it got
    24); completions cap it at OpenAI's 16. The pool can hold less than the context. (A stand-in for the tokenizer manager: only
    `_make`'s arithmetic is under test.)"""
    from types import SimpleNamespace
    from treadle.runtime.server.openai_api import _make
    tm = SimpleNamespace(context_len=256, num_slots=slots, make_req=lambda **kw: kw["params"])
    ids = list(range(231))
    room = min(256, slots) - 231
    assert _make(tm, {}, ids, default_max=None, return_logprob=False, top=0)["max_new_tokens"] == room
    assert _make(tm, {}, ids, default_max=16, return_logprob=False, top=0)["max_new_tokens"] == min(16, room)
    assert _make(tm, {"max_tokens": 7}, ids, default_max=None, return_logprob=False, top=0)["max_new_tokens"] == 7


def test_completions_and_n(client):
    r = client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    r2 = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=5, n=2, temperature=0.9,
                                   seed=3)
    assert [c.index for c in r2.choices] == [0, 1] and all(c.text for c in r2.choices)
    assert 2 <= r2.usage.completion_tokens <= 10
    one = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=1)
    assert r2.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once, not per sample


def test_stop_string(client):
    r = client.completions.create(model="smol", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=["7"])
    c = r.choices[0]
    assert c.finish_reason == "stop" and "7" not in c.text and "6" in c.text


def test_seed_determinism(client):
    kw = dict(model="smol", prompt="My favourite animal is", max_tokens=10, temperature=1.0)
    a = client.completions.create(**kw, seed=1234).choices[0].text
    b = client.completions.create(**kw, seed=1234).choices[0].text
    assert a == b


def test_logprobs(client):
    r = client.chat.completions.create(model="smol", messages=MSGS, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for tok in content:
        assert tok.logprob <= 0 and len(tok.top_logprobs) == 3
        assert tok.top_logprobs[0].token == tok.token  # greedy
    rc = client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2)
    lp = rc.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 4 and all(len(t) <= 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == rc.choices[0].text
    # completions list the sampled token among its step's top_logprobs too (OpenAI: up to
    # logprobs + 1 entries), however unlikely a hot temperature made it
    hot = client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=12, temperature=2.0, seed=3,
                                    logprobs=1).choices[0].logprobs
    for tok, tlp, tops in zip(hot.tokens, hot.token_logprobs, hot.top_logprobs):
        assert 1 <= len(tops) <= 2 and tops[tok] == tlp, (tok, tlp, tops)


def test_usage_cached_tokens_on_repeat(client):
    msgs = [{"role": "user", "content": "Tell me something about the radix tree data structure, briefly."}]
    client.chat.completions.create(model="smol", messages=msgs, max_tokens=2, temperature=0)
    r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens > 0
    # n samples of a prompt never sent: the shared prefill they start with is not a cache hit
    # of the request (it reported all but one prompt token cached); streamed the same
    fresh = [{"role": "user", "content": f"Name a colour ({uuid.uuid4().hex})."}]
    r = client.chat.completions.create(model="smol", messages=fresh, max_tokens=2, temperature=1.0, n=3)
    assert r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens // 2, r.usage
    again = client.chat.completions.create(model="smol", messages=fresh, max_tokens=2, temperature=1.0, n=3,
                                           stream=True, stream_options={"include_usage": True})
    usage = [c.usage for c in again if c.usage is not None][-1]
    assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 1, usage  # now it was cached


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=60,
        temperature=0, response_format={"type": "json_schema",
                                        "json_schema": {"name": "person", "schema": schema, "strict": True}})
    obj = json.loads(r.choices[0].message.content)
    assert isinstance(obj["name"], str) and isinstance(obj["age"], int)
    r2 = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": 'Reply with exactly this JSON: {"ok": true}'}],
        max_tokens=60, temperature=0, response_format={"type": "json_object"})
    assert r2.choices[0].finish_reason == "stop", r2.choices[0].message.content
    assert isinstance(json.loads(r2.choices[0].message.content), dict)


def test_json_schema_lenient_drops_and_reports(client, server):
    """A keyword treadle cannot enforce (multipleOf 0.3 on a number) is a 400 naming it and its
    path; with json_schema_lenient it is dropped and listed, in the OpenAI response and in the
    native meta_info."""
    schema = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.3}}, "required": ["x"]}
    rf = {"type": "json_schema", "json_schema": {"name": "half", "schema": schema}}
    ask = dict(model="smol", messages=[{"role": "user", "content": "Give x as JSON."}], max_tokens=40,
               temperature=0, response_format=rf)
    with pytest.raises(openai.BadRequestError, match=r"multipleOf' at \$\.properties\.x"):
        client.chat.completions.create(**ask)
    r = client.chat.completions.create(**ask, extra_body={"json_schema_lenient": True})
    dropped = r.model_extra["json_schema_dropped"]
    assert [(d["keyword"], d["path"]) for d in dropped] == [("multipleOf", "$.properties.x")], dropped
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content)["x"], (int, float))
    native = requests.post(server.url + "/generate", headers={"Authorization": f"Bearer {KEY}"}, timeout=T, json={
        "text": "x =", "sampling_params": {"json_schema": schema, "json_schema_lenient": True, "max_new_tokens": 8,
                                           "temperature": 0}})
    assert native.status_code == 200, native.text
    assert native.json()["meta_info"]["json_schema_dropped"][0]["keyword"] == "multipleOf"
    off = requests.post(server.url + "/generate", headers={"Authorization": f"Bearer {KEY}"}, timeout=T, json={
        "text": "x =", "sampling_params": {"json_schema": {"type": "integer"}, "json_schema_lenient": True,
                                           "max_new_tokens": 4}})
    assert off.json()["meta_info"]["json_schema_dropped"] == []  # lenient, nothing to drop: said so


class TreeNode(BaseModel):
    name: str
    children: list[TreeNode]
    parent: Optional[TreeNode]


def test_parse_into_a_recursive_pydantic_model(client):
    """``client.chat.completions.parse(response_format=Model)``: the openai client sends the
    model's strict schema (recursive through list and Optional), the output parses into it."""
    deep = '{"name":"a","children":[],"parent":{"name":"r","children":[],"parent":null}}'
    msgs = [{"role": "system", "content": "You write JSON."},
            {"role": "user", "content": "Reply with exactly this JSON: " + deep}]
    r = client.chat.completions.parse(model="smol", messages=msgs, response_format=TreeNode, max_tokens=200,
                                      temperature=0)
    node = r.choices[0].message.parsed
    assert isinstance(node, TreeNode) and node.name == "a" and node.parent.name == "r", r.choices[0].message.content
    assert TreeNode.model_validate_json(r.choices[0].message.content) == node


QUERY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
         "required": ["city", "unit"]}
JSON_BLOCKS = {"type": "structural_tag", "structures": [{"begin": "```json\n", "schema": QUERY, "end": "\n```"}],
               "triggers": ["```"]}


def test_response_format_structural_tag(client):
    """A free reply in which every code block the model opens is a JSON block holding a valid
    query (SGLang's structural_tag response format). Read back independently: each ``` opens
    ```json, a value that validates, and the closing fence."""
    import jsonschema

    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Give the weather query for Paris as a JSON code block."}],
        response_format=JSON_BLOCKS, max_tokens=80, temperature=0.8, n=6, seed=1)
    blocks = 0
    for c in r.choices:
        text = c.message.content
        pos = 0
        while (at := text.find("```", pos)) >= 0:
            assert text.startswith("```json\n", at), text
            value, end = json.JSONDecoder().raw_decode(text, at + 8)
            jsonschema.validate(value, QUERY)
            if c.finish_reason == "length" and end + 4 > len(text):
                break  # cut by max_tokens inside the end
            assert text.startswith("\n```", end), text
            blocks += 1
            pos = end + 4
    assert blocks >= 1, [c.message.content for c in r.choices]


def test_response_format_structural_tag_format_tree(client):
    """xgrammar's ``format`` form: a reply that is one JSON block and a one-line comment after
    it (``sequence`` of a ``tag`` and an ``any_text`` tag). Read back independently."""
    import jsonschema

    fmt = {"type": "sequence", "elements": [
        {"type": "tag", "begin": "```json\n", "content": {"type": "json_schema", "json_schema": QUERY}, "end": "\n```"},
        {"type": "tag", "begin": "\nNote: ", "content": {"type": "any_text"}, "end": "."}]}
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Give the weather query for Paris as a JSON code block."}],
        response_format={"type": "structural_tag", "format": fmt}, max_tokens=120, temperature=0)
    text = r.choices[0].message.content
    assert text.startswith("```json\n"), text
    value, end = json.JSONDecoder().raw_decode(text, 8)
    jsonschema.validate(value, QUERY)
    assert text.startswith("\n```\nNote: ", end), text
    if r.choices[0].finish_reason == "stop":
        assert text.endswith(".") and text.count(".", end) == 1, text
    bad = {"type": "structural_tag", "format": {"type": "sequence", "elements": [{"type": "any_text"},
                                                                                 {"type": "json_schema", "json_schema": QUERY}]}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=MSGS, response_format=bad, max_tokens=4)
    assert "must begin with fixed text" in str(e.value)


def test_extra_body_regex_and_choices(client):
    r = client.completions.create(model="smol", prompt="The year is", max_tokens=8, temperature=0,
                                  extra_body={"regex": "[0-9]{4}"})
    assert len(r.choices[0].text) == 4 and r.choices[0].text.isdigit()
    r = client.chat.completions.create(model="smol", messages=MSGS, max_tokens=8, temperature=0,
                                       extra_body={"choices": ["red", "green"], "top_k": 5})
    assert r.choices[0].message.content in ("red", "green")


def test_vllm_guided_names(client):
    r = client.chat.completions.create(model="smol", messages=MSGS, max_tokens=8, temperature=0,
                                       extra_body={"guided_choice": ["red", "green"]})
    assert r.choices[0].message.content in ("red", "green")
    r = client.completions.create(model="smol", prompt="The year is", max_tokens=8, temperature=0,
                                  extra_body={"guided_regex": "[0-9]{4}"})
    assert re.fullmatch("[0-9]{4}", r.choices[0].text)
    r = client.chat.completions.create(model="smol", messages=MSGS, max_tokens=8, temperature=0,
                                       extra_body={"guided_grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].message.content in ("yes", "no")
    r = client.chat.completions.create(model="smol", messages=MSGS, max_tokens=40, temperature=0,
                                       extra_body={"guided_json": {"type": "object", "properties": {
                                           "n": {"type": "integer"}}, "required": ["n"]}})
    assert isinstance(json.loads(r.choices[0].message.content)["n"], int)
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="smol", messages=MSGS, max_tokens=4,
                                       extra_body={"regex": "a", "guided_regex": "b"})
    assert "not both" in ei.value.body["message"]
    # include_stop_str_in_output: the matched stop string stays in the text
    kw = dict(model="smol", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=["7"])
    cut = client.completions.create(**kw).choices[0]
    kept = client.completions.create(**kw, extra_body={"include_stop_str_in_output": True}).choices[0]
    assert kept.text == cut.text + "7" and kept.finish_reason == cut.finish_reason == "stop", (kept, cut)
    # vLLM's meaning: the text ends right after the stop string, also inside a token (" Paris" -> " Par";
    # no_stop_trim, SGLang's, keeps the whole token)
    kw = dict(model="smol", prompt="The capital of France is", max_tokens=30, temperature=0, stop=["r"])
    cut = client.completions.create(**kw).choices[0].text
    kept = client.completions.create(**kw, extra_body={"include_stop_str_in_output": True}).choices[0].text
    whole = client.completions.create(**kw, extra_body={"no_stop_trim": True}).choices[0].text
    assert kept == cut + "r" and whole.startswith(kept) and whole != kept, (cut, kept, whole)


def test_extra_body_ebnf(client):
    grammar = 'root ::= "The answer is " num "."\nnum ::= [1-9] [0-9]?'
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "What is 6 times 7?"}],
                                       max_tokens=12, temperature=0, extra_body={"ebnf": grammar})
    text = r.choices[0].message.content
    assert re.fullmatch(r"The answer is [1-9][0-9]?\.", text) and r.choices[0].finish_reason == "stop", text


def test_completions_echo_scores_the_prompt(client):
    prompt = "The capital of France is"
    r = client.completions.create(model="smol", prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    c, lp = r.choices[0], r.choices[0].logprobs
    assert c.text == prompt and "".join(lp.tokens) == prompt and len(lp.tokens) == r.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x < 0 for x in lp.token_logprobs[1:]) and lp.text_offset == sorted(lp.text_offset)
    # generating, echoed or not: the same tokens, with the prompt in front
    plain = client.completions.create(model="smol", prompt=prompt, max_tokens=4, temperature=0, logprobs=1).choices[0]
    echoed = client.completions.create(model="smol", prompt=prompt, max_tokens=4, temperature=0, logprobs=1,
                                       echo=True).choices[0]
    assert echoed.text == prompt + plain.text
    assert echoed.logprobs.tokens == lp.tokens + plain.logprobs.tokens
    assert echoed.logprobs.token_logprobs[:len(lp.tokens)] == pytest.approx(lp.token_logprobs, abs=0.05)
    assert echoed.logprobs.token_logprobs[len(lp.tokens):] == pytest.approx(plain.logprobs.token_logprobs, abs=0.05)
    # scoring prompt + answer gives the answer's first token the logprob it was generated with
    scored = client.completions.create(model="smol", prompt=prompt + plain.logprobs.tokens[0], max_tokens=0,
                                       echo=True, logprobs=0).choices[0].logprobs
    assert scored.token_logprobs[-1] == pytest.approx(plain.logprobs.token_logprobs[0], abs=0.05)
    # streamed: the prompt comes first, once
    parts = [c.text for chunk in client.completions.create(model="smol", prompt=prompt, max_tokens=4, temperature=0,
                                                           echo=True, stream=True) for c in chunk.choices]
    assert parts[0].startswith(prompt) and "".join(parts) == echoed.text
    # a prompt of token ids is echoed as their text
    text = client.completions.create(model="smol", prompt=[504, 3575, 282], max_tokens=0, echo=True).choices[0].text
    again = client.completions.create(model="smol", prompt=text, max_tokens=0, echo=True, logprobs=0).choices[0]
    assert text and again.text == text and len(again.logprobs.tokens) == 3


def test_logit_bias(client, server):
    prompt = "The capital of France is"
    # the greedy reply's first token, id and text, from the native API
    out = requests.post(server.url + "/generate", headers={"Authorization": f"Bearer {KEY}"}, timeout=T,
                        json={"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).json()
    first, first_text = out["output_ids"][0], out["text"]
    kw = dict(model="smol", prompt=prompt, temperature=0, logprobs=0)
    assert client.completions.create(**kw, max_tokens=1).choices[0].logprobs.tokens == [first_text]
    banned = client.completions.create(**kw, max_tokens=3, logit_bias={str(first): -100}).choices[0]
    assert banned.logprobs.tokens[0] != first_text
    forced = client.completions.create(**kw, max_tokens=3, logit_bias={str(first): 100}).choices[0]
    assert forced.finish_reason == "length" and forced.logprobs.tokens == [first_text] * 3
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(**kw, max_tokens=1, logit_bias={"12": 500})
    assert "logit_bias" in ei.value.body["message"] and ei.value.body["param"] == "logit_bias"


THINK = {"regex": "<think>[a-z ]{12,40}</think>[A-Z][a-z ]{3,30}\\."}  # a reasoning reply from SmolLM2


def test_reasoning_content(client):
    kw = dict(model="smol", messages=MSGS, max_tokens=60, temperature=0, extra_body=THINK)
    m = client.chat.completions.create(**kw).choices[0].message
    raw = client.chat.completions.create(**{**kw, "extra_body": {**THINK, "separate_reasoning": False}})
    text = raw.choices[0].message.content
    assert text.startswith("<think>") and "</think>" in text
    assert m.reasoning_content == text[7:text.index("</think>")].strip()
    assert m.content == text[text.index("</think>") + 8:].lstrip() and m.content.endswith(".")
    assert raw.choices[0].message.model_extra.get("reasoning_content") is None
    reasoning, content = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            reasoning.append(c.delta.model_extra.get("reasoning_content") or "")
            content.append(c.delta.content or "")
    assert "".join(reasoning) == m.reasoning_content and "".join(content) == m.content
    assert sum(1 for r in reasoning if r) > 1  # the reasoning streams in pieces


def test_chat_template_kwargs(client):
    r = client.chat.completions.create(model="smol", messages=MSGS, max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="smol", messages=MSGS, max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"tokenize": True}})
    assert ei.value.body["param"] == "chat_template_kwargs"


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                                                   "maxLength": 20}},
                                                         "required": ["city"]}}}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCE_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


def _check_calls(calls, allowed=TOOLS):
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in allowed}
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in schemas
        jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])


def test_tool_choice_named_and_required(client):
    r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice=FORCE_WEATHER,
                                       max_tokens=60, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.message.content is None and len(c.message.tool_calls) == 1
    _check_calls(c.message.tool_calls, [WEATHER])
    r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="required", n=2,
                                       parallel_tool_calls=False, max_tokens=80, temperature=0.8, seed=3)
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None and len(c.message.tool_calls) == 1
        _check_calls(c.message.tool_calls)
    # cut short by max_tokens: no content (it was the wrapper array, '[{"name":...'), the call
    # as far as it got once its name is whole
    for n in (6, 12):
        c = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=n, temperature=0).choices[0]
        assert c.finish_reason == "length" and c.message.content is None, c.message
        assert all(t.function.name == "get_weather" for t in c.message.tool_calls or [])


SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search hotels",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "filters": {"type": "object"}},
                   "required": ["city", "filters"]}}}


def test_tool_with_a_free_form_parameter(client):
    """A free-form parameter (``filters: {"type": "object"}``) is a hole in the call grammar
    (constrained/index/json_holes.py), not a regex unrolled two levels: the calls validate. (The
    small model, sampled, may also nest on until max_tokens: those replies end in "length".)"""
    ask = [{"role": "user", "content": 'Call search with city "Rome" and filters {"pool": {"required": true}, '
                                       '"price": {"max": 100, "currency": "EUR"}}.'}]
    r = client.chat.completions.create(model="smol", messages=ask, tools=[SEARCH, CLOCK], tool_choice="required",
                                       n=6, max_tokens=200, temperature=1.0, seed=1)
    finished = [c for c in r.choices if c.finish_reason == "tool_calls"]
    assert finished, [c.message for c in r.choices]
    for c in finished:
        _check_calls(c.message.tool_calls, [SEARCH, CLOCK])


def test_tool_calls_stream_like_non_stream(client):
    kw = dict(model="smol", messages=ASK, tools=TOOLS, tool_choice=FORCE_WEATHER, max_tokens=60, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.tool_calls[0].function.arguments
    names, args, reasons = [], [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            reasons.append(c.finish_reason)
            for tc in c.delta.tool_calls or []:
                assert tc.index == 0
                names.append(tc.function.name)
                args.append(tc.function.arguments or "")
    assert [n for n in names if n] == ["get_weather"] and len(args) > 2  # arguments arrive in pieces
    assert "".join(args) == full and reasons[-1] == "stop"
    calls = {}
    for chunk in client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="required",
                                                max_tokens=80, temperature=0, stream=True):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                calls[tc.index] = tc
            reason = c.finish_reason
    assert reason == "tool_calls"
    _check_calls(list(calls.values()))


def test_tool_choice_auto_and_a_tool_conversation(client):
    # the model may answer or call; either way the reply is well formed
    r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, max_tokens=60, temperature=0)
    c = r.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
        _check_calls(c.message.tool_calls)
    else:
        assert c.message.content and c.finish_reason in ("stop", "length")
    strict = [{"type": "function", "function": {**t["function"], "strict": True}} for t in TOOLS]
    r = client.chat.completions.create(model="smol", messages=ASK, tools=strict, max_tokens=40, temperature=0.8,
                                       n=4, seed=5)  # its <tool_call> blocks run under a structural tag
    for c in r.choices:
        if c.message.tool_calls:
            _check_calls(c.message.tool_calls)
        else:
            assert c.message.content and c.finish_reason in ("stop", "length")
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "unit": "C"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'}]
    r = client.chat.completions.create(model="smol", messages=history, tools=TOOLS, tool_choice="none",
                                       max_tokens=30, temperature=0)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    alone = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="none",
                                           max_tokens=1).usage.prompt_tokens
    assert r.usage.prompt_tokens > alone + 20  # the call and its result are part of the prompt


def odd_tool(properties: dict) -> dict:
    return {"type": "function", "function": {"name": "odd", "parameters": {"type": "object", "properties": properties,
                                                                          "required": list(properties)}}}


@pytest.mark.parametrize("kwargs,needle", [
    ({"tools": [{"type": "function", "function": {"name": "x y"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "not in tools"),
    ({"tool_choice": "required"}, "needs a non-empty tools list"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}],
      "tools": TOOLS}, "messages[0].tool_calls[0]"),
    # a schema keyword the grammar cannot enforce, located in the request's tools (it read
    # "$.items.properties.arguments.properties.n", the grammar's wrapper)
    ({"tools": [odd_tool({"n": {"type": "integer", "multipleOf": 7}})], "tool_choice": "required"},
     "'multipleOf' at tools[0].function.parameters.properties.n"),
    ({"tools": [*TOOLS, odd_tool({"n": {"type": "integer", "multipleOf": 7}})], "tool_choice": "required"},
     f"'multipleOf' at tools[{len(TOOLS)}].function.parameters.properties.n"),
    ({"tools": [*TOOLS, odd_tool({"n": {"type": "integer", "multipleOf": 7}})],
      "tool_choice": {"type": "function", "function": {"name": "odd"}}},
     f"'multipleOf' at tools[{len(TOOLS)}].function.parameters.properties.n"),
])
def test_bad_tool_requests_are_400(client, server, kwargs, needle):
    kw = {"model": "smol", "messages": ASK, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(**kw)
    assert needle in ei.value.body["message"], ei.value.body
    if "multipleOf" in needle:
        assert ei.value.body["param"] == "tools"
    assert requests.get(server.url + "/health", timeout=T).status_code == 200


@pytest.mark.parametrize("kwargs,needle", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 2}, "top_p"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"extra_body": {"bogus_param": 1}}, "bogus_param"),
    ({"extra_body": {"regex": "(["}}, "regex"),
    ({"extra_body": {"ebnf": "root ::= [z-a]"}}, "reversed"),
    ({"extra_body": {"ebnf": 'root ::= "a"'}, "response_format": {"type": "json_object"}}, "ebnf"),
    ({"messages": [{"role": "user", "content": "hi " * 9000}]}, "context length"),
    ({"messages": [{"role": "user", "content": "x" * 2_000_000}]}, "in any tokenization"),
    ({"max_tokens": 8180}, "max_tokens (8180) + the prompt"),  # as vLLM and SGLang: no silent cap
    ({"max_completion_tokens": 8180}, "max_completion_tokens (8180) + the prompt"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {**JSON_BLOCKS, "triggers": ["~~~"]}}, "does not start with any of the triggers"),
    ({"n": 129}, "n must be in [1, 128]"),
    ({"stream_options": {"include_usage": True}}, "stream_options is only allowed with stream: true"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
     "json_schema.name must be"),
    ({"extra_body": {"continue_final_message": True}}, "set add_generation_prompt false"),
    ({"extra_body": {"continue_final_message": True, "add_generation_prompt": False}},
     "needs an assistant message last"),
    ({"extra_body": {"rid": 7}}, "rid must be"),
])
def test_bad_requests_are_400(client, server, kwargs, needle):
    kw = {"model": "smol", "messages": MSGS, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(**kw)
    body = ei.value.body
    assert needle in body["message"] and body["type"] == "invalid_request_error"
    param = {"context length": "messages", "in any tokenization": "messages", "reversed": "ebnf",
             "regex": "regex"}.get(needle)
    assert param is None or body["param"] == param, body
    assert requests.get(server.url + "/health", timeout=T).status_code == 200


def test_malformed_json_is_400(server):
    r = requests.post(server.url + "/v1/chat/completions", data=b"{oops", timeout=T,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_a_lone_surrogate_is_400(server):
    """JSON's "\\ud83d" escape parses to half a character (a client that cut a string inside
    an emoji sends it; the openai client cannot): a 400 naming the field, it was a 500."""
    auth = {"Authorization": f"Bearer {KEY}"}
    for path, body, param in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "cut \ud83d"}]},
                               "messages"),
                              ("/v1/completions", {"prompt": "a\udc00"}, "prompt"),
                              ("/tokenize", {"prompt": "a\ud800b"}, "prompt")):
        r = requests.post(server.url + path, json=body, headers=auth, timeout=T)  # ensure_ascii: the escape
        assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == param, r.text


def test_non_finite_numbers_are_400(server):
    # JSON parsers (Python's too) accept NaN / Infinity literals; the openai client will not send them
    for body in (b'{"model": "smol", "prompt": "hi", "max_tokens": 2, "temperature": NaN}',
                 b'{"model": "smol", "prompt": "hi", "max_tokens": 2, "top_p": Infinity}'):
        r = requests.post(server.url + "/v1/completions", data=body, timeout=T,
                          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        assert r.status_code == 400 and "finite" in r.json()["error"]["message"]
    assert requests.get(server.url + "/health", timeout=T).status_code == 200


def test_api_key(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", timeout=T, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = requests.post(server.url + "/generate", json={"text": "x"}, timeout=T)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert requests.get(server.url + "/health", timeout=T).status_code == 200  # liveness needs no key
    # nor do the other probes and scrapes (as SGLang); the rest does
    for path in ("/health_generate", "/metrics", "/version"):
        assert requests.get(server.url + path, timeout=T).status_code == 200, path
    for path in ("/get_server_info", "/v1/models"):
        assert requests.get(server.url + path, timeout=T).status_code == 401, path
    # unknown paths and methods answer in the OpenAI error shape (FastAPI's was {"detail": ...})
    r = requests.get(server.url + "/v1/nope", headers={"Authorization": f"Bearer {KEY}"}, timeout=T)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = requests.get(server.url + "/generate", headers={"Authorization": f"Bearer {KEY}"}, timeout=T)
    assert r.status_code == 405 and "error" in r.json()


def test_model_names(client, server):
    """The served name and SGLang's customary "default" reach the model; another name is a
    404 model_not_found (OpenAI's and vLLM's answer: it was served by this model regardless).
    /v1/models/{id} answers for the served name."""
    assert client.models.retrieve("smol").id == "smol"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    for name in ("smol", "default"):
        assert client.chat.completions.create(model=name, messages=MSGS, max_tokens=1).choices[0].message.content
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=1)
    assert ei.value.body["code"] == "model_not_found" and ei.value.body["param"] == "model", ei.value.body
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="smol2", prompt="hi", max_tokens=1)


def test_continue_final_message_and_developer_messages(client):
    """continue_final_message (vLLM's, with add_generation_prompt false) ends the prompt
    inside the assistant's begun reply: the prompt is the open turn plus its text, so the
    model continues it. A developer message is a system message to a template without the
    role (OpenAI's meaning): the same prompt, token for token."""
    begun = [{"role": "user", "content": "Count from 1 to 5."}, {"role": "assistant", "content": "1, 2, 3,"}]
    cont = client.chat.completions.create(model="smol", messages=begun, max_tokens=3, temperature=0,
                                          extra_body={"continue_final_message": True, "add_generation_prompt": False})
    fresh = client.chat.completions.create(model="smol", messages=begun[:1], max_tokens=1, temperature=0)
    tokens = requests.post(client.base_url.scheme + "://" + client.base_url.netloc.decode() + "/tokenize",
                           json={"prompt": "1, 2, 3,", "add_special_tokens": False}, timeout=T,
                           headers={"Authorization": f"Bearer {KEY}"}).json()["count"]
    # the fresh prompt ends with the opened assistant turn; the continued one adds its text
    # after the user turn's end and that opening (no end of turn, no second opening)
    assert cont.usage.prompt_tokens == fresh.usage.prompt_tokens + tokens, (cont.usage, fresh.usage, tokens)
    assert cont.choices[0].message.content.lstrip().startswith("4"), cont.choices[0].message.content
    # /tokenize with messages (vLLM's) gives the ids chat makes of them
    url = client.base_url.scheme + "://" + client.base_url.netloc.decode() + "/tokenize"
    for body, usage in (({"messages": begun, "add_generation_prompt": False, "continue_final_message": True},
                         cont.usage), ({"messages": begun[:1]}, fresh.usage)):
        r = requests.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=T)
        assert r.json()["count"] == usage.prompt_tokens, (r.text, usage)
    usage = [client.chat.completions.create(model="smol", messages=[{"role": role, "content": "Be brief."}, *MSGS],
                                            max_tokens=1, temperature=0).usage.prompt_tokens
             for role in ("system", "developer")]
    assert usage[0] == usage[1], usage


def test_rid_names_an_openai_request_for_abort_request(server):
    """SGLang's `rid` on the OpenAI routes: /abort_request ends the request by it, and the n
    samples of a request with it (it was accepted and ignored)."""
    import concurrent.futures as cf
    import time

    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "smol", "messages": MSGS, "max_tokens": 1500, "temperature": 0, "ignore_eos": True,
            "rid": "oai-job", "n": 2}
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(lambda: requests.post(server.url + "/v1/chat/completions", json=body, headers=auth,
                                              timeout=T))
        deadline = time.monotonic() + 60
        while requests.get(server.url + "/get_server_info", headers=auth, timeout=T).json()["num_running"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ok = requests.post(server.url + "/abort_request", json={"rid": "oai-job"}, headers=auth, timeout=T).json()
        r = fut.result(timeout=T)
    assert ok["success"] is True and r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["finish_reason"] for c in choices] == ["abort", "abort"], choices
    assert r.json()["usage"]["completion_tokens"] < 3000


def test_stream_usage_is_null_until_the_last_chunk_and_logprob_bytes_are_whole(server):
    """With include_usage, every chunk carries "usage": null but the last, as OpenAI's. A
    token that is a piece of a multi-byte character has its own bytes in `bytes` (they were
    those of U+FFFD, its decoded text), so the pieces join into the character."""
    from treadle.runtime.server.testing import sse_events

    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "smol", "messages": MSGS, "max_tokens": 4, "stream": True,  # the other keys: taken, no effect
            "stream_options": {"include_usage": True, "continuous_usage_stats": False, "include_obfuscation": False}}
    with requests.post(server.url + "/v1/chat/completions", json=body, headers=auth, stream=True, timeout=T) as r:
        events = [e for e in sse_events(r) if e != "[DONE]"]
    assert all(e["usage"] is None for e in events[:-1]) and events[-1]["usage"]["completion_tokens"] == 4, events
    tok = requests.post(server.url + "/tokenize", json={"prompt": "🌻", "add_special_tokens": False}, headers=auth,
                        timeout=T).json()["tokens"]
    assert len(tok) > 1  # the sunflower is byte pieces in SmolLM2's vocabulary
    r = requests.post(server.url + "/v1/chat/completions", headers=auth, timeout=T, json={
        "model": "smol", "messages": MSGS, "max_tokens": len(tok), "logprobs": True, "temperature": 0,
        "regex": "🌻"}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert bytes(b for e in content for b in e["bytes"]).decode() == "🌻", content


def test_cors_preflight_needs_no_key(server):
    """Browser pages may call the API (--allowed-origins, default any, as vLLM's and SGLang's):
    a preflight is answered without the key (a browser sends none), and answers carry the
    CORS header, a 401 too."""
    origin = {"Origin": "http://app.example"}
    r = requests.options(server.url + "/v1/chat/completions", timeout=T, headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})
    assert r.status_code == 200 and r.headers.get("access-control-allow-origin") in ("*", origin["Origin"]), r.headers
    for auth, status in (({"Authorization": f"Bearer {KEY}"}, 200), ({}, 401)):
        r = requests.get(server.url + "/v1/models", headers={**origin, **auth}, timeout=T)
        assert r.status_code == status and r.headers.get("access-control-allow-origin"), r.headers


def test_logprob_tokens_of_character_pieces(client):
    """A token that is a piece of a multi-byte character is OpenAI's "bytes:\\xe6\\x97" in
    logprobs (its text alone was U+FFFD for every piece, so a completions top_logprobs dict
    lost entries), and text_offset counts characters (each piece had counted one: every later
    offset was off)."""
    prompt = "日本 means Japan."
    lp = client.completions.create(model="smol", prompt=prompt, max_tokens=0, echo=True, logprobs=1).choices[0].logprobs
    assert "\ufffd" not in "".join(lp.tokens) and any(t.startswith("bytes:") for t in lp.tokens), lp.tokens
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] + len(lp.tokens[-1]) == len(prompt)
    for tok, off in zip(lp.tokens, lp.text_offset):
        assert tok.startswith("bytes:") or prompt[off:].startswith(tok), (tok, off, lp.text_offset)
