"""End to end on the GPU: the Triton attention backend and the fused sampler give the same
greedy tokens as HF transformers with the same weights, and constrained outputs validate."""
from __future__ import annotations

import json

import pytest
import torch

from treadle.runtime import Engine
from treadle.runtime.model_config import DUMMY_CONFIGS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _save_tiny(name: str, path) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = DUMMY_CONFIGS[name].to_hf_dict()
    cfg = AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_greedy_matches_hf_on_gpu(name, tmp_path):
    from transformers import AutoModelForCausalLM

    path = _save_tiny(name, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).cuda().eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49000, (n,), generator=g).tolist() for n in (5, 17, 33, 100)]
    # fp32 on both sides so greedy choices are comparable token for token
    with Engine(model_path=path, device="cuda", dtype="float32", attention_backend="triton",
                max_total_tokens=4096) as e:
        out = e.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, "temperature": 0,
                                                              "ignore_eos": True})
        e.check_integrity()
    for ids, o in zip(prompts, out):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=16, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert o["output_ids"] == ref


def test_constrained_outputs_validate_on_gpu():
    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"]}
    with Engine(device="cuda", max_total_tokens=8192) as e:  # the embedded SmolLM2, bf16
        outs = e.generate(["A person:", "Another person:", "Hello"],
                          [{"max_new_tokens": 48, "temperature": 0, "json_schema": schema},
                           {"max_new_tokens": 48, "temperature": 0.8, "seed": 3, "json_schema": schema},
                           {"max_new_tokens": 8, "temperature": 0}])
        for o in outs[:2]:
            jsonschema.validate(json.loads(o["text"]), schema)
        e.check_integrity()
