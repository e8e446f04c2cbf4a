"""The FastAPI app: native endpoints (/generate, (de)tokenize, health, info, cache, abort, metrics), the
API-key / draining gate, and error rendering. OpenAI routes live in `openai_api.py`.

Bodies are parsed by hand (not pydantic models) so every problem is a 400 in the OpenAI
error shape that names the field, never FastAPI's 422.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.io_struct import TokenizedGenerateReq
from treadle.runtime.model_source import EMBEDDED_HF_ID
from treadle.runtime.sampling_params import SamplingParams
from treadle.runtime.server.compat_fields import NATIVE, OPENAI, check_compat_fields
from treadle.runtime.server.metrics import ServerMetrics
from treadle.runtime.server.protocol import (APIError, ReplyJSON, add_cors, add_error_handlers, body_deadline, clip,
                                             clip_names, error_body, overloaded, parse_abort_request, parse_json_object,
                                             quoted, read_body, unauthorized)
from treadle.runtime.server.streaming import (ClientGone, gather_all, merge_streams, sse,
                                              stream_or_error, until_done_or_disconnect)
from treadle.runtime.server.tokenizer_manager import TokenizerManager, check_rid, mark_request_size, merge_chunks

log = logging.getLogger("treadle.server")

_GENERATE_FIELDS = {"text", "input_ids", "sampling_params", "stream", "return_logprob", "logprob_start_len",
                    "top_logprobs_num", "return_text_in_logprobs", "rid"}
# reachable while draining / without a key: liveness must never need credentials
# without the API key, as SGLang: probes and scrapes (no request content in any of them)
_OPEN_PATHS = {"/health", "/health_generate", "/metrics", "/version"}
# the paths /metrics counts responses of by name (treadle_http_responses_total); others are "other"
_COUNTED_PATHS = {"/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models", "/tokenize",
                  "/detokenize", "/abort_request", "/flush_cache", "/health", "/health_generate", "/metrics", "/version",
                  "/get_server_info", "/get_model_info"}
HEALTH_GENERATE_TIMEOUT_S = 30.0
HEALTH_GENERATE_POLL_S = 0.5  # how often a waiting probe looks for other requests' output
INLINE_PARSE_BYTES = 1 << 20  # bodies below this are parsed on the event loop (read_json)


@dataclass
class ServerState:
    args: EngineArgs
    tm: TokenizerManager
    metrics: ServerMetrics
    model_info: dict
    child_pids: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    @property
    def model_name(self) -> str:
        return self.args.served_model_name or self.args.model_path or "SmolLM2-135M-Instruct"

    def check_model(self, model: Any) -> None:
        """A request's `model`: this server's name, SGLang's customary "default" (or "", which
        SGLang's examples send: its server reads no name), the embedded model's Hugging Face id
        when it is the one served, or left out; another name is a 404 (OpenAI's and vLLM's
        answer), not another model's reply."""
        if model is None or model in (self.model_name, "default", ""):
            return
        if (isinstance(model, str) and model.lower() == EMBEDDED_HF_ID.lower()
                and (self.args.model_path or EMBEDDED_HF_ID).lower() == EMBEDDED_HF_ID.lower()):
            return
        if not isinstance(model, str):
            raise APIError.bad_request("model must be a string", "model")
        raise APIError(f"the model {quoted(model)} does not exist: this server serves {self.model_name!r} (or send "
                       '"default")', 404, "invalid_request_error", "model", "model_not_found")


