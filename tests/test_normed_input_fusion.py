"""The RMSNorm left to the kernel that reads it (kernels/rmsnorm.py's NormedInput): the one-row
GEMV (kernels/gemv.py, plain, FP8 per row and block-scaled, with the gate/up SiLU product) and
the MoE router (kernels/fused_moe.py) normalise x as they load it, against a float64 reference
of the same math and against the unfused ops; the models' decode steps give the unfused
logits with the fusion taken (TRITON_INTERPRET=1 on CPU, CUDA graphs on the GPU)."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.fp8_linear import quantize_weight_ref
from treadle.kernels.fused_moe import moe_route_ref, moe_router
from treadle.kernels.gemv import dequantize_blocks, gemv, gemv_ref
from treadle.kernels.rmsnorm import NormedInput, rmsnorm_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
EPS = 1e-6


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype).to(DEV)


def _normed_input(k: int, dtype: torch.dtype, residual: bool, seed: int = 0) -> NormedInput:
    x = _rand(1, k, seed=seed, dtype=dtype)
    g = (torch.rand(k, generator=torch.Generator().manual_seed(seed + 1)) + 0.5).to(dtype).to(DEV)
    if not residual:
        return NormedInput(x, g, EPS)
    return NormedInput(x, g, EPS, _rand(1, k, seed=seed + 2, dtype=dtype), torch.empty_like(x))


def _exact(n: NormedInput, w: torch.Tensor, w_scale: torch.Tensor | None, bias: torch.Tensor | None,
           act: str | None) -> torch.Tensor:
    """float64 rstd * (w @ (h * g)) (+ bias), h = x, or x + residual as the kernel rounded it into
    residual_out (the interpreter's bf16 rounding is not the GPU's): the kernel's math with
    nothing rounded but h."""
    h = (n.x if n.residual is None else n.residual_out).double()
    rstd = torch.rsqrt(h.pow(2).mean() + EPS)
    wf = w.double() if w_scale is None else (dequantize_blocks(w, w_scale) if w_scale.dim() == 2
                                             else w.double() * w_scale.double()[:, None])
    y = (h * n.weight.double()) @ wf.double().T * rstd
    if bias is not None:
        y = y + bias.double()
    if act:
        gate, up = y.chunk(2, dim=1)
        y = torch.nn.functional.silu(gate) * up
    return y


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [100, 1024, 2148, 3072])  # one masked chunk; one whole; two and a tail; three
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("weights", ["float", "fp8_row", "fp8_block"])
def test_gemv_normalises_its_input(dtype: torch.dtype, k: int, residual: bool, act: str | None, weights: str) -> None:
    n_rows = 22  # 11 gate/up pairs: a partly masked last tile
    w = _rand(n_rows, k, seed=3, dtype=dtype, scale=0.05)
    w_scale = None
    if weights == "fp8_row":
        w, w_scale = quantize_weight_ref(w)
    elif weights == "fp8_block":
        w, w_scale = quantize_weight_ref(w)
        w_scale = torch.stack([w_scale * (1 + 0.25 * j) for j in range(-(-k // 128))], dim=1).contiguous()
    bias = _rand(n_rows, seed=4, dtype=dtype, scale=0.1)
    n = _normed_input(k, dtype, residual)
    y = gemv(n, w, bias, w_scale=w_scale, act=act)
    assert y.shape == (1, n_rows // 2 if act else n_rows) and y.dtype == dtype
    want = _exact(n, w, w_scale, bias, act)
    # the kernel rounds only its output: within an ulp or two of dtype at the outputs' scale
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert (y.double() - want).abs().max() <= tol * want.abs().max()
    if residual:  # the residual stream: x + residual rounded to x's dtype
        torch.testing.assert_close(n.residual_out, (n.x.float() + n.residual.float()).to(dtype))
    # the unfused path (normed rows rounded to dtype, then the product) agrees up to that rounding
    ref = gemv_ref(n._replace(residual_out=None if not residual else torch.empty_like(n.x)), w, bias,
                   w_scale=w_scale, act=act)
    assert (ref.double() - want).abs().max() <= (1e-4 if dtype == torch.float32 else 3e-2) * want.abs().max()


@needs_kernel
@pytest.mark.parametrize("k", [100, 2148])  # one masked chunk; two and a tail
@pytest.mark.parametrize("weights", ["float", "fp8_row", "fp8_block"])
def test_gemv_silu_of_a_plain_row(k: int, weights: str) -> None:
    # one row of x that comes normed already (an FP8 gate/up after the norm's own launch): the
    # gate/up GEMV writes silu(gate) * up itself, no SiLU launch
    dtype = torch.bfloat16
    w = _rand(22, k, seed=6, dtype=dtype, scale=0.05)
    w_scale = None
    if weights != "float":
        w, w_scale = quantize_weight_ref(w)
        if weights == "fp8_block":
            w_scale = torch.stack([w_scale * (1 + 0.25 * j) for j in range(-(-k // 128))], dim=1).contiguous()
    x = _rand(1, k, seed=7, dtype=dtype)
    bias = _rand(22, seed=8, dtype=dtype, scale=0.1)
    y = gemv(x, w, bias, w_scale=w_scale, act="silu")
    assert y.shape == (1, 11) and y.dtype == dtype
    wf = w.double() if w_scale is None else (dequantize_blocks(w, w_scale).double() if w_scale.dim() == 2
                                             else w.double() * w_scale.double()[:, None])
    gate, up = (x.double() @ wf.T + bias.double()).chunk(2, dim=1)
    want = torch.nn.functional.silu(gate) * up
    assert (y.double() - want).abs().max() <= 1e-2 * want.abs().max()
    ref = gemv_ref(x, w, bias, w_scale=w_scale, act="silu")
    assert (ref.double() - want).abs().max() <= 1e-2 * want.abs().max()


@needs_kernel
def test_gemv_normed_input_without_residual_leaves_x() -> None:
    n = _normed_input(300, torch.float32, residual=False)
    before = n.x.clone()
    y = gemv(n, _rand(8, 300, seed=5, scale=0.1))
    assert torch.equal(n.x, before)
    torch.testing.assert_close(y, rmsnorm_ref(n.x, n.weight, EPS) @ _rand(8, 300, seed=5, scale=0.1).T,
                               atol=1e-5, rtol=1e-5)


def test_normed_input_rejects_bad_arguments() -> None:
    x = torch.randn(1, 64)
    g = torch.ones(64)
    w = torch.randn(8, 64)
    with pytest.raises(ValueError, match="one non-empty row"):
        gemv_ref(NormedInput(torch.randn(2, 64), g, EPS), w)
    with pytest.raises(ValueError, match="residual and residual_out together"):
        gemv_ref(NormedInput(x, g, EPS, torch.randn(1, 64)), w)
    r = torch.randn(1, 64)
    with pytest.raises(ValueError, match="must not share memory"):
        gemv_ref(NormedInput(x, g, EPS, r, r), w)
    with pytest.raises(ValueError, match="weight must be"):
        gemv_ref(NormedInput(x, torch.ones(32), EPS), w)
    with pytest.raises(ValueError, match="even N"):
        gemv_ref(NormedInput(x, g, EPS), torch.randn(7, 64), act="silu")
    with pytest.raises(ValueError, match="act must be"):
        gemv_ref(NormedInput(x, g, EPS), w, act="gelu")
    with pytest.raises(ValueError, match="one non-empty row"):
        gemv_ref(torch.randn(2, 64), w, act="silu")  # a plain x with an act: one row (the decode step's)
    with pytest.raises(ValueError, match="normed_out"):
        moe_router(NormedInput(x, g, EPS), w, 2, True, torch.zeros(1, dtype=torch.int32))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 2500])  # one chunk; two (the router's chunks are 2,048 wide)
@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("residual", [False, True])
def test_router_normalises_its_input(dtype: torch.dtype, hidden: int, tokens: int, residual: bool) -> None:
    x = _rand(tokens, hidden, seed=6, dtype=dtype)
    g = (torch.rand(hidden, generator=torch.Generator().manual_seed(7)) + 0.5).to(dtype).to(DEV)
    r = _rand(tokens, hidden, seed=8, dtype=dtype) if residual else None
    w = _rand(16, hidden, seed=9, dtype=dtype, scale=0.5 / hidden ** 0.5)
    n = NormedInput(x, g, EPS, r, torch.empty_like(x) if residual else None)
    normed = torch.empty_like(x)
    ticket = torch.zeros(1, dtype=torch.int32, device=DEV)
    weights, ids = moe_router(n, w, 4, True, ticket, normed_out=normed)
    assert int(ticket) == 0
    # the experts' input: rmsnorm of h (as the kernel rounded it, see _exact) with rmsnorm's rounding
    want = rmsnorm_ref(x if r is None else n.residual_out, g, EPS)
    torch.testing.assert_close(normed, want, **({} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)))
    if residual:
        torch.testing.assert_close(n.residual_out, (x.float() + r.float()).to(dtype))
    h = (x if r is None else n.residual_out).double()  # as the kernel rounded it (see _exact)
    logits = (h * g.double()) @ w.double().T * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    want_w, want_ids = moe_route_ref(logits, 4, True)
    assert torch.equal(ids.cpu(), want_ids.cpu())
    torch.testing.assert_close(weights.double(), want_w.double(), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------- models

def _decode_logits(model_path: str, prompt: list[int], fused: bool, monkeypatch) -> torch.Tensor:
    """float32 logits of each position of `prompt` decoded one token a step (batch 1)."""
    from treadle.runtime.engine_args import EngineArgs
    from treadle.runtime.forward_batch import ForwardBatch, ForwardMode
    from treadle.runtime.model_runner import ModelRunner
    from treadle.runtime.models import ops

    monkeypatch.setattr(ops, "FUSE_NORM_WITHOUT_CUDA", fused)
    monkeypatch.setenv("TREADLE_FUSED_NORM", "1" if fused else "0")
    runner = ModelRunner(EngineArgs(model_path=model_path, device="cpu", dtype="float32", max_total_tokens=64,
                                    max_running_requests=1))
    taken = []
    layer = runner.model.layers[0]
    real = type(layer.self_attn).forward

    def forward_spy(self, positions, x, *a, **k):
        taken.append(isinstance(x, NormedInput))
        return real(self, positions, x, *a, **k)

    monkeypatch.setattr(type(layer.self_attn), "forward", forward_spy)
    row = runner.req_to_token_pool.alloc()
    slots = runner.allocator.alloc(len(prompt))
    runner.req_to_token_pool.req_to_token[row, : len(prompt)] = slots.to(torch.int32)
    out = []
    try:
        for j, tok in enumerate(prompt):
            fb = ForwardBatch.build(ForwardMode.DECODE, [tok], [j], slots[j:j + 1], [row], [j], [1], [0], runner.device)
            out.append(runner.forward(fb)[0])
    finally:
        runner.allocator.free(slots)
        runner.req_to_token_pool.free(row)
    assert taken and all(t == fused for t in taken)  # the path asked for was the path taken
    return torch.stack(out)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU run of the fused path needs "
                    "TRITON_INTERPRET=1 (the GPU's is test_fused_norm_decode_on_gpu)")
@pytest.mark.parametrize("model", ["dummy:tiny-llama", "dummy:tiny-qwen3-moe"])
def test_decode_with_fused_norms_gives_the_unfused_logits(model: str, monkeypatch) -> None:
    prompt = [1, 520, 4011, 88, 9, 33]
    with monkeypatch.context() as m:
        plain = _decode_logits(model, prompt, False, m)
    with monkeypatch.context() as m:
        fused = _decode_logits(model, prompt, True, m)
    assert torch.equal(plain.argmax(-1), fused.argmax(-1))
    torch.testing.assert_close(fused, plain, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("model,quant", [("dummy:tiny-qwen3", None), ("dummy:tiny-qwen3", "fp8"),
                                         ("dummy:tiny-qwen3-moe", None), ("dummy:tiny-mixtral", None)])
def test_fused_norm_decode_on_gpu(model: str, quant: str | None, monkeypatch) -> None:
    """Batch-1 decode in CUDA graphs (bf16) with the norms fused into the projections and the
    rotation into the attention (tests/test_decode_attention_new_token.py) gives the unfused
    run's greedy tokens, or where a near tie flips one, logprobs within bf16's rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from treadle.kernels import decode_attention as dec, fused_moe, gemv as gemv_mod
    from treadle.runtime import Engine

    calls = {"gemv": 0, "router": 0, "attention": 0}
    real_gemv, real_router, real_attention = gemv_mod._gemv_normed, fused_moe.moe_router, dec.decode_attention

    def gemv_spy(*a, **k):
        calls["gemv"] += 1
        return real_gemv(*a, **k)

    def router_spy(x, *a, **k):
        calls["router"] += isinstance(x, NormedInput)
        return real_router(x, *a, **k)

    def attention_spy(*a, **k):
        calls["attention"] += k.get("new") is not None
        return real_attention(*a, **k)

    monkeypatch.setattr(gemv_mod, "_gemv_normed", gemv_spy)
    monkeypatch.setattr(fused_moe, "moe_router", router_spy)
    monkeypatch.setattr(dec, "decode_attention", attention_spy)
    prompts = [[1, 520, 4011, 88], [1, 9, 33, 7000, 12, 5, 48000, 17, 3, 99]]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    runs = {}
    for fused in (False, True):
        monkeypatch.setenv("TREADLE_FUSED_NORM", "1" if fused else "0")
        monkeypatch.setenv("TREADLE_FUSED_ROPE", "1" if fused else "0")
        monkeypatch.setenv("TREADLE_FUSED_SILU", "1" if fused else "0")  # an FP8 gate/up's SiLU product
        before = dict(calls)
        kw = {"quantization": quant} if quant else {}
        with Engine(model_path=model, max_total_tokens=2048, **kw) as e:
            runs[fused] = [e.generate(input_ids=p, sampling_params=params, return_logprob=True) for p in prompts]
        took = {name: calls[name] - before[name] for name in calls}
        assert (took["gemv"] + took["router"] > 0) == fused and (took["attention"] > 0) == fused, (fused, took)
    for plain, fused in zip(runs[False], runs[True]):
        a = plain["meta_info"]["output_token_logprobs"]
        b = fused["meta_info"]["output_token_logprobs"]
        for (lp_a, tok_a, *_), (lp_b, tok_b, *_) in zip(a, b):
            assert abs(lp_a - lp_b) < 0.1, (a, b)
            if tok_a != tok_b:  # a near tie flipped: the rest of the two runs continue different texts
                break


