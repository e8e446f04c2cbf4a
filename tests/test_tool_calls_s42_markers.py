"""A `</tool_call>` inside a call's JSON string arguments is part of them, not the block's end:
in the reply parser, its stream, the single-call stop string and SGLang's FunctionCallParser;
and a continue_final_message that ends inside an open `<tool_call>` block (its reply finishes
that call, or a 400 where the call would be constrained). Real server: the shared plain_server,
the reply forced by a regex so the embedded model writes exactly the case."""
from __future__ import annotations

import json

import openai
import pytest

from treadle.runtime.server.tool_calls import call_blocks, plan_tools
from treadle.srt.function_call.function_call_parser import FunctionCallParser

ECHO = {"type": "function", "function": {
    "name": "echo", "description": "Repeat a text",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
TEXT = 'a </tool_call> "b" \\ <tool_call> c'  # the close tag, quotes, a backslash and the open tag
ARGS = json.dumps({"text": TEXT})
CALL = '<tool_call>\n{"name": "echo", "arguments": ' + ARGS + '}\n</tool_call>'


def _regex_literal(text: str) -> str:
    return "".join("\\" + ch if ch in '\\.^$|?*+()[]{}' else "\\n" if ch == "\n" else ch for ch in text)


# ---------------------------------------------------------------- parsing, no server

def test_blocks_end_at_the_close_tag_outside_strings():
    text = "Sure. " + CALL + " Done."
    (b,) = call_blocks(text)
    assert (b.start, b.end, b.closed) == (6, 6 + len(CALL), True)
    assert json.loads(b.inner)["arguments"]["text"] == TEXT
    # unclosed: to the end
    assert [(x.inner, x.closed) for x in call_blocks('<tool_call>{"a": "</tool_call>')] == [('{"a": "</tool_call>', False)]


@pytest.mark.parametrize("parallel", [True, False])
def test_parse_and_stream_keep_the_arguments_whole(parallel):
    plan = plan_tools({"tools": [ECHO], "parallel_tool_calls": parallel})
    reply = plan.parse("Sure. " + CALL, "stop")
    assert reply.content == "Sure." and reply.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [("echo", {"text": TEXT})]
    stream, text, deltas = plan.streamer(), "", []
    for i in range(0, len("Sure. " + CALL), 7):
        text = ("Sure. " + CALL)[:i + 7]
        deltas.append(stream.feed(text))
    last, reason = stream.finish(text, "stop")
    content = "".join(d.get("content", "") for d in deltas + [last])
    assert content == "Sure." and reason == "tool_calls"
    assert [json.loads(c["function"]["arguments"]) for c in last["tool_calls"]] == [{"text": TEXT}]


def test_function_call_parser_keeps_the_arguments_whole():
    text = "Sure. " + CALL
    normal, calls = FunctionCallParser([ECHO], "qwen25").parse_non_stream(text)
    assert normal == "Sure." and [json.loads(c.parameters) for c in calls] == [{"text": TEXT}]
    parser, got = FunctionCallParser([ECHO], "qwen25"), []
    for i in range(0, len(text), 5):
        got += parser.parse_stream_chunk(text[i:i + 5])[1]
    assert [json.loads(c.parameters) for c in got] == [{"text": TEXT}]


def test_a_continued_open_call_is_read_with_the_reply():
    head = CALL[:CALL.index("</tool_call> ") + len("</tool_call>")]  # ends inside the string, with a close tag
    rest = CALL[len(head):] + "\nDone."
    plan = plan_tools({"tools": [ECHO]})
    assert plan.continuing("Sure. " + CALL) is plan  # a closed block: nothing to finish
    cont = plan.continuing("Sure. " + head)
    assert cont.open_call == head  # from the tag on
    reply = cont.parse(rest, "stop")
    assert reply.content == "\nDone." and reply.finish_reason == "tool_calls"
    assert [json.loads(c.arguments) for c in reply.calls] == [{"text": TEXT}]
    stream, deltas = cont.streamer(), []
    for i in range(0, len(rest), 5):
        deltas.append(stream.feed(rest[:i + 5]))
    last, reason = stream.finish(rest, "stop")
    assert "".join(d.get("content", "") for d in deltas + [last]) == "\nDone." and reason == "tool_calls"
    assert [json.loads(c["function"]["arguments"]) for c in last["tool_calls"]] == [{"text": TEXT}]
    assert cont.parse(" never mind", "stop").content == " never mind"  # no call made: the reply is content


# ---------------------------------------------------------------- over HTTP

@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="none", max_retries=0)


def _chat(client, messages, stream=False, **extra):
    kw = dict(model="default", messages=messages, tools=[ECHO], temperature=0, max_tokens=80)
    return client.chat.completions.create(**kw, stream=stream, **extra)


def _calls(client, messages, stream, **extra):
    """(content, calls, finish_reason) of one reply, unstreamed or from the stream's deltas."""
    if not stream:
        r = _chat(client, messages, **extra).choices[0]
        return (r.message.content, [(c.function.name, json.loads(c.function.arguments))
                                    for c in r.message.tool_calls or []], r.finish_reason)
    content, args, names, reason = "", {}, {}, None
    for chunk in _chat(client, messages, stream=True, **extra):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            # one call a chunk, as OpenAI and SGLang stream them: SGLang's function-calling doc
            # reads chunk.choices[0].delta.tool_calls[0] only
            assert len(ch.delta.tool_calls or [None]) == 1, ch.delta.tool_calls
            for tc in ch.delta.tool_calls or []:
                names.setdefault(tc.index, tc.function.name)
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
            reason = ch.finish_reason or reason
    return content or None, [(names[i], json.loads(args[i])) for i in sorted(args)], reason


USER = [{"role": "user", "content": f"Echo this text: {TEXT}"}]


def test_a_close_tag_in_the_arguments_is_part_of_the_call(client):
    # the single-call stop string was "</tool_call>": it ended the reply inside the string (with
    # parallel calls the parser cut the block there: the unit tests above)
    # (one request, unstreamed: the stream's reading of the same reply is the unit test's)
    extra = {"parallel_tool_calls": False, "extra_body": {"regex": _regex_literal(CALL)}}
    assert _calls(client, USER, False, **extra) == (None, [("echo", {"text": TEXT})], "tool_calls")


def test_continuing_a_message_that_opened_a_call_finishes_that_call(client):
    """... and a second call after it: parallel calls stream one a chunk."""
    head = CALL[:CALL.index("</tool_call> ") + len("</tool_call>")]  # ends inside the string, with a close tag
    second = '\n<tool_call>\n{"name": "echo", "arguments": {"text": "two"}}\n</tool_call>'
    messages = USER + [{"role": "assistant", "content": head}]
    extra = {"extra_body": {"continue_final_message": True, "add_generation_prompt": False,
                            "regex": _regex_literal(CALL[len(head):] + second)}}
    # (one request, streamed: the unstreamed reading of the same reply is the unit test's)
    want = (None, [("echo", {"text": TEXT}), ("echo", {"text": "two"})], "tool_calls")
    assert _calls(client, messages, True, **extra) == want


@pytest.mark.parametrize("tools, choice, words", [
    ([ECHO], "required", "tool_choice 'required' constrains the reply"),
    ([ECHO], {"type": "function", "function": {"name": "echo"}}, "tool_choice 'echo' constrains the reply"),
    ([{"type": "function", "function": {**ECHO["function"], "strict": True}}], "auto", "the strict tool 'echo'"),
])
def test_continuing_inside_a_call_that_would_be_constrained_is_a_400(client, tools, choice, words):
    messages = USER + [{"role": "assistant", "content": '<tool_call>\n{"name": "echo", "arguments": {"text": "'}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=messages, tools=tools, tool_choice=choice,
                                       max_tokens=8, extra_body={"continue_final_message": True,
                                                                 "add_generation_prompt": False})
    err = e.value.body
    assert err["param"] == "continue_final_message" and words in err["message"], err


def test_a_single_call_closed_on_its_line_ends_the_reply_for_finish_reason():
    """Without parallel calls the stop string is "\\n</tool_call>"; a model that closes a call on
    the same line ("}</tool_call>") is not stopped and writes on until max_tokens: its first call
    is still the reply's one call, and finish_reason "tool_calls", not "length"."""
    plan = plan_tools({"tools": [ECHO], "parallel_tool_calls": False})
    text = '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call> and then I went on and on'
    reply = plan.parse(text, "length")
    assert reply.content is None and reply.finish_reason == "tool_calls" and len(reply.calls) == 1
    cut = plan.parse('<tool_call>{"name": "echo", "arguments": {"text": "x"}}', "length")  # not closed: cut
    assert cut.finish_reason == "length"
    parallel = plan_tools({"tools": [ECHO]}).parse(text, "length")  # more calls may have followed
    assert parallel.finish_reason == "length" and parallel.content == " and then I went on and on"


@pytest.mark.parametrize("fmt, marker", [("llama3", "<|python_tag|>"), ("mistral", "[TOOL_CALLS]")])
def test_other_formats_keep_their_marker_inside_arguments(fmt, marker):
    """FunctionCallParser's llama3 and mistral formats: their marker inside an argument string is
    text (llama3 split a reply that opens with a call at a <|python_tag|> in its string)."""
    args = {"text": f"a {marker} b; c"}
    call = json.dumps({"name": "echo", "parameters" if fmt == "llama3" else "arguments": args})
    text = call if fmt == "llama3" else f"[TOOL_CALLS] [{call}]"
    normal, calls = FunctionCallParser([ECHO], fmt).parse_non_stream(text)
    assert normal == "" and [json.loads(c.parameters) for c in calls] == [args]
    parser, got = FunctionCallParser([ECHO], fmt), []
    for i in range(0, len(text), 4):
        new_text, new_calls = parser.parse_stream_chunk(text[i:i + 4])
        assert new_text == ""
        got += new_calls
    assert [json.loads(c.parameters) for c in got] == [args]
