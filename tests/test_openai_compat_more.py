"""More of the OpenAI-compatible API as the real `openai` client sees it (its streaming
helper included), against one real server subprocess running the embedded SmolLM2. What
tests/test_server_openai.py covers is not repeated here."""
from __future__ import annotations

import json
import re

import openai
import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, sse_events

pytestmark = pytest.mark.slow
T = 300  # a hang guard, not a speed check

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]


def call(city: str) -> str:
    return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>' % city


# a reply of two calls under tool_choice "auto" (the request's own regex wins over the tools'
# structural tag; the calls are parsed from it as from a free reply)
TWO_CALLS = {"regex": re.escape(call("Paris") + "\n" + call("Rome"))}


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning"])
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=T, max_retries=0)


@pytest.mark.parametrize("name", [[], {}, ["get_weather"]])
def test_tool_choice_function_name_not_a_string_is_400(server, name):
    """A list or object as the named function made a TypeError (unhashable), a 500."""
    r = requests.post(server.url + "/v1/chat/completions", timeout=T, json={
        "model": "default", "messages": ASK, "tools": TOOLS, "max_tokens": 1,
        "tool_choice": {"type": "function", "function": {"name": name}}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "tool_choice" and "tool_choice.function.name" in err["message"], err


def _events(client, **kw) -> tuple[list, object]:
    with client.chat.completions.stream(model="default", messages=ASK, tools=TOOLS, max_tokens=80, temperature=0,
                                        **kw) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    return events, final


@pytest.mark.parametrize("kw", [{"extra_body": TWO_CALLS}, {"tool_choice": "required"},
                                {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}])
def test_stream_helper_ends_every_tool_call(client, kw):
    """The openai client's stream helper ends a call (tool_calls.function.arguments.done) when
    a later chunk starts another call or carries the finish_reason. The calls of an "auto" or
    "required" reply came in the chunk with the finish_reason, so the last call never ended:
    OpenAI sends the finish in a chunk of its own, with an empty delta."""
    events, final = _events(client, **kw)
    message = final.choices[0].message
    assert message.tool_calls, message
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert [e.index for e in done] == list(range(len(message.tool_calls))), [e.type for e in events]
    for e, tc in zip(done, message.tool_calls):
        assert e.name == "get_weather" and json.loads(e.arguments) == json.loads(tc.function.arguments)
    if "extra_body" in kw:
        assert [json.loads(tc.function.arguments)["city"] for tc in message.tool_calls] == ["Paris", "Rome"]
        assert final.choices[0].finish_reason == "tool_calls"
    else:
        # a reply that can only be tool calls has content null, streamed (as OpenAI's first
        # chunk says) as unstreamed; it added up to "" from the role chunk
        assert message.content is None, message


def test_streamed_finish_chunk_of_a_tool_reply_is_empty(server):
    """On the wire: the calls, then a last chunk with the finish_reason and an empty delta."""
    body = {"model": "default", "messages": ASK, "tools": TOOLS, "max_tokens": 80, "temperature": 0, "stream": True,
            **TWO_CALLS}
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=T) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [e["choices"][0] for e in events[:-1]]
    assert chunks[-1]["finish_reason"] == "tool_calls" and chunks[-1]["delta"] == {}, chunks[-1]
    assert all(c["finish_reason"] is None for c in chunks[:-1]), chunks
    assert sum(len(c["delta"].get("tool_calls") or []) for c in chunks) == 2, chunks


def test_chat_hints_are_accepted_and_other_modalities_refused(client, server):
    """reasoning_effort, verbosity, prediction and modalities ["text"] are what the openai client
    sends for newer models: a reply as without them (they were 'unknown field' 400s); a wrong
    type, or an audio modality this server cannot write, is a 400 naming the field."""
    kw = dict(model="default", messages=[{"role": "user", "content": "Say hi."}], max_tokens=6, temperature=0)
    plain = client.chat.completions.create(**kw).choices[0].message.content
    hinted = client.chat.completions.create(**kw, reasoning_effort="low", verbosity="low", modalities=["text"],
                                            prediction={"type": "content", "content": "Hi"})
    assert hinted.choices[0].message.content == plain
    for field, value in (("modalities", ["text", "audio"]), ("reasoning_effort", 3), ("prediction", "Hi")):
        r = requests.post(server.url + "/v1/chat/completions", json={**kw, field: value}, timeout=T)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
