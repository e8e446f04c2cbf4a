"""OpenAI's legacy function calling (`functions` / `function_call`, deprecated, still taken by
OpenAI's API and sent by older clients and frameworks) on a real server with the openai
client: the same as tools of those functions, answered in the legacy shape
(message.function_call, finish_reason "function_call", streamed as delta.function_call);
legacy conversation history (an assistant's function_call, `function` result messages) renders
as tool calls and results. Before, `functions` was a 400 "unknown field"."""
from __future__ import annotations

import json

import openai
import pytest
import requests

T = 120
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"]}}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
# under function_call "auto" this model never calls on its own: a `choices` constraint (the
# request's own, which "auto" keeps) makes the reply text then a call, parsed as any reply is
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FORCED = {"choices": ["Let me check. " + CALL]}


@pytest.fixture(scope="module")
def srv(plain_server):
    return plain_server  # shared with other modules (conftest.py)


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=T)


def streamed(client, **kw) -> tuple[dict, str | None, str]:
    """The function_call and content a stream's deltas add up to, and its finish_reason."""
    call, content, finish = {}, "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        d = chunk.choices[0].delta
        assert not d.tool_calls, d
        if d.function_call is not None:
            for k in ("name", "arguments"):
                if getattr(d.function_call, k) is not None:
                    call[k] = call.get(k, "") + getattr(d.function_call, k)
        content += d.content or ""
        finish = chunk.choices[0].finish_reason or finish
    return call, finish, content


def test_a_named_function_call_is_answered_as_message_function_call(client):
    kw = dict(model="default", messages=ASK, functions=[WEATHER], function_call={"name": "get_weather"},
              max_tokens=40, temperature=0)
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert msg.tool_calls is None and msg.content is None, msg
    assert msg.function_call.name == "get_weather" and set(json.loads(msg.function_call.arguments)) == {"city"}, msg
    assert r.choices[0].finish_reason == "stop"  # a forced call stops, as OpenAI's
    call, finish, content = streamed(client, **kw)
    assert call == {"name": "get_weather", "arguments": msg.function_call.arguments} and finish == "stop", call
    assert content == ""


def test_an_auto_function_call_finishes_with_function_call_streamed_or_not(client):
    kw = dict(model="default", messages=ASK, functions=[WEATHER], max_tokens=60, temperature=0, extra_body=FORCED)
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "function_call" and msg.tool_calls is None, r
    assert (msg.function_call.name, json.loads(msg.function_call.arguments)) == ("get_weather", {"city": "Paris"})
    assert msg.content == "Let me check."
    call, finish, content = streamed(client, **kw)
    assert call == {"name": "get_weather", "arguments": msg.function_call.arguments}, call
    assert finish == "function_call" and content == "Let me check."
    # the same reply with tools is today's shape
    t = client.chat.completions.create(**{**kw, "functions": None}, tools=[{"type": "function", "function": WEATHER}])
    assert t.choices[0].finish_reason == "tool_calls" and t.choices[0].message.function_call is None
    assert t.choices[0].message.tool_calls[0].function.arguments == msg.function_call.arguments


def test_function_call_none_leaves_the_functions_out(client):
    r = client.chat.completions.create(model="default", messages=ASK, functions=[WEATHER], function_call="none",
                                       max_tokens=6, temperature=0)
    plain = client.chat.completions.create(model="default", messages=ASK, max_tokens=6, temperature=0)
    assert r.choices[0].message.function_call is None and r.choices[0].message.content
    assert r.choices[0].message.content == plain.choices[0].message.content  # the same prompt: tools not rendered


def test_legacy_history_renders_as_tool_calls_and_results(srv, client):
    history = ASK + [{"role": "assistant", "content": None,
                      "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                     {"role": "function", "name": "get_weather", "content": '{"temp": 21}'}]
    as_tools = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    ids = [requests.post(srv.url + "/tokenize", json={"messages": m}, timeout=T).json()["tokens"]
           for m in (history, as_tools)]
    assert ids[0] == ids[1]
    prompt = requests.post(srv.url + "/detokenize", json={"tokens": ids[0]}, timeout=T).json()["prompt"]
    assert '"name": "get_weather"' in prompt and '<tool_response>\n{"temp": 21}' in prompt, prompt
    r = client.chat.completions.create(model="default", messages=history, functions=[WEATHER], max_tokens=4,
                                       temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "function_call")


@pytest.mark.parametrize("extra, param, words", [
    ({"functions": [WEATHER], "tools": [{"type": "function", "function": WEATHER}]}, "tools", "legacy form"),
    ({"functions": [WEATHER], "parallel_tool_calls": False}, "parallel_tool_calls", "legacy form"),
    ({"functions": "get_weather"}, "functions", "functions must be a list"),
    ({"functions": [{"name": "bad name"}]}, "functions", "functions[0].name must be"),
    ({"function_call": "auto"}, "function_call", "non-empty functions list"),
    ({"functions": [WEATHER], "function_call": "required"}, "function_call", "function_call must be"),
    ({"functions": [WEATHER], "function_call": {"name": "nope"}}, "function_call", "'nope', which is not in functions"),
    ({"functions": [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strng"}}}}],
      "function_call": {"name": "f"}}, "functions", "functions[0].parameters"),
    ({"messages": ASK + [{"role": "function", "content": "21"}]}, "messages[1].name", "needs the `name`"),
    ({"messages": ASK + [{"role": "function", "name": "get_weather", "content": None}]}, "messages[1].content",
     "a function message needs a 'content'"),
    ({"messages": ASK + [{"role": "user", "content": "x", "function_call": {"name": "f"}}]}, "messages",
      "function_call must be"),
])
def test_bad_legacy_fields_are_400s_naming_them(srv, extra, param, words):
    r = requests.post(srv.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, **extra}, timeout=T)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
