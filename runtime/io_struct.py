"""Messages crossing the scheduler boundary (in-process queues for the Engine, ZMQ between
processes for the server). Plain dataclasses: picklable and cheap."""
from __future__ import annotations

from dataclasses import dataclass, field

from treadle.runtime.sampling_params import SamplingParams


@dataclass(slots=True)
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False


@dataclass(slots=True)
class AbortReq:
    rid: str


@dataclass(slots=True)
class ControlReq:
    """flush_cache / get_info / check_integrity; answered with a ControlOut of the same id."""
    kind: str
    req_id: int = 0


@dataclass(slots=True)
class ControlOut:
    kind: str
    req_id: int
    result: object = None


@dataclass(slots=True)
class ReqOutput:
    """What a request produced since its last output (everything when `finished`)."""
    rid: str
    new_ids: list[int]
    finished: dict | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[float, int]]] | None = None
    error: str | None = None  # set when the request was rejected (finished type "abort")
    internal: bool = False  # the error is the server's (a failed step), not the request's


class OutputAccum:
    """A request's ReqOutputs so far, and the native result object (/generate, Engine) they
    make. Prompt logprobs come once, as soon as the prompt is computed."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list = []
        self.input_logprobs: list | None = None
        self.input_tops: list | None = None
        self.last: ReqOutput | None = None

    def add(self, out: ReqOutput) -> None:
        self.ids.extend(out.new_ids)
        self.logprobs.extend(out.output_logprobs)
        self.tops.extend(out.output_top_logprobs)
        if out.input_logprobs is not None:
            self.input_logprobs, self.input_tops = out.input_logprobs, out.input_top_logprobs
        self.last = out

    def result(self, rid: str, text: str) -> dict:
        o = self.last
        meta: dict = {"id": rid, "prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
                      "cached_tokens": o.cached_tokens, "finish_reason": o.finished}
        if o.error:
            meta["error"] = o.error
            if o.internal:
                meta["internal_error"] = True
        if self.logprobs:
            meta["output_token_logprobs"] = list(zip(self.logprobs, self.ids))
            if self.tops:
                meta["output_top_logprobs"] = self.tops
        if self.input_logprobs is not None:
            meta["input_token_logprobs"] = self.input_logprobs
            meta["input_top_logprobs"] = self.input_tops
        return {"text": text, "output_ids": list(self.ids), "meta_info": meta}
