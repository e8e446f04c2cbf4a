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


@pytest.mark.parametrize("changed, field", [
    ({"rope_theta": -1}, "rope_theta"), ({"rms_norm_eps": -1e-5}, "rms_norm_eps"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                       "original_max_position_embeddings": "x"}}, "original_max_position_embeddings"),
], ids=["theta-negative", "eps-negative", "factor-zero", "llama3-orig-string"])
def test_a_rope_or_norm_number_no_model_runs_with_is_a_value_error_naming_it(changed, field):
    """A negative rope_theta or rms_norm_eps, or a linear rope factor of 0, was loaded, and every
    request then failed on NaN logits (an internal error); a llama3 field of a string was
    float()'s bare "could not convert string to float"."""
    with pytest.raises(ValueError, match=f"`{field}`"):
        ModelConfig.from_hf_dict({**_LLAMA, **changed})


def test_a_window_that_never_bites_is_still_served():
    for window in (None, 2048, 2048.0, 10**9, float("inf")):  # inf: was OverflowError
        ModelConfig.from_hf_dict({**_LLAMA, "max_position_embeddings": 2048, "sliding_window": window})
    with pytest.raises(ValueError, match="sliding-window attention"):
        ModelConfig.from_hf_dict({**_LLAMA, "max_position_embeddings": 2048, "sliding_window": 512})


@pytest.mark.parametrize("changed", [{"intermediate_size": 100}, {"num_key_value_heads": 2}, {"head_dim": 8}],
                         ids=["narrower-mlp", "fewer-kv-heads", "smaller-head-dim"])
def test_a_config_smaller_than_its_weights_is_a_value_error_not_a_cut_tensor(tmp_path, changed):
    """A column (row) layer's loader narrowed the checkpoint's tensor to the model's slice of it
    (for tensor parallelism) without checking its whole length: weights 128 wide under a config
    of intermediate_size 100, or k_proj of 4 KV heads under num_key_value_heads 2, were cut and
    the model served, silently wrong (3c0894c made a tensor too small a ValueError, not one too big)."""
    import json

    from test_engine_hostile_s48 import _tiny_llama_checkpoint

    from treadle.runtime import Engine

    _tiny_llama_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **changed}))
    with pytest.raises(ValueError, match=r"checkpoint tensor .* of shape \((64, 128|64, 64)\)"):
        Engine(model_path=str(tmp_path), skip_tokenizer_init=True, max_total_tokens=256)
