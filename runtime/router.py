"""The data-parallel router: one HTTP front for N replica servers.

    python -m treadle.runtime.router --worker http://127.0.0.1:30001 --worker http://127.0.0.1:30002 \\
        --port 30000 --policy cache_aware
    python -m treadle.runtime.router --launch-replicas 2 --port 30000 [server flags ...]

Forwards POST /generate, /v1/completions, /v1/chat/completions, /v1/responses, /tokenize and /detokenize
(SSE relayed byte for byte; a client that disconnects, streamed or not, closes the upstream
request, so the replica aborts), sends a Responses request with `previous_response_id` and
GET / DELETE /v1/responses/{id} (/input_items, POST /cancel) to the replica that stores that
response (`router_responses.py`), and
serves GET /health (its own), /v1/models, /get_model_info, /version, /health_generate (a
replica's), /get_server_info (replicas aggregated + router stats), /metrics (the router's own, per replica: `router_metrics.py`),
POST /flush_cache and /abort_request (broadcast).

Which replica gets a request is the policy's choice (`router_policy.py`). A background task
polls every replica's /health; a dead one leaves the rotation until it answers again. A
request whose connection to a replica cannot be opened (so no byte reached it) is retried on
another replica; once sent, it is never replayed. Every response names the replica in the
`X-Treadle-Replica` header.

SIGTERM / SIGINT: the router takes no new connection and gives open responses
`--shutdown-grace-s` to end, then ends them itself (a stream with an error event and [DONE], a
request still waiting with a 503; their replicas see the upstream request gone and abort)
and exits, stopping the replicas it launched.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import logging
import shlex
import subprocess
import sys
import time
import urllib.parse
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from treadle.runtime.router_metrics import RouterMetrics
from treadle.runtime.router_policy import CacheAwareConfig, make_policy
from treadle.runtime.router_responses import (
    RESPONSES_PATH, STORE_CAPACITY, ResponseHomes, responses_routing_text, stored_response_id,
)
from treadle.runtime.server.protocol import (
    PIECEWISE_PARSE_BYTES, APIError, add_cors, add_error_handlers, body_deadline, error_body, loads_in_pieces,
    parse_abort_request, parse_json_object, quoted, read_body,
)
from treadle.runtime.server.streaming import AbortOnDisconnectStream, ClientGone, until_done_or_disconnect

log = logging.getLogger("treadle.router")

REPLICA_HEADER = "X-Treadle-Replica"
# the client's headers a replica reads: its API key; the body's type and encoding (a compressed
# body is the replica's 415 naming its Content-Encoding, not "not valid JSON"); and the Host a
# keyless replica checks against DNS rebinding (--allowed-hosts): left behind, a rebinding page
# read the replicas' answers through the router. A browser Origin is the router's to check
# (_ForeignOrigin), against the --allowed-origins its CORS headers name
_FORWARDED_HEADERS = ("content-type", "content-encoding", "authorization", "host")
HEALTH_TIMEOUT_S = 5.0
HEALTH_GENERATE_TIMEOUT_S = 40.0  # a replica's own probe answers 503 after 30 s without a token
HEALTH_FAILURES_TO_DROP = 3
CLOSE_MARGIN_S = 2.0  # after the grace, how long responses get to end before uvicorn cancels them


@dataclass(frozen=True)
class RouterArgs:
    workers: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "cache_aware"
    health_interval_s: float = 1.0
    cache: CacheAwareConfig = CacheAwareConfig()
    max_request_bytes: int = 64 << 20  # a larger body is a 413, before the router holds it whole
    allowed_origins: str = ""  # CORS, as the server's --allowed-origins; none by default
    request_body_timeout_s: float = 30.0  # as the server's: a body not in whole by then is a 408


@dataclass(slots=True)
class Replica:
    url: str
    healthy: bool = False
    in_flight: int = 0  # requests sent and not yet answered / streamed to the end
    connect_failures: int = 0
    health_failures: int = 0  # consecutive failed (not refused) health checks
    times_dropped: int = 0  # how often it left the rotation
    prompt_chars: int = 0  # of the requests routed here
    matched_chars: int = 0  # of those, chars the router's tree had seen here before
    responses: collections.Counter = field(default_factory=collections.Counter)  # answered, by HTTP status
    failures: int = 0  # requests it failed after taking them: answered 502, or a stream ended by an error event

    @property
    def routed(self) -> int:
        return sum(self.responses.values())

    @property
    def prefix_match_rate(self) -> float:
        return self.matched_chars / max(1, self.prompt_chars)

    def stats(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "in_flight": self.in_flight, "routed": self.routed,
                "connect_failures": self.connect_failures, "failures": self.failures,
                "times_dropped": self.times_dropped,
                "prefix_match_rate": self.prefix_match_rate}


def _read_for_routing(path: str, body: bytes) -> tuple[Any, str]:
    """The body's JSON (None where it is no JSON a replica would read: it answers that with its
    own 400) and its routing text; a 400 for a body that nests too deeply, as a replica's."""
    try:
        if len(body) < PIECEWISE_PARSE_BYTES:
            obj = json.loads(body)
        else:
            obj = loads_in_pieces(body.decode(json.detect_encoding(body), "surrogatepass"))
    except ValueError:  # not JSON, not UTF-8, an integer of more than 4,300 digits
        obj = None  # a replica answers it with a proper 400
    except RecursionError as e:  # as a replica would say (it could not be parsed here either)
        raise APIError.bad_request("the request body nests too deeply") from e
    return obj, routing_text(path, obj)


