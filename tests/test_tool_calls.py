"""OpenAI function calling, the parts without a server: validating `tools` / `tool_choice`,
the constraint a choice sets, parsing replies, streaming deltas, and rendering tool
conversations for templates with and without tool support (the server tests in
test_server_openai.py run it end to end)."""
from __future__ import annotations

import copy
import json
import re

import jsonschema
import pytest

from treadle.runtime.server.protocol import APIError
from treadle.runtime.server.tool_calls import ToolPlan, plan_tools, render_messages, template_knows_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: no arguments


def plan(choice=None, parallel=True, tools=(WEATHER, TIME)) -> ToolPlan:
    body = {"tools": list(tools), "parallel_tool_calls": parallel}
    if choice is not None:
        body["tool_choice"] = choice
    p = plan_tools(body)
    assert p is not None
    return p


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize("body, param, words", [
    ({"tools": "get_weather"}, "tools", "must be a list"),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0] must be"),
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools", "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "a second function named 'get_weather'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools", "parameters"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'nope', which is not in tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs a non-empty tools list"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "must be a boolean"),
])
def test_bad_tools_are_400s_naming_the_field(body, param, words):
    with pytest.raises(APIError) as e:
        plan_tools(body)
    assert e.value.status == 400 and e.value.param == param and words in e.value.message


def test_choices_plan():
    assert plan_tools({}) is None and plan_tools({"tools": [], "tool_choice": "none"}) is None
    assert plan_tools({"tools": [WEATHER], "tool_choice": "none"}) is None  # tools ignored
    assert plan().choice == "auto" and plan("auto").choice == "auto" and plan("required").choice == "required"
    named = plan({"type": "function", "function": {"name": "get_time"}})
    assert (named.choice, named.named) == ("named", "get_time")


# ---------------------------------------------------------------- the constraint

def test_named_choice_constrains_to_the_functions_arguments():
    over = plan({"type": "function", "function": {"name": "get_weather"}}).sampling_overrides(None)
    assert json.loads(over["json_schema"]) == WEATHER["function"]["parameters"]
    over = plan({"type": "function", "function": {"name": "get_time"}}).sampling_overrides(None)
    assert json.loads(over["json_schema"]) == {"type": "object", "properties": {}, "additionalProperties": False}


@pytest.mark.parametrize("mode, parameters", [("strict", None), ("spec", None),
                                              ("strict", {"type": "object", "properties": {}})])
def test_a_function_without_parameters_is_called_with_empty_arguments(mode, parameters):
    """OpenAI: an omitted `parameters` is an empty parameter list, so the arguments are `{}`
    (they used to be any JSON object, and the model nested `{"type": {"type": ...` on). An
    explicit `"properties": {}` means the same in the default strict mode."""
    from treadle.constrained.compile.grammar import GrammarSpec
    fn = {"name": "ping"} if parameters is None else {"name": "ping", "parameters": parameters}
    tools = ({"type": "function", "function": fn}, WEATHER)
    for choice, empty, other in [
            ({"type": "function", "function": {"name": "ping"}}, "{}", '{"type":"function"}'),
            ("required", '[{"name":"ping","arguments":{}}]', '[{"name":"ping","arguments":{"a":1}}]')]:
        text = plan(choice, tools=tools).sampling_overrides(None)["json_schema"]
        regex = GrammarSpec("json_schema", text).to_regex(json_schema_mode=mode)
        assert re.fullmatch(regex, empty) and not re.fullmatch(regex, other), choice


