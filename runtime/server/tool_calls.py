"""OpenAI function calling on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls`.

A request with tools runs like any chat request; what changes:
- **the prompt.** A chat template that knows tools (its text mentions `tools`, as Llama 3.1+,
  Qwen 2.5/3 and Mistral templates do) gets them, and the conversation's earlier tool calls
  and results, as the template expects. Any other template (the embedded SmolLM2's) gets a
  system message listing the tools and the `<tool_call>` reply format, earlier calls as
  `<tool_call>` text and results as `<tool_response>` user turns.
- **the output.** `tool_choice: "required"` constrains decoding to a JSON array of
  `{"name", "arguments"}` objects, each valid under its tool's `parameters` schema;
  naming a function constrains it to that function's arguments object. Both are parsed back
  into `tool_calls` and cannot fail to parse unless cut by `max_tokens`. `"auto"` (the
  default with tools) leaves the model free and parses `<tool_call>{...}</tool_call>` blocks
  (Hermes / Qwen format) or a reply that is a single `{"name", "arguments"|"parameters"}`
  object (Llama format) naming a listed tool; text outside the calls stays `content`. When a
  tool is `strict` (OpenAI's `function.strict`), "auto" constrains the `<tool_call>` blocks
  with a structural tag: a block the model opens names a listed tool and holds arguments
  valid under a strict tool's schema (any JSON object for the others); the text stays free.
  `"none"` ignores the tools entirely (they are not rendered either).
- **finish_reason** is "tool_calls" when the reply calls tools (auto / required), "stop" for
  a named function (as OpenAI does), "length" when `max_tokens` cut it.

Streaming: a named function's arguments stream as they are decoded; a "required" reply's
calls each come whole once its array item closes, the last one (cut by max_tokens or not)
when the reply ends (one chunk a call, openai_api.render_chunk); "auto" streams content and holds back anything that may
begin a `<tool_call>` block, whose calls are sent when the reply ends, and a reply that
starts as a JSON object (a Llama-format call, or content sent at the end); the deltas add up
to the reply the same request gets unstreamed.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any

from treadle.constrained.schema.json_schema import embedded_defs
from treadle.runtime.detokenizer import partial_suffix_len
from treadle.runtime.server.protocol import PIECEWISE_PARSE_BYTES, APIError, json_pieces, loads_in_pieces, quoted

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")  # \Z: "$" admits a trailing newline
MAX_TOOLS = 1024  # functions in a request's tools (OpenAI takes 128)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
# the stop string that ends a reply at its first call (parallel_tool_calls false): the close tag
# on a line of its own, as the prompt and the structural tag write it. A JSON string cannot hold
# a raw newline, so this never fires inside a call's arguments, as "</tool_call>" alone did
# ({"text": "a </tool_call> b"} stopped there, and the reply was a broken call given as content)
STOP = "\n" + CLOSE
# an omitted `parameters` means a function without arguments (OpenAI's definition)
NO_PARAMETERS: dict = {"type": "object", "properties": {}, "additionalProperties": False}  # `{}` in any mode
# outside a JSON string: a quote opens one, or the close tag ends the block; inside: an escape
# (\" or \\ among them) is skipped whole, a quote closes it
_OUTSIDE_RE = re.compile('"|' + re.escape(CLOSE))
_INSIDE_RE = re.compile(r'\\.|"', re.S)


@dataclass(frozen=True)
class Block:
    """A `<tool_call>` block of a reply: text[start:end], `inner` between the tags."""
    start: int
    end: int
    inner: str
    closed: bool  # its close tag is there (else it runs to the end of the text)


def call_blocks(text: str) -> list[Block]:
    """The `<tool_call>` blocks of `text`, in order. A block ends at the first `</tool_call>`
    outside a JSON string: one inside a string of the arguments ({"text": "a </tool_call> b"},
    escaped quotes respected) is part of them; a block never closed runs to the end."""
    blocks, pos = [], 0
    while (start := text.find(OPEN, pos)) >= 0:
        at, inside, end = start + len(OPEN), False, None
        while end is None:
            m = (_INSIDE_RE if inside else _OUTSIDE_RE).search(text, at)
            if m is None:
                break
            if m.group() == '"':
                inside = not inside
            elif not inside:  # the close tag
                end = m.start()
            at = m.end()
        body = start + len(OPEN)
        if end is None:
            blocks.append(Block(start, len(text), text[body:], False))
            break
        blocks.append(Block(start, end + len(CLOSE), text[body:end], True))
        pos = end + len(CLOSE)
    return blocks


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict  # JSON schema of the arguments object
    spec: dict  # the client's {"type": "function", "function": {...}}, for templates
    strict: bool = False  # function.strict: its calls must follow `parameters`, under "auto" too


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it

    def as_openai(self, index: int | None = None) -> dict:
        d: dict[str, Any] = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                             "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


@dataclass(frozen=True)
class Reply:
    content: str | None
    calls: tuple[ToolCall, ...]
    finish_reason: str | None


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request's tools mean for its prompt, its decoding and its reply."""
    tools: tuple[Tool, ...]
    choice: str  # "auto" | "required" | "named"
    named: str | None  # the function a "named" choice forces
    parallel: bool
    # OpenAI's legacy `functions` / `function_call` (plan_tools): the reply's call comes as
    # message.function_call (one, never several) and finish_reason "function_call"
    legacy: bool = False
    # continue_final_message: the `<tool_call>` block the continued message left open (its text
    # from the tag on), which the reply finishes (`continuing`)
    open_call: str = ""

    def continuing(self, message: str | None) -> "ToolPlan":
        """This plan for a reply that continues `message` (continue_final_message; None: a
        reply of its own). A message that ends inside a `<tool_call>` block has its reply read
        as the rest of that block: the call it completes is a call (it was content, the block's
        head being in the prompt). Where the call would be constrained (a `required` or named
        tool_choice, whose grammar writes a whole reply from its start, or a strict tool, whose
        structural tag begins at the tag) the block cannot be, from its middle: APIError(400)."""
        blocks = call_blocks(message or "")
        if not blocks or blocks[-1].closed:
            return self
        if self.choice != "auto":
            what = "a JSON array of calls" if self.choice == "required" else "the function's arguments"
            raise APIError.bad_request(
                f"continue_final_message: the last message ends inside a {OPEN} block, and tool_choice "
                f"{quoted(self.choice if self.choice == 'required' else self.named)} constrains the reply to "
                f"{what} from its start; end the message before {OPEN}, or send tool_choice \"auto\"",
                "continue_final_message")
        strict = [t.name for t in self.tools if t.strict]
        if strict:
            raise APIError.bad_request(
                f"continue_final_message: the last message ends inside a {OPEN} block, and the strict tool "
                f"{quoted(strict[0])}'s arguments are constrained only from the block's start; end the message "
                f"before {OPEN}", "continue_final_message")
        return replace(self, open_call=message[blocks[-1].start:])

    # ------------------------------------------------------------------ decoding
    def sampling_overrides(self, stop: Any) -> dict:
        """Sampling params this plan sets (`stop` is the request's own, kept)."""
        if self.choice == "named":
            return {"json_schema": json.dumps(self._tool(self.named).parameters)}
        if self.choice == "required":
            # each tool's parameters sit under $defs, their own refs rebased there (a Pydantic
            # model's nested models are "#/$defs/..." refs of the parameters schema)
            defs = embedded_defs({f"tool_{i}": t.parameters for i, t in enumerate(self.tools)})
            calls = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": {"$ref": f"#/$defs/{k}"}},
                      "required": ["name", "arguments"]} for k, t in zip(defs, self.tools)]
            # oneOf: a call is of exactly one tool (their names differ), and a tool whose
            # parameters cannot be written is refused by name, never left out as an anyOf
            # branch would be in the default mode
            schema: dict = {"type": "array", "minItems": 1,
                            "items": calls[0] if len(calls) == 1 else {"oneOf": calls}, "$defs": defs}
            if not self.parallel:
                schema["maxItems"] = 1
            return {"json_schema": json.dumps(schema)}
        over: dict = {}
        if any(t.strict for t in self.tools):  # auto: calls are constrained, the text around them free
            over["structural_tag"] = json.dumps(self.structural_tag(), ensure_ascii=False)
        if not self.parallel:  # auto: end the reply with its first call
            stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
            over["stop"] = stops if STOP in stops else [*stops, STOP]
        return over

    def structural_tag(self) -> dict:
        """The reply under "auto" as a structural tag (constrained/ebnf/structural_tag.py): free
        text, and each `<tool_call>` block a call of a listed tool laid out as the prompt shows
        it, with arguments valid under its `parameters` (a strict tool's) or any JSON object."""
        return {"structures": [{"begin": f'{OPEN}\n{{"name": {json.dumps(t.name)}, "arguments": ',
                                "schema": t.parameters if t.strict else {"type": "object"},
                                "end": f"}}\n{CLOSE}"} for t in self.tools],
                "triggers": [OPEN]}

    def checked_tools(self, structural_tag: str | None) -> list[int]:
        """The tools whose parameters are compiled on their own before the request runs
        (openai_api), so that one whose parameters do not compile or accept no value is a 400
        naming it: under "required" every tool, as the call array's grammar leaves out a branch
        that accepts nothing (the model could never call that tool; with one tool the error was
        the wrapper's "minItems at $"); under "auto" the strict tools while the request's
        `structural_tag` is theirs (its errors at a schema's root named no tool). A named
        function's grammar is its own parameters (`locate` names it)."""
        if self.choice == "required":
            return list(range(len(self.tools)))
        if self.choice == "auto" and structural_tag is not None:
            return [i for i, t in enumerate(self.tools) if t.strict]
        return []

    def where(self, i: int) -> str:
        """Tool `i`'s parameters, as the request names them."""
        return f"functions[{i}].parameters" if self.legacy else f"tools[{i}].function.parameters"

    def locate(self, message: str, tool: int | None = None) -> str:
        """A grammar error's schema path (`at $...`) restated in the request's terms: the
        grammar wraps the tools' parameters (an array of calls, each tool's under $defs; a
        structural tag), whose paths the client never wrote. `tool`: the error is of that
        tool's parameters compiled alone (`checked_tools`), rooted at `$`."""
        named = next((i for i, t in enumerate(self.tools) if t.name == self.named), 0)
        message = re.sub(r"\$\.items(?:\.(?:any|one)Of\[(\d+)\])?\.properties\.arguments",
                         lambda m: self.where(int(m.group(1) or 0)), message)
        message = re.sub(r"\$\.\$defs\.tool_(\d+)", lambda m: self.where(int(m.group(1))), message)
        message = re.sub(r"\$\.structures\[(\d+)\]\.schema", lambda m: self.where(int(m.group(1))), message)
        if tool is not None or self.choice == "named":
            # the root, where a path or the message's ":" follows it
            message = re.sub(r"\$(?=[.\[\s:]|$)", self.where(named if tool is None else tool), message)
        return message

    def _tool(self, name: str | None) -> Tool:
        return next(t for t in self.tools if t.name == name)

    # ------------------------------------------------------------------ reply
    def parse(self, text: str, finish: str | None) -> Reply:
        """The finished reply `text` (stop strings already trimmed) as content and calls."""
        if self.choice == "named":
            return Reply(None, (ToolCall(self.named or "", text),), finish)
        if self.choice == "required":
            try:
                items = _loads(text)
                calls = tuple(ToolCall(_name(it["name"]), _dump(it["arguments"])) for it in items)
            except (ValueError, TypeError, KeyError, RecursionError):  # cut short by max_tokens (or nested past json)
                # as a named call cut short (and OpenAI's): the calls so far, the last one's
                # arguments as far as they got; the wrapper array is never shown as content
                return Reply(None, _calls_so_far(text), finish)
            return Reply(None, calls, "tool_calls" if finish == "stop" else finish)
        content, calls = self.parse_auto(text)
        if not calls:
            return Reply(text, (), finish)
        # without parallel calls, a first call closed by its tag ends the reply whatever came
        # after it (a model that writes "}</tool_call>" on one line is not stopped by STOP)
        ended = finish == "stop" or (not self.parallel and finish == "length" and self._first_call_closed(text))
        # trailing whitespace (before the call) goes; leading stays, as in a reply without calls,
        # so the streamed content (sent before anyone knows a call follows) adds up to this
        return Reply(content.rstrip() or None, calls, "tool_calls" if ended else finish)

    def _first_call_closed(self, text: str) -> bool:
        known = {t.name for t in self.tools}
        return next((b.closed for b in call_blocks(self.open_call + text) if _as_call(b.inner, known)), False)

    def parse_auto(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        """The calls in a free reply, and the text around them (unstripped: the text before
        the first call is a prefix of `text`). Without parallel calls, the first call ends
        the reply (what a model writes after it is dropped, as the stop string would have).
        With `open_call`, the reply first finishes that block."""
        known = {t.name for t in self.tools}
        full = self.open_call + text
        if not self.open_call and text.lstrip().startswith("{"):  # Llama's format: the reply is one object
            call = _as_call(text, known)  # (its strings may hold "<tool_call>")
            if call is not None:
                return "", (call,)
        if OPEN in full:
            calls, outside, pos = [], [], len(self.open_call)
            for b in call_blocks(full):
                call = _as_call(b.inner, known)
                if call is None:  # not a valid call of a listed tool: leave it as text
                    continue
                outside.append(full[pos:b.start])
                pos = b.end
                calls.append(call)
                if not self.parallel:
                    break
            outside.append(full[pos:] if self.parallel or not calls else "")
            return "".join(outside), tuple(calls)
        call = _as_call(text, known)
        return ("", (call,)) if call is not None else (text, ())

    def call_of(self, text: str) -> ToolCall | None:
        """The call that the JSON object `text` writes, when it names a listed tool; else None."""
        return _as_call(text, {t.name for t in self.tools})

    def streamer(self) -> "ToolStream":
        return ToolStream(self)


class _BigNumber(float):
    """A JSON number past a double's range ("1e999": valid JSON, inf to Python), with the text
    it was written as, which _dump writes back: json writes inf as `Infinity`, no JSON."""
    __slots__ = ("text",)


def _number(text: str) -> float:
    value = float(text)
    if value - value == 0:  # finite
        return value
    big = _BigNumber(value)
    big.text = text
    return big


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


# a model's reply read as JSON strictly: json.loads takes NaN, Infinity and -Infinity (JavaScript's
# words, no JSON), so a call the model wrote with them came back with arguments that JSON parsers
# (strict json.loads, JavaScript's JSON.parse) refuse; with them a block is no call (left as text)
_STRICT = json.JSONDecoder(parse_constant=_no_constant, parse_float=_number)


def _loads(text: str) -> Any:
    return _STRICT.decode(text)


def _dump(args: Any) -> str:
    """Arguments as compact JSON, as the grammar of a named call writes them; a number past a
    double's range as the model wrote it (see _BigNumber)."""
    if not isinstance(args, dict):
        raise TypeError("arguments must be an object")
    try:
        return json_text(args, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a number past a double's range (NaN and inf come from no strict parse)
        pass
    # each such number is written as a string marked by a nonce, then its quotes and all give
    # way to the number's text
    nonce, texts = uuid.uuid4().hex, []

    def mark(v: Any) -> Any:
        if isinstance(v, _BigNumber):
            texts.append(v.text)
            return f"\ue000{nonce}:{len(texts) - 1}\ue000"
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return v

    text = json_text(mark(args), separators=(",", ":"), allow_nan=False)
    return re.sub(f'"\ue000{nonce}:(\\d+)\ue000"', lambda m: texts[int(m.group(1))], text)


_LONE_RE = re.compile("[\ud800-\udfff]")


def json_text(value: Any, allow_nan: bool = True, **kw: Any) -> str:
    """json.dumps(value, ensure_ascii=False), a lone surrogate in it written as its \\uXXXX
    escape: the same JSON value, and a text that is whole UTF-8. A model may write "\\ud800" in
    a call's arguments (valid JSON); written out raw, the reply's arguments were no UTF-8 a
    client could send back (httpx's json= raises), and sent back escaped, the next turn's
    prompt held half a character: a 400 naming a character of the rendered prompt."""
    # in pieces, as a reply (protocol.json_pieces): a client's 15 MB arguments, read back and
    # written out for the prompt, held the GIL, and every other client, for 0.9 s in one call
    sep = kw.pop("separators", (", ", ": "))
    text = ("".join(json_pieces(value, ensure_ascii=False, separators=sep, allow_nan=allow_nan)) if not kw
            else json.dumps(value, ensure_ascii=False, separators=sep, allow_nan=allow_nan, **kw))
    # json.loads joins a surrogate pair into one character: any left here is lone
    return _LONE_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def lone_surrogate_at(value: Any, path: str) -> str | None:
    """The path of the first string (or object key) in `value` holding a lone surrogate, or None."""
    stack = [(value, path)]
    while stack:  # a loop, not recursion: a schema nested deeply is still walked
        v, at = stack.pop()
        if isinstance(v, str):
            if _LONE_RE.search(v):
                return at
        elif isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str) and _LONE_RE.search(k):
                    return f"{at} (the key {json.dumps(k)})"
                stack.append((item, f"{at}.{k}"))
        elif isinstance(v, list):
            stack.extend((item, f"{at}[{j}]") for j, item in enumerate(v))
    return None


_ITEM_GAP_RE = re.compile(r"\s*,?\s*")
# an item begun: its name whole, then (if it got that far) the arguments key
_CALL_HEAD_RE = re.compile(r'\s*,?\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")(\s*,\s*"arguments"\s*:\s*)?')


def _whole_calls(text: str, pos: int = 0) -> tuple[list[ToolCall], int]:
    """The whole `{"name", "arguments"}` items of a `required` reply (so far) after `pos` (0:
    from its start; else where an earlier look stopped), and where they end."""
    if pos == 0:
        pos = text.find("[") + 1
        if pos == 0:
            return [], 0
    calls = []
    while True:
        start = _ITEM_GAP_RE.match(text, pos).end()
        try:
            item, end = _STRICT.raw_decode(text, start)
            calls.append(ToolCall(_name(item["name"]), _dump(item["arguments"])))
            pos = end
        except (ValueError, TypeError, KeyError, RecursionError):
            return calls, pos


def _calls_so_far(text: str) -> tuple[ToolCall, ...]:
    """The calls of a `required` reply cut short: each whole `{"name", "arguments"}` item,
    then the last one begun, with its arguments text as far as it got (empty when the cut
    came before them: the grammar writes the name first). Nothing when not even a name is whole."""
    calls, pos = _whole_calls(text)
    if pos == 0:
        return ()
    head = _CALL_HEAD_RE.match(text, pos)
    if head is not None:
        try:  # free text (a reasoning block read with the reply: separate_reasoning false) may
            # hold what looks like a name but is no JSON string ("\x": a JSONDecodeError, a 500)
            calls.append(ToolCall(_name(json.loads(head.group(1))), text[head.end():] if head.group(2) else ""))
        except ValueError:
            pass
    return tuple(calls)


def _name(name: Any) -> str:
    """A call's name as the reply gives it: a string (a number there is no call: ValueError)."""
    if not isinstance(name, str):
        raise ValueError(f"a call's name must be a string, got {type(name).__name__}")
    return name


def _as_call(text: str, known: set[str]) -> ToolCall | None:
    """`{"name": ..., "arguments" | "parameters": {...}}` naming a listed tool, else None.
    A reply nested past what json reads (a thousand "[") is no call either: its RecursionError
    was a 500, and a stream cut off; and so is one whose name is no string ({"name": [1]}: a
    TypeError, unhashable, looking it up in `known`, was a 500 too)."""
    try:
        obj = _loads(text)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in known:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            args = _loads(args)
        return ToolCall(obj["name"], _dump(args)) if isinstance(args, dict) else None
    except (ValueError, RecursionError):
        return None


class ToolStream:
    """One streamed choice: turns text deltas into OpenAI chat deltas."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.sent = 0  # characters of the reply sent as content (auto) or arguments (named)
        self.in_call = bool(plan.open_call)  # auto: a <tool_call> block has begun (in the prompt, too)
        self.call: dict | None = None  # named: the call announced in the first delta
        self.calls_sent = 0  # required: the calls sent, each whole ...
        self.calls_end = 0  # ... and where the last of them ends in the reply (0: none yet)
        self.looked = 0  # required: how much of the reply the last look for a whole item saw

    def feed(self, text: str) -> dict:
        """The delta for the reply so far, `text` being all of it."""
        if self.plan.choice == "named":
            new, self.sent = text[self.sent:], len(text)
            if self.call is None:
                self.call = ToolCall(self.plan.named or "", new).as_openai(0)
                return {"tool_calls": [self.call]}
            return {"tool_calls": [{"index": 0, "function": {"arguments": new}}]} if new else {}
        if self.plan.choice == "required":
            return self._closed_calls(text)
        if self.in_call:
            return {}
        if self.sent == 0 and text.lstrip()[:1] in ("", "{"):
            return {}  # the reply may be a Llama-format call, a lone JSON object: decided at the end
        at = text.find(OPEN, self.sent)
        if at >= 0:
            self.in_call = True
            end = at
        else:  # hold back a tail that may be the start of "<tool_call>"
            end = len(text) - partial_suffix_len(text, OPEN)
        # and trailing whitespace: before a call, the reply's content ends without it
        end = max(self.sent, len(text[:end].rstrip()))
        new, self.sent = text[self.sent:end], end
        return {"content": new} if new else {}

    def _closed_calls(self, text: str) -> dict:
        """required: the delta of the calls whose array items closed since the last one sent
        (an item closes with a "}": the reply is looked at again only when one came)."""
        if "}" not in text[self.looked:]:
            return {}
        self.looked = len(text)
        calls, self.calls_end = _whole_calls(text, self.calls_end)
        start, self.calls_sent = self.calls_sent, self.calls_sent + len(calls)
        return {"tool_calls": [c.as_openai(start + k) for k, c in enumerate(calls)]} if calls else {}

    def finish(self, text: str, finish: str | None) -> tuple[dict, str | None]:
        """The last delta and the finish_reason, given the whole reply."""
        if self.plan.choice == "named":
            return self.feed(text), finish
        reply = self.plan.parse(text, finish)
        delta: dict = {}
        if not reply.calls:  # what is content: the whole reply (auto), never a cut `required` array
            rest = (reply.content or "")[self.sent:]
        else:
            # (required: those sent as they closed are the reply's first calls, parsed from
            # the same items)
            calls = reply.calls[self.calls_sent:]
            if calls:
                delta["tool_calls"] = [c.as_openai(self.calls_sent + i) for i, c in enumerate(calls)]
            rest = self.plan.parse_auto(text)[0][self.sent:].rstrip() if self.plan.choice == "auto" else ""
        if rest:
            delta["content"] = rest
        return delta, reply.finish_reason


# ====================================================================== request side

def plan_tools(body: dict) -> ToolPlan | None:
    """Validate `tools` / `tool_choice` / `parallel_tool_calls`; None when tools play no part
    (none given, or tool_choice "none"). Raises APIError(400) naming the bad field. OpenAI's
    legacy `functions` / `function_call` are the same as tools (`legacy_plan`)."""
    if body.get("functions") is not None or body.get("function_call") is not None:
        return legacy_plan(body)
    tools_in, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is None:  # left out or null (vLLM's and SGLang's Optional[bool]): OpenAI's default
        parallel = True
    if not isinstance(parallel, bool):
        raise APIError.bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if tools_in is None or tools_in == []:
        if choice not in (None, "none"):
            raise APIError.bad_request("tool_choice needs a non-empty tools list", "tool_choice")
        return None
    if not isinstance(tools_in, list):
        raise APIError.bad_request("tools must be a list of function tools", "tools")
    if len(tools_in) > MAX_TOOLS:  # each is checked, rendered into the prompt and the grammar: bounded work
        raise APIError.bad_request(f"tools has {len(tools_in)} functions; this server takes at most {MAX_TOOLS}",
                                   "tools")
    tools: list[Tool] = []
    names: set[str] = set()  # a second function of a name (was a scan of the list per tool: 40,000 took 44 s)
    for i, t in enumerate(tools_in):
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(t, dict) and t.get("type") == "custom":  # OpenAI's free-form (grammar) tools
            raise APIError.bad_request(f"tools[{i}]: custom tools are not supported by this server; "
                                       "send a function tool", "tools")
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise APIError.bad_request(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise APIError.bad_request(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -", "tools")
        if name in names:
            raise APIError.bad_request(f"tools[{i}]: a second function named {quoted(name)}", "tools")
        names.add(name)
        lone = lone_surrogate_at(fn, f"tools[{i}].function")  # rendered into the prompt and the grammar
        if lone is not None:
            raise APIError.bad_request(f"{lone} has a lone surrogate, half of a character: send whole characters",
                                       "tools")
        params = fn.get("parameters", NO_PARAMETERS)
        if not isinstance(params, dict):
            raise APIError.bad_request(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise APIError.bad_request(f"tools[{i}].function.description must be a string", "tools")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise APIError.bad_request(f"tools[{i}].function.strict must be a boolean", "tools")
        tools.append(Tool(name, params, t, bool(strict)))
    if choice in (None, "auto"):
        return ToolPlan(tuple(tools), "auto", None, parallel)
    if choice == "none":
        return None
    if choice == "required":
        return ToolPlan(tuple(tools), "required", None, parallel)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return _allowed_tools(choice.get("allowed_tools"), tools, parallel)
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(fn, dict):
        raise APIError.bad_request('tool_choice must be "none", "auto", "required", '
                                   '{"type": "function", "function": {"name": ...}} or '
                                   '{"type": "allowed_tools", "allowed_tools": {...}}', "tool_choice")
    if not isinstance(fn.get("name"), str):  # a list or object here made a TypeError, a 500
        raise APIError.bad_request("tool_choice.function.name must be a string", "tool_choice")
    if fn["name"] not in {t.name for t in tools}:
        raise APIError.bad_request(f"tool_choice names {quoted(fn.get('name'))}, which is not in tools", "tool_choice")
    return ToolPlan(tuple(tools), "named", fn["name"], parallel)


def _allowed_tools(spec: Any, tools: list[Tool], parallel: bool) -> ToolPlan:
    """OpenAI's tool_choice {"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required",
    "tools": [{"type": "function", "function": {"name": ...}}, ...]}}: the reply may call (auto)
    or must call (required) only the tools listed there, each one of `tools`."""
    where = "tool_choice.allowed_tools"
    if not isinstance(spec, dict) or spec.get("mode") not in ("auto", "required"):
        raise APIError.bad_request(f'{where} must be an object with "mode" "auto" or "required" '
                                   'and a "tools" list', "tool_choice")
    listed = spec.get("tools")
    if not isinstance(listed, list) or not listed:
        raise APIError.bad_request(f"{where}.tools must be a non-empty list of function tools", "tool_choice")
    by_name = {t.name: t for t in tools}
    chosen: dict[str, Tool] = {}
    for i, ref in enumerate(listed):
        fn = ref.get("function") if isinstance(ref, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(ref, dict) or ref.get("type") != "function" or not isinstance(name, str):
            raise APIError.bad_request(f'{where}.tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}',
                                       "tool_choice")
        if name not in by_name:
            raise APIError.bad_request(f"{where}.tools[{i}] names {quoted(name)}, which is not in tools", "tool_choice")
        chosen[name] = by_name[name]
    return ToolPlan(tuple(t for t in tools if t.name in chosen), spec["mode"], None, parallel)


# the words of plan_tools' errors, restated in the legacy fields' terms
_LEGACY_WORDS = (("tools[", "functions["), ("].function.", "]."), ("tool_choice", "function_call"),
                 ("in tools", "in functions"), ("tools list", "functions list"), ("tools has", "functions has"),
                 ('must be {"type": "function", "function": {...}}', "must be a function definition object"),
                 ("function_call.function.name", "function_call.name"))


def legacy_plan(body: dict) -> ToolPlan | None:
    """OpenAI's deprecated function calling (which its API still takes): `functions` (a list
    of {name, description, parameters}) and `function_call` ("none", "auto" or {"name": ...})
    are `tools` of those functions and the same `tool_choice`, with at most one call a reply
    (the legacy reply has room for one: message.function_call). Mixed with the tools fields
    it is a 400 (which would win is anyone's guess)."""
    mixed = next((k for k in ("tools", "tool_choice", "parallel_tool_calls") if body.get(k) is not None), None)
    if mixed is not None:
        raise APIError.bad_request(f"functions and function_call are the legacy form of tools and tool_choice: "
                                   f"send {mixed} without them", mixed)
    functions, call = body.get("functions"), body.get("function_call")
    if functions is not None and not isinstance(functions, list):
        raise APIError.bad_request("functions must be a list of function definitions", "functions")
    tools = [{"type": "function", "function": f} for f in functions or []]
    if isinstance(call, dict):
        if set(call) != {"name"}:
            raise APIError.bad_request('function_call must be "none", "auto" or {"name": ...}', "function_call")
        choice: Any = {"type": "function", "function": {"name": call["name"]}}
    elif call in (None, "none", "auto"):
        choice = call
    else:
        raise APIError.bad_request('function_call must be "none", "auto" or {"name": ...}', "function_call")
    try:
        plan = plan_tools({"tools": tools, "tool_choice": choice, "parallel_tool_calls": False})
    except APIError as e:
        for ours, theirs in _LEGACY_WORDS:
            e.message = e.message.replace(ours, theirs)
        e.param = {"tools": "functions", "tool_choice": "function_call"}.get(e.param or "", e.param)
        raise
    return None if plan is None else ToolPlan(plan.tools, plan.choice, plan.named, False, legacy=True)


def template_knows_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def render_messages(messages: list[dict], plan: ToolPlan | None, native: bool) -> list[dict]:
    """Messages (already checked: role, string content, tool_calls kept) ready for a template
    that knows tools (`native`, which then also gets `tools=`) or for one that does not."""
    if native:
        return [_native(m) for m in messages]
    out: list[dict] = []
    if plan is not None:
        prompt = _tools_prompt(plan)
        if messages and messages[0]["role"] == "system":
            out.append({"role": "system", "content": messages[0]["content"] + "\n\n" + prompt})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": prompt})
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool"):  # consecutive results share one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        elif m.get("tool_calls"):
            calls = "\n".join(f'{OPEN}\n{json_text({"name": c["function"]["name"], "arguments": _args(c)})}\n{CLOSE}'
                              for c in m["tool_calls"])
            out.append({"role": m["role"], "content": (m["content"] + "\n" if m["content"] else "") + calls})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return [{"role": m["role"], "content": m["content"]} for m in out]


def _native(m: dict) -> dict:
    d = {k: v for k, v in m.items() if k in ("role", "content", "name", "tool_call_id")}
    if m.get("tool_calls"):
        # templates read the arguments as a mapping (`| tojson`), as HF documents
        d["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _args(c)}} for c in m["tool_calls"]]
    return d


def _args(call: dict) -> Any:
    """A call's arguments as a mapping (their JSON text when it is not JSON); the text, made
    whole UTF-8 (json_text), when they hold a lone surrogate: a template writes the mapping out
    itself (`| tojson`, raw characters), which would put half a character in the prompt."""
    a = call["function"].get("arguments", "{}")
    try:
        # a long text in pieces (protocol.loads_in_pieces): one json.loads call over a client's
        # 15 MB arguments held the GIL, and with it every other client, for 0.9 s
        value = (json.loads(a) if len(a) < PIECEWISE_PARSE_BYTES else loads_in_pieces(a)) if isinstance(a, str) else a
    except ValueError:
        return a
    if lone_surrogate_at(value, "") is not None:
        return json_text(value)
    return value


def _tools_prompt(plan: ToolPlan) -> str:
    listed = "\n".join(json.dumps(t.spec, ensure_ascii=False) for t in plan.tools)
    return ("You may call one or more functions to help with the user's request. The functions, "
            f"as JSON schemas:\n<tools>\n{listed}\n</tools>\n\n"
            "To call a function, answer with a <tool_call> block holding a JSON object with its "
            "name and arguments, one block per call:\n"
            f'{OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n{CLOSE}')


def legacy_message(i: int, m: dict) -> dict:
    """messages[i] with OpenAI's legacy function calling in today's terms: an assistant's
    `function_call` ({name, arguments}) is its one tool call, and a `function` message (a
    function's result, named by `name`) a `tool` message. APIError(400) for a malformed one."""
    fc = m.get("function_call")
    if fc is not None:
        if m.get("role") != "assistant" or not isinstance(fc, dict) or not isinstance(fc.get("name"), str) \
                or not isinstance(fc.get("arguments", "{}"), (str, dict)):
            raise APIError.bad_request(f"messages[{i}].function_call must be {{\"name\", \"arguments\"}} on an "
                                       "assistant message", "messages")
        if m.get("tool_calls") is not None:
            raise APIError.bad_request(f"messages[{i}] has both tool_calls and function_call: send one", "messages")
        m = {**m, "tool_calls": [{"id": f"call_{i}", "type": "function", "function": fc}]}
        del m["function_call"]
    if m.get("role") == "function":
        if not isinstance(m.get("name"), str):
            raise APIError.bad_request(f"messages[{i}]: a function message needs the `name` of the function whose "
                                       "result it holds", f"messages[{i}].name")
        m = {**m, "role": "tool"}
    return m


def check_message_tool_fields(i: int, m: dict) -> None:
    """messages[i]'s tool_calls / tool_call_id, as OpenAI defines them; APIError(400) if not."""
    calls = m.get("tool_calls")
    if calls is not None:
        if m["role"] != "assistant" or not isinstance(calls, list):
            raise APIError.bad_request(f"messages[{i}].tool_calls must be a list on an assistant message",
                                       "messages")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                    or not isinstance(fn.get("arguments", "{}"), (str, dict)):
                raise APIError.bad_request(f"messages[{i}].tool_calls[{j}] must have function.name and "
                                           "function.arguments (a JSON string)", "messages")
            if _LONE_RE.search(fn["name"]):  # rendered into the prompt (the arguments are made whole: _args)
                raise APIError.bad_request(f"messages[{i}].tool_calls[{j}].function.name has a lone surrogate, half "
                                           "of a character: send whole characters", "messages")
    if m["role"] == "tool" and m.get("tool_call_id") is not None and not isinstance(m["tool_call_id"], str):
        raise APIError.bad_request(f"messages[{i}].tool_call_id must be a string", "messages")
