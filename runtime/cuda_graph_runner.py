"""CUDA graphs for decode and short extends: the whole model forward is captured once per
shape of a ladder and replayed, so a step costs a handful of copies and one graph launch
instead of hundreds of kernel launches from Python (an eager forward of llama3-8b is
launch-bound: 11-21 ms on the H200 against 4.1-4.4 ms for a decode graph).

Decode: a batch is padded up to the next captured size, all captured at start. Padding rows
decode a dummy request: its req_to_token row points every position at KV slot 0 (the pool's
reserved dummy slot), it has sequence length 1 and writes its K/V into slot 0, so it never
touches a real request's KV.

Short extends (jump-forward and n-gram verify steps, small prefills): every request gets a
fixed slot of E tokens (E = 4, 8, 16, 32 or 64, the smallest that holds its longest extend), the
batch is padded to the next ladder size, and the graph of (batch, E) is captured the first
time that shape comes. A request's tokens fill the start of its slot; the rest of the slot,
and padding requests (extend length 0, so attention skips them), write their K/V into slot
0. Logits are computed for every row and the requested ones gathered after the replay.
"""
from __future__ import annotations

import bisect
import contextlib
import gc
import logging
import time
from typing import TYPE_CHECKING

import torch

from treadle.kernels.decode_attention import default_kv_splits
from treadle.runtime.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from treadle.runtime.model_runner import ModelRunner

log = logging.getLogger("treadle")

_LADDER = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512]
_EXTEND_WIDTHS = (4, 8, 16, 32, 64)  # tokens per request slot in an extend graph


