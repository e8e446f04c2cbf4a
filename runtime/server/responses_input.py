"""The input side of /v1/responses (responses_api.py): a Responses body checked and
translated into a /v1/chat/completions body, and the chat path's errors renamed back into
this API's fields.

    instructions                  -> a system message first (not carried to the next turn)
    input (a string, or items)    -> user / system / developer / assistant messages; a
                                     function_call item -> an assistant tool call, a
                                     function_call_output item -> a tool message
    previous_response_id          -> that stored response's conversation, before the input
    text.format                   -> response_format (json_object, json_schema)
    tools [{type: function, ...}] -> chat tools (strict: true unless sent false, as OpenAI's)
    tool_choice                   -> chat tool_choice
    max_output_tokens             -> max_completion_tokens

A field asking for what treadle cannot do (built-in tools, image or file inputs, background
responses, reasoning effort, ...) is a 400 naming it; an unknown field is a 400, as on the
chat route.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple

from treadle.runtime.server.compat_fields import OPENAI, Table, check_compat_fields
from treadle.runtime.server.openai_api import _PASSED
from treadle.runtime.server.protocol import APIError, clip_names, json_pieces, non_finite_path, quoted
from treadle.runtime.server.responses_output import ITEM_OVERHEAD, new_id

# the chat path's sampling extras (SGLang's and vLLM's, sent as extra_body), passed on as they are
EXTRAS = tuple(f for f in _PASSED if f not in ("temperature", "top_p", "n"))
_HOSTED_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11",
                 "file_search", "computer", "computer_use", "computer_use_preview", "code_interpreter",
                 "image_generation", "mcp", "local_shell", "shell", "apply_patch", "tool_search")
# fields of OpenAI's that ask for what treadle does not do: taken only at a value asking for nothing
_REFUSED: Table = {
    "background": (lambda v: v in (None, False), "treadle has no background responses (send the request and "
                                                 "wait, or stream it)"),
    "background_options": (lambda v: v is None, "treadle has no background responses"),
    "conversation": (lambda v: v is None, "treadle has no Conversations API: chain responses with "
                                          "previous_response_id"),
    "context_management": (lambda v: v in (None, []), "treadle does not compact a conversation"),
    "prompt": (lambda v: v is None, "treadle keeps no prompt templates: send the input itself"),
    "moderation": (lambda v: v is None, "treadle runs no moderation"),
    "image": (lambda v: v is None, "treadle writes text only"),
    "access_programs": (lambda v: v is None, "treadle has no access programs"),
    "truncation": (lambda v: v in (None, "disabled"), "treadle does not drop input items to fit the context "
                                                      '(send "disabled": an input past the context is a 400)'),
    # labels and hints: any value of their type
    "user": (lambda v: v is None or isinstance(v, str), "must be a string"),
    "safety_identifier": (lambda v: v is None or isinstance(v, str), "must be a string"),
    "prompt_cache_key": (lambda v: v is None or isinstance(v, str), "must be a string"),
    "prompt_cache_retention": (lambda v: v is None or isinstance(v, str), "must be a string"),
    "prompt_cache_options": (lambda v: v is None or isinstance(v, dict), "must be an object"),
    "service_tier": (lambda v: v is None or isinstance(v, str), "must be a string"),
    "max_tool_calls": (lambda v: v is None or (type(v) is int and v >= 1), "must be an integer >= 1"),
}
_FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "stream_options",
           "text", "tools", "tool_choice", "parallel_tool_calls", "metadata", "store", "previous_response_id",
           "reasoning", "include", "top_logprobs", "rid", "request_id", *_REFUSED, *EXTRAS, *OPENAI}
LOGPROBS = "message.output_text.logprobs"  # the one `include` value treadle fills
# the chat path's words -> this API's (longest first, where one holds another)
_WORDS = (("response_format.json_schema must be an object; its `schema`, a JSON Schema",
           "text.format.schema must be a JSON Schema"),
          ("response_format.json_schema.schema", "text.format.schema"),
          ("response_format.json_schema.", "text.format."), ("response_format", "text.format"), ("max_completion_tokens", "max_output_tokens"),
          ("max_tokens", "max_output_tokens"), ("].function.", "]."), ("tool_choice.function.name", "tool_choice.name"))
_PARAMS = {"response_format": "text", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens"}
_MESSAGE_RE = re.compile(r"messages\[(\d+)\]")


class Plan(NamedTuple):
    chat: dict  # the chat body
    origins: list[str]  # per chat message: where the client sent it
    input_items: list[dict]
    new_messages: list[dict]  # the chat messages of this input (no instructions)
    # characters a stored response keeps of this request (json_size): its input twice (the
    # items and their messages) and the other fields it echoes; and of the input alone
    size: int
    input_size: int


def json_size(value: Any) -> int:
    """`value`'s compact JSON length in characters, written in pieces (protocol.json_pieces:
    a large value does not hold the GIL in one call): the measure of what a store keeps."""
    return sum(map(len, json_pieces(value)))


def check_fields(body: dict) -> None:
    """Unknown fields, and those asking for what treadle does not do: a 400 naming them."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise APIError.bad_request(f"unknown field(s): {clip_names(unknown)}", unknown[0])
    check_compat_fields(body, _REFUSED)
    metadata = body.get("metadata")
    # OpenAI's bounds (a stored response keeps it)
    if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16
                                 or not all(len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                                            for k, v in metadata.items())):
        raise APIError.bad_request("metadata must be an object of at most 16 keys of at most 64 characters, each "
                                   "a string of at most 512", "metadata")
    for name in ("store", "stream", "parallel_tool_calls"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise APIError.bad_request(f"{name} must be a boolean", name)
    so = body.get("stream_options")
    if so is not None and (body.get("stream") is not True or not isinstance(so, dict)):
        raise APIError.bad_request("stream_options must be an object, sent with stream: true", "stream_options")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise APIError.bad_request("reasoning must be an object", "reasoning")
        asked = {k: v for k, v in reasoning.items() if v is not None and not (k == "effort" and v == "none")}
        if asked:
            name = sorted(asked)[0]
            raise APIError.bad_request(f"reasoning.{name}={quoted(asked[name], 60)} is not supported: treadle has no "
                                       "control of a model's reasoning (leave it out, or send null)", "reasoning")
    include = body.get("include")
    if include is not None and not isinstance(include, list):
        raise APIError.bad_request(f"include must be a list, got {quoted(include, 80)}", "include")
    other = next((v for v in include or () if v != LOGPROBS), None)
    if other is not None:
        raise APIError.bad_request(f"include: {quoted(other, 80)} is not supported: treadle fills {LOGPROBS} "
                                   "only", "include")
    top = body.get("top_logprobs")
    if top is not None and (type(top) is not int or not 0 <= top <= 20):
        raise APIError.bad_request(f"top_logprobs must be an integer in [0, 20], got {quoted(top)}", "top_logprobs")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise APIError.bad_request("instructions must be a string", "instructions")


def renamed(e: APIError, origins: list[str]) -> APIError:
    """A chat-path error in this API's terms: its fields, and its message's place in the input."""
    msg = _MESSAGE_RE.sub(lambda m: origins[int(m.group(1))] if int(m.group(1)) < len(origins) else m.group(),
                          e.message)
    for ours, theirs in _WORDS:
        msg = msg.replace(ours, theirs)
    if e.param == "response_format":  # a schema's compile error names the sampling field
        msg = msg.replace("json_schema: ", "text.format.schema: ")
    e.message = msg
    if e.param is not None:
        e.param = "input" if e.param.startswith("messages") else _PARAMS.get(e.param, e.param)
    return e


def wants_logprobs(body: dict) -> bool:
    """Whether the reply's text comes with its tokens' logprobs: `include` asks, and so does a
    `top_logprobs` above 0 (which would mean nothing otherwise)."""
    return LOGPROBS in (body.get("include") or ()) or bool(body.get("top_logprobs"))


def translate(body: dict, earlier: list[dict]) -> Plan:
    """The Responses body as a chat body (on a builder thread: it walks the input)."""
    _check_finite(body)
    chat: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", "parallel_tool_calls", "stream",
                                                  "rid", "request_id", *EXTRAS, *OPENAI) if k in body}
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if wants_logprobs(body):
        chat["logprobs"], chat["top_logprobs"] = True, body.get("top_logprobs") or 0
    messages, origins = [], []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
        origins.append("instructions")
    messages += earlier
    origins += ["previous_response_id's conversation"] * len(earlier)
    items, own = _input_items(body.get("input"))
    for m, where in own:
        messages.append(m)
        origins.append(where)
    if not messages:
        if items:  # reasoning items only: "input is required" told a client that sent some it sent none
            raise APIError.bad_request("input holds nothing to answer: its items are reasoning items only, which "
                                       "make no prompt (send a message, or function_call items and their outputs)",
                                       "input")
        raise APIError.bad_request("input is required (a string, or a list of items)", "input")
    chat["messages"] = messages
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    new_messages = [m for m, _ in own]
    input_size = json_size(new_messages) + ITEM_OVERHEAD * len(new_messages)
    echoed = json_size({k: v for k, v in body.items() if k != "input"})
    return Plan(chat, origins, items, new_messages,
                echoed + input_size + json_size(items) + ITEM_OVERHEAD * len(items), input_size)


