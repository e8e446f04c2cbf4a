"""OpenAI's Responses API through the router: which replica holds each stored response.

A replica keeps its stored responses in its own memory (server/responses_api.ResponseStore),
so a request that names one (`previous_response_id`, or GET / DELETE /v1/responses/{id},
its /input_items and /cancel) must reach that replica. The router remembers, for each
response it relayed, the replica that answered it: a non-streamed response's `id` is read
from its body, a streamed one's from its first event (`response.created`), relayed on as it
came. Kept so rather than encoded in the id: the replicas' ids and API stay OpenAI's and
their own, and nothing ties a response to a replica's position in the router's list.

Bounded as the replicas' stores are (STORE_CAPACITY each, the oldest first), so the router
never knows more ids than its replicas can hold. An id it forgot (or never saw: one made
before the router started) goes to each healthy replica in turn until one does not answer
"not held" (router.forward), so the client hears a replica's own answer: a 401 for a wrong
API key, the replica's 404 (400 as `previous_response_id`), or the response of the one that
holds it (its home from then on). A replica that is gone (connection refused: a restart)
takes its ids with it, and one that answers "not found" for an id drops that id.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

RESPONSES_PATH = "/v1/responses"
# server/responses_api.STORE_CAPACITY: the stored responses one replica keeps (not imported:
# that module brings the server's whole request path into the router)
STORE_CAPACITY = 1000


class ResponseHomes:
    """Response id -> index of the replica that stores it, at most `capacity` ids (the least
    recently named goes first). Used on the router's event loop only."""

    def __init__(self, capacity: int) -> None:
        assert capacity >= 1
        self.capacity = capacity
        self._homes: OrderedDict[str, int] = OrderedDict()

    def put(self, rid: str, replica: int) -> None:
        self._homes[rid] = replica
        self._homes.move_to_end(rid)
        while len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def get(self, rid: str) -> int | None:
        """The replica holding `rid` (None: not known); named, it is kept longer."""
        replica = self._homes.get(rid)
        if replica is not None:
            self._homes.move_to_end(rid)
        return replica

    def forget(self, rid: str) -> None:
        self._homes.pop(rid, None)

    def forget_replica(self, replica: int) -> None:
        """Drop every id of `replica` (its process is gone, and its store with it)."""
        for rid in [r for r, i in self._homes.items() if i == replica]:
            del self._homes[rid]

    def __len__(self) -> int:
        return len(self._homes)


def stored_response_id(payload: bytes, streamed: bool) -> str | None:
    """The id of the stored response a replica's 200 answer to POST /v1/responses holds: the
    body's (`streamed` False), or the first event's `response` (`streamed`: `payload` holds
    at least that whole event). None for one sent with store: false, or anything else."""
    try:
        if streamed:
            event = payload.split(b"\n\n", 1)[0].decode()
            data = "\n".join(line[5:].removeprefix(" ") for line in event.splitlines() if line.startswith("data:"))
            obj: Any = json.loads(data).get("response")
        else:
            obj = json.loads(payload)
    except (ValueError, AttributeError, RecursionError):  # not JSON, not an object: nothing to remember
        return None
    if not isinstance(obj, dict) or obj.get("object") != "response" or obj.get("store") is False:
        return None
    rid = obj.get("id")
    return rid if isinstance(rid, str) else None


def responses_routing_text(obj: dict) -> str:
    """What a Responses request's prompt begins with: its instructions, then its input (a
    string, or its items as JSON one after another)."""
    parts = [obj["instructions"]] if isinstance(obj.get("instructions"), str) else []
    inp = obj.get("input")
    if isinstance(inp, str):
        parts.append(inp)
    elif isinstance(inp, list):
        parts += [json.dumps(item, sort_keys=True, ensure_ascii=False) for item in inp]
    return "".join(parts)
