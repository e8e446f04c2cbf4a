"""SGLang's `FunctionCallParser` (`sglang.srt.function_call.function_call_parser`), which its
function-calling doc runs over an offline Engine's output:

    parser = FunctionCallParser(tools=tools, tool_call_parser="qwen25")
    normal_text, calls = parser.parse_non_stream(generated_text)
    for call in calls:                      # ToolCallItem: tool_index, name, parameters (JSON text)
        print(call.name, call.parameters)

`tools` are SGLang's `Tool(type="function", function=Function(name=..., description=...,
parameters=...))` (`sglang.srt.managers.io_struct` / `sglang.srt.entrypoints.openai.protocol`,
here under treadle.srt's same paths) or OpenAI tool dicts. The calls are read by treadle's own
tool-call parsing (runtime/server/tool_calls.py, what /v1/chat/completions answers with), in the
format of the named parser:

- "qwen25" (also "qwen"): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
  (Hermes / Qwen 2.5 / Qwen 3); the normal text is what comes before the first block, stripped.
- "llama3": `<|python_tag|>` and/or JSON objects `{"name": ..., "parameters": {...}}` separated by
  ";" (Llama 3.1 / 3.2); the normal text is what comes before `<|python_tag|>`.
- "mistral": `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`; the normal text is what
  comes before it, stripped.

As SGLang's, a call of a function not in `tools` is left out, and a reply without calls is
returned whole as the normal text. `parse_stream_chunk(delta)` takes the reply's text a piece at
a time and returns the normal text that is sure to be no call, and each call once its block is
complete (name and whole arguments in one ToolCallItem, where SGLang's streams the arguments in
pieces after the name: joined per `tool_index` they are the same). SGLang's other parsers
("deepseekv3", "pythonic", "kimi_k2", ...) are a ValueError naming the ones treadle has.
"""
from __future__ import annotations

import json
from typing import Any, List, Literal, Optional, Tuple

from pydantic import BaseModel, Field

from treadle.runtime.detokenizer import partial_suffix_len

# SGLang's parser names, those treadle reads and those it does not
_FORMATS = {"qwen25": "qwen25", "qwen": "qwen25", "llama3": "llama3", "mistral": "mistral"}
_SGLANG_ONLY = ("deepseekv3", "deepseekv31", "deepseekv32", "glm", "glm45", "gpt-oss", "kimi_k2", "pythonic",
                "qwen3_coder", "step3", "minimax-m2", "gigachat3")


class Function(BaseModel):
    """SGLang's Function of a tool (OpenAI's `function` object)."""
    description: Optional[str] = Field(default=None)
    name: Optional[str] = None
    parameters: Optional[object] = None
    strict: bool = False


class Tool(BaseModel):
    """SGLang's Tool: `{"type": "function", "function": Function}`."""
    type: Literal["function"] = "function"
    function: Function


class ToolCallItem(BaseModel):
    """One call the parser found: its tool's index in `tools`, the function's name, and its
    arguments as JSON text (as SGLang's `parameters`)."""
    tool_index: int
    name: Optional[str] = None
    parameters: str


class StreamingParseResult(BaseModel):
    normal_text: str = ""
    calls: List[ToolCallItem] = []


def _tool_dict(t: Any, i: int) -> dict:
    if isinstance(t, BaseModel):
        t = t.model_dump(exclude_none=True)
    elif not isinstance(t, dict) and hasattr(t, "function"):  # another Tool-like object
        fn = t.function
        t = {"type": getattr(t, "type", "function"),
             "function": {k: getattr(fn, k) for k in ("name", "description", "parameters", "strict")
                          if getattr(fn, k, None) is not None}}
    if not isinstance(t, dict):
        raise ValueError(f"tools[{i}] must be a Tool (or an OpenAI tool dict), got {type(t).__name__}")
    t = dict(t)
    t.setdefault("type", "function")
    if isinstance(t.get("function"), dict) and t["function"].get("strict") is False:
        t["function"] = {k: v for k, v in t["function"].items() if k != "strict"}
    return t


