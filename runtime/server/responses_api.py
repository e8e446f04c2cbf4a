"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, and
GET /v1/responses/{id}/input_items.

A Responses body is translated into a /v1/chat/completions body (responses_input.py) and
built and run by the chat path (openai_api.build_chat, prepare, run_to_end, stream_items), so
chat templating, structured outputs, tool calling, usage and abort-on-disconnect are the chat
endpoint's; the reply comes back as output items or typed stream events (responses_output.py).

Stored responses (store: true, the default) are kept in memory with their input items and
conversation: the last STORE_CAPACITY of them, and no more than STORE_CHARS characters of
their texts in all (a conversation's earlier turns counted in each later turn that holds
them); the oldest goes first.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import Response

from treadle.runtime.server.http_server import ServerState, off_loop_if_large, read_json, reply_entries
from treadle.runtime.server.openai_api import Shaper, build_chat, prepare, run_to_end, stream_items
from treadle.runtime.server.protocol import APIError, ReplyJSON, finish_reason, quoted
from treadle.runtime.server.responses_input import LOGPROBS, check_fields, renamed, translate
from treadle.runtime.server.responses_output import Output, event_lines, new_id
from treadle.runtime.server.streaming import stream_or_error
from treadle.runtime.server.tokenizer_manager import Chunk

STORE_CAPACITY = 1000  # stored responses a server keeps (the oldest goes first) ...
STORE_CHARS = 256 << 20  # ... and the characters they keep, in all (Stored.size)


class Stored(NamedTuple):
    response: dict
    input_items: list[dict]  # the request's input, as items with ids
    conversation: list[dict]  # chat messages: the earlier turns, this input and this reply (no instructions)
    # characters it keeps (responses_input.json_size), the whole conversation's included: an
    # earlier turn's messages live as long as a later turn that holds them
    size: int
    conversation_size: int


