"""kernels/fp8_linear's launches (Fp8Config): the default for each row count, and every launch the
sweep (benchmarks/bench_quant_linear.py --sweep) may time agrees with the reference of its path
(TRITON_INTERPRET=1 on the CPU; llama3-8b shapes in the GPU suite)."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.fp8_linear import (
    GEMV_MAX_M, Fp8Config, candidate_configs, fp8_linear, fp8_linear_ref, pick_config, quantize_weight_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def _case(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w, ws = quantize_weight_ref(torch.randn(n, k, generator=g) * 0.05)
    x = torch.randn(m, k, generator=g) * torch.logspace(-1, 1, m)[:, None]  # rows of different sizes
    return x.to(torch.bfloat16).to(DEV), w.to(DEV), ws.to(DEV), torch.randn(n, generator=g).to(DEV)


def test_default_launch_per_row_count() -> None:
    assert pick_config(1, 4096, 4096).path == "gemv"  # decode: weight-only, the weight's bytes
    assert pick_config(GEMV_MAX_M + 1, 4096, 4096).path == "scaled_mm"
    assert {c.path for c in candidate_configs(1, 4096, 4096)} == {"gemv", "scaled_mm"}
    assert {c.path for c in candidate_configs(16, 4096, 4096)} == {"scaled_mm"}  # past the GEMV's rows


@needs_kernel
@pytest.mark.parametrize("m", [1, 3])
def test_every_candidate_launch_matches_its_reference(m: int) -> None:
    x, w, ws, b = _case(m, 40, 3000, seed=m)  # masked rows and columns for every tile
    exact = x.float() @ (w.float() * ws[:, None]).T + b
    for cfg in candidate_configs(m, 40, 3000):
        if cfg.path == "scaled_mm":
            continue  # test_quantization_kernels runs it
        y = fp8_linear(x, w, ws, b, out_dtype=torch.float32, config=cfg)
        torch.testing.assert_close(y, fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32, config=cfg),
                                   atol=1e-3, rtol=1e-3, msg=str(cfg))
        torch.testing.assert_close(y, exact, atol=1e-3, rtol=1e-3, msg=str(cfg))  # weight-only: x as it is


def test_unknown_launch_is_refused() -> None:
    x, w, ws, _ = (t.cpu() for t in _case(2, 16, 32, seed=5))
    with pytest.raises(ValueError, match="unknown fp8 launch path 'marlin'"):
        fp8_linear(x, w, ws, config=Fp8Config("marlin"))


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])  # llama3-8b's linears
def test_gpu_every_launch_on_llama3_shapes(n: int, k: int) -> None:
    x, w, ws, b = _case(1, n, k, seed=6)
    for cfg in candidate_configs(1, n, k):
        torch.testing.assert_close(fp8_linear(x, w, ws, b, out_dtype=torch.float32, config=cfg),
                                   fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32, config=cfg),
                                   atol=2e-2, rtol=2e-2, msg=str(cfg))
