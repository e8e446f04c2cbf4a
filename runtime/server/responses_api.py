"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, and
GET /v1/responses/{id}/input_items.

A Responses body is translated into a /v1/chat/completions body and built and run by the
chat path (openai_api.build_chat, prepare, run_to_end, stream_items), so chat templating,
structured outputs, tool calling, usage and abort-on-disconnect are the chat endpoint's:

    instructions                  -> a system message first (not carried to the next turn)
    input (a string, or items)    -> user / system / developer / assistant messages; a
                                     function_call item -> an assistant tool call, a
                                     function_call_output item -> a tool message
    previous_response_id          -> that stored response's conversation, before the input
    text.format                   -> response_format (json_object, json_schema)
    tools [{type: function, ...}] -> chat tools (strict: true unless sent false, as OpenAI's)
    tool_choice                   -> chat tool_choice
    max_output_tokens             -> max_completion_tokens

The reply comes back as output items (responses_output.py). Errors of the chat path are
renamed into this API's fields (messages[3] -> the input item it came from). A field asking
for what treadle cannot do (built-in tools, image or file inputs, background responses,
reasoning effort, ...) is a 400 naming it; an unknown field is a 400, as on the chat route.

Stored responses (store: true, the default) are kept in memory, the last STORE_CAPACITY of
them per server, with their input items and conversation; the oldest goes first.
"""
from __future__ import annotations

import re
import time
from collections import OrderedDict
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import Response

from treadle.runtime.server.compat_fields import OPENAI, Table, check_compat_fields
from treadle.runtime.server.http_server import ServerState, read_json
from treadle.runtime.server.openai_api import (_PASSED, Shaper, build_chat, prepare, run_to_end,
                                               stream_items)
from treadle.runtime.server.protocol import APIError, ReplyJSON, clip_names, finish_reason, quoted
from treadle.runtime.server.responses_output import Output, event_lines, new_id
from treadle.runtime.server.streaming import stream_or_error
from treadle.runtime.server.tokenizer_manager import Chunk

STORE_CAPACITY = 1000  # stored responses a server keeps (the oldest goes first)

# the chat path's sampling extras (SGLang's and vLLM's, sent as extra_body), passed on as they are
_EXTRAS = tuple(f for f in _PASSED if f not in ("temperature", "top_p", "n"))
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
    "top_logprobs": (lambda v: v in (None, 0), "/v1/responses returns no logprobs here; /v1/chat/completions "
                                               "does (logprobs, top_logprobs)"),
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
           "reasoning", "include", "rid", "request_id", *_REFUSED, *_EXTRAS, *OPENAI}
# the chat path's words -> this API's (longest first, where one holds another)
_WORDS = (("response_format.json_schema.schema", "text.format.schema"), ("response_format.json_schema.", "text.format."),
          ("response_format", "text.format"), ("max_completion_tokens", "max_output_tokens"),
          ("max_tokens", "max_output_tokens"), ("].function.", "]."), ("tool_choice.function.name", "tool_choice.name"))
_PARAMS = {"response_format": "text", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens"}
_MESSAGE_RE = re.compile(r"messages\[(\d+)\]")


class Stored(NamedTuple):
    response: dict
    input_items: list[dict]  # the request's input, as items with ids
    conversation: list[dict]  # chat messages: the earlier turns, this input and this reply (no instructions)


class ResponseStore:
    """The last `capacity` stored responses, by id (an OrderedDict: the oldest goes first).
    Used on the event loop only."""

    def __init__(self, capacity: int = STORE_CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, Stored] = OrderedDict()

    def put(self, rid: str, entry: Stored) -> None:
        self._entries[rid] = entry
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        return self._entries.get(rid)

    def delete(self, rid: str) -> bool:
        return self._entries.pop(rid, None) is not None

    def __len__(self) -> int:
        return len(self._entries)


class _Plan(NamedTuple):
    chat: dict  # the chat body
    origins: list[str]  # per chat message: where the client sent it
    input_items: list[dict]
    conversation: list[dict]  # the chat messages of the earlier turns and this input, no instructions


def register_responses_routes(app: FastAPI, state: ServerState, store: ResponseStore | None = None) -> None:
    store = ResponseStore() if store is None else store

    @app.post("/v1/responses")
    async def create(request: Request) -> Response:
        body = await read_json(request)
        return await _create(request, state, store, body)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Response:
        if request.query_params.get("stream") not in (None, "false"):
            raise APIError.bad_request("stream: a stored response is returned whole here (no replay of its events)",
                                       "stream")
        return ReplyJSON(_stored(store, response_id).response)

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> dict:
        _stored(store, response_id)
        store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str) -> dict:
        _stored(store, response_id)
        raise APIError.bad_request("only a background response can be cancelled, and treadle has none: this one is "
                                   "finished (a running request stops when its client disconnects, or by "
                                   "/abort_request)", "response_id")

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request) -> dict:
        items = _stored(store, response_id).input_items
        q = request.query_params
        order = q.get("order", "desc")
        limit = q.get("limit", "20")
        if order not in ("asc", "desc"):
            raise APIError.bad_request('order must be "asc" or "desc"', "order")
        if not limit.isdigit() or not 1 <= int(limit) <= 100:
            raise APIError.bad_request("limit must be an integer in [1, 100]", "limit")
        items = items if order == "asc" else items[::-1]
        after = q.get("after")
        if after is not None:
            at = next((i for i, it in enumerate(items) if it["id"] == after), None)
            if at is None:
                raise APIError.bad_request(f"after: no input item {quoted(after)} in this response", "after")
            items = items[at + 1:]
        page = items[:int(limit)]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)}


def _stored(store: ResponseStore, rid: str) -> Stored:
    entry = store.get(rid)
    if entry is None:
        raise APIError(f"no response with id {quoted(rid)} is stored here (a server keeps its last "
                       f"{store.capacity} stored responses, in memory)", 404, "invalid_request_error", "response_id",
                       "response_not_found")
    return entry


# ====================================================================== the request

async def _create(request: Request, state: ServerState, store: ResponseStore, body: dict) -> Response:
    tm = state.tm
    _check_fields(body)
    prev = body.get("previous_response_id")
    earlier: list[dict] = []
    if prev is not None:
        if not isinstance(prev, str):
            raise APIError.bad_request("previous_response_id must be a string", "previous_response_id")
        entry = store.get(prev)
        if entry is None:
            raise APIError(f"previous_response_id: no stored response with id {quoted(prev)} (a server keeps its "
                           f"last {store.capacity} stored responses, in memory; one sent with store: false is not "
                           "kept)", 400, "invalid_request_error", "previous_response_id", "previous_response_not_found")
        earlier = entry.conversation
    plan = await tm.off_loop(_translate, body, earlier)
    try:
        reqs, tools, think, _ = await build_chat(request, state, plan.chat)
        run = await prepare(request, state, plan.chat, reqs, True, tools)
    except APIError as e:
        raise _renamed(e, plan.origins) from None
    rid, created = new_id("resp_"), time.time()
    shaper = Shaper(tm, rid, state.model_name, True, int(created), 1, tools, None, think)
    dropped = run.reqs[0].sampling_params.json_schema_dropped

    def response(out: Output, status: str, incomplete: dict | None, usage: dict | None) -> dict:
        r = _echo(state, body, rid, created, status, incomplete, out.items, usage)
        if dropped is not None:  # json_schema_lenient: the keywords dropped, never silently
            r["json_schema_dropped"] = dropped
        return r

    def finished(out: Output, reason: str | None) -> dict:
        status, incomplete = out.finish(reason)
        r = response(out, status, incomplete, _usage(shaper, tm, out))
        if body.get("store", True) is not False:
            reply = out.as_message()
            store.put(rid, Stored(r, plan.input_items, plan.conversation + ([reply] if reply else [])))
        return r

    if not body.get("stream"):
        try:
            accs = await run_to_end(request, tm, run, shaper)
        except APIError as e:
            raise _renamed(e, plan.origins) from None
        c = shaper.choice(0, accs[0])
        out = Output()
        out.delta(c["message"])
        return ReplyJSON(finished(out, c["finish_reason"]))

    out, seq = Output(), [0]

    def lines(events: list[dict]) -> list[str]:
        sent = []
        for e in events:
            e["sequence_number"] = seq[0]
            seq[0] += 1
            sent.append(event_lines(e))
        return sent

    def render(item: tuple[int, Chunk]) -> list[str]:
        _, ch = item
        shaper.accs[0] = ch.acc
        sent = []
        if seq[0] == 0:  # written now, before the items it would hold grow
            r = response(out, "in_progress", None, None)
            sent = lines([{"type": "response.created", "response": r}, {"type": "response.in_progress", "response": r}])
        if ch.text or ch.finished:
            c = {"finish_reason": finish_reason(ch.acc.last.finished if ch.finished else None)}
            out.delta(shaper.chat_delta(0, ch, c))
            if ch.finished:
                r = finished(out, c["finish_reason"])
                out.events.append({"type": "response.completed" if r["status"] == "completed" else
                                   "response.incomplete", "response": r})
        return sent + lines(out.take())

    def failed(e: APIError) -> list[str]:
        e = _renamed(e, plan.origins)
        r = response(out, "failed", None, None)
        r["error"] = {"code": "server_error" if e.status >= 500 else "invalid_prompt", "message": e.message}
        return lines([{"type": "error", "code": e.code or e.type, "message": e.message, "param": e.param},
                      {"type": "response.failed", "response": r}])

    try:
        return await stream_or_error(request, stream_items(tm, run, shaper), render, failed=failed, done=False)
    except APIError as e:
        raise _renamed(e, plan.origins) from None


def _check_fields(body: dict) -> None:
    """Unknown fields, and those asking for what treadle does not do: a 400 naming them."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise APIError.bad_request(f"unknown field(s): {clip_names(unknown)}", unknown[0])
    check_compat_fields(body, _REFUSED)
    metadata = body.get("metadata")
    if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16
                                 or not all(isinstance(v, str) for v in metadata.values())):
        raise APIError.bad_request("metadata must be an object of at most 16 string values", "metadata")
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
    if include is not None and (not isinstance(include, list) or include):
        raise APIError.bad_request(f"include={quoted(include, 80)} is not supported: treadle fills none of the "
                                   "extra output fields (send [] or leave it out)", "include")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise APIError.bad_request("instructions must be a string", "instructions")


