"""The mixture-of-experts layer: a router and experts run by one fused kernel
(kernels/fused_moe.py; its torch reference on CPU).

Parallelism over the tensor-parallel group of size N:
- tensor parallel (default): every rank holds every expert, each expert's intermediate
  columns split N ways (w13 rows and w2 columns, as a dense MLP's); partial outputs are
  all-reduced.
- expert parallel (`--enable-expert-parallel`): rank r holds experts [r E/N, (r+1) E/N)
  whole. The layer's input is already on every rank (attention is tensor-parallel and ends in
  an all-reduce), so dispatching tokens to experts costs no communication: each rank runs the
  pairs routed to its experts and the combine is one all-reduce of the partial outputs (an
  all-gather of tokens would move nothing new, and a reduce-scatter plus all-gather is that
  same all-reduce). Greedy outputs equal tensor parallelism's up to summation order.

FP8 experts (weight-only; `to_fp8` before loading an FP8 checkpoint, `quantize_fp8` after
loading float weights for --quantization fp8): the same parameters in float8_e4m3fn, with
`gate_up_scale` [E_local, 2 I_local, KB] and `down_scale` [E_local, H, KB'] fp32, a scale per
output row and per block of inputs (KB 1 per channel or per tensor); a checkpoint's block
scales are repeated down their rows as they load, as the dense layers' are
(runtime/quantization/fp8.py).
"""
from __future__ import annotations

import torch
from torch import nn

from treadle.kernels import fused_moe as fm
from treadle.kernels.rmsnorm import NormedInput
from treadle.runtime.models import ops
from treadle.runtime.models.parallel import SINGLE, ParallelContext, all_reduce