class ResponseStore:
    """The last stored responses, by id, at most `capacity` of them and `max_chars` characters
    (Stored.size) in all: the oldest goes first; one larger than `max_chars` alone is not kept.
    Used on the event loop only."""

    def __init__(self, capacity: int = STORE_CAPACITY, max_chars: int = STORE_CHARS) -> None:
        self.capacity, self.max_chars = capacity, max_chars
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self.chars = 0  # the entries' sizes, summed

    def put(self, rid: str, entry: Stored) -> None:
        if entry.size > self.max_chars:
            return
        self._entries[rid] = entry
        self.chars += entry.size
        while len(self._entries) > self.capacity or self.chars > self.max_chars:
            self.chars -= self._entries.popitem(last=False)[1].size

    def get(self, rid: str) -> Stored | None:
        return self._entries.get(rid)

    def delete(self, rid: str) -> bool:
        entry = self._entries.pop(rid, None)
        if entry is not None:
            self.chars -= entry.size
        return entry is not None

    def __len__(self) -> int:
        return len(self._entries)


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
        entry = _stored(store, response_id)
        # a large one is written on a builder thread (its size in characters, a fair count of entries)
        return await off_loop_if_large(state.tm, entry.size // 16, lambda: ReplyJSON(entry.response))

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
    async def input_items(response_id: str, request: Request) -> Response:
        entry = _stored(store, response_id)
        items = entry.input_items
        q = request.query_params
        order = q.get("order", "desc")
        limit = q.get("limit", "20")
        if order not in ("asc", "desc"):
            raise APIError.bad_request('order must be "asc" or "desc"', "order")
        # ASCII digits, few of them: str.isdigit() also passes '²' (int() refuses it) and a
        # 5,000-digit run (past int()'s limit), which answered a 500
        if not (limit.isascii() and limit.isdigit() and len(limit) <= 20 and 1 <= int(limit) <= 100):
            raise APIError.bad_request(f"limit must be an integer in [1, 100], got {quoted(limit)}", "limit")
        items = items if order == "asc" else items[::-1]
        after = q.get("after")
        if after is not None:
            at = next((i for i, it in enumerate(items) if it["id"] == after), None)
            if at is None:
                raise APIError.bad_request(f"after: no input item {quoted(after)} in this response", "after")
            items = items[at + 1:]
        page = items[:int(limit)]
        out = {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
               "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)}
        return await off_loop_if_large(state.tm, entry.size // 16, lambda: ReplyJSON(out))


def _stored(store: ResponseStore, rid: str) -> Stored:
    entry = store.get(rid)
    if entry is None:
        raise APIError(f"no response with id {quoted(rid)} is stored here (a server keeps its last "
                       f"{store.capacity:,} stored responses, {store.max_chars:,} characters at most, in memory)",
                       404, "invalid_request_error", "response_id", "response_not_found")
    return entry


# ====================================================================== the request

async def _create(request: Request, state: ServerState, store: ResponseStore, body: dict) -> Response:
    tm = state.tm
    check_fields(body)
    prev = body.get("previous_response_id")
    earlier: list[dict] = []
    earlier_size = 0
    if prev is not None:
        if not isinstance(prev, str):
            raise APIError.bad_request("previous_response_id must be a string", "previous_response_id")
        entry = store.get(prev)
        if entry is None:
            raise APIError(f"previous_response_id: no stored response with id {quoted(prev)} (a server keeps its "
                           f"last {store.capacity:,} stored responses, {store.max_chars:,} characters at most, in "
                           "memory; one sent with store: false is not kept)", 400, "invalid_request_error",
                           "previous_response_id", "previous_response_not_found")
        earlier, earlier_size = entry.conversation, entry.conversation_size
    plan = await tm.off_loop(translate, body, earlier)
    try:
        reqs, tools, think, _ = await build_chat(request, state, plan.chat)
        if plan.chat.get("logprobs") and (tools is not None or think is not None):
            raise APIError.bad_request(f"include {LOGPROBS} (or top_logprobs above 0): logprobs come with a reply "
                                       "of text alone here, not with tools or split-off reasoning", "include")
        run = await prepare(request, state, plan.chat, reqs, True, tools)
    except APIError as e:
        raise renamed(e, plan.origins) from None
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
            kept = out.size()
            store.put(rid, Stored(r, plan.input_items, earlier + plan.new_messages + ([reply] if reply else []),
                                  earlier_size + plan.size + 2 * kept, earlier_size + plan.input_size + kept))
        return r

    if not body.get("stream"):
        try:
            accs = await run_to_end(request, tm, run, shaper)
        except APIError as e:
            raise renamed(e, plan.origins) from None

        def shaped() -> tuple[Output, str | None]:  # a builder thread's work when large (logprobs)
            c = shaper.choice(0, accs[0])
            out = Output()
            if c["logprobs"]:
                out.add_logprobs(c["logprobs"]["content"])
            out.delta(c["message"])
            return out, c["finish_reason"]

        size = reply_entries(accs)
        r = finished(*await off_loop_if_large(tm, size, shaped))  # stored here, on the event loop
        return await off_loop_if_large(tm, size, lambda: ReplyJSON(r))

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
        if ch.logprobs:
            out.add_logprobs(shaper.logprobs(0, ch.ids, ch.logprobs, ch.top_logprobs)["content"])
        if ch.text or ch.finished:
            c = {"finish_reason": finish_reason(ch.acc.last.finished if ch.finished else None)}
            out.delta(shaper.chat_delta(0, ch, c))
            if ch.finished:
                r = finished(out, c["finish_reason"])
                out.events.append({"type": "response.completed" if r["status"] == "completed" else
                                   "response.incomplete", "response": r})
        return sent + lines(out.take())

    def failed(e: APIError) -> list[str]:
        e = renamed(e, plan.origins)
        r = response(out, "failed", None, None)
        r["error"] = {"code": "server_error" if e.status >= 500 else "invalid_prompt", "message": e.message}
        return lines([{"type": "error", "code": e.code or e.type, "message": e.message, "param": e.param},
                      {"type": "response.failed", "response": r}])

    try:
        return await stream_or_error(request, stream_items(tm, run, shaper), render, failed=failed, done=False)
    except APIError as e:
        raise renamed(e, plan.origins) from None


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
            "tool_choice": body.get("tool_choice") or "auto", "tools": tools,
            "top_logprobs": body.get("top_logprobs") or 0,
            "top_p": 1.0 if body.get("top_p") is None else body["top_p"], "truncation": "disabled",
            "usage": usage, "user": body.get("user")}
