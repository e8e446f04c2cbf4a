"""Decode attention that rotates and stores the step's newest token itself
(kernels/decode_attention.py's NewToken): against kernels/rope.py's rotate-and-store followed by
the attention (its reference and its kernels), with and without Qwen3's per-head norm, one
split and several, an fp8 pool, a request of one token; the backend takes it at decode and the
models' decode steps give the same logits as with the rotation's own launch."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.decode_attention import NewToken, decode_attention, decode_attention_ref
from treadle.kernels.kv_store import FP8_KV_DTYPE
from treadle.kernels.rope import apply_rope, build_cos_sin_cache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def _case(seq_lens: list[int], hq: int, hk: int, d: int, dtype: torch.dtype, norm: bool, pool_dtype=None,
          seed: int = 0):
    """A shuffled paged pool holding every position but each request's newest, whose slot is
    given with its raw (unrotated) q/k/v heads."""
    g = torch.Generator().manual_seed(seed)
    num_slots = sum(seq_lens) + 5
    kb = torch.randn(num_slots, hk, d, generator=g).to(dtype)
    vb = torch.randn(num_slots, hk, d, generator=g).to(dtype)
    if pool_dtype is not None:
        kb, vb = kb.to(pool_dtype), vb.to(pool_dtype)
    r2t = torch.zeros(len(seq_lens) + 2, max(seq_lens) + 3, dtype=torch.int32)
    rows = torch.randperm(r2t.shape[0], generator=g)[: len(seq_lens)]
    slots = 1 + torch.randperm(num_slots - 1, generator=g)
    used = 0
    newest = []
    for row, n in zip(rows.tolist(), seq_lens):
        r2t[row, :n] = slots[used:used + n].to(torch.int32)
        newest.append(int(slots[used + n - 1]))
        used += n
    b = len(seq_lens)
    q = torch.randn(b, hq, d, generator=g).to(dtype)
    k = torch.randn(b, hk, d, generator=g).to(dtype)
    v = torch.randn(b, hk, d, generator=g).to(dtype)
    cos_sin = build_cos_sin_cache(d, max(seq_lens) + 8, 10000.0, None, "cpu")
    qk_norm = None
    if norm:
        qk_norm = ((torch.rand(d, generator=g) + 0.5).to(dtype).to(DEVICE),
                   (torch.rand(d, generator=g) + 0.5).to(dtype).to(DEVICE), 1e-6)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    new = NewToken(dev(k), dev(v), torch.tensor(newest, device=DEVICE), torch.tensor(seq_lens, device=DEVICE) - 1,
                   dev(cos_sin), qk_norm)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    return dev(q), dev(kb), dev(vb), dev(r2t), dev(rows), lens, new


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("group", [1, 4])
def test_new_token_rotated_and_stored_in_stage_one(dtype: torch.dtype, norm: bool, splits: int, group: int) -> None:
    hk, d = 2, 64
    q, kb, vb, r2t, rows, lens, new = _case([37, 1, 130], hk * group, hk, d, dtype, norm)
    kb_ref, vb_ref = kb.clone(), vb.clone()
    q_before = q.clone()
    out, want = torch.empty_like(q), torch.empty_like(q)
    decode_attention(q, kb, vb, out, r2t, rows, lens, d ** -0.5, max_kv_splits=splits, new=new)
    decode_attention_ref(q, kb_ref, vb_ref, want, r2t, rows, lens, d ** -0.5, new=new)
    assert torch.equal(q, q_before)  # q is read, not rotated in place
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)
    torch.testing.assert_close(vb, vb_ref, atol=0, rtol=0)  # values stored as they are
    torch.testing.assert_close(kb, kb_ref, atol=tol, rtol=tol)  # keys rotated (and normed) then stored
    assert not torch.equal(kb[new.slots], new.k) and torch.equal(vb[new.slots], new.v)


@needs_kernel
def test_new_token_matches_the_rotation_kernel_then_attention() -> None:
    # the same answer as the two launches it replaces: kernels/rope.py's rotate-and-store, then
    # decode attention of the rotated q
    q, kb, vb, r2t, rows, lens, new = _case([64, 9], 8, 2, 64, torch.float32, True, seed=3)
    kb2, vb2 = kb.clone(), vb.clone()
    out, want = torch.empty_like(q), torch.empty_like(q)
    decode_attention(q, kb, vb, out, r2t, rows, lens, 0.125, max_kv_splits=2, new=new)
    q2, k2 = q.clone(), new.k.clone()
    apply_rope(q2, k2, new.positions, new.cos_sin, new.qk_norm, kv_store=(kb2, vb2, new.slots, new.v))
    decode_attention(q2, kb2, vb2, want, r2t, rows, lens, 0.125, max_kv_splits=2)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kb, kb2, atol=1e-6, rtol=1e-6)


@needs_kernel
def test_new_token_into_an_fp8_pool() -> None:
    # against the two launches (the same casts to e5m2, whose steps are 25% apart: the torch
    # reference rounds some keys the other way under the interpreter)
    q, kb, vb, r2t, rows, lens, new = _case([20, 3], 4, 1, 32, torch.bfloat16, False, FP8_KV_DTYPE, seed=5)
    kb2, vb2 = kb.clone(), vb.clone()
    out, want = torch.empty_like(q), torch.empty_like(q)
    decode_attention(q, kb, vb, out, r2t, rows, lens, 0.2, max_kv_splits=3, new=new)
    q2, k2 = q.clone(), new.k.clone()
    apply_rope(q2, k2, new.positions, new.cos_sin, None, kv_store=(kb2, vb2, new.slots, new.v))
    decode_attention(q2, kb2, vb2, want, r2t, rows, lens, 0.2, max_kv_splits=3)
    assert torch.equal(kb.view(torch.uint8), kb2.view(torch.uint8)) and torch.equal(vb.view(torch.uint8),
                                                                                     vb2.view(torch.uint8))
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)


def test_new_token_rejects_bad_arguments() -> None:
    q, kb, vb, r2t, rows, lens, new = _case([5], 4, 2, 32, torch.float32, False)
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="positions must be int64"):
        decode_attention_ref(q, kb, vb, out, r2t, rows, lens, 0.2, new=new._replace(positions=new.positions.int()))
    with pytest.raises(ValueError, match="cos_sin_cache"):
        decode_attention_ref(q, kb, vb, out, r2t, rows, lens, 0.2, new=new._replace(cos_sin=new.cos_sin[:, :16]))
    with pytest.raises(ValueError, match="k must have shape"):
        decode_attention_ref(q, kb, vb, out, r2t, rows, lens, 0.2, new=new._replace(k=new.k[:, :1], v=new.v[:, :1]))
    with pytest.raises(ValueError, match="qk_norm"):
        decode_attention_ref(q, kb, vb, out, r2t, rows, lens, 0.2, new=new._replace(qk_norm=(1, 2)))