class Gate:
    """Pure ASGI middleware (so streaming and disconnect detection pass through untouched), in
    this order: without an API key, the browser checks (`_browser_refusal`); Bearer auth on
    everything but the probes and scrapes (_OPEN_PATHS); 503 for new requests while draining,
    and for new generation requests once the in-flight limit is reached, before their body is
    read (an overloaded server answers in microseconds, not after tokenizing); and a 500 for
    an error no handler caught, answered here so the connection stays usable."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        self.hosts = allowed_hosts(state.args)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope = origin_form(scope)
        path = scope["path"]
        route = path if path in _COUNTED_PATHS else "other"  # a bounded label set
        metrics, raw_send = self.state.metrics, send
        started = False

        async def send(message: dict) -> None:  # counts every response by its status
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                metrics.http_responses.labels(route=route, status=str(message["status"])).inc()
            await raw_send(message)

        key, tm = self.state.args.api_key, self.state.tm
        refusal = _framing_refusal(scope)
        if refusal is None and not key:
            refusal = _browser_refusal(scope, self.hosts, self.state.args.allowed_origins)
        if refusal is None and key and path not in _OPEN_PATHS:
            if not authorized([v for k, v in scope["headers"] if k == b"authorization"], key):
                refusal = unauthorized()
        if refusal is None and tm.draining and path != "/metrics":
            refusal = overloaded("the server is shutting down and accepts no new requests")
        if refusal is None and path in _GENERATION_PATHS and tm.num_in_flight >= tm.max_in_flight:
            refusal = overloaded(f"too many requests in flight ({tm.num_in_flight}, limit {tm.max_in_flight}); "
                                 "retry later")
        if refusal is not None:
            return await JSONResponse(refusal.body(), refusal.status, headers=refusal.headers)(scope, receive, send)
        if scope["method"] == "HEAD":
            # served as GET (RFC 9110: a server answers HEAD wherever it answers GET; `curl -I` and
            # monitors got a 405); uvicorn, which keeps the request's own scope, sends no body
            scope = {**scope, "method": "GET"}
        try:
            await self.app(scope, body_deadline(receive, self.state.args.request_body_timeout_s), send)
        except Exception as e:
            if started:
                raise  # a response under way (a stream renders its own error event): nothing to add
            if isinstance(e, APIError):  # the body's timeout where no handler turned it into its answer
                return await JSONResponse(e.body(), e.status, headers=e.headers)(scope, receive, send)
            # answered here, not by the app's catch-all, which re-raises to the server: uvicorn
            # then dropped the keep-alive connection without a `Connection: close`, and the
            # client's next request on it was reset
            log.exception("internal error on %s", path)
            body = error_body(f"internal server error: {type(e).__name__}: {e}", "server_error")
            await JSONResponse(body, 500)(scope, receive, send)


def authorized(values: list[bytes], key: str) -> bool:
    """Whether a request's Authorization header lines (`values`, raw) carry `key`: one line,
    `Bearer <key>`, the scheme's name in any case (RFC 9110 11.1) and one or more spaces after
    it. The key is compared in constant time (hmac.compare_digest: a `!=` returns at the first
    byte that differs, which a client could time, a byte at a time), as bytes: the key's UTF-8
    is what a client sends for it (read as latin-1 text, a key of other than ASCII never matched).
    Anything else, two lines included, is no key (a 401, never an error)."""
    if len(values) != 1:
        return False
    scheme, _, token = values[0].strip(b" \t").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.lstrip(b" "), key.encode("utf-8"))


# the routes that start generation: refused before their body is read when the server is full
_GENERATION_PATHS = {"/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses"}
# the media types a browser page of another origin can send without asking first (a CORS
# "simple request"): refused on a keyless server, which cannot tell such a page from a client
_JSON_TYPES = ("application/json",)


def allowed_hosts(args: EngineArgs) -> set[str] | None:
    """The `Host` names a keyless server answers to (None = any): --allowed-hosts when given
    ("*" = any); else localhost and the bound host. IP literals are always taken (a DNS-
    rebinding page reaches the server only through a name it controls)."""
    given = getattr(args, "allowed_hosts", None)
    if given is not None:
        names = {h.strip().lower() for h in given.split(",") if h.strip()}
        return None if "*" in names else names
    return {"localhost", args.host.lower()}


def _host_name(host: str) -> str:
    """A Host header without its port ("[::1]:8000" -> "::1", "a.b:80" -> "a.b")."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


_ABSOLUTE_FORM_RE = re.compile(r"(?i)https?://([^/?#]*)")


def origin_form(scope: Scope) -> Scope:
    """A request whose target is in absolute form (`POST http://host:port/generate`: RFC 9112
    3.2.2 bids a server accept it; clients write it to a proxy, and some send it on) as the
    same request in origin form: the path after the authority, and the authority as its Host
    (which the target's authority overrides). uvicorn passed the whole URL on as the path: a
    404 for every route."""
    m = _ABSOLUTE_FORM_RE.match(scope["path"])
    if m is None:
        return scope
    raw = scope.get("raw_path") or b""
    raw_m = re.match(rb"(?i)https?://([^/?#]*)", raw)
    if raw_m is None:  # (a root_path before it: no absolute form after all)
        return scope
    headers = [(k, v) for k, v in scope["headers"] if k != b"host"] + [(b"host", raw_m.group(1))]
    return {**scope, "path": scope["path"][m.end():] or "/", "raw_path": raw[raw_m.end():] or b"/",
            "headers": headers}


