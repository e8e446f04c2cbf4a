"""Decode attention over the paged KV pool: one new query token per request.

Request b's query attends to the keys at positions 0 .. seq_lens[b] - 1, read through
req_to_token[req_pool_indices[b]]; its own K/V (the last position) is already stored.

Triton kernels: split-KV ("flash-decoding") in two stages.

    stage 1, grid (request b, kv head, split s): keys [lo_s, hi_s) of request b, for ALL
        G = Hq / Hk query heads of the kv head at once (a [G, D] x [D, BLOCK_N] dot), so K/V
        are read once per kv head. Writes the split's normalised partial output and its
        log-sum-exp (base 2) to a fp32 workspace.
    stage 2, grid (request b, q head): merges the splits of that request.

With max_kv_splits == 1 (big batches already fill the GPU) stage 1 writes the normalised
output straight into o and stage 2 is not launched.

Split ranges are computed on the device from seq_lens[b] (`_split_range`), so with a fixed
`max_kv_splits` the launch depends on no host value of seq_lens (CUDA-graph safe):

    chunk = ceil(ceil(seq_len / max_kv_splits) / BLOCK_N) * BLOCK_N      (>= BLOCK_N)
    split s covers [s * chunk, min((s + 1) * chunk, seq_len));   splits past seq_len are empty

Workspace: one fp32 buffer of `decode_workspace_numel(B, Hq, D, max_kv_splits)` elements,
holding partial outputs [B, Hq, S, D] followed by log-sum-exps [B, Hq, S].
A request with seq_len == 0 gets a zero output (the reference gives NaN there).

The pool holds q's dtype or float8_e5m2 (the fp8 KV cache, half the bytes to read): loaded
K/V tiles are converted to the dot operand dtype, which holds every e5m2 value exactly.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl, rope
from treadle.kernels.rope import norm_half

from .kv_store import (
    check_attention_io, check_device, check_index, dot_operand_dtype, interpreted,
)

_LOG2E = 1.4426950408889634
_MAX_SPLITS = 256


@triton.jit
def _split_range(seq_len, split, num_splits, ALIGN: tl.constexpr):
    """Key range [lo, hi) of `split` (hi <= lo when empty) and the number of non-empty splits."""
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), ALIGN) * ALIGN
    chunk = tl.maximum(chunk, ALIGN)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    return lo, hi, tl.cdiv(seq_len, chunk)


@triton.jit
def _attend_tile(q, k_base, v_base, slots, n_mask, offs_d, d_mask, m_i, l_i, acc, qk_scale,
                 stride_ks, stride_vs, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of keys (their pool slots; n_mask: which are keys) folded into the online softmax."""
    k = tl.load(k_base + slots[:, None] * stride_ks + offs_d[None, :], mask=d_mask[None, :], other=0.0)
    qk = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * qk_scale  # [BLOCK_H, BLOCK_N]
    qk = tl.where(n_mask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: the first tile has >= 1 key
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # a masked key's value reads as 0, not as the dummy slot's (p = 0 times NaN is NaN; its
    # score is -inf by the where above, NaN or not)
    v = tl.load(v_base + slots[:, None] * stride_vs + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :],
                other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _rotated_heads(x_row, heads, h_mask, stride_h, cos, sin, w_ptr, eps, HALF: tl.constexpr, NORM: tl.constexpr):
    # the halves [H, HALF] (fp32) of heads x_row[heads] rotated by cos/sin, each head RMS-normalised
    # by the weight at w_ptr first (NORM): kernels/rope.py's rotation and rounding
    d = tl.arange(0, HALF)
    ptr = x_row + heads[:, None] * stride_h + d[None, :]
    x1 = tl.load(ptr, mask=h_mask[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=h_mask[:, None], other=0.0).to(tl.float32)
    if NORM:
        rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        x1 = norm_half(x1, rstd, w_ptr, d, x_row.dtype.element_ty)
        x2 = norm_half(x2, rstd, w_ptr + HALF, d, x_row.dtype.element_ty)
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :]


@triton.jit
def _decode_stage1_kernel(
    # pointers
    Q, KBuf, VBuf, ReqToToken, ReqPoolIdx, SeqLens,
    PartOut,  # [B, Hq, S, D] fp32; with DIRECT, the output O [B, Hq, D] itself
    PartLse,  # [B, Hq, S] fp32 (unused with DIRECT)
    # sizes / scalars
    qk_scale,  # sm_scale * log2(e)
    group,  # Hq // Hk
    num_splits,
    # strides (elements)
    stride_qb, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_req,
    stride_pb, stride_ph, stride_ps,  # PartOut
    stride_lb, stride_lh,  # PartLse (last dim contiguous)
    # meta
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # a constexpr so the d mask folds away when HEAD_DIM == BLOCK_D
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    DIRECT: tl.constexpr,  # one split: write the final output (O's dtype) and skip stage 2
    PDL: tl.constexpr,
    # ROPE (a NewToken): Q, KNew and VNew are the q/k/v projection's raw heads; stage 1 rotates q
    # (each head RMS-normalised first, NORM) and the split holding the newest key rotates and
    # stores it and its value in the pool before reading its keys
    KNew, VNew, NewSlots, Positions, CosSin, QW, KW, eps,
    stride_knb, stride_knh, stride_vnb, stride_vnh, stride_cs,
    ROPE: tl.constexpr, NORM: tl.constexpr,
):
    b = tl.program_id(0)
    kv_h = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_h * group + offs_g  # the q heads of this kv head
    g_mask = offs_g < group
    d_mask = offs_d < HEAD_DIM
    out_ptrs = PartOut + b.to(tl.int64) * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :]
    # The index tables (seq_lens, the request rows, req_to_token) are written before the step
    # starts, never by a kernel of it: they and the first key tile's slots are read before the
    # wait (kernels/pdl.py), so that the first keys' loads follow it at once. The keys and
    # values are read after it: the kernel before this one stores the newest token's.
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    lo, hi, _ = _split_range(seq_len, split, num_splits, BLOCK_N)
    row = tl.load(ReqPoolIdx + b).to(tl.int64)
    tokens = ReqToToken + row * stride_req
    offs = lo + offs_n
    n_mask = offs < hi
    slots = tl.load(tokens + offs, mask=n_mask, other=0).to(tl.int64)  # masked -> dummy slot 0
    HALF: tl.constexpr = BLOCK_D // 2
    offs_half = tl.arange(0, HALF)
    if ROPE:  # the position, its cos/sin row and the new slot: written before the step
        cs_row = CosSin + tl.load(Positions + b).to(tl.int64) * stride_cs
        cos = tl.load(cs_row + offs_half)
        sin = tl.load(cs_row + HALF + offs_half)
        new_slot = tl.load(NewSlots + b).to(tl.int64)
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    if lo >= hi:
        if DIRECT:  # seq_len == 0: a zero output, as stage 2 would give
            tl.store(out_ptrs, tl.zeros([BLOCK_H, BLOCK_D], tl.float32).to(PartOut.dtype.element_ty),
                     mask=g_mask[:, None] & d_mask[None, :])
        return

    k_base = KBuf + kv_h * stride_kh
    v_base = VBuf + kv_h * stride_vh
    # [BLOCK_H, BLOCK_D]: rows past the group are zero (tl.dot needs >= 16 rows)
    if ROPE:
        q1, q2 = _rotated_heads(Q + b.to(tl.int64) * stride_qb, heads, g_mask, stride_qh, cos, sin, QW, eps,
                                HALF, NORM)
        # [BLOCK_H, HALF] halves side by side, rounded to q's dtype as the rotation kernel stores them
        q = tl.reshape(tl.permute(tl.join(q1, q2), (0, 2, 1)), (BLOCK_H, BLOCK_D))
        q = q.to(Q.dtype.element_ty).to(DOT_DTYPE)
        if hi == seq_len:  # this split holds the newest key: rotate and store it and its value first
            kv_h_row = tl.full([1], 0, tl.int32) + kv_h
            k1, k2 = _rotated_heads(KNew + b.to(tl.int64) * stride_knb, kv_h_row, kv_h_row >= 0, stride_knh, cos,
                                    sin, KW, eps, HALF, NORM)
            k_dst = k_base + new_slot * stride_ks + offs_half[None, :]
            tl.store(k_dst, k1.to(Q.dtype.element_ty).to(KBuf.dtype.element_ty))
            tl.store(k_dst + HALF, k2.to(Q.dtype.element_ty).to(KBuf.dtype.element_ty))
            v_new = tl.load(VNew + b.to(tl.int64) * stride_vnb + kv_h * stride_vnh + offs_d)
            tl.store(v_base + new_slot * stride_vs + offs_d, v_new.to(VBuf.dtype.element_ty))
            tl.debug_barrier()  # the stores are seen by this program's loads of its last tile
    else:
        q_ptrs = Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    m_i, l_i, acc = _attend_tile(q, k_base, v_base, slots, n_mask, offs_d, d_mask, m_i, l_i, acc, qk_scale,
                                 stride_ks, stride_vs, DOT_DTYPE, PRECISION)
    for n_start in range(lo + BLOCK_N, hi, BLOCK_N):
        offs = n_start + offs_n
        n_mask = offs < hi
        slots = tl.load(tokens + offs, mask=n_mask, other=0).to(tl.int64)
        m_i, l_i, acc = _attend_tile(q, k_base, v_base, slots, n_mask, offs_d, d_mask, m_i, l_i, acc, qk_scale,
                                     stride_ks, stride_vs, DOT_DTYPE, PRECISION)

    tl.store(out_ptrs, (acc / l_i[:, None]).to(PartOut.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])
    if not DIRECT:
        lse_ptrs = PartLse + b.to(tl.int64) * stride_lb + heads * stride_lh + split
        tl.store(lse_ptrs, m_i + tl.log2(l_i), mask=g_mask)