def _check_finite(body: dict) -> None:
    """A 400 naming the first NaN or infinite number (NaN, Infinity, 1e400, which Python's
    reader takes) anywhere in the body: the response echoes the request's settings, and the
    store its input items, as JSON, which has no text for them."""
    at = non_finite_path(body)
    if at is not None:
        field = re.match(r"[^.\[]*", at).group(0)
        raise APIError.bad_request(f"{at}: JSON has no such number as NaN or infinity (nor one past a double's range, "
                                   "as 1e400): send a finite number", field)


def _text(value: Any, where: str) -> str:
    """A content (a string, or a list of text parts) as one string; another part is a 400."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise APIError.bad_request(f"{where} must be a string or a list of content parts", "input")
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise APIError.bad_request(f"{where}[{j}]: {kind} parts are not supported: treadle serves text-only "
                                       "models (send input_text)", "input")
        key = "refusal" if kind == "refusal" else "text"
        if kind not in ("input_text", "output_text", "text", "refusal") or not isinstance(part.get(key), str):
            raise APIError.bad_request(f"{where}[{j}] must be a text part ({{\"type\": \"input_text\", \"text\": "
                                       "...}, or output_text)", "input")
        texts.append(part[key])
    return "".join(texts)


def _input_items(value: Any) -> tuple[list[dict], list[tuple[dict, str]]]:
    """`input` as (its items with ids, for input_items; (chat message, where it came from) pairs).
    Consecutive function_call items, and those following an assistant message, are that
    assistant turn's tool calls."""
    if value is None:
        return [], []
    if isinstance(value, str):
        return [{"id": new_id("msg_"), "type": "message", "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": value}]}], [({"role": "user", "content": value}, "input")]
    if not isinstance(value, list):
        raise APIError.bad_request("input must be a string or a list of items", "input")
    items: list[dict] = []
    out: list[tuple[dict, str]] = []
    turn = False  # the last message is an assistant's, from the item before (reasoning aside)
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError.bad_request(f"{where}.role must be one of user, system, developer, assistant; got "
                                           f"{quoted(role)}", "input")
            text = _text(item.get("content"), f"{where}.content")
            content = item["content"] if isinstance(item["content"], list) else [
                {"type": "output_text" if role == "assistant" else "input_text", "text": text}]
            items.append({"id": item.get("id") or new_id("msg_"), "type": "message", "role": role,
                          "status": item.get("status") or "completed", "content": content})
            out.append(({"role": role, "content": text}, where))
            turn = role == "assistant"
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise APIError.bad_request(f"{where}.{key} must be a string (a function_call item: call_id, "
                                               "name, arguments)", "input")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            items.append({"id": item.get("id") or new_id("fc_"), "type": "function_call", "status": "completed",
                          **{k: item[k] for k in ("call_id", "name", "arguments")}})
            if turn:  # the same assistant turn as the item before
                out[-1][0].setdefault("tool_calls", []).append(call)
            else:
                out.append(({"role": "assistant", "content": "", "tool_calls": [call]}, where))
            turn = True
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError.bad_request(f"{where}.call_id must be a string", "input")
            text = _text(item.get("output"), f"{where}.output")
            items.append({"id": item.get("id") or new_id("fco_"), "type": "function_call_output", "status": "completed",
                          "call_id": item["call_id"], "output": item["output"]})
            out.append(({"role": "tool", "tool_call_id": item["call_id"], "content": text}, where))
            turn = False
        elif kind == "reasoning":  # an earlier turn's reasoning: chat templates leave it out of the prompt
            items.append({**item, "id": item.get("id") or new_id("rs_")})
        elif kind is None:
            raise APIError.bad_request(f"{where} must be an item object with a type (or a message with a role)",
                                       "input")
        else:
            raise APIError.bad_request(f"{where}: items of type {quoted(kind)} are not supported (treadle takes "
                                       "message, function_call, function_call_output and reasoning items)", "input")
    return items, out


