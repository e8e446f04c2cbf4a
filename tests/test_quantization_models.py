"""Quantized models on the CPU: tiny checkpoints in each published layout (compressed-tensors
FP8 per channel and per tensor, fbgemm_fp8, AWQ, GPTQ with and without act-order), packed here
by code written from the formats' specs (not treadle's packers), load to the weights the spec
says and give the greedy tokens of a float model holding those weights; the embedded SmolLM2
quantized at load (fp8, awq) gives the greedy tokens of its own dequantized-fp32 reference;
unknown formats are refused by name; the server reports its quantization. These run on the CPU
(device="cpu") on a GPU machine too, where the gpu-marked tests below cover the kernels."""
from __future__ import annotations

import json

import pytest
import requests
import torch
from safetensors.torch import save_file

from treadle.runtime import Engine
from treadle.runtime.model_config import DUMMY_CONFIGS
from treadle.runtime.quantization.base import dequantized_weights

CFG = DUMMY_CONFIGS["tiny-llama"]  # hidden 64, 4 q heads and 2 kv heads of 16, intermediate 128, 2 layers
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
PROMPTS = [[1, 520, 4011, 88], [1, 9, 33, 7000, 12, 5, 48000]]
# (HF projection, merged parameter, input group for act-order)
PROJ = [("self_attn.q_proj", "self_attn.qkv_proj", "attn_in"), ("self_attn.k_proj", "self_attn.qkv_proj", "attn_in"),
        ("self_attn.v_proj", "self_attn.qkv_proj", "attn_in"), ("self_attn.o_proj", "self_attn.o_proj", "o_in"),
        ("mlp.gate_proj", "mlp.gate_up_proj", "mlp_in"), ("mlp.up_proj", "mlp.gate_up_proj", "mlp_in"),
        ("mlp.down_proj", "mlp.down_proj", "down_in")]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's gemm pack: nibble i of an int holds column 8c + order[i]