@triton.jit
def _decode_stage2_kernel(
    # pointers
    PartOut, PartLse, O, SeqLens,
    # sizes
    num_splits,
    # strides (elements)
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,  # PartLse (last dim contiguous)
    stride_ob, stride_oh,
    # meta
    ALIGN: tl.constexpr,  # stage 1's BLOCK_N
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # a constexpr so the d mask folds away when HEAD_DIM == BLOCK_D
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    _, _, used = _split_range(seq_len, 0, num_splits, ALIGN)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < used
    d_mask = offs_d < HEAD_DIM

    lse = tl.load(PartLse + b.to(tl.int64) * stride_lb + h * stride_lh + offs_s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(used > 0, m, 0.0)  # no split at all: keep exp2 away from -inf - -inf
    w = tl.exp2(lse - m)  # [BLOCK_S], 0 for unused splits
    part_ptrs = PartOut + b.to(tl.int64) * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :]
    part = tl.load(part_ptrs, mask=s_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(O + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=d_mask)


def decode_workspace_numel(batch_size: int, num_heads: int, head_dim: int, max_kv_splits: int) -> int:
    """fp32 elements of the decode workspace: partial outputs [B, Hq, S, D] + log-sum-exps [B, Hq, S]."""
    return batch_size * num_heads * max_kv_splits * (head_dim + 1)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_kv_splits(batch_size: int, num_kv_heads: int, max_seq_len: int, device: torch.device | str) -> int:
    """Splits per request. Once every SM has a (request, kv head) program of its own, one: a
    split then only adds stage 2's merge (H200 sweep, llama3-8b heads, 576 keys: the fastest
    config at batch 32, 128 and 256 has one split, for bf16 and fp8 pools alike;
    benchmarks/sweep_decode_attention.py). Fewer programs than SMs: enough splits that stage 1
    fills the GPU (about 8 programs per SM), at most one per 64 keys of the longest context (a
    split is a serial chain of dependent loads: at batch 1 short splits are what hides the
    latency). Call it once (e.g. at CUDA-graph capture, with the longest context) and pass the
    result as `max_kv_splits`; it does not look at seq_lens: each request uses only the splits
    its own length fills."""
    device = torch.device(device)
    sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 4
    programs = max(1, batch_size * num_kv_heads)
    if programs >= sms:
        return 1
    want = triton.cdiv(8 * sms, programs)
    by_len = triton.cdiv(max(1, max_seq_len), 64)
    return max(1, min(want, by_len, 64))


def _decode_blocks(on_gpu: bool, block_d: int, splits: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) for stage 1."""
    if not on_gpu:
        return 16, 1, 1
    # H200 sweeps (benchmarks/sweep_decode_attention.py, D 128, GQA 4). One split per request
    # (big batches): 64-key tiles, 3 stages, the sweep's best at bs 128 and 256 (bs 128 x 576
    # keys: 76 us for bf16 and 66 for an fp8 pool, whose 128-byte rows need the longer tile to
    # keep as many bytes in flight, against 83 and 87 with the previous 2 splits x 32-key tiles).
    # Split requests: default_kv_splits gives a split at most 64 keys where it has SMs to spare,
    # so one 64-key tile on 4 warps and no pipelining (nothing to overlap within a split): on an
    # H100, batch 1 x 576 keys with Qwen3-MoE's heads (GQA 8), 4.5 us against 6.1 for the
    # previous 32-key tiles on 2 warps and 2 stages (results/decode_attention_sweep_moe_bs1_h100.json)
    return (64, 2, 3) if splits == 1 else (64, 4, 1)


class NewToken(NamedTuple):
    """A decode step's newest token as the q/k/v projection left it, for `decode_attention` to
    rotate and store (kernels/rope.py's rotate-and-store, in stage 1): k and v [B, Hk, D], their
    pool rows `slots` [B], `positions` [B] int64, the `cos_sin` table [max_pos, D] fp32
    (rope.build_cos_sin_cache) and `qk_norm` (q_weight [D], k_weight [D], eps) or None."""
    k: torch.Tensor
    v: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    cos_sin: torch.Tensor
    qk_norm: tuple | None = None


NEW_TOKEN_MIN_HEAD_DIM = 16  # stage 1's head tile (BLOCK_D) is at least 16 wide: rotating needs it to be D


def _check_new(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, new: NewToken) -> None:
    rope.check_rope(q, new.k, new.positions, new.cos_sin, new.qk_norm)
    if q.shape[2] < NEW_TOKEN_MIN_HEAD_DIM:
        raise ValueError(f"rotating the new token in the attention kernel needs a head dim of at least "
                         f"{NEW_TOKEN_MIN_HEAD_DIM}, got {q.shape[2]}")
    rope.check_kv_store(new.k, (k_buffer, v_buffer, new.slots, new.v))


def decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [num_slots, Hk, D]
    v_buffer: torch.Tensor,  # [num_slots, Hk, D]
    o: torch.Tensor,  # [B, Hq, D], written
    req_to_token: torch.Tensor,  # [max_requests, max_context] int32
    req_pool_indices: torch.Tensor,  # [B]
    seq_lens: torch.Tensor,  # [B]
    sm_scale: float,
    *,
    max_kv_splits: int | None = None,
    max_seq_len: int | None = None,
    workspace: torch.Tensor | None = None,
    block_n: int | None = None,
    new: NewToken | None = None,
) -> None:
    """Triton split-KV decode attention; same arguments and results as `decode_attention_ref`.

    `new` (a NewToken): q holds the projection's heads before rotation and the newest key and
    value are not stored yet; stage 1 rotates q (and normalises its heads, qk_norm) and stores the
    rotated newest key and its value as kernels/rope.py's rotate-and-store would: one launch fewer
    a layer. q is left as it was.

    `max_kv_splits`: splits per request (each request uses those its length needs). When
    omitted it is `default_kv_splits(B, Hk, max_seq_len, device)`, and `max_seq_len`, when
    also omitted, is read from seq_lens (one host sync): pass `max_kv_splits` inside a CUDA
    graph. `workspace`: optional fp32 contiguous buffer of at least
    `decode_workspace_numel(B, Hq, D, max_kv_splits)` elements (reused across calls / graph
    replays); else one is allocated. q / o may be strided views with a contiguous last dim.
    k_buffer / v_buffer hold q's dtype or float8_e5m2 (upcast on load).
    `block_n` (power of two >= 16) overrides stage 1's key tile and split alignment.
    Values are trusted: seq_lens must fit req_to_token's row and slots must be pool rows.
    """
    batch, num_heads, head_dim = check_attention_io(q, o, k_buffer, v_buffer, req_to_token, "B")
    check_index("req_pool_indices", req_pool_indices, batch)
    check_index("seq_lens", seq_lens, batch)
    tensors = dict(q=q, k_buffer=k_buffer, v_buffer=v_buffer, o=o, req_to_token=req_to_token,
                   req_pool_indices=req_pool_indices, seq_lens=seq_lens)
    if workspace is not None:
        tensors["workspace"] = workspace
    if new is not None:
        _check_new(q, k_buffer, v_buffer, new)
        tensors.update(k_new=new.k, v_new=new.v, new_slots=new.slots, positions=new.positions, cos_sin=new.cos_sin)
    check_device(_decode_stage1_kernel, **tensors)
    num_kv_heads = k_buffer.shape[1]
    if max_kv_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max().item()) if batch else 0
        max_kv_splits = default_kv_splits(batch, num_kv_heads, max_seq_len, q.device)
    if not isinstance(max_kv_splits, int) or not 1 <= max_kv_splits <= _MAX_SPLITS:
        raise ValueError(f"max_kv_splits must be an int in [1, {_MAX_SPLITS}], got {max_kv_splits!r}")
    need = decode_workspace_numel(batch, num_heads, head_dim, max_kv_splits)
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.float32, device=q.device)
    elif workspace.dtype != torch.float32 or not workspace.is_contiguous() or workspace.numel() < need:
        raise ValueError(
            f"workspace must be a contiguous float32 tensor of >= {need} elements "
            f"(decode_workspace_numel), got {workspace.dtype} with {workspace.numel()} elements"
        )
    if batch == 0:
        return

    on_gpu = not interpreted(_decode_stage1_kernel)
    block_d = max(16, triton.next_power_of_2(head_dim))
    bn, num_warps, num_stages = _decode_blocks(on_gpu, block_d, max_kv_splits)
    bn = block_n or bn
    if bn < 16 or bn & (bn - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {bn}")
    group = num_heads // num_kv_heads
    flat = workspace.view(-1)
    n_out = batch * num_heads * max_kv_splits * head_dim
    part_out = flat[:n_out].view(batch, num_heads, max_kv_splits, head_dim)
    part_lse = flat[n_out:need].view(batch, num_heads, max_kv_splits)
    dot_dtype = dot_operand_dtype(q.dtype, on_gpu)

    # one split: stage 1 normalises and writes o itself (no partials, no stage 2)
    direct = max_kv_splits == 1
    dst = o if direct else part_out
    dst_strides = (o.stride(0), o.stride(1), 0) if direct else (part_out.stride(0), part_out.stride(1), part_out.stride(2))
    if new is not None:
        qw, kw, eps = new.qk_norm if new.qk_norm is not None else (q, q, 0.0)
        rope_args = dict(KNew=new.k, VNew=new.v, NewSlots=new.slots, Positions=new.positions, CosSin=new.cos_sin,
                         QW=qw, KW=kw, eps=float(eps), stride_knb=new.k.stride(0), stride_knh=new.k.stride(1),
                         stride_vnb=new.v.stride(0), stride_vnh=new.v.stride(1), stride_cs=new.cos_sin.stride(0))
    else:
        rope_args = dict(KNew=q, VNew=q, NewSlots=seq_lens, Positions=seq_lens, CosSin=q, QW=q, KW=q, eps=0.0,
                         stride_knb=0, stride_knh=0, stride_vnb=0, stride_vnh=0, stride_cs=0)
    _decode_stage1_kernel[(batch, num_kv_heads, max_kv_splits)](
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens,
        dst, part_lse,
        float(sm_scale) * _LOG2E, group, max_kv_splits,
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        req_to_token.stride(0),
        *dst_strides,
        part_lse.stride(0), part_lse.stride(1),
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=bn, HEAD_DIM=head_dim, BLOCK_D=block_d,
        DOT_DTYPE=dot_dtype, PRECISION="ieee" if dot_dtype == tl.float32 else "tf32", DIRECT=direct,
        **rope_args, ROPE=new is not None, NORM=new is not None and new.qk_norm is not None,
        num_warps=num_warps, num_stages=num_stages, **pdl.options(q),
    )
    if direct:
        return
    _decode_stage2_kernel[(batch, num_heads)](
        part_out, part_lse, o, seq_lens,
        max_kv_splits,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        o.stride(0), o.stride(1),
        ALIGN=bn, BLOCK_S=triton.next_power_of_2(max_kv_splits), HEAD_DIM=head_dim, BLOCK_D=block_d,
        num_warps=4 if on_gpu else 1, **pdl.options(q),
    )


def decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [num_slots, Hk, D]
    v_buffer: torch.Tensor,  # [num_slots, Hk, D]
    o: torch.Tensor,  # [B, Hq, D], written
    req_to_token: torch.Tensor,  # [max_requests, max_context] int32
    req_pool_indices: torch.Tensor,  # [B]
    seq_lens: torch.Tensor,  # [B]
    sm_scale: float,
    new: NewToken | None = None,
) -> None:
    """Pure-torch reference on any device: pads the batch to its longest sequence. Gathered
    K/V rows are upcast to fp32, so an fp8 pool needs nothing more. `new`: q and the newest
    key rotated (copies; q is left as it was) and stored first, by kernels/rope.py's reference."""
    if new is not None:
        _check_new(q, k_buffer, v_buffer, new)
        q = q.clone()
        rope.apply_rope_ref(q, new.k.clone(), new.positions, new.cos_sin, new.qk_norm,
                            kv_store=(k_buffer, v_buffer, new.slots, new.v))
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_heads // num_kv_heads
    max_len = int(seq_lens.max().item()) if bs else 0
    if bs == 0 or max_len == 0:
        return
    slots = req_to_token[req_pool_indices.long(), :max_len].long()  # [B, L]
    # Gather each (request, KV head)'s keys as one contiguous [L, D] block: rows of the
    # [slots * Hk, D] view, in [B, Hk, L] order. index_select is much faster than advanced
    # indexing on CPU (this is the CPU runtime's path), and contiguous K/V let the two
    # batched matmuls below read them straight (SDPA's fused kernel is slower for one query).
    rows = (slots[:, None, :] * num_kv_heads + torch.arange(num_kv_heads, device=q.device)[None, :, None]).reshape(-1)
    k = k_buffer.view(-1, head_dim).index_select(0, rows).view(bs, num_kv_heads, max_len, head_dim)
    v = v_buffer.view(-1, head_dim).index_select(0, rows).view(bs, num_kv_heads, max_len, head_dim)
    qg = q.view(bs, num_kv_heads, group, head_dim).float()  # [B, Hk, G, D]: a KV head's G query heads
    scores = torch.matmul(qg, k.float().transpose(-1, -2)).mul_(sm_scale)  # [B, Hk, G, L]
    pad = torch.arange(max_len, device=q.device)[None, :] >= seq_lens.to(q.device)[:, None]  # [B, L]
    scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    if bs > 1 and bool(pad.any()):  # a padded position's value must not be NaN or inf: 0 * NaN is NaN
        v = v.float().masked_fill_(pad[:, None, :, None], 0)
    out = torch.matmul(torch.softmax(scores, dim=-1), v.float())  # [B, Hk, G, D]
    o.copy_(out.reshape(bs, num_heads, head_dim).to(o.dtype))


if __name__ == "__main__":  # tiny GPU timing: python -m treadle.kernels.decode_attention
    if torch.cuda.is_available():
        from triton.testing import do_bench

        hq, hk, d, dev, dt = 32, 8, 128, "cuda", torch.bfloat16
        for bs, seq in ((1, 8192), (32, 2048), (128, 2048)):
            kb = torch.randn(bs * seq + 1, hk, d, device=dev, dtype=dt)
            vb = torch.randn_like(kb)
            r2t = (1 + torch.arange(bs * seq, device=dev, dtype=torch.int32)).view(bs, seq)
            q = torch.randn(bs, hq, d, device=dev, dtype=dt)
            o = torch.empty_like(q)
            lens = torch.full((bs,), seq, device=dev, dtype=torch.int32)
            idx = torch.arange(bs, device=dev)
            ms = do_bench(lambda: decode_attention(q, kb, vb, o, r2t, idx, lens, d**-0.5, max_seq_len=seq))
            gbs = 2 * bs * seq * hk * d * 2 / ms / 1e6
            print(f"decode bs={bs} seq={seq}: {ms * 1e3:.1f} us, {gbs:.0f} GB/s of KV")
