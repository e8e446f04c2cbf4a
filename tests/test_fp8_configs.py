"""kernels/fp8_linear's launches (Fp8Config): the default for each row count, and every launch the
sweep (benchmarks/bench_quant_linear.py --sweep) may time agrees with the reference of its path
(TRITON_INTERPRET=1 on the CPU; llama3-8b shapes in the GPU suite)."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.fp8_linear import (
    GEMV_MAX_M, MM_MAX_M, Fp8Config, candidate_configs, fp8_linear, fp8_linear_ref, pick_config, quantize_weight_ref,
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


def _assert_matches(y: torch.Tensor, ref: torch.Tensor, cfg: Fp8Config) -> None:
    if DEV == "cuda" and cfg.path == "mm":
        # Hopper's e4m3 MMA adds a K block's products in fewer bits than fp32 (fp8_mm promotes to
        # fp32 every block): an H100 run was 3.8e-3 off at -1.33 in a row whose largest output is
        # 65 (6e-5 of it); an error of a tenth of a percent of the row would be a bug
        worst = ((y - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)).max().item()
        assert worst < 1e-3, f"{cfg}: a row off by {worst:.2e} of its largest output"
    else:  # the interpreter's fp32 dot, the GEMV's fp32 sums
        torch.testing.assert_close(y, ref, atol=1e-3, rtol=1e-3, msg=lambda e: f"{cfg}: {e}")


def test_default_launch_per_row_count() -> None:
    assert pick_config(1, 4096, 4096).path == "gemv"  # decode: weight-only, the weight's bytes
    assert pick_config(GEMV_MAX_M + 1, 4096, 4096).path == "mm"  # a decode batch: split-K W8A8
    assert pick_config(128, 4096, 14336).path == "mm"  # 32 of cuBLAS's output tiles: too few
    assert pick_config(128, 28672, 4096).path == "scaled_mm"  # 224 tiles: cuBLAS does well
    assert pick_config(MM_MAX_M, 4096, 14336).path == "scaled_mm"  # 64 tiles
    assert pick_config(MM_MAX_M + 1, 4096, 4096).path == "scaled_mm"  # prefill: cuBLAS
    assert {c.path for c in candidate_configs(1, 4096, 4096)} == {"gemv", "mm", "scaled_mm"}
    assert {c.path for c in candidate_configs(16, 4096, 4096)} == {"mm", "scaled_mm"}  # past the GEMV's rows
    assert {c.path for c in candidate_configs(MM_MAX_M + 1, 4096, 4096)} == {"scaled_mm"}
    # o at 128 rows: 128 column tiles of 32, one program an SM of ~132, so K (4096) whole
    cfg = pick_config(128, 4096, 4096)
    assert (cfg.block_m, cfg.block_n, cfg.split, cfg.warps) == (128, 32, 1, 8)
    # down: K = 14,336 in 256-wide blocks, 64 tiles of 64 columns, so K in 2 parts
    cfg = pick_config(128, 4096, 14336)
    assert (cfg.block_n, cfg.block_k, cfg.split) == (64, 256, 2)


@needs_kernel
@pytest.mark.parametrize("m", [1, 3])
def test_every_candidate_launch_matches_its_reference(m: int) -> None:
    x, w, ws, b = _case(m, 40, 3000, seed=m)  # masked rows and columns for every tile
    exact = x.float() @ (w.float() * ws[:, None]).T + b
    seen = set()
    for cfg in candidate_configs(m, 40, 3000):
        if cfg.path == "scaled_mm":
            continue  # test_quantization_kernels runs it
        if DEV == "cpu":  # the interpreter computes the same for any warps or stages
            key = cfg._replace(warps=0, stages=0)
            if key in seen:
                continue
            seen.add(key)
        y = fp8_linear(x, w, ws, b, out_dtype=torch.float32, config=cfg)
        _assert_matches(y, fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32, config=cfg), cfg)
        if cfg.path == "gemv":  # weight-only: x as it is
            torch.testing.assert_close(y, exact, atol=1e-3, rtol=1e-3, msg=lambda e, c=cfg: f"{c}: {e}")
        else:  # W8A8: x quantized per token, within e4m3's rounding of the float product
            assert (y - exact).abs().max() < 0.05 * exact.abs().max(), str(cfg)


@needs_kernel
@pytest.mark.parametrize("m", [2, 17, 130])  # one tile of rows, a masked tile, two tiles of 128
def test_split_k_mm_matches_its_reference(m: int) -> None:
    # K = 3000 in parts of whole 128-blocks with a short last one, masked columns, a bias; split 1 too
    x, w, ws, b = _case(m, 40, 3000, seed=10 + m)
    ref = fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32, config=Fp8Config("mm"))
    for split in (1, 3, 7):
        cfg = Fp8Config("mm", 32, 128, 4, 64 if m <= 64 else 128, split, 3)
        _assert_matches(fp8_linear(x, w, ws, b, out_dtype=torch.float32, config=cfg), ref, cfg)
    y16 = fp8_linear(x, w, ws, None, out_dtype=torch.bfloat16)  # the default launch, no bias, bf16 out
    torch.testing.assert_close(y16.float(), ref - b, atol=3e-2, rtol=2e-2)


def test_unknown_launch_is_refused() -> None:
    x, w, ws, _ = (t.cpu() for t in _case(2, 16, 32, seed=5))
    with pytest.raises(ValueError, match="unknown fp8 launch path 'marlin'"):
        fp8_linear(x, w, ws, config=Fp8Config("marlin"))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 128])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])  # llama3-8b's linears
def test_gpu_every_launch_on_llama3_shapes(m: int, n: int, k: int) -> None:
    # Error per row against the row's largest output: an entry near zero is a sum of terms as
    # large as the row's and carries their rounding (cuBLAS's rowwise FP8 product is rounded to
    # bf16, 2^-9 of the largest; Hopper's e4m3 MMA adds 128 products at a time in less than
    # fp32). On an H100 the worst rows were 0.7% (scaled_mm) and 0.03% (mm).
    x, w, ws, b = _case(m, n, k, seed=6)
    for cfg in candidate_configs(m, n, k):
        y = fp8_linear(x, w, ws, b, out_dtype=torch.float32, config=cfg)
        ref = fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32, config=cfg)
        worst = ((y - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)).max().item()
        assert worst < 2e-2, f"{cfg}: a row off by {worst:.2%} of its largest output"
