"""HF `architectures[0]` -> model class. Importing a model module happens on lookup."""
from __future__ import annotations

from torch import nn

from treadle.runtime.model_config import ModelConfig
from treadle.runtime.models.parallel import SINGLE, ParallelContext

# All four share one implementation; their differences (qkv bias, q/k norm, tied embeddings,
# head_dim) are ModelConfig fields.
_REGISTRY = {
    "LlamaForCausalLM": ("treadle.runtime.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("treadle.runtime.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("treadle.runtime.models.llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("treadle.runtime.models.llama", "LlamaForCausalLM"),
    # mixtures of experts: the Llama pieces with a routed-experts MLP (moe.py)
    "Qwen3MoeForCausalLM": ("treadle.runtime.models.qwen3_moe", "Qwen3MoeForCausalLM"),
    "MixtralForCausalLM": ("treadle.runtime.models.mixtral", "MixtralForCausalLM"),
}


def build_model(cfg: ModelConfig, ctx: ParallelContext = SINGLE) -> nn.Module:
    if cfg.architecture not in _REGISTRY:
        raise ValueError(
            f"unsupported architecture {cfg.architecture!r}; supported: {', '.join(sorted(_REGISTRY))}"
        )
    import importlib

    module, cls = _REGISTRY[cfg.architecture]
    return getattr(importlib.import_module(module), cls)(cfg, ctx)
