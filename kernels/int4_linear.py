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

Nibbles become floats without an int-to-float conversion (a quarter of an FMA's rate): the
"magic number" trick. ``v = ((packed >> 4i) & 0x000F000F) | 0x43004300`` holds, in its two
16-bit halves, the bf16 bits of 128 + q for inputs k = 8r + i and 8r + 4 + i (0x4300 is
bf16 128, whose last mantissa bit is worth 1); 0x6400 (fp16 1024) does the same for fp16, and
a bf16's bits shifted to the top of an int32 are the same number in fp32. The four shifts
i = 0..3 of a [R, BLOCK_N] packed tile give 8 sub-tiles; sub-tile j holds inputs 8r + j,
so it meets x's columns k0 + 8r + j (a strided [BLOCK_M, R] load) in its own ``tl.dot``.

``int4_linear`` runs one of five paths (``Int4Config.path``; ``pick_config`` picks from an
H100 sweep, benchmarks/results/quant_linear_sweep_h100.json):
- ``gemv`` (M <= 4, groups of at most 256): a program streams BLOCK_N columns one packed row
  at a time (a warp's 512 contiguous bytes at 128 columns), a group's rows unrolled; the 8
  inputs of a row are scalars of x shared by all of a thread's columns (no layout shuffle),
  two nibbles a bitwise op by the trick above. K is cut into SPLIT parts when the column
  blocks are too few; the last part of a column block to arrive (an acq_rel counter) adds the
  parts' fp32 sums in order: one launch, deterministic.
- ``tc`` (M <= 16 past that, G a multiple of 128): the sub-tiles go into the tensor cores as
  they are, 128 + q in bf16/fp16, one 128-input block a step; the zero and the scale are folded
  into the block's fp32 partial product afterwards: ``(part - rowsum(x) * (128 + z)) * s``. K may
  be cut into SPLIT parts added atomically into a zeroed fp32 output.
- ``dequant`` (every other M): ``_dequant_kernel`` writes the whole weight [K, N] in x's
  dtype, then cuBLAS (``torch.matmul``). At 128 rows it is 3-10x faster than either Triton
  dot path (gate_up 209 us against 400-1,470), and at prefill sizes within a few % of bf16.
- ``gemm`` and ``fold`` (for tens to hundreds of rows): a step's packed [BLOCK_K // 8, BLOCK_N]
  tile broadcast against the 8 nibble shifts is a [BLOCK_K // 8, 8, BLOCK_N] tile whose reshape
  to [BLOCK_K, BLOCK_N] lies in x's input order, so x's tile loads as it is and one ``tl.dot``
  takes the step. ``gemm`` dequantizes in fp32, ``(q - z) * s`` (exact before the cast to x's
  dtype), any group; ``fold`` feeds ``offset + q`` (exact in bf16 / fp16) to the dot and folds
  the zero and the scale into the step's partial product, as ``tc`` does (BLOCK_K dividing the
  group). (The kernel before these two made 8 dots of 16 inputs from strided x columns: 1.2-1.4
  ms for a 128-row down projection on the H100.)
``int4_linear_ref`` dequantizes the whole weight and multiplies in fp32.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl

__all__ = ["GEMV_MAX_M", "TC_MAX_M", "Int4Config", "pick_config", "candidate_configs",
           "int4_linear", "int4_linear_ref", "dequantize", "dequantize_ref", "unpack_rows", "pack_rows",
           "unpack_cols", "pack_cols", "gemv_counters"]

GEMV_MAX_M = 4  # the GEMV's rows
TC_MAX_M = 16  # the tensor-core small-M kernel's rows (one 16-row dot tile)
_SWEEP_GEMM_MAX_M = 256  # candidate_configs offers the Triton dot paths up to here
TC_BLOCK_K = 128  # inputs a tc / gemm step takes at least: 16 packed rows, the least K of a bf16 tl.dot
SMS = 132  # multiprocessors of an H100 / H200
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_PATHS = ("gemv", "tc", "gemm", "fold", "dequant")


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


# ------------------------------------------------------------------------- kernel pieces

@triton.jit
def _magic_halves(packed, i: tl.constexpr, KIND: tl.constexpr):
    """Sub-tiles i and 4 + i of a packed tile (inputs 8r + i, 8r + 4 + i) as 128 + q (1024 + q
    for fp16): KIND 0 fp32 (the bf16 bits moved to the top of an int32), 1 bf16, 2 fp16."""
    if KIND == 2:
        v = ((packed >> (4 * i)) & 0x000F000F) | 0x64006400
        lo = v.to(tl.int16).to(tl.float16, bitcast=True)
        hi = (v >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    else:
        v = ((packed >> (4 * i)) & 0x000F000F) | 0x43004300
        if KIND == 1:
            lo = v.to(tl.int16).to(tl.bfloat16, bitcast=True)
            hi = (v >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            lo = (v << 16).to(tl.float32, bitcast=True)
            hi = (v & -65536).to(tl.float32, bitcast=True)  # 0xFFFF0000: the top half in place
    return lo, hi


@triton.jit
def _magic_offset(KIND: tl.constexpr):
    """The number the tiles of `_magic_halves` add to q."""
    if KIND == 2:
        offset = 1024.0
    else:
        offset = 128.0
    return offset


@triton.jit
def _biased_zeros(z_ptr, ns, mask, offset):
    """offset + the zeros of columns ns (nibble n % 8 of the packed int n // 8 at z_ptr) in fp32,
    through 2^23's mantissa (no int-to-float conversion)."""
    zq = (tl.load(z_ptr + ns // 8, mask=mask, other=0) >> ((ns % 8) * 4)) & 0xF
    return (zq | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 - offset)


@triton.jit
def _mma(x, w, acc, KIND: tl.constexpr):
    """acc + x @ w: fp32 "ieee" for KIND 0 (fp32 x, or the interpreter, whose tl.dot multiplies
    bf16 bit patterns as integers), else in x's dtype on the tensor cores."""
    if KIND == 0:
        acc = tl.dot(x.to(tl.float32), w, acc, input_precision="ieee")
    else:
        acc = tl.dot(x, w.to(x.dtype), acc)
    return acc


@triton.jit
def _x_columns(x_rows, k0, rs, j: tl.constexpr, mmask, K):
    """x[ms, k0 + 8r + j] for the rows r of a packed tile: [BLOCK_M, R], zero past M and K."""
    ks = k0 + rs * 8 + j
    return tl.load(x_rows + ks[None, :], mask=mmask[:, None] & (ks < K)[None, :], other=0.0)


@triton.jit
def _group_rows(s_ptr, z_ptr, k0, rs, rmask, ns, nmask, stride_sg, stride_zg,
                GROUP: tl.constexpr, BLOCK_K: tl.constexpr, offset):
    """(s, offset + z) in fp32 for the packed rows k0 // 8 + rs: one [1, BLOCK_N] row when the
    block lies in one group, else gathered per row [R, BLOCK_N] (a row's inputs share a group)."""
    if GROUP % BLOCK_K == 0:
        g = k0 // GROUP
        s = tl.load(s_ptr + g * stride_sg + ns, mask=nmask, other=0.0).to(tl.float32)[None, :]
        z = _biased_zeros(z_ptr + g * stride_zg, ns, nmask, offset)[None, :]
    else:
        gs = ((k0 + rs * 8) // GROUP)[:, None]
        mask = rmask[:, None] & nmask[None, :]
        s = tl.load(s_ptr + gs * stride_sg + ns[None, :], mask=mask, other=0.0).to(tl.float32)
        z = _biased_zeros(z_ptr + gs * stride_zg, ns[None, :], mask, offset)
    return s, z


@triton.jit
def _group_scales(s_ptr, z_ptr, k0, rs, rmask, ns, nmask, stride_sg, stride_zg,
                  GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """(s, (128 + z) * s) in fp32 for the packed rows k0 // 8 + rs (see `_group_rows`)."""
    s, z = _group_rows(s_ptr, z_ptr, k0, rs, rmask, ns, nmask, stride_sg, stride_zg, GROUP, BLOCK_K, 128.0)
    return s, z * s


@triton.jit
def _write_out(acc, y_ptr, b_ptr, ms, ns, mmask, nmask, stride_ym, part_id, HAS_BIAS: tl.constexpr,
               ATOMIC: tl.constexpr):
    """acc (+ bias, by K's part 0 alone) into y: stored in y's dtype, or added to a zeroed fp32 y."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + ns, mask=nmask & (ns * 0 + part_id == 0), other=0.0).to(tl.float32)[None, :]
    ptrs = y_ptr + ms.to(tl.int64)[:, None] * stride_ym + ns[None, :]
    mask = mmask[:, None] & nmask[None, :]
    if ATOMIC:
        tl.atomic_add(ptrs, acc, mask=mask)
    else:
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------- kernels

@triton.jit
def _int4_tc_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, b_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_qk, stride_sg, stride_zg, stride_ym,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, KIND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
):
    # grid: (cdiv(N, BLOCK_N), SPLIT, cdiv(M, BLOCK_M)); one program = a [BLOCK_M, BLOCK_N]
    # output tile over 1/SPLIT of K's BLOCK_K-input blocks (BLOCK_K >= 128 divides GROUP). A
    # block's packed [BLOCK_K // 8, BLOCK_N] ints are loaded once; its 8 sub-tiles hold 128 + q
    # and meet x's strided columns in 8 dots summed into the block's `part`. A block lies in
    # one group, so (part - rowsum(x) * (128 + z)) * s is its exact share of x @ w.
    ms = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = ms < M
    nmask = ns < N
    rs = tl.arange(0, BLOCK_K // 8)
    x_rows = x_ptr + ms.to(tl.int64)[:, None] * stride_xm
    offset = _magic_offset(KIND)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    blocks = K // BLOCK_K
    per = tl.cdiv(blocks, SPLIT)
    b0 = tl.program_id(1) * per
    for b in range(b0, tl.minimum(b0 + per, blocks)):
        k0 = b * BLOCK_K
        packed = tl.load(qw_ptr + (k0 // 8 + rs).to(tl.int64)[:, None] * stride_qk + ns[None, :],
                         mask=nmask[None, :], other=0, eviction_policy="evict_first")
        part = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        xs = tl.zeros([BLOCK_M, BLOCK_K // 8], tl.float32)  # the 8 x tiles added, then one row sum
        for i in tl.static_range(4):
            lo, hi = _magic_halves(packed, i, KIND)
            x_lo = _x_columns(x_rows, k0, rs, i, mmask, K)
            x_hi = _x_columns(x_rows, k0, rs, 4 + i, mmask, K)
            part = _mma(x_hi, hi, _mma(x_lo, lo, part, KIND), KIND)
            xs += x_lo.to(tl.float32) + x_hi.to(tl.float32)
        g = k0 // GROUP
        z = _biased_zeros(z_ptr + g * stride_zg, ns, nmask, offset)
        s = tl.load(s_ptr + g * stride_sg + ns, mask=nmask, other=0.0).to(tl.float32)
        acc += (part - tl.sum(xs, axis=1)[:, None] * z[None, :]) * s[None, :]
    _write_out(acc, y_ptr, b_ptr, ms, ns, mmask, nmask, stride_ym, tl.program_id(1), HAS_BIAS, SPLIT > 1)


@triton.jit
def _int4_gemm_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, b_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_qk, stride_sg, stride_zg, stride_ym,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, KIND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT): 1/SPLIT of K's blocks a program (its
    # part added atomically into a zeroed fp32 output when SPLIT > 1); a step takes BLOCK_K inputs: x's [BLOCK_M,
    # BLOCK_K] tile as it lies and the packed [BLOCK_K // 8, BLOCK_N] ints, whose nibbles
    # broadcast against 8 shifts make a [BLOCK_K // 8, 8, BLOCK_N] tile: row r, nibble j is
    # input 8r + j, so the reshape to [BLOCK_K, BLOCK_N] is in x's order and one dot takes the
    # whole step. The 4-bit values become floats through 2^23's mantissa (no int-to-float
    # conversion):
    # - FOLD 0 ("gemm"): w = (q - z) * s in fp32 (exact, one rounding), cast to x's dtype;
    # - FOLD 1 ("fold", BLOCK_K dividing GROUP): offset + q, exact in x's dtype (128 + q in
    #   bf16, 1024 + q in fp16, q in fp32), into the dot as it is; the step's part of the
    #   product is then (part - rowsum(x) * (offset + z)) * s, the block being in one group.
    ms = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = ms < M
    nmask = ns < N
    rs = tl.arange(0, BLOCK_K // 8)
    ks = tl.arange(0, BLOCK_K)
    shifts = (tl.arange(0, 8) * 4)[None, :, None]
    x_rows = x_ptr + ms.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    q_rows = qw_ptr + rs.to(tl.int64)[:, None] * stride_qk + ns[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT) * BLOCK_K
    k_start = tl.program_id(2) * per
    for k0 in range(k_start, tl.minimum(k_start + per, K), BLOCK_K):
        rmask = k0 + rs * 8 < K
        x = tl.load(x_rows + k0, mask=mmask[:, None] & (k0 + ks < K)[None, :], other=0.0)
        packed = tl.load(q_rows + (k0 // 8) * stride_qk, mask=rmask[:, None] & nmask[None, :], other=0)
        q = (packed[:, None, :] >> shifts) & 0xF  # [R, 8, BLOCK_N]: input 8r + j
        if FOLD:
            g = k0 // GROUP
            s = tl.load(s_ptr + g * stride_sg + ns, mask=nmask, other=0.0).to(tl.float32)
            if KIND == 1:
                wq = (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
                zb = _biased_zeros(z_ptr + g * stride_zg, ns, nmask, 128.0)
            elif KIND == 2:
                wq = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
                zb = _biased_zeros(z_ptr + g * stride_zg, ns, nmask, 1024.0)
            else:
                wq = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
                zb = _biased_zeros(z_ptr + g * stride_zg, ns, nmask, 0.0)
            part = _mma(x, tl.reshape(wq, (BLOCK_K, BLOCK_N)), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), KIND)
            xs = tl.sum(x.to(tl.float32), axis=1)
            acc += (part - xs[:, None] * zb[None, :]) * s[None, :]
        else:
            s, zc = _group_rows(s_ptr, z_ptr, k0, rs, rmask, ns, nmask, stride_sg, stride_zg, GROUP, BLOCK_K,
                                8388608.0)
            w = ((q | 0x4B000000).to(tl.float32, bitcast=True) - zc[:, None, :]) * s[:, None, :]
            acc = _mma(x, tl.reshape(w, (BLOCK_K, BLOCK_N)), acc, KIND)
    _write_out(acc, y_ptr, b_ptr, ms, ns, mmask, nmask, stride_ym, tl.program_id(2), HAS_BIAS, SPLIT > 1)


@triton.jit
def _dequant_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr,
    N, K,
    stride_qk, stride_sg, stride_zg, stride_wk,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # grid: (cdiv(K, BLOCK_K), cdiv(N, BLOCK_N)); w[k0 + 8r + j, n] from sub-tile j of one
    # packed [BLOCK_K // 8, BLOCK_N] tile, (128 + q) * s - (128 + z) * s in fp32, stored in w's dtype
    k0 = tl.program_id(0) * BLOCK_K
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < N
    rs = tl.arange(0, BLOCK_K // 8)
    rmask = k0 + rs * 8 < K
    mask = rmask[:, None] & nmask[None, :]
    packed = tl.load(qw_ptr + (k0 // 8 + rs).to(tl.int64)[:, None] * stride_qk + ns[None, :], mask=mask, other=0)
    s, zs = _group_scales(s_ptr, z_ptr, k0, rs, rmask, ns, nmask, stride_sg, stride_zg, GROUP, BLOCK_K)
    rows = w_ptr + (k0 + rs * 8).to(tl.int64)[:, None] * stride_wk + ns[None, :]
    for i in tl.static_range(4):
        lo, hi = _magic_halves(packed, i, 0)
        tl.store(rows + i * stride_wk, (lo * s - zs).to(w_ptr.dtype.element_ty), mask=mask)
        tl.store(rows + (4 + i) * stride_wk, (hi * s - zs).to(w_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _int4_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K,
    stride_xm, stride_qk, stride_sg, stride_zg, stride_ym,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr,
):
    # grid: (M, cdiv(N, BLOCK_N), SPLIT); one program = BLOCK_N outputs of one row of x over
    # 1/SPLIT of K's groups (the rows of x for one column block are neighbours in launch order,
    # so a second row reads w from L2). Each step is one packed row, [BLOCK_N] ints (a warp's
    # 512 contiguous bytes at 128 columns), unrolled over a group's GROUP // 8 rows so their
    # loads are in flight together. The 8 inputs of a packed row are 8 scalars of x: every
    # thread multiplies its ints' nibbles by the same x[8r + j], so x costs no layout shuffle
    # and one load for all of a thread's columns. Nibbles become floats by `_magic_halves`'
    # trick (two nibbles a bitwise op, no int-to-float conversion), 128 + q multiplied into
    # x as they are; the offset, the zero and the scale are folded once a group:
    # acc += s * sum((128 + q) x) - s * (128 + z) * sum(x).
    #
    # With SPLIT > 1 each program writes its fp32 partial sums to ws[part, m, :], and the last
    # of a column block's SPLIT programs to arrive (an acq_rel counter at cnt[m, block], which
    # it sets back to 0) adds them in part order, adds the bias and stores y: one launch,
    # deterministic, no zeroed buffer.
    m = tl.program_id(0)
    pid_n = tl.program_id(1)
    part_id = tl.program_id(2)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < N
    R: tl.constexpr = GROUP // 8
    groups = K // GROUP
    per = tl.cdiv(groups, SPLIT)
    g0 = part_id * per
    g1 = tl.minimum(g0 + per, groups)
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    zshift = (ns % 8) * 4
    acc = tl.zeros([BLOCK_N], tl.float32)
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    for g in range(g0, g1):
        rows = qw_ptr + g * R * stride_qk + ns
        s = tl.load(s_ptr + g * stride_sg + ns, mask=nmask, other=0.0).to(tl.float32)
        z = ((tl.load(z_ptr + g * stride_zg + ns // 8, mask=nmask, other=0) >> zshift) & 0xF).to(tl.float32)
        xg = x_row + g * GROUP
        part = tl.zeros([BLOCK_N], tl.float32)
        xsum = 0.0
        for r in tl.static_range(R):
            p = tl.load(rows + r * stride_qk, mask=nmask, other=0, eviction_policy="evict_first")
            for i in tl.static_range(4):
                lo, hi = _magic_halves(p, i, 0)  # 128 + q[8r + i], 128 + q[8r + 4 + i] in fp32
                x_lo = tl.load(xg + r * 8 + i).to(tl.float32)
                x_hi = tl.load(xg + r * 8 + 4 + i).to(tl.float32)
                xsum += x_lo
                xsum += x_hi
                part = tl.fma(lo, x_lo, part)
                part = tl.fma(hi, x_hi, part)
        acc += part * s - ((128.0 + z) * s) * xsum
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + ns, mask=nmask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m.to(tl.int64) * stride_ym + ns, acc.to(y_ptr.dtype.element_ty), mask=nmask)
    else:
        tl.store(ws_ptr + (part_id * M + m).to(tl.int64) * N + ns, acc, mask=nmask)
        tl.debug_barrier()  # every thread's partials written before the counter is released
        cnt = cnt_ptr + m * tl.num_programs(1) + pid_n
        arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            y = tl.zeros([BLOCK_N], tl.float32)
            for i in range(SPLIT):  # L2 only (.cg): another SM wrote them
                y += tl.load(ws_ptr + (i * M + m).to(tl.int64) * N + ns, mask=nmask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                y += tl.load(b_ptr + ns, mask=nmask, other=0.0).to(tl.float32)
            tl.store(y_ptr + m.to(tl.int64) * stride_ym + ns, y.to(y_ptr.dtype.element_ty), mask=nmask)
            tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


def _check(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int,
           bias: torch.Tensor | None, out_dtype: torch.dtype | None) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in _DTYPES:
        raise ValueError("x must be an fp32/fp16/bf16 [M, K] tensor")
    m, k = x.shape
    _check_weight(k, qweight, scales, qzeros, group_size)
    n = qweight.shape[1]
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must be [N={n}], got {tuple(bias.shape)}")
    if out_dtype is not None and out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype must be fp32/fp16/bf16, got {out_dtype}")
    for name, t in (("qweight", qweight), ("scales", scales), ("qzeros", qzeros)) + ((("bias", bias),) if bias is not None else ()):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def _check_weight(k: int, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int) -> None:
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


# ------------------------------------------------------------------------- configs

class Int4Config(NamedTuple):
    """How `int4_linear` runs: ``path`` one of "gemv", "tc", "gemm", "dequant"; the tile
    [block_m, block_n] of outputs a program makes (gemv: one row; dequant: block_m unused) and
    block_k inputs a step (gemv: its group; tc: a multiple of 128 dividing the group; gemm: a
    power of two >= 128; dequant: the [block_k, block_n] weight tile a program writes);
    ``warps`` and ``stages`` for the launch; ``split`` the parts K is cut into (the GEMV's
    last part adds them; tc, gemm and fold add theirs atomically into a zeroed fp32 output;
    dequant: 1)."""
    path: str
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    split: int = 1


def gemv_split(m: int, n: int, k: int, group_size: int, block_n: int) -> int:
    """How many parts the GEMV cuts K into: a program is one warp and its loads in flight are
    one group's rows, so it wants many, about 24 an SM (of an H100 / H200's 132; an H100 sweep:
    llama3-8b's gate_up 60.5 us in 3 parts, 30.2 us in 16), each part at least 2 groups long."""
    programs = m * triton.cdiv(n, block_n)
    want = triton.cdiv(24 * SMS, programs)
    return max(1, min(want, (k // group_size) // 2))


def tc_split(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int = TC_BLOCK_K) -> int:
    """How many parts the tc kernel cuts K into: about 2 programs an SM when the output tiles
    alone are fewer, each part at least 4 blocks of block_k inputs."""
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    return max(1, min(triton.cdiv(2 * SMS, tiles), (k // block_k) // 4))


def _tc_fits(k: int, group_size: int) -> bool:
    return group_size % TC_BLOCK_K == 0 and k % TC_BLOCK_K == 0


def _dot_config(m: int, n: int, k: int, group_size: int) -> Int4Config:
    """A one-dot-a-step launch (candidate_configs' first guess): fold where 128-input blocks lie in
    one group, else gemm; a tile of up to 128 rows, 128 columns while that gives every SM a
    program (else 64, and K cut into parts as tc cuts it)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    path = "fold" if group_size % 128 == 0 else "gemm"
    block_n = 128 if triton.cdiv(m, block_m) * triton.cdiv(n, 128) >= SMS else 64
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split = 1 if tiles >= SMS else tc_split(m, n, k, block_m, block_n)
    return Int4Config(path, block_m, block_n, 128, 8 if block_m == 128 else 4, 3, split)


def _gemv_config(m: int, n: int, k: int, group_size: int) -> Int4Config | None:
    """The GEMV's launch (up to GEMV_MAX_M rows, groups of at most 256): 128 columns a
    program (a warp's 512 bytes a packed row) on one warp, K split while the column blocks
    are fewer than ~4 programs an SM."""
    if m > GEMV_MAX_M or group_size > 256:
        return None
    return Int4Config("gemv", 1, 128, group_size, 1, 1, gemv_split(m, n, k, group_size, 128))


def pick_config(m: int, n: int, k: int, group_size: int) -> Int4Config:
    """The default config of an [m, k] x [k, n] product with group_size-wide groups (an H100
    sweep, benchmarks/results/quant_linear_sweep_gemv_h100.json):
    - one row: "gemv" (K split for about 24 programs an SM), but "tc" for K > 8192 with groups
      a multiple of 128 (llama3-8b's down projection: 30.1 us against the GEMV's 38.6);
    - up to TC_MAX_M rows with groups a multiple of 128: "tc" (a 16-row tile, 64 columns, 4
      warps, 3 stages, K split so that there are about 2 programs an SM): at 4 rows it beat
      the GEMV, whose programs for each row read w again, on every llama3-8b shape;
    - up to GEMV_MAX_M rows with other groups (up to 256): "gemv";
    - otherwise "dequant" (the weight in x's dtype, then cuBLAS). The one-dot kernels ("fold",
      "gemm") are configs only: at 128 rows on an H100 a llama3-8b layer took 418.6 us with
      `_dot_config`'s launch against bf16's 178.6 in the same run
      (results/quant_linear_fold_s44_h100.json), no better than dequant's 402.8 in an earlier
      H100 run (quant_linear_int4mma_nopdl_h100.json); 203.4 us at 64 rows, 403.2 at 32."""
    tc = m <= TC_MAX_M and _tc_fits(k, group_size)
    gemv = _gemv_config(m, n, k, group_size)
    if gemv is not None and (not tc or (m == 1 and k <= 8192)):
        return gemv
    if tc:
        return Int4Config("tc", 16, 64, TC_BLOCK_K, 4, 3, tc_split(m, n, k, 16, 64))
    return Int4Config("dequant", 0, 64, 128, 4, 1)


def candidate_configs(m: int, n: int, k: int, group_size: int) -> list[Int4Config]:
    """Configs worth timing for this shape on the GPU, the default first (no duplicates)."""
    found = [pick_config(m, n, k, group_size)]
    if m <= TC_MAX_M and _tc_fits(k, group_size):
        for bn, warps, stages in ((32, 4, 3), (64, 4, 2), (64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 8, 4)):
            found.append(Int4Config("tc", 16, bn, TC_BLOCK_K, warps, stages, tc_split(m, n, k, 16, bn)))
        found += [Int4Config("tc", 16, 64, TC_BLOCK_K, 4, 3, s) for s in (1, 2, 4, 8) if s <= k // TC_BLOCK_K]
        if group_size % 256 == 0:
            found.append(Int4Config("tc", 16, 64, 256, 4, 3, tc_split(m, n, k, 16, 64, 256)))
        for path, bn, warps in (("fold", 32, 4), ("fold", 64, 4), ("fold", 128, 4), ("fold", 128, 8), ("gemm", 64, 4)):
            found.append(Int4Config(path, 16, bn, TC_BLOCK_K, warps, 3, tc_split(m, n, k, 16, bn)))
        gemv = _gemv_config(m, n, k, group_size)
        if gemv is not None:
            found += [gemv._replace(block_n=bn, warps=w, split=gemv_split(m, n, k, group_size, bn)) for bn, w in
                      ((128, 1), (64, 1), (256, 1), (256, 2), (512, 4))]
            found += [gemv._replace(split=s) for s in (1, 4, 16, 32, 64) if s <= k // group_size // 2]
    elif m <= _SWEEP_GEMM_MAX_M:
        guess = _dot_config(m, n, k, group_size)  # the launch measured in session 44 (pick_config's docstring)
        found.append(guess)
        bm = guess.block_m
        for path in ("fold", "gemm") if group_size % 64 == 0 else ("gemm",):
            for block_m in dict.fromkeys((bm, max(16, bm // 2))):
                for bn, bk in ((64, 64), (64, 128), (128, 64), (128, 128), (256, 64)):
                    found += [Int4Config(path, block_m, bn, bk, w, st) for w, st in ((4, 3), (8, 3), (4, 4), (8, 4))]
            for bn, split in ((64, 2), (64, 4), (128, 2), (128, 4)):
                found.append(Int4Config(path, bm, bn, 128, 8 if bm == 128 else 4, 3, split))
        found.append(Int4Config("dequant", 0, 64, 128, 4, 1))
    else:
        found += [Int4Config("dequant", 0, bn, bk, w, 1) for bn, bk, w in
                  ((128, 128, 4), (64, 256, 4), (128, 256, 8), (256, 128, 8))]
        found += [Int4Config("gemm", 128, bn, 128, 8, st) for bn, st in ((128, 3), (256, 3), (128, 4))]
    return list(dict.fromkeys(found))


def _validate(cfg: Int4Config, k: int, group_size: int) -> None:
    if cfg.path not in _PATHS:
        raise ValueError(f"path must be one of {_PATHS}, got {cfg.path!r}")
    pow2 = (cfg.block_n,) + ((cfg.block_k,) if cfg.path != "gemv" else ()) \
        + ((cfg.block_m,) if cfg.path in ("tc", "gemm", "fold") else ())
    if any(v <= 0 or v & (v - 1) for v in pow2) or cfg.split < 1 or cfg.warps < 1 or cfg.stages < 1:
        raise ValueError(f"block sizes must be powers of two, split, warps and stages positive: {cfg}")
    if cfg.path == "gemv" and (cfg.block_k != group_size or group_size > 256):
        raise ValueError(f"the GEMV takes groups of at most 256 as its block_k, got {cfg}")
    if cfg.path == "tc" and (cfg.block_k < TC_BLOCK_K or group_size % cfg.block_k or cfg.block_m < 16):
        raise ValueError(f"tc needs block_m >= 16 and a block_k >= 128 that divides the group size: {cfg}")
    if cfg.path in ("gemm", "fold") and (cfg.block_k < 16 or cfg.block_m < 16 or cfg.block_n < 16):
        raise ValueError(f"{cfg.path} needs tiles of at least 16 (a dot's least): {cfg}")
    if cfg.path == "fold" and group_size % cfg.block_k:
        raise ValueError(f"fold needs a block_k that divides the group size ({group_size}): {cfg}")
    if cfg.path == "dequant" and cfg.split != 1:
        raise ValueError(f"dequant does not split K: {cfg}")
    if cfg.path == "dequant" and cfg.block_k < 8:
        raise ValueError(f"dequant's block_k is at least one packed row (8): {cfg}")


# ------------------------------------------------------------------------- launchers

def _kind(x: torch.Tensor) -> int:
    """The kernels' tile dtype: 0 fp32 "ieee" dots (fp32 x, or the interpreter), 1 bf16, 2 fp16."""
    if x.dtype == torch.float32 or x.device.type != "cuda":
        return 0
    return 1 if x.dtype == torch.bfloat16 else 2


def _split_out(y: torch.Tensor, split: int) -> torch.Tensor:
    """Where the kernel writes: y, or a zeroed fp32 buffer its K parts are added into."""
    return y if split == 1 else torch.zeros(y.shape, dtype=torch.float32, device=y.device)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def gemv_counters(device: torch.device, need: int) -> torch.Tensor:
    """The GEMV's split-K arrival counters on `device`: zeros, and back to zero after every
    launch (the last program of a column block resets its own). Kept for the process, grown
    outside CUDA-graph capture; launches on one stream at a time share them."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < need:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the int4 GEMV's counters must be allocated before CUDA-graph capture: run the "
                               "shape once eagerly first")
        have = torch.zeros(max(need, 1 << 16), dtype=torch.int32, device=device)
        _COUNTERS[device] = have
    return have


def _run_gemv(x, qweight, scales, qzeros, group_size, bias, y, cfg):
    m, k = x.shape
    n = y.shape[1]
    blocks = triton.cdiv(n, cfg.block_n)
    ws = torch.empty((cfg.split, m, n), dtype=torch.float32, device=x.device) if cfg.split > 1 else y
    cnt = gemv_counters(x.device, m * blocks) if cfg.split > 1 else y
    _int4_gemv_kernel[(m, blocks, cfg.split)](
        x, qweight, scales, qzeros, bias if bias is not None else scales, y, ws, cnt, m, n, k,
        x.stride(0), qweight.stride(0), scales.stride(0), qzeros.stride(0), y.stride(0),
        GROUP=group_size, HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, SPLIT=cfg.split,
        num_warps=cfg.warps, num_stages=cfg.stages, **pdl.options(x))
    return y


def _run_tc(x, qweight, scales, qzeros, group_size, bias, y, cfg):
    m, k = x.shape
    n = y.shape[1]
    out = _split_out(y, cfg.split)
    _int4_tc_kernel[(triton.cdiv(n, cfg.block_n), cfg.split, triton.cdiv(m, cfg.block_m))](
        x, qweight, scales, qzeros, bias if bias is not None else scales, out, m, n, k,
        x.stride(0), qweight.stride(0), scales.stride(0), qzeros.stride(0), out.stride(0),
        GROUP=group_size, HAS_BIAS=bias is not None, KIND=_kind(x), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT=cfg.split, num_warps=cfg.warps, num_stages=cfg.stages)
    return out


def _run_gemm(x, qweight, scales, qzeros, group_size, bias, y, cfg):
    m, k = x.shape
    n = y.shape[1]
    out = _split_out(y, cfg.split)
    _int4_gemm_kernel[(triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split)](
        x, qweight, scales, qzeros, bias if bias is not None else scales, out, m, n, k,
        x.stride(0), qweight.stride(0), scales.stride(0), qzeros.stride(0), out.stride(0),
        GROUP=group_size, HAS_BIAS=bias is not None, KIND=_kind(x), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, FOLD=cfg.path == "fold", SPLIT=cfg.split, num_warps=cfg.warps, num_stages=cfg.stages)
    return out


def _run_dequant(x, qweight, scales, qzeros, group_size, bias, y, cfg):
    w = dequantize(qweight, scales, qzeros, group_size, x.dtype, cfg)
    out = x @ w if bias is None else torch.addmm(bias.to(x.dtype), x, w)
    return out


_RUNNERS = {"gemv": _run_gemv, "tc": _run_tc, "gemm": _run_gemm, "fold": _run_gemm, "dequant": _run_dequant}


def _on_kernel_device(t: torch.Tensor) -> None:
    if t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"the kernels need a CUDA device (got {t.device}); use the _ref functions on CPU")


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int,
               dtype: torch.dtype = torch.bfloat16, config: Int4Config | None = None) -> torch.Tensor:
    """The weight [K, N] in dtype by `_dequant_kernel` (config's block_n, block_k, warps)."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    _check_weight(k, qweight, scales, qzeros, group_size)
    _on_kernel_device(qweight)
    cfg = config or Int4Config("dequant", 0, 64, 128, 4, 1)
    _validate(cfg, k, group_size)
    qweight, scales, qzeros = qweight.contiguous(), scales.contiguous(), qzeros.contiguous()
    w = torch.empty((k, n), dtype=dtype, device=qweight.device)
    _dequant_kernel[(triton.cdiv(k, cfg.block_k), triton.cdiv(n, cfg.block_n))](
        qweight, scales, qzeros, w, n, k, qweight.stride(0), scales.stride(0), qzeros.stride(0), w.stride(0),
        GROUP=group_size, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.warps, num_stages=cfg.stages)
    return w


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                group_size: int, bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                config: Int4Config | None = None) -> torch.Tensor:
    """``x [M, K] @ dequant(qweight) [K, N] (+ bias)`` -> [M, N] in out_dtype (default x's), by
    config's path (default `pick_config`'s)."""
    _check(x, qweight, scales, qzeros, group_size, bias, out_dtype)
    _on_kernel_device(x)
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = qweight.shape[1]
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    cfg = config or pick_config(m, n, k, group_size)
    _validate(cfg, k, group_size)
    qweight, scales, qzeros = qweight.contiguous(), scales.contiguous(), qzeros.contiguous()
    out = _RUNNERS[cfg.path](x, qweight, scales, qzeros, group_size, bias, y, cfg)
    return out if out is y else y.copy_(out)


def int4_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                    group_size: int, bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                    config: Int4Config | None = None) -> torch.Tensor:
    """Pure-torch reference with the same signature: dequantize to fp32, multiply, round once."""
    _check(x, qweight, scales, qzeros, group_size, bias, out_dtype)
    y = x.float() @ dequantize_ref(qweight, scales, qzeros, group_size)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)