class FusedExperts(nn.Module):
    """This rank's experts: `gate_up_proj` [E_local, 2 I_local, H] (gate rows, then up rows)
    and `down_proj` [E_local, H, I_local]: HF's own fused names and layout, so an HF model's
    state_dict loads as it is; per-expert checkpoint tensors load through `load_expert`."""

    def __init__(self, num_experts: int, hidden: int, inter: int, ctx: ParallelContext = SINGLE,
                 expert_parallel: bool = False) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.ep = expert_parallel and ctx.size > 1
        self.ctx = ctx
        if self.ep:
            if num_experts % ctx.size:
                raise ValueError(f"expert parallelism needs tp_size {ctx.size} to divide num_experts {num_experts}")
            self.num_local, self.inter_local = num_experts // ctx.size, inter
            self.expert_start = ctx.rank * self.num_local
        else:
            if inter % ctx.size:
                raise ValueError(f"tp_size {ctx.size} must divide the experts' intermediate size {inter} "
                                 "(or use --enable-expert-parallel)")
            self.num_local, self.inter_local, self.expert_start = num_experts, inter // ctx.size, 0
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_local, 2 * self.inter_local, hidden),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(self.num_local, hidden, self.inter_local), requires_grad=False)
        self.gate_up_proj.weight_loader = self._load_fused  # type: ignore[attr-defined]
        self.down_proj.weight_loader = self._load_fused  # type: ignore[attr-defined]
        self.fp8_block: tuple[int, int] | None = None  # (rows, inputs) of a checkpoint's scale blocks
        self.gate_up_scale: nn.Parameter | None = None
        self.down_scale: nn.Parameter | None = None

    @property
    def is_fp8(self) -> bool:
        return self.gate_up_scale is not None

    def to_fp8(self, block: tuple[int, int] | None) -> None:
        """Before loading an FP8 checkpoint: FP8 expert weights and their scales, zero-filled
        for `load_expert`; `block` (rows, inputs) of its scales, None per channel or tensor."""
        e, two_i, h = self.gate_up_proj.shape
        inter = self.inter_local
        dev = self.gate_up_proj.device
        if block is not None and self.ctx.size > 1 and not self.ep and inter % block[1]:
            raise ValueError(f"FP8 blocks of {block[1]} inputs do not divide each rank's {inter} expert intermediate "
                             f"columns (tp_size {self.ctx.size}); try --enable-expert-parallel")
        kb13 = -(-h // block[1]) if block else 1
        kb2 = -(-inter // block[1]) if block else 1
        self.fp8_block = block
        self.gate_up_proj = nn.Parameter(torch.zeros(e, two_i, h, dtype=torch.float8_e4m3fn, device=dev),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.zeros(e, h, inter, dtype=torch.float8_e4m3fn, device=dev),
                                      requires_grad=False)
        self.gate_up_scale = nn.Parameter(torch.zeros(e, two_i, kb13, device=dev), requires_grad=False)
        self.down_scale = nn.Parameter(torch.zeros(e, h, kb2, device=dev), requires_grad=False)

    def quantize_fp8(self) -> None:
        """After loading float weights (--quantization fp8): FP8 with a scale per output row."""
        from treadle.kernels.fp8_linear import quantize_weight_ref

        for name in ("gate_up_proj", "down_proj"):
            w = getattr(self, name).data
            q, scale = quantize_weight_ref(w.reshape(-1, w.shape[2]))
            setattr(self, name, nn.Parameter(q.reshape(w.shape), requires_grad=False))
            setattr(self, name.replace("_proj", "_scale"),
                    nn.Parameter(scale.reshape(w.shape[0], w.shape[1], 1), requires_grad=False))
            del w

    def dequantized(self) -> dict[str, torch.Tensor]:
        """{"gate_up_proj", "down_proj": fp32 [E_local, ...]}: the float experts FP8 ones stand for."""
        from treadle.kernels.gemv import dequantize_blocks

        return {"gate_up_proj": dequantize_blocks(self.gate_up_proj, self.gate_up_scale),
                "down_proj": dequantize_blocks(self.down_proj, self.down_scale)}

    def _cols(self) -> slice:
        """This rank's slice of an expert's intermediate columns."""
        if self.ep:
            return slice(0, self.inter_local)
        r = self.ctx.rank
        return slice(r * self.inter_local, (r + 1) * self.inter_local)

    def _load_fused(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        """All experts at once, in HF's fused layout: gate_up [E, 2I, H] or down [E, H, I]."""
        if loaded.dim() != 3 or loaded.shape[0] != self.num_experts:
            raise ValueError(f"fused expert tensor {tuple(loaded.shape)} is not [{self.num_experts}, ...]")
        mine = loaded[self.expert_start : self.expert_start + self.num_local]
        for e in range(self.num_local):
            if param is self.gate_up_proj:
                inter = loaded.shape[1] // 2
                self.load_expert(mine[e, :inter], self.expert_start + e, "gate")
                self.load_expert(mine[e, inter:], self.expert_start + e, "up")
            else:
                self.load_expert(mine[e], self.expert_start + e, "down")

    def load_expert(self, loaded: torch.Tensor, expert: int, part: str, scale: bool = False) -> bool:
        """Copy one expert's gate [I, H], up [I, H] or down [H, I] weight (or with `scale`, its
        FP8 scales: one value, [N, 1] or blocks [cdiv(N, bn), cdiv(K, bk)]) into this rank's
        slice; False when the expert lives on another rank."""
        local = expert - self.expert_start
        if not 0 <= local < self.num_local:
            return False
        cols, n = self._cols(), self.inter_local
        if scale:
            return self._load_scale(loaded, local, part, cols)
        if self.is_fp8 and loaded.dtype != torch.float8_e4m3fn:
            raise ValueError(f"an FP8 checkpoint's expert {expert} {part} weight is {loaded.dtype}")
        with torch.no_grad():
            if part == "down":
                self.down_proj.data[local].copy_(loaded[:, cols])
            else:
                rows = slice(0, n) if part == "gate" else slice(n, 2 * n)
                self.gate_up_proj.data[local, rows].copy_(loaded[cols])
        return True

    def _load_scale(self, loaded: torch.Tensor, local: int, part: str, cols: slice) -> bool:
        if not self.is_fp8:
            raise ValueError(f"expert {part} scales in a checkpoint this model does not read as FP8")
        w = self.down_proj if part == "down" else self.gate_up_proj
        rows_total = w.shape[1] if part == "down" else (cols.stop - cols.start) * self.ctx.size if not self.ep \
            else self.inter_local
        loaded = loaded.float()
        if loaded.numel() == 1:  # per tensor
            per_row = loaded.reshape(1, 1).expand(rows_total, 1)
        elif self.fp8_block is not None:
            per_row = loaded.reshape(loaded.shape[0], -1).repeat_interleave(self.fp8_block[0], dim=0)[:rows_total]
        else:  # per channel [N, 1]
            per_row = loaded.reshape(-1, 1)
        with torch.no_grad():
            if part == "down":  # this rank's input blocks of the intermediate columns
                kb = self.down_scale.shape[2]
                start = 0 if (self.ep or self.fp8_block is None) else cols.start // self.fp8_block[1]
                self.down_scale.data[local].copy_(per_row[:, start:start + kb])
            else:
                n = self.inter_local
                rows = slice(0, n) if part == "gate" else slice(n, 2 * n)
                self.gate_up_scale.data[local, rows].copy_(per_row[cols])
        return True

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """x [T, H], the routing of each token over this rank's experts -> this rank's partial
        output [T, H] (the caller all-reduces)."""
        fn = fm.fused_moe if x.is_cuda else fm.fused_moe_ref
        return fn(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids,
                  w13_scale=self.gate_up_scale, w2_scale=self.down_scale)


class SparseMoeBlock(nn.Module):
    """Router (`gate`, replicated on every rank) + experts; the MLP of an MoE decoder layer.
    renormalize: the top-k weights are divided by their sum (Qwen3-MoE's norm_topk_prob;
    Mixtral always: its softmax over the top-k logits is the same thing)."""

    def __init__(self, num_experts: int, top_k: int, hidden: int, inter: int, renormalize: bool,
                 ctx: ParallelContext = SINGLE, expert_parallel: bool = False) -> None:
        super().__init__()
        self.top_k, self.renormalize, self.ctx = top_k, renormalize, ctx
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.gate.weight.requires_grad_(False)
        self.experts = FusedExperts(num_experts, hidden, inter, ctx, expert_parallel)
        # fm.moe_router's ticket (it leaves it zero): the router of a few tokens in one launch
        self.register_buffer("route_ticket", torch.zeros(1, dtype=torch.int32), persistent=False)

    def input_quant(self, x: torch.Tensor) -> None:
        """As LlamaMLP.input_quant: the router and the experts take x as it is."""
        return None

    def fuses_norm(self, x: torch.Tensor) -> bool:
        """Whether the router takes the norm before the block as a NormedInput (ops.fuses_norm):
        it normalises as it loads x and writes the normed rows for the experts. Only where asked
        for (TREADLE_FUSED_NORM=1): on one H100 it was not faster than the norm's launch."""
        return ops.fusion("TREADLE_FUSED_NORM") == "1" and ops.fuses_norm(x) and self.gate.weight.dtype == x.dtype

    def forward(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        ex = self.experts
        if isinstance(x, NormedInput):
            normed = torch.empty_like(x.x)
            weights, ids = fm.moe_router(x, self.gate.weight, self.top_k, self.renormalize, self.route_ticket,
                                         ex.expert_start, ex.num_local, normed_out=normed)
            return all_reduce(ex(normed, weights, ids), self.ctx)
        if x.is_cuda and x.shape[0] <= fm.ROUTER_MAX_TOKENS and x.stride(1) == 1:
            weights, ids = fm.moe_router(x, self.gate.weight, self.top_k, self.renormalize, self.route_ticket,
                                         ex.expert_start, ex.num_local)
        else:
            logits = ops.linear(x, self.gate.weight, out_dtype=torch.float32)  # [T, E]
            route = fm.moe_route if x.is_cuda else fm.moe_route_ref
            weights, ids = route(logits, self.top_k, self.renormalize, ex.expert_start, ex.num_local)
        return all_reduce(ex(x, weights, ids), self.ctx)
