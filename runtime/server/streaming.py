"""Helpers shared by the native and OpenAI handlers: client-disconnect detection, fan-in of
several request streams, and Server-Sent Events responses that abort on disconnect."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from treadle.runtime.server.protocol import APIError, json_text

log = logging.getLogger("treadle.server")

# the ASGI scope key a Server-Sent Events response sets (AbortOnDisconnectStream): its body may
# take an SSE comment between the events it writes, a half-close probe's (http_protocol). Here,
# not there: http_protocol loads uvicorn, which the router's argument errors must not wait for
SSE_SCOPE_KEY = "treadle.sse"

DISCONNECT_POLL_S = 0.25


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def until_done_or_disconnect(request: Request, aw: Awaitable[Any]) -> Any:
    """Await `aw`, but cancel it (which aborts its requests) when the client disconnects."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
            # let the request generators run their abort-on-exit before we return
            await asyncio.gather(task, return_exceptions=True)


async def gather_all(aws: list[Awaitable[Any]]) -> list[Any]:
    """Like asyncio.gather, but the first failure cancels (and so aborts) the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _coalesce(batch: list[tuple[int, Any]], merge: Callable[[Any, Any], Any], done: object) -> list[tuple[int, Any]]:
    """`batch` (queued (index, item) pairs, in arrival order) with each source's consecutive
    items merged into its first one's place: each source's own order is kept, its end marker
    or failure stays after its items."""
    out: list[tuple[int, Any]] = []
    at: dict[int, int] = {}  # source -> the place in `out` of its item still open to merging
    for i, item in batch:
        if item is done or isinstance(item, Exception):
            at.pop(i, None)
            out.append((i, item))
        elif i in at:
            out[at[i]] = (i, merge(out[at[i]][1], item))
        else:
            at[i] = len(out)
            out.append((i, item))
    return out


async def merge_streams(gens: list[AsyncIterator[Any]],
                        merge: Callable[[Any, Any], Any] | None = None) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several async iterators as (index, item) in arrival order. Closing the
    merged iterator cancels (and so aborts) every source still running. `merge(a, b)`: one
    item standing for a source's two consecutive ones; given, the items that queued while the
    consumer was busy come merged, one per source, as one request's stream merges its own
    (TokenizerManager.generate). Without it, n streamed samples rendered every token's chunk
    whatever the backlog: /generate's cumulative chunks (every logprob so far in each), 3,201
    chunks and 520 MB of JSON on the event loop for 8 samples of 400 tokens with top 20, the
    stream four times slower and /health waiting up to 1.1 s behind it."""
    if len(gens) == 1:
        try:
            async for item in gens[0]:
                yield 0, item
        finally:
            await gens[0].aclose()
        return
    q: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, g: AsyncIterator[Any]) -> None:
        try:
            async for item in g:
                q.put_nowait((i, item))
            q.put_nowait((i, done))
        except Exception as e:  # handed to the consumer, which raises it
            q.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(tasks)
        while remaining:
            batch = [await q.get()]
            if merge is not None:
                while not q.empty():
                    batch.append(q.get_nowait())
                batch = _coalesce(batch, merge, done)
            for i, item in batch:
                if item is done:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# characters JSON writes as they are, but where Python's str.splitlines() (and so a client reading
# a stream with requests' iter_lines(decode_unicode=True)) ends a line: a reply holding one cut
# its event in two, neither of them JSON. Inside a JSON string (the only place a non-ASCII
# character can be) their escapes mean the same
_LINE_BREAKS = (("\x85", "\\u0085"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def sse(obj: Any) -> str:
    text = json_text(obj)
    if not text.isascii():
        for char, escape in _LINE_BREAKS:
            if char in text:
                text = text.replace(char, escape)
    return f"data: {text}\n\n"


class AbortOnDisconnectStream(StreamingResponse):
    """A StreamingResponse that notices a disconnect even while waiting for the next token
    (not only on the next write) and always closes its body iterator, whose cleanup aborts
    the request and frees its KV."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # a half-closed client's probe may write an SSE comment between events (http_protocol)
        scope[SSE_SCOPE_KEY] = True

        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError as e:  # the client vanished mid-write: same as a disconnect
                        log.debug("stream write failed, client gone: %s", e)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await listen()
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


async def stream_or_error(request: Request, items: AsyncIterator[Any],
                          render: Callable[[Any], list[str]], tail: Callable[[], list[str]] | None = None,
                          failed: Callable[[APIError], list[str]] | None = None, done: bool = True):
    """Start an SSE response once the first item is there, so an early failure (e.g. a
    grammar that does not compile) is still a plain 400; later failures become an SSE error
    event (`failed(e)`'s lines, else the error body). `render(item)` gives the SSE lines of an
    item, `tail()` lines sent before [DONE] (sent unless `done` is false)."""
    try:
        first = await until_done_or_disconnect(request, items.__anext__())
    except StopAsyncIteration:
        first = None
    except BaseException:
        await items.aclose()
        raise

    async def body() -> AsyncIterator[str]:
        try:
            if first is not None:
                for line in render(first):
                    yield line
                async for item in items:
                    for line in render(item):
                        yield line
            for line in (tail() if tail else []):
                yield line
        except APIError as e:
            for line in (failed(e) if failed else [sse(e.body())]):
                yield line
        finally:
            await items.aclose()
        if done:
            yield "data: [DONE]\n\n"

    return AbortOnDisconnectStream(body(), media_type="text/event-stream",
                                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)
