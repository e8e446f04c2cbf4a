"""kernels/matmul.py (the skinny decode-batch GEMM) vs its reference: small ragged shapes here
(TRITON_INTERPRET=1 on CPU), llama3-8b shapes at decode batch sizes on the GPU (marked gpu)."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.matmul import Config, matmul, matmul_ref, pick_config

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=5e-3, rtol=5e-3)}
# swapped and plain operand order, even and masked tiles, split K over 1..4 programs
CONFIGS = [None, Config(64, 64, 1, True, 4, 2), Config(32, 32, 4, False, 4, 2), Config(16, 128, 2, True, 4, 1)]


def _rand(*shape: int, dtype: torch.dtype, seed: int, device: str = DEV) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / 4).to(dtype).to(device)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(5, 64, 128), (33, 100, 300), (130, 64, 64), (1, 48, 80)])
def test_matmul_matches_ref(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    x, w, b = _rand(m, k, dtype=dtype, seed=0), _rand(n, k, dtype=dtype, seed=1), _rand(n, dtype=dtype, seed=2)
    for config in CONFIGS:
        torch.testing.assert_close(matmul(x, w, b, config=config), matmul_ref(x, w, b), **TOL[dtype])
        torch.testing.assert_close(matmul(x, w, config=config), matmul_ref(x, w), **TOL[dtype])
    y = matmul(x, w, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    torch.testing.assert_close(y, x.float() @ w.float().T, **TOL[dtype])


@needs_kernel
def test_matmul_strided_rows_and_empty_shapes() -> None:
    x = _rand(20, 96, dtype=torch.float32, seed=3)[:, :64]  # row stride 96, unit column stride
    w = _rand(40, 64, dtype=torch.float32, seed=4)
    torch.testing.assert_close(matmul(x, w), x @ w.T, **TOL[torch.float32])
    assert matmul(x[:0], w).shape == (0, 40)
    b = _rand(40, dtype=torch.float32, seed=5)
    torch.testing.assert_close(matmul(x[:, :0], w[:, :0], b), b.expand(20, 40))


def test_matmul_rejects_bad_arguments() -> None:
    x, w = torch.zeros(4, 64), torch.zeros(8, 64)
    with pytest.raises(ValueError, match="w \\[N, K\\]"):
        matmul_ref(x, w[:, :32])
    with pytest.raises(ValueError, match="dtype"):
        matmul_ref(x, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        matmul_ref(x, torch.zeros(64, 8).T)
    with pytest.raises(ValueError, match="bias"):
        matmul_ref(x, w, torch.zeros(7))
    with pytest.raises(ValueError, match="fp32/fp16/bf16"):
        matmul_ref(x.to(torch.int32), w)
    if os.environ.get("TRITON_INTERPRET") == "1":
        with pytest.raises(ValueError, match="power of two"):
            matmul(x, w, config=Config(48, 64, 1, True, 4, 1))
        with pytest.raises(ValueError, match=">= 16"):
            matmul(x, w, config=Config(8, 64, 1, True, 4, 1))


def test_pick_config_splits_long_k_over_few_tiles_only() -> None:
    assert pick_config(128, 4096, 14336).split_k > 1  # llama3-8b down: 64 tiles of 64 rows
    assert pick_config(128, 28672, 4096).split_k == 1  # gate_up: 448 tiles
    for m in (5, 32, 64, 128, 256):
        for n, k in [(16, 16), (4096, 4096), (128256, 4096), (4096, 14336), (10, 100)]:
            cfg = pick_config(m, n, k)
            assert cfg.split_k >= 1 and k // cfg.split_k >= min(k, 1024) // 2


# ------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name,n,k", [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                                      ("down", 4096, 14336), ("lm_head", 128256, 4096)])
@pytest.mark.parametrize("m", [5, 32, 100, 128, 256])
def test_matmul_llama3_8b_shapes_on_gpu(name: str, n: int, k: int, m: int) -> None:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    want = matmul_ref(x, w, out_dtype=torch.float32)
    got = matmul(x, w, out_dtype=torch.float32)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)  # both fp32 sums; only the order differs
    torch.testing.assert_close(matmul(x, w).float(), want, **TOL[torch.bfloat16])
