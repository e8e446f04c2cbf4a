"""Store new K/V rows into their pool slots.

    k_buffer[slots[t]] = k[t]      v_buffer[slots[t]] = v[t]      for t in 0 .. T-1

One program per token copies its [Hk * D] row of K and of V (the row is contiguous in both
the source and the pool, so the copy is a flat vectorized load/store), cast to the pool dtype.

The pool may be the model dtype or float8_e5m2 (the fp8 KV cache: a direct round-to-nearest
cast with no scales; e5m2 keeps fp16's exponent range, max 57344, ample for K/V activations,
at 2 mantissa bits). The attention kernels upcast fp8 rows after loading them; every e5m2
value is exact in fp16, bf16 and fp32, so that upcast is lossless and only the store rounds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from treadle.kernels import pdl

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_KV_DTYPE = torch.float8_e5m2  # the one fp8 KV cache format (scale-free)
KV_POOL_DTYPES = _FLOAT_DTYPES + (FP8_KV_DTYPE,)


@triton.jit
def _store_kv_kernel(
    # pointers
    KBuf, VBuf, Slots, K, V,
    # sizes
    row_size,  # Hk * D
    # strides (elements)
    stride_buf_s, stride_k_t, stride_v_t,
    # meta
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    t = tl.program_id(0)
    slot = tl.load(Slots + t).to(tl.int64)
    dst_k = KBuf + slot * stride_buf_s
    dst_v = VBuf + slot * stride_buf_s
    src_k = K + t.to(tl.int64) * stride_k_t
    src_v = V + t.to(tl.int64) * stride_v_t
    for start in range(0, row_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < row_size
        k = tl.load(src_k + offs, mask=mask)
        v = tl.load(src_v + offs, mask=mask)
        # a no-op for a pool in the source dtype; round-to-nearest-even into an fp8 pool
        tl.store(dst_k + offs, k.to(KBuf.dtype.element_ty), mask=mask)
        tl.store(dst_v + offs, v.to(VBuf.dtype.element_ty), mask=mask)


def interpreted(kernel: object) -> bool:
    """True when triton was imported with TRITON_INTERPRET=1 (kernels run on CPU tensors)."""
    return not isinstance(kernel, JITFunction)


def check_device(kernel: object, **tensors: torch.Tensor) -> None:
    """Raise ValueError unless every tensor is on one device the kernel can run on
    (CUDA normally; CPU when triton runs in interpreter mode). Shared by the attention wrappers."""
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        names = ", ".join(f"{n}={t.device}" for n, t in tensors.items())
        raise ValueError(f"all tensors must be on one device, got {names}")
    device = devices.pop()
    if interpreted(kernel):
        if device.type != "cpu":
            raise ValueError(
                f"triton runs in interpreter mode (TRITON_INTERPRET=1): tensors must be on CPU, got {device}"
            )
    elif device.type != "cuda":
        raise ValueError(
            f"tensors are on {device}: the Triton kernel needs CUDA tensors "
            "(set TRITON_INTERPRET=1 before importing triton to run on CPU, or call the *_ref function)"
        )


def check_index(name: str, t: torch.Tensor, length: int) -> None:
    """Raise ValueError unless `t` is a contiguous 1-D int32/int64 tensor of `length` entries."""
    if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be a 1-D int32/int64 tensor, got shape {tuple(t.shape)} {t.dtype}")
    if t.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries (one per request), got {t.shape[0]}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_attention_io(
    q: torch.Tensor, o: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    req_to_token: torch.Tensor, lead: str,
) -> tuple[int, int, int]:
    """Shared checks of the attention wrappers' query / output, KV pool and request-to-token
    table; returns q's shape (`lead` names its first dim in messages: B or T).

    q and o: 3-D [lead, Hq, D] of one shape, fp16/bf16/fp32 (each its own), contiguous last dim
    (strided views such as slices of a fused qkv projection are fine). The pool: K and V alike,
    3-D [num_slots, Hk, D] with a contiguous last dim, Hk dividing Hq, in q's dtype or
    float8_e5m2 (an fp8 KV cache, read with any float q: the kernels upcast its rows before the
    dot products). req_to_token: 2-D int32 with contiguous rows."""
    if q.dim() != 3 or o.dim() != 3:
        raise ValueError(f"q and o must be 3-D [{lead}, Hq, D], got {tuple(q.shape)} and {tuple(o.shape)}")
    if o.shape != q.shape:
        raise ValueError(f"o must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
    for name, t in (("q", q), ("o", o)):
        if t.shape[2] > 1 and t.stride(2) != 1:
            raise ValueError(f"{name} must have a contiguous last dim, got strides {t.stride()}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float16/bfloat16/float32, got {t.dtype}")
    _, num_heads, head_dim = q.shape
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [num_slots, Hk, D], got shape {tuple(t.shape)}")
        if t.shape[2] > 1 and t.stride(2) != 1:
            raise ValueError(f"{name} must have a contiguous last dim, got strides {t.stride()}")
    if v_buffer.shape != k_buffer.shape or v_buffer.dtype != k_buffer.dtype:
        raise ValueError(
            f"v_buffer must match k_buffer: {tuple(v_buffer.shape)} {v_buffer.dtype} "
            f"vs {tuple(k_buffer.shape)} {k_buffer.dtype}"
        )
    num_kv_heads = k_buffer.shape[1]
    if k_buffer.shape[2] != head_dim:
        raise ValueError(f"k_buffer head_dim {k_buffer.shape[2]} != q head_dim {head_dim}")
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"q heads ({num_heads}) must be a multiple of k_buffer heads ({num_kv_heads})")
    if k_buffer.dtype != q.dtype and k_buffer.dtype != FP8_KV_DTYPE:
        raise ValueError(
            f"k_buffer/v_buffer dtype {k_buffer.dtype} must equal q dtype {q.dtype} "
            f"or be {FP8_KV_DTYPE} (the fp8 KV cache)"
        )
    if req_to_token.dim() != 2 or req_to_token.dtype != torch.int32:
        raise ValueError(
            f"req_to_token must be a 2-D int32 tensor, got shape {tuple(req_to_token.shape)} {req_to_token.dtype}"
        )
    if req_to_token.shape[1] > 1 and req_to_token.stride(1) != 1:
        raise ValueError(f"req_to_token rows must be contiguous, got strides {req_to_token.stride()}")
    return tuple(q.shape)


def dot_operand_dtype(dtype: torch.dtype, on_gpu: bool) -> tl.dtype:
    """tl.dot operand dtype for attention on `dtype` inputs: the input dtype itself, except bf16
    under the interpreter (triton 3.9's interpreter multiplies bf16 blocks wrongly), which is
    upcast to fp32 there."""
    if dtype == torch.float32 or (dtype == torch.bfloat16 and not on_gpu):
        return tl.float32
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


def check_store(k_buffer: torch.Tensor, v_buffer: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """store_kv's argument checks (also those of kernels/rope.py's fused rotate-and-store)."""
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [*, Hk, D], got shape {tuple(t.shape)}")
        allowed = KV_POOL_DTYPES if name.endswith("buffer") else _FLOAT_DTYPES
        if t.dtype not in allowed:
            raise ValueError(f"{name} must be {'/'.join(str(d).removeprefix('torch.') for d in allowed)}, got {t.dtype}")
        if (t.shape[2] > 1 and t.stride(2) != 1) or (t.shape[1] > 1 and t.stride(1) != t.shape[2]):
            raise ValueError(f"{name} must have contiguous [Hk, D] rows, got strides {t.stride()}")
    if k_buffer.shape != v_buffer.shape or k_buffer.dtype != v_buffer.dtype or k_buffer.stride() != v_buffer.stride():
        raise ValueError(
            f"v_buffer must match k_buffer in shape/dtype/strides: {tuple(k_buffer.shape)} {k_buffer.dtype} "
            f"vs {tuple(v_buffer.shape)} {v_buffer.dtype}"
        )
    if slots.dim() != 1 or slots.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"slots must be 1-D int64/int32, got shape {tuple(slots.shape)} {slots.dtype}")
    if not slots.is_contiguous():
        raise ValueError("slots must be contiguous")
    num_tokens = slots.shape[0]
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != num_tokens or t.shape[1:] != k_buffer.shape[1:]:
            raise ValueError(
                f"{name} must have shape [T={num_tokens}, Hk={k_buffer.shape[1]}, D={k_buffer.shape[2]}], "
                f"got {tuple(t.shape)}"
            )


def store_kv(
    k_buffer: torch.Tensor,  # [num_slots, Hk, D]
    v_buffer: torch.Tensor,  # [num_slots, Hk, D]
    slots: torch.Tensor,  # [T] int64 (or int32)
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
) -> None:
    """Scatter k[t] / v[t] into k_buffer[slots[t]] / v_buffer[slots[t]] (cast to the pool dtype).

    k / v are fp16/bf16/fp32; the pool is one of those or float8_e5m2 (rounded to nearest even).
    Requires: pool rows contiguous (stride(1) == D, stride(2) == 1) and identical K/V pool
    layouts; k / v rows contiguous per token (any token stride); slots in [0, num_slots).
    Slots must be distinct (duplicate slots race, as in the reference's undefined order).
    """
    check_store(k_buffer, v_buffer, slots, k, v)
    num_tokens = slots.shape[0]
    check_device(_store_kv_kernel, k_buffer=k_buffer, v_buffer=v_buffer, slots=slots, k=k, v=v)
    if num_tokens == 0:
        return
    row_size = k_buffer.shape[1] * k_buffer.shape[2]
    block = min(triton.next_power_of_2(row_size), 4096)
    _store_kv_kernel[(num_tokens,)](
        k_buffer, v_buffer, slots, k, v,
        row_size,
        k_buffer.stride(0), k.stride(0), v.stride(0),
        BLOCK=block,
        num_warps=4 if block >= 1024 else 1, **pdl.options(k),
    )


def store_kv_ref(
    k_buffer: torch.Tensor,  # [num_slots, Hk, D]
    v_buffer: torch.Tensor,  # [num_slots, Hk, D]
    slots: torch.Tensor,  # [T] int64
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
) -> None:
    """Pure-torch reference: k_buffer[slots] = k; v_buffer[slots] = v (cast to the pool dtype)."""
    # index_copy_ rather than k_buffer[slots] = k: ~20x faster on CPU, same result for the
    # distinct slots a batch writes. CPU index_copy_ has no fp8 kernel: an fp8 pool copies its
    # (already cast) bytes through uint8 views instead.
    slots = slots.long()
    for buf, x in ((k_buffer, k), (v_buffer, v)):
        x = x.to(buf.dtype)
        if buf.dtype == FP8_KV_DTYPE:
            buf, x = buf.view(torch.uint8), x.view(torch.uint8)
        buf.index_copy_(0, slots, x)


if __name__ == "__main__":  # tiny timing on a GPU: python -m treadle.kernels.kv_store
    if torch.cuda.is_available():
        from triton.testing import do_bench

        kb = torch.zeros(1 << 18, 8, 128, device="cuda", dtype=torch.bfloat16)
        vb = torch.zeros_like(kb)
        for n in (1, 128, 8192):
            s = torch.randperm(kb.shape[0], device="cuda")[:n]
            kk = torch.randn(n, 8, 128, device="cuda", dtype=torch.bfloat16)
            vv = torch.randn_like(kk)
            t_k = do_bench(lambda: store_kv(kb, vb, s, kk, vv))
            t_r = do_bench(lambda: store_kv_ref(kb, vb, s, kk, vv))
            print(f"store_kv T={n}: triton {t_k * 1e3:.1f} us, ref {t_r * 1e3:.1f} us")
