"""The attention kernels never let the dummy KV slot's contents into a real request's output.

CUDA-graph padding (padded decode requests, the unused rows of an extend graph's slots) writes
whatever it computed into slot 0, and that can be NaN or inf (an int4 model's padded rows did,
on an H100: every request of the graph then came out NaN). The kernels map masked positions
of a block to slot 0; they must read them as 0, since p = 0 times a NaN value is still NaN.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton is imported (the conftest does the same)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from treadle.kernels.decode_attention import decode_attention, decode_attention_ref  # noqa: E402
from treadle.kernels.extend_attention import extend_attention, extend_attention_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _pool(seq_lens: list[int], hk: int, d: int, dtype: torch.dtype, poison: float):
    """Random K/V in slots 1.., slot 0 (the dummy every masked position maps to) holds `poison`."""
    g = torch.Generator().manual_seed(11)
    n = sum(seq_lens) + 1
    kb = torch.randn(n, hk, d, generator=g).to(dtype)
    vb = torch.randn(n, hk, d, generator=g).to(dtype)
    kb[0] = poison
    vb[0] = poison
    r2t = torch.zeros(len(seq_lens), max(seq_lens) + 3, dtype=torch.int32)
    slots = 1 + torch.randperm(n - 1, generator=g)
    used = 0
    for b, length in enumerate(seq_lens):
        r2t[b, :length] = slots[used:used + length].to(torch.int32)
        used += length
    rows = torch.arange(len(seq_lens))
    return g, kb.to(DEVICE), vb.to(DEVICE), r2t.to(DEVICE), rows.to(DEVICE)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_ignores_a_poisoned_dummy_slot(poison, dtype):
    seq_lens = [5, 37, 1]  # none a multiple of the key block: each ends in masked positions
    g, kb, vb, r2t, rows = _pool(seq_lens, 2, 16, dtype, poison)
    q = torch.randn(len(seq_lens), 4, 16, generator=g).to(dtype).to(DEVICE)
    lens = torch.tensor(seq_lens, device=DEVICE)
    for splits in (1, 3):
        out = torch.empty_like(q)
        decode_attention(q, kb, vb, out, r2t, rows, lens, 0.3, max_kv_splits=splits)
        want = torch.empty_like(q)
        decode_attention_ref(q, kb, vb, want, r2t, rows, lens, 0.3)
        assert torch.isfinite(want).all()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_ignores_a_poisoned_dummy_slot(poison, dtype):
    prefix, ext = [3, 0, 20], [4, 7, 9]  # diagonal blocks end mid-block
    seq = [p + e for p, e in zip(prefix, ext)]
    g, kb, vb, r2t, rows = _pool(seq, 2, 16, dtype, poison)
    q = torch.randn(sum(ext), 4, 16, generator=g).to(dtype).to(DEVICE)
    starts = torch.tensor([0] + ext[:-1]).cumsum(0).to(DEVICE)
    as_idx = lambda xs: torch.tensor(xs, device=DEVICE)  # noqa: E731
    out = torch.empty_like(q)
    extend_attention(q, kb, vb, out, r2t, rows, as_idx(prefix), as_idx(ext), starts, 0.3)
    want = torch.empty_like(q)
    extend_attention_ref(q, kb, vb, want, r2t, rows, as_idx(prefix), as_idx(ext), starts, 0.3)
    assert torch.isfinite(want).all()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), want.float(), atol=tol, rtol=tol)