@pytest.mark.parametrize("parallel", [True, False])
def test_required_choice_schema_admits_exactly_calls_of_listed_tools(parallel):
    schema = json.loads(plan("required", parallel).sampling_overrides(None)["json_schema"])
    ok = [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    two = ok + [{"name": "get_time", "arguments": {}}]
    jsonschema.validate(ok, schema)
    for bad in ([], [{"name": "get_weather", "arguments": {}}], [{"name": "other", "arguments": {}}],
                [{"name": "get_time"}], {"name": "get_time", "arguments": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    if parallel:
        jsonschema.validate(two, schema)
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(two, schema)


# A Pydantic model's schema: nested models are "#/$defs/..." refs, a recursive one may be "#"
ORDER = {"type": "function", "function": {"name": "place_order", "parameters": {
    "type": "object", "properties": {"ship_to": {"$ref": "#/$defs/Address"},
                                     "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
    "required": ["ship_to", "items"],
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
              "Item": {"type": "object", "properties": {"sku": {"type": "string"},
                                                        "parts": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
                       "required": ["sku"]}}}}}
TREE = {"type": "function", "function": {"name": "make_tree", "parameters": {
    "type": "object", "properties": {"label": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["label"]}}}


@pytest.mark.parametrize("tools", [(ORDER,), (ORDER, TREE, WEATHER)])
def test_required_choice_keeps_the_tools_own_refs(tools):
    """Each tool's local refs still resolve inside the combined schema (they used to point at
    its root, which has no such $defs: 'cannot resolve'), and its regex admits real calls."""
    from treadle.constrained.compile.grammar import GrammarSpec
    from treadle.constrained.schema.json_schema import json_schema_to_regex
    text = plan("required", tools=tools).sampling_overrides(None)["json_schema"]
    schema = json.loads(text)
    order = {"name": "place_order", "arguments": {"ship_to": {"city": "Oslo"},
                                                  "items": [{"sku": "a", "parts": [{"sku": "b"}]}]}}
    tree = {"name": "make_tree", "arguments": {"label": "r", "kids": [{"label": "k", "kids": [{"label": "g"}]}]}}
    good = [order] + ([tree] if TREE in tools else [])
    jsonschema.validate(good, schema)
    bad_order = copy.deepcopy(order)
    bad_order["arguments"]["items"][0]["parts"] = [{"no_sku": 1}]  # the nested Item's own `required`
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([bad_order], schema)
    assert GrammarSpec("json_schema", text).to_regex(holes=True)  # recursive refs as calls
    regex = json_schema_to_regex(text)  # unrolled 3 levels
    assert re.fullmatch(regex, json.dumps(good, separators=(",", ":")))
    assert not re.fullmatch(regex, json.dumps([bad_order], separators=(",", ":")))


def test_auto_choice_sets_no_constraint_and_one_call_when_not_parallel():
    assert plan("auto").sampling_overrides(["\n\n"]) == {}
    assert plan("auto", parallel=False).sampling_overrides("END") == {"stop": ["END", "\n</tool_call>"]}
    assert plan("auto", parallel=False).sampling_overrides(None) == {"stop": ["\n</tool_call>"]}


def test_auto_choice_with_a_strict_tool_constrains_the_calls_only():
    """A `strict` tool makes "auto" a structural tag: text stays free, a <tool_call> block the
    model opens must name a listed tool, laid out as the prompt shows, with valid arguments
    (a non-strict tool's: any JSON object). Parsed back by the usual "auto" parser."""
    from treadle.constrained.compile.grammar import GrammarSpec

    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    p = plan("auto", parallel=False, tools=(strict, TIME))
    over = p.sampling_overrides(None)
    assert over["stop"] == ["\n</tool_call>"]
    regex = re.compile(GrammarSpec.from_params(structural_tag=over["structural_tag"]).to_regex())
    good = ('Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo"}}\n</tool_call>'
            '<tool_call>\n{"name": "get_time", "arguments": {"tz":"UTC","any":[1]}}\n</tool_call>')
    assert regex.fullmatch(good) and regex.fullmatch("No tools needed.")
    assert calls_of(plan("auto", tools=(strict, TIME)).parse(good, "stop")) == [("get_weather", {"city": "Oslo"}),
                                                                            ("get_time", {"tz": "UTC", "any": [1]})]
    assert calls_of(p.parse(good, "stop")) == [("get_weather", {"city": "Oslo"})]  # not parallel: the first call
    for bad in ('<tool_call>\n{"name": "get_weather", "arguments": {"town":"Oslo"}}\n</tool_call>',
                '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>',
                '<tool_call>\n{"name": "get_time", "arguments": [1]}\n</tool_call>'):
        assert not regex.fullmatch(bad), bad
    assert "structural_tag" not in plan("auto").sampling_overrides(None)  # no strict tool: free as before
    with pytest.raises(APIError, match="strict must be a boolean"):
        plan_tools({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]})


# ---------------------------------------------------------------- parsing replies

def calls_of(reply):
    return [(c.name, json.loads(c.arguments)) for c in reply.calls]


def test_parse_named_and_required():
    r = plan({"type": "function", "function": {"name": "get_weather"}}).parse('{"city": "Rome"}', "stop")
    assert r.content is None and calls_of(r) == [("get_weather", {"city": "Rome"})] and r.finish_reason == "stop"
    r = plan("required").parse('[{"name": "get_time", "arguments": {}}, '
                               '{"name": "get_weather", "arguments": {"city": "Rome"}}]', "stop")
    assert calls_of(r) == [("get_time", {}), ("get_weather", {"city": "Rome"})] and r.finish_reason == "tool_calls"
    # max_tokens cut it: the calls so far, the last with its arguments as far as they got, and
    # never the wrapper array as content (as a named call cut short, and OpenAI's)
    cut = plan("required").parse('[{"name": "get_wea', "length")
    assert (cut.content, cut.calls, cut.finish_reason) == (None, (), "length")
    cut = plan("required").parse('[{"name":"get_time","arguments":{}}, {"name":"get_weather","arguments":{"ci',
                                 "length")
    assert cut.content is None and cut.finish_reason == "length"
    assert [(c.name, c.arguments) for c in cut.calls] == [("get_time", "{}"), ("get_weather", '{"ci')]
    # arguments come out compact whichever way tool_choice went (named calls are as generated)
    assert r.calls[1].arguments == '{"city":"Rome"}'


def test_parse_auto_hermes_blocks_and_text_around_them():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>')
    r = plan().parse(text, "stop")
    assert calls_of(r) == [("get_weather", {"city": "Oslo"}), ("get_time", {})]
    assert r.content == "Let me check." and r.finish_reason == "tool_calls"
    # an unknown function or broken JSON is not a call: the reply stays text
    for text in ('<tool_call>{"name": "launch", "arguments": {}}</tool_call>', "<tool_call>{not json</tool_call>",
                 "It is sunny.", '{"name": "get_weather"', '{"name": "get_weather", "arguments": [1]}'):
        r = plan().parse(text, "stop")
        assert (r.content, r.calls, r.finish_reason) == (text, (), "stop")
    # a reply that is one call object (Llama's format, "parameters")
    r = plan().parse(' {"name": "get_weather", "parameters": {"city": "Lima"}}', "stop")
    assert calls_of(r) == [("get_weather", {"city": "Lima"})] and r.content is None
    # the closing tag trimmed as a stop string (parallel_tool_calls false)
    r = plan("auto", parallel=False).parse('<tool_call>\n{"name": "get_time", "arguments": {}}\n', "stop")
    assert calls_of(r) == [("get_time", {})]
    # cut by max_tokens inside a call: finish_reason stays "length"
    assert plan().parse('<tool_call>{"name": "get_ti', "length").finish_reason == "length"


# ---------------------------------------------------------------- streaming

def stream(p: ToolPlan, pieces: list[str], finish: str = "stop"):
    ts, text, deltas = p.streamer(), "", []
    for piece in pieces:
        text += piece
        deltas.append(ts.feed(text))
    last, reason = ts.finish(text, finish)
    return deltas + [last], reason


def test_stream_named_sends_the_call_then_argument_pieces():
    deltas, reason = stream(plan({"type": "function", "function": {"name": "get_weather"}}),
                            ['{"ci', 'ty": ', '"Oslo"}'])
    first = deltas[0]["tool_calls"][0]
    assert first["index"] == 0 and first["function"]["name"] == "get_weather" and first["id"].startswith("call_")
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if d)
    assert json.loads(args) == {"city": "Oslo"} and reason == "stop"


def test_stream_auto_holds_back_a_possible_tool_call_start():
    p = plan()
    deltas, reason = stream(p, ["Hello <to", "ol_c", "all>", '{"name": "get_time", "arguments": {}}', "</tool_call>"])
    content = "".join(d.get("content", "") for d in deltas)
    assert deltas[0] == {"content": "Hello"} and deltas[1] == {} and content == "Hello"
    assert [c["function"]["name"] for c in deltas[-1]["tool_calls"]] == ["get_time"] and reason == "tool_calls"
    # "<to" that turns out to be text is sent once it cannot begin a call
    deltas, reason = stream(p, ["a <to", "p> b"])
    assert "".join(d.get("content", "") for d in deltas) == "a <top> b" and reason == "stop"
    assert not any("tool_calls" in d for d in deltas)


@pytest.mark.parametrize("text", [
    ' {"name": "get_weather", "parameters": {"city": "Lima"}}',  # Llama format: no content at all
    '{"answer": 42}',  # a JSON reply that is no call: content, sent at the end
    '{"name": "get_weather"',  # cut short
    'Sure. \n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\nDone.  ',
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
    "  Plain text, then spaces  ",
    '  Sure. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>',  # leading spaces, then a call
    '\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
    "a <top> b { c",
])
def test_stream_auto_adds_up_to_the_unstreamed_reply(text):
    p = plan()
    want = p.parse(text, "stop")
    for size in (1, 2, 5):
        deltas, reason = stream(p, [text[i:i + size] for i in range(0, len(text), size)])
        content = "".join(d.get("content", "") for d in deltas) or None
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for d in deltas for c in d.get("tool_calls", [])]
        assert (content, calls, reason) == (want.content, calls_of(want), want.finish_reason), size


def test_stream_required_sends_each_call_as_its_item_closes():
    deltas, reason = stream(plan("required"), ['[{"name": "get_time", ', '"arguments": {}}', ', {"name": "get_ti',
                                               'me", "arguments": {}}]'])
    assert deltas[0] == {} and deltas[2] == {} and deltas[4] == {} and reason == "tool_calls"
    assert [(c["index"], c["function"]["name"]) for d in (deltas[1], deltas[3]) for c in d["tool_calls"]] == [
        (0, "get_time"), (1, "get_time")]


@pytest.mark.parametrize("text", ['[{"name":"get_weather","arguments', '[{"name": "get_wea', "", '[{"name":"get_time",',
                                  '[{"name":"get_time","arguments":{}}, {"name":"get_weather","arguments":{"ci'])
def test_stream_required_cut_short_adds_up_to_the_unstreamed_reply(text):
    """max_tokens cut a required call: the stream sends what the unstreamed reply has (the
    calls so far), never the wrapper array as content (it sent the cut JSON as content)."""
    p = plan("required")
    want = p.parse(text, "length")
    deltas, reason = stream(p, [text[i:i + 3] for i in range(0, len(text), 3)], "length")
    assert not any("content" in d for d in deltas) and want.content is None
    calls = [(c["function"]["name"], c["function"]["arguments"]) for d in deltas for c in d.get("tool_calls", [])]
    assert calls == [(c.name, c.arguments) for c in want.calls] and reason == "length"
    # a call whose name is whole is listed, with its arguments as far as they got (none yet
    # when the cut came right after the name: it was dropped)
    if '"name":"get_' in text:
        assert want.calls and want.calls[-1].name in ("get_weather", "get_time"), want


# ---------------------------------------------------------------- prompts

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo and the time?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "4 C"},
    {"role": "tool", "tool_call_id": "c2", "content": "09:00"},
]