@pytest.mark.parametrize("setting,want", [(None, (True, False, True)), ("auto", (True, False, True)),
                                          ("0", (False, False, False)), ("1", (True, True, True))])
def test_fusion_settings(setting: str | None, want: tuple, monkeypatch) -> None:
    """Unset (auto), the norm is left to a bf16 / fp32 projection but not to a MoE router (not
    faster there on the H100, docs/performance.md), and the rotation to decode attention; 0
    turns both off; 1 also gives the router its norm."""
    from treadle.runtime.attention_backend import fused_rope
    from treadle.runtime.models import ops
    from treadle.runtime.models.moe import SparseMoeBlock
    from treadle.runtime.models.parallel import ColumnParallelLinear

    monkeypatch.setattr(ops, "FUSE_NORM_WITHOUT_CUDA", True)
    for name in ("TREADLE_FUSED_NORM", "TREADLE_FUSED_ROPE"):
        if setting is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, setting)
    x = torch.zeros(1, 64)
    projection = ColumnParallelLinear(64, [32])
    router = SparseMoeBlock(num_experts=4, top_k=2, hidden=64, inter=32, renormalize=True)
    assert (projection.fuses_norm(x), router.fuses_norm(x), fused_rope()) == want
    assert not projection.fuses_norm(torch.zeros(2, 64))  # batch-1 decode only
