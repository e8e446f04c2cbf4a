"""Lone surrogates (half a character, JSON's "\\ud800" escape) in chat requests against a real
server (session 41).

A model may write "\\ud800" in a tool call's arguments, valid JSON. The reply's `arguments`
held it as a raw lone surrogate: no UTF-8 a client could send back (the openai client's httpx
raises encoding it), and sent back escaped, the next turn's prompt held half a character, a 400
"at character 622" of a prompt the client never saw. Now the arguments are whole UTF-8 JSON
text of the same value and the conversation goes on. Half a character in the client's own
message or tool fields is a 400 naming the field, not a character of the rendered prompt."""
from __future__ import annotations

import json
import re

import pytest
import requests
from openai import OpenAI

from treadle.runtime.server.testing import sse_events, wait_idle

T = 120
LONE = "\ud800"
TOOLS = [{"type": "function", "function": {"name": "get_w", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


def post(srv, body: dict, **kw) -> requests.Response:
    # json.dumps writes a lone surrogate as its escape, as a JSON client does
    return requests.post(srv.url + "/v1/chat/completions", data=json.dumps({"model": "default", **body}),
                         headers={"Content-Type": "application/json"}, timeout=T, **kw)


def test_a_tool_call_with_a_lone_surrogate_escape_goes_on_to_the_next_turn(srv):
    messages = [{"role": "user", "content": "weather?"}]
    # the model's reply forced (a regex beside tools: auto parses the reply as usual)
    forced = '<tool_call>{"name": "get_w", "arguments": {"city": "\\ud800"}}</tool_call>'
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 60, "temperature": 0, "regex": re.escape(forced)}
    r = post(srv, body)
    assert r.status_code == 200, r.text[:400]
    call = r.json()["choices"][0]["message"]["tool_calls"][0]
    args = call["function"]["arguments"]
    args.encode("utf-8")  # whole UTF-8: was a raw lone surrogate (UnicodeEncodeError)
    assert json.loads(args) == {"city": LONE}, args
    events = sse_events(post(srv, {**body, "stream": True}, stream=True))
    streamed = [tc["function"]["arguments"] for e in events if isinstance(e, dict) for ch in e["choices"]
                for tc in ch["delta"].get("tool_calls") or []]
    assert events[-1] == "[DONE]" and [json.loads(a) for a in streamed] == [{"city": LONE}], events[-3:]
    streamed[0].encode("utf-8")
    # the next turn, as the openai client sends it: the call, its result
    client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=T)
    turn = client.chat.completions.create(model="default", max_tokens=8, temperature=0, tools=TOOLS, messages=[
        *messages, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}])
    assert turn.choices[0].finish_reason in ("stop", "length", "tool_calls"), turn
    wait_idle(srv.url)


USER = {"role": "user", "content": "Hi"}


@pytest.mark.parametrize("body, where", [
    ({"messages": [{"role": "user", "content": "Hi " + LONE}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]}, "messages[0].content"),
    ({"messages": [USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "x", "name": LONE}]},
     "messages[2].name"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_w", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": LONE}],
      "tools": TOOLS}, "messages[2].content"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get" + LONE, "arguments": "{}"}}]}]}, "messages[1].tool_calls[0].function.name"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "description": "d" + LONE}}]},
     "tools[0].function.description"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "description": LONE}}}}}]},
     "tools[0].function.parameters.properties.a.description"),
    ({"messages": [USER], "functions": [{"name": "f", "description": LONE}]}, "functions[0].description"),
], ids=["content", "content-part", "name", "tool-result", "call-name", "tool-description", "tool-parameters",
        "legacy-function"])
def test_a_lone_surrogate_in_a_message_or_a_tool_is_a_400_naming_the_field(srv, body, where):
    r = post(srv, {"max_tokens": 2, **body})
    assert r.status_code == 400, r.text[:400]
    err = r.json()["error"]
    # was "the text has a lone surrogate (U+D800) at character 118" (of the rendered prompt)
    assert err["message"].startswith(where) and "lone surrogate" in err["message"], err
    assert err["param"] == where.split("[")[0], err
