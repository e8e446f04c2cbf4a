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
"""
from __future__ import annotations

import torch
from torch import nn

from treadle.kernels import fused_moe as fm
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

    def load_expert(self, loaded: torch.Tensor, expert: int, part: str) -> bool:
        """Copy one expert's gate [I, H], up [I, H] or down [H, I] weight into this rank's
        slice; False when the expert lives on another rank."""
        local = expert - self.expert_start
        if not 0 <= local < self.num_local:
            return False
        cols, n = self._cols(), self.inter_local
        with torch.no_grad():
            if part == "down":
                self.down_proj.data[local].copy_(loaded[:, cols])
            else:
                rows = slice(0, n) if part == "gate" else slice(n, 2 * n)
                self.gate_up_proj.data[local, rows].copy_(loaded[cols])
        return True

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """x [T, H], the routing of each token over this rank's experts -> this rank's partial
        output [T, H] (the caller all-reduces)."""
        fn = fm.fused_moe if x.is_cuda else fm.fused_moe_ref
        return fn(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids)


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ex = self.experts
        if x.is_cuda and x.shape[0] <= fm.ROUTER_MAX_TOKENS and x.stride(1) == 1:
            weights, ids = fm.moe_router(x, self.gate.weight, self.top_k, self.renormalize, self.route_ticket,
                                         ex.expert_start, ex.num_local)
        else:
            logits = ops.linear(x, self.gate.weight, out_dtype=torch.float32)  # [T, E]
            route = fm.moe_route if x.is_cuda else fm.moe_route_ref
            weights, ids = route(logits, self.top_k, self.renormalize, ex.expert_start, ex.num_local)
        return all_reduce(ex(x, weights, ids), self.ctx)
