"""More of the OpenAI-compatible API as the real `openai` client sees it (its streaming
helper included), against one real server subprocess running the embedded SmolLM2. What
tests/test_server_openai.py covers is not repeated here."""
from __future__ import annotations

import json
import re

import openai
import pytest
import requests

from treadle.runtime.server.testing import sse_events

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
def server(plain_server):
    return plain_server  # shared with other modules (conftest.py)


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


# ---- fields sent as JSON null (from test_openai_null_fields)
# Fields sent as JSON null through the real `openai` client, against a real server
# subprocess running the embedded SmolLM2: an optional field that is null means what leaving
# it out means, as vLLM's and SGLang's servers (their request models type these fields
# Optional) take it. Frameworks that write every field of a request model send such nulls.

ASK_PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_null_parallel_tool_calls_is_the_default(client):
    """parallel_tool_calls: null (vLLM and SGLang: Optional[bool]) was a 400 "must be a
    boolean"; it is the default, true: the same calls as leaving it out."""
    kw = dict(model="default", messages=ASK_PARIS, tools=TOOLS, tool_choice="required", max_tokens=60, temperature=0)
    left_out = client.chat.completions.create(**kw)
    null = client.chat.completions.create(**kw, parallel_tool_calls=None)
    calls = [(c.function.name, c.function.arguments) for c in null.choices[0].message.tool_calls]
    assert calls == [(c.function.name, c.function.arguments) for c in left_out.choices[0].message.tool_calls]
    assert null.choices[0].finish_reason == "tool_calls" and calls[0][0] == "get_weather"
    # without tools, as with any other unset option
    plain = client.chat.completions.create(model="default", messages=ASK_PARIS, max_tokens=3, temperature=0,
                                           parallel_tool_calls=None)
    assert plain.choices[0].message.content and plain.usage.completion_tokens == 3


# ---- chat echo and best_of (from test_openai_chat_echo)
# vLLM's chat `echo` and chat `best_of`, through the real `openai` client (extra_body),
# against a real server subprocess running the embedded SmolLM2.
#
# vLLM's /v1/chat/completions takes `echo`: the reply starts with the last message's content
# when that message has the reply's role (the assistant's, or any with
# add_generation_prompt false), the way a client continuing a prefilled assistant message gets
# the whole message back. treadle accepted the field and ignored it (the reply lacked the
# prefill). `best_of` other than `n` is a 400 on chat as on completions (it was ignored).

PREFILL = "The three primary colours are"
CONTINUE = [{"role": "user", "content": "Name the primary colours."}, {"role": "assistant", "content": PREFILL}]


def _streamed(client, **kw) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish


@pytest.mark.parametrize("n", [1, 2])
def test_echo_returns_the_continued_message_whole(client, n):
    cont = dict(model="default", messages=CONTINUE, max_tokens=6, temperature=0, n=n,
                extra_body={"add_generation_prompt": False, "continue_final_message": True})
    plain = client.chat.completions.create(**cont)
    tail = plain.choices[0].message.content
    assert tail and not tail.startswith(PREFILL)
    echoed = client.chat.completions.create(**{**cont, "extra_body": {**cont["extra_body"], "echo": True}})
    assert [c.message.content for c in echoed.choices] == [PREFILL + tail] * n
    assert [c.index for c in echoed.choices] == list(range(n))
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens  # the echo is prompt, not output
    text, finish = _streamed(client, **{**cont, "n": 1, "extra_body": {**cont["extra_body"], "echo": True}})
    assert text == PREFILL + tail and finish == "length"


def test_echo_with_a_generation_prompt_needs_an_assistant_message_last(client):
    """add_generation_prompt true: the reply's role is the assistant's, so only a last
    assistant message is echoed (vLLM's rule); a last user message is not."""
    ask = dict(model="default", messages=CONTINUE[:1], max_tokens=4, temperature=0)
    assert (client.chat.completions.create(**ask, extra_body={"echo": True}).choices[0].message.content
            == client.chat.completions.create(**ask).choices[0].message.content)
    after = dict(model="default", messages=CONTINUE, max_tokens=4, temperature=0)
    new = client.chat.completions.create(**after).choices[0].message.content
    assert client.chat.completions.create(**after, extra_body={"echo": True}).choices[0].message.content == PREFILL + new
    text, _ = _streamed(client, **after, extra_body={"echo": True})
    assert text == PREFILL + new


def test_chat_best_of_other_than_n_is_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=CONTINUE[:1], max_tokens=2, extra_body={"best_of": 3})
    assert e.value.status_code == 400 and e.value.body["param"] == "best_of"
    ok = client.chat.completions.create(model="default", messages=CONTINUE[:1], max_tokens=2, n=2,
                                        extra_body={"best_of": 2})
    assert len(ok.choices) == 2