def _renamed(e: APIError, origins: list[str]) -> APIError:
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


def _translate(body: dict, earlier: list[dict]) -> _Plan:
    """The Responses body as a chat body (on a builder thread: it walks the input)."""
    chat: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", "parallel_tool_calls", "stream",
                                                  "rid", "request_id", *_EXTRAS, *OPENAI) if k in body}
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
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
        raise APIError.bad_request("input is required (a string, or a list of items)", "input")
    chat["messages"] = messages
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return _Plan(chat, origins, items, earlier + [m for m, _ in own])


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


# ====================================================================== the response

def _usage(shaper: Shaper, tm: Any, out: Output) -> dict:
    u = shaper.usage()
    cached = u["prompt_tokens_details"]["cached_tokens"]
    reasoning = "".join(p["text"] for item in out.items if item["type"] == "reasoning" for p in item["content"])
    # the reasoning's tokens counted again from its text (the scheduler counts the reply whole)
    thought = len(tm.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning and tm.tokenizer else 0
    return {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
            "total_tokens": u["total_tokens"],
            # the radix cache keeps every prompt: what it did not hold already, it holds now
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": u["prompt_tokens"] - cached},
            "output_tokens_details": {"reasoning_tokens": min(thought, u["completion_tokens"])}}


def _echo(state: ServerState, body: dict, rid: str, created: float, status: str, incomplete: dict | None,
          output: list[dict], usage: dict | None) -> dict:
    """The response object: its output and usage, and the request's settings as OpenAI echoes them."""
    text = body.get("text") or {}
    tools = [{**t, "strict": t.get("strict") is not False} for t in body.get("tools") or []]
    return {"id": rid, "object": "response", "created_at": int(created), "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "background": False, "error": None,
            "incomplete_details": incomplete, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": body.get("max_tool_calls"),
            "metadata": body.get("metadata") or {}, "model": state.model_name, "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": body.get("prompt_cache_key"), "reasoning": {"effort": None, "summary": None},
            "safety_identifier": body.get("safety_identifier"), "service_tier": body.get("service_tier") or "default",
            "store": body.get("store") is not False,
            "temperature": 1.0 if body.get("temperature") is None else body["temperature"],
            "text": {"format": text.get("format") or {"type": "text"}, "verbosity": text.get("verbosity") or "medium"},
            "tool_choice": body.get("tool_choice") or "auto", "tools": tools, "top_logprobs": 0,
            "top_p": 1.0 if body.get("top_p") is None else body["top_p"], "truncation": "disabled",
            "usage": usage, "user": body.get("user")}
