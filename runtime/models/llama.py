"""The Llama family on the paged KV pool: Llama 2/3, Mistral, SmolLM2, Qwen2 (qkv bias) and
Qwen3 (per-head q/k RMSNorm). One file read top to bottom; parameter names are the HF ones so
checkpoints load without renaming beyond the merged qkv / gate_up projections."""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from treadle.kernels.fp8_quant import ActQuant, Fp8Act
from treadle.kernels.rmsnorm import NormedInput
from treadle.runtime.forward_batch import ForwardBatch
from treadle.runtime.model_config import ModelConfig
from treadle.runtime.models import ops
from treadle.runtime.models.parallel import (
    SINGLE, ColumnParallelLinear, ParallelContext, ParallelLMHead, QKVParallelLinear,
    RowParallelLinear, VocabParallelEmbedding, default_weight_loader,
)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rmsnorm(x, self.weight, self.eps)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, ctx: ParallelContext) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_heads,
                                          cfg.num_kv_heads, bias=cfg.attention_bias, ctx=ctx)
        self.num_heads = self.qkv_proj.local_heads
        self.num_kv_heads = self.qkv_proj.local_kv_heads
        # Qwen2 biases q/k/v only; Llama-style attention_bias also biases o_proj
        o_bias = cfg.attention_bias and cfg.architecture != "Qwen2ForCausalLM"
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=o_bias, ctx=ctx)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.head_dim ** -0.5

    def input_quant(self, x: torch.Tensor) -> ActQuant | None:
        """How the q/k/v projection would quantize x (runtime/models/parallel.py), for the norm before it."""
        return self.qkv_proj.input_quant(x)

    def fuses_norm(self, x: torch.Tensor) -> bool:
        """Whether the q/k/v projection takes the norm before it as a NormedInput."""
        return self.qkv_proj.fuses_norm(x)

    def forward(self, positions: torch.Tensor, x: torch.Tensor | Fp8Act | NormedInput, cos_sin: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hk) D]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.reshape(t, self.num_kv_heads, self.head_dim)  # [T, Hk, D]
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        qk_norm = None
        if self.q_norm is not None:  # Qwen3: each head RMS-normalised, in the rotation's pass
            qk_norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        # the backend rotates q and k (ops.apply_rope) as it stores k and v: one kernel on the GPU
        o = fb.attn_backend.forward(q, k, v, self.layer_id, fb, self.scale,
                                    rope=(positions, cos_sin, qk_norm))  # [T, Hq, D]
        return self.o_proj(o.reshape(t, q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2, ctx=ctx)
        self.gate_up_proj.act_and_mul = "silu"
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, ctx=ctx)

    def input_quant(self, x: torch.Tensor) -> ActQuant | None:
        return self.gate_up_proj.input_quant(x)

    def fuses_norm(self, x: torch.Tensor) -> bool:
        return self.gate_up_proj.fuses_norm(x)

    def forward(self, x: torch.Tensor | Fp8Act | NormedInput) -> torch.Tensor:
        # an FP8 down projection gets silu(gate) * up quantized by the SiLU kernel itself
        return self.down_proj(self.gate_up_proj.silu_and_mul(x, self.down_proj.input_quant(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, ctx: ParallelContext) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_id, ctx)
        self.mlp = LlamaMLP(cfg, ctx)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                cos_sin: torch.Tensor, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = _pre_norm(x, residual, self.input_layernorm, self.self_attn)
        x = self.self_attn(positions, x, cos_sin, fb)
        x, residual = _pre_norm(x, residual, self.post_attention_layernorm, self.mlp)
        return self.mlp(x), residual


def _pre_norm(x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm, consumer: nn.Module
              ) -> tuple[torch.Tensor | Fp8Act | NormedInput, torch.Tensor]:
    """(the consumer's input, the residual stream from here on) of a pre-norm: residual += x (the
    first layer's residual is x itself), then the norm. The residual add is fused into the
    norm's kernel, which quantizes per token where the consumer's projection is FP8
    (ops.rmsnorm). At batch-1 decode on the GPU the consumer's own kernel normalises (a
    NormedInput, where `consumer.fuses_norm` says so): no norm launch, and the residual stream
    continues in a new tensor that kernel writes."""
    if ops.fuses_norm(x) and consumer.fuses_norm(x):
        out = None if residual is None else torch.empty_like(residual)
        return NormedInput(x, norm.weight, norm.eps, residual, out), x if out is None else out
    if residual is None:
        return ops.rmsnorm(x, norm.weight, norm.eps, consumer.input_quant(x)), x
    return ops.fused_add_rmsnorm(x, residual, norm.weight, norm.eps, consumer.input_quant(x)), residual


class LlamaForCausalLM(nn.Module):
    """Also serves Mistral, Qwen2 and Qwen3: their differences are config flags."""

    decoder_layer: type[nn.Module] = LlamaDecoderLayer  # a model whose layers differ (MoE) names its own

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext = SINGLE) -> None:
        super().__init__()
        self.config = cfg
        self.ctx = ctx
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, ctx)
        self.layers = nn.ModuleList(self.decoder_layer(cfg, i, ctx) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, ctx)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def init_rope(self, max_positions: int) -> None:
        """Build the cos/sin table on the model's device (after the model is moved there)."""
        cfg = self.config
        self.cos_sin = ops.build_cos_sin_cache(cfg.head_dim, max_positions, cfg.rope_theta,
                                               dict(cfg.rope_scaling) if cfg.rope_scaling else None, self.norm.weight.device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """input_ids, positions: [T]. Returns the final hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, self.cos_sin, fb)
        ops.fused_add_rmsnorm(x, residual, self.norm.weight, self.norm.eps)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        return self.lm_head.compute_logits(hidden).float()

    # ---- weights ----------------------------------------------------------------------------
    # checkpoint name fragment -> (merged parameter fragment, shard id)
    _MERGED = {".q_proj.": (".qkv_proj.", "q"), ".k_proj.": (".qkv_proj.", "k"),
               ".v_proj.": (".qkv_proj.", "v"), ".gate_proj.": (".gate_up_proj.", 0),
               ".up_proj.": (".gate_up_proj.", 1)}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into this rank's parameters. Every parameter must
        be filled exactly once (tied lm_head excepted); a missing or unknown name is an error."""
        params = dict(self.named_parameters(remove_duplicate=False))
        filled: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if name.startswith("lm_head.") and self.config.tie_word_embeddings:
                continue
            if "rotary_emb" in name:
                continue
            name, shard = self._load_one(params, name, tensor)
            filled.add(name if shard is None else f"{name}/{shard}")
        expected = set()
        for name, p in params.items():
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            if ".qkv_proj." in name:
                expected |= {f"{name}/{s}" for s in "qkv"}
            elif ".gate_up_proj." in name:
                expected |= {f"{name}/0", f"{name}/1"}
            else:
                expected.add(name)
        missing = sorted(expected - filled)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")

    def _load_one(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> tuple[str, Any]:
        """Copy one checkpoint tensor (its name without the "model." prefix) into its parameter,
        q/k/v and gate/up into their merged ones; returns (parameter name, shard id or None)."""
        shard = None
        for frag, (merged, sid) in self._MERGED.items():
            if frag in name:
                name, shard = name.replace(frag, merged), sid
                break
        if name not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in {type(self).__name__}")
        p = params[name]
        try:
            with torch.no_grad():
                getattr(p, "weight_loader", default_weight_loader)(p, tensor.to(p.dtype), shard)
        except (RuntimeError, ValueError) as e:  # a tensor of another shape: the checkpoint's, named
            raise ValueError(f"checkpoint tensor for {name!r}{'' if shard is None else f' ({shard})'} of shape "
                             f"{tuple(tensor.shape)} does not fit the model's parameter {tuple(p.shape)} ({e}); "
                             "check that config.json describes these weights") from e
        return name, shard
