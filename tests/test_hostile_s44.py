"""Hostile clients against a real server (session 44): what a client sends, or makes the model
write, is answered (a 200 or a 400 naming the problem), never a 5xx or a stream cut off, and
holds no KV once answered."""
from __future__ import annotations

import json

import openai
import pytest
import requests

from treadle.runtime.server.testing import sse_events, wait_idle
from treadle.runtime.server.tool_calls import plan_tools

T = 120
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=T, max_retries=0)


def _streamed_content(srv, body: dict) -> tuple[str, list]:
    """A streamed chat reply's content (its deltas joined) and its events."""
    r = requests.post(srv.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=T)
    assert r.status_code == 200, r.text
    events = sse_events(r)
    assert events[-1] == "[DONE]", events[-3:]
    assert not any("error" in e for e in events[:-1] if isinstance(e, dict)), events
    text = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e.get("choices", []))
    return text, events


def test_a_call_whose_name_is_no_string_is_content_not_a_500(srv, client):
    # the reply is read for calls: {"name": ...} naming a listed tool. A name that is a list or
    # an object (what a model may write, and what a client's regex makes it write) was looked up
    # in the set of tool names: TypeError "unhashable type", a 500 (a stream cut off, no [DONE])
    body = {"model": "default", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 20}
    reply = '{"name": [1]}'  # a reply that is one object (Llama's format), unstreamed, with tools
    r = client.chat.completions.create(**body, tools=[WEATHER], extra_body={"regex": r'\{"name": \[1\]\}'})
    msg = r.choices[0].message
    assert msg.content == reply and not msg.tool_calls, r
    assert r.choices[0].finish_reason == "stop", r
    reply = '<tool_call>{"name": {}}</tool_call>'  # a tagged block, streamed, with legacy functions
    text, _ = _streamed_content(srv, {**body, "functions": [WEATHER["function"]],
                                      "regex": r'<tool_call>\{"name": \{\}\}</tool_call>'})
    assert text == reply
    wait_idle(srv.url)


def test_a_refusal_part_last_is_read_as_the_prompt_reads_it(srv):
    # the last message's text (for continue_final_message and echo) joined each part's "text"
    # member: a refusal part's own text ("refusal") was left out of the echo, and a refusal part
    # with a "text" member that is no string was a TypeError, a 500
    url = srv.url + "/v1/chat/completions"
    user = {"role": "user", "content": "Will you help?"}
    odd = {"role": "assistant", "content": [{"type": "refusal", "refusal": "No", "text": 5}]}
    r = requests.post(url, json={"model": "default", "messages": [user, odd], "max_tokens": 2}, timeout=T)
    assert r.status_code == 200, r.text
    refusal = {"role": "assistant", "content": [{"type": "text", "text": "I "}, {"type": "refusal", "refusal": "will not"}]}
    body = {"model": "default", "messages": [user, refusal], "max_tokens": 2, "echo": True,
            "add_generation_prompt": False, "continue_final_message": True}
    r = requests.post(url, json=body, timeout=T)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("I will not"), r.json()
    text, _ = _streamed_content(srv, body)
    assert text.startswith("I will not"), text
    wait_idle(srv.url)


def test_n_samples_of_a_lenient_json_schema_are_served(srv, client):
    # json_schema_lenient rewrites the request's schema and records what it dropped; its n
    # samples were then rebuilt from the request's params, json_schema_dropped among them,
    # which a client may not set: "json_schema_dropped is set by treadle", a 500 for a
    # plain lenient request with n > 1 (chat, completions and /generate alike)
    schema = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.37}}, "required": ["x"]}
    dropped = [{"keyword": "multipleOf", "path": "$.properties.x"}]

    def seen(listed: list) -> list:
        return [{k: d[k] for k in ("keyword", "path")} for d in listed]

    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "A number?"}], max_tokens=6, n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        extra_body={"json_schema_lenient": True})
    assert len(r.choices) == 2 and seen(r.model_extra["json_schema_dropped"]) == dropped, r
    body = {"model": "default", "prompt": "x =", "max_tokens": 6, "n": 2, "json_schema": json.dumps(schema),
            "json_schema_lenient": True, "stream": True}
    events = sse_events(requests.post(srv.url + "/v1/completions", json=body, stream=True, timeout=T))
    assert events[-1] == "[DONE]" and {c["index"] for e in events[:-1] for c in e["choices"]} == {0, 1}, events
    assert all(seen(e["json_schema_dropped"]) == dropped for e in events[:-1]), events
    r = requests.post(srv.url + "/generate", json={"text": "x =", "sampling_params": {
        "max_new_tokens": 6, "n": 2, "json_schema": json.dumps(schema), "json_schema_lenient": True}}, timeout=T)
    assert r.status_code == 200, r.text
    assert [seen(p["meta_info"]["json_schema_dropped"]) for p in r.json()] == [dropped, dropped], r.json()
    wait_idle(srv.url)


def test_best_of_is_an_integer_equal_to_n(srv):
    # best_of was compared to n by value: true and 1.0 (== 1 in Python) passed as n's default
    # (OpenAI refuses both), and on completions best_of 1 beside a null n was "not supported"
    for path, base in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions",
                                                             {"messages": [{"role": "user", "content": "Hi"}]})):
        for best_of in (True, 1.0, "1", [1]):
            r = requests.post(srv.url + path, json={"model": "default", **base, "max_tokens": 1, "best_of": best_of},
                              timeout=T)
            assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", (path, best_of, r.text)
            assert "must be an integer" in r.json()["error"]["message"], r.text
        r = requests.post(srv.url + path, json={"model": "default", **base, "max_tokens": 1, "n": None, "best_of": 1},
                          timeout=T)
        assert r.status_code == 200, (path, r.text)


def test_a_required_reply_read_with_free_text_names_no_call_of_its_making():
    # a `required` reply is read for the calls its grammar wrote; where it did not write all of
    # the text (the reasoning before it, kept with separate_reasoning false, under
    # --reasoning-parser think) that text may look like the head of a call: a name that is no
    # JSON string ("\x") was a JSONDecodeError, a 500, and a number became a call's name
    plan = plan_tools({"tools": [WEATHER], "tool_choice": "required"})
    assert plan.parse('<think>so [{"name": "\\x", "arguments": {', "length").calls == ()
    assert plan.parse('<think>[{"name": 5, "arguments": {}}]', "length").calls == ()
    assert plan.parse('[{"name": 5, "arguments": {}}]', "stop").calls == ()
    # what the grammar writes is read as before
    reply = plan.parse('[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "argu',
                       "length")
    assert [(c.name, c.arguments) for c in reply.calls] == [("get_weather", '{"city":"Paris"}'), ("get_weather", "")]
