"""HTTP-facing error type and the OpenAI error body.

Every handler raises `APIError`; one exception handler renders it as
`{"error": {"message", "type", "param", "code"}}` with the right status, so every client
error is a 4xx naming the problem and never a 500.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive

from treadle.runtime.sampling_params import clip, clip_names, quoted  # noqa: F401 (re-exported for the server)

_PARAM_RE = re.compile(r"sampling_params\.(\w+)|sampling_params field\(s\): (\w+)"
                       r"|^(top_logprobs_num|logprob_start_len|input_ids|return_logprob|return_text_in_logprobs"
                       r"|json_schema|structural_tag)\b")


class APIError(Exception):
    """An error the client should see, with its HTTP status and OpenAI error fields."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers  # the response's extra headers (a 503's Retry-After)

    @classmethod
    def bad_request(cls, e: Exception | str, param: str | None = None) -> "APIError":
        """A 400 from a validation error; the offending field is guessed from the message
        ("sampling_params.top_p must be ...") when not given."""
        msg = str(e)
        if param is None:
            m = _PARAM_RE.search(msg)
            if m:
                param = next(g for g in m.groups() if g)
        return cls(msg, 400, "invalid_request_error", param, None)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


# The longest error message sent: messages quote a client's values through
# sampling_params.quoted / clip (QUOTE_CHARS each); this bounds the rest (a grammar compiler's
# message quoting a 5 MB rule name, a library's exception text), so an error body stays small
# whatever the request held
MAX_ERROR_MESSAGE_CHARS = 4000


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": whole_chars(bounded_message(message)), "type": type,
                      "param": whole_chars(None if param is None else clip(param)), "code": code}}


def bounded_message(message: str, limit: int = MAX_ERROR_MESSAGE_CHARS) -> str:
    """`message` whole up to `limit` characters; else its start and its end (where a message
    says what to do) with how much was cut between them."""
    if not isinstance(message, str) or len(message) <= limit:
        return message
    head, tail = limit * 3 // 4, limit // 4
    return f"{message[:head]} ... [{len(message) - head - tail:,} characters cut] ... {message[-tail:]}"


def whole_chars(text: str | None) -> str | None:
    """`text` with each lone surrogate written as its escape (U+D800 -> "\\ud800"): a message
    that quotes a client's string (an unknown field named "\\ud800" in its JSON) must still
    encode as UTF-8, or rendering the 400 fails and the client gets a 500."""
    if text is None or not isinstance(text, str):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ReplyJSON(JSONResponse):
    """A JSON reply whose strings may hold a lone surrogate (a model that wrote a "\\ud800"
    escape in a tool call's arguments, which are parsed and written out again): those
    replies are written with every non-ASCII character escaped, as JSON allows, instead of
    failing to encode (a 500 after the request had run). Written in pieces (json_pieces), so
    that a large reply encoded on a thread lets the event loop run between them."""

    def render(self, content: Any) -> bytes:
        try:
            return "".join(json_pieces(content, ensure_ascii=False)).encode("utf-8")
        except UnicodeEncodeError:
            return "".join(json_pieces(content, ensure_ascii=True)).encode("ascii")


JSON_PIECE_ITEMS = 64  # list items (each a flat list or tuple) one C json.dumps call writes
JSON_PIECE_CHARS = 1 << 16  # characters of a string one C json.dumps call writes
JSON_PIECE_NUMBERS = 1024  # numbers of a list one C json.dumps call writes


