"""Tensor-parallel building blocks. Every linear layer knows how it is split across ranks, and
each parameter carries its own `weight_loader(param, loaded, shard_id)` that copies its rank's
slice out of a full checkpoint tensor, so the model loader stays a dozen lines.

With tp_size == 1 (the default, and CPU) these are plain layers with no communication.

A linear layer may hold a quantization method (`quant`, runtime/quantization/base.py): it
then owns the layer's weight parameters and its matmul. Quantized parameters are tagged with
the dimensions their outputs and inputs run along (and how many each element packs), which
is all the loaders below need to cut a rank's slice of them.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from treadle.kernels.fp8_quant import ActQuant, Fp8Act
from treadle.kernels.rmsnorm import NormedInput
from treadle.runtime.models import ops


class ParallelContext(NamedTuple):
    rank: int = 0
    size: int = 1
    group: object | None = None  # torch.distributed ProcessGroup when size > 1
    # small CUDA tensors go through peer memory when the ranks share a host (p2p_all_reduce.py)
    p2p: object | None = None
    # --enable-expert-parallel: MoE layers place whole experts on ranks (models/moe.py)
    expert_parallel: bool = False


SINGLE = ParallelContext()


def all_reduce(x: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """The sum of `x` over the ranks: `x` itself (reduced in place) or a new tensor."""
    if ctx.size > 1:
        if ctx.p2p is not None and ctx.p2p.fits(x):
            return ctx.p2p(x)
        dist.all_reduce(x, group=ctx.group)
    return x


def _set_loader(param: nn.Parameter, loader) -> None:
    param.weight_loader = loader  # type: ignore[attr-defined]


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"weight shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor slice {tuple(src.shape)} does not fit parameter slice {tuple(dst.shape)}")
    dst.copy_(src)


def _whole(loaded: torch.Tensor, dim: int, want: int) -> None:
    """The checkpoint tensor must be as long as the model's layer along `dim` (all ranks'
    slices together): a longer one was cut to the slice silently (a config.json of fewer
    heads or a narrower MLP than its weights ran a wrong model), a shorter one failed on copy."""
    if want and loaded.dim() > dim and loaded.shape[dim] != want:
        raise ValueError(f"checkpoint tensor of shape {tuple(loaded.shape)} has {loaded.shape[dim]} along dimension "
                         f"{dim} where the model's layer has {want}")


def _load_output_slice(param: nn.Parameter, loaded: torch.Tensor, shard: int, start: int, offset: int,
                       size: int, blocks: int = 1) -> None:
    """Column layers: the checkpoint's outputs [start, start + size) go to the parameter's
    outputs [offset, offset + size) (sizes in outputs; a packed dimension divides them);
    `blocks`: how many slices of `size` the checkpoint's tensor holds (0: not checked, a
    quantization's scales, whose rows a block format pads)."""
    if getattr(param, "per_shard", False):  # one value per merged part (a per-tensor scale)
        param.data[shard].copy_(loaded.reshape(()))
        return
    dim = getattr(param, "output_dim", 0)
    if dim is None:  # not split by outputs (GPTQ's g_idx): the parts share one tensor
        seen = getattr(param, "parts_seen", 0)
        if seen and not torch.equal(param.data, loaded.to(param.device)):
            raise ValueError(f"merged projections carry different {tuple(param.shape)} tensors (e.g. g_idx); "
                             "treadle runs them as one matmul and needs them equal")
        param.parts_seen = seen + 1  # type: ignore[attr-defined]
        _copy(param.data, loaded)
        return
    pack = getattr(param, "output_pack", 1)
    _whole(loaded, dim, blocks * size // pack)
    _copy(param.data.narrow(dim, offset // pack, size // pack), loaded.narrow(dim, start // pack, size // pack))


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's output rows split evenly across ranks. Several logical outputs
    (gate and up) can be merged into one matmul: `output_sizes` lists them, and shard_id
    picks which one a checkpoint tensor fills."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False,
                 ctx: ParallelContext = SINGLE) -> None:
        super().__init__()
        for s in output_sizes:
            if s % ctx.size:
                raise ValueError(f"output size {s} is not divisible by tp_size {ctx.size}")
        self.ctx = ctx
        self.local_sizes = [s // ctx.size for s in output_sizes]
        out = sum(self.local_sizes)
        self.in_local, self.out_local, self.shard_sizes = in_features, out, self.local_sizes
        self.quant = None  # a QuantMethod once quantized (runtime/quantization)
        # "silu": a gate/up pair whose caller takes silu(gate) * up (`silu_and_mul`); a quantized
        # layer may then keep its weight in a layout that fuses the two
        self.act_and_mul: str | None = None
        self.weight = nn.Parameter(torch.empty(out, in_features), requires_grad=False)
        _set_loader(self.weight, self._load)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out), requires_grad=False)
            _set_loader(self.bias, self._load)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        shard = 0 if shard_id is None else int(shard_id)
        size = self.local_sizes[shard]
        _load_output_slice(param, loaded, shard, self.ctx.rank * size, sum(self.local_sizes[:shard]), size,
                           self.ctx.size if self._own(param) else 0)

    def _own(self, param: nn.Parameter) -> bool:
        """Whether `param` is the layer's weight or bias (not a quantization's scale)."""
        # (a quantized layer has no `weight`)
        return param is getattr(self, "weight", None) or param is getattr(self, "bias", None)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, x: torch.Tensor | Fp8Act | NormedInput) -> torch.Tensor:
        if self.quant is not None:
            return self.quant.apply(self, x, self.bias)
        return ops.linear(x, self.weight, self.bias)

    def fuses_norm(self, x: torch.Tensor) -> bool:
        """Whether this layer takes the norm before it as a NormedInput (ops.fuses_norm): its
        kernel then normalises x as it loads it."""
        if not ops.fuses_norm(x):
            return False
        if self.quant is not None:
            return self.quant.fuses_norm(self, x)
        return self.weight.dtype == x.dtype and self.weight.is_contiguous()

    def input_quant(self, x: torch.Tensor | Fp8Act) -> ActQuant | None:
        """The form this layer would quantize an input like x into (None: it takes x as it is): a
        kernel producing its input may hand it over that way (an Fp8Act), or as a plain tensor."""
        return self.quant.input_quant(self, x) if self.quant is not None else None

    def silu_and_mul(self, x: torch.Tensor | Fp8Act, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
        """A gate/up pair (act_and_mul "silu"): silu(gate) * up of x's projection, [T, out_local / 2];
        with `quant` (the next layer's `input_quant`) possibly quantized per token for it."""
        if self.quant is not None:
            return self.quant.apply_silu_and_mul(self, x, self.bias, quant)
        if isinstance(x, NormedInput):  # one GEMV: norm, gate, up and the product
            return ops.linear(x, self.weight, self.bias, act="silu")
        return ops.silu_and_mul(self.forward(x), quant)


class QKVParallelLinear(ColumnParallelLinear):
    """Merged q/k/v projection. Query heads split across ranks; KV heads split too, or
    replicated when there are fewer KV heads than ranks (each rank keeps the one its query
    heads use)."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, ctx: ParallelContext = SINGLE) -> None:
        if num_heads % ctx.size:
            raise ValueError(f"num_attention_heads {num_heads} is not divisible by tp_size {ctx.size}")
        if num_kv_heads >= ctx.size and num_kv_heads % ctx.size:
            raise ValueError(f"num_key_value_heads {num_kv_heads} is not divisible by tp_size {ctx.size}")
        if num_kv_heads < ctx.size and ctx.size % num_kv_heads:
            raise ValueError(f"tp_size {ctx.size} is not a multiple of num_key_value_heads {num_kv_heads}")
        self.head_dim = head_dim
        self.local_heads = num_heads // ctx.size
        self.local_kv_heads = max(1, num_kv_heads // ctx.size)
        self.kv_replicas = max(1, ctx.size // num_kv_heads)
        # ColumnParallelLinear divides by ctx.size: pass global sizes that divide to the local ones
        super().__init__(hidden, [self.local_heads * head_dim * ctx.size,
                                  self.local_kv_heads * head_dim * ctx.size,
                                  self.local_kv_heads * head_dim * ctx.size], bias, ctx)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        idx = {"q": 0, "k": 1, "v": 2}[shard_id] if isinstance(shard_id, str) else int(shard_id)
        size = self.local_sizes[idx]
        # KV shards: rank r reads KV head block r // kv_replicas
        block = self.ctx.rank if idx == 0 else self.ctx.rank // self.kv_replicas
        blocks = self.ctx.size if idx == 0 else self.ctx.size // self.kv_replicas
        _load_output_slice(param, loaded, idx, block * size, sum(self.local_sizes[:idx]), size,
                           blocks if self._own(param) else 0)


class RowParallelLinear(nn.Module):
    """y = x W^T with W's input columns split across ranks; partial sums are all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 ctx: ParallelContext = SINGLE) -> None:
        super().__init__()
        if in_features % ctx.size:
            raise ValueError(f"input size {in_features} is not divisible by tp_size {ctx.size}")
        self.ctx = ctx
        self.local_in = in_features // ctx.size
        self.in_local, self.out_local, self.shard_sizes = self.local_in, out_features, [out_features]
        self.quant = None  # a QuantMethod once quantized (runtime/quantization)
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in), requires_grad=False)
        _set_loader(self.weight, self._load)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            _set_loader(self.bias, default_weight_loader)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        dim = getattr(param, "input_dim", 1)
        if dim is None:  # not split by inputs (a per-channel or per-tensor scale)
            _copy(param.data, loaded.reshape(param.shape))
            return
        n = self.local_in // getattr(param, "input_pack", 1)
        # (not a block format's scales, whose rows it pads)
        _whole(loaded, dim, n * self.ctx.size if param is getattr(self, "weight", None) else 0)
        _copy(param.data, loaded.narrow(dim, self.ctx.rank * n, n))

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, x: torch.Tensor | Fp8Act) -> torch.Tensor:
        y = self.quant.apply(self, x, None) if self.quant is not None else ops.linear(x, self.weight)
        y = all_reduce(y, self.ctx)
        return y + self.bias if self.bias is not None else y

    def input_quant(self, x: torch.Tensor | Fp8Act) -> ActQuant | None:
        """As ColumnParallelLinear.input_quant."""
        return self.quant.input_quant(self, x) if self.quant is not None else None


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split across ranks by vocabulary range; other ranks' ids contribute 0."""

    def __init__(self, vocab_size: int, hidden: int, ctx: ParallelContext = SINGLE) -> None:
        super().__init__()
        self.ctx = ctx
        self.vocab_size = vocab_size
        self.local_vocab = -(-vocab_size // ctx.size)  # ceil: the last rank's rows may be padding
        self.start = ctx.rank * self.local_vocab
        self.weight = nn.Parameter(torch.zeros(self.local_vocab, hidden), requires_grad=False)
        _set_loader(self.weight, self._load)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        rows = min(self.local_vocab, loaded.shape[0] - self.start)
        param.data[:rows].copy_(loaded[self.start : self.start + rows])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.ctx.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.local_vocab)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0)
        return all_reduce(out, self.ctx)


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection over the vocabulary split; ranks' logit slices are all-gathered."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # fp32 straight from a GEMV (no cast pass); otherwise the caller's .float() casts
        logits = ops.linear(hidden, self.weight, out_dtype=torch.float32 if self.ctx.size == 1 else None)
        if self.ctx.size > 1:
            parts = [torch.empty_like(logits) for _ in range(self.ctx.size)]
            dist.all_gather(parts, logits, group=self.ctx.group)
            logits = torch.cat(parts, dim=-1)
        return logits[:, : self.vocab_size]
