"""Sampling glue: turn a batch of requests into the fused sampler's per-row tensors, fill the
grammar / min-tokens bitmask, draw, and gather logprobs. The fused Triton kernel runs on CUDA;
its pure-torch reference (same signature) on CPU."""
from __future__ import annotations

from typing import NamedTuple

import torch

from treadle.kernels import sampling as sk
from treadle.runtime.request import Req


class SampleResult(NamedTuple):
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[float, int]] | None]


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, eos_token_ids: tuple[int, ...]) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.eos_token_ids = tuple(eos_token_ids)
        self.words = (vocab_size + 31) // 32
        self._mask_buf = torch.empty((0, self.words), dtype=torch.int32)

    def _bitmask(self, reqs: list[Req]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """int32 [B, words] with grammar rows filled by their matcher and rows still under
        min_new_tokens with their stop tokens cleared; None when no row is constrained."""
        rows = [i for i, r in enumerate(reqs)
                if r.grammar is not None or len(r.output_ids) < r.params.min_new_tokens]
        if not rows:
            return None, None
        if self._mask_buf.shape[0] < len(reqs):  # one host buffer, reused across steps
            self._mask_buf = torch.empty((max(len(reqs), 2 * self._mask_buf.shape[0]), self.words),
                                         dtype=torch.int32)
        mask = self._mask_buf[: len(reqs)]
        mask.fill_(-1)
        for i in rows:
            r = reqs[i]
            if r.grammar is not None:
                r.grammar.fill_next_token_bitmask(mask, i)
            if len(r.output_ids) < r.params.min_new_tokens:
                stops = set(r.params.stop_token_ids)
                if not r.params.ignore_eos:
                    stops |= set(self.eos_token_ids)
                for t in stops:
                    if t < self.vocab_size:
                        # clear bit t % 32 of word t // 32 (int32 arithmetic: wrap the sign bit)
                        w = int(mask[i, t // 32]) & ~(1 << (t % 32))
                        mask[i, t // 32] = w - (1 << 32) if w >= (1 << 31) else w
        has = torch.zeros(len(reqs), dtype=torch.bool)
        has[rows] = True
        # the CPU path reads the buffer in place; it is refilled only at the next step
        return mask.to(self.device, non_blocking=True), has.to(self.device, non_blocking=True)

    def _penalty_counts(self, reqs: list[Req]) -> torch.Tensor | None:
        if not any(r.params.frequency_penalty or r.params.presence_penalty or r.params.repetition_penalty != 1
                   for r in reqs):
            return None
        counts = torch.zeros(len(reqs), self.vocab_size, dtype=torch.int32)
        for i, r in enumerate(reqs):
            if r.output_ids:
                ids = torch.tensor(r.output_ids, dtype=torch.int64)
                counts[i].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        return counts.to(self.device, non_blocking=True)

    def sample(self, logits: torch.Tensor, reqs: list[Req]) -> SampleResult:
        """logits: float32 [B, vocab] for `reqs` in order. Draws one token per request (does not
        change the requests). Row i's RNG stream is (seed, output position), so a seeded
        request gets the same tokens whatever batch it runs in."""
        def col(values, dtype):
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        ps = [r.params for r in reqs]
        bitmask, mask_rows = self._bitmask(reqs)
        counts = self._penalty_counts(reqs)
        if bitmask is None and counts is None and all(p.is_greedy for p in ps):
            # all-greedy and unconstrained: an argmax is all there is to do (one read of the logits)
            ids = logits.argmax(dim=-1)
            logprobs = logits.gather(1, ids[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
        else:
            batch = sk.SamplingBatch(
                temperatures=col([0.0 if p.is_greedy else p.temperature for p in ps], torch.float32),
                top_ps=col([p.top_p for p in ps], torch.float32),
                top_ks=col([p.top_k for p in ps], torch.int32),
                min_ps=col([p.min_p for p in ps], torch.float32),
                seeds=col([r.seed for r in reqs], torch.int64),
                steps=col([len(r.output_ids) for r in reqs], torch.int64),
                bitmask=bitmask,
                mask_rows=mask_rows,
                token_counts=counts,
                frequency_penalties=col([p.frequency_penalty for p in ps], torch.float32),
                presence_penalties=col([p.presence_penalty for p in ps], torch.float32),
                repetition_penalties=col([p.repetition_penalty for p in ps], torch.float32),
            )
            fn = sk.fused_sample if logits.is_cuda else sk.fused_sample_ref
            ids, logprobs = fn(logits, batch)
        top: list[list[tuple[float, int]] | None] = [None] * len(reqs)
        want = [i for i, r in enumerate(reqs) if r.return_logprob and r.top_logprobs_num > 0]
        if want:
            k = max(reqs[i].top_logprobs_num for i in want)
            vals, idx = torch.log_softmax(logits[want], dim=-1).topk(k, dim=-1)
            vals, idx = vals.tolist(), idx.tolist()
            for j, i in enumerate(want):
                n = reqs[i].top_logprobs_num
                top[i] = list(zip(vals[j][:n], idx[j][:n]))
        return SampleResult(ids.tolist(), logprobs.tolist(), top)


def prompt_logprobs(logits: torch.Tensor, next_ids: list[int], top_k: int
                    ) -> tuple[list[float], list[list[tuple[float, int]]]]:
    """Logprob of each next prompt token under the logits at the previous position.
    logits: [N, vocab] float32; next_ids: N token ids."""
    lp = torch.log_softmax(logits, dim=-1)
    chosen = lp.gather(1, torch.tensor(next_ids, device=lp.device)[:, None]).squeeze(1).tolist()
    tops: list[list[tuple[float, int]]] = []
    if top_k > 0:
        vals, idx = lp.topk(top_k, dim=-1)
        tops = [list(zip(v, i)) for v, i in zip(vals.tolist(), idx.tolist())]
    return chosen, tops
