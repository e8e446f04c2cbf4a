"""Qwen3-MoE: the Qwen3 decoder (q/k RMSNorm attention, from llama.py) with a routed
mixture of experts for its MLP (moe.py). Layers listed in mlp_only_layers, or off the
decoder_sparse_step grid, keep a dense MLP. Mixtral (mixtral.py) is this model with other
checkpoint names and always-renormalised routing."""
from __future__ import annotations

import re
from typing import Iterable

import torch
from torch import nn

from treadle.runtime.model_config import ModelConfig
from treadle.runtime.models.llama import (
    LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, RMSNorm,
)
from treadle.runtime.models.moe import SparseMoeBlock
from treadle.runtime.models.parallel import ParallelContext


class MoeDecoderLayer(LlamaDecoderLayer):
    """LlamaDecoderLayer (its forward unchanged) whose MLP is a SparseMoeBlock where the
    config says so."""

    def __init__(self, cfg: ModelConfig, layer_id: int, ctx: ParallelContext) -> None:
        nn.Module.__init__(self)  # not LlamaDecoderLayer's: it would build a dense MLP first
        self.self_attn = LlamaAttention(cfg, layer_id, ctx)
        if cfg.is_moe_layer(layer_id):
            self.mlp = SparseMoeBlock(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                      cfg.moe_intermediate_size, cfg.norm_topk_prob, ctx, ctx.expert_parallel)
        else:
            self.mlp = LlamaMLP(cfg, ctx)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# one expert's tensor in a checkpoint: layers.{L}.mlp.experts.{e}.{gate,up,down}_proj.weight, and
# in FP8 checkpoints its scales (weight_scale, or weight_scale_inv of block-wise fp8) and the
# static input_scale (read, not used: activations stay as they are)
_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\."
                     r"(weight|weight_scale|weight_scale_inv|input_scale)$")


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """Forward, logits and rope from LlamaForCausalLM; the layers and the weight names differ."""

    # checkpoint name fragment -> treadle's (subclasses rename theirs onto Qwen3-MoE's)
    _RENAME: tuple[tuple[str, str], ...] = ()
    decoder_layer = MoeDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into this rank's parameters: experts one by one
        (`...experts.{e}.gate_proj.weight`, as checkpoints store them) or fused
        (`...experts.gate_up_proj` [E, 2I, H], as an HF model's state_dict holds them).
        Every parameter must be filled exactly once; a missing or unknown name is an error."""
        params = dict(self.named_parameters(remove_duplicate=False))
        filled: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            for old, new in self._RENAME:
                name = name.replace(old, new)
            if (name.startswith("lm_head.") and self.config.tie_word_embeddings) or "rotary_emb" in name:
                continue
            m = _EXPERT.match(name)
            if m:
                experts = self.get_submodule(m.group(1))
                e, part = int(m.group(2)), m.group(3)
                if not 0 <= e < experts.num_experts:
                    raise ValueError(f"checkpoint tensor {name!r} names expert {e} of {experts.num_experts}")
                kind = m.group(4)
                if kind == "input_scale":
                    continue
                if kind == "weight":
                    if not experts.is_fp8:
                        tensor = tensor.to(experts.down_proj.dtype)
                    experts.load_expert(tensor, e, part)
                    filled.add(f"{m.group(1)}/{e}/{part}")
                else:
                    experts.load_expert(tensor, e, part, scale=True)
                    filled.add(f"{m.group(1)}/{e}/{part}/scale")
                continue
            name, shard = self._load_one(params, name, tensor)
            if name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj"):
                base = name.rsplit(".", 1)[0]
                parts = ("gate", "up") if name.endswith("gate_up_proj") else ("down",)
                n = self.get_submodule(base).num_experts
                filled |= {f"{base}/{e}/{part}" for e in range(n) for part in parts}
            else:
                filled.add(name if shard is None else f"{name}/{shard}")
        missing = sorted(self._expected() - filled)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")

    def _expected(self) -> set[str]:
        expected = set()
        for name, _ in self.named_parameters(remove_duplicate=False):
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            if ".qkv_proj." in name:
                expected |= {f"{name}/{s}" for s in "qkv"}
            elif ".gate_up_proj." in name:
                expected |= {f"{name}/0", f"{name}/1"}
            elif name.endswith((".experts.gate_up_proj", ".experts.down_proj", ".experts.gate_up_scale",
                                ".experts.down_scale")):
                base, leaf = name.rsplit(".", 1)
                parts = ("gate", "up") if leaf.startswith("gate_up") else ("down",)
                tail = "/scale" if leaf.endswith("_scale") else ""
                expected |= {f"{base}/{e}/{part}{tail}" for e in range(self.get_submodule(base).num_experts)
                             for part in parts}
            else:
                expected.add(name)
        return expected