def _framing_refusal(scope: Scope) -> APIError | None:
    """A request that gives both a Content-Length and a Transfer-Encoding: a 400, and the
    connection closes after it (RFC 9112 6.1 lets a server refuse it, and bids it close the
    connection whatever it does). h11 reads such a body by its Transfer-Encoding alone: one
    sent by its length, not chunked, held its connection until the body's deadline (30 s, then
    a 408), and a proxy in front that framed it by its length while this server read chunks
    would see the two disagree on where the next request starts (request smuggling)."""
    names = {k for k, _ in scope["headers"]}
    if b"content-length" not in names or b"transfer-encoding" not in names:
        return None
    return APIError("the request gives both a Content-Length and a Transfer-Encoding; send one of them "
                    "(RFC 9112 6.1)", 400, "invalid_request_error", None, "invalid_http_request",
                    {"Connection": "close"})


def _browser_refusal(scope: Scope, hosts: set[str] | None, allowed_origins: str | None) -> APIError | None:
    """On a server without an API key, the requests a web page of another site could make it
    run: a `Host` that is not one of the server's names (DNS rebinding: 403), a POST whose
    content type is not JSON (a form or text/plain post needs no CORS preflight: 415), and a
    POST from a browser `Origin` that --allowed-origins does not list (403)."""
    headers = dict(scope["headers"])
    host = _host_name(headers.get(b"host", b"").decode("latin-1").strip().lower())
    if hosts is not None and host and host not in hosts and not _is_ip(host) and not host.endswith(".localhost"):
        return APIError(f"this server answers to {', '.join(sorted(hosts))} and IP addresses, not the Host "
                        f"{quoted(host)}: start it with --allowed-hosts {clip(host)} (or an --api-key) to serve "
                        "that name",
                        403, "invalid_request_error", None, "host_not_allowed")
    if scope["method"] != "POST":
        return None
    ctype = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    if ctype and ctype not in _JSON_TYPES and not ctype.endswith("+json"):
        return APIError(f"the request body must be JSON (Content-Type: application/json), got {quoted(ctype)}", 415,
                        "invalid_request_error", None, "unsupported_media_type")
    origin = headers.get(b"origin", b"").decode("latin-1").strip()
    if origin:
        allowed = {o.strip() for o in (allowed_origins or "").split(",") if o.strip()}
        if "*" not in allowed and origin not in allowed:
            return APIError(f"requests from the web page origin {quoted(origin)} are refused: a server without an API "
                            "key serves only the origins --allowed-origins lists", 403, "invalid_request_error",
                            None, "origin_not_allowed")
    return None


