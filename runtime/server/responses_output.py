"""The output side of /v1/responses (responses_api.py): output items built from the chat
path's reply, whole or streamed as chat deltas, and the typed stream events that build them.

A reply becomes, in order: a `reasoning` item (when the server splits reasoning off), a
`message` item holding one `output_text` part, and a `function_call` item per tool call. A
reply that is only calls has no message item; one with neither text nor calls has an empty
message, so that `output_text` is always there to read. Streamed, an item is added when its
first piece arrives and done when the next item begins or the reply ends, as OpenAI streams them:

    response.output_item.added -> response.content_part.added -> response.output_text.delta ...
    -> response.output_text.done -> response.content_part.done -> response.output_item.done
    (a call: output_item.added -> function_call_arguments.delta ... -> .done -> output_item.done)
"""
from __future__ import annotations

import copy
import uuid
from typing import Any

from treadle.runtime.server.streaming import sse

# item type -> (its id's prefix, its content part's type, the stream events of that part's text)
_KINDS = {"message": ("msg_", "output_text", "response.output_text"),
          "reasoning": ("rs_", "reasoning_text", "response.reasoning_text")}


# characters a store counts for each item or message beside its text (a dict's own memory)
ITEM_OVERHEAD = 256


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def event_lines(event: dict) -> str:
    """One stream event as Server-Sent Events text, named by its type as OpenAI sends them."""
    return f"event: {event['type']}\n{sse(event)}"


class Output:
    """A response's output items, and the stream events (without sequence numbers) that
    build them, as the reply's pieces come: `reasoning`, `text`, `call`, then `finish`."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.events: list[dict] = []  # not yet sent (`take`)
        self._open: int | None = None  # the item still growing
        self._calls: dict[int, int] = {}  # a chat delta's tool call index -> its item's index
        self._logprobs: list[dict] = []  # token logprobs not yet given to the message's text (add_logprobs)

    def take(self) -> list[dict]:
        out, self.events = self.events, []
        return out

    def _emit(self, type: str, **fields: Any) -> None:
        self.events.append({"type": type, **fields})

    def _begin(self, item: dict) -> int:
        self._end("completed")
        self.items.append(item)
        at = self._open = len(self.items) - 1
        self._emit("response.output_item.added", output_index=at, item=copy.deepcopy(item))
        if item["type"] in _KINDS:
            part = _KINDS[item["type"]][1]
            item["content"].append({"type": part, "text": "", **({"annotations": [], "logprobs": []}
                                                                  if part == "output_text" else {})})
            self._emit("response.content_part.added", item_id=item["id"], output_index=at, content_index=0,
                       part=copy.deepcopy(item["content"][0]))
        return at

    def _end(self, status: str) -> None:
        """Close the open item: its done events, with `status`."""
        at, self._open = self._open, None
        if at is None:
            return
        item = self.items[at]
        item["status"] = status
        if item["type"] in _KINDS:
            part, events = item["content"][0], _KINDS[item["type"]][2]
            extra = {"logprobs": part["logprobs"]} if item["type"] == "message" else {}
            self._emit(events + ".done", item_id=item["id"], output_index=at, content_index=0, text=part["text"],
                       **extra)
            self._emit("response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                       part=copy.deepcopy(part))
        else:
            self._emit("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                       name=item["name"], arguments=item["arguments"])
        self._emit("response.output_item.done", output_index=at, item=copy.deepcopy(item))

    def _grow(self, kind: str, text: str, empty: bool = False) -> None:
        """Add `text` to the open item of `kind`, or to a new one (begun even for no text with `empty`)."""
        if not text and not empty:
            return
        at = self._open
        if at is None or self.items[at]["type"] != kind:
            item: dict = {"id": new_id(_KINDS[kind][0]), "type": kind, "status": "in_progress", "content": []}
            if kind == "message":
                item["role"] = "assistant"
            else:
                item["summary"] = []
            at = self._begin(item)
        item = self.items[at]
        if not text:
            return
        item["content"][0]["text"] += text
        extra = {}
        if kind == "message":  # the logprobs of the tokens written since the last delta
            extra["logprobs"], self._logprobs = self._logprobs, []
            item["content"][0]["logprobs"] += extra["logprobs"]
        self._emit(_KINDS[kind][2] + ".delta", item_id=item["id"], output_index=at, content_index=0, delta=text,
                   **extra)

    def add_logprobs(self, entries: list[dict]) -> None:
        """Token logprobs (chat's `logprobs.content` entries), given to the message's text with
        its next delta, or when the reply ends (the end token's, which writes no text)."""
        self._logprobs += entries

    def reasoning(self, text: str) -> None:
        self._grow("reasoning", text)

    def text(self, text: str) -> None:
        self._grow("message", text)

    def call(self, piece: dict) -> None:
        """A chat tool call, or its streamed piece ({"index", "id"?, "function": {"name"?,
        "arguments"?}}): a piece with an id begins a function_call item, the call's id its call_id."""
        fn = piece.get("function") or {}
        index = piece.get("index", len(self._calls))
        if "id" in piece or index not in self._calls:
            self._calls[index] = self._begin({"id": new_id("fc_"), "type": "function_call", "status": "in_progress",
                                              "call_id": piece.get("id") or new_id("call_"),
                                              "name": fn.get("name", ""), "arguments": ""})
        at = self._calls[index]
        if fn.get("arguments"):
            self.items[at]["arguments"] += fn["arguments"]
            self._emit("response.function_call_arguments.delta", item_id=self.items[at]["id"], output_index=at,
                       delta=fn["arguments"])

    def delta(self, delta: dict) -> None:
        """A chat delta (or a whole chat message): its reasoning, text, then tool calls."""
        self.reasoning(delta.get("reasoning_content") or "")
        self.text(delta.get("content") or "")
        for i, piece in enumerate(delta.get("tool_calls") or ()):
            self.call(piece if "index" in piece else {**piece, "index": i})

    def finish(self, finish_reason: str | None) -> tuple[str, dict | None]:
        """Close the reply; its status and incomplete_details. A reply cut by the token limit
        is "incomplete" (its last item too), an aborted one "cancelled"."""
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            self._grow("message", "", empty=True)
        if self._logprobs and self._open is not None and self.items[self._open]["type"] == "message":
            self.items[self._open]["content"][0]["logprobs"] += self._logprobs
        self._logprobs = []
        self._end("incomplete" if finish_reason in ("length", "abort") else "completed")
        if finish_reason == "length":
            return "incomplete", {"reason": "max_output_tokens"}
        return ("cancelled" if finish_reason == "abort" else "completed"), None

    def size(self) -> int:
        """Characters the items keep: their texts and arguments, and ITEM_OVERHEAD each."""
        texts = sum(len(p["text"]) for item in self.items for p in item.get("content", ()))
        return texts + sum(len(item.get("arguments", "")) + ITEM_OVERHEAD for item in self.items)

    def text_of(self) -> str:
        """The text of the message items (the client's `output_text`)."""
        return "".join(p["text"] for item in self.items if item["type"] == "message" for p in item["content"])

    def as_message(self) -> dict | None:
        """The reply as an assistant chat message (for the next turn of previous_response_id):
        its text and its calls; None when it has neither. Reasoning stays out, as chat
        templates leave an earlier turn's reasoning out."""
        calls = [{"id": item["call_id"], "type": "function",
                  "function": {"name": item["name"], "arguments": item["arguments"]}}
                 for item in self.items if item["type"] == "function_call"]
        text = self.text_of()
        if not text and not calls:
            return None
        return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