@contextlib.contextmanager
def _no_collection():
    """No automatic garbage collection while a graph is captured: an object it frees may make
    a CUDA call that invalidates the capture (an earlier engine's CUDA graph being reset, in
    tests that run several engines in one process). torch.cuda.graph collects just before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CudaGraphRunner:
    def __init__(self, runner: "ModelRunner", max_bs: int, extend_max_tokens: int = 0) -> None:
        self.runner = runner
        self.sizes = [b for b in _LADDER if b <= max_bs] or [1]
        n = self.sizes[-1]
        dev = runner.device
        pool = runner.req_to_token_pool
        self.dummy_row = pool.reserve()  # kept through a failed step's recovery (pool.clear())
        assert self.dummy_row is not None, "the request table keeps a spare row for graph padding"
        pool.req_to_token[self.dummy_row].zero_()  # every position -> dummy slot 0
        i64 = dict(dtype=torch.int64, device=dev)
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.out_cache_loc = torch.zeros(n, **i64)
        self.req_pool_indices = torch.full((n,), self.dummy_row, **i64)
        self.seq_lens = torch.ones(n, **i64)
        self.prefix_lens = torch.zeros(n, **i64)
        self.extend_lens = torch.ones(n, **i64)
        self.extend_start_loc = torch.arange(n, **i64)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        t0 = time.perf_counter()
        self._capture_all()
        log.info("captured %d decode CUDA graphs (bs %d..%d) in %.1fs", len(self.sizes), self.sizes[0],
                 self.sizes[-1], time.perf_counter() - t0)
        # short extends: (batch sizes of the ladder, E) with batch * E <= extend_max_tokens
        self.ext_sizes = {e: [b for b in self.sizes if b * e <= extend_max_tokens] for e in _EXTEND_WIDTHS}
        self.ext_sizes = {e: bs for e, bs in self.ext_sizes.items() if bs}
        t_max = max((bs[-1] * e for e, bs in self.ext_sizes.items()), default=0)
        b_max = max((bs[-1] for bs in self.ext_sizes.values()), default=0)
        self.ext_ids = torch.zeros(t_max, **i64)
        self.ext_positions = torch.zeros(t_max, **i64)
        self.ext_loc = torch.zeros(t_max, **i64)
        self.ext_rows = torch.full((b_max,), self.dummy_row, **i64)
        self.ext_prefix = torch.zeros(b_max, **i64)
        self.ext_lens = torch.zeros(b_max, **i64)
        self.ext_seq = torch.zeros(b_max, **i64)
        # slot starts 0, E, 2E, ... per width (width 1: every row)
        self._starts = {w: torch.arange(0, max(t_max, 1) * w, w, **i64) for w in (1, *_EXTEND_WIDTHS)}
        self.ext_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.ext_logits: torch.Tensor | None = None  # [max tokens, vocab], written by every extend graph
        self._ext_pool = None

    def _batch(self, bs: int) -> ForwardBatch:
        r = self.runner
        fb = ForwardBatch(mode=ForwardMode.DECODE, input_ids=self.input_ids[:bs], positions=self.positions[:bs],
                          out_cache_loc=self.out_cache_loc[:bs], req_pool_indices=self.req_pool_indices[:bs],
                          seq_lens=self.seq_lens[:bs], prefix_lens=self.prefix_lens[:bs],
                          extend_lens=self.extend_lens[:bs], extend_start_loc=self.extend_start_loc[:bs],
                          logits_indices=self.extend_start_loc[:bs], seq_lens_cpu=[1] * bs,
                          extend_lens_cpu=[1] * bs)
        fb.attn_backend = r.attn_backend
        num_kv_heads = r.kv_pool.k_buffers[0].shape[1]
        # fixed at capture: sized for the longest context, each program finds its own range
        fb.attn_meta = {"max_seq_len": r.context_len, "max_extend_len": 1,
                        "kv_splits": default_kv_splits(bs, num_kv_heads, r.context_len, r.device)}
        return fb

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        model = self.runner.model
        return model.compute_logits(model(fb.input_ids, fb.positions, fb))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        mem_pool = None
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):  # largest first: smaller graphs reuse its memory pool
            fb = self._batch(bs)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile / autotune outside the capture
                    self._forward(fb)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with _no_collection(), torch.cuda.graph(g, pool=mem_pool, stream=stream):
                out = self._forward(fb)
            mem_pool = g.pool()
            self.graphs[bs], self.outputs[bs] = g, out
        torch.cuda.synchronize()

    def close(self) -> None:
        """Free every captured graph now, not whenever the garbage collector reaches them
        (perhaps while another engine in this process captures)."""
        torch.cuda.synchronize()
        for g in [*self.graphs.values(), *self.ext_graphs.values()]:
            g.reset()
        self.graphs.clear()
        self.outputs.clear()
        self.ext_graphs.clear()

    def can_run(self, fb: ForwardBatch) -> bool:
        if fb.mode is ForwardMode.DECODE:
            return 0 < fb.batch_size <= self.sizes[-1]
        return self._extend_shape(fb) is not None

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits of fb's requested rows: [bs, vocab] for decode (a view into the graph's
        output buffer, valid until the next replay), [len(logits_indices), vocab] for an
        extend (a copy)."""
        if fb.mode is not ForwardMode.DECODE:
            return self._replay_extend(fb, self._extend_shape(fb))
        bs = fb.batch_size
        padded = self.sizes[bisect.bisect_left(self.sizes, bs)]
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        self.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        if padded > bs:
            self.input_ids[bs:padded].zero_()
            self.positions[bs:padded].zero_()
            self.out_cache_loc[bs:padded].zero_()
            self.req_pool_indices[bs:padded].fill_(self.dummy_row)
            self.seq_lens[bs:padded].fill_(1)
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]

    # ------------------------------------------------------------------ short extends

    def _extend_shape(self, fb: ForwardBatch) -> tuple[int, int] | None:
        """(padded batch, tokens per request) of a captured or capturable extend graph."""
        lens = fb.extend_lens_cpu
        if not self.ext_sizes or not lens:
            return None
        longest, bs = max(lens), len(lens)
        for e, sizes in self.ext_sizes.items():
            if longest <= e:
                return (sizes[bisect.bisect_left(sizes, bs)], e) if bs <= sizes[-1] else None
        return None

    def _extend_batch(self, pbs: int, e: int) -> ForwardBatch:
        r = self.runner
        t = pbs * e
        fb = ForwardBatch(mode=ForwardMode.EXTEND, input_ids=self.ext_ids[:t], positions=self.ext_positions[:t],
                          out_cache_loc=self.ext_loc[:t], req_pool_indices=self.ext_rows[:pbs],
                          seq_lens=self.ext_seq[:pbs], prefix_lens=self.ext_prefix[:pbs],
                          extend_lens=self.ext_lens[:pbs], extend_start_loc=self._starts[e][:pbs],
                          logits_indices=self._starts[1][:t], seq_lens_cpu=[e] * pbs, extend_lens_cpu=[e] * pbs)
        fb.attn_backend = r.attn_backend
        fb.attn_meta = {"max_seq_len": r.context_len, "max_extend_len": e, "kv_splits": 1}
        return fb

    @torch.inference_mode()
    def _capture_extend(self, shape: tuple[int, int]) -> None:
        pbs, e = shape
        t0 = time.perf_counter()
        fb = self._extend_batch(pbs, e)
        # capture inputs: dummy requests extending by e tokens, all in the dummy slot
        self.ext_ids.zero_()
        self.ext_positions.zero_()
        self.ext_loc.zero_()
        self.ext_rows.fill_(self.dummy_row)
        self.ext_prefix.zero_()
        self.ext_lens.fill_(e)
        self.ext_seq.fill_(e)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile / autotune outside the capture
                warm = self._forward(fb)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if self.ext_logits is None:  # one logits buffer for every extend graph
            self.ext_logits = torch.empty(self.ext_ids.shape[0], warm.shape[1], dtype=warm.dtype,
                                          device=warm.device)
        del warm
        g = torch.cuda.CUDAGraph()
        with _no_collection(), torch.cuda.graph(g, pool=self._ext_pool, stream=stream):
            # the graph's own logits are scratch in the shared pool, copied out before it ends
            self.ext_logits[:pbs * e].copy_(self._forward(fb))
        self._ext_pool = g.pool()
        self.ext_graphs[shape] = g
        torch.cuda.synchronize()
        log.info("captured the extend CUDA graph of %d requests x %d tokens in %.2fs", pbs, e,
                 time.perf_counter() - t0)

    def _replay_extend(self, fb: ForwardBatch, shape: tuple[int, int]) -> torch.Tensor:
        from treadle.runtime.forward_batch import to_device

        if shape not in self.ext_graphs:
            self._capture_extend(shape)
        pbs, e = shape
        bs, lens = fb.batch_size, fb.extend_lens_cpu
        # row of each packed token in the slotted layout: request i's j-th token -> i * e + j
        dst = to_device([i * e + j for i, n in enumerate(lens) for j in range(n)], self.ext_ids.device)
        t = pbs * e
        self.ext_ids[:t].zero_()
        self.ext_positions[:t].zero_()
        self.ext_loc[:t].zero_()  # unused rows write their K/V into the dummy slot
        self.ext_ids.index_copy_(0, dst, fb.input_ids)
        self.ext_positions.index_copy_(0, dst, fb.positions)
        self.ext_loc.index_copy_(0, dst, fb.out_cache_loc)
        self.ext_rows[:bs].copy_(fb.req_pool_indices)
        self.ext_prefix[:bs].copy_(fb.prefix_lens)
        self.ext_lens[:bs].copy_(fb.extend_lens)
        self.ext_seq[:bs].copy_(fb.seq_lens)
        if pbs > bs:  # padding requests extend by nothing: attention leaves them alone
            self.ext_rows[bs:pbs].fill_(self.dummy_row)
            self.ext_prefix[bs:pbs].zero_()
            self.ext_lens[bs:pbs].zero_()
            self.ext_seq[bs:pbs].zero_()
        self.ext_graphs[shape].replay()
        return self.ext_logits.index_select(0, dst[fb.logits_indices])
