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
