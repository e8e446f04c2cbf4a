"""4-bit weight-only (W4A16) linear on the tensor cores, fed straight from memory: the int4 path
for decode batches (up to 64 rows) and the dequantization for prefill, in CUDA C++
(kernels/int4_mma.cu) compiled at run time by NVRTC (kernels/cuda_jit.py).

Why not Triton: at batch 1 a decode step streams ~3.5 GB of 4-bit weights (llama3-8b), so the
GEMV must turn memory into products at ~6 G weights a microsecond. On the CUDA cores that is
three instructions a weight (two to make a float, one FMA), close to what the SMs can issue:
the Triton GEMV (kernels/int4_linear.py) reaches 30-50% of the copy bandwidth. The tensor
cores take the products and the sums off the CUDA cores, but only when each thread holds the
exact elements of its ``mma`` fragment, which Triton gives no way to place; its dot path goes
through shared memory instead, and measured no faster.

The layout ("mma layout"), made at load by `pack_mma` from q [K, N] (values 0..15):

    qweight_mma  int32 [N // 16, K // 64, 32, 4]

Element [nt, c, lane, s] is the 4-bit q of outputs n0 = 16 nt + g and n0 + 8 + g (g = lane // 4)
over inputs k = 64 c + 16 t + 4 s + j (t = lane % 4, j = 0..3), with nibbles at bits

    j:          0    1    2    3
    row g       0   16    8   24
    row g + 8   4   20   12   28

so that ``((word >> 4 i) & 0x000F000F) | 0x43004300`` (i = 0..3) is, as two bf16s, 128 + q of
the A fragment registers a0..a3 of ``mma.m16n8k16`` (A = the weight tile, 16 outputs x 16
inputs; B = x's tile, 16 inputs x 8 rows of x), with the inputs of an mma step taken in the
order k = 16 t + 4 s + (0, 1 | 2, 3) (the sum does not care which input is which, so long as
A and B agree): a lane's B fragments over the 4 steps of a chunk are then x's 16 consecutive
inputs 64 c + 16 t .. + 15, two 16-byte loads. A warp reads 512 contiguous bytes of weights a
chunk, 16 a lane. fp16 uses 0x6400 (1024 + q). The offset and the zero are removed by a second
mma a step, of the constant tile -(128 + z) (one value a row) with the same x: D = sum (q - z) x
in fp32, and the scale is applied once a group: y += s * D. Scales and zeros stay as
kernels/int4_linear.py keeps them ([K // G, N] and [K // G, N // 8]).

A gate/up pair (a SwiGLU MLP's merged gate_up projection, gate outputs then up outputs) can be
stored interleaved by 8 outputs (`interleave_gate_up`): each 16-output tile then holds 8 gate
outputs in its rows g and their up outputs in its rows g + 8, which a lane's accumulators hold
side by side, so ``int4_mma_linear(..., gated=True)`` writes silu(gate) * up itself (no
activation kernel, no [M, 2I] intermediate).

``int4_mma_linear`` needs N % 16 == 0, K % 64 == 0, a group that is a multiple of 64 and divides
K, x in bf16 or fp16 and scales in fp16 or bf16 (`supports`); the runtime keeps the Triton
layout for anything else. ``int4_mma_linear_ref`` (CPU) unpacks and multiplies in fp32.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton

from treadle.kernels import cuda_jit, pdl
from treadle.kernels.activation import silu_and_mul, silu_and_mul_ref
from treadle.kernels.int4_linear import dequantize_ref, pack_rows

__all__ = ["MMA_MAX_M", "MmaConfig", "supports", "available", "pack_mma", "unpack_mma", "mma_to_rows",
           "interleave_gate_up", "deinterleave_gate_up",
           "int4_mma_linear", "int4_mma_linear_ref", "int4_mma_dequantize", "pick_mma_config",
           "candidate_mma_configs", "prepare", "int4_mma_read_bound"]

MMA_MAX_M = 64  # rows the tensor-core GEMV takes (eight 8-row tiles of x); more are dequantized for cuBLAS
_MAX_TILES = 8
_SHARED_BYTES = 48 * 1024  # a block's static shared memory: its warps' partial sums, 512 bytes a tile each
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "int4_mma.cu")
_KIND = {torch.bfloat16: 1, torch.float16: 2}
_SIG_GEMV = "pppppp" + "iiiiii"
_SIG_DEQUANT = "pppp" + "iii"

# nibble bit of (row half h: 0 for g, 1 for g + 8; input j of the 4 a step takes)
_BIT = torch.tensor([[0, 16, 8, 24], [4, 20, 12, 28]], dtype=torch.int64)


class MmaConfig(NamedTuple):
    """warps: a block's warps, which cut K among them; unroll: 64-input chunks a warp loads ahead;
    order: 0 a contiguous range of chunks a warp, 1 units of `unroll` chunks dealt in turn;
    dequant: instead of the GEMV, dequantize the weight and multiply by cuBLAS."""
    warps: int
    unroll: int
    order: int = 0
    dequant: bool = False


def supports(n: int, k: int, group_size: int, x_dtype: torch.dtype, scale_dtype: torch.dtype) -> bool:
    return (n % 16 == 0 and k % 64 == 0 and group_size % 64 == 0 and k % group_size == 0
            and x_dtype in _KIND and scale_dtype in _KIND)


def available(device: torch.device | None = None) -> bool:
    """Can the kernels run here: a CUDA device of compute capability 8.0 or later, and NVRTC."""
    if not cuda_jit.available():
        return False
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index)[0] >= 8


# ------------------------------------------------------------------------- the layout

def pack_mma(q: torch.Tensor) -> torch.Tensor:
    """q [K, N] (integers 0..15, any int dtype) -> the mma layout, int32 [N // 16, K // 64, 32, 4]."""
    k, n = q.shape
    if n % 16 or k % 64:
        raise ValueError(f"the mma layout needs N % 16 == 0 and K % 64 == 0, got K={k}, N={n}")
    # q[k, n] with k = 64 c + 16 t + 4 s + j and n = 16 nt + 8 h + g
    v = q.to(torch.int64).reshape(k // 64, 4, 4, 4, n // 16, 2, 8)  # [c, t, s, j, nt, h, g]
    v = v.permute(4, 0, 6, 1, 2, 5, 3)  # [nt, c, g, t, s, h, j]
    words = (v << _BIT.to(v.device)).sum(dim=(-2, -1))  # [nt, c, g, t, s]
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.to(torch.int32).reshape(n // 16, k // 64, 32, 4).contiguous()


def unpack_mma(packed: torch.Tensor) -> torch.Tensor:
    """`pack_mma`'s inverse: -> int32 q [K, N]."""
    nt, kc = packed.shape[0], packed.shape[1]
    w = packed.to(torch.int64).reshape(nt, kc, 8, 4, 4, 1, 1) & 0xFFFFFFFF  # [nt, c, g, t, s, 1, 1]
    v = (w >> _BIT.to(w.device)) & 0xF  # [nt, c, g, t, s, h, j]
    v = v.permute(1, 3, 4, 6, 0, 5, 2)  # [c, t, s, j, nt, h, g]
    return v.reshape(kc * 64, nt * 16).to(torch.int32).contiguous()


def mma_to_rows(packed: torch.Tensor) -> torch.Tensor:
    """The mma layout -> kernels/int4_linear.py's [K // 8, N] packing of the same q."""
    return pack_rows(unpack_mma(packed))


def _gate_up_order(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Output index of each interleaved position: 16 m + r holds gate output 8 m + r (r < 8) or up
    output 8 m + r - 8 (the pair's outputs n / 2 + 8 m + r - 8)."""
    if n % 16:
        raise ValueError(f"a gate/up pair interleaved by 8 needs 16 | N, got N={n}")
    pos = torch.arange(n, device=device)
    tile, r = pos // 16, pos % 16
    return torch.where(r < 8, 8 * tile + r, n // 2 + 8 * tile + r - 8)


def interleave_gate_up(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """A gate/up pair's tensor along its output dim (gate outputs, then up outputs; N % 16 == 0)
    -> the interleaved order the gated GEMV reads (a copy). For q [K, N], the scales [K // G, N]
    and the zeros unpacked to [K // G, N]."""
    return t.index_select(dim, _gate_up_order(t.shape[dim], t.device))


def deinterleave_gate_up(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`interleave_gate_up`'s inverse (a copy)."""
    order = _gate_up_order(t.shape[dim], t.device)
    return t.index_select(dim, torch.argsort(order))


def int4_mma_linear_ref(x: torch.Tensor, qweight_mma: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                        group_size: int, bias: torch.Tensor | None = None, gated: bool = False) -> torch.Tensor:
    """Pure torch: dequantize to fp32, multiply, round once to x's dtype; gated (an interleaved
    gate/up pair): then SiLU(gate) * up as kernels/activation.py's reference, [M, N / 2]."""
    w = dequantize_ref(mma_to_rows(qweight_mma), scales, qzeros, group_size)
    y = x.float() @ w
    if bias is not None:
        y = y + bias.float()
    y = y.to(x.dtype)
    return silu_and_mul_ref(deinterleave_gate_up(y)) if gated else y


# ------------------------------------------------------------------------- the kernels

@functools.lru_cache(maxsize=None)
def _module(kind: int, skind: int, mt: int, warps: int, unroll: int, order: int = 0, gated: int = 0) -> cuda_jit.Module:
    with open(_SOURCE) as f:
        source = f.read()
    # griddepcontrol is an sm_90 instruction: Ampere builds leave it out
    use_pdl = int(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9)
    return cuda_jit.Module(source, "int4_mma", {"KIND": kind, "SKIND": skind, "MT": mt, "WARPS": warps,
                                                "UNROLL": unroll, "ORDER": order, "PDL": use_pdl, "GATED": gated})


@functools.lru_cache(maxsize=None)
def _gemv(kind: int, skind: int, mt: int, cfg: MmaConfig, gated: bool = False) -> cuda_jit.Function:
    return _module(kind, skind, mt, cfg.warps, cfg.unroll, cfg.order, int(gated)).function("int4_mma_gemv", _SIG_GEMV)


@functools.lru_cache(maxsize=None)
def _dequant(kind: int, skind: int) -> cuda_jit.Function:
    return _module(kind, skind, 1, 4, 2).function("int4_mma_dequant", _SIG_DEQUANT)


def prepare(device: torch.device, scale_dtype: torch.dtype = torch.float16) -> None:
    """Compile and load, for `device`, the variants the default configs launch (bf16 and fp16
    activations, 1, 2, 4 and 8 tiles of x, plain and gated, the dequantization): a model does this
    at load, so that no kernel is first compiled inside a CUDA-graph capture."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    skind = _KIND[scale_dtype]
    for kind in _KIND.values():
        for mt, cfg in _DEFAULT_CONFIGS:  # everything pick_mma_config returns (about 0.3 s a variant)
            for gated in (False, True):
                _gemv(kind, skind, mt, cfg, gated).prepare(index)
        _dequant(kind, skind).prepare(index)


def _tiles(m: int) -> int:
    """8-row tiles of x the GEMV is compiled for: 1, 2, 4 or 8."""
    return 1 if m <= 8 else 2 if m <= 16 else 4 if m <= 32 else 8


def pick_mma_config(m: int, n: int, k: int) -> MmaConfig:
    """From H100 sweeps of llama3-8b's projections (benchmarks/results/int4_mma_sweep_h100.json
    and int4_mma_sweep_mid_h100.json, PDL on). Up to 8 rows: 4 warps a block when there are at
    least 1,024 column tiles (gate_up, 1,792), 8 from 320 (qkv, 384), else 16 (o and down, 256),
    so that every SM has work in one wave; 2 chunks loaded ahead (4 with 8 warps). 9-16 rows: 8
    warps, 2 ahead; 17-32: the same with the chunks dealt in turn (124.9 us a layer at 24 rows,
    bf16 165.9 at 32); 33-64: 4 warps, 4 ahead, in turn (263.1 us at 64 rows, bf16 169.7). Past
    MMA_MAX_M rows the weight is dequantized for cuBLAS (about 440 us a layer at 64 to 128 rows on
    the H100, results/quant_linear_int4mma_nopdl_h100.json)."""
    if m > MMA_MAX_M:
        return MmaConfig(0, 0, dequant=True)
    if m > 32:
        return MmaConfig(4, 4, 1)
    if m > 16:
        return MmaConfig(8, 2, 1)
    if m > 8:
        return MmaConfig(8, 2)
    tiles = n // 16
    if tiles >= 1024:
        return MmaConfig(4, 2)
    return MmaConfig(8, 4) if tiles >= 320 else MmaConfig(16, 2)


_DEFAULT_CONFIGS = ((1, MmaConfig(4, 2)), (1, MmaConfig(8, 4)), (1, MmaConfig(16, 2)), (2, MmaConfig(8, 2)),
                    (4, MmaConfig(8, 2, 1)), (8, MmaConfig(4, 4, 1)))


def candidate_mma_configs(m: int, n: int, k: int) -> list[MmaConfig]:
    """Configs worth timing for this shape, the default first."""
    found = [pick_mma_config(m, n, k)]
    if m <= _MAX_TILES * 8:
        found += [MmaConfig(w, u, o) for o in (0, 1) for w in (4, 8, 16) for u in (2, 4)
                  if w * _tiles(m) * 512 <= _SHARED_BYTES]
    if m > 8:
        found.append(MmaConfig(0, 0, dequant=True))
    return list(dict.fromkeys(found))


def _check(x, qweight_mma, scales, qzeros, group_size, bias) -> tuple[int, int, int]:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in _KIND:
        raise ValueError("x must be a bf16/fp16 [M, K] tensor")
    m, k = x.shape
    if qweight_mma.dtype != torch.int32 or qweight_mma.dim() != 4 or qweight_mma.shape[2:] != (32, 4):
        raise ValueError(f"qweight_mma must be int32 [N // 16, K // 64, 32, 4], got {qweight_mma.dtype} "
                         f"{tuple(qweight_mma.shape)}")
    n = qweight_mma.shape[0] * 16
    if qweight_mma.shape[1] * 64 != k:
        raise ValueError(f"qweight_mma holds K = {qweight_mma.shape[1] * 64} inputs but x has {k}")
    if not supports(n, k, group_size, x.dtype, scales.dtype):
        raise ValueError(f"the mma kernels need a group size that is a multiple of 64 dividing K and fp16/bf16 "
                         f"scales; got group {group_size}, K {k}, scales {scales.dtype}")
    if scales.shape != (k // group_size, n) or qzeros.shape != (k // group_size, n // 8) or qzeros.dtype != torch.int32:
        raise ValueError(f"scales must be [K // G, N] = [{k // group_size}, {n}] and qzeros int32 [K // G, N // 8]")
    if bias is not None and (bias.shape != (n,) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [N={n}] in x's dtype")
    for name, t in (("qweight_mma", qweight_mma), ("scales", scales), ("qzeros", qzeros)) + (
            (("bias", bias),) if bias is not None else ()):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    return m, n, k


def int4_mma_linear(x: torch.Tensor, qweight_mma: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                    group_size: int, bias: torch.Tensor | None = None, config: MmaConfig | None = None,
                    gated: bool = False) -> torch.Tensor:
    """``x [M, K] @ dequant(w) (+ bias)`` -> [M, N] in x's dtype: the tensor-core GEMV for
    M <= MMA_MAX_M (config's choice), else the weight dequantized to [N, K] and multiplied by cuBLAS.
    gated: w is an interleaved gate/up pair (`interleave_gate_up`, no bias) and the result is
    silu(gate) * up, [M, N / 2], as kernels/activation.py's silu_and_mul of the plain product."""
    m, n, k = _check(x, qweight_mma, scales, qzeros, group_size, bias)
    if x.device.type != "cuda":
        raise ValueError(f"the mma kernels need a CUDA device (got {x.device}); use int4_mma_linear_ref on CPU")
    if gated and bias is not None:
        raise ValueError("a gated (gate/up) int4 linear takes no bias")
    cfg = config or pick_mma_config(m, n, k)
    if cfg.dequant:
        w = int4_mma_dequantize(qweight_mma, scales, qzeros, group_size, x.dtype)
        y = torch.nn.functional.linear(x, w, bias)
        return silu_and_mul(deinterleave_gate_up(y)) if gated else y
    if m > _MAX_TILES * 8:
        raise ValueError(f"the int4 tensor-core GEMV takes at most {_MAX_TILES * 8} rows, got {m}; use a dequant config")
    if cfg.warps * _tiles(m) * 512 > _SHARED_BYTES:
        raise ValueError(f"{cfg.warps} warps of {_tiles(m)} tiles of x need more than 48 KB of shared memory")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    y = torch.empty((m, n // 2 if gated else n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    qweight_mma, scales, qzeros = qweight_mma.contiguous(), scales.contiguous(), qzeros.contiguous()
    fn = _gemv(_KIND[x.dtype], _KIND[scales.dtype], _tiles(m), cfg, gated)
    fn.launch((n // 16,), (32 * cfg.warps,), qweight_mma, scales, qzeros, x, bias, y,
              m, n, k, x.stride(0), y.stride(0), group_size, device=x.device, pdl=pdl.enabled(x))
    return y


def int4_mma_dequantize(qweight_mma: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int,
                        dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The weight transposed, [N, K] in dtype (an nn.Linear weight), on the GPU."""
    n, k = qweight_mma.shape[0] * 16, qweight_mma.shape[1] * 64
    if not supports(n, k, group_size, dtype, scales.dtype):
        raise ValueError(f"the mma kernels need a group size that is a multiple of 64 dividing K, fp16/bf16 scales "
                         f"and a bf16/fp16 dtype; got group {group_size}, K {k}, {scales.dtype}, {dtype}")
    qweight_mma, scales, qzeros = qweight_mma.contiguous(), scales.contiguous(), qzeros.contiguous()
    wt = torch.empty((n, k), dtype=dtype, device=qweight_mma.device)
    _dequant(_KIND[dtype], _KIND[scales.dtype]).launch(
        (n // 16, triton.cdiv(k // 64, 4)), (128,), qweight_mma, scales, qzeros, wt, n, k, group_size,
        device=qweight_mma.device, pdl=pdl.enabled(qweight_mma))
    return wt


def int4_mma_read_bound(qweight_mma: torch.Tensor, config: MmaConfig, sink: torch.Tensor) -> None:
    """For benchmarks: the GEMV's blocks and loads over the same weights, with no arithmetic (the
    time a kernel of this shape needs to stream these bytes)."""
    n, k = qweight_mma.shape[0] * 16, qweight_mma.shape[1] * 64
    fn = _module(1, 2, 1, config.warps, config.unroll, config.order).function("int4_mma_read_bound", "ppii")
    fn.launch((n // 16,), (32 * config.warps,), qweight_mma, sink, n, k, device=qweight_mma.device,
              pdl=pdl.enabled(qweight_mma))
