"""SGLang's FunctionCallParser (sglang.srt.function_call.function_call_parser) and ServerArgs
(sglang.srt.server_args), as SGLang's function-calling doc and offline-engine examples use them,
over the embedded model: both were missing (ImportError)."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

import treadle as sgl

TOOLS = [{"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city to find the weather for"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}]


def _sglang_tools():
    """The doc's convert_dict_to_tool, unchanged."""
    from treadle.srt.managers.io_struct import Function, Tool

    def convert_dict_to_tool(tool_dict: dict) -> Tool:
        function_dict = tool_dict.get("function", {})
        return Tool(
            type=tool_dict.get("type", "function"),
            function=Function(
                name=function_dict.get("name"),
                description=function_dict.get("description"),
                parameters=function_dict.get("parameters"),
            ),
        )

    return [convert_dict_to_tool(raw_tool) for raw_tool in TOOLS]


def test_the_function_calling_docs_offline_engine_section():
    from treadle.srt.function_call.function_call_parser import FunctionCallParser

    llm = sgl.Engine(max_total_tokens=4096)
    try:
        messages = [{"role": "user", "content": "What's the weather like in Boston today? Use celsius."}]
        prompt = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=TOOLS)
        # the embedded SmolLM2 knows no tool format: the reply is held to a Qwen 2.5 call
        sampling_params = {
            "max_new_tokens": 80, "temperature": 0, "top_p": 0.95, "skip_special_tokens": False,
            "regex": r'I will check\.\n<tool_call>\n\{"name": "get_current_weather", "arguments": '
                     r'\{"city": "(Boston|Paris)", "unit": "celsius"\}\}\n</tool_call>'}
        result = llm.generate(prompt, sampling_params=sampling_params)
        generated_text = result["text"]

        tools = _sglang_tools()
        parser = FunctionCallParser(tools=tools, tool_call_parser="qwen25")
        assert parser.has_tool_call(generated_text)
        normal_text, calls = parser.parse_non_stream(generated_text)
        assert normal_text == "I will check."
        assert len(calls) == 1 and calls[0].name == "get_current_weather" and calls[0].tool_index == 0
        assert json.loads(calls[0].parameters)["unit"] == "celsius"
        assert calls[0].parameters == json.dumps(json.loads(calls[0].parameters))  # SGLang's spacing

        # streamed: the normal text, then the call once its block is complete
        stream_parser = FunctionCallParser(tools=tools, tool_call_parser="qwen25")
        texts, streamed, so_far = [], [], ""
        for chunk in llm.generate(prompt, sampling_params=sampling_params, stream=True):
            normal, new_calls = stream_parser.parse_stream_chunk(chunk["text"][len(so_far):])
            so_far = chunk["text"]
            texts.append(normal)
            streamed += new_calls
        assert "".join(texts).strip() == "I will check."
        assert [(c.name, c.parameters) for c in streamed] == [(c.name, c.parameters) for c in calls]
    finally:
        llm.shutdown()


def test_parser_formats_and_errors():
    from treadle.srt.function_call.core_types import ToolCallItem
    from treadle.srt.function_call.function_call_parser import FunctionCallParser

    tools = _sglang_tools()
    qwen = FunctionCallParser(tools, "qwen25")
    text = ('Sure.\n<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>')
    normal, calls = qwen.parse_non_stream(text)
    assert normal == "Sure." and calls == [ToolCallItem(tool_index=0, name="get_current_weather",
                                                        parameters='{"city": "Paris", "unit": "celsius"}')]
    assert qwen.parse_non_stream("Just text.") == ("Just text.", []) and not qwen.has_tool_call("Just text.")

    llama = FunctionCallParser(TOOLS, "llama3")  # OpenAI tool dicts are taken too
    two = ('<|python_tag|>{"name": "get_current_weather", "parameters": {"city": "Oslo", "unit": "celsius"}};'
           '{"name": "get_current_weather", "parameters": {"city": "Rome", "unit": "celsius"}}')
    normal, calls = llama.parse_non_stream(two)
    assert normal == "" and [json.loads(c.parameters)["city"] for c in calls] == ["Oslo", "Rome"]
    assert llama.has_tool_call('{"name": "x"}')

    mistral = FunctionCallParser(tools, "mistral")
    normal, calls = mistral.parse_non_stream(
        'Ok [TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"city": "Lima", "unit": "celsius"}}]')
    assert normal == "Ok" and json.loads(calls[0].parameters)["city"] == "Lima"

    # streamed a few characters at a time: the text before the block, never a piece of "<tool_call>"
    stream = FunctionCallParser(tools, "qwen25")
    out_text, out_calls = "", []
    for i in range(0, len(text), 3):
        t, c = stream.parse_stream_chunk(text[i:i + 3])
        assert "<" not in t
        out_text, out_calls = out_text + t, out_calls + c
    assert out_text.strip() == "Sure." and [c.name for c in out_calls] == ["get_current_weather"]

    from treadle.srt.function_call_parser import FunctionCallParser as older_path  # older SGLang's module

    assert older_path is FunctionCallParser
    with pytest.raises(ValueError, match="Unsupported tool_call_parser: no_such"):
        FunctionCallParser(tools, "no_such")
    with pytest.raises(ValueError, match="Unsupported tool_call_parser: pythonic.*qwen25"):
        FunctionCallParser(tools, "pythonic")
    with pytest.raises(ValueError, match="name"):
        FunctionCallParser([{"type": "function", "function": {"name": "bad name!"}}], "qwen25")


def test_server_args_as_sglangs_offline_examples_use_them(monkeypatch):
    """examples/runtime/engine/offline_batch_inference.py: ServerArgs.add_cli_args(parser),
    ServerArgs.from_cli_args(args), sgl.Engine(**dataclasses.asdict(server_args))."""
    from treadle.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parser.add_argument("--num-prompts", type=int, default=2)  # a script's own flag
    args = parser.parse_args(["--model-path", "HuggingFaceTB/SmolLM2-135M-Instruct", "--tp", "1",
                              "--random-seed", "7", "--max-total-tokens", "4096", "--disable-cuda-graph"])
    server_args = ServerArgs.from_cli_args(args)
    assert (server_args.seed, server_args.tp_size, server_args.cuda_graph) == (7, 1, False)
    assert server_args.url() == "http://127.0.0.1:30000" and sgl.ServerArgs is ServerArgs

    prompts = ["Hello, my name is", "The capital of France is"]
    sampling_params = {"temperature": 0, "max_new_tokens": 8}
    llm = sgl.Engine(**dataclasses.asdict(server_args))
    try:
        outputs = llm.generate(prompts, sampling_params)
        assert len(outputs) == 2 and all(o["text"] for o in outputs)
        assert llm.args.seed == 7 and llm.args.max_total_tokens == 4096
    finally:
        llm.shutdown()

    assert ServerArgs(model_path="x", random_seed=3).seed == 3
    with pytest.raises(ValueError, match="dp_size"):
        ServerArgs(model_path="x", dp_size=2)
    with pytest.raises(ValueError, match="no_such_arg"):
        ServerArgs(model_path="x", no_such_arg=1)
