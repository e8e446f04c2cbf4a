"""Weight loading (GGUF vs HF's own GGUF loader, cache, safetensors dirs) and tokenizers."""

from __future__ import annotations

import os
import time
import types

import numpy as np
import pytest
import torch

from treadle.runtime.gguf_loader import expected_names, load_gguf_state_dict, read_gguf_config
from treadle.runtime.model_config import DUMMY_CONFIGS, ModelConfig
from treadle.runtime.model_source import embedded_model_path, resolve_model_source
from treadle.runtime.tokenizer import apply_chat_template, clear_tokenizer_cache, get_chat_template, load_tokenizer
from treadle.runtime.weights import gguf_cache_path, init_dummy_weights, load_state_dict, load_weights


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A private TREADLE_CACHE_DIR for the whole module (conversion runs once here)."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("treadle-cache")
    mp.setenv("TREADLE_CACHE_DIR", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def hf_gguf_state(hf_smollm2) -> dict[str, torch.Tensor]:
    """HF transformers' own dequantization of the embedded GGUF (the reference; its float32 model
    is loaded once for this module and test_engine_parity, conftest.py)."""
    return dict(hf_smollm2.state_dict())


def test_gguf_state_dict_equals_hf_gguf_loader(hf_gguf_state) -> None:
    path = embedded_model_path()
    config = read_gguf_config(path)
    t0 = time.perf_counter()
    ours = load_gguf_state_dict(path, config)
    print(f"\nload_gguf_state_dict: {time.perf_counter() - t0:.2f}s for {len(ours)} tensors")
    # HF lists the tied lm_head (same storage as the embedding); we do not.
    assert set(ours) == set(hf_gguf_state) - {"lm_head.weight"} == expected_names(config)
    for name, ref in hf_gguf_state.items():
        if name == "lm_head.weight":
            continue
        assert ours[name].dtype == torch.float32 and ours[name].shape == ref.shape, name
        # q/k only match if the llama.cpp row permutation was undone correctly.
        torch.testing.assert_close(ours[name], ref, atol=1e-6, rtol=0, msg=name)


def test_gguf_cache_second_load_is_served_from_cache(cache_dir, hf_gguf_state) -> None:
    source = resolve_model_source(None)
    first, rep1 = load_state_dict(source, torch.float32)
    assert not rep1.from_cache and rep1.convert_s > 0 and rep1.num_tensors == len(first)
    assert os.path.isfile(gguf_cache_path(source)) and str(cache_dir) in rep1.cache_path
    second, rep2 = load_state_dict(source, torch.float32)
    print(f"\nGGUF first load: convert {rep1.convert_s:.2f}s + load {rep1.load_s:.2f}s; "
          f"cached load: {rep2.load_s:.2f}s")
    assert rep2.from_cache and rep2.convert_s == 0.0
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    torch.testing.assert_close(second["model.layers.3.self_attn.k_proj.weight"],
                               hf_gguf_state["model.layers.3.self_attn.k_proj.weight"], atol=1e-6, rtol=0)
    half, _ = load_state_dict(source, torch.bfloat16)
    assert half["model.norm.weight"].dtype == torch.bfloat16


def test_tokenizer_from_gguf_then_from_disk_cache(cache_dir) -> None:
    source = resolve_model_source(None)
    clear_tokenizer_cache()
    t0 = time.perf_counter()
    from_gguf = load_tokenizer(source)
    t1 = time.perf_counter()
    assert load_tokenizer(source) is from_gguf  # in-process memo
    assert os.path.isfile(os.path.join(os.path.dirname(gguf_cache_path(source)), "tokenizer", "tokenizer.json"))
    clear_tokenizer_cache()
    t2 = time.perf_counter()
    from_disk = load_tokenizer(source)
    t3 = time.perf_counter()
    print(f"\ntokenizer: from GGUF {t1 - t0:.2f}s, from disk cache {t3 - t2:.2f}s")
    assert from_disk is not from_gguf
    text = "Hello, world! 12345 héllo\n\t<|im_start|>user  naïve"
    assert from_disk.encode(text) == from_gguf.encode(text)
    assert (from_disk.bos_token_id, from_disk.eos_token_id, len(from_disk)) == (
        from_gguf.bos_token_id, from_gguf.eos_token_id, len(from_gguf))
    assert get_chat_template(from_disk) == get_chat_template(from_gguf) is not None
    messages = [{"role": "user", "content": "hi"}]
    prompt = apply_chat_template(from_disk, messages)
    assert prompt == apply_chat_template(from_gguf, messages)
    assert prompt.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in prompt
    assert not apply_chat_template(from_disk, messages, add_generation_prompt=False).endswith("assistant\n")


def test_chat_template_errors() -> None:
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(types.SimpleNamespace(chat_template=None), [{"role": "user", "content": "x"}])
    fake = types.SimpleNamespace(chat_template={"default": "T", "tool_use": "U"})
    assert get_chat_template(fake) == "T"
    with pytest.raises(ValueError, match="message 0 must be a dict with 'role' and 'content'"):
        apply_chat_template(fake, [{"role": "user"}])


def _tiny_hf_model(name: str, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**DUMMY_CONFIGS[name].to_hf_dict()))


