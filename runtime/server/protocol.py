"""HTTP-facing error type and the OpenAI error body.

Every handler raises `APIError`; one exception handler renders it as
`{"error": {"message", "type", "param", "code"}}` with the right status, so every client
error is a 4xx naming the problem and never a 500.
"""
from __future__ import annotations

import re
from typing import Any

_PARAM_RE = re.compile(r"sampling_params\.(\w+)|sampling_params field\(s\): (\w+)"
                       r"|^(top_logprobs_num|logprob_start_len|input_ids|return_logprob|return_text_in_logprobs)\b")


class APIError(Exception):
    """An error the client should see, with its HTTP status and OpenAI error fields."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

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


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def unauthorized() -> APIError:
    return APIError("invalid or missing API key: send `Authorization: Bearer <key>`", 401,
                    "invalid_request_error", None, "invalid_api_key")


def overloaded(message: str) -> APIError:
    return APIError(message, 503, "server_overloaded", None, "server_overloaded")


def finish_reason(finished: dict | None) -> str | None:
    """The scheduler's finish dict -> the OpenAI finish_reason string."""
    if finished is None:
        return None
    kind = finished.get("type")
    return {"stop": "stop", "length": "length"}.get(kind, kind)


def matched_stop(finished: dict | None) -> object:
    return None if finished is None else finished.get("matched")