def json_pieces(obj: Any, ensure_ascii: bool = False, separators: tuple[str, str] = (",", ":"),
                allow_nan: bool = False) -> list[str]:
    """``obj``'s compact JSON text (as JSONResponse writes it: no NaN, "," and ":" separators)
    in pieces whose concatenation is json.dumps's text. json's C encoder holds the GIL for a
    whole call: one call over a 50 MB reply (n samples with top logprobs) stopped every other
    thread, the event loop's included, for seconds even when run on a builder thread. Here no
    call writes more than JSON_PIECE_ITEMS items of a list of lists (a reply's logprob
    triples) or JSON_PIECE_CHARS characters of a string, with the interpreter free to switch
    threads between calls."""
    dumps = json.JSONEncoder(ensure_ascii=ensure_ascii, allow_nan=allow_nan, separators=separators).encode
    comma, colon = separators
    out: list[str] = []

    def walk(x: Any) -> None:
        if type(x) is dict and all(type(k) is str for k in x):
            out.append("{")
            for i, (k, v) in enumerate(x.items()):
                out.append((comma if i else "") + dumps(k) + colon)
                walk(v)
            out.append("}")
        elif type(x) in (list, tuple) and len(x) > 1 and type(x[0]) in (dict, list, tuple):
            out.append("[")
            if _flat(x[0]):  # e.g. logprob triples, or a position's top-logprob list: slices of them
                for i in range(0, len(x), JSON_PIECE_ITEMS):
                    out.append((comma if i else "") + dumps(list(x[i:i + JSON_PIECE_ITEMS]))[1:-1])
            else:
                for i, v in enumerate(x):
                    if i:
                        out.append(comma)
                    walk(v)
            out.append("]")
        elif type(x) in (list, tuple) and len(x) > JSON_PIECE_NUMBERS:
            # a long list of scalars (a client's tool call arguments, read back): slices of
            # numbers, and any other item alone (5M numbers: 0.3 s in one call)
            out.append("[")
            for i in range(0, len(x), JSON_PIECE_NUMBERS):
                part = x[i:i + JSON_PIECE_NUMBERS]
                if all(type(v) in (int, float, bool) or v is None for v in part):
                    out.append((comma if i else "") + dumps(list(part))[1:-1])
                else:
                    for j, v in enumerate(part):
                        if i or j:
                            out.append(comma)
                        walk(v)
            out.append("]")
        elif type(x) is str and len(x) > JSON_PIECE_CHARS:  # /detokenize's text of 8M ids: 0.4 s in one call
            out.append('"')
            for i in range(0, len(x), JSON_PIECE_CHARS):  # escapes are per character: slices write the same
                out.append(dumps(x[i:i + JSON_PIECE_CHARS])[1:-1])
            out.append('"')
        else:
            out.append(dumps(x))

    walk(obj)
    return out


def non_finite_path(obj: Any, path: str = "") -> str | None:
    """The path (`tools[0].parameters.maximum`) of the first NaN or infinite number in a
    parsed JSON value, or None. Python's reader takes NaN, Infinity and 1e400 (as inf), which
    JSON has no text for: a reply that echoes one back cannot be written. Iterative: a value
    nests as deep as the reader allowed."""
    todo: list[tuple[Any, str]] = [(obj, path)]
    while todo:
        x, at = todo.pop()
        if type(x) is float and not math.isfinite(x):
            return at or "the value"
        if type(x) is dict:
            todo.extend((v, f"{at}.{k}" if at else str(k)) for k, v in reversed(list(x.items())))
        elif type(x) in (list, tuple):
            todo.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(x))))
    return None


def _flat(x: Any) -> bool:
    """Whether ``x`` is a short list or tuple of scalars or of short tuples of scalars."""
    if type(x) not in (list, tuple) or len(x) > 64:
        return False
    return all(type(v) not in (dict, list, tuple) or (type(v) in (list, tuple) and len(v) <= 8 and
                                                       all(type(w) not in (dict, list, tuple) for w in v)) for v in x)


def json_text(obj: Any) -> str:
    """`obj` as JSON text that encodes as UTF-8: non-ASCII characters as they are, unless a
    lone surrogate among them forces the escaped (ASCII) form (see ReplyJSON)."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj)
    return text


def unauthorized() -> APIError:
    return APIError("invalid or missing API key: send `Authorization: Bearer <key>`", 401,
                    "invalid_request_error", None, "invalid_api_key")


RETRY_AFTER_S = 1  # what a 503 for a full or draining server tells the client to wait


def overloaded(message: str) -> APIError:
    return APIError(message, 503, "server_overloaded", None, "server_overloaded",
                    {"Retry-After": str(RETRY_AFTER_S)})


def finish_reason(finished: dict | None) -> str | None:
    """The scheduler's finish dict -> the OpenAI finish_reason string."""
    if finished is None:
        return None
    kind = finished.get("type")
    return {"stop": "stop", "length": "length"}.get(kind, kind)


def matched_stop(finished: dict | None) -> object:
    return None if finished is None else finished.get("matched")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 once it is known to pass `limit` bytes: from its
    Content-Length before reading, or while reading (chunked, or longer than declared)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_large(size, limit)
        parts.append(part)
    return b"".join(parts)