@pytest.mark.parametrize("name,shard", [("tiny-llama", None), ("tiny-qwen3", "2MB"), ("tiny-qwen2", None)])
def test_hf_safetensors_dir_round_trip(tmp_path, name: str, shard: str | None) -> None:
    model = _tiny_hf_model(name)
    kw = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(tmp_path, safe_serialization=True, **kw)
    if shard is not None:
        assert (tmp_path / "model.safetensors.index.json").is_file()
    source = resolve_model_source(str(tmp_path))
    assert source.kind == "hf" and source.config == DUMMY_CONFIGS[name] and source.tokenizer_path is None
    got, report = load_state_dict(source, torch.float32)
    want = model.state_dict()
    if DUMMY_CONFIGS[name].tie_word_embeddings:
        want = {k: v for k, v in want.items() if k != "lm_head.weight"}
    assert set(got) == set(want) == expected_names(source.config)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert report.kind == "hf" and report.num_tensors == len(want) and not report.from_cache


def test_bin_only_dir_and_empty_dir_are_rejected(tmp_path) -> None:
    _tiny_hf_model("tiny-llama").save_pretrained(tmp_path, safe_serialization=True)
    state = dict(load_weights(resolve_model_source(str(tmp_path)), torch.float32))
    os.remove(tmp_path / "model.safetensors")
    source = resolve_model_source(str(tmp_path))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_weights(source, torch.float32)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="only PyTorch .bin.*safetensors"):
        load_weights(source, torch.float32)


def test_dummy_source_has_no_weights_and_init_is_deterministic() -> None:
    assert list(load_weights(resolve_model_source("dummy:tiny-llama"), torch.float32)) == []
    a, b, c = (_tiny_hf_model("tiny-qwen3", seed=s) for s in (1, 2, 3))
    init_dummy_weights(a, seed=7)
    init_dummy_weights(b, seed=7)
    init_dummy_weights(c, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
        if "norm" in k:
            assert torch.all(sa[k] == 1.0), k
    w = sa["model.layers.0.mlp.up_proj.weight"]
    assert not torch.equal(w, sc["model.layers.0.mlp.up_proj.weight"])
    assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002


def _write_tiny_gguf(path: str, arch: str, cfg: ModelConfig, tensors: dict[str, np.ndarray],
                     raw: dict[str, tuple[np.ndarray, object]] | None = None) -> None:
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    for name, (arr, qtype) in (raw or {}).items():
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


_GGUF_PARTS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def _to_gguf_name(hf: str) -> str:
    glob = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}
    if hf in glob:
        return glob[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_PARTS[module]}.{kind}"


