"""kernels/gemv.py vs its reference: small ragged shapes here (TRITON_INTERPRET=1 on CPU),
llama3-8b shapes on the GPU (marked gpu), and ops.linear's routing inside a CUDA graph."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.gemv import MAX_M, gemv, gemv_ref, pick_config

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=5e-3, rtol=5e-3)}


def _rand(*shape: int, dtype: torch.dtype, seed: int, device: str = DEV) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(8, 2048), (9, 2148), (4, 3072)])
def test_gemv_one_row_with_two_chunks_loaded_before_the_wait(dtype: torch.dtype, n: int, k: int) -> None:
    # one row of x and K past one 1,024-wide chunk: the second chunk is loaded ahead with the
    # first (AHEAD2), whole (2,048), with a masked tail (2,148) or followed by a third (3,072)
    x, w, b = _rand(1, k, dtype=dtype, seed=0), _rand(n, k, dtype=dtype, seed=1), _rand(n, dtype=dtype, seed=2)
    torch.testing.assert_close(gemv(x, w, b), gemv_ref(x, w, b), **TOL[dtype])


# Every row count in fp32; the 16-bit dtypes with one row and with MAX_M rows. The two are
# separate code: M unrolls the accumulators (each `if M > i` adds a row), the dtype only
# converts each row's loads, so MAX_M runs every row's branch in every dtype (2 and 3 rows
# in bf16 / fp16 ran the same lines again: 12 interpreted cases of 36).
M_BY_DTYPE = [(torch.float32, m) for m in (1, 2, 3, MAX_M)] + [
    (dtype, m) for dtype in (torch.bfloat16, torch.float16) for m in (1, MAX_M)]


@needs_kernel
@pytest.mark.parametrize("dtype,m", M_BY_DTYPE)
@pytest.mark.parametrize("n,k", [(37, 100), (16, 1024), (5, 3)])
def test_gemv_matches_ref(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    x, w, b = _rand(m, k, dtype=dtype, seed=0), _rand(n, k, dtype=dtype, seed=1), _rand(n, dtype=dtype, seed=2)
    torch.testing.assert_close(gemv(x, w, b), gemv_ref(x, w, b), **TOL[dtype])
    for config in (None, (8, 64, 4, 1), (1, 32, 2, 1)):  # even and masked tiles
        torch.testing.assert_close(gemv(x, w, config=config), gemv_ref(x, w), **TOL[dtype])
    y = gemv(x, w, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, x.float() @ w.float().T, **TOL[dtype])


@needs_kernel
def test_gemv_strided_rows_of_x() -> None:
    x = _rand(3, 96, dtype=torch.float32, seed=3)[:, :64]  # row stride 96, unit column stride
    w = _rand(40, 64, dtype=torch.float32, seed=4)
    torch.testing.assert_close(gemv(x, w), x @ w.T, **TOL[torch.float32])


def test_gemv_rejects_bad_arguments() -> None:
    x, w = _rand(1, 64, dtype=torch.float32, seed=0, device="cpu"), _rand(8, 64, dtype=torch.float32, seed=1, device="cpu")
    with pytest.raises(ValueError, match="rows of x"):
        gemv_ref(_rand(MAX_M + 1, 64, dtype=torch.float32, seed=0, device="cpu"), w)
    with pytest.raises(ValueError, match="w \\[N, K\\]"):
        gemv_ref(x, w[:, :32])
    with pytest.raises(ValueError, match="dtype"):
        gemv_ref(x, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        gemv_ref(x, _rand(64, 8, dtype=torch.float32, seed=1, device="cpu").T)
    with pytest.raises(ValueError, match="bias"):
        gemv_ref(x, w, torch.zeros(7))
    with pytest.raises(ValueError, match="fp32/fp16/bf16"):
        gemv_ref(x.to(torch.int32), w)


def test_pick_config_fits_the_shape() -> None:
    for m in range(1, MAX_M + 1):
        for n, k in [(1, 1), (4096, 4096), (128256, 4096), (4096, 14336), (10, 100)]:
            block_n, block_k, warps, stages = pick_config(m, n, k)
            assert block_k <= max(16, 2 * k) and block_n >= 1 and warps in (1, 2, 4, 8) and stages >= 1


# ------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name,n,k", [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                                      ("down", 4096, 14336), ("lm_head", 128256, 4096)])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_gemv_llama3_8b_shapes_on_gpu(name: str, n: int, k: int, m: int) -> None:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    want = gemv_ref(x, w, out_dtype=torch.float32)
    got = gemv(x, w, out_dtype=torch.float32)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)  # both fp32 sums; only the order differs
    torch.testing.assert_close(gemv(x, w).float(), want, **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ops_linear_uses_gemv_in_a_cuda_graph_only() -> None:
    from treadle.runtime.models import ops

    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    eager = ops.linear(x, w)
    torch.testing.assert_close(eager, torch.nn.functional.linear(x, w), atol=0, rtol=0)  # cuBLAS outside a graph
    ops.linear(x, w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.linear(x, w, out_dtype=torch.float32)
    g.replay()
    torch.cuda.synchronize()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, gemv(x, w, out_dtype=torch.float32), atol=0, rtol=0)


def test_ops_linear_on_cpu_matches_f_linear() -> None:
    """The CPU runtime's linear (oneDNN where torch has it): F.linear's results in fp32 up to
    summation order, with and without bias, for one row and many, and in other dtypes."""
    from treadle.runtime.models import ops

    g = torch.Generator().manual_seed(0)
    for m, n, k in [(1, 960, 576), (7, 49, 33), (300, 64, 1536)]:
        x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        for bias in (None, b):
            torch.testing.assert_close(ops.linear(x, w, bias), torch.nn.functional.linear(x, w, bias),
                                       atol=1e-4, rtol=1e-5)
        assert ops.linear(x, w, out_dtype=torch.float64).dtype == torch.float64
    empty = ops.linear(torch.zeros(0, 8), torch.ones(4, 8))
    assert empty.shape == (0, 4)
    xb, wb = torch.randn(3, 16, generator=g).bfloat16(), torch.randn(5, 16, generator=g).bfloat16()
    torch.testing.assert_close(ops.linear(xb, wb), torch.nn.functional.linear(xb, wb))