def test_render_for_a_template_without_tools():
    out = render_messages(copy.deepcopy(CONVERSATION), plan(), native=False)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n") and '"name": "get_weather"' in out[0]["content"]
    assert out[2]["content"].count("<tool_call>") == 2 and '"arguments": {"city": "Oslo"}' in out[2]["content"]
    assert out[3]["content"] == "<tool_response>\n4 C\n</tool_response>\n<tool_response>\n09:00\n</tool_response>"
    # without tools in the request (tool_choice "none"), the history is still rendered, with no tool list
    out = render_messages(copy.deepcopy(CONVERSATION), None, native=False)
    assert out[0] == {"role": "system", "content": "Be brief."} and len(out) == 4


# A minimal template in the style of models that take tools (Qwen / Llama 3.1): `tools` listed
# in the system turn, assistant tool_calls rendered from their arguments mapping.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_render_for_a_template_with_tools(smollm2_tokenizer):
    from treadle.runtime.tokenizer import apply_chat_template

    tok = copy.copy(smollm2_tokenizer)
    tok.chat_template = TOOLS_TEMPLATE
    assert template_knows_tools(TOOLS_TEMPLATE) and not template_knows_tools(smollm2_tokenizer.chat_template)
    p = plan()
    msgs = render_messages(copy.deepcopy(CONVERSATION), p, native=True)
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}  # a mapping for `| tojson`
    assert msgs[3] == {"role": "tool", "content": "4 C", "tool_call_id": "c1"}
    text = apply_chat_template(tok, msgs, tools=[t.spec for t in p.tools])
    assert text.startswith("<|im_start|>system\nget_weather;get_time;<|im_end|>")
    assert 'CALL get_weather {"city": "Oslo"}' in text and text.endswith("<|im_start|>assistant\n")