def routing_text(path: str, obj: Any) -> str:
    """The text whose prefix decides placement: the prompt (the first one of a batch), token
    ids as "ids:1,2,3,", or the chat messages as JSON one after another (appending a turn
    extends the prefix)."""
    if not isinstance(obj, dict):
        return ""
    try:
        if path == RESPONSES_PATH:
            return responses_routing_text(obj)
        if path == "/v1/chat/completions":
            msgs = obj.get("messages")
            if not isinstance(msgs, list):
                return ""
            return "".join(json.dumps(m, sort_keys=True, ensure_ascii=False) for m in msgs)
    except RecursionError:
        # a message nested just short of what json.loads read, written back from a few frames
        # deeper: the router answered a plain-text 500. Placed by load instead, the replica
        # answers it (its own 400 for a body that nests too deeply)
        return ""
    p = obj.get("prompt") if path == "/v1/completions" else obj.get("text", obj.get("input_ids"))
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        p = p[0]  # a batch: place it by its first prompt
    if isinstance(p, str):
        return p
    if isinstance(p, list) and all(isinstance(x, int) for x in p):
        return "ids:" + "".join(f"{x}," for x in p)
    return ""


class _RelayStream(AbortOnDisconnectStream):
    """An SSE relay that runs `on_close` however it ends (done, client gone, or never
    started), which closes the upstream stream and releases the replica."""

    def __init__(self, content: Any, on_close: Callable[[], Awaitable[None]], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            # a copy: the relayed chunks need not end between two events, so no half-close probe
            # (http_protocol: an SSE comment, for a stream marked in its scope) may go between them
            await super().__call__({**scope}, receive, send)
        finally:
            await self._on_close()


class Router:
    def __init__(self, args: RouterArgs) -> None:
        if not args.workers:
            raise ValueError("the router needs at least one replica: pass --worker URL (or --launch-replicas N)")
        self.args = args
        self.replicas = [Replica(u.rstrip("/")) for u in args.workers]
        self.policy = make_policy(args.policy, len(self.replicas), args.cache)
        # no read timeout: a long generation may be silent for a while before its answer
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self.started = time.time()
        # which replica stores each response it relayed: bounded as their stores are
        self.response_homes = ResponseHomes(STORE_CAPACITY * len(self.replicas))
        self.no_replica = 0  # requests refused with 503: no healthy replica left to try
        # set once a SIGTERM's grace period is over: open responses end themselves (a stream
        # with an error event and [DONE], a wait with a 503) before uvicorn would cancel them
        self.closing = asyncio.Event()

    # ---- health ----

    async def check_health(self) -> None:
        """One round: GET /health on every replica. A refused connection takes a replica out
        at once (its process is gone); a slow or failing answer only after
        `HEALTH_FAILURES_TO_DROP` in a row, so a replica busy with a long prefill does not flap."""
        async def one(i: int, r: Replica) -> None:
            try:
                ok = (await self.client.get(r.url + "/health", timeout=HEALTH_TIMEOUT_S)).status_code == 200
            except httpx.ConnectError:
                self._set_health(i, False, gone=True)
                return
            except httpx.HTTPError:
                ok = False
            r.health_failures = 0 if ok else r.health_failures + 1
            if ok or r.health_failures >= HEALTH_FAILURES_TO_DROP:
                self._set_health(i, ok)

        await asyncio.gather(*(one(i, r) for i, r in enumerate(self.replicas)))

    def _set_health(self, i: int, ok: bool, gone: bool = False) -> None:
        """Flip a replica in or out of rotation; `gone` (connection refused) also forgets what
        the policy knows of its cache, which a restarted process will not have."""
        r = self.replicas[i]
        if gone:
            self.policy.on_unhealthy(i)
            self.response_homes.forget_replica(i)  # a restarted process stores none of them
        if ok != r.healthy:
            log.warning("replica %s is %s", r.url, "healthy: back in rotation" if ok else "unhealthy: out of rotation")
            r.times_dropped += 0 if ok else 1
        r.healthy = ok

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.args.health_interval_s)
            await self.check_health()

    # ---- forwarding ----

    async def forward(self, request: Request, path: str, method: str = "POST",
                      stored: tuple[str, int] | None = None) -> Response:
        """Send the request to a replica the policy picks, or, with `stored` (a response id
        and the replica that stores it), to that one only; relay its answer."""
        body = await read_body(request, self.args.max_request_bytes)
        if method != "POST":
            obj, text = None, ""
        elif len(body) < PIECEWISE_PARSE_BYTES:
            obj, text = _read_for_routing(path, body)
        else:
            # on a thread, and parsed in short pieces (json's C parser holds the GIL for a whole
            # call): a 48 MB body (/detokenize of 8M ids) parsed and written as routing text here
            # held the event loop 2 s, every other stream and /health of the router waiting
            obj, text = await asyncio.to_thread(_read_for_routing, path, body)
        stream = isinstance(obj, dict) and obj.get("stream") is True
        creates = path == RESPONSES_PATH  # a response the replica may store: remember where
        if creates and isinstance(obj, dict) and isinstance(obj.get("previous_response_id"), str):
            prev = obj["previous_response_id"]
            stored = (prev, self.response_homes.get(prev))
        # an id of no known home (never relayed here, forgotten, or made before the router
        # started): each healthy replica in turn is asked, so the client hears a replica's own
        # answer (a 401 for a wrong API key; "not held" from the last one) and one that holds
        # it answers it
        probing = stored is not None and stored[1] is None
        headers = forwarded_headers(request)
        tried: set[int] = set()
        while True:
            cands = [i for i, r in enumerate(self.replicas) if r.healthy and i not in tried]
            if stored is not None and not probing:
                cands = [i for i in cands if i == stored[1]]
                if not cands:  # out of rotation, or it failed just now: no other replica has the response
                    self.no_replica += 1
                    raise APIError(f"the replica that stores response {stored[0]!r} "
                                   f"({self.replicas[stored[1]].url}) is out of rotation", 503,
                                   "server_overloaded", None, "no_healthy_replica")
            if not cands:
                self.no_replica += 1
                raise APIError("no healthy replica to serve the request" + (" (tried all)" if tried else ""),
                               503, "server_overloaded", None, "no_healthy_replica")
            if probing:
                idx, matched = cands[0], 0
            elif stored is not None:
                idx, matched = stored[1], 0
            else:
                idx, matched = self.policy.choose(text, cands, [r.in_flight for r in self.replicas])
            tried.add(idx)
            rep = self.replicas[idx]
            rep.in_flight += 1
            # record the placement now, not once the replica answers: requests of the same
            # prefix arriving meanwhile must see it (a failed connect clears this tree anyway)
            self.policy.on_routed(idx, text)
            try:
                resp = await self._send_watching_client(request, self.client.build_request(
                    method, rep.url + path, content=body if method == "POST" else None, headers=headers))
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                # nothing reached the replica: safe to place the request elsewhere
                rep.in_flight -= 1
                rep.connect_failures += 1
                log.warning("cannot connect to %s (%s); retrying elsewhere", rep.url, e)
                if isinstance(e, httpx.ConnectError):  # refused: the process is gone (a timeout may be load)
                    self._set_health(idx, False, gone=True)
                continue
            except BaseException as e:
                rep.in_flight -= 1
                if isinstance(e, httpx.HTTPError):
                    raise self._failed(rep, e) from e
                raise
            if resp.status_code == 503 and stored is None and \
                    any(r.healthy and i not in tried for i, r in enumerate(self.replicas)):
                await resp.aclose()  # overloaded or draining: it ran nothing, so another may take it
                rep.in_flight -= 1
                continue
            if probing and any(r.healthy and i not in tried for i, r in enumerate(self.replicas)):
                try:
                    not_held = await _not_held(resp)
                except httpx.HTTPError as e:  # it broke off inside its short error answer
                    rep.in_flight -= 1
                    await resp.aclose()
                    raise self._failed(rep, e) from e
                if not_held:
                    await resp.aclose()  # it ran nothing: the next replica may hold the id
                    rep.in_flight -= 1
                    continue
            if probing and resp.status_code == 200 and method != "DELETE":
                self.response_homes.put(stored[0], idx)  # found: it lives there
                stored = (stored[0], idx)
            rep.prompt_chars += len(text)
            rep.matched_chars += matched
            seen = None
            if creates and resp.status_code == 200:
                seen = functools.partial(self._remember_response, idx, stream)
            elif stored is not None and path != RESPONSES_PATH:  # GET, DELETE or cancel of a stored one
                self._after_stored(stored[0], resp, method)
            return await self._relay(request, resp, rep, stream, seen)

    def _remember_response(self, idx: int, streamed: bool, payload: bytes) -> None:
        """Note replica `idx` as the home of the stored response its answer holds (if any)."""
        rid = stored_response_id(payload, streamed)
        if rid is not None:
            self.response_homes.put(rid, idx)

    def _after_stored(self, rid: str, resp: httpx.Response, method: str) -> None:
        """Forget `rid` once its replica deleted it, or says it does not hold it (its store
        let it go first)."""
        if (method == "DELETE" and resp.status_code == 200) or resp.status_code == 404:
            self.response_homes.forget(rid)

    async def forward_stored(self, request: Request, method: str, rid: str, sub: str = "") -> Response:
        """GET / DELETE /v1/responses/{rid}{sub}, or POST its /cancel, on the replica that
        stores it (each in turn if the router does not know it: see forward)."""
        home = self.response_homes.get(rid)
        path = f"{RESPONSES_PATH}/{urllib.parse.quote(rid, safe='')}{sub}"
        if request.url.query:
            path += "?" + request.url.query
        return await self.forward(request, path, method, stored=(rid, home))

    async def _send_watching_client(self, request: Request, req: httpx.Request) -> httpx.Response:
        """Send `req` and wait for the replica's response headers, but give up (ClientGone) if
        the client disconnects meanwhile. A non-streamed replica sends its headers only when
        the answer is done, so without this the replica would generate on for a client long
        gone; cancelling the send closes the upstream connection, and the replica aborts."""
        task = asyncio.ensure_future(self.client.send(req, stream=True))
        try:
            return await until_done_or_disconnect(request, self._unless_closing(task))
        except ClientGone:
            if task.done() and not task.cancelled() and task.exception() is None:
                await task.result().aclose()  # the headers came just as the client left
            raise

    async def _relay(self, request: Request, resp: httpx.Response, rep: Replica, stream: bool,
                     seen: Callable[[bytes], None] | None = None) -> Response:
        """Relay the replica's answer; `seen` gets the whole body of one not streamed, or the
        beginning of a stream up to its first whole event (all of it, if shorter)."""
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                rep.in_flight -= 1
                await resp.aclose()

        hdrs = {REPLICA_HEADER: rep.url}
        ctype = resp.headers.get("content-type", "application/json")
        if stream and resp.status_code == 200:
            tail = b""  # the last bytes relayed: does the stream stand between two events?

            def last_event(message: str, type_: str, code: str) -> bytes:
                # a replica cut off inside an event: end that one first, so the error is an event
                sep = b"" if tail in (b"", b"\n\n") else b"\n\n"
                return sep + f"data: {json.dumps(error_body(message, type_, None, code))}\n\ndata: [DONE]\n\n".encode()

            async def relay():
                nonlocal tail
                head = b"" if seen is not None else None  # the stream's beginning, until its first event ends
                chunks = resp.aiter_raw().__aiter__()
                closing = asyncio.ensure_future(self.closing.wait())
                nxt = None
                try:
                    while True:
                        nxt = asyncio.ensure_future(chunks.__anext__())
                        await asyncio.wait((nxt, closing), return_when=asyncio.FIRST_COMPLETED)
                        if not nxt.done():  # shutting down: end the stream as a stream ends
                            nxt.cancel()
                            yield last_event("the router is shutting down", "server_overloaded", "server_overloaded")
                            return
                        try:
                            chunk = nxt.result()
                        except StopAsyncIteration:
                            if head:
                                seen(head)
                            return
                        if chunk:
                            tail = (tail + chunk)[-2:]
                        if head is not None:
                            head += chunk
                            if b"\n\n" in head or len(head) > self.args.max_request_bytes + (1 << 20):
                                seen(head)  # the first event echoes the request: bounded by its size
                                head = None
                        yield chunk
                except httpx.HTTPError as e:  # the replica died mid-stream
                    rep.failures += 1
                    yield last_event(f"replica {rep.url} failed mid-stream: {type(e).__name__}", "server_error",
                                     "replica_failed")
                finally:  # also when the client left (the relay is closed mid-wait)
                    closing.cancel()
                    if nxt is not None and not nxt.done():
                        nxt.cancel()

            rep.responses[200] += 1
            return _RelayStream(relay(), release, status_code=200, media_type=ctype,
                                headers={**hdrs, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            data = await until_done_or_disconnect(request, self._unless_closing(resp.aread()))
        except httpx.HTTPError as e:
            raise self._failed(rep, e) from e
        finally:
            await release()  # on a disconnect this closes the upstream connection: the replica aborts
        rep.responses[resp.status_code] += 1
        if seen is not None:
            seen(data)
        return Response(data, status_code=resp.status_code, media_type=ctype, headers=hdrs)

    @staticmethod
    def _failed(rep: Replica, e: httpx.HTTPError) -> APIError:
        """The 502 for a request `rep` took and failed (counted among its answers and failures)."""
        rep.failures += 1
        rep.responses[502] += 1
        return APIError(f"replica {rep.url} failed: {type(e).__name__}: {e}", 502, "server_error")

    async def _unless_closing(self, aw: Awaitable[Any]) -> Any:
        """``aw``'s result, or a 503 once the router closes (``aw`` is cancelled: its upstream
        connection closes, and the replica aborts); ``aw`` is cancelled too when this is (the
        client left)."""
        task, closing = asyncio.ensure_future(aw), asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait((task, closing), return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            raise APIError("the router is shutting down", 503, "server_overloaded", None, "server_overloaded")
        finally:
            closing.cancel()
            if not task.done():
                task.cancel()

    async def get_any(self, path: str, request: Request | None = None, timeout_s: float = 10.0) -> Response:
        """A read-only GET answered by the first healthy replica that responds (with the
        client's forwarded headers: its API key)."""
        headers = forwarded_headers(request) if request else []
        for r in [r for r in self.replicas if r.healthy]:
            try:
                resp = await self.client.get(r.url + path, timeout=timeout_s, headers=headers)
            except httpx.HTTPError:
                continue
            return Response(resp.content, resp.status_code, media_type=resp.headers.get("content-type"),
                            headers={REPLICA_HEADER: r.url})
        raise APIError("no healthy replica to answer", 503, "server_overloaded", None, "no_healthy_replica")

    async def broadcast(self, method: str, path: str, body: bytes = b"",
                        request: Request | None = None) -> list[httpx.Response | None]:
        """Send to every healthy replica (with the client's forwarded headers: its API key);
        None where it failed (or the replica is out)."""
        headers = forwarded_headers(request) if request else []
        if not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("content-type", "application/json"))

        async def one(r: Replica) -> httpx.Response | None:
            if not r.healthy:
                return None
            try:
                return await self.client.request(method, r.url + path, content=body, timeout=30.0, headers=headers)
            except httpx.HTTPError:
                return None

        return list(await asyncio.gather(*(one(r) for r in self.replicas)))

    async def server_info(self, request: Request | None = None) -> dict | Response:
        infos = await self.broadcast("GET", "/get_server_info", request=request)
        refused = _refusal(self.replicas, infos)
        if refused is not None:  # the client's API key: no replica's info, nor the router's, for it
            return refused
        reps = []
        for r, resp in zip(self.replicas, infos):
            info = _json_object(resp) if resp is not None and resp.status_code == 200 else None
            reps.append({**r.stats(), "server_info": info})
        live = [x["server_info"] for x in reps if x["server_info"]]
        total = {k: sum(i.get(k, 0) for i in live) for k in ("prompt_tokens", "cached_tokens", "num_running",
                                                              "num_waiting")}
        # SGLang's per-scheduler states, each live replica's: sglang.bench_serving reads
        # internal_states[0] of a server's answer (a KeyError through the router before)
        states = [st for i in live for st in (i.get("internal_states") or []) if isinstance(st, dict)]
        return {**total, "internal_states": states,
                "cache_hit_rate": total["cached_tokens"] / max(1, total["prompt_tokens"]),
                "router": {"policy": self.policy.name, "num_healthy": sum(r.healthy for r in self.replicas),
                           "uptime_s": round(time.time() - self.started, 1)},
                "replicas": reps}


async def _not_held(resp: httpx.Response) -> bool:
    """Whether a replica's answer says it does not hold the stored response a request named:
    a 404 `response_not_found`, or a 400 `previous_response_not_found` (nothing ran)."""
    if resp.status_code not in (400, 404):
        return False
    await resp.aread()  # a short error body
    err = (_json_object(resp) or {}).get("error")
    return isinstance(err, dict) and err.get("code") in ("response_not_found", "previous_response_not_found")


def forwarded_headers(request: Request) -> list[tuple[str, str]]:
    """The client's headers a replica needs too (its API key, the body's type), every line
    of them: a replica refuses two Authorization lines, which the router must not make one."""
    return [(k, v) for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS]


def _json_object(resp: httpx.Response) -> dict | None:
    """The replica's JSON object body; None for anything else (one that is not a treadle server,
    or that broke off), so one odd replica does not fail a broadcast's answer."""
    try:
        body = resp.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _refusal(replicas: list[Replica], res: list[httpx.Response | None]) -> Response | None:
    """The first answer, relayed, when every replica that answered a broadcast refused the
    client's credentials (401 / 403: a wrong or missing API key); else None."""
    answered = [(r, x) for r, x in zip(replicas, res) if x is not None]
    if not answered or any(x.status_code not in (401, 403) for _, x in answered):
        return None
    r, x = answered[0]
    return Response(x.content, x.status_code, media_type=x.headers.get("content-type"),
                    headers={REPLICA_HEADER: r.url, **({"WWW-Authenticate": x.headers["www-authenticate"]}
                                                       if "www-authenticate" in x.headers else {})})


def _flush_failure(resp: httpx.Response | None) -> str:
    if resp is None:
        return "no answer"
    body = _json_object(resp)
    return str(body.get("message") if body and body.get("message") else f"HTTP {resp.status_code}")


def create_router_app(args: RouterArgs) -> FastAPI:
    router = Router(args)

    @asynccontextmanager
    async def lifespan(app_: FastAPI):
        app_.state.loop = asyncio.get_running_loop()  # for the SIGTERM handler (run)
        await router.check_health()  # know who is up before the first request
        task = asyncio.create_task(router.health_loop())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await router.client.aclose()

    app = FastAPI(title="treadle-router", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.router = router
    app.state.loop = None

    add_error_handlers(app)  # APIError, 404 / 405 in the OpenAI error shape, as a replica's

    @app.exception_handler(ClientGone)
    async def _client_gone(_: Request, e: ClientGone) -> Response:
        return Response(status_code=499)

    for path in ("/generate", "/v1/completions", "/v1/chat/completions", RESPONSES_PATH, "/tokenize",
                 "/detokenize"):
        async def post(request: Request, _path: str = path) -> Response:
            return await router.forward(request, _path)

        app.add_api_route(path, post, methods=["POST"])

    # a replica's read-only GETs, under SGLang's newer names too (as a replica serves them);
    # /health_generate, the probe of SGLang's router, runs one token through a replica (the
    # router's own /health says only that one is in rotation)
    for path in ("/v1/models", "/get_model_info", "/model_info", "/version", "/health_generate"):
        async def get(request: Request, _path: str = path) -> Response:
            return await router.get_any(_path, request, timeout_s=HEALTH_GENERATE_TIMEOUT_S
                                        if _path == "/health_generate" else 10.0)

        app.add_api_route(path, get, methods=["GET"])

    # a stored response lives on one replica (router_responses.py)
    @app.get(RESPONSES_PATH + "/{response_id}")
    async def get_response(response_id: str, request: Request) -> Response:
        return await router.forward_stored(request, "GET", response_id)

    @app.delete(RESPONSES_PATH + "/{response_id}")
    async def delete_response(response_id: str, request: Request) -> Response:
        return await router.forward_stored(request, "DELETE", response_id)

    @app.get(RESPONSES_PATH + "/{response_id}/input_items")
    async def response_input_items(response_id: str, request: Request) -> Response:
        return await router.forward_stored(request, "GET", response_id, "/input_items")

    @app.post(RESPONSES_PATH + "/{response_id}/cancel")
    async def cancel_response(response_id: str, request: Request) -> Response:
        return await router.forward_stored(request, "POST", response_id, "/cancel")

    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> Response:
        # quoted whole: "../" in a name must not walk out of /v1/models on the replica
        return await router.get_any("/v1/models/" + urllib.parse.quote(model, safe=""), request)

    @app.get("/health")
    async def health() -> Response:
        if not any(r.healthy for r in router.replicas):
            return JSONResponse(error_body("no healthy replica", "server_overloaded", None, "no_healthy_replica"), 503)
        return Response(status_code=200)

    @app.get("/get_server_info")
    @app.get("/server_info")  # SGLang's newer name of the route, as a replica's
    async def get_server_info(request: Request) -> Any:
        return await router.server_info(request)

    metrics = RouterMetrics(router)

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/flush_cache")
    async def flush_cache(request: Request) -> Response:
        if not any(r.healthy for r in router.replicas):
            raise APIError("no healthy replica to flush", 503, "server_overloaded", None, "no_healthy_replica")
        res = await router.broadcast("POST", "/flush_cache", request=request)
        refused = _refusal(router.replicas, res)
        if refused is not None:  # nothing was flushed: the client hears why, as from a replica
            return refused
        router.policy.reset()
        failed = [f"{r.url}: {_flush_failure(x)}" for x, r in zip(res, router.replicas)
                  if r.healthy and (x is None or x.status_code != 200)]
        if failed:  # which replica said no, and why (one still running requests, one down)
            return JSONResponse({"success": False, "message": "not flushed on " + "; ".join(failed)}, 400)
        skipped = [r.url for r in router.replicas if not r.healthy]  # its cache is gone if it restarts
        return JSONResponse({"success": True, **({"skipped_out_of_rotation": skipped} if skipped else {})})

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await read_body(request, args.max_request_bytes)
        parse_abort_request(parse_json_object(body))  # a 400 as a replica's, before asking them all
        res = await router.broadcast("POST", "/abort_request", body, request)
        answered = [(r, x) for r, x in zip(router.replicas, res) if x is not None]
        if answered and all(400 <= x.status_code < 500 for _, x in answered):
            # every replica refused it (a wrong API key): the client hears why, not "nothing to stop"
            r, x = answered[0]
            return Response(x.content, x.status_code, media_type=x.headers.get("content-type"),
                            headers={REPLICA_HEADER: r.url})
        return JSONResponse({"success": any(x.status_code == 200 and (_json_object(x) or {}).get("success")
                                            for _, x in answered)})

    app.add_middleware(_BodyDeadline, timeout_s=args.request_body_timeout_s)
    app.add_middleware(_HeadAsGet)
    app.add_middleware(_ForeignOrigin, allowed_origins=args.allowed_origins)
    add_cors(app, args.allowed_origins)
    return app


class _BodyDeadline:
    """The whole request body must be in within `timeout_s` of its headers, or reading it
    raises a 408 (the connection then closes), as a replica's --request-body-timeout-s: a client
    that sent a Content-Length and then trickled the body, or none of it (slowloris), held its
    connection and handler forever. Once the body is in, `receive` is uvicorn's own again (a
    relay waits on it for the client's disconnect, as long as its answer lasts)."""

    def __init__(self, app: Any, timeout_s: float) -> None:
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        await self.app(scope, body_deadline(receive, self.timeout_s), send)


class _ForeignOrigin:
    """A POST from a browser page of an origin --allowed-origins does not list ("*": any) is a
    403, as a keyless replica's (the router does not pass the Origin on, so the replicas serve
    the origins the router's CORS headers name). A page of any site can send a POST that needs
    no CORS preflight (no Content-Type, or text/plain): through the router, it aborted every
    request (/abort_request abort_all), flushed the caches and ran generations. A page with
    an API key is preflighted, so a listed origin is all it needs."""

    def __init__(self, app: Any, allowed_origins: str) -> None:
        self.app = app
        self.allowed = {o.strip() for o in allowed_origins.split(",") if o.strip()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and "*" not in self.allowed:
            origin = next((v for k, v in scope["headers"] if k == b"origin"), b"").decode("latin-1").strip()
            if origin and origin not in self.allowed:
                body = error_body(f"requests from the web page origin {quoted(origin)} are refused: the router "
                                  "serves only the origins --allowed-origins lists", "invalid_request_error", None,
                                  "origin_not_allowed")
                return await JSONResponse(body, 403)(scope, receive, send)
        await self.app(scope, receive, send)


class _HeadAsGet:
    """HEAD served as GET wherever GET is, as a replica does (RFC 9110; `curl -I` and health
    monitors got a 405); uvicorn, which keeps the request's own scope, sends no body."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, send)


# ---- replicas on this host (--launch-replicas N) ----

def launch_replicas(n: int, server_argv: list[str], startup_timeout_s: float = 600.0,
                    host: str = "127.0.0.1") -> tuple[list[subprocess.Popen], list[str]]:
    """Start n `launch_server` processes on free ports (each in its own session so its whole
    group can be killed) and wait until all answer /health. Returns (processes, base URLs)."""
    import socket

    procs, urls = [], []
    try:
        for _ in range(n):
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            cmd = [sys.executable, "-m", "treadle.runtime.launch_server", "--host", host, "--port", str(port),
                   *server_argv]
            procs.append(subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent))
            urls.append(f"http://{host}:{port}")
        deadline = time.monotonic() + startup_timeout_s
        pending = set(range(n))
        while pending:
            for i in list(pending):
                if procs[i].poll() is not None:
                    raise RuntimeError(f"replica {urls[i]} exited with {procs[i].returncode} during start-up")
                try:
                    if httpx.get(urls[i] + "/health", timeout=2.0).status_code == 200:
                        pending.discard(i)
                except httpx.HTTPError:
                    pass  # not listening yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas {[urls[i] for i in pending]} not healthy after {startup_timeout_s}s")
            time.sleep(0.5)
        log.warning("launched %d replicas: %s", n, " ".join(urls))
        return procs, urls
    except BaseException:
        stop_replicas(procs)
        raise


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the router dies, even by SIGKILL (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def stop_replicas(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each replica's process group, SIGKILL what is left after 10 s."""
    import os
    import signal

    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass  # gone already
        for p in live:
            try:
                p.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass  # SIGKILL next round


# ---- command line ----

def add_router_args(p: argparse.ArgumentParser) -> None:
    d, c = RouterArgs(workers=()), CacheAwareConfig()
    p.add_argument("--worker", dest="workers", action="append", default=[], metavar="URL",
                   help="a replica's base URL (repeat for each replica)")
    p.add_argument("--launch-replicas", "--dp-size", dest="launch_replicas", type=int, default=0, metavar="N",
                   help="spawn N replica servers on free ports (server flags: the unknown ones, or --server-args)")
    p.add_argument("--server-args", default="", help="flags for spawned replicas, as one shell-quoted string")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--policy", choices=["cache_aware", "round_robin"], default=d.policy)
    p.add_argument("--health-interval-s", type=float, default=d.health_interval_s)
    p.add_argument("--cache-match-ratio", type=float, default=c.match_ratio,
                   help="route by prefix when this share of the prompt matches a replica's tree")
    p.add_argument("--cache-match-chars", type=int, default=c.match_chars,
                   help="... or when at least this many characters match")
    p.add_argument("--balance-abs", type=int, default=c.balance_abs,
                   help="in-flight spread above which requests go to the least loaded replica")
    p.add_argument("--max-tree-chars", type=int, default=c.max_tree_chars, help="prefix tree bound per replica")
    p.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes,
                   help="the largest request body the router reads; a larger one is a 413")
    p.add_argument("--allowed-origins", default=d.allowed_origins,
                   help="CORS: origins (comma-separated, * = any) whose browser pages may call the router; "
                        "default none (the replicas' own setting is not relayed)")
    p.add_argument("--request-body-timeout-s", type=float, default=d.request_body_timeout_s,
                   help="a request body not in whole this many seconds after its headers is a 408, "
                        "as a replica's (a client trickling it held its connection forever)")
    p.add_argument("--stream-write-timeout-s", type=float, default=60.0,
                   help="a client that reads none of its response this long is disconnected (its "
                        "replica's request aborted), as a replica's")
    p.add_argument("--shutdown-grace-s", type=float, default=10.0,
                   help="on SIGTERM, how long open responses may run before they are closed")
    p.add_argument("--log-level", default="warning")


def check_router_args(ns: argparse.Namespace, log_levels: tuple[str, ...]) -> None:
    """What `run` would find only late: as a traceback (no replica, a bad --port or
    --log-level), after launching the replicas, or never (a health check with no pause)."""
    if ns.launch_replicas < 0:
        raise ValueError("--launch-replicas must be >= 0")
    if not ns.workers and not ns.launch_replicas:
        raise ValueError("the router needs at least one replica: pass --worker URL (or --launch-replicas N)")
    if not 0 <= ns.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {ns.port}")
    if ns.log_level not in log_levels:
        raise ValueError(f"argument --log-level: invalid choice: {ns.log_level!r} "
                         f"(choose from {', '.join(map(repr, log_levels))})")
    for flag, value, ok, bound in (
            ("--shutdown-grace-s", ns.shutdown_grace_s, ns.shutdown_grace_s >= 0, ">= 0"),
            ("--max-request-bytes", ns.max_request_bytes, ns.max_request_bytes >= 1, ">= 1"),
            ("--health-interval-s", ns.health_interval_s, ns.health_interval_s > 0, "> 0"),
            ("--request-body-timeout-s", ns.request_body_timeout_s,
             0 < ns.request_body_timeout_s < float("inf"), "a finite number > 0"),
            ("--stream-write-timeout-s", ns.stream_write_timeout_s,
             0 < ns.stream_write_timeout_s < float("inf"), "a finite number > 0"),
            ("--max-tree-chars", ns.max_tree_chars, ns.max_tree_chars >= 1, ">= 1"),
            ("--cache-match-ratio", ns.cache_match_ratio, 0 <= ns.cache_match_ratio <= 1, "in [0, 1]"),
            ("--cache-match-chars", ns.cache_match_chars, ns.cache_match_chars >= 0, ">= 0"),
            ("--balance-abs", ns.balance_abs, ns.balance_abs >= 0, ">= 0")):
        if not ok:
            raise ValueError(f"{flag} must be {bound}, got {value}")


def add_router_subcommand(sub: argparse._SubParsersAction) -> None:
    """Register `treadle router` on the `treadle` command's subparsers."""
    p = sub.add_parser("router", help="route requests over data-parallel replica servers",
                       description=__doc__.split("\n\n")[0])
    add_router_args(p)
    p.set_defaults(func=lambda ns: run(ns, []))


def run(ns: argparse.Namespace, server_argv: list[str]) -> None:
    import uvicorn

    from treadle.runtime.server.http_protocol import header_deadline_protocol

    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server_argv = [*shlex.split(ns.server_args), *server_argv]
    if server_argv and not ns.launch_replicas:
        raise SystemExit(f"unknown router flag(s) {' '.join(server_argv)} (server flags need --launch-replicas)")
    procs: list[subprocess.Popen] = []
    try:
        workers = list(ns.workers)
        if ns.launch_replicas:
            procs, urls = launch_replicas(ns.launch_replicas, server_argv)
            workers += urls
        args = RouterArgs(workers=tuple(workers), host=ns.host, port=ns.port, policy=ns.policy,
                          health_interval_s=ns.health_interval_s,
                          cache=CacheAwareConfig(ns.cache_match_ratio, ns.cache_match_chars, ns.balance_abs,
                                                 ns.max_tree_chars),
                          max_request_bytes=ns.max_request_bytes, allowed_origins=ns.allowed_origins,
                          request_body_timeout_s=ns.request_body_timeout_s)
        app = create_router_app(args)
        grace = ns.shutdown_grace_s

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                # the router ends what is open once the grace is over; uvicorn's own bound (without
                # one its shutdown waits for every open stream, as long as its client reads) a
                # little later only cancels what still would not end
                loop = app.state.loop
                if loop is not None and not self.should_exit:
                    loop.call_soon_threadsafe(loop.call_later, grace, app.state.router.closing.set)
                super().handle_exit(sig, frame)

        # a replica's protocol: a deadline for a request's headers (a client sending them a byte
        # at a time held its connection forever), a bound on a response its client does not
        # read (the relay, its replica's request and its KV were held as long as the socket was
        # open), a reply to a client that half-closed, malformed requests in the OpenAI shape
        Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=ns.log_level,
                              timeout_graceful_shutdown=grace + CLOSE_MARGIN_S,
                              http=header_deadline_protocol(ns.request_body_timeout_s,
                                                            ns.stream_write_timeout_s))).run()
    finally:
        stop_replicas(procs)


def main(argv: list[str] | None = None) -> None:
    # no abbreviations: an unknown (server) flag must never be taken for a prefix of a router flag
    parser = argparse.ArgumentParser(prog="python -m treadle.runtime.router", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    add_router_args(parser)
    ns, rest = parser.parse_known_args(argv)
    from treadle.runtime.cli import LOG_LEVELS

    try:
        check_router_args(ns, LOG_LEVELS)
    except ValueError as e:
        parser.error(str(e))
    run(ns, rest)


if __name__ == "__main__":
    main(sys.argv[1:])
