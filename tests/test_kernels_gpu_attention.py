"""GPU tests of the paged-KV attention kernels at Llama-3-8B-like shapes (Hq 32, Hk 8, D 128, bf16).

Run on a CUDA machine: .venv/bin/python -m pytest -q -m gpu tests/test_kernels_gpu_attention.py
Each kernel is compared to its pure-torch reference on the same device. Tolerances: bf16 / fp16
atol = rtol = 2e-2 plus a mean-error bound of 2e-3 (both sides round the output to the half
type; the kernel also rounds softmax probabilities to bf16 before the PV product); fp32 1e-4.
"""
from __future__ import annotations

import pytest
import torch

from treadle.kernels.decode_attention import (
    decode_attention, decode_attention_ref, decode_workspace_numel, default_kv_splits,
)
from treadle.kernels.extend_attention import extend_attention, extend_attention_ref
from treadle.kernels.kv_store import store_kv, store_kv_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

HQ, HK, D = 32, 8, 128


def _check(out: torch.Tensor, want: torch.Tensor) -> None:
    tol = 1e-4 if out.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), want.float(), atol=tol, rtol=tol)
    assert (out.float() - want.float()).abs().mean().item() < tol / 10


def _pool(seq_lens: list[int], hk: int, d: int, dtype: torch.dtype, seed: int, pool_dtype: torch.dtype | None = None):
    """Random KV pool (in `pool_dtype`, default `dtype`); each request's positions map to
    shuffled distinct slots in a shuffled table row."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    num_slots = sum(seq_lens) + 1
    kb = torch.randn(num_slots, hk, d, device="cuda", generator=g).to(pool_dtype or dtype)
    vb = torch.randn(num_slots, hk, d, device="cuda", generator=g).to(pool_dtype or dtype)
    r2t = torch.zeros(len(seq_lens) + 4, max(seq_lens) + 8, dtype=torch.int32, device="cuda")
    rows = torch.randperm(r2t.shape[0], device="cuda", generator=g)[: len(seq_lens)]
    slots = 1 + torch.randperm(num_slots - 1, device="cuda", generator=g)
    used = 0
    for row, n in zip(rows.tolist(), seq_lens):
        r2t[row, :n] = slots[used : used + n].to(torch.int32)
        used += n
    return g, kb, vb, r2t, rows


def _lens(n: int, lo: int, hi: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


def _extend(prefix: list[int], ext: list[int], hq: int, hk: int, d: int, dtype: torch.dtype, seed: int = 0,
            pool_dtype: torch.dtype | None = None):
    g, kb, vb, r2t, rows = _pool([p + e for p, e in zip(prefix, ext)], hk, d, dtype, seed, pool_dtype)
    q = torch.randn(sum(ext), hq, d, device="cuda", generator=g).to(dtype)
    cu = torch.tensor([0] + ext, device="cuda").cumsum(0)
    args = (q, kb, vb, None, r2t, rows, torch.tensor(prefix, device="cuda", dtype=torch.int32),
            torch.tensor(ext, device="cuda", dtype=torch.int32), cu[:-1].to(torch.int32), d**-0.5)
    out, want = torch.empty_like(q), torch.empty_like(q)
    extend_attention(*args[:3], out, *args[4:])
    extend_attention_ref(*args[:3], want, *args[4:])
    torch.cuda.synchronize()
    _check(out, want)


@pytest.mark.parametrize(
    "batch, ext_range, prefix_range",
    [
        (1, (4096, 4096), (0, 0)),  # one 4k prompt, no prefix
        (1, (1000, 1000), (3000, 3000)),  # 1k new tokens after a 3k cached prefix
        (32, (1, 512), (0, 0)),
        (32, (1, 512), (1, 3584)),
        (128, (1, 64), (0, 0)),
        (128, (1, 64), (1, 4000)),  # jump-forward / chunk-tail sized extends over long prefixes
    ],
)
def test_extend_llama_shapes(batch, ext_range, prefix_range):
    ext = _lens(batch, *ext_range, seed=batch)
    prefix = _lens(batch, *prefix_range, seed=batch + 1)
    ext[0] = 1 if batch > 1 else ext[0]  # a single-token extend in every ragged batch
    _extend(prefix, ext, HQ, HK, D, torch.bfloat16, seed=batch)


@pytest.mark.parametrize(
    "hq, hk, d, dtype",
    [(32, 8, 64, torch.bfloat16), (16, 16, 128, torch.float16), (8, 2, 256, torch.bfloat16),
     (12, 4, 96, torch.bfloat16), (8, 8, 128, torch.float32), (28, 4, 128, torch.bfloat16)],
)
def test_extend_other_head_dims_and_dtypes(hq, hk, d, dtype):
    _extend([0, 300, 17], [700, 129, 1], hq, hk, d, dtype, seed=d)


def _decode(seq_lens: list[int], hq: int, hk: int, d: int, dtype: torch.dtype, seed: int = 0,
            pool_dtype: torch.dtype | None = None, **kwargs):
    g, kb, vb, r2t, rows = _pool(seq_lens, hk, d, dtype, seed, pool_dtype)
    q = torch.randn(len(seq_lens), hq, d, device="cuda", generator=g).to(dtype)
    lens = torch.tensor(seq_lens, device="cuda", dtype=torch.int32)
    out, want = torch.empty_like(q), torch.empty_like(q)
    decode_attention(q, kb, vb, out, r2t, rows, lens, d**-0.5, **kwargs)
    decode_attention_ref(q, kb, vb, want, r2t, rows, lens, d**-0.5)
    torch.cuda.synchronize()
    _check(out, want)


@pytest.mark.parametrize("batch", [1, 32, 128])
@pytest.mark.parametrize("splits", [None, 1, 16])
def test_decode_llama_shapes(batch, splits):
    seq = _lens(batch, 1, 4096, seed=batch)
    seq[0] = 4096 if batch == 1 else 1  # the longest context alone; a length-1 request in a batch
    _decode(seq, HQ, HK, D, torch.bfloat16, seed=batch, max_kv_splits=splits)


@pytest.mark.parametrize(
    "hq, hk, d, dtype",
    [(32, 8, 64, torch.bfloat16), (16, 16, 128, torch.float16), (8, 2, 256, torch.bfloat16),
     (12, 4, 96, torch.bfloat16), (8, 8, 128, torch.float32), (64, 1, 128, torch.bfloat16)],
)
def test_decode_other_head_dims_and_dtypes(hq, hk, d, dtype):
    _decode([1, 513, 2048, 77], hq, hk, d, dtype, seed=d)


def test_decode_in_cuda_graph_follows_new_seq_lens():
    """Captured once with fixed max_kv_splits + workspace; replays read new seq_lens / q on device."""
    batch, max_len = 16, 4096
    seq = _lens(batch, 1, max_len, seed=3)
    g, kb, vb, r2t, rows = _pool([max_len] * batch, HK, D, torch.bfloat16, seed=3)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor(seq, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    splits = default_kv_splits(batch, HK, max_len, "cuda")
    ws = torch.empty(decode_workspace_numel(batch, HQ, D, splits), device="cuda")

    def run() -> None:
        decode_attention(q, kb, vb, out, r2t, rows, lens, D**-0.5, max_kv_splits=splits, workspace=ws)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for step in range(3):
        lens.copy_(torch.tensor(_lens(batch, 1, max_len, seed=10 + step), device="cuda"))
        q.copy_(torch.randn_like(q))
        graph.replay()
        want = torch.empty_like(q)
        decode_attention_ref(q, kb, vb, want, r2t, rows, lens, D**-0.5)
        torch.cuda.synchronize()
        _check(out, want)


@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32])
def test_store_kv_llama_shapes(src_dtype):
    n = 4096
    kb = torch.randn(1 << 15, HK, D, device="cuda", dtype=torch.bfloat16)
    vb = torch.randn_like(kb)
    slots = torch.randperm(kb.shape[0], device="cuda")[:n]
    k = torch.randn(n, HK, D, device="cuda", dtype=src_dtype)
    v = torch.randn_like(k)
    kb2, vb2 = kb.clone(), vb.clone()
    store_kv(kb, vb, slots, k, v)
    store_kv_ref(kb2, vb2, slots, k, v)
    torch.cuda.synchronize()
    assert torch.equal(kb, kb2) and torch.equal(vb, vb2)


# ------------------------------------------------------------------ fp8 KV cache (float8_e5m2 pool)

FP8 = torch.float8_e5m2


@pytest.mark.parametrize("batch, ext_range, prefix_range", [(1, (4096, 4096), (0, 0)), (32, (1, 512), (1, 3584))])
def test_extend_fp8_pool_llama_shapes(batch, ext_range, prefix_range):
    ext = _lens(batch, *ext_range, seed=batch)
    prefix = _lens(batch, *prefix_range, seed=batch + 1)
    _extend(prefix, ext, HQ, HK, D, torch.bfloat16, seed=batch, pool_dtype=FP8)


@pytest.mark.parametrize("batch", [1, 128])
@pytest.mark.parametrize("splits", [None, 1])
def test_decode_fp8_pool_llama_shapes(batch, splits):
    seq = _lens(batch, 1, 4096, seed=batch)
    seq[0] = 4096 if batch == 1 else 1
    _decode(seq, HQ, HK, D, torch.bfloat16, seed=batch, pool_dtype=FP8, max_kv_splits=splits)


def test_store_kv_into_fp8_pool_rounds_like_torch():
    n = 4096
    kb = torch.zeros(1 << 15, HK, D, device="cuda", dtype=FP8)
    vb = torch.zeros_like(kb)
    slots = torch.randperm(kb.shape[0], device="cuda")[:n]
    k = torch.randn(n, HK, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kb2, vb2 = kb.clone(), vb.clone()
    store_kv(kb, vb, slots, k, v)
    store_kv_ref(kb2, vb2, slots, k, v)
    torch.cuda.synchronize()
    for got, want in ((kb, kb2), (vb, vb2)):
        steps = (got.view(torch.uint8).int() - want.view(torch.uint8).int()).abs()
        assert steps.max().item() <= 1  # same code, or a tie rounded the other way
        assert (steps == 0).float().mean().item() > 0.99
