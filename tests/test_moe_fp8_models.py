"""FP8 mixtures of experts on the CPU: tiny Qwen3-MoE quantized at load (--quantization fp8:
experts and attention per channel) and a tiny checkpoint in the block-wise FP8 layout Qwen3's
FP8 MoE releases use (experts.{e}.{gate,up,down}_proj.weight + weight_scale_inv per 128 x 128
block; written here from the format's description) load to their dequantized weights and
decode the greedy tokens of a float model holding them; tensor and expert parallelism (gloo)
give tp 1's tokens."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from treadle.runtime import Engine
from treadle.runtime.model_config import DUMMY_CONFIGS
from treadle.runtime.quantization.base import dequantized_weights

CFG = DUMMY_CONFIGS["tiny-qwen3-moe"]  # hidden 64, 8 experts of 32, 2 a token; layer 1 dense
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
PROMPTS = [[1, 520, 4011, 88], [1, 9, 33, 7000, 12, 5, 48000]]
FP8 = torch.float8_e4m3fn


def _block_quantize(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.zeros(nb * bn, kb * bk)
    padded[:n, :k] = w
    scale = padded.reshape(nb, bn, kb, bk).abs().amax(dim=(1, 3)).clamp(min=1e-8) / 448.0
    q = (padded.reshape(nb, bn, kb, bk) / scale[:, None, :, None]).reshape(nb * bn, kb * bk)[:n, :k]
    return q.to(FP8), scale


def _checkpoint(path, bn: int | None, bk: int | None):
    """tiny-qwen3-moe in block FP8 (every linear but the router and lm_head; bn None: one
    weight_scale a tensor, the fp8 format without weight_block_size) and the float weights
    (HF names, experts fused as [E, ...]) it stands for."""
    c = CFG
    g = torch.Generator().manual_seed(5)
    qd, kvd, h, i_moe = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.moe_intermediate_size
    out = {"model.embed_tokens.weight": torch.randn(c.vocab_size, h, generator=g),
           "lm_head.weight": torch.randn(c.vocab_size, h, generator=g) * 0.1, "model.norm.weight": torch.ones(h)}
    floats = dict(out)

    def put(key: str, shape: tuple[int, int]) -> torch.Tensor:
        w = torch.randn(*shape, generator=g) * 0.1
        if bn is None:
            s = w.abs().amax() / 448.0
            q = (w / s).to(FP8)
            out[key + ".weight"], out[key + ".weight_scale"] = q, s
            return q.float() * s
        q, s = _block_quantize(w, bn, bk)
        out[key + ".weight"], out[key + ".weight_scale_inv"] = q, s
        return q.float() * s.repeat_interleave(bn, 0)[:shape[0]].repeat_interleave(bk, 1)[:, :shape[1]]

    for layer in range(c.num_layers):
        pre = f"model.layers.{layer}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{pre}.{norm}.weight"] = floats[f"{pre}.{norm}.weight"] = torch.ones(h)
        for norm in ("q_norm", "k_norm"):
            out[f"{pre}.self_attn.{norm}.weight"] = floats[f"{pre}.self_attn.{norm}.weight"] = torch.ones(c.head_dim)
        for name, shape in (("q_proj", (qd, h)), ("k_proj", (kvd, h)), ("v_proj", (kvd, h)), ("o_proj", (h, qd))):
            floats[f"{pre}.self_attn.{name}.weight"] = put(f"{pre}.self_attn.{name}", shape)
        if c.is_moe_layer(layer):
            out[f"{pre}.mlp.gate.weight"] = floats[f"{pre}.mlp.gate.weight"] = torch.randn(c.num_experts, h, generator=g)
            gu, down = [], []
            for e in range(c.num_experts):
                gate = put(f"{pre}.mlp.experts.{e}.gate_proj", (i_moe, h))
                up = put(f"{pre}.mlp.experts.{e}.up_proj", (i_moe, h))
                gu.append(torch.cat([gate, up]))
                down.append(put(f"{pre}.mlp.experts.{e}.down_proj", (h, i_moe)))
            floats[f"{pre}.mlp.experts.gate_up_proj"] = torch.stack(gu)
            floats[f"{pre}.mlp.experts.down_proj"] = torch.stack(down)
        else:
            for name, shape in (("gate_proj", (c.intermediate_size, h)), ("up_proj", (c.intermediate_size, h)),
                                ("down_proj", (h, c.intermediate_size))):
                floats[f"{pre}.mlp.{name}.weight"] = put(f"{pre}.mlp.{name}", shape)
    d = c.to_hf_dict()
    d["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    if bn is not None:
        d["quantization_config"]["weight_block_size"] = [bn, bk]
    (path / "config.json").write_text(json.dumps(d))
    save_file({k: v.contiguous() for k, v in out.items()}, str(path / "model.safetensors"))
    return str(path), floats


@pytest.fixture(scope="module")
def reference_engine():
    with Engine(model_path="dummy:tiny-qwen3-moe", max_total_tokens=1024, device="cpu") as e:
        yield e


def _reference_tokens(engine, weights: dict[str, torch.Tensor]):
    engine.runner.model.load_weights(weights.items())
    assert engine.flush_cache()
    return [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]


def test_quantized_at_load_experts_decode_as_their_dequantized_float_model(reference_engine):
    with Engine(model_path="dummy:tiny-qwen3-moe", quantization="fp8", max_total_tokens=1024, device="cpu") as q:
        experts = q.runner.model.layers[0].mlp.experts
        assert experts.gate_up_proj.dtype == FP8 and experts.down_scale.shape == (8, CFG.hidden_size, 1)
        assert q.runner.model.layers[0].self_attn.qkv_proj.weight.dtype == FP8
        out = [o["output_ids"] for o in q.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
        deq = dequantized_weights(q.runner.model)
    assert "layers.0.mlp.experts.gate_up_proj" in deq and "layers.1.mlp.gate_up_proj.weight" in deq
    params = dict(reference_engine.runner.model.named_parameters())
    with torch.no_grad():
        for name, w in deq.items():
            params[name].copy_(w)
    assert reference_engine.flush_cache()
    want = [o["output_ids"] for o in reference_engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    assert out == want


@pytest.mark.parametrize("bn,bk", [(128, 128), (16, 32)])
def test_block_fp8_moe_checkpoint_loads_its_blocks_and_decodes_as_its_float_model(tmp_path, reference_engine, bn, bk):
    path, want = _checkpoint(tmp_path, bn, bk)
    with Engine(model_path=path, max_total_tokens=1024, device="cpu") as e:
        assert f"{bn}x{bk}-block" in e.get_server_info()["quantization"]
        got = dequantized_weights(e.runner.model)
        for name in ("gate_up_proj", "down_proj"):
            assert torch.equal(got[f"layers.0.mlp.experts.{name}"], want[f"model.layers.0.mlp.experts.{name}"])
        out = [o["output_ids"] for o in e.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    assert out == _reference_tokens(reference_engine, want)


@pytest.mark.slow
@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp2", "ep2"])
def test_block_fp8_moe_tensor_and_expert_parallel_give_tp1_tokens(tmp_path, reference_engine, expert_parallel):
    """tp 2 (a scale a tensor): each rank its 16 of an expert's 32 intermediate columns; ep 2
    (16 x 32 blocks): each rank 4 whole experts with all their block scales."""
    path, want = _checkpoint(tmp_path, 16, 32) if expert_parallel else _checkpoint(tmp_path, None, None)
    with Engine(model_path=path, max_total_tokens=1024, tp_size=2, enable_expert_parallel=expert_parallel,
                device="cpu") as e:
        out = [o["output_ids"] for o in e.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    assert out == _reference_tokens(reference_engine, want)


def test_4bit_moe_and_blocks_that_cut_a_ranks_columns_are_refused(tmp_path):
    with pytest.raises(ValueError, match="4-bit mixture-of-experts"):
        Engine(model_path="dummy:tiny-qwen3-moe", quantization="awq", device="cpu")
    path, _ = _checkpoint(tmp_path, 16, 32)
    # tp 2 leaves each rank 16 of an expert's 32 columns: not a block of 32
    with pytest.raises((ValueError, RuntimeError), match="do not divide each rank's 16 expert"):
        Engine(model_path=path, tp_size=2, device="cpu")


@pytest.mark.gpu
def test_gpu_block_fp8_moe_checkpoint_decodes_through_cuda_graphs(tmp_path):
    """On CUDA: FP8 experts through the GEMV (decode, in CUDA graphs) and the grouped GEMM (a
    300-token prefill), one by one and batched; the kernels' products are checked against the
    reference in test_fused_moe_fp8.py."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path, _ = _checkpoint(tmp_path, 16, 32)
    prompts = PROMPTS + [[1] + [(7 * i) % 40000 + 5 for i in range(300)]]
    with Engine(model_path=path, max_total_tokens=4096) as e:
        assert e.runner.model.layers[0].mlp.experts.gate_up_scale.is_cuda
        one = [e.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 16}) for p in prompts]
        assert e.flush_cache()
        batch = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 16})
    for a, b in zip(one, batch):
        assert len(a["output_ids"]) == 16 and len(b["output_ids"]) == 16