def too_large(size: int, limit: int) -> APIError:
    return APIError(f"the request body has {size} bytes or more, more than this server reads ({limit}, "
                    "--max-request-bytes)", 413, "invalid_request_error", None, "request_too_large")


def parse_abort_request(obj: dict) -> tuple[str | None, bool]:
    """/abort_request's body as (rid, abort_all), SGLang's fields: {"rid": "..."} stops that
    request (and the parts of a batch or of n samples sent under it), {"abort_all": true} every
    request; anything else is a 400 naming the field."""
    unknown = sorted(set(obj) - {"rid", "abort_all"})
    if unknown:
        raise APIError.bad_request(f"unknown field(s) {', '.join(unknown)}; accepted: abort_all, rid", unknown[0])
    abort_all = obj.get("abort_all", False)
    if not isinstance(abort_all, bool):
        raise APIError.bad_request("abort_all must be true or false", "abort_all")
    rid = obj.get("rid")
    if abort_all:
        if rid not in (None, "") and not isinstance(rid, str):
            raise APIError.bad_request("rid must be a string", "rid")
        return None, True
    if not isinstance(rid, str):
        raise APIError.bad_request("rid must be a string (or abort_all true)", "rid")
    return rid, False


# bodies of this many bytes or more are parsed in pieces (loads_in_pieces), smaller ones by one
# json.loads call (a megabyte: about 25 ms)
PIECEWISE_PARSE_BYTES = 1 << 20
PARSE_PIECE_CHARS = 1 << 16  # the most characters of a number list one C json call reads
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_RUN = re.compile(r"[-+0-9.eE, \t\n\r]{1,%d}" % PARSE_PIECE_CHARS)
# an object or array holding no other (strings of up to 64 characters, 1,024 members at most,
# so at most ~67 KB): read whole by one C call. Its end is the container's own: a string is
# matched from quote to quote, escapes included, so a bracket inside one cannot end it
_FLAT = re.compile(r'[\[{](?:[^\[\]{}"\\]|"(?:[^"\\]|\\.){0,64}"){0,1024}[\]}]')
_scan_once = json.scanner.make_scanner(json.JSONDecoder())  # one value at a position (C)
_scanstring = json.decoder.scanstring


