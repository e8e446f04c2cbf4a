"""Extend (prefill) attention over the paged KV pool.

New tokens of each request attend causally to the request's cached prefix and to themselves.
The K/V of the new tokens must already be stored in the pool (see `kv_store.py`), so every key
is read through the request-to-token table:

    request b, new token i  (position p = prefix_lens[b] + i)
      attends to keys at positions 0 .. p   ->  slots req_to_token[req_pool_indices[b], 0 .. p]

Layout: q / o are the ragged concatenation of every request's new tokens; request b's rows are
q[extend_start_loc[b] : extend_start_loc[b] + extend_lens[b]].

Triton kernel: flash attention (online softmax, fp32 accumulation) with the keys gathered
through req_to_token. Grid = (request, q head, query block of BLOCK_M new tokens):

    keys  0 ........ full_end | full_end ...... kv_end         (kv_end = prefix + last query of block + 1)
          unmasked blocks     | causal-masked blocks
    where full_end = (prefix + first query of block) rounded down to BLOCK_N, so every key of
    the first loop is visible to every query of the block; key blocks past the diagonal of
    the block's last query are never visited.

GQA: q head h reads kv head h // (Hq // Hk). head_dim is padded to a power of two BLOCK_D
(>= 16) and masked, so any head_dim works.

The pool holds q's dtype or float8_e5m2 (the fp8 KV cache): loaded K/V tiles are converted to
the dot operand dtype (q's dtype; fp32 for fp32 q and for bf16 under the interpreter), which
every e5m2 value fits exactly, so an fp8 pool is read as if it had been upcast, and a pool in
q's dtype takes the same (no-op) conversion as before.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .kv_store import (
    check_attention_io, check_device, check_index, dot_operand_dtype, interpreted,
)

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_block(
    acc, m_i, l_i,  # running state: [BLOCK_M, BLOCK_D], [BLOCK_M], [BLOCK_M] fp32
    q, q_pos,  # [BLOCK_M, BLOCK_D] queries and their positions [BLOCK_M]
    n_start, kv_end,  # keys n_start .. n_start + BLOCK_N - 1, those >= kv_end masked (CAUSAL only)
    tokens, k_base, v_base, stride_ks, stride_vs, qk_scale,
    offs_n, offs_d, d_mask,
    CAUSAL: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One online-softmax step over a block of keys gathered through the request's token row."""
    offs = n_start + offs_n
    if CAUSAL:
        n_mask = offs < kv_end
        slots = tl.load(tokens + offs, mask=n_mask, other=0).to(tl.int64)  # masked -> dummy slot 0
    else:
        slots = tl.load(tokens + offs).to(tl.int64)
    k = tl.load(k_base + slots[:, None] * stride_ks + offs_d[None, :], mask=d_mask[None, :], other=0.0)
    qk = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    if CAUSAL:
        visible = (offs[None, :] <= q_pos[:, None]) & n_mask[None, :]
        qk = tl.where(visible, qk, float("-inf"))
    # finite: every valid row sees >= 1 key in its first block (key full_end <= its position)
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if CAUSAL:  # a masked key's value reads as 0, not as the dummy slot's: p = 0 times NaN is NaN
        v_mask = n_mask[:, None] & d_mask[None, :]  # (its score is -inf by the where above, NaN or not)
    else:
        v_mask = d_mask[None, :]
    v = tl.load(v_base + slots[:, None] * stride_vs + offs_d[None, :], mask=v_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _extend_attention_kernel(
    # pointers
    Q, KBuf, VBuf, O,
    ReqToToken, ReqPoolIdx, PrefixLens, ExtendLens, ExtendStart,
    # sizes / scalars
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    group,  # Hq // Hk
    # strides (elements)
    stride_qt, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_req,
    # meta
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # a constexpr so the d mask folds away when HEAD_DIM == BLOCK_D
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # operand dtype of tl.dot (the input dtype; fp32 for bf16 under the interpreter)
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    m_start = tl.program_id(2) * BLOCK_M
    ext = tl.load(ExtendLens + b).to(tl.int32)
    if m_start >= ext:
        return
    prefix = tl.load(PrefixLens + b).to(tl.int32)
    start = tl.load(ExtendStart + b).to(tl.int64)
    row = tl.load(ReqPoolIdx + b).to(tl.int64)
    kv_h = h // group

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < ext
    d_mask = offs_d < HEAD_DIM

    # [BLOCK_M, BLOCK_D] queries of this block
    q_ptrs = Q + (start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)
    q_pos = prefix + offs_m  # absolute positions of the queries

    tokens = ReqToToken + row * stride_req
    k_base = KBuf + kv_h * stride_kh
    v_base = VBuf + kv_h * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # 1) keys every query of the block sees: no mask at all
    full_end = ((prefix + m_start) // BLOCK_N) * BLOCK_N
    for n_start in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q, q_pos, n_start, full_end, tokens, k_base, v_base, stride_ks, stride_vs, qk_scale,
            offs_n, offs_d, d_mask, CAUSAL=False, DOT_DTYPE=DOT_DTYPE, PRECISION=PRECISION,
        )
    # 2) the diagonal: causal mask; key blocks past the block's last query are skipped
    kv_end = prefix + tl.minimum(ext, m_start + BLOCK_M)
    for n_start in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q, q_pos, n_start, kv_end, tokens, k_base, v_base, stride_ks, stride_vs, qk_scale,
            offs_n, offs_d, d_mask, CAUSAL=True, DOT_DTYPE=DOT_DTYPE, PRECISION=PRECISION,
        )

    acc = acc / l_i[:, None]
    o_ptrs = O + (start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _default_blocks(on_gpu: bool, block_d: int, dtype: torch.dtype, max_extend: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the launch."""
    if not on_gpu:  # the interpreter: small tiles keep numpy fast
        return 16, 16, 1, 1
    wide = block_d > 128 or dtype == torch.float32
    block_m = 64 if wide else 128
    block_n = 32 if wide else 64
    # short extends (jump-forward, speculative, chunk tails) do not fill a 128-row block
    block_m = max(16, min(block_m, triton.next_power_of_2(max(max_extend, 1))))
    num_warps = 8 if block_d >= 128 and block_m >= 128 else 4
    return block_m, block_n, num_warps, 2


def extend_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_buffer: torch.Tensor,  # [num_slots, Hk, D]
    v_buffer: torch.Tensor,  # [num_slots, Hk, D]
    o: torch.Tensor,  # [T, Hq, D], written
    req_to_token: torch.Tensor,  # [max_requests, max_context] int32
    req_pool_indices: torch.Tensor,  # [B]
    prefix_lens: torch.Tensor,  # [B]
    extend_lens: torch.Tensor,  # [B]
    extend_start_loc: torch.Tensor,  # [B]
    sm_scale: float,
    *,
    max_extend_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> None:
    """Triton extend attention; same arguments and results as `extend_attention_ref`.

    q / o may be strided views (e.g. slices of a fused qkv projection) as long as the last
    dim is contiguous; q is fp16/bf16/fp32 and k_buffer, v_buffer share q's dtype or are
    float8_e5m2 (an fp8 KV cache, upcast on load); o may be any of fp16/bf16/fp32.
    `max_extend_len` (>= max(extend_lens)) sizes the grid; when omitted it is read from
    extend_lens (one host sync). Rows of requests with extend_lens == 0 are left untouched.
    Values are trusted: prefix + extend must fit in req_to_token's row and every slot must be
    a valid pool row. `block_m` / `block_n` override the tile shape (powers of two >= 16).
    """
    num_tokens, num_heads, head_dim = check_attention_io(q, o, k_buffer, v_buffer, req_to_token, "T")
    batch = req_pool_indices.shape[0] if req_pool_indices.dim() == 1 else -1
    for name, t in (
        ("req_pool_indices", req_pool_indices), ("prefix_lens", prefix_lens),
        ("extend_lens", extend_lens), ("extend_start_loc", extend_start_loc),
    ):
        check_index(name, t, batch)
    check_device(
        _extend_attention_kernel, q=q, k_buffer=k_buffer, v_buffer=v_buffer, o=o, req_to_token=req_to_token,
        req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, extend_lens=extend_lens,
        extend_start_loc=extend_start_loc,
    )
    if batch == 0 or num_tokens == 0:
        return
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max().item())
    if max_extend_len <= 0:
        return
    on_gpu = not interpreted(_extend_attention_kernel)
    block_d = max(16, triton.next_power_of_2(head_dim))
    bm, bn, num_warps, num_stages = _default_blocks(on_gpu, block_d, q.dtype, max_extend_len)
    bm, bn = block_m or bm, block_n or bn
    for name, val in (("block_m", bm), ("block_n", bn)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {val}")
    dot_dtype = dot_operand_dtype(q.dtype, on_gpu)
    grid = (batch, num_heads, triton.cdiv(max_extend_len, bm))
    _extend_attention_kernel[grid](
        q, k_buffer, v_buffer, o,
        req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_start_loc,
        float(sm_scale) * _LOG2E, num_heads // k_buffer.shape[1],
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        o.stride(0), o.stride(1),
        req_to_token.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=head_dim, BLOCK_D=block_d,
        DOT_DTYPE=dot_dtype, PRECISION="ieee" if dot_dtype == tl.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )


_BATCHED_EXT = 16  # requests extending by at most this many tokens share one padded SDPA call
# A CPU chunk with a cached prefix of at least this many new tokens runs as two unmasked SDPA
# calls merged by log-sum-exp (`_prefix_then_causal`); below it the fixed cost of the second
# call and the merge outweighs the masked work it saves (measured on the 2-core dev box).
_SPLIT_MIN_EXT = 256
_FLASH_LSE: list = []  # [op or None] once probed


def _flash_lse_op():
    """PyTorch's private fused CPU attention op that also returns the log-sum-exp, or None
    where this torch lacks it or it answers differently than expected (checked once against
    public SDPA on a small masked case; the caller then keeps the masked SDPA call)."""
    if not _FLASH_LSE:
        op = None
        try:
            cand = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
            g = torch.Generator().manual_seed(0)
            q = torch.randn(1, 4, 5, 8, generator=g)
            k, v = torch.randn(2, 1, 2, 12, 8, generator=g)
            mask = torch.arange(12)[None, :] <= torch.arange(7, 12)[:, None]
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
            got = _prefix_then_causal(q, k[0], v[0], 7, 0.3, cand)
            if got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5):
                op = cand
        except (AttributeError, RuntimeError, TypeError, ValueError):
            op = None
        _FLASH_LSE.append(op)
    return _FLASH_LSE[0]


def _prefix_then_causal(qi, k, v, prefix: int, sm_scale: float, op=None) -> torch.Tensor:
    """Attention of qi [1, Hq, ext, D] (fp32) for queries at positions prefix .. prefix+ext-1
    over k / v [Hk, prefix+ext, D] (fp32), without a mask tensor: (a) every query against the
    prefix keys, unmasked, with query heads grouped under their KV head; (b) the queries against
    their own chunk's keys, causal (SDPA's fused CPU kernel skips the blocks above the
    diagonal); the two softmax halves merged by their log-sum-exps. The masked call this
    replaces computes every score of the chunk x chunk square and reads a mask for each."""
    op = op or _flash_lse_op()
    num_heads, ext, head_dim = qi.shape[1], qi.shape[2], qi.shape[3]
    num_kv_heads = k.shape[0]
    group = num_heads // num_kv_heads
    qg = qi.reshape(1, num_kv_heads, group * ext, head_dim)  # head h -> kv head h // group
    out_p, lse_p = op(qg, k[None, :, :prefix], v[None, :, :prefix], scale=sm_scale)
    # chunk keys, viewed (not copied) once per query head of the group: [Hk, G, ext, D]
    kc = k[:, None, prefix:].expand(num_kv_heads, group, ext, head_dim)
    vc = v[:, None, prefix:].expand(num_kv_heads, group, ext, head_dim)
    out_c, lse_c = op(qi.view(num_kv_heads, group, ext, head_dim), kc, vc, is_causal=True, scale=sm_scale)
    # softmax over both key sets = the halves weighted by exp(lse_half) / (exp(lse_p) + exp(lse_c))
    w_p = torch.sigmoid(lse_p.view(num_kv_heads, group, ext) - lse_c)[..., None]
    return torch.lerp(out_c, out_p.view(num_kv_heads, group, ext, head_dim), w_p).view(1, num_heads, ext, head_dim)


def extend_attention_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k_buffer: torch.Tensor,  # [num_slots, Hk, D]
    v_buffer: torch.Tensor,  # [num_slots, Hk, D]
    o: torch.Tensor,  # [T, Hq, D], written
    req_to_token: torch.Tensor,  # [max_requests, max_context] int32
    req_pool_indices: torch.Tensor,  # [B]
    prefix_lens: torch.Tensor,  # [B]
    extend_lens: torch.Tensor,  # [B]
    extend_start_loc: torch.Tensor,  # [B]
    sm_scale: float,
) -> None:
    """Pure-torch reference on any device (the CPU runtime's path). On CPU, requests with
    short extends (decode rows, jump-forward drafts, small chunks) share one padded SDPA
    call; each longer one gets its own. Query heads are grouped by KV head (no K/V repeat).
    Gathered K/V rows are upcast to fp32 (as is q), so an fp8 pool needs nothing more."""
    num_heads, num_kv_heads = q.shape[1], k_buffer.shape[1]
    group = num_heads // num_kv_heads
    reqs = [r for r in zip(req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist(),
                           extend_start_loc.tolist()) if r[2] > 0]
    # (CPU only: it is the CPU runtime's speed-up; on CUDA this reference checks the kernels,
    # and one call per request there avoids SDPA's masked fused kernels)
    small = [r for r in reqs if r[2] <= _BATCHED_EXT] if q.device.type == "cpu" else []
    if len(small) > 1:
        _extend_padded(q, k_buffer, v_buffer, o, req_to_token, small, group, sm_scale)
        reqs = [r for r in reqs if r[2] > _BATCHED_EXT]
    for row, prefix, ext, start in reqs:
        seq = prefix + ext
        slots = req_to_token[row, :seq].long()
        k = k_buffer.index_select(0, slots).transpose(0, 1)  # [Hk, seq, D] (index_select: fast on CPU)
        v = v_buffer.index_select(0, slots).transpose(0, 1)
        if q.device.type == "cpu":
            # The CPU runtime's path. 4-D inputs, which SDPA runs in its fused (flash) CPU
            # kernel; 3-D ones fall to its math path, which materializes every score: 5x
            # slower at 1,800 tokens on the 2-core dev box. Without a cached prefix the
            # attention is plain causal (no mask tensor, and the masked half skipped).
            qi = q[start: start + ext].transpose(0, 1)[None].float()  # [1, Hq, ext, D]
            if prefix > 0 and ext >= _SPLIT_MIN_EXT and _flash_lse_op() is not None:
                out = _prefix_then_causal(qi, k.float(), v.float(), prefix, sm_scale)
                o[start: start + ext] = out[0].transpose(0, 1).to(o.dtype)
                continue
            mask = None if prefix == 0 else \
                torch.arange(seq, device=q.device)[None, :] <= torch.arange(prefix, seq, device=q.device)[:, None]
            out = F.scaled_dot_product_attention(qi, k[None].float(), v[None].float(), attn_mask=mask,
                                                 is_causal=prefix == 0, scale=sm_scale, enable_gqa=group > 1)
            o[start: start + ext] = out[0].transpose(0, 1).to(o.dtype)
            continue
        qi = q[start: start + ext].transpose(0, 1).reshape(num_kv_heads, group * ext, -1)  # [Hk, G*ext, D]
        # query i sits at position prefix + i and may see keys 0 .. prefix + i
        q_pos = torch.arange(prefix, seq, device=q.device)[:, None]
        mask = (torch.arange(seq, device=q.device)[None, :] <= q_pos).repeat(group, 1)  # [G*ext, seq]
        out = F.scaled_dot_product_attention(qi.float(), k.float(), v.float(), attn_mask=mask, scale=sm_scale)
        o[start: start + ext] = out.view(num_heads, ext, -1).transpose(0, 1).to(o.dtype)


def _extend_padded(q, k_buffer, v_buffer, o, req_to_token, reqs, group: int, sm_scale: float) -> None:
    """One SDPA over requests padded to the longest sequence and the longest extend."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = num_heads // group
    dev = q.device
    bs = len(reqs)
    rows = torch.tensor([r[0] for r in reqs], device=dev)
    prefix = torch.tensor([r[1] for r in reqs], device=dev)
    ext = torch.tensor([r[2] for r in reqs], device=dev)
    max_len = max(r[1] + r[2] for r in reqs)
    max_ext = max(r[2] for r in reqs)
    slots = req_to_token[rows, :max_len].long().reshape(-1)  # past a request's length: stale, masked
    k = k_buffer.index_select(0, slots).view(bs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    v = v_buffer.index_select(0, slots).view(bs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    beyond = torch.arange(max_len, device=dev)[None, :] >= (prefix + ext)[:, None]  # [B, L]
    if bool(beyond.any()):  # stale slots read as 0: a masked NaN or inf would still reach the output
        k = k.float().masked_fill_(beyond[:, None, :, None], 0)
        v = v.float().masked_fill_(beyond[:, None, :, None], 0)
    # token index per (request, extend position); padding rows read token 0 and are dropped
    i = torch.arange(max_ext, device=dev)
    tok = torch.tensor([r[3] for r in reqs], device=dev)[:, None] + i[None, :]
    valid = i[None, :] < ext[:, None]  # [B, E]
    qb = q[torch.where(valid, tok, 0)]  # [B, E, Hq, D]
    qb = qb.permute(0, 2, 1, 3).reshape(bs, num_kv_heads, group * max_ext, head_dim)
    q_pos = prefix[:, None] + i[None, :]  # [B, E]
    mask = torch.arange(max_len, device=dev)[None, None, :] <= q_pos[:, :, None]  # [B, E, L]
    mask = mask | ~valid[:, :, None]  # padding rows see everything (finite softmax; dropped)
    mask = mask.repeat(1, group, 1)[:, None]  # [B, 1, G*E, L]
    out = F.scaled_dot_product_attention(qb.float(), k.float(), v.float(), attn_mask=mask, scale=sm_scale)
    out = out.view(bs, num_heads, max_ext, head_dim).transpose(1, 2)  # [B, E, Hq, D]
    o[tok[valid]] = out[valid].to(o.dtype)


if __name__ == "__main__":  # tiny GPU timing: python -m treadle.kernels.extend_attention
    if torch.cuda.is_available():
        from triton.testing import do_bench

        bs, ext, hq, hk, d = 8, 512, 32, 8, 128
        dev, dt = "cuda", torch.bfloat16
        kb = torch.randn(bs * ext + 1, hk, d, device=dev, dtype=dt)
        vb = torch.randn_like(kb)
        r2t = (1 + torch.arange(bs * ext, device=dev, dtype=torch.int32)).view(bs, ext)
        q = torch.randn(bs * ext, hq, d, device=dev, dtype=dt)
        o = torch.empty_like(q)
        idx = torch.arange(bs, device=dev)
        pre = torch.zeros(bs, device=dev, dtype=torch.int32)
        lens = torch.full((bs,), ext, device=dev, dtype=torch.int32)
        starts = torch.arange(bs, device=dev, dtype=torch.int32) * ext
        args = (q, kb, vb, o, r2t, idx, pre, lens, starts, d**-0.5)
        ms = do_bench(lambda: extend_attention(*args, max_extend_len=ext))
        flops = 4 * bs * hq * d * ext * (ext + 1) / 2
        print(f"extend bs={bs} x {ext}: {ms * 1e3:.1f} us, {flops / ms / 1e9:.1f} TFLOP/s")
