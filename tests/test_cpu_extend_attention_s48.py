"""CPU extend attention with a cached prefix (prefix-cache hits, chunked-prefill chunks after the
first): `extend_attention_ref` serves a long chunk as two unmasked SDPA calls merged by
log-sum-exp instead of one call with a [chunk, prefix + chunk] mask. Results must equal plain
softmax attention; the fused kernel must never be handed a mask for such a chunk."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from treadle.kernels import extend_attention as ea


def _pool(reqs, hq, hk, d, dtype, seed):
    """A KV pool with the requests' slots scattered, plus their queries. reqs: [(prefix, ext)]."""
    g = torch.Generator().manual_seed(seed)
    total = sum(p + e for p, e in reqs)
    perm = torch.randperm(total + 7, generator=g)[:total] + 1  # slot 0 never used
    k_buf = torch.randn(total + 8, hk, d, generator=g).to(dtype)
    v_buf = torch.randn(total + 8, hk, d, generator=g).to(dtype)
    max_ctx = max(p + e for p, e in reqs)
    r2t = torch.zeros(len(reqs) + 1, max_ctx, dtype=torch.int32)
    at = 0
    for i, (p, e) in enumerate(reqs):
        r2t[i + 1, : p + e] = perm[at: at + p + e].to(torch.int32)
        at += p + e
    n = sum(e for _, e in reqs)
    q = torch.randn(n, hq, d, generator=g).to(dtype)
    starts = torch.tensor([0] + [e for _, e in reqs][:-1]).cumsum(0)
    meta = (torch.arange(1, len(reqs) + 1), torch.tensor([p for p, _ in reqs]),
            torch.tensor([e for _, e in reqs]), starts)
    return q, k_buf, v_buf, r2t, meta


def _softmax_attention(q, k_buf, v_buf, r2t, meta, scale):
    """Plain float64 softmax attention, one request at a time."""
    group = q.shape[1] // k_buf.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for row, p, e, s in zip(*(t.tolist() for t in meta)):
        slots = r2t[row, : p + e].long()
        k = k_buf[slots].double().repeat_interleave(group, 1).transpose(0, 1)  # [Hq, p+e, D]
        v = v_buf[slots].double().repeat_interleave(group, 1).transpose(0, 1)
        scores = q[s: s + e].double().transpose(0, 1) @ k.transpose(1, 2) * scale  # [Hq, e, p+e]
        visible = torch.arange(p + e)[None, :] <= torch.arange(p, p + e)[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[s: s + e] = (probs @ v).transpose(0, 1)
    return out


@pytest.mark.parametrize("hq,hk,dtype", [(9, 3, torch.float32), (8, 2, torch.bfloat16), (4, 4, torch.float32)])
def test_matches_softmax_attention(hq, hk, dtype):
    # chunks long enough for the split, prefix 0 (causal path), a 1-token prefix, short chunks
    reqs = [(300, 256), (1, 270), (0, 260), (513, 1), (40, 17), (600, 256)]
    d = 64
    q, k_buf, v_buf, r2t, meta = _pool(reqs, hq, hk, d, dtype, seed=hq * 10 + hk)
    o = torch.empty_like(q)
    ea.extend_attention_ref(q, k_buf, v_buf, o, r2t, *meta, sm_scale=d ** -0.5)
    want = _softmax_attention(q, k_buf, v_buf, r2t, meta, d ** -0.5)
    if dtype == torch.float32:
        torch.testing.assert_close(o.double(), want, atol=2e-6, rtol=1e-5)
    else:  # the output is rounded to bf16 once
        torch.testing.assert_close(o.double(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("prefix,ext", [(1, 1), (5, 1), (1, 9), (200, 1), (64, 3), (3, 64)])
def test_split_itself_exact_at_small_sizes(prefix, ext):
    # the merge below the size the runtime uses it at: chunk of 1, prefix of 1
    if ea._flash_lse_op() is None:
        pytest.fail("this torch lacks the fused CPU attention op with log-sum-exp")
    g = torch.Generator().manual_seed(prefix * 1000 + ext)
    hq, hk, d = 9, 3, 32
    q = torch.randn(ext, hq, d, generator=g).transpose(0, 1)[None]
    k, v = torch.randn(2, hk, prefix + ext, d, generator=g)
    got = ea._prefix_then_causal(q, k, v, prefix, 0.2)
    mask = torch.arange(prefix + ext)[None, :] <= torch.arange(prefix, prefix + ext)[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k[None].double(), v[None].double(), attn_mask=mask, scale=0.2, enable_gqa=True)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)


class _FusedCalls(TorchDispatchMode):
    """Records the attn_mask argument of every fused CPU attention call."""

    def __init__(self):
        super().__init__()
        self.masks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ == "_scaled_dot_product_flash_attention_for_cpu":
            self.masks.append(kwargs.get("attn_mask"))
        return func(*args, **kwargs)


def test_prefix_chunk_reaches_fused_kernel_without_mask():
    reqs = [(500, 300)]
    q, k_buf, v_buf, r2t, meta = _pool(reqs, 9, 3, 64, torch.float32, seed=1)
    o = torch.empty_like(q)
    with _FusedCalls() as calls:
        ea.extend_attention_ref(q, k_buf, v_buf, o, r2t, *meta, sm_scale=0.125)
    assert calls.masks, "no fused CPU attention call"
    assert all(m is None for m in calls.masks), [tuple(m.shape) for m in calls.masks if m is not None]