def _text_format(text: Any) -> dict | None:
    """`text` ({format, verbosity}) -> the chat response_format (None: free text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise APIError.bad_request("text must be an object ({\"format\": {...}})", "text")
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise APIError.bad_request(f"text: unknown member(s) {clip_names(unknown)}", "text")
    if text.get("verbosity") is not None and not isinstance(text["verbosity"], str):  # a hint, as chat's verbosity
        raise APIError.bad_request("text.verbosity must be a string", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kinds = ("text", "json_object", "json_schema")
    if not isinstance(fmt, dict) or fmt.get("type") not in kinds:
        raise APIError.bad_request(f"text.format.type must be one of {', '.join(kinds)}", "text")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    unknown = sorted(set(fmt) - {"type", "name", "schema", "strict", "description"})
    if unknown:
        raise APIError.bad_request(f"text.format: unknown member(s) {clip_names(unknown)}", "text")
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


def _tools(tools: Any) -> list[dict]:
    """Responses function tools ({type, name, description, parameters, strict}) as chat tools."""
    if not isinstance(tools, list):
        raise APIError.bad_request("tools must be a list of function tools", "tools")
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind in _HOSTED_TOOLS or (isinstance(kind, str) and kind.startswith(("web_search", "computer"))):
            raise APIError.bad_request(f"tools[{i}]: {kind} is one of OpenAI's built-in tools; treadle runs none "
                                       "(send function tools, which your code runs)", "tools")
        if kind == "custom":
            raise APIError.bad_request(f"tools[{i}]: custom tools are not supported by this server; send a "
                                       "function tool", "tools")
        if kind != "function":
            raise APIError.bad_request(f'tools[{i}] must be {{"type": "function", "name": ..., "parameters": ...}}',
                                       "tools")
        for name, ok in (("defer_loading", (None, False)), ("async", (None, False))):
            if t.get(name) not in ok:
                raise APIError.bad_request(f"tools[{i}].{name}={quoted(t[name])} is not supported (leave it out)",
                                           "tools")
        callers = t.get("allowed_callers")
        if callers is not None and (not isinstance(callers, list) or "direct" not in callers):
            raise APIError.bad_request(f"tools[{i}].allowed_callers: treadle's model calls tools directly only "
                                       '(send ["direct"] or leave it out)', "tools")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        fn["strict"] = t.get("strict") is not False  # OpenAI's default: strict
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("none", "auto", "required"):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind == "allowed_tools":
        listed = choice.get("tools")
        if not isinstance(listed, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                                   for t in listed):
            raise APIError.bad_request("tool_choice.tools must be a list of {\"type\": \"function\", \"name\": ...}",
                                       "tool_choice")
        return {"type": "allowed_tools", "allowed_tools": {
            "mode": choice.get("mode"), "tools": [{"type": "function", "function": {"name": t.get("name")}}
                                                  for t in listed]}}
    if isinstance(kind, str) and (kind in _HOSTED_TOOLS or kind.startswith(("web_search", "computer"))
                                  or kind == "custom"):
        raise APIError.bad_request(f"tool_choice: {kind} tools are not supported by this server (function tools "
                                   "only)", "tool_choice")
    raise APIError.bad_request('tool_choice must be "none", "auto", "required", {"type": "function", "name": ...} '
                               'or {"type": "allowed_tools", "mode": ..., "tools": [...]}', "tool_choice")
