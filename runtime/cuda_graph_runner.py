"""CUDA graphs for decode: the whole model forward of a decode batch is captured once per
batch size of a ladder and replayed, so a step costs a handful of copies and one graph launch
instead of hundreds of kernel launches from Python.

A batch is padded up to the next captured size. Padding rows decode a dummy request: its
req_to_token row points every position at KV slot 0 (the pool's reserved dummy slot), it has
sequence length 1 and writes its K/V into slot 0, so it never touches a real request's KV.
"""
from __future__ import annotations

import bisect
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


class CudaGraphRunner:
    def __init__(self, runner: "ModelRunner", max_bs: int) -> None:
        self.runner = runner
        self.sizes = [b for b in _LADDER if b <= max_bs] or [1]
        n = self.sizes[-1]
        dev = runner.device
        pool = runner.req_to_token_pool
        self.dummy_row = pool.alloc()
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
            with torch.cuda.graph(g, pool=mem_pool, stream=stream):
                out = self._forward(fb)
            mem_pool = g.pool()
            self.graphs[bs], self.outputs[bs] = g, out
        torch.cuda.synchronize()

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.mode is ForwardMode.DECODE and 0 < fb.batch_size <= self.sizes[-1]

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits [bs, vocab] of a decode batch (a view into the graph's output buffer, valid
        until the next replay)."""
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
