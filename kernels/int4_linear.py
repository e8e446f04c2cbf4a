"""4-bit weight-only (W4A16) linear: ``y = x @ dequant(w) (+ bias)`` in the one packed layout
treadle keeps at run time (AWQ and GPTQ checkpoints are repacked to it at load,
runtime/quantization/int4.py).

Layout (K input features, N outputs, G the group size, K % G == 0, G % 8 == 0, N % 8 == 0):
    qweight  [K // 8, N]  int32: bits 4j..4j+3 of qweight[r, n] hold the 4-bit q of
                          input k = 8r + j (k runs along the packed int, as GPTQ packs)
    scales   [K // G, N]  fp16 / bf16 / fp32
    qzeros   [K // G, N // 8] int32: bits 4j..4j+3 of qzeros[g, c] hold the zero of column 8c + j
    w[k, n] = (q[k, n] - zero[k // G, n]) * scales[k // G, n]      (w is [K, N]: y = x @ w)

GPTQ's act-order (g_idx) is not in the kernel: rows are sorted by group at load and the
caller permutes x's columns the same way (one gather of a [M, K] activation).

``int4_linear`` picks a GEMV for M <= GEMV_MAX_M rows (each program a column block of one
row, a group at a time, the products reduced in registers: the weight is streamed once, half
a byte an element) and a dequantizing GEMM for more (each packed int loaded once and
unpacked in registers to a tile for ``tl.dot``);
``int4_linear_ref`` dequantizes the whole weight and multiplies in fp32.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["GEMV_MAX_M", "int4_linear", "int4_linear_ref", "dequantize_ref", "unpack_rows", "pack_rows",
           "unpack_cols", "pack_cols"]

GEMV_MAX_M = 4
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------- packing helpers

# (one broadcast shift over a [R, 8, N] int32 view: ~10x faster on the CPU than writing each
# nibble plane; int32 shifts wrap, so the top nibble lands in the sign bit as it should)

def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, N] with 8 nibbles an int along the rows -> int32 values [8R, N] (row 8r + j = nibble j)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed[:, None, :] >> shifts[None, :, None]) & 0xF).view(-1, packed.shape[1])


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """`unpack_rows`'s inverse: values in [0, 15], [8R, N] -> int32 [R, N]."""
    if q.shape[0] % 8:
        raise ValueError(f"need a multiple of 8 rows to pack, got {q.shape[0]}")
    q = q.to(torch.int32).reshape(-1, 8, q.shape[1])
    acc = q[:, 0].clone()
    for j in range(1, 8):
        acc |= q[:, j] << (4 * j)
    return acc


def unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] with 8 nibbles an int along the columns -> int32 values [R, 8C] (column 8c + j = nibble j)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed[:, :, None] >> shifts[None, None, :]) & 0xF).view(packed.shape[0], -1)


def pack_cols(q: torch.Tensor) -> torch.Tensor:
    """`unpack_cols`'s inverse: values in [0, 15], [R, 8C] -> int32 [R, C]."""
    if q.shape[1] % 8:
        raise ValueError(f"need a multiple of 8 columns to pack, got {q.shape[1]}")
    q = q.to(torch.int32).reshape(q.shape[0], -1, 8)
    acc = q[:, :, 0].clone()
    for j in range(1, 8):
        acc |= q[:, :, j] << (4 * j)
    return acc


