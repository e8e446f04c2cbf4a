"""kernels/fp8_linear.py and kernels/int4_linear.py vs their dequantize-then-matmul references:
small ragged shapes here (TRITON_INTERPRET=1 on CPU), llama3-8b shapes on the GPU (gpu marker);
the 4-bit packings (treadle's, AWQ's interleave) round-trip."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.fp8_linear import (
    FP8_DTYPE, fp8_gemv, fp8_gemv_ref, fp8_linear, fp8_linear_ref, per_token_quant, per_token_quant_ref,
    quantize_weight_ref, scaled_mm_ref,
)
from treadle.kernels.int4_linear import (
    Int4Config, candidate_configs, dequantize, dequantize_ref, int4_linear, int4_linear_ref, pack_cols, pack_rows,
    pick_config, unpack_cols, unpack_rows,
)
from treadle.runtime.quantization.int4 import awq_pack, awq_unpack, quantize_rtn

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _int4(k: int, n: int, group: int, seed: int, device: str = DEV):
    g = _g(seed)
    qweight = pack_rows(torch.randint(0, 16, (k, n), generator=g))
    qzeros = pack_cols(torch.randint(0, 16, (k // group, n), generator=g))
    scales = (torch.rand(k // group, n, generator=g) * 0.05 + 0.01).half()
    return qweight.to(device), scales.to(device), qzeros.to(device)


def test_packings_round_trip() -> None:
    q = torch.randint(0, 16, (24, 40), generator=_g(0), dtype=torch.uint8)
    assert torch.equal(unpack_rows(pack_rows(q)).to(torch.uint8), q)
    assert torch.equal(unpack_cols(pack_cols(q)).to(torch.uint8), q)
    assert torch.equal(awq_unpack(awq_pack(q)).to(torch.uint8), q)
    # AWQ's interleave, written out: nibble j of int c holds column 8c + (0, 2, 4, 6, 1, 3, 5, 7)[j]
    row = torch.arange(8, dtype=torch.uint8)[None]  # column i holds value i
    assert [(int(awq_pack(row)[0, 0]) >> (4 * j)) & 0xF for j in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert int(pack_rows(row.T)[0, 0]) == 0x76543210


@pytest.mark.parametrize("sym", [False, True])
def test_quantize_rtn_error_is_within_half_a_step(sym: bool) -> None:
    w = torch.randn(48, 64, generator=_g(1))
    q, z, s = quantize_rtn(w, 32, sym)
    g = torch.arange(64) // 32
    back = (q.float() - z.float()[g]) * s.float()[g]  # [K, N]
    # half a step, and a little for the fp16 scale (GPTQ's symmetric grid reaches +amax only to 7 of 7.5 steps)
    assert ((back - w.T).abs() <= s.float()[g] * 0.51 + 1e-6).all()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_token_quant_matches_ref(dtype: torch.dtype) -> None:
    # rows from 1e-4 to 1e3 in scale: subnormal and normal fp8 values, a zero row, a clamped row
    x = (torch.randn(12, 300, generator=_g(2)) * torch.logspace(-4, 3, 12)[:, None]).to(dtype)
    x[0] = 0
    for ub in (None, 5.0):
        xq, s = per_token_quant(x.to(DEV), ub)
        xr, sr = per_token_quant_ref(x.to(DEV), ub)
        assert xq.dtype == FP8_DTYPE and torch.equal(xq.float(), xr.float())
        torch.testing.assert_close(s, sr, rtol=0, atol=0)


@needs_kernel
@pytest.mark.parametrize("m", [1, 3, 4])
@pytest.mark.parametrize("n,k", [(40, 96), (24, 1000), (16, 4096)])
@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16])
def test_fp8_gemv_matches_ref(m: int, n: int, k: int, xdtype: torch.dtype) -> None:
    # the decode path: weight-only, x as it is (96 and 1000 masked, 4096 in whole chunks)
    g = _g(3)
    w, ws = quantize_weight_ref(torch.randn(n, k, generator=g).to(DEV))
    x = torch.randn(m, k, generator=g).to(xdtype).to(DEV)
    b = torch.randn(n, generator=g).to(DEV)
    for out in (torch.float32, torch.bfloat16):
        tol = dict(atol=1e-4, rtol=1e-4) if out == torch.float32 else dict(atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(fp8_gemv(x, w, ws, b, out_dtype=out), fp8_gemv_ref(x, w, ws, b, out_dtype=out),
                                   **tol)
    y = fp8_gemv(x, w, ws, config=(4, 64, 2, 1), out_dtype=torch.float32)  # masked tiles
    torch.testing.assert_close(y, fp8_gemv_ref(x, w, ws, out_dtype=torch.float32), atol=1e-4, rtol=1e-4)
    exact = x.float() @ (w.float() * ws[:, None]).T  # the dequantized weight, written out
    torch.testing.assert_close(fp8_gemv_ref(x, w, ws, out_dtype=torch.float32), exact, atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("m", [1, 33])  # the weight-only GEMV, and W8A8 torch._scaled_mm above 1 row
def test_fp8_linear_matches_ref(m: int) -> None:
    g = _g(4)
    w, ws = quantize_weight_ref(torch.randn(48, 64, generator=g).to(DEV))
    x, b = torch.randn(m, 64, generator=g).to(DEV), torch.randn(48, generator=g).to(DEV)
    y = fp8_linear(x, w, ws, b, out_dtype=torch.float32)
    # a GPU's FP8 MMA adds a K block's products in fewer bits than fp32 (fp8_mm promotes to fp32
    # every block; an H100 run missed 1e-3 by one element of 1,584, off by 1.7e-3 at 0.69)
    tol = 1e-3 if DEV == "cpu" or m == 1 else 4e-3
    torch.testing.assert_close(y, fp8_linear_ref(x, w, ws, b, out_dtype=torch.float32), atol=tol, rtol=tol)
    # and the W8A8 product is close to the float one (the quantization is sane)
    exact = x @ (w.float() * ws[:, None]).T + b
    assert (y - exact).abs().max() < 0.05 * exact.abs().max()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8, 20])  # the defaults: gemv up to 4 rows, tc to 16 (dequant for groups of 32), dequant above
@pytest.mark.parametrize("k,n,group", [(64, 24, 32), (256, 40, 128)])
def test_int4_linear_matches_ref(dtype: torch.dtype, m: int, k: int, n: int, group: int) -> None:
    qweight, scales, qzeros = _int4(k, n, group, seed=5)
    g = _g(6)
    x, b = torch.randn(m, k, generator=g).to(dtype).to(DEV), torch.randn(n, generator=g).to(dtype).to(DEV)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=6e-2, rtol=2e-2)
    ref = int4_linear_ref(x, qweight, scales, qzeros, group, b)
    torch.testing.assert_close(int4_linear(x, qweight, scales, qzeros, group, b), ref, **tol)
    if m >= 16:  # a smaller dot tile: masked rows and columns
        cfg = Int4Config("gemm", 16, 16, 128, 4, 2)
        torch.testing.assert_close(int4_linear(x, qweight, scales, qzeros, group, b, config=cfg), ref, **tol)


# (config, k, n, group): every path on small shapes, with masked columns (n not a multiple of
# block_n), K cut into parts (split > 1, uneven), groups of 32 / 64 / 128 / 256 / a whole row
_INT4_CASES = {
    "tc": (Int4Config("tc", 16, 32, 128, 4, 3, 1), 256, 40, 128),
    "tc-split3": (Int4Config("tc", 16, 16, 128, 4, 3, 3), 512, 24, 128),  # 4 blocks in parts of 2, 2, 0
    "tc-row-group-split2": (Int4Config("tc", 16, 32, 128, 4, 3, 2), 384, 40, 384),
    "tc-k256": (Int4Config("tc", 16, 32, 256, 4, 3, 1), 512, 40, 256),
    "tc-m32": (Int4Config("tc", 32, 64, 128, 4, 3, 2), 256, 40, 128),
    "gemm": (Int4Config("gemm", 16, 32, 128, 4, 3), 256, 40, 128),
    "gemm-g32": (Int4Config("gemm", 32, 16, 128, 4, 3), 96, 24, 32),  # K < block_k; 4 groups a block
    "gemm-g64-k256": (Int4Config("gemm", 64, 32, 256, 4, 3), 256, 40, 64),
    "gemm-k64": (Int4Config("gemm", 16, 32, 64, 4, 3), 384, 40, 128),  # two blocks a group
    "fold": (Int4Config("fold", 16, 32, 128, 4, 3), 256, 40, 128),
    "fold-g32": (Int4Config("fold", 32, 16, 32, 4, 3), 96, 24, 32),  # three blocks, a group each
    "fold-k64-g256": (Int4Config("fold", 16, 64, 64, 4, 3), 512, 40, 256),  # four blocks a group; masked columns
    "fold-split3": (Int4Config("fold", 16, 16, 128, 4, 3, 3), 512, 24, 128),  # 4 blocks in parts of 2, 2, 0
    "gemm-split2-g32": (Int4Config("gemm", 16, 32, 64, 4, 3, 2), 320, 40, 32),  # 5 blocks in parts of 3, 2
    "dequant": (Int4Config("dequant", 0, 32, 128, 4, 1), 256, 40, 128),
    "dequant-g32": (Int4Config("dequant", 0, 16, 16, 4, 1), 96, 24, 32),
    "gemv-split2": (Int4Config("gemv", 1, 16, 32, 4, 1, 2), 256, 24, 32),
    "gemv-split3-g96": (Int4Config("gemv", 1, 64, 96, 2, 1, 3), 768, 40, 96),  # 8 groups in parts of 3, 3, 2
}


@needs_kernel
@pytest.mark.parametrize("case,m", [(c, m) for c in _INT4_CASES for m in (1, 3, 16, 17, 40)
                                    if _INT4_CASES[c][0].path != "gemv" or m <= 4])  # the GEMV: a program a row
def test_int4_paths_match_ref(case: str, m: int) -> None:
    """Each path and config against the dequantize-first reference, with a bias (added once
    however K is split): fp32 x exactly (up to fp32 sums), bf16 x into an fp32 output."""
    cfg, k, n, group = _INT4_CASES[case]
    qweight, scales, qzeros = _int4(k, n, group, seed=12)
    g = _g(13)
    x, b = torch.randn(m, k, generator=g).to(DEV), torch.randn(n, generator=g).to(DEV)
    for dtype in (torch.float32, torch.bfloat16):
        xd, bd = x.to(dtype), b.to(dtype)
        ref = int4_linear_ref(xd, qweight, scales, qzeros, group, bd, out_dtype=torch.float32)
        y = int4_linear(xd, qweight, scales, qzeros, group, bd, out_dtype=torch.float32, config=cfg)
        # the dequant and gemm paths multiply a weight rounded to x's dtype (on a GPU: the
        # interpreter's dots are fp32 whatever x's dtype)
        loose = cfg.path in ("dequant", "gemm", "fold") and dtype != torch.float32
        tol = dict(atol=6e-2, rtol=2e-2) if loose else dict(atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(y, ref, **tol)


@needs_kernel
@pytest.mark.parametrize("k,n,group", [(256, 40, 128), (96, 24, 32)])
def test_int4_dequantize_kernel_is_exact_in_fp32(k: int, n: int, group: int) -> None:
    qweight, scales, qzeros = _int4(k, n, group, seed=14)
    want = dequantize_ref(qweight, scales, qzeros, group)
    assert torch.equal(dequantize(qweight, scales, qzeros, group, torch.float32), want)
    w = dequantize(qweight, scales, qzeros, group, torch.bfloat16, Int4Config("dequant", 0, 16, 32, 4, 1))
    # one rounding from the exact value (to nearest on the GPU; the interpreter truncates)
    torch.testing.assert_close(w.float(), want, atol=0, rtol=2.0 ** -8 if DEV == "cuda" else 2.0 ** -7)


def test_int4_pick_config_and_candidates() -> None:
    # the H100 sweep's choices: the GEMV at one row, tc up to 16, the dequantized weight and cuBLAS above
    assert pick_config(1, 28672, 4096, 128) == Int4Config("gemv", 1, 128, 128, 1, 1, 15)  # 224 column blocks
    assert pick_config(1, 4096, 4096, 128) == Int4Config("gemv", 1, 128, 128, 1, 1, 16)  # 32 groups in parts of 2
    assert pick_config(1, 4096, 14336, 128).path == "tc"  # K > 8192
    assert pick_config(4, 4096, 4096, 128).path == "tc"
    assert pick_config(4, 4096, 4096, 96).path == "gemv"  # any group up to 256
    assert pick_config(16, 4096, 14336, 128).path == "tc" and pick_config(16, 4096, 14336, 128).split > 1
    assert pick_config(16, 4096, 4096, 64).path == "dequant"  # groups of 64: no 128-input block in one group
    assert pick_config(1, 4096, 4096, 512).path == "tc"  # the GEMV unrolls a group: at most 256
    assert pick_config(128, 28672, 4096, 128).path == "dequant"
    assert pick_config(8192, 28672, 4096, 128).path == "dequant"
    for shape in [(1, 28672, 4096, 128), (1, 4096, 14336, 128), (3, 6144, 4096, 64), (40, 4096, 4096, 128),
                  (128, 28672, 4096, 128), (8192, 28672, 4096, 128), (8192, 4096, 4096, 32)]:
        found = candidate_configs(*shape)
        assert found[0] == pick_config(*shape) and len(set(found)) == len(found)
        assert 6 <= len(found) <= (90 if shape[0] <= 256 else 20), (shape, len(found))
        assert {c.path for c in found} >= ({"tc", "gemv"} if shape[0] == 1 else {"dequant"})
        if shape[0] == 128:
            assert {"gemm", "fold"} <= {c.path for c in found}
    x = torch.zeros(2, 64).to(DEV)
    qweight, scales, qzeros = _int4(64, 24, 32, seed=7)
    for bad in (Int4Config("tc", 16, 16, 128, 4, 3), Int4Config("gemm", 16, 16, 8, 4, 3),
                Int4Config("fold", 16, 16, 64, 4, 3), Int4Config("gemm", 8, 16, 64, 4, 3),
                Int4Config("gemm", 16, 24, 128, 4, 3), Int4Config("dequant", 0, 16, 16, 4, 1, 2),
                Int4Config("mma", 16, 16, 128, 4, 3), Int4Config("gemv", 1, 128, 64, 1, 1)):
        with pytest.raises(ValueError):
            int4_linear(x, qweight, scales, qzeros, 32, config=bad)


@needs_kernel
@pytest.mark.parametrize("m", [1, 3])
def test_int4_gemv_split_k_matches_ref(m: int) -> None:
    # 32 groups of 32 over 24 columns: too few column blocks, so K is cut into parts whose
    # fp32 sums the last part to arrive adds (the bias once); its arrival counters are back
    # at zero afterwards, so the next call starts clean
    from treadle.kernels.int4_linear import _COUNTERS, gemv_split

    k, n, group = 1024, 24, 32
    assert gemv_split(m, n, k, group, 16) > 1
    qweight, scales, qzeros = _int4(k, n, group, seed=10)
    g = _g(11)
    x, b = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEV), torch.randn(n, generator=g).to(torch.bfloat16).to(DEV)
    ref = int4_linear_ref(x, qweight, scales, qzeros, group, b, out_dtype=torch.float32)
    for _ in range(2):
        torch.testing.assert_close(int4_linear(x, qweight, scales, qzeros, group, b, out_dtype=torch.float32), ref,
                                   atol=2e-3, rtol=2e-3)
        assert not _COUNTERS[x.device].any()


def test_kernel_wrappers_refuse_bad_arguments() -> None:
    qweight, scales, qzeros = _int4(64, 24, 32, seed=7, device="cpu")
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="group_size"):
        int4_linear_ref(x, qweight, scales, qzeros, 48)
    with pytest.raises(ValueError, match="qweight"):
        int4_linear_ref(torch.randn(2, 72), qweight, scales, qzeros, 32)
    with pytest.raises(ValueError, match="qzeros"):
        int4_linear_ref(x, qweight, scales, qzeros[:, :2], 32)
    w, ws = quantize_weight_ref(torch.randn(16, 64))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_linear_ref(x, w.float(), ws)
    with pytest.raises(ValueError, match="w_scale"):
        fp8_gemv_ref(x, w, ws[:8])
    with pytest.raises(ValueError, match="x_scale"):
        scaled_mm_ref(per_token_quant_ref(x)[0], ws, w, ws)


# ------------------------------------------------------------------------------ GPU

@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16, 128, 512])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])  # llama3-8b's linears
def test_gpu_llama3_shapes(m: int, n: int, k: int) -> None:
    g = _g(8)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).cuda()
    w, ws = quantize_weight_ref(torch.randn(n, k, generator=g).cuda() * 0.02)
    ref = fp8_linear_ref(x, w, ws, out_dtype=torch.float32)
    torch.testing.assert_close(fp8_linear(x, w, ws, out_dtype=torch.float32), ref, atol=2e-2, rtol=2e-2)
    qweight, scales, qzeros = _int4(k, n, 128, seed=9, device="cuda")
    ref = int4_linear_ref(x, qweight, scales, qzeros, 128, out_dtype=torch.float32)
    torch.testing.assert_close(int4_linear(x, qweight, scales, qzeros, 128, out_dtype=torch.float32), ref,
                               atol=0.5, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("act", [None, "silu"])
def test_gpu_fp8_gemv_takes_every_e4m3_code(act: str | None) -> None:
    """Every finite e4m3 code (the subnormals, zeros of both signs and +-448 among them) reaches
    the FP8 GEMV's products (a plain row, and a gate/up pair's SiLU product) as torch converts it:
    each row holds all 254 codes, so a code converted wrong shows in every output."""
    from treadle.kernels.gemv import gemv, gemv_ref

    codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=torch.uint8)
    n, k = 254 * 2, 1024
    idx = (torch.arange(n)[:, None] * 7 + torch.arange(k)[None, :]) % 254
    w = codes[idx].view(torch.float8_e4m3fn).cuda()
    assert set(w.view(torch.uint8)[0].tolist()) == set(codes.tolist())
    x = torch.randn(1, k, generator=_g(21)).to(torch.bfloat16).cuda()
    ws = torch.rand(n, generator=_g(22)).cuda() + 0.5
    got = gemv(x, w, w_scale=ws, out_dtype=torch.float32, act=act)
    want = gemv_ref(x, w, w_scale=ws, out_dtype=torch.float32, act=act)
    # the products are exact either way; only the order of the fp32 sums differs
    bound = (x.float().abs() @ w.float().abs().T * ws).max().item()
    torch.testing.assert_close(got, want, atol=1e-5 * bound * (bound if act else 1.0), rtol=1e-4)


@needs_kernel
def test_fp8_gate_up_of_one_row_writes_the_silu_product(monkeypatch) -> None:
    """An FP8 gate/up pair of one row (the batch-1 decode step: weight-only GEMV, its input normed
    by the norm's own launch) gives silu(gate) * up from the GEMV itself (kernels/gemv.py's act on a
    plain row), the product the separate SiLU launch gives, with TREADLE_FUSED_SILU unset (auto) or 1;
    0 launches that."""
    from quantized_layers import quantized_linear  # tests/quantized_layers.py

    from treadle.kernels import gemv as gemv_mod

    layer = quantized_linear("fp8", 64, [32, 32], 32, _g(12), DEV, act_and_mul="silu")
    layer.quant.use_kernels = True
    x = torch.randn(1, 64, generator=_g(13)).to(torch.bfloat16).to(DEV)
    gate, up = (x.float() @ layer.quant.dequantize(layer).T + layer.bias.float()).chunk(2, dim=1)
    want = torch.nn.functional.silu(gate) * up
    fused_calls = []
    real = gemv_mod._gemv_normed
    monkeypatch.setattr(gemv_mod, "_gemv_normed", lambda *a, **k: fused_calls.append(1) or real(*a, **k))
    ys = {}
    for setting in ("1", "auto", "0"):
        monkeypatch.setenv("TREADLE_FUSED_SILU", setting)
        before = len(fused_calls)
        ys[setting] = layer.silu_and_mul(x)
        assert (len(fused_calls) > before) == (setting != "0")
    for y in ys.values():
        assert y.shape == (1, 32) and y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), want, atol=2e-2 * want.abs().max().item(), rtol=0)
    torch.testing.assert_close(ys["1"], ys["0"], atol=2e-2 * want.abs().max().item(), rtol=0)


@needs_kernel
@pytest.mark.parametrize("method", ["fp8", "awq", "gptq-act"])
def test_quantized_layer_kernel_path_matches_its_dequantized_weight(method: str) -> None:
    """A merged linear's GPU branch (the kernels, act-order's input permutation) run here under
    the interpreter, against x @ dequantize().T: what the CPU branch and the reference compute."""
    from quantized_layers import quantized_linear  # tests/quantized_layers.py

    g = _g(10)
    layer = quantized_linear(method, 64, [32, 16], 32, g, DEV)
    layer.quant.use_kernels = True
    for m in (1, 20):
        x = torch.randn(m, 64, generator=g).to(DEV)
        want = x @ layer.quant.dequantize(layer).T + layer.bias
        tol = 0.05 * want.abs().max().item() if method == "fp8" else 1e-4  # fp8 also quantizes x on this path
        torch.testing.assert_close(layer(x), want, atol=tol, rtol=0)