def parse_json_object(raw: bytes) -> dict:
    """A request body as a JSON object, or a 400 saying what is wrong with it."""
    try:
        if len(raw) < PIECEWISE_PARSE_BYTES:
            obj = json.loads(raw)
        else:
            obj = loads_in_pieces(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError.bad_request(f"the request body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise APIError.bad_request("the request body nests too deeply") from e
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        field = _field_of_huge_int(raw)
        raise APIError.bad_request(f"{field or 'a field'}: an integer of more than {sys.get_int_max_str_digits()} "
                                   f"digits is not a number this server takes ({e})", field) from e
    if not isinstance(obj, dict):
        raise APIError.bad_request(f"the request body must be a JSON object, got {type(obj).__name__}")
    return obj


def loads_in_pieces(s: str, max_depth: int = 1000) -> Any:
    """json.loads(s): the same value, or a JSONDecodeError (ValueError for an integer past
    Python's digit limit, RecursionError past `max_depth` levels), read in C calls over short
    pieces of `s`. json's C parser holds the GIL for a whole call: one json.loads over a 40 MB
    body (/detokenize's 8M ids) took a second in which no other thread of the server ran, the
    event loop's included, so every stream and /health waited, though the body was parsed on
    a builder thread. Here objects and arrays are walked in Python, their scalars read one by
    one by json's C scanner, and runs of numbers in an array PARSE_PIECE_CHARS characters at
    a time by json.loads (8M ids: ~0.6 s, as fast as one call), with the interpreter free to
    switch threads between calls. A string is one call (60 MB: ~0.1 s), and so is an object
    or array holding no other of at most ~67 KB (_FLAT: 300k objects of 5 numbers each,
    walked, took 4x one call's time)."""
    if s.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", s, 0)
    ws = _WS.match
    stack: list[Any] = []  # the open containers, innermost last ...
    keys: list[Any] = []  # ... and for an object, the key its next value goes under
    pos = ws(s, 0).end()

    def fail(message: str, at: int) -> json.JSONDecodeError:
        return json.JSONDecodeError(message, s, at)

    def key_at(at: int) -> tuple[str, int]:
        if s[at:at + 1] != '"':
            raise fail("Expecting property name enclosed in double quotes", at)
        key, at = _scanstring(s, at + 1, True)
        at = ws(s, at).end()
        if s[at:at + 1] != ":":
            raise fail("Expecting ':' delimiter", at)
        return key, ws(s, at + 1).end()

    def numbers_at(at: int, into: list) -> int:
        """Read the whole numbers of a run of them at `at` (each followed by a comma) into
        `into`, a piece at a time; the position of the first element not read."""
        while s[at:at + 1] in ("-", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"):
            run = _NUMBER_RUN.match(s, at).group()
            cut = run.rfind(",")
            if cut <= 0:
                break
            try:
                into.extend(json.loads("[" + run[:cut] + "]"))
            except json.JSONDecodeError as e:
                raise fail(e.msg, at + e.pos - 1) from None
            at = ws(s, at + cut + 1).end()
        return at

    while True:
        c = s[pos:pos + 1]  # a value starts here
        if c in ("{", "[") and _FLAT.match(s, pos) is None:
            if len(stack) >= max_depth:
                raise RecursionError("maximum recursion depth exceeded while decoding a JSON document")
            pos = ws(s, pos + 1).end()
            if s[pos:pos + 1] == ("}" if c == "{" else "]"):
                value, pos = ({} if c == "{" else []), pos + 1
            elif c == "{":
                stack.append({})
                key, pos = key_at(pos)
                keys.append(key)
                continue
            else:
                stack.append([])
                keys.append(None)
                pos = numbers_at(pos, stack[-1])
                continue
        else:
            try:
                value, pos = _scan_once(s, pos)
            except StopIteration as e:
                raise fail("Expecting value", e.value) from None
        while True:  # the value read ends its container's element; go on after it
            if not stack:
                end = ws(s, pos).end()
                if end != len(s):
                    raise fail("Extra data", end)
                return value
            top = stack[-1]
            if type(top) is list:
                top.append(value)
            else:
                top[keys[-1]] = value
            pos = ws(s, pos).end()
            c = s[pos:pos + 1]
            if c == ",":
                pos = ws(s, pos + 1).end()
                if type(top) is list:
                    pos = numbers_at(pos, top)
                else:
                    keys[-1], pos = key_at(pos)
                break
            if c != ("]" if type(top) is list else "}"):
                raise fail("Expecting ',' delimiter", pos)
            value, pos = stack.pop(), pos + 1
            keys.pop()


def _field_of_huge_int(raw: bytes) -> str | None:
    """The name of the member that holds the first over-long integer of a JSON body: the
    nearest key before it (for a list of numbers, the list's)."""
    m = re.search(rb"\d{%d,}" % (sys.get_int_max_str_digits() + 1), raw)
    if m is None:
        return None
    keys = re.findall(rb'"((?:[^"\\]|\\.){1,200})"\s*:', raw[max(0, m.start() - 100_000): m.start()])
    return keys[-1].decode("utf-8", "replace") if keys else None


def add_error_handlers(app: FastAPI) -> None:
    """APIError, and the framework's own 404 / 405, in the OpenAI error shape."""
    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), kind), e.status_code, headers=getattr(e, "headers", None))


def add_cors(app: FastAPI, allowed: str) -> None:
    """Let browser pages of these origins (comma-separated, * = any; "" = none) call the app.
    Add it last, outside any key gate: a preflight carries no key, and errors need the headers too."""
    origins = [o.strip() for o in allowed.split(",") if o.strip()]
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])


def body_deadline(receive: Receive, timeout_s: float) -> Receive:
    """`receive` with a deadline for the request body: the whole body must be in within
    `timeout_s` of the request's headers, or reading it raises a 408 (the connection then
    closes). A client that sent its headers and a Content-Length and then trickled the body,
    or none of it (slowloris), held its connection and its handler forever. Once the body is
    in, receive is the server's own again (a stream waits on it for the client's disconnect,
    for as long as the stream lasts)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    body_done = False

    async def receive_before_deadline() -> dict:
        nonlocal body_done
        if body_done:
            return await receive()
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            body_done = True  # once: what follows (a disconnect) is the server's to see
            raise APIError(f"the request body did not arrive whole within {timeout_s:g} s of its headers "
                           "(--request-body-timeout-s)", 408, "invalid_request_error", None, "request_timeout",
                           {"Connection": "close"}) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_done = True
        return message

    return receive_before_deadline
