"""Session 48's review of the runtime's new code: what a reviewer broke, each case failing on
the code before its fix."""
from __future__ import annotations

import pytest

from treadle.runtime.model_config import ModelConfig

_LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
          "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 256}


@pytest.mark.parametrize("arch, field, value", [
    ("LlamaForCausalLM", "sliding_window", []),  # was int()'s TypeError
    ("Qwen2ForCausalLM", "sliding_window", "4k"),  # was int()'s ValueError of its own words
    ("MixtralForCausalLM", "num_experts_per_tok", [2]),  # was TypeError
    ("MixtralForCausalLM", "num_local_experts", [8]),
    ("Qwen3MoeForCausalLM", "num_experts_per_tok", float("inf")),
    ("Qwen3MoeForCausalLM", "mlp_only_layers", 3),  # was tuple(3): TypeError
], ids=["window-list", "window-string", "mixtral-topk-list", "mixtral-experts-list", "qwen3moe-topk-inf",
        "qwen3moe-mlp-only-int"])
def test_a_broken_window_or_moe_field_of_config_json_is_a_value_error_naming_it(arch, field, value):
    """The s48 loading fixes made a broken config.json a ValueError naming the field, but the
    sliding window and the mixture-of-experts fields still went through a bare int() / tuple()."""
    config = {**_LLAMA, "architectures": [arch], "num_experts": 4, "moe_intermediate_size": 32, field: value}
    with pytest.raises(ValueError, match=f"`{field}`"):
        ModelConfig.from_hf_dict(config)


def test_a_window_that_never_bites_is_still_served():
    for window in (None, 2048, 2048.0, 10**9, float("inf")):  # inf: was OverflowError
        ModelConfig.from_hf_dict({**_LLAMA, "max_position_embeddings": 2048, "sliding_window": window})
    with pytest.raises(ValueError, match="sliding-window attention"):
        ModelConfig.from_hf_dict({**_LLAMA, "max_position_embeddings": 2048, "sliding_window": 512})