async def read_json(request: Request) -> dict:
    """The body as a JSON object, or a 400 saying what is wrong with it (a 413 past
    --max-request-bytes, before the rest is read). A body of a megabyte or more is parsed on
    a builder thread (TokenizerManager.off_loop)."""
    state: ServerState = request.app.state.server
    # every Content-Encoding line, each a list of codings applied in order (RFC 9110 8.4): the
    # first line alone was read, so "identity" then "gzip" on a line of its own passed as plain
    codings = [c.strip().lower() for line in request.headers.getlist("content-encoding") for c in line.split(",")]
    coding = ", ".join(c for c in codings if c)
    if any(c not in ("", "identity") for c in codings):  # RFC 9110 15.5.16: a coding not taken is a 415
        raise APIError(f"the request body is sent with Content-Encoding {quoted(coding)}; this server reads only "
                       "uncompressed bodies: send it without a Content-Encoding", 415, "invalid_request_error",
                       None, "unsupported_content_encoding", {"Accept-Encoding": "identity"})
    raw = await read_body(request, state.args.max_request_bytes)
    mark_request_size(len(raw))  # a large body's building goes to the bulk thread (TokenizerManager.off_loop)
    # a megabyte or more takes milliseconds to parse: a builder thread's work (an abort or a
    # probe, small, never waits behind the builders)
    return parse_json_object(raw) if len(raw) < INLINE_PARSE_BYTES else await state.tm.off_loop(parse_json_object, raw)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="treadle", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    tm = state.tm

    add_error_handlers(app)  # APIError, 404 / 405 in the OpenAI error shape

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)  # gone while its body was still coming (slowloris)
    async def _client_gone(_: Request, e: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it; the request was aborted

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return JSONResponse(error_body(f"internal server error: {type(e).__name__}: {e}", "server_error"), 500)

    @app.get("/health")
    async def health() -> Response:
        if tm.dead:
            return JSONResponse(error_body(tm.dead, "server_error"), 503)
        return Response(status_code=200)

    probing: list[asyncio.Task] = []  # the probe under way, which every concurrent caller waits on

    @app.get("/health_generate")
    async def health_generate() -> Response:
        """A real one-token generation through the whole pipeline, or, on a busy server whose
        probe waits its turn, any other request's output meanwhile (as SGLang's) or a forward
        step the scheduler finished meanwhile (as its stats report it). One probe runs
        at a time, whoever asks: callers meanwhile share its answer, so probes (open without a
        key) hold at most one generation slot, never the slots of paying requests."""
        # not held to the in-flight limit: a busy server is a healthy one (draining and a dead
        # child are 503s all the same)
        if not probing or probing[0].done():
            probing[:] = [asyncio.ensure_future(_probe())]
        await asyncio.shield(probing[0])
        return Response(status_code=200)

    async def _probe() -> None:
        r = TokenizedGenerateReq(f"health-{os.urandom(6).hex()}", [0],
                                 SamplingParams(max_new_tokens=1, temperature=0.0))
        start = time.monotonic()
        steps = _forward_steps(tm.sched_info)

        async def run() -> None:
            async for _ in tm.generate(r, internal=True):
                pass

        probe = asyncio.ensure_future(run())
        try:
            while not probe.done():
                await asyncio.wait([probe], timeout=HEALTH_GENERATE_POLL_S)
                # the server generates: healthy (the probe is aborted below). Another request's
                # output, or a forward step the scheduler finished since the probe began (its
                # stats come every STATS_PERIOD_S between steps, through the detokenizer, as
                # outputs do): requests not streamed send nothing until they end, so a server
                # busy decoding long ones, whose KV left the probe queued, answered 503 "no token
                # within 30 s" (an orchestrator's liveness probe then restarts a healthy server)
                if tm.last_output_at > start or _forward_steps(tm.sched_info) > steps:
                    break
                if time.monotonic() - start > HEALTH_GENERATE_TIMEOUT_S:
                    raise APIError(f"no token within {HEALTH_GENERATE_TIMEOUT_S}s", 503, "server_error")
            if probe.done():
                probe.result()  # its error (a dead child: 503)
        finally:
            if not probe.done():
                probe.cancel()  # generate() aborts the probe in the scheduler
                await asyncio.gather(probe, return_exceptions=True)

    @app.get("/version")
    async def version() -> dict:
        return {"version": _version()}

    @app.get("/get_model_info")
    @app.get("/model_info")  # SGLang's newer name of the route
    async def get_model_info() -> dict:
        info = state.model_info
        return {"model_path": info["model_path"], "served_model_name": state.model_name,
                "architecture": info["architecture"], "vocab_size": info["vocab_size"],
                "context_length": info["context_len"], "is_generation": True,
                "tokenizer_path": info.get("tokenizer_path"),
                # clients (the DSL's RuntimeEndpoint) render roles with the server's template
                "chat_template": getattr(tm.tokenizer, "chat_template", None),
                "bos_token": getattr(tm.tokenizer, "bos_token", None),
                "eos_token": getattr(tm.tokenizer, "eos_token", None),
                "bos_token_id": getattr(tm.tokenizer, "bos_token_id", None),
                "eos_token_id": getattr(tm.tokenizer, "eos_token_id", None),
                # how /generate streams: whole output so far (SGLang's default) or what is new
                "incremental_streaming_output": state.args.incremental_streaming_output,
                # the rest of SGLang's keys (its clients read them): a text-only model with
                # weights as loaded, no preferred sampling params of its own
                "architectures": [info["architecture"]], "preferred_sampling_params": None,
                "weight_version": "default", "has_image_understanding": False, "has_audio_understanding": False}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        """vLLM's /tokenize: {"prompt": text} (or a list of texts) -> {"tokens", "count",
        "max_model_len"}, the ids /generate would see for that text; `add_special_tokens`
        false leaves out what the tokenizer adds (BOS). {"messages": [...]} (with
        add_generation_prompt, continue_final_message, chat_template_kwargs): the ids of the
        prompt /v1/chat/completions would make of them."""
        obj = await read_json(request)
        # checked, tokenized and rendered on a builder thread: each takes time in the size of
        # the client's input, which must not hold the event loop (and every other client)
        return await tm.off_loop(_tokenize, state, obj)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
        obj = await read_json(request)
        _no_unknown(obj, {"model", "tokens"})
        state.check_model(obj.get("model"))
        # checking, decoding and rendering take time in the number of ids (9M ids held the
        # event loop, and every other client's request, /health too, for seconds): a builder
        # thread's work
        return await tm.off_loop(_detokenize, tm, obj.get("tokens"), state.model_info["vocab_size"])

    @app.get("/get_server_info")
    @app.get("/server_info")  # SGLang's newer name of the route
    async def get_server_info() -> dict:
        sched = await tm.scheduler_info()
        args = {k: v for k, v in vars(state.args).items() if k != "api_key"}
        # SGLang's top-level keys (its server arguments, model_path the model loaded, version and
        # the KV pool's max_total_num_tokens / max_req_input_len), as an Engine's; the scheduler's
        # counters win where a name is both
        sglang = {**args, "model_path": state.model_info["model_path"], "version": _version()}
        if isinstance(sched.get("total_slots"), int):
            sglang["max_total_num_tokens"] = sched["total_slots"]
            sglang["max_req_input_len"] = min(state.model_info["context_len"], sched["total_slots"]) - 1
        # SGLang's per-scheduler states: sglang.bench_serving reads internal_states[0] (for
        # avg_spec_accept_length, absent here: no speculative decoding)
        sglang["internal_states"] = [dict(sched)]
        return {**sglang, **sched, "engine_args": args, "num_in_flight": tm.num_in_flight, "model_load_s": state.model_info["model_load_s"],
                "quantization": state.model_info.get("quantization"),
                "pids": {"server": os.getpid(), **state.child_pids}, "uptime_s": round(time.time() - state.started, 1)}

    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        res = await tm.control("flush_cache")
        if not res.get("success"):
            return JSONResponse({"success": False, "message": "not flushed: requests are still running"}, 400)
        return JSONResponse({"success": True})

    @app.post("/abort_request")
    async def abort_request(request: Request) -> dict:
        obj = await read_json(request)
        rid, abort_all = parse_abort_request(obj)  # a typo is a 400, not a 200 that stopped nothing
        if abort_all:
            tm.abort_all()
            return {"success": True}
        return {"success": tm.abort_named(rid)}  # a batch's or n samples' parts too

    @app.get("/metrics")
    async def metrics() -> Response:
        # the scheduler's latest snapshot: a scrape never waits for a step (a long prefill
        # on a CPU takes a minute, longer than Prometheus's 10 s scrape timeout)
        info = tm.sched_info or await tm.control("get_info")
        return Response(state.metrics.render(info, tm.num_in_flight), media_type=state.metrics.content_type)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        obj = await read_json(request)
        reqs, single, aliases, grammars = await tm.off_loop(build_native, tm, obj)
        stream = bool(obj.get("stream", False))
        tm.check_capacity(len(reqs))
        tm.check_prompt_logprobs(reqs, "logprob_start_len")
        tm.check_output_logprobs(reqs, "top_logprobs_num", "max_new_tokens",
                                 "top_logprobs_num" if any(r.top_logprobs_num for r in reqs) else "return_logprob")
        if len(reqs) > 1:  # a bad grammar refuses the batch (or n samples) whole, before any of it runs
            await until_done_or_disconnect(request, tm.check_grammars(
                grammars, batch=isinstance(obj.get("sampling_params"), list) and not single))
        # one prompt, one sample: its failure is the response's (a 400 / 500, or a stream's error
        # event); a batch or n samples answer with every part's own outcome, a failed part's
        # result carrying its `error` (docs/serving.md), so one part failing mid-run (its grammar,
        # its logits, a failed step) costs the others nothing
        one = single and len(reqs) == 1
        if stream:
            return await stream_or_error(request, native_stream(tm, reqs, aliases, per_part=not one),
                                         _render_native(one, state.args.incremental_streaming_output))
        lasts = await until_done_or_disconnect(request, run_native(tm, reqs, aliases, per_part=not one))

        def reply() -> ReplyJSON:
            results = [native_result(c) for c in lasts]
            return ReplyJSON(results[0] if one else results)

        return await off_loop_if_large(tm, reply_entries([c.acc for c in lasts]), reply)

    from treadle.runtime.server.openai_api import register_openai_routes

    register_openai_routes(app, state)
    from treadle.runtime.server.responses_api import register_responses_routes

    register_responses_routes(app, state)
    app.add_middleware(Gate, state=state)
    allowed = state.args.allowed_origins
    add_cors(app, ("*" if state.args.api_key else "") if allowed is None else allowed)
    return app


def _forward_steps(info: dict | None) -> int:
    """The forward steps the scheduler had finished at its stats snapshot `info` (-1 without one)."""
    steps = (info or {}).get("forward_steps")
    return steps if isinstance(steps, int) else -1


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("treadle")
    except PackageNotFoundError:  # run from a checkout without installing
        return "unknown"


# vLLM's /tokenize fields for what treadle's does not do there: taken at their defaults
_TOKENIZE_COMPAT = {"tools": (lambda v: v is None, "/tokenize renders messages without tools here"),
                    "chat_template": OPENAI["chat_template"], "mm_processor_kwargs": OPENAI["mm_processor_kwargs"]}


def _tokenize(state: ServerState, obj: dict) -> Response:
    """/tokenize's reply (on a builder thread)."""
    tm = state.tm
    _no_unknown(obj, {"model", "prompt", "add_special_tokens", "messages", "add_generation_prompt",
                      "continue_final_message", "chat_template_kwargs", "return_token_strs"}, _TOKENIZE_COMPAT)
    check_compat_fields(obj, _TOKENIZE_COMPAT)
    state.check_model(obj.get("model"))
    add = obj.get("add_special_tokens", True)
    if not isinstance(add, bool):
        raise APIError.bad_request("add_special_tokens must be a boolean", "add_special_tokens")
    strs = obj.get("return_token_strs")  # vLLM's: each token's text beside the ids (token_strs)
    if strs is not None and not isinstance(strs, bool):
        raise APIError.bad_request("return_token_strs must be a boolean", "return_token_strs")
    if tm.tokenizer is None:
        raise APIError.bad_request("this model has no tokenizer", "prompt")
    if ("prompt" in obj) == ("messages" in obj):
        raise APIError.bad_request("give exactly one of prompt or messages", "prompt")
    limit = state.model_info["context_len"]
    if "messages" in obj:
        gen, cont = obj.get("add_generation_prompt", True), obj.get("continue_final_message", False)
        if not isinstance(gen, bool) or not isinstance(cont, bool):
            raise APIError.bad_request("add_generation_prompt and continue_final_message must be booleans",
                                       "add_generation_prompt")
        ids = tm.encode(tm.chat_prompt(obj["messages"], None, obj.get("chat_template_kwargs"), gen, cont), "messages",
                        add_special_tokens=add, must_fit=False)
        return ReplyJSON({"tokens": ids, "count": len(ids), "max_model_len": limit,
                          **({"token_strs": tm.tokenizer.convert_ids_to_tokens(ids)} if strs else {})})
    prompt = obj["prompt"]
    single = isinstance(prompt, str)
    texts = [prompt] if single else prompt
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise APIError.bad_request("prompt must be a string or a non-empty list of strings", "prompt")
    tm.check_prompt_count(len(texts), "prompt")
    ids = [tm.encode(t, "prompt", add_special_tokens=add, must_fit=False) for t in texts]
    more = {}
    if strs:
        more["token_strs"] = [tm.tokenizer.convert_ids_to_tokens(x) for x in ids]
        more["token_strs"] = more["token_strs"][0] if single else more["token_strs"]
    return ReplyJSON({"tokens": ids[0] if single else ids, "count": len(ids[0]) if single else [len(x) for x in ids],
                      "max_model_len": limit, **more})


def _detokenize(tm: TokenizerManager, ids: Any, vocab: int) -> Response:
    """/detokenize's reply (on a builder thread): the ids checked and decoded, the JSON rendered."""
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise APIError.bad_request("tokens must be a list of integers", "tokens")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError.bad_request(f"tokens must be in [0, {vocab}); got {quoted(bad)}", "tokens")
    if tm.tokenizer is None:
        raise APIError.bad_request("this model has no tokenizer", "tokens")
    return ReplyJSON({"prompt": _decode_releasing_the_gil(tm.tokenizer, ids)})


def _decode_releasing_the_gil(tokenizer: Any, ids: list[int]) -> str:
    """tokenizer.decode(ids), through the Rust tokenizer's decode_batch where it is the same
    text: a fast tokenizer's decode holds the GIL throughout (9M ids: 1.6 s in which the event
    loop, on another thread, could not run), its decode_batch lets go of it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "decode_batch") or getattr(tokenizer, "clean_up_tokenization_spaces",
                                                                          True):
        return tokenizer.decode(ids)
    return backend.decode_batch([ids], skip_special_tokens=False)[0]


def _no_unknown(obj: dict, accepted: set[str], compat: Any = ()) -> None:
    """A 400 naming the fields of `obj` neither `accepted` nor in `compat` (other servers'
    fields taken at their defaults: not listed as accepted, which would read as served)."""
    unknown = sorted(set(obj) - accepted - set(compat))
    if unknown:
        raise APIError.bad_request(f"unknown field(s) {clip_names(unknown)}; accepted: {', '.join(sorted(accepted))}",
                                   unknown[0])


# the fields an error of one prompt of a batch names when it is that prompt's own (its text or
# ids, its length against the context): batch_part says which prompt
_PROMPT_PARAMS = ("text", "input_ids", "prompt", "messages", "max_new_tokens", "max_tokens", "max_completion_tokens",
                  "logprob_start_len", "logprobs")


@contextlib.contextmanager
def batch_part(i: int, own: bool):
    """Name prompt `i` in a 400 raised for it while a batch is built ("prompt 1 of the batch:
    the prompt has 9001 tokens ..."), as a batch's grammar errors do: a batch of a hundred
    prompts was refused without saying which. `own`: the prompts have options of their own
    (then every error is the prompt's); else an error of the shared options, which every prompt
    would raise, is left as it is (the first prompt raises it)."""
    try:
        yield
    except APIError as e:
        if e.status == 400 and (own or i > 0 or e.param in _PROMPT_PARAMS):
            e.message = f"prompt {i} of the batch: {e.message}"
        raise


def build_native(tm: TokenizerManager, obj: dict
                 ) -> tuple[list[TokenizedGenerateReq], bool, dict[str, tuple], list[tuple[int, SamplingParams]]]:
    """The /generate body -> requests (batch items and n samples expanded), whether the input
    was a single prompt, the other rids /abort_request reaches each part by (the batch's
    rid, the rid of the item its n samples came from), and the (index, params) of the prompts
    with a grammar to check first (only the first when they share one params object)."""
    check_compat_fields(obj, NATIVE)  # SGLang's fields for what treadle lacks: taken at their defaults
    _no_unknown(obj, _GENERATE_FIELDS, NATIVE)
    text, ids = obj.get("text"), obj.get("input_ids")
    if (text is None) == (ids is None):
        raise APIError.bad_request("give exactly one of text or input_ids", "text")
    if text is not None:
        if not isinstance(text, (str, list)):
            raise APIError.bad_request("text must be a string or a list of strings", "text")
        single = isinstance(text, str)
        if not single and not all(isinstance(t, str) for t in text):
            raise APIError.bad_request("text must be a string or a list of strings", "text")
        prompts: list[dict] = [{"text": t} for t in ([text] if single else text)]
    else:
        if not isinstance(ids, list):
            raise APIError.bad_request("input_ids must be a list of integers or a list of such lists", "input_ids")
        single = not ids or not isinstance(ids[0], list)
        prompts = [{"input_ids": x} for x in ([ids] if single else ids)]
    if not prompts:
        raise APIError.bad_request("the batch is empty", "text" if text is not None else "input_ids")
    tm.check_prompt_count(len(prompts), "text" if text is not None else "input_ids")  # before tokenizing them
    sp = obj.get("sampling_params")
    if isinstance(sp, list):
        if len(sp) != len(prompts):
            raise APIError.bad_request(f"{len(sp)} sampling_params for {len(prompts)} prompts", "sampling_params")
        params = sp
    elif sp is None or isinstance(sp, dict):
        params = [sp or {}] * len(prompts)
    else:
        raise APIError.bad_request("sampling_params must be an object or a list of objects", "sampling_params")
    rid = obj.get("rid")
    for r in rid if isinstance(rid, list) else [rid]:
        check_rid(r)
    if isinstance(rid, list):
        rids = [r if r != "" else None for r in rid]
    elif rid is None or rid == "":  # no name: each request gets its own (a batch's were "-0", "-1", ...)
        rids = [None] * len(prompts)
    else:  # one rid for a batch: its items are "<rid>-<i>"
        rids = [rid] if single else [f"{rid}-{i}" for i in range(len(prompts))]
    if len(rids) != len(prompts):
        raise APIError.bad_request(f"{len(rids)} rids for {len(prompts)} prompts", "rid")
    stream = obj.get("stream")
    stream = False if stream is None else stream  # null: the default, as SGLang's client may send it
    if not isinstance(stream, bool):
        raise APIError.bad_request("stream must be a boolean", "stream")
    # logprob options: one value for all, or (as SGLang) a list with one per prompt
    per_prompt = {}
    for name, default in (("return_logprob", False), ("logprob_start_len", None), ("top_logprobs_num", 0),
                          ("return_text_in_logprobs", False)):
        v = obj.get(name)
        v = default if v is None else v  # null is the default (SGLang's client sends its fields so)
        if isinstance(v, list) and len(v) != len(prompts):
            raise APIError.bad_request(f"{len(v)} values of {name} for {len(prompts)} prompts", name)
        per_prompt[name] = v if isinstance(v, list) else [v] * len(prompts)
    reqs, aliases, grammars = [], {}, []
    batch_name = (rid,) if isinstance(rid, str) and rid and not single else ()  # "" is no name (rids above)
    own = isinstance(sp, list) or any(isinstance(obj.get(k), list) for k in per_prompt)  # per-prompt options
    for i, (p, sparams, r) in enumerate(zip(prompts, params, rids)):
        with batch_part(i, own) if not single else contextlib.nullcontext():
            req = tm.make_req(**p, params=sparams, **{k: v[i] for k, v in per_prompt.items()}, stream=stream,
                              rid=r)
        if req.sampling_params.has_grammar and (isinstance(sp, list) or not grammars):
            grammars.append((i, req.sampling_params))
        for part in tm.expand_n(req):
            reqs.append(part)
            aliases[part.rid] = batch_name + ((req.rid,) if part is not req else ())
    if len({r.rid for r in reqs}) != len(reqs):
        raise APIError.bad_request("request ids must be unique", "rid")
    return reqs, single, aliases, grammars


# a reply of more logprob entries and tokens than this is made and encoded on a builder thread:
# 50 MB of JSON (n samples with top logprobs) took the event loop, and every other client, for
# seconds (json_pieces lets the loop run while a thread encodes)
INLINE_REPLY_ENTRIES = 20_000


def reply_entries(accs: list[Any]) -> int:
    """The tokens and logprob values the results of these outputs (Accum) hold: their size."""
    n = 0
    for acc in accs:
        per = 1 + len(acc.tops[0]) if acc.tops and acc.tops[0] else 2 if acc.logprobs else 1
        n += len(acc.ids) * per + len(acc.input_logprobs or ()) * (1 + len((acc.input_tops or [[]])[-1] or ()))
    return n


async def off_loop_if_large(tm: TokenizerManager, entries: int, build: Any) -> Any:
    """``build()`` here when the reply is small, else on a builder thread."""
    return build() if entries < INLINE_REPLY_ENTRIES else await tm.off_loop(build)


def native_result(chunk: Any) -> dict:
    """A request's native result from its last chunk; a failed one's carries `error` (the
    OpenAI-shaped error a request of its own would have been answered with) beside what it
    made before, its meta_info's finish_reason being {"type": "abort", "message": ...}."""
    res = chunk.acc.result()
    if chunk.error is not None:
        res["error"] = chunk.error.body()["error"]
    return res


async def run_native(tm: TokenizerManager, reqs: list[TokenizedGenerateReq], aliases: dict[str, tuple],
                     per_part: bool = False) -> list[Any]:
    """Each request's last chunk (native_result makes its result). `per_part`: a request that fails has its result (with `error`)
    like the others, which run on; else its failure is raised (and stops the others)."""
    async def one(r: TokenizedGenerateReq) -> Any:
        last = None
        async for chunk in tm.generate(r, aliases[r.rid], errors_as_output=per_part):
            last = chunk
        return last

    with tm.reserve(reqs, aliases):
        await tm.warm_prefixes(reqs, aliases)
        return await gather_all([one(r) for r in reqs])


async def native_stream(tm: TokenizerManager, reqs: list[TokenizedGenerateReq], aliases: dict[str, tuple],
                        per_part: bool = False):
    """(index, chunk) pairs of all requests; the prompt is warmed first when shared.
    `per_part`: as run_native's (a failed request's last chunk carries its error)."""
    with tm.reserve(reqs, aliases):
        await tm.warm_prefixes(reqs, aliases)
        async for item in merge_streams([tm.generate(r, aliases[r.rid], errors_as_output=per_part)
                                         for r in reqs], merge_chunks):
            yield item


def _render_native(single: bool, incremental: bool):
    """Native stream chunks as SGLang's: `text` and `output_ids` are the whole output so far
    (with --incremental-streaming-output, only what is new, as Engine.generate(stream=True)
    gives); `meta_info` is cumulative; batches add `index`."""
    def render(item: tuple[int, Any]) -> list[str]:
        i, chunk = item
        if not chunk.text and not chunk.ids and not chunk.finished:
            return []
        res = native_result(chunk)
        if incremental:
            res["text"] = chunk.text
            res["output_ids"] = list(chunk.ids)
        if not single:
            res["index"] = i
        return [sse(res)]

    return render
