"""OpenAI's Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id}) through the
`openai` client as application code calls it: responses.create, .parse, .stream, .retrieve,
.delete and input_items.list, on the shared plain_server. Short replies throughout."""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Literal

import openai
import pytest
import requests
from openai.lib._pydantic import to_strict_json_schema  # the schema responses.parse sends
from pydantic import BaseModel

from treadle.runtime.server.testing import wait_idle

T = 60
# strict false: "auto" leaves the calls free (strict, OpenAI's default, constrains them: a grammar to compile)
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": False,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
NAMED = {"type": "function", "name": "get_weather"}


class Verdict(BaseModel):  # small to compile (an integer range took ~3 s here)
    answer: Literal["yes", "no"]
    sure: bool


@pytest.fixture(scope="module")
def client(plain_server):  # the server shared with other modules (conftest.py)
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="none", timeout=T, max_retries=0)


def _metric(server, name: str) -> float:
    text = requests.get(server.url + "/metrics", timeout=T).text
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_text_answer_usage_instructions_and_the_token_limit(client):
    r = client.responses.create(model="default", input="What is the capital of France?",
                                instructions="Answer in one word.", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model
    assert r.instructions == "Answer in one word." and r.max_output_tokens == 8 and r.temperature == 0
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert msg.content[0].annotations == [] and r.output_text == msg.content[0].text and r.output_text
    u = r.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens and 0 < u.output_tokens <= 8
    assert u.output_tokens_details.reasoning_tokens == 0 and u.input_tokens_details.cached_tokens >= 0
    assert (r.status, r.incomplete_details) == ("completed", None) or r.incomplete_details.reason == "max_output_tokens"
    # the instructions are in the prompt (a system message): longer ones, a longer prompt; a
    # 2-token limit cuts the reply
    cut = client.responses.create(model="default", input="What is the capital of France?", max_output_tokens=2,
                                  instructions="Answer in one word. Answer in one word.", temperature=0)
    assert cut.usage.input_tokens > u.input_tokens + 3
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[0].status == "incomplete" and cut.usage.output_tokens == 2


def test_structured_output_through_text_format_and_parse(client):
    schema = to_strict_json_schema(Verdict)  # what responses.parse sends: one grammar, compiled once
    r = client.responses.create(model="default", input="Is water wet? Answer in JSON.", max_output_tokens=24,
                                temperature=0, text={"format": {"type": "json_schema", "name": "verdict",
                                                                "schema": schema, "strict": True}})
    assert r.status == "completed", r
    Verdict.model_validate_json(r.output_text)
    assert r.text.format.type == "json_schema" and r.text.format.name == "verdict"
    parsed = client.responses.parse(model="default", input="Is the sky green? Answer in JSON.",
                                    text_format=Verdict, max_output_tokens=24, temperature=0)
    assert isinstance(parsed.output_parsed, Verdict), parsed
    obj = client.responses.create(model="default", input="Give a JSON object.", max_output_tokens=6, temperature=0,
                                  text={"format": {"type": "json_object"}})
    assert obj.output_text.startswith("{") and obj.text.format.type == "json_object"


def test_tool_call_round_trip(client):
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    r = client.responses.create(model="default", input=[ask], tools=[WEATHER], tool_choice=NAMED,
                                max_output_tokens=24, temperature=0)
    (call,) = r.output  # a reply that is only calls has no message item
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id and call.id
    assert isinstance(json.loads(call.arguments)["city"], str) and r.status == "completed"
    assert r.tools[0].name == "get_weather" and r.tool_choice.name == "get_weather"
    # the call and its output go back as input items: the next prompt holds the first one whole
    follow = [ask, call, {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    r2 = client.responses.create(model="default", input=follow, tools=[WEATHER], max_output_tokens=4,
                                 temperature=0)
    assert r2.output and r2.status in ("completed", "incomplete")
    assert r2.usage.input_tokens > r.usage.input_tokens + 10
    assert r2.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - 2  # the same prompt, rendered again
    # or only the output, after the stored response that made the call: the same prompt
    r3 = client.responses.create(model="default", input=follow[2:], previous_response_id=r.id, tools=[WEATHER],
                                 max_output_tokens=4, temperature=0)
    assert r3.usage.input_tokens == r2.usage.input_tokens, (r2.usage, r3.usage)
    # a named function streams its arguments; their deltas add up to the item's arguments
    events = list(client.responses.create(model="default", input=[ask], tools=[WEATHER], stream=True,
                                          tool_choice=NAMED,
                                          max_output_tokens=24, temperature=0))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"], kinds
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response.output[0]
    assert deltas == events[-3].arguments == final.arguments and json.loads(final.arguments)["city"]
    assert events[2].item.call_id == final.call_id


def test_stream_events_in_order_and_deltas_add_up(client):
    events = list(client.responses.create(model="default", input="Say hello.", max_output_tokens=10, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds
    n = kinds.count("response.output_text.delta")
    assert n >= 2 and kinds[4:4 + n] == ["response.output_text.delta"] * n
    assert kinds[4 + n:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                             "response.completed" if events[-1].response.status == "completed"
                             else "response.incomplete"], kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[4 + n].text == events[-1].response.output_text and text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[-1].response.usage.output_tokens <= 10
    # the client's stream helper, with a parsed format (a reply that completes)
    with client.responses.stream(model="default", input="Is fire hot? Answer in JSON.", text_format=Verdict,
                                 max_output_tokens=24, temperature=0) as stream:
        seen = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" in seen and isinstance(final.output_parsed, Verdict)


def test_logprobs_of_the_reply_text_whole_and_streamed(client):
    fmt = {"format": {"type": "json_schema", "name": "verdict", "schema": to_strict_json_schema(Verdict)}}
    kw = dict(model="default", input="Is ice cold? Answer in JSON.", max_output_tokens=24, temperature=0, text=fmt,
              include=["message.output_text.logprobs"], top_logprobs=2)
    r = client.responses.create(**kw)
    lps = r.output[0].content[0].logprobs
    assert r.status == "completed" and r.top_logprobs == 2
    assert len(lps) == r.usage.output_tokens and all(len(lp.top_logprobs) == 2 for lp in lps)
    assert "".join(lp.token for lp in lps).startswith(r.output_text)  # then the end token's
    events = list(client.responses.create(**kw, stream=True))
    streamed = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    final = events[-1].response.output[0].content[0].logprobs
    assert [lp.token for lp in final] == [lp.token for lp in lps]
    assert streamed == [lp.token for lp in lps][:len(streamed)] and len(streamed) >= len(lps) - 1


def test_store_retrieve_previous_response_id_and_delete(client):
    r1 = client.responses.create(model="default", input="My name is Ada.", max_output_tokens=8, temperature=0,
                                 metadata={"case": "store"})
    got = client.responses.retrieve(r1.id)
    assert got.id == r1.id and got.output_text == r1.output_text and got.metadata == {"case": "store"}
    r2 = client.responses.create(model="default", input="What is my name?", previous_response_id=r1.id,
                                 max_output_tokens=8, temperature=0)
    assert r2.previous_response_id == r1.id
    # the earlier turn leads the prompt: its prompt is a cached prefix of this one, its reply follows
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens - 1
    assert r2.usage.input_tokens > r1.usage.input_tokens + 5
    items = client.responses.input_items.list(r2.id, order="asc").data
    assert [(i.type, i.role, i.content[0].text) for i in items] == [("message", "user", "What is my name?")]
    client.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(r1.id)
    assert err.value.body["param"] == "response_id", err.value.body
    with pytest.raises(openai.BadRequestError) as err:  # deleted: no longer a conversation to go on from
        client.responses.create(model="default", input="Hi", previous_response_id=r1.id, max_output_tokens=2)
    assert err.value.body["param"] == "previous_response_id" and r1.id in err.value.body["message"]
    unstored = client.responses.create(model="default", input="Hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize("kw, param, words", [
    (dict(tools=[{"type": "web_search"}]), "tools", "web_search is one of OpenAI's built-in tools"),
    (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]),
     "input", "input[0].content[0]: input_image parts are not supported"),
    (dict(text={"format": {"type": "json_schema", "name": "bad", "schema": {"type": "nonsense"}}}),
     "text", "text.format.schema: keyword 'type'"),
    (dict(reasoning={"effort": "high"}), "reasoning", "reasoning.effort='high' is not supported"),
    (dict(background=True), "background", "no background responses"),
    (dict(include=["reasoning.encrypted_content"]), "include", "'reasoning.encrypted_content' is not supported"),
    (dict(top_logprobs=2, tools=[{"type": "function", "name": "f"}]), "include", "logprobs come with a reply of text"),
    (dict(truncation="auto"), "truncation", "does not drop input items"),
    (dict(extra_body={"best_of": 2}), "best_of", "unknown field(s): best_of"),
    (dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input", "'item_reference' are not supported"),
    (dict(max_output_tokens=-1), "max_output_tokens", "max_output_tokens must be >= 0"),
])
def test_what_cannot_be_served_is_a_400_naming_it(client, kw, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**{"model": "default", "input": "Hi", "max_output_tokens": 2, **kw})
    body = err.value.body
    assert body["param"] == param and words in body["message"], body


def test_disconnect_mid_stream_aborts_the_request(plain_server):
    server = plain_server
    aborted = _metric(server, 'treadle_requests_total{finish_reason="abort"}')
    r = requests.post(server.url + "/v1/responses", stream=True, timeout=T,
                      json={"input": "Tell a long story.", "stream": True, "max_output_tokens": 1000,
                            "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200, r.text
    deltas = 0
    for line in r.iter_lines():
        if line.startswith(b"event: response.output_text.delta"):
            deltas += 1
            if deltas == 3:
                break
    r.close()
    i = wait_idle(server.url)
    assert i["protected_slots"] == 0 and i["free_slots"] + i["evictable_slots"] == i["total_slots"], i
    assert _metric(server, 'treadle_requests_total{finish_reason="abort"}') == aborted + 1


def test_an_aborted_response_is_cancelled(client, plain_server):
    rid = "resp-abort-" + uuid.uuid4().hex
    got: list = []
    t = threading.Thread(target=lambda: got.append(client.responses.create(
        model="default", input="Tell a long story.", max_output_tokens=1000, temperature=0,
        extra_body={"ignore_eos": True, "request_id": rid})))
    t.start()
    while not got and requests.get(plain_server.url + "/get_server_info", timeout=T).json()["num_running"] == 0:
        time.sleep(0.05)
    assert requests.post(plain_server.url + "/abort_request", json={"rid": rid}, timeout=T).json()["success"]
    t.join(T)
    (r,) = got
    assert r.status == "cancelled" and r.output[0].status == "incomplete" and r.usage.output_tokens < 1000, r
    wait_idle(plain_server.url)


def test_the_store_is_bounded_by_count_and_by_characters():
    from treadle.runtime.server.responses_api import ResponseStore, Stored

    def entry(size: int) -> Stored:
        return Stored({}, [], [], size, size)

    store = ResponseStore(capacity=3, max_chars=100)
    for i in range(4):
        store.put(f"r{i}", entry(10))
    assert [store.get(f"r{i}") is not None for i in range(4)] == [False, True, True, True] and store.chars == 30
    store.put("big", entry(85))  # 115 characters: the oldest go until it fits
    assert store.get("r1") is None and store.get("r2") is None and store.get("r3") is not None
    assert store.chars == 95 and len(store) == 2
    store.put("huge", entry(101))  # larger than the whole bound alone: not kept, nothing evicted for it
    assert store.get("huge") is None and len(store) == 2
    assert store.delete("big") and not store.delete("big") and store.chars == 10


def test_output_items_and_events_of_reasoning_text_and_calls():
    # a reply with all three kinds, as the chat path's deltas give them (a server with
    # --reasoning-parser splits the reasoning off; plain_server has none)
    from treadle.runtime.server.responses_output import Output

    out = Output()
    for delta in ({"reasoning_content": "Let me"}, {"reasoning_content": " see."}, {"content": "Calling."},
                  {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                   "function": {"name": "f", "arguments": '{"x": 1}'}},
                                  {"index": 1, "id": "call_b", "type": "function",
                                   "function": {"name": "g", "arguments": "{}"}}]}):
        out.delta(delta)
    assert out.finish("tool_calls") == ("completed", None)
    assert [(i["type"], i["status"]) for i in out.items] == [("reasoning", "completed"), ("message", "completed"),
                                                            ("function_call", "completed"),
                                                            ("function_call", "completed")]
    assert out.items[0]["content"] == [{"type": "reasoning_text", "text": "Let me see."}]
    assert [(i["call_id"], i["name"], i["arguments"]) for i in out.items[2:]] == [("call_a", "f", '{"x": 1}'),
                                                                                ("call_b", "g", "{}")]
    kinds = [(e["type"], e.get("output_index")) for e in out.take()]
    assert kinds == [
        ("response.output_item.added", 0), ("response.content_part.added", 0), ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.delta", 0), ("response.reasoning_text.done", 0), ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.content_part.added", 1), ("response.output_text.delta", 1),
        ("response.output_text.done", 1), ("response.content_part.done", 1), ("response.output_item.done", 1),
        ("response.output_item.added", 2), ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2), ("response.output_item.done", 2),
        ("response.output_item.added", 3), ("response.function_call_arguments.delta", 3),
        ("response.function_call_arguments.done", 3), ("response.output_item.done", 3)]
    assert out.as_message() == {"role": "assistant", "content": "Calling.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}
    empty = Output()  # neither text nor calls: an empty message, so output_text is there to read
    assert empty.finish("stop") == ("completed", None) and empty.text_of() == "" and len(empty.items) == 1
