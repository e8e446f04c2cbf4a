"""kernels/fp8_linear.fp8_tc: W8A8 for a few rows on the tensor cores, x quantized per token inside
the kernel, against per_token_quant_ref + scaled_mm_ref (TRITON_INTERPRET=1 on the CPU runs the
kernel's fp32 branch; the GPU suite runs the e4m3 tl.dot)."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.fp8_linear import (
    TC_MAX_M, Fp8Config, candidate_configs, fp8_linear, fp8_linear_ref, fp8_tc, per_token_quant_ref, pick_config,
    quantize_weight_ref, scaled_mm_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def _case(m: int, n: int, k: int, seed: int, xdtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    w, ws = quantize_weight_ref(torch.randn(n, k, generator=g) * 0.05)
    # rows of very different sizes: each gets its own scale
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]
    b = torch.randn(n, generator=g)
    return x.to(xdtype).to(DEV), w.to(DEV), ws.to(DEV), b.to(DEV)


@needs_kernel
@pytest.mark.parametrize("m", [1, 5, TC_MAX_M])
@pytest.mark.parametrize("n,k", [(48, 64), (40, 300), (64, 512)])  # ragged K / N, and whole tiles
@pytest.mark.parametrize("swap", [False, True])
def test_fp8_tc_matches_the_w8a8_reference(m: int, n: int, k: int, swap: bool) -> None:
    x, w, ws, b = _case(m, n, k, seed=m + n + k)
    cfg = Fp8Config("tc", 16, 64, 4, 2, swap)
    for bias, ub in ((None, None), (b, 30.0)):  # an amax cap saturates the rows past it
        y = fp8_tc(x, w, ws, bias, ub, torch.float32, cfg)
        xq, sx = per_token_quant_ref(x, ub)
        ref = scaled_mm_ref(xq, sx, w, ws, bias, out_dtype=torch.float32)
        torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)
    # the quantization is sane: each row close to the float product of the dequantized weight
    y = fp8_tc(x, w, ws, None, None, torch.float32, cfg)
    exact = x.float() @ (w.float() * ws[:, None]).T
    assert ((y - exact).abs().amax(dim=1) <= 0.06 * exact.abs().amax(dim=1)).all()


@needs_kernel
def test_fp8_linear_takes_the_tensor_cores_up_to_tc_max_m() -> None:
    # the default launch at 1 and TC_MAX_M rows is fp8_tc; its result is fp8_linear_ref's (W8A8 at every M)
    for m in (1, TC_MAX_M):
        assert pick_config(m, 4096, 4096).path == "tc"
        x, w, ws, b = _case(m, 32, 128, seed=3)
        torch.testing.assert_close(fp8_linear(x, w, ws, b, out_dtype=torch.float32),
                                   fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32), atol=1e-4, rtol=1e-4)
    assert pick_config(TC_MAX_M + 1, 4096, 4096).path == "scaled_mm"
    # narrow column blocks where the outputs are few, so every multiprocessor has work
    assert pick_config(1, 4096, 14336).block_n < pick_config(1, 28672, 4096).block_n


@needs_kernel
def test_every_candidate_config_runs_and_agrees() -> None:
    x, w, ws, _ = _case(1, 4096, 256, seed=4)
    ref = fp8_linear_ref(x, w, ws, out_dtype=torch.float32)
    cands = candidate_configs(1, 4096, 256)
    assert {c.path for c in cands} == {"tc", "gemv", "scaled_mm"} and any(c.swap for c in cands)
    for cfg in cands:
        if cfg.path == "scaled_mm" and DEV == "cpu":
            continue  # torch._scaled_mm's CPU kernel wants other layouts; the GPU suite runs it
        y = fp8_linear(x, w, ws, out_dtype=torch.float32, config=cfg)
        want = fp8_linear_ref(x, w, ws, out_dtype=torch.float32, config=cfg)
        torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4, msg=str(cfg))
        assert (y - ref).abs().max() <= 0.05 * ref.abs().max()


def test_fp8_tc_refuses_bad_arguments() -> None:
    x, w, ws, b = (t.cpu() for t in _case(2, 16, 32, seed=5))
    with pytest.raises(ValueError, match="rows"):
        fp8_tc(torch.randn(TC_MAX_M + 1, 32), w, ws)
    with pytest.raises(ValueError, match="w_scale"):
        fp8_tc(x, w, ws[:4])
    with pytest.raises(ValueError, match="bias"):
        fp8_tc(x, w, ws, b[:3])
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_tc(x, w.float(), ws)
    with pytest.raises(ValueError, match="unknown fp8 path"):
        fp8_linear(x, w, ws, config=Fp8Config("marlin"))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])  # llama3-8b's linears
def test_gpu_fp8_tc_llama3_shapes(m: int, n: int, k: int) -> None:
    x, w, ws, b = _case(m, n, k, seed=6)
    ref = fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32)
    torch.testing.assert_close(fp8_linear(x, w, ws, b, out_dtype=torch.float32), ref, atol=2e-2, rtol=2e-2)
    # every launch the sweep may pick, on one shape a row count
    for cfg in candidate_configs(m, n, k) if (n, k) == (4096, 14336) else ():
        y = fp8_linear(x, w, ws, b, out_dtype=torch.float32, config=cfg)
        want = fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32, config=cfg)  # "gemv": weight-only
        torch.testing.assert_close(y, want, atol=2e-2, rtol=2e-2, msg=str(cfg))