class FunctionCallParser:
    """SGLang's FunctionCallParser over treadle's tool-call parsing (see the module's doc)."""

    def __init__(self, tools: List[Any], tool_call_parser: str) -> None:
        from treadle.runtime.server.protocol import APIError
        from treadle.runtime.server.tool_calls import plan_tools

        fmt = _FORMATS.get(tool_call_parser)
        if fmt is None:
            if tool_call_parser in _SGLANG_ONLY:
                raise ValueError(f"Unsupported tool_call_parser: {tool_call_parser} (treadle reads "
                                 f"{', '.join(_FORMATS)})")
            raise ValueError(f"Unsupported tool_call_parser: {tool_call_parser}")
        if not isinstance(tools, (list, tuple)):
            raise ValueError(f"tools must be a list of Tool, got {type(tools).__name__}")
        self.tools = list(tools)
        self.tool_call_parser = tool_call_parser
        self._format = fmt
        try:
            plan = plan_tools({"tools": [_tool_dict(t, i) for i, t in enumerate(tools)]}) if tools else None
        except APIError as e:
            raise ValueError(e.message) from None
        self._plan = plan
        self._index = {t.name: i for i, t in enumerate(plan.tools)} if plan is not None else {}
        # parse_stream_chunk's state: the reply so far, the normal text and calls given out
        self._buffer = ""
        self._sent_text = 0
        self._sent_calls = 0

    # ------------------------------------------------------------------ one whole reply
    def has_tool_call(self, text: str) -> bool:
        """Whether `text` holds the start of a call in this format (SGLang's test)."""
        if self._format == "qwen25":
            return "<tool_call>" in text
        if self._format == "llama3":
            return "<|python_tag|>" in text or text.startswith("{")
        return "[TOOL_CALLS]" in text

    def parse_non_stream(self, full_text: str) -> Tuple[str, List[ToolCallItem]]:
        """(normal text, calls) of a whole reply; (the reply, []) when it calls nothing."""
        normal, calls, _ = self._parse(full_text)
        return (normal, calls) if calls else (full_text, [])

    def _item(self, call: Any) -> ToolCallItem:
        # SGLang's parameters: the arguments dumped with json's default separators
        args = json.dumps(json.loads(call.arguments), ensure_ascii=False)
        return ToolCallItem(tool_index=self._index[call.name], name=call.name, parameters=args)

    def _calls_of(self, text: str) -> list[ToolCallItem]:
        """The call in one JSON object's text, when it names a listed tool."""
        if self._plan is None:
            return []
        call = self._plan.call_of(text)
        return [] if call is None else [self._item(call)]

    def _parse(self, text: str) -> tuple[str, list[ToolCallItem], int | None]:
        """(normal text, complete calls, where the calls begin or None) of `text` so far."""
        if self._format == "qwen25":
            at = text.find("<tool_call>")
            if at < 0:
                return text, [], None
            from treadle.runtime.server.tool_calls import call_blocks

            # a block ends at the close tag outside the arguments' strings (tool_calls.call_blocks)
            calls = [c for b in call_blocks(text) if b.closed for c in self._calls_of(b.inner)]
            return text[:at].strip(), calls, at
        if self._format == "llama3":
            # a reply that opens with a JSON object is calls from its start: a <|python_tag|> in
            # one of their strings is no marker (it split the call there)
            if text.lstrip().startswith("{"):
                normal, body, start = "", text, 0
            elif "<|python_tag|>" in text:
                at = text.index("<|python_tag|>")
                normal, body, start = text[:at], text[at + len("<|python_tag|>"):], at
            else:
                return text, [], None
            return normal, self._objects(body), start
        at = text.find("[TOOL_CALLS]")
        if at < 0:
            return text, [], None
        body = text[at + len("[TOOL_CALLS]"):].lstrip()
        calls: list[ToolCallItem] = []
        try:
            items, _ = json.JSONDecoder().raw_decode(body)
        except ValueError:
            items = None
        if isinstance(items, dict):
            items = [items]
        for item in items if isinstance(items, list) else ():
            calls += self._calls_of(json.dumps(item))
        return text[:at].strip(), calls, at

    def _objects(self, body: str) -> list[ToolCallItem]:
        """Llama's calls: JSON objects one after another, separated by ";"."""
        dec, pos, calls = json.JSONDecoder(), 0, []
        while True:
            pos = len(body) - len(body[pos:].lstrip(" \t\r\n;"))
            if pos >= len(body):
                return calls
            try:
                obj, end = dec.raw_decode(body, pos)
            except ValueError:
                return calls  # not (yet) a whole object
            calls += self._calls_of(json.dumps(obj))
            pos = end

    # ------------------------------------------------------------------ a streamed reply
    def parse_stream_chunk(self, chunk_text: str) -> Tuple[str, List[ToolCallItem]]:
        """Feed the next piece of the reply: (the normal text now sure to be no call, the calls
        completed by it). Text that may still begin a call is held back until it is known."""
        self._buffer += chunk_text
        text = self._buffer
        normal, calls, start = self._parse(text)
        if start is None:  # no call begun: all is normal text but a tail that may begin one
            marker = {"qwen25": "<tool_call>", "llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}[self._format]
            end = len(text) - partial_suffix_len(text, marker)
            if self._format == "llama3" and not text.strip():
                end = 0  # the reply may still open with a JSON object
            new_text = text[self._sent_text:end]
            self._sent_text = max(self._sent_text, end)
        else:  # the normal text before the call (not yet given out)
            before = text[:start]
            new_text = before[self._sent_text:].rstrip() if self._sent_text < len(before) else ""
            self._sent_text = max(self._sent_text, len(before))
        new_calls = calls[self._sent_calls:]
        self._sent_calls = len(calls)
        return new_text, list(new_calls)
