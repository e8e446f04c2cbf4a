"""Req: one generation request's state inside the scheduler.

KV bookkeeping (page size 1). `fill_ids = input_ids + output_ids + draft`; its first `kv_len` tokens have
KV in the pool, addressed by req_to_token[req_pool_idx, 0:kv_len]. Of those, the first
`prefix_len` slots belong to the radix tree (matched or inserted, locked via `last_node`); the
rest are owned by this request alone. The last sampled token never has KV yet.

    fill_ids:  [ prompt ........................ | output ....... ]
    slots:     [ tree (locked) 0:prefix_len | owned prefix_len:kv_len ]  (kv_len <= len(fill_ids))
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from treadle.runtime.sampling_params import SamplingParams


@dataclass(slots=True, eq=False)
class Req:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    seed: int
    return_logprob: bool = False
    logprob_start_len: int = -1  # >= 0: return prompt-token logprobs from this position
    top_logprobs_num: int = 0
    stream: bool = False
    # when it joined the waiting queue, for the starvation bound (schedule_policy.starved); set
    # again when it is retracted (scheduler._retract)
    arrival: float = field(default_factory=time.monotonic)

    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    prefix_len: int = 0
    last_node: Any = None
    kv_len: int = 0
    cached_tokens: int = 0  # prompt tokens served from the tree at first admission
    admitted_once: bool = False
    num_retractions: int = 0
    finished: dict | None = None

    grammar: Any = None  # GrammarMatcher once compiled
    grammar_error: str | None = None  # its mask could not be computed (a lazy index past its cap)
    grammar_future: Any = None
    num_jump_tokens: int = 0  # tokens appended by jump-forward (not drawn by the sampler)
    # Verified jump-forward (and n-gram speculation): tokens proposed after the last output
    # token, computed in the next extend and kept only as far as the sampler's own choice
    # agrees. Not output yet: never streamed, never in output_ids.
    draft: list[int] = field(default_factory=list)
    draft_masks: Any = None  # int32 [len(draft) + 1, words]: the grammar mask at each draft position
    draft_kind: str = ""  # "jump" (a grammar's forced text) or "ngram" (speculative)
    # the longest jump draft to propose next: after a draft the model left early, twice what it
    # kept (at least 1), after one it took whole, twice its length (scheduler._verify_draft)
    jump_cap: int | None = None
    stop_bytes: int | None = None  # the longest stop string's UTF-8 bytes, measured once (scheduler._stop_window)
    ngram: Any = None  # NgramIndex of prompt + output, for n-gram drafts (speculative decoding)
    logit_bias_index: Any = None  # (token ids, values) tensors of params.logit_bias, built at its first step
    stop_ban: Any = None  # (device tensor of the stop ids banned under min_new_tokens, host word mask), built once

    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs_sent: bool = False
    sent_len: int = 0  # output tokens already reported to the caller
    first_token_at: float | None = None  # time.monotonic() of its first output token (TTFT)

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids + self.draft

    @property
    def last_token(self) -> int:
        """The newest token (the decode step's input), without building fill_ids."""
        if self.draft:
            return self.draft[-1]
        return self.output_ids[-1] if self.output_ids else self.input_ids[-1]

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids) + len(self.draft)

    @property
    def num_pending(self) -> int:
        """Tokens to compute before the next sample (1 while decoding)."""
        return self.seq_len - self.kv_len

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0

    def remaining_new_tokens(self) -> int:
        return max(0, self.params.max_new_tokens - len(self.output_ids))

    def finish(self, kind: str, **extra: Any) -> None:
        if self.finished is None:
            self.finished = {"type": kind, **extra}
