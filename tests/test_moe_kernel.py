"""kernels/fused_moe.py vs a per-pair loop written out here and vs its own references: small
shapes on CPU (TRITON_INTERPRET=1), Qwen3-30B-A3B and Mixtral layer shapes on the GPU (gpu
marker), both paths (decode GEMV and sorted grouped GEMM), experts on another rank skipped."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.fused_moe import (
    fused_moe, fused_moe_ref, moe_align, moe_route, moe_route_ref, moe_router,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def _rand(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32,
          device: str = DEV) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype).to(device)


def _per_pair(x, w13, w2, weights, ids):
    """The definition, one (token, k) pair at a time, in float64."""
    x, w13, w2 = x.double().cpu(), w13.double().cpu(), w2.double().cpu()
    out = torch.zeros_like(x)
    inter = w13.shape[1] // 2
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e >= w13.shape[0]:
                continue
            gu = w13[e] @ x[t]
            out[t] += float(weights[t, k]) * (w2[e] @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:]))
    return out


def _case(t: int, e: int, k: int, h: int, inter: int, dtype=torch.float32, device=DEV, seed=0):
    x = _rand(t, h, seed=seed, dtype=dtype, device=device)
    w13 = _rand(e, 2 * inter, h, seed=seed + 1, scale=h ** -0.5, dtype=dtype, device=device)
    w2 = _rand(e, h, inter, seed=seed + 2, scale=inter ** -0.5, dtype=dtype, device=device)
    logits = _rand(t, e, seed=seed + 3, device=device)
    return x, w13, w2, logits


@pytest.mark.parametrize("one_hot_max", [1 << 21, 0], ids=["one-hot", "sort"])
def test_align_groups_pairs_by_expert_with_padding(one_hot_max, monkeypatch):
    from treadle.kernels import fused_moe

    monkeypatch.setattr(fused_moe, "_ONE_HOT_MAX", one_hot_max)
    ids = torch.tensor([[3, 0], [0, 1], [3, 0], [4, 4]], dtype=torch.int32)  # expert 4 = elsewhere
    sorted_ids, block_expert, num_padded = moe_align(ids, num_experts=4, block_m=4)
    # expert 0: pairs 1, 2, 5; expert 1: pair 3; expert 3: pairs 0, 4; pairs 6, 7 left out
    assert int(num_padded) == 12
    assert sorted_ids[:12].tolist() == [1, 2, 5, 8, 3, 8, 8, 8, 0, 4, 8, 8]
    assert block_expert[:3].tolist() == [0, 1, 3]
    assert sorted_ids.numel() % 4 == 0 and sorted_ids.numel() >= 12


def test_route_ref_normalisation():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    w, ids = moe_route_ref(logits, 2, renormalize=False)
    p = torch.softmax(logits, -1)[0]
    assert ids.tolist() == [[1, 2]] and ids.dtype == torch.int32
    torch.testing.assert_close(w[0], p[[1, 2]])
    w, _ = moe_route_ref(logits, 2, renormalize=True)  # Mixtral: a softmax over the top-2 logits
    torch.testing.assert_close(w[0], torch.softmax(torch.tensor([2.0, 1.0]), -1))
    _, local = moe_route_ref(logits, 2, renormalize=True, expert_start=2, num_local=2)  # rank 1 of 2
    assert local.tolist() == [[2, 0]]  # expert 1 lives elsewhere (2 = none here), expert 2 is local 0


@needs_kernel
# 3 tokens x top-3 of 4 experts: 9 pairs, so an expert takes several, also among the 2 local ones
# of the expert-parallel half (each token picks at least one of them); 6 tokens proved no more
# and cost 20 s a case in the Triton interpreter
@pytest.mark.parametrize("t,e,k", [(1, 8, 2), (3, 4, 3)])
@pytest.mark.parametrize("h,inter", [(48, 24), (64, 32)], ids=["masked", "even"])
def test_fused_moe_matches_definition_both_paths(t, e, k, h, inter):
    # 48 / 24: not powers of two, masked tiles; 64 / 32: chunks that divide the rows, no masks
    x, w13, w2, logits = _case(t, e, k, h, inter)
    for start, local in ((0, e), (e // 2, e // 2)):  # all experts here; half of them (expert parallel)
        weights, ids = moe_route(logits, k, True, start, local)
        ref_w, ref_ids = moe_route_ref(logits, k, True, start, local)
        assert torch.equal(ids.cpu(), ref_ids.cpu())
        torch.testing.assert_close(weights, ref_w)
        mine = (w13[start : start + local].contiguous(), w2[start : start + local].contiguous())
        want = _per_pair(x, *mine, weights, ids)
        torch.testing.assert_close(fused_moe_ref(x, *mine, weights, ids).double().cpu(), want, atol=1e-5, rtol=1e-5)
        # bk_down 16 and 8: the down projection's rows in 2 chunks (the second masked at 24) and
        # in 3 or 4, so the chunks loaded before the wait and those after are both checked
        for decode, config in ((True, None), (True, {"split_down": True, "bn_down": 16}), (True, {"bk_down": 16}),
                               (True, {"bk_down": 8, "bn_down": 4}), (False, None)):
            got = fused_moe(x, *mine, weights, ids, decode_path=decode, config=config)
            torch.testing.assert_close(got.double().cpu(), want, atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("t,e,k,h,renorm", [(1, 8, 2, 48, True), (3, 60, 4, 96, False), (8, 128, 8, 1536, True)])
def test_router_in_one_launch_matches_the_matmul_then_route(t, e, k, h, renorm):
    # moe_router = the router's fp32 logits, then moe_route; the program that takes the last
    # ticket routes, and leaves the ticket zero for the next layer's launch
    x = _rand(t, h, seed=t)
    gate = _rand(e, h, seed=t + 1, scale=h ** -0.5)
    ticket = torch.zeros(1, dtype=torch.int32, device=DEV)
    for start, local in ((0, e), (e // 2, e - e // 2)):  # all experts here; those of rank 1 of 2
        w, ids = moe_router(x, gate, k, renorm, ticket, start, local)
        ref_w, ref_ids = moe_route_ref(x.double() @ gate.double().T, k, renorm, start, local)
        assert torch.equal(ids.cpu(), ref_ids.cpu())
        torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=1e-5)
        assert int(ticket) == 0
    with pytest.raises(ValueError, match="gate_weight"):
        moe_router(x, gate[:, :-1].contiguous(), k, renorm, ticket)
    with pytest.raises(ValueError, match="1 <= T"):
        moe_router(_rand(9, h, seed=0), gate, k, renorm, ticket)
    with pytest.raises(ValueError, match="ticket"):
        moe_router(x, gate, k, renorm, ticket.float())
    with pytest.raises(ValueError, match="top_k"):
        moe_router(x, gate, e + 1, renorm, ticket)


def test_fused_moe_rejects_bad_arguments():
    x, w13, w2, logits = _case(2, 4, 2, 16, 8, device="cpu")
    weights, ids = moe_route_ref(logits, 2, True)
    with pytest.raises(ValueError, match="shapes do not agree"):
        fused_moe_ref(x, w13, w2[:, :, :4], weights, ids)
    with pytest.raises(ValueError, match="int32"):
        fused_moe_ref(x, w13, w2, weights, ids.long())
    with pytest.raises(ValueError, match="share one of"):
        fused_moe_ref(x, w13.double(), w2, weights, ids)
    with pytest.raises(ValueError, match="top_k"):
        moe_route_ref(logits, 5, True)
    with pytest.raises(ValueError, match="local experts"):
        moe_route_ref(logits, 2, True, expert_start=3, num_local=2)
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="CUDA"):
            fused_moe(x, w13, w2, weights, ids)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 8, 2048, 768), (8, 2, 4096, 14336)], ids=["qwen3-30b-a3b", "mixtral"])
@pytest.mark.parametrize("t", [1, 3, 32, 300])
def test_fused_moe_gpu_bf16_layer_shapes(shape, t):
    e, k, h, inter = shape
    x, w13, w2, logits = _case(t, e, k, h, inter, dtype=torch.bfloat16, device="cuda")
    weights, ids = moe_route(logits, k, True)
    ref = fused_moe_ref(x, w13, w2, weights, ids).float()
    for decode, config in ((True, None), (True, {"split_down": True}), (False, None)):
        got = fused_moe(x, w13, w2, weights, ids, decode_path=decode, config=config).float()
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_fused_moe_gpu_fp32_and_expert_parallel_and_graph_capture():
    e, k, h, inter = 16, 4, 256, 96
    x, w13, w2, logits = _case(40, e, k, h, inter, device="cuda")
    weights, ids = moe_route(logits, k, False, 4, 8)  # experts 4..11 here
    mine = (w13[4:12].contiguous(), w2[4:12].contiguous())
    want = _per_pair(x, *mine, weights, ids)
    for decode in (True, False):
        torch.testing.assert_close(fused_moe(x, *mine, weights, ids, decode_path=decode).double().cpu(), want,
                                   atol=1e-4, rtol=1e-4)
    # routing + both paths inside one CUDA graph: fixed shapes, no host sync
    out = {}
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up (compiles) outside the capture
            wts, ix = moe_route(logits, k, True)
            fused_moe(x[:1], w13, w2, wts[:1], ix[:1]), fused_moe(x, w13, w2, wts, ix, decode_path=False)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        wts, ix = moe_route(logits, k, True)
        out["one"] = fused_moe(x[:1], w13, w2, wts[:1], ix[:1])
        out["many"] = fused_moe(x, w13, w2, wts, ix, decode_path=False)
    logits.copy_(_rand(40, e, seed=9, device="cuda"))  # new routing, replayed
    g.replay()
    torch.cuda.synchronize()
    wts, ix = moe_route_ref(logits, k, True)
    want = _per_pair(x, w13, w2, wts, ix)
    torch.testing.assert_close(out["many"].double().cpu(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out["one"].double().cpu(), want[:1], atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4])
def test_router_in_one_launch_is_race_free_over_many_launches(t):
    # Qwen3-30B-A3B's router (128 experts, hidden 2048, top 8): 200 back-to-back launches on one
    # ticket, as the layers of a decode step make them, each routed from its own logits
    e, k, h = 128, 8, 2048
    gate = _rand(e, h, seed=1, scale=h ** -0.5, dtype=torch.bfloat16, device="cuda")
    xs = [_rand(t, h, seed=10 + i, dtype=torch.bfloat16, device="cuda") for i in range(4)]
    ticket = torch.zeros(1, dtype=torch.int32, device="cuda")
    got = [moe_router(xs[i % 4], gate, k, True, ticket) for i in range(200)]
    torch.cuda.synchronize()
    assert int(ticket) == 0
    for i, (w, ids) in enumerate(got):
        ref_w, ref_ids = moe_route_ref(xs[i % 4].double() @ gate.double().T, k, True)
        assert torch.equal(ids, ref_ids), i
        torch.testing.assert_close(w, ref_w, atol=1e-4, rtol=1e-4)