def dequantize_ref(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """The fp32 weight [K, N] of the packed layout (see the module docstring)."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    q = unpack_rows(qweight).view(k // group_size, group_size, n).float()  # [groups, G, N]
    z = unpack_cols(qzeros).float()  # [groups, N]
    return ((q - z[:, None, :]) * scales.float()[:, None, :]).view(k, n)


# ------------------------------------------------------------------------- kernels

@triton.jit
def _int4_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, b_ptr, y_ptr,
    N, K,
    stride_xm, stride_qk, stride_sg, stride_zg, stride_ym,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
):
    # grid: (M, cdiv(N, BLOCK_N), SPLIT); one program = BLOCK_N outputs of one row of x over
    # 1/SPLIT of K (the rows of a column block are neighbours in launch order, so a second row
    # reads w from L2); with SPLIT > 1 the parts are added into a zeroed fp32 y. Each
    # step takes one group: its [GROUP // 8, BLOCK_N] packed ints, each loaded once, and
    # unpacks nibble j of every int (inputs k = 8r + j) in turn. A nibble becomes a float by
    # OR-ing it into 2^23's mantissa, and subtracting 2^23 + zero gives (q - zero) exactly: no
    # int-to-float conversion, whose rate is a quarter of an FMA's. The group's scale
    # multiplies its column sums once.
    m = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < N
    R: tl.constexpr = GROUP // 8
    rs = tl.arange(0, R)
    acc = tl.zeros([R, BLOCK_N], tl.float32)
    x_row = x_ptr + m * stride_xm
    zshift = (ns % 8) * 4
    groups = K // GROUP
    per = tl.cdiv(groups, SPLIT)
    g0 = tl.program_id(2) * per
    for g in range(g0, tl.minimum(g0 + per, groups)):
        packed = tl.load(qw_ptr + (g * R + rs).to(tl.int64)[:, None] * stride_qk + ns[None, :],
                         mask=nmask[None, :], other=0, eviction_policy="evict_first")  # [R, BLOCK_N]
        zp = tl.load(z_ptr + g * stride_zg + ns // 8, mask=nmask, other=0)
        zf = (((zp >> zshift) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)  # 2^23 + zero
        s = tl.load(s_ptr + g * stride_sg + ns, mask=nmask, other=0.0).to(tl.float32)
        part = tl.zeros([R, BLOCK_N], tl.float32)
        for j in tl.static_range(8):
            xj = tl.load(x_row + g * GROUP + rs * 8 + j).to(tl.float32)  # [R]
            q = (((packed >> (4 * j)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
            part += (q - zf[None, :]) * xj[:, None]
        acc += part * s[None, :]
    y = tl.sum(acc, axis=0)
    if HAS_BIAS:
        y += tl.load(b_ptr + ns, mask=nmask & (ns * 0 + tl.program_id(2) == 0), other=0.0).to(tl.float32)
    if SPLIT == 1:
        tl.store(y_ptr + m * stride_ym + ns, y.to(y_ptr.dtype.element_ty), mask=nmask)
    else:
        tl.atomic_add(y_ptr + m * stride_ym + ns, y, mask=nmask)


@triton.jit
def _int4_gemm_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, b_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_qk, stride_sg, stride_zg, stride_ym,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)); each step loads [BLOCK_K // 8, BLOCK_N] packed
    # ints once, unpacks them to a [BLOCK_K, BLOCK_N] tile (row 8r + j = nibble j of packed row
    # r), dequantizes with the one group row the tile lies in (BLOCK_K divides GROUP) and feeds
    # tl.dot
    ms = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = ms < M
    nmask = ns < N
    RP: tl.constexpr = BLOCK_K // 8
    rs = tl.arange(0, RP)
    ks = tl.arange(0, BLOCK_K)
    shifts = tl.arange(0, 8) * 4
    zshift = (ns % 8) * 4
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        packed = tl.load(qw_ptr + (k0 // 8 + rs).to(tl.int64)[:, None] * stride_qk + ns[None, :],
                         mask=nmask[None, :], other=0)  # [RP, BLOCK_N]
        q = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))
        g = k0 // GROUP
        z = (tl.load(z_ptr + g * stride_zg + ns // 8, mask=nmask, other=0) >> zshift) & 0xF
        s = tl.load(s_ptr + g * stride_sg + ns, mask=nmask, other=0.0).to(tl.float32)
        w = (q - z[None, :]).to(tl.float32) * s[None, :]  # [BLOCK_K, BLOCK_N]
        x = tl.load(x_ptr + ms[:, None] * stride_xm + (k0 + ks)[None, :], mask=mmask[:, None], other=0.0)
        if IEEE:  # fp32 x, or the interpreter (whose tl.dot multiplies bf16 bit patterns as integers)
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))
    if HAS_BIAS:
        acc += tl.load(b_ptr + ns, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + ms[:, None] * stride_ym + ns[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


def _check(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int,
           bias: torch.Tensor | None, out_dtype: torch.dtype | None) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in _DTYPES:
        raise ValueError("x must be an fp32/fp16/bf16 [M, K] tensor")
    m, k = x.shape
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError(f"qweight and qzeros must be int32, got {qweight.dtype} and {qzeros.dtype}")
    if qweight.dim() != 2 or qweight.shape[0] * 8 != k:
        raise ValueError(f"qweight must be [K // 8 = {k // 8}, N], got {tuple(qweight.shape)}")
    n = qweight.shape[1]
    if group_size <= 0 or group_size % 8 or k % group_size:
        raise ValueError(f"group_size must be a positive multiple of 8 dividing K = {k}, got {group_size}")
    if scales.shape != (k // group_size, n) or scales.dtype not in _DTYPES:
        raise ValueError(f"scales must be float [K // G = {k // group_size}, N = {n}], got {scales.dtype} "
                         f"{tuple(scales.shape)}")
    if n % 8 or qzeros.shape != (k // group_size, n // 8):
        raise ValueError(f"qzeros must be [K // G, N // 8] = [{k // group_size}, {n // 8}] (N a multiple of 8), "
                         f"got {tuple(qzeros.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must be [N={n}], got {tuple(bias.shape)}")
    if out_dtype is not None and out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype must be fp32/fp16/bf16, got {out_dtype}")
    for name, t in (("qweight", qweight), ("scales", scales), ("qzeros", qzeros)) + ((("bias", bias),) if bias is not None else ()):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def gemv_split(m: int, n: int, k: int, group_size: int, block_n: int) -> int:
    """How many parts the GEMV cuts K into: enough programs for every multiprocessor (about 4
    an SM of the H200's 132) when the column blocks alone are too few, each part at least 4
    groups long."""
    programs = m * triton.cdiv(n, block_n)
    want = triton.cdiv(528, programs)
    return max(1, min(want, (k // group_size) // 4))


def pick_config(m: int, n: int, k: int, group_size: int) -> tuple[int, int, int, int, bool]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, use_dot): the GEMV (use_dot False; BLOCK_K is its
    group) for M <= GEMV_MAX_M, else the dequantizing GEMM, whose BLOCK_K divides the group
    size (a tile's scales are one row) and whose column blocks are narrowed until there are
    enough of them for every multiprocessor."""
    if m <= GEMV_MAX_M:  # narrow column blocks: enough programs for every multiprocessor
        # (H200 sweep without split-K, benchmarks/results/quant_gemv_sweep_cuda.log: 32
        # columns on 4 warps for 28672 x 4096, 1.25 TB/s; 16 for 4096 x 14336, 0.42 TB/s: too
        # few programs, each a long walk along K, which `gemv_split` now cuts)
        return 1, 16 if n <= 8192 else 32, group_size, 4, False
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_k = min(128, group_size)
    while group_size % block_k:
        block_k //= 2
    block_n = 128
    while block_n > 32 and triton.cdiv(m, block_m) * triton.cdiv(n, block_n) < 132:
        block_n //= 2
    return block_m, block_n, block_k, 4, True


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                group_size: int, bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                config: tuple[int, int, int, int, bool] | None = None) -> torch.Tensor:
    """``x [M, K] @ dequant(qweight) [K, N] (+ bias)`` -> [M, N] in out_dtype (default x's)."""
    _check(x, qweight, scales, qzeros, group_size, bias, out_dtype)
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use int4_linear_ref on CPU")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = qweight.shape[1]
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    bm, bn, bk, warps, use_dot = config or pick_config(m, n, k, group_size)
    if use_dot and (bm < 16 or bk < 16 or group_size % bk):
        raise ValueError("a tl.dot tile needs BLOCK_M >= 16 and a BLOCK_K >= 16 that divides the group size")
    if not use_dot and (group_size & (group_size - 1)):
        raise ValueError(f"the GEMV takes a power-of-two group size, got {group_size}")
    qweight, scales, qzeros = qweight.contiguous(), scales.contiguous(), qzeros.contiguous()
    args = (x, qweight, scales, qzeros, bias if bias is not None else scales, y)
    strides = (x.stride(0), qweight.stride(0), scales.stride(0), qzeros.stride(0), y.stride(0))
    if not use_dot:
        split = gemv_split(m, n, k, group_size, bn)
        out = y if split == 1 else torch.zeros((m, n), dtype=torch.float32, device=x.device)
        args = args[:5] + (out,)
        _int4_gemv_kernel[(m, triton.cdiv(n, bn), split)](
            *args, n, k, *strides[:4], out.stride(0), GROUP=group_size, HAS_BIAS=bias is not None, BLOCK_N=bn,
            SPLIT=split, num_warps=warps)
        return y if split == 1 else y.copy_(out)
    _int4_gemm_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        *args, m, n, k, *strides, GROUP=group_size, HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32 or x.device.type != "cuda", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps)
    return y


def int4_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                    group_size: int, bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                    config: tuple[int, int, int, int, bool] | None = None) -> torch.Tensor:
    """Pure-torch reference with the same signature: dequantize to fp32, multiply, round once."""
    _check(x, qweight, scales, qzeros, group_size, bias, out_dtype)
    y = x.float() @ dequantize_ref(qweight, scales, qzeros, group_size)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)