def _float_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = CFG
    qd, kvd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {"self_attn.q_proj": (qd, c.hidden_size), "self_attn.k_proj": (kvd, c.hidden_size),
              "self_attn.v_proj": (kvd, c.hidden_size), "self_attn.o_proj": (c.hidden_size, qd),
              "mlp.gate_proj": (c.intermediate_size, c.hidden_size), "mlp.up_proj": (c.intermediate_size, c.hidden_size),
              "mlp.down_proj": (c.hidden_size, c.intermediate_size)}
    w = {"model.embed_tokens.weight": torch.randn(c.vocab_size, c.hidden_size, generator=g),
         "lm_head.weight": torch.randn(c.vocab_size, c.hidden_size, generator=g) * 0.1,
         "model.norm.weight": torch.ones(c.hidden_size)}
    for i in range(c.num_layers):
        w[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(c.hidden_size)
        w[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(c.hidden_size)
        for name, shape in shapes.items():
            w[f"model.layers.{i}.{name}.weight"] = torch.randn(*shape, generator=g) * 0.08
    return w


def _pack_ints(vals: list[torch.Tensor]) -> torch.Tensor:
    """Eight [..] tensors of nibbles -> int32: nibble i from vals[i] (bits 4i..4i+3)."""
    acc = torch.zeros_like(vals[0], dtype=torch.int64)
    for i, v in enumerate(vals):
        acc |= v.to(torch.int64) << (4 * i)
    return torch.where(acc >= 2**31, acc - 2**32, acc).to(torch.int32)


def _int4_groups(w: torch.Tensor, g_idx: torch.Tensor, groups: int, sym: bool):
    """[N, K] float -> q [K, N], zeros [groups, N], scales fp16 [groups, N], per g_idx group."""
    wt = w.T
    s = torch.empty(groups, w.shape[0])
    z = torch.empty(groups, w.shape[0])
    for gi in range(groups):
        rows = wt[g_idx == gi]
        if sym:
            s[gi], z[gi] = rows.abs().amax(0) * 2 / 15, 8
        else:
            lo, hi = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
            s[gi] = (hi - lo) / 15
            z[gi] = (-lo / s[gi]).round()
    s = s.half()
    q = (wt / s.float()[g_idx] + z[g_idx]).round().clamp(0, 15)
    return q.long(), z.long(), s


def _write(path, tensors: dict[str, torch.Tensor], qcfg: dict | None) -> str:
    d = CFG.to_hf_dict()
    if qcfg is not None:
        d["quantization_config"] = qcfg
    (path / "config.json").write_text(json.dumps(d))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return str(path)


def _quantized_checkpoint(fmt: str, path) -> tuple[str, dict[str, torch.Tensor]]:
    """A checkpoint of format `fmt` and the float weights (HF names) it stands for."""
    w = _float_weights()
    out = {k: v for k, v in w.items() if not any(f".{p}." in k for p, _, _ in PROJ)}
    deq: dict[str, torch.Tensor] = {}
    perms = {}
    group = 32
    for i in range(CFG.num_layers):
        for proj, _, inp in PROJ:
            name = f"model.layers.{i}.{proj}"
            wt = w[name + ".weight"]
            n, k = wt.shape
            if fmt in ("ct-channel", "fbgemm", "ct-tensor"):
                per_row = fmt != "ct-tensor"
                amax = wt.abs().amax(1, keepdim=True) if per_row else wt.abs().amax().reshape(1)
                scale = amax / 448.0
                q = (wt / (scale if per_row else scale[0])).to(torch.float8_e4m3fn)
                out[name + ".weight"] = q
                out[name + ".weight_scale"] = scale.to(torch.bfloat16) if fmt == "ct-channel" else scale
                if fmt == "ct-tensor":
                    out[name + ".input_scale"] = torch.tensor([0.05])
                s = out[name + ".weight_scale"].float()
                deq[name + ".weight"] = q.float() * (s if per_row else s[0])
                continue
            if fmt == "gptq-act":  # one permutation per input (q/k/v share theirs, as GPTQ's Hessian is shared)
                perm = perms.setdefault((i, inp), torch.randperm(k, generator=torch.Generator().manual_seed(k + i)))
                g_idx = torch.empty(k, dtype=torch.long)
                g_idx[perm] = torch.arange(k) // group  # the i-th input quantized is in group i // G
            else:
                g_idx = torch.arange(k) // group
            q, z, s = _int4_groups(wt, g_idx, k // group, sym=fmt != "awq")
            deq[name + ".weight"] = ((q - z[g_idx]).float() * s.float()[g_idx]).T
            out[name + ".scales"] = s
            if fmt == "awq":
                out[name + ".qweight"] = _pack_ints([q[:, AWQ_ORDER[j]::8] for j in range(8)])  # [K, N/8]
                out[name + ".qzeros"] = _pack_ints([z[:, AWQ_ORDER[j]::8] for j in range(8)])
            else:
                out[name + ".qweight"] = _pack_ints([q[j::8] for j in range(8)])  # [K/8, N]
                out[name + ".qzeros"] = _pack_ints([(z[:, j::8] - 1) & 0xF for j in range(8)])  # stored minus 1
                out[name + ".g_idx"] = g_idx.to(torch.int32)
    qcfg = {"ct-channel": _ct("channel", None), "ct-tensor": _ct("tensor", {"num_bits": 8, "type": "float",
                                                                             "strategy": "tensor", "dynamic": False}),
            "fbgemm": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]},
            "awq": {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"},
            "gptq": {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": True},
            "gptq-act": {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": True, "sym": True,
                         "checkpoint_format": "gptq"}}[fmt]
    return _write(path, out, qcfg), {**w, **deq}


def _ct(strategy: str, acts: dict | None) -> dict:
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "config_groups": {"group_0": {
                "targets": ["Linear"], "input_activations": acts or {"num_bits": 8, "type": "float", "strategy": "token",
                                                                      "dynamic": True, "symmetric": True},
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, "symmetric": True}}}}


@pytest.fixture(scope="module")
def reference_engine():
    """A float tiny-llama: each test loads the weights a checkpoint stands for into it."""
    with Engine(model_path="dummy:tiny-llama", max_total_tokens=1024, device="cpu") as e:
        yield e


@pytest.mark.parametrize("fmt", ["ct-channel", "ct-tensor", "fbgemm", "awq", "gptq", "gptq-act"])
def test_tiny_checkpoint_loads_what_its_format_says(fmt, tmp_path, reference_engine):
    path, want = _quantized_checkpoint(fmt, tmp_path)
    with Engine(model_path=path, max_total_tokens=1024, device="cpu") as e:
        model = e.runner.model
        qkv = model.layers[0].self_attn.qkv_proj
        assert qkv.quant is not None and not hasattr(qkv, "g_idx")
        assert {p.dtype for p in qkv.parameters()} <= {torch.float8_e4m3fn, torch.float32, torch.int32, torch.float16}
        got = dequantized_weights(model)
        for i in range(CFG.num_layers):
            for merged, parts in (("self_attn.qkv_proj", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
                                  ("self_attn.o_proj", ["self_attn.o_proj"]),
                                  ("mlp.gate_up_proj", ["mlp.gate_proj", "mlp.up_proj"]), ("mlp.down_proj", ["mlp.down_proj"])):
                expect = torch.cat([want[f"model.layers.{i}.{p}.weight"] for p in parts])
                have = got[f"layers.{i}.{merged}.weight"]
                assert torch.equal(have, expect.to(have.device)), (fmt, i, merged)
        out = e.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert "fp8" in e.get_server_info()["quantization"] or fmt.startswith(("awq", "gptq"))
    reference_engine.runner.model.load_weights(want.items())
    assert reference_engine.flush_cache()
    ref = reference_engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]


def test_unknown_or_contradicting_formats_are_refused(tmp_path):
    from treadle.runtime.model_source import resolve_model_source

    d = CFG.to_hf_dict()
    for bad, message in (({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
                         ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version='gemv'"),
                         ({"quant_method": "gptq", "bits": 8}, "bits=8"),
                         ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "'pack-quantized'")):
        (tmp_path / "config.json").write_text(json.dumps({**d, "quantization_config": bad}))
        with pytest.raises(ValueError, match=message):
            resolve_model_source(str(tmp_path))
    path, _ = _quantized_checkpoint("awq", tmp_path)
    with pytest.raises(ValueError, match="quantized as awq"):
        Engine(model_path=path, quantization="fp8")
    with pytest.raises(ValueError, match="mixture-of-experts"):
        Engine(model_path="dummy:tiny-mixtral", quantization="awq")  # FP8 experts run; 4-bit ones do not yet
    with pytest.raises(ValueError, match="quantization must be one of"):
        Engine(model_path="dummy:tiny-llama", quantization="int3")


# ---------------------------------------------------------------- the embedded model

HELD_OUT = ["Write a haiku about a lighthouse.", "What is 17 times 23?", "List three uses of copper."]


@pytest.mark.slow
def test_embedded_model_quantized_at_load_matches_its_dequantized_reference(smollm2_tokenizer):
    prompts = [smollm2_tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                     tokenize=False) for p in HELD_OUT]
    params = {"max_new_tokens": 8, "temperature": 0}  # the CPU dequantizes every weight each step: keep it short
    with Engine(max_total_tokens=2048, gguf_dequantize=True, device="cpu") as ref:  # the float32 path
        floats = dict(ref.runner.model.named_parameters())
        for method, dtypes in (("fp8", {torch.float8_e4m3fn}), ("awq", {torch.int32})):
            with Engine(quantization=method, max_total_tokens=2048, device="cpu") as q:
                assert {p.dtype for p in q.runner.model.layers[3].mlp.down_proj.parameters()} >= dtypes
                out = q.generate(prompts, sampling_params=params)
                deq = dequantized_weights(q.runner.model)
            assert len(deq) == 4 * 30  # every linear of the 30 layers
            with torch.no_grad():
                for name, w in deq.items():
                    assert not torch.equal(floats[name], w)  # quantized: not the float weights
                    floats[name].copy_(w)
            assert ref.flush_cache()
            want = ref.generate(prompts, sampling_params=params)
            assert [o["output_ids"] for o in out] == [o["output_ids"] for o in want], method


@pytest.mark.slow
def test_server_reports_its_quantization():
    from treadle.runtime.server.testing import ServerProcess

    with ServerProcess(["--model-path", "dummy:tiny-llama", "--quantization", "gptq", "--max-total-tokens", "1024",
                        "--device", "cpu", "--log-level", "warning"]) as srv:
        info = requests.get(srv.url + "/get_server_info", timeout=30).json()
        assert info["quantization"].startswith("gptq (4-bit weights, group 64")
        assert info["engine_args"]["quantization"] == "gptq"
        r = requests.post(srv.url + "/generate", json={"input_ids": PROMPTS[0], "sampling_params": GREEDY}, timeout=60)
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 8


@pytest.mark.slow
def test_tensor_parallel_cuts_packed_tensors_per_rank(tmp_path, reference_engine):
    """tp_size 2 (gloo): every rank loads its slice of a GPTQ checkpoint (packed along K in the
    row-parallel layers, whose g_idx then starts past group 0) and the ranks give the tp 1 tokens."""
    path, want = _quantized_checkpoint("gptq", tmp_path)
    with Engine(model_path=path, max_total_tokens=1024, tp_size=2, device="cpu") as e:
        out = e.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    reference_engine.runner.model.load_weights(want.items())
    assert reference_engine.flush_cache()
    ref = reference_engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp8", "awq", "gptq"])
def test_gpu_quantized_dummy_model_decodes_through_cuda_graphs(method):
    """On CUDA the kernels run (prefill through the GEMM / _scaled_mm, decode through the GEMVs
    inside CUDA graphs); 4-bit's first token is its dequantized weights' bf16 model's (FP8 also
    quantizes activations, so only runs here; its products are checked in the kernel tests)."""
    with Engine(model_path="dummy:llama3.2-1b", quantization=method, max_total_tokens=4096) as q:
        out = q.generate(input_ids=PROMPTS, sampling_params={**GREEDY, "max_new_tokens": 16})
        deq = dequantized_weights(q.runner.model)
    with Engine(model_path="dummy:llama3.2-1b", max_total_tokens=4096) as ref:
        params = dict(ref.runner.model.named_parameters())
        with torch.no_grad():
            for name, w in deq.items():
                params[name].copy_(w)
        want = ref.generate(input_ids=PROMPTS, sampling_params={**GREEDY, "max_new_tokens": 16})
    for o, w in zip(out, want):
        assert len(o["output_ids"]) == 16
        if method != "fp8":  # weight-only: the same bf16 products up to summation order
            assert o["output_ids"][0] == w["output_ids"][0]
