"""Sampling glue: turn a batch of requests into the fused sampler's per-row tensors, fill the
grammar / min-tokens bitmask, draw, and gather logprobs. The fused Triton kernel runs on CUDA;
its pure-torch reference (same signature) on CPU."""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from treadle.kernels import sampling as sk
from treadle.runtime.forward_batch import to_device
from treadle.runtime.request import Req


class SampleResult(NamedTuple):
    token_ids: list[int]  # -1 for a row whose logits were not finite (its request must fail)
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
        """int32 [B, words] with grammar rows filled by their matcher, their stop tokens cleared
        under min_new_tokens (`forbid_early_stop`); None when no row has a grammar (the other
        rows' min_new_tokens is a logits ban, see `_biased`)."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return None, None
        if self._mask_buf.shape[0] < len(reqs):  # one host buffer, reused across steps
            # pinned on CUDA: the copy to the device then does not wait for the GPU's queue (the
            # buffer is refilled only after the step that read it has been waited for)
            self._mask_buf = torch.empty((max(len(reqs), 2 * self._mask_buf.shape[0]), self.words),
                                         dtype=torch.int32, pin_memory=self.device.type == "cuda")
        mask = self._mask_buf[: len(reqs)]
        mask.fill_(-1)
        for i in rows:
            try:
                reqs[i].grammar.fill_next_token_bitmask(mask, i)
            except ValueError as e:  # a lazy index past its cap (lazy_index.py): this request alone fails
                reqs[i].grammar_error = str(e)
                mask[i].fill_(-1)  # any token: the scheduler ends the request before reading it
                continue
            self.forbid_early_stop(mask, i, reqs[i], len(reqs[i].output_ids))
        has = [r.grammar is not None for r in reqs]
        # the CPU path reads the buffer in place; it is refilled only at the next step
        return mask.to(self.device, non_blocking=True), to_device(has, self.device, torch.bool)

    def forbid_early_stop(self, mask: torch.Tensor, row: int, req: Req, num_output: int) -> None:
        """Clear the stop tokens of ``mask[row]`` (host int32) while a request with
        ``num_output`` output tokens is still under its min_new_tokens, unless the row allows
        nothing else: a grammar that can only end here ends (its end wins over min_new_tokens;
        an empty row would draw a token the grammar refuses)."""
        if num_output >= req.params.min_new_tokens:
            return
        clear = self._stop_ban(req)[1]
        if clear is None:
            return
        # the row's words as unsigned 32-bit values in int64: clearing bit 31 of a negative int32
        # word one token at a time in Python ints went below int32's range (a RuntimeError that
        # failed the whole step; found by helper-54); and one tensor op instead of two a stop token
        bits = mask[row].to(torch.int64) & 0xFFFFFFFF
        bits &= ~clear
        if bool(bits.any()):  # else the row allows nothing else, and stays as it was
            mask[row] = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32)

    def _stop_ids(self, req: Req) -> list[int]:
        """The tokens that would end ``req``: banned while it is under min_new_tokens."""
        stops = set(req.params.stop_token_ids) | (set() if req.params.ignore_eos else set(self.eos_token_ids))
        return sorted(t for t in stops if t < self.vocab_size)

    def _stop_ban(self, req: Req) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``req``'s stop tokens as the sampler bans them under min_new_tokens, made once per
        request (they do not change): the ids on this sampler's device (for the logits) and the
        bits to clear in a host bitmask row (int64 words); (None, None) without stop tokens.
        Rebuilding them from the request's lists at every step cost a batch of 32 requests with
        40,000 stop_token_ids each 560 ms a step (helper-68)."""
        if req.stop_ban is None:
            stops = self._stop_ids(req)
            if not stops:
                req.stop_ban = (None, None)
            else:
                t = torch.tensor(stops, dtype=torch.int64)
                # distinct tokens are distinct bits, so their sum within a word is their OR
                clear = torch.zeros(self.words, dtype=torch.int64).index_add_(
                    0, t // 32, torch.ones_like(t) << (t % 32))
                req.stop_ban = (t.to(self.device), clear)
        return req.stop_ban

    def _biased(self, logits: torch.Tensor, reqs: list[Req], ban_early_stops: bool) -> torch.Tensor:
        """`logits` plus the rows' logit_bias, and -inf at the stop tokens of rows without a
        grammar still under min_new_tokens (when `ban_early_stops`; grammar rows have it in
        their mask): a new tensor, the same one when no row has either. The ban as logits
        keeps an all-greedy batch on the plain argmax."""
        banned: list[tuple[int, torch.Tensor]] = []
        biased: list[tuple[int, Req]] = []
        for i, r in enumerate(reqs):
            p = r.params
            if p.logit_bias:
                biased.append((i, r))
            if ban_early_stops and r.grammar is None and len(r.output_ids) < p.min_new_tokens:
                stops = self._stop_ban(r)[0]
                if stops is not None:
                    banned.append((i, stops))
        if not banned and not biased:
            return logits
        out = logits
        if biased:
            rows, cols, vals = [], [], []
            for i, r in biased:
                # a request's logit_bias (up to the whole vocabulary) is made tensors once, at its
                # first step: rebuilding 49k entries from the dict took 65 ms of every step of the
                # batch it ran in
                if r.logit_bias_index is None:
                    b = r.params.logit_bias
                    r.logit_bias_index = (to_device(list(b.keys()), logits.device),
                                          to_device(list(b.values()), logits.device, torch.float32))
                ids, bias = r.logit_bias_index
                rows.append(torch.full_like(ids, i))
                cols.append(ids)
                vals.append(bias)
            out = logits.index_put((torch.cat(rows), torch.cat(cols)), torch.cat(vals), accumulate=True)
        if banned:
            out = out.clone() if out is logits else out
            for i, stops in banned:  # one row at a time: a plain store, no accumulate
                out[i].index_fill_(0, stops, -float("inf"))
        return out

    def _penalty_counts(self, reqs: list[Req], outputs: list[list[int]]) -> torch.Tensor | None:
        if not any(r.params.has_penalties for r in reqs):
            return None
        counts = torch.zeros(len(reqs), self.vocab_size, dtype=torch.int32)
        for i, out in enumerate(outputs):
            if out:
                ids = torch.tensor(out, dtype=torch.int64)
                counts[i].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        return counts.to(self.device, non_blocking=True)

    def sample(self, logits: torch.Tensor, reqs: list[Req], masks: torch.Tensor | None = None,
               draft: list[int] | None = None) -> SampleResult:
        """logits: float32 [B, vocab] for `reqs` in order. Draws one token per request (does not
        change the requests). Row i's RNG stream is (seed, output position), so a seeded
        request gets the same tokens whatever batch it runs in. ``masks``: a host int32
        bitmask [B, words] to use instead of the requests' grammar state. ``draft``: the rows
        are one request's next k + 1 positions, row j after its output and ``draft[:j]`` (the
        RNG position and the penalties' counts move on with it), as draft verification needs:
        each row then draws what decoding one token at a time would."""
        return self.finish(self.launch(logits, reqs, masks, draft))

    def launch(self, logits: torch.Tensor, reqs: list[Req], masks: torch.Tensor | None = None,
               draft: list[int] | None = None) -> "PendingSample":
        """:meth:`sample` without waiting for the device: the tokens stay a device tensor
        (the overlap scheduler feeds them to the next forward) until :meth:`finish`."""
        dev = self.device
        ps = [r.params for r in reqs]
        outputs = [r.output_ids for r in reqs] if draft is None else \
            [reqs[0].output_ids + draft[:j] for j in range(len(reqs))]
        # draft verification's masks already clear early stops, position by position
        logits = self._biased(logits, reqs, ban_early_stops=masks is None)
        if masks is None:
            bitmask, mask_rows = self._bitmask(reqs)
        else:
            bitmask, mask_rows = masks.to(dev, non_blocking=True), None
        counts = self._penalty_counts(reqs, outputs)
        if bitmask is None and counts is None and all(p.is_greedy for p in ps):
            # all-greedy and unconstrained: an argmax is all there is to do (one read of the logits)
            ids = logits.argmax(dim=-1)
            if any(r.return_logprob for r in reqs):
                logprobs = logits.gather(1, ids[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
            else:  # nobody reads them (_process_token keeps them for return_logprob only): skip a pass
                logprobs = torch.zeros(len(reqs), device=logits.device)
        else:
            B = len(reqs)
            # one host->device copy per dtype
            f32 = to_device([0.0 if p.is_greedy else p.temperature for p in ps] + [p.top_p for p in ps]
                            + [p.min_p for p in ps] + [p.frequency_penalty for p in ps]
                            + [p.presence_penalty for p in ps] + [p.repetition_penalty for p in ps],
                            dev, torch.float32).view(6, B)
            # top_k >= vocab is no cut (the kernels' int32 must not see a larger value)
            i64 = to_device([min(p.top_k, self.vocab_size) for p in ps] + [r.seed for r in reqs]
                            + [len(out) for out in outputs], dev).view(3, B)
            batch = sk.SamplingBatch(
                temperatures=f32[0], top_ps=f32[1], top_ks=i64[0].to(torch.int32), min_ps=f32[2],
                seeds=i64[1], steps=i64[2], bitmask=bitmask, mask_rows=mask_rows, token_counts=counts,
                frequency_penalties=f32[3], presence_penalties=f32[4], repetition_penalties=f32[5],
            )
            fn = sk.fused_sample if logits.is_cuda else sk.fused_sample_ref
            ids, logprobs = fn(logits, batch)
        # a row whose logits hold a NaN or +inf (the model's, or a penalty's overflow) has no
        # distribution: its request fails alone (the scheduler sees token -1), the others draw
        # as usual. Computed on the device and copied with the tokens: no extra host sync. Its
        # device token becomes 0, so that an overlapped next step embeds a valid id.
        ok = (logits < float("inf")).all(dim=-1)  # False where NaN or +inf
        if counts is not None:  # a seen positive logit is divided by the repetition penalty
            rep = to_device([p.repetition_penalty for p in ps], dev, torch.float32)
            ok &= logits.amax(dim=-1).clamp_min(0) / rep < float("inf")
        ids = torch.where(ok, ids, torch.zeros_like(ids))
        want = [i for i, r in enumerate(reqs) if r.return_logprob and r.top_logprobs_num > 0]
        results = [ids, logprobs, ok]
        if want:
            k = min(max(reqs[i].top_logprobs_num for i in want), logits.shape[-1])
            rows = torch.tensor(want, device=logits.device)
            lsm = torch.log_softmax(logits[rows], dim=-1)
            top = lsm.topk(k, dim=-1)
            # these rows' chosen logprobs from the same log-softmax, so that a chosen token listed
            # among the top ones shows the same value (the sampler's own differs in the last bits)
            results[1] = logprobs.index_copy(0, rows, lsm.gather(1, ids[rows].long()[:, None]).squeeze(1)
                                             .to(logprobs.dtype))
            results += [top.values, top.indices]
        done = None
        if logits.is_cuda:
            # Start the copies to the host now, right behind the sampling kernel: a copy issued
            # at finish() would queue behind whatever the stream got meanwhile (the overlap
            # scheduler's next forward) and wait for all of it.
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in results]
            for h, t in zip(host, results):
                h.copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            results = host
        return PendingSample(ids, results, done, want, [r.top_logprobs_num for r in reqs])

    @staticmethod
    def finish(p: "PendingSample") -> SampleResult:
        """Wait for a launched sample's copies and read them on the host."""
        if p.done is not None:
            p.done.synchronize()
        ids, logprobs, ok, *top_t = (t.tolist() for t in p.host)
        ids = [t if good else -1 for t, good in zip(ids, ok)]
        top: list[list[tuple[float, int]] | None] = [None] * len(p.top_n)
        if p.want:
            vals, idx = top_t
            for j, i in enumerate(p.want):
                n = p.top_n[i]
                top[i] = list(zip(vals[j][:n], idx[j][:n]))
        return SampleResult(ids, logprobs, top)


class PendingSample(NamedTuple):
    token_ids: torch.Tensor  # int64 [B] on the device (the overlap scheduler's next input)
    host: list[torch.Tensor]  # ids, logprobs, finite rows[, top values, top indices]: host copies on CUDA
    done: Any  # torch.cuda.Event recorded after the copies (None on CPU)
    want: list[int]  # rows that asked for top logprobs
    top_n: list[int]  # per row: how many top logprobs


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
