"""Messages crossing the scheduler boundary (in-process queues for the Engine, ZMQ between
processes for the server). Plain dataclasses: picklable and cheap."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from treadle.runtime.sampling_params import SamplingParams, sample_seed


@dataclass(slots=True)
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    return_text_in_logprobs: bool = False  # read where the result is made; the scheduler ignores it


def split_samples(r: TokenizedGenerateReq) -> list[TokenizedGenerateReq]:
    """n parallel samples become n requests "<rid>-<j>" sharing the prompt, whose KV they share
    through the radix cache once it is warmed; a seeded request's sample j draws with
    sample_seed(seed, j) (the server's and the Engine's samples alike)."""
    p = r.sampling_params
    if p.n == 1:
        return [r]
    out = []
    # json_schema_lenient's record of what it dropped is treadle's (from_dict refuses it from a
    # client): each sample takes it over, as it takes the schema it was made for (a lenient
    # request with n > 1 raised "json_schema_dropped is set by treadle", a 500)
    own = {**p.to_dict(), "n": 1, "json_schema_dropped": None}
    for j in range(p.n):
        seed = None if p.seed is None else sample_seed(p.seed, j)
        q = SamplingParams.from_dict({**own, "seed": seed})
        q.json_schema_dropped = p.json_schema_dropped
        out.append(dataclasses.replace(r, rid=f"{r.rid}-{j}", sampling_params=q))
    return out


@dataclass(slots=True)
class AbortReq:
    rid: str


@dataclass(slots=True)
class ControlReq:
    """flush_cache / get_info / check_integrity / check_grammars (`payload`: the (index,
    SamplingParams) of a batch's prompts with a grammar; answered once they have compiled,
    with {index: error} of the bad ones); answered with a ControlOut of the same id."""
    kind: str
    req_id: int = 0
    payload: object = None


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
    # time.monotonic() (system-wide on Linux: comparable across the server's processes) of the
    # first output token: a request's TTFT even when its output arrives only at the end
    first_token_at: float | None = None


class OutputAccum:
    """A request's ReqOutputs so far, and the native result object (/generate, Engine) they
    make. Prompt logprobs come once, as soon as the prompt is computed.

    Logprobs in the result are SGLang's: with `return_logprob`, `input_token_logprobs` and
    `output_token_logprobs` are lists of `(logprob, token_id, text)` (the first prompt token
    has logprob None; text is None unless `return_text_in_logprobs`), and with
    `top_logprobs_num` > 0, `input_top_logprobs` / `output_top_logprobs` hold one list of such
    triples a position (None where there is none: the first prompt token)."""

    def __init__(self, req: TokenizedGenerateReq, decode: Callable[[list[int]], list[str]] | None = None) -> None:
        self.req = req
        self.decode = decode if req.return_text_in_logprobs else None
        self.texts: dict[int, str] = {}  # token id -> its text, for return_text_in_logprobs
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list = []
        self.input_logprobs: list | None = None
        self.input_tops: list | None = None
        self.last: ReqOutput | None = None
        self.created = time.monotonic()  # for e2e_latency, as SGLang's meta_info (the scheduler's clock)
        # the result's logprob triples, made from the lists above when a result is asked for,
        # from where the last one stopped (a stream's chunk costs O(new tokens), and callers
        # that read only the raw lists, as the OpenAI shaper, never pay for them)
        self.meta: dict = {}
        self._made = 0  # output positions already in self.meta
        self._input_made: list | None = None  # the input_logprobs list they were made from

    def add(self, out: ReqOutput) -> None:
        self.ids.extend(out.new_ids)
        self.logprobs.extend(out.output_logprobs)
        self.tops.extend(out.output_top_logprobs)
        if out.input_logprobs is not None:
            self.input_logprobs, self.input_tops = out.input_logprobs, out.input_top_logprobs
        self.last = out

    def _triples(self, pairs: list[tuple]) -> list[tuple]:
        if self.decode is None:
            return [(lp, t, None) for lp, t in pairs]
        new = list({t for _, t in pairs if t not in self.texts})
        self.texts.update(zip(new, self.decode(new)))
        return [(lp, t, self.texts[t]) for lp, t in pairs]

    def _logprob_meta(self) -> dict:
        """The logprob triples so far, made only for what arrived since the last call."""
        r, meta, tops = self.req, self.meta, self.req.top_logprobs_num > 0
        if not meta:
            meta.update(input_token_logprobs=[], output_token_logprobs=[])
            if tops:
                meta.update(input_top_logprobs=[], output_top_logprobs=[])
        if self.input_logprobs is not None and self.input_logprobs is not self._input_made:
            # aligned with the prompt from logprob_start_len (-1: the last token), and no further
            # than they go: a request aborted while its prompt was scored in chunks has scores
            # for the first positions only (paired with the last ids, each had another's id)
            scored = self.input_logprobs
            start = r.logprob_start_len if r.logprob_start_len >= 0 else max(0, len(r.input_ids) - 1)
            prompt = r.input_ids[start:start + len(scored)]
            meta["input_token_logprobs"] = self._triples(list(zip(scored, prompt)))
            if tops:
                meta["input_top_logprobs"] = [self._triples(t) if t else None for t in (self.input_tops or [])]
            self._input_made = self.input_logprobs
        new = slice(self._made, len(self.logprobs))
        meta["output_token_logprobs"] += self._triples(list(zip(self.logprobs[new], self.ids[new])))
        if tops:
            meta["output_top_logprobs"] += [self._triples(t) if t else None for t in self.tops[new]]
        self._made = len(self.logprobs)
        return meta

    def result(self, rid: str, text: str) -> dict:
        o = self.last
        meta: dict = {"id": rid, "prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
                      "cached_tokens": o.cached_tokens, "finish_reason": o.finished}
        if o.finished is not None:  # seconds from the request's arrival to its end
            meta["e2e_latency"] = round(time.monotonic() - self.created, 6)
        if self.req.sampling_params.json_schema_dropped is not None:  # json_schema_lenient: never silent
            meta["json_schema_dropped"] = self.req.sampling_params.json_schema_dropped
        if o.error:
            meta["error"] = o.error
            if o.internal:
                meta["internal_error"] = True
        if self.req.return_logprob:  # copies: later outputs extend ours
            meta.update((k, list(v)) for k, v in self._logprob_meta().items())
        return {"text": text, "output_ids": list(self.ids), "meta_info": meta}