@pytest.mark.parametrize("name,arch", [("tiny-qwen3", "qwen3"), ("tiny-llama", "llama")])
def test_synthetic_gguf_round_trip(tmp_path, name: str, arch: str) -> None:
    """Tensors written like llama.cpp's converter come back exact (llama: Q/K permuted on disk)."""
    cfg = DUMMY_CONFIGS[name]
    model = _tiny_hf_model(name)
    want = {k: v for k, v in model.state_dict().items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    tensors = {}
    for k, v in want.items():
        arr = v.numpy()
        if arch == "llama" and (k.endswith("q_proj.weight") or k.endswith("k_proj.weight")):
            n = cfg.num_heads if "q_proj" in k else cfg.num_kv_heads
            # llama.cpp's converter: rows of each head [half0 | half1] -> interleaved pairs.
            arr = arr.reshape(n, 2, arr.shape[0] // n // 2, arr.shape[1]).swapaxes(1, 2).reshape(arr.shape)
        tensors[_to_gguf_name(k)] = np.ascontiguousarray(arr)
    path = str(tmp_path / "tiny.gguf")
    _write_tiny_gguf(path, arch, cfg, tensors)
    got_cfg = read_gguf_config(path)
    assert got_cfg.qk_norm == cfg.qk_norm and got_cfg.tie_word_embeddings == cfg.tie_word_embeddings
    assert (got_cfg.head_dim, got_cfg.num_kv_heads, got_cfg.vocab_size) == (cfg.head_dim, cfg.num_kv_heads, 49152)
    got = load_gguf_state_dict(path, got_cfg)
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("qtype_name", ["Q8_1", "I32"])
def test_unsupported_quantization_names_tensor_and_type(tmp_path, qtype_name: str) -> None:
    import gguf

    cfg = DUMMY_CONFIGS["tiny-llama"]
    qtype = gguf.GGMLQuantizationType[qtype_name]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    # Raw bytes [rows, cols // block * type_size]: 64 values per row stored as qtype.
    raw = np.zeros((cfg.vocab_size, cfg.hidden_size // block * type_size), dtype=np.uint8)
    path = str(tmp_path / "q.gguf")
    _write_tiny_gguf(path, "llama", cfg, {}, raw={"token_embd.weight": (raw, qtype)})
    with pytest.raises(ValueError, match=f"'token_embd.weight'.*{qtype_name}"):
        load_gguf_state_dict(path, read_gguf_config(path))


def test_llama3_rope_recovered_from_rope_freqs_tensor(tmp_path) -> None:
    import dataclasses

    cfg = dataclasses.replace(DUMMY_CONFIGS["tiny-llama"], rope_theta=500000.0, num_layers=1)
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
    factors = []
    for f in inv_freq:  # llama.cpp's converter, written out branch by branch
        wavelen = 2 * np.pi / f
        if wavelen < 8192 / 4.0:
            factors.append(1.0)
        elif wavelen > 8192 / 1.0:
            factors.append(8.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / 8.0 + smooth))
    assert 1.0 in factors and 8.0 in factors and any(1 < f < 8 for f in factors)  # all three branches
    good = str(tmp_path / "good.gguf")
    _write_tiny_gguf(good, "llama", cfg, {"rope_freqs.weight": np.array(factors, dtype=np.float32)})
    assert read_gguf_config(good).rope_scaling_dict == DUMMY_CONFIGS["llama3-8b"].rope_scaling_dict
    bad = str(tmp_path / "bad.gguf")
    _write_tiny_gguf(bad, "llama", cfg, {"rope_freqs.weight": np.array(factors, dtype=np.float32)[::-1].copy()})
    with pytest.raises(ValueError, match="rope_freqs tensor that is not standard Llama-3 scaling"):
        read_gguf_config(bad)


def test_model_is_built_in_the_serving_dtype(monkeypatch) -> None:
    # a bf16 model's parameters are made in bf16, not in fp32 and cast after: Qwen3-30B-A3B built
    # in fp32 first needs 122 GB, more than an 80 GB GPU holds for its 61 GB of bf16 weights
    from treadle.runtime import model_runner
    from treadle.runtime.engine_args import EngineArgs

    seen = []
    real = model_runner.build_model

    def spy(cfg, ctx):
        model = real(cfg, ctx)
        seen.extend(p.dtype for p in model.parameters())
        return model

    monkeypatch.setattr(model_runner, "build_model", spy)
    runner = model_runner.ModelRunner(EngineArgs(model_path="dummy:tiny-qwen3-moe", device="cpu", dtype="bfloat16",
                                                 max_total_tokens=64))
    assert seen and set(seen) == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32  # restored
    assert next(runner.model.parameters()).dtype == torch.bfloat16
