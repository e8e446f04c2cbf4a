"""Mixture-of-experts models: tiny random Qwen3-MoE and Mixtral checkpoints give HF
transformers' greedy tokens (CPU, fp32); tensor parallel 2 and expert parallel 2 (gloo) give
tp 1's outputs, constrained decoding and the radix cache included; the server serves one."""
from __future__ import annotations

import json

import pytest
import torch

from treadle.runtime import Engine
from treadle.runtime.model_config import DUMMY_CONFIGS, ModelConfig
from treadle.runtime.models.registry import build_model

TIMEOUT = 60.0


def _save_tiny(name: str, path) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = DUMMY_CONFIGS[name].to_hf_dict()
    cfg = AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # larger weights than the default init: no near-ties in greedy choices
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-mixtral"])
def test_tiny_moe_matches_hf(name, tmp_path):
    from transformers import AutoModelForCausalLM

    path = _save_tiny(name, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    assert ModelConfig.from_hf_dict(hf.config.to_dict()) == DUMMY_CONFIGS[name]  # the config round-trips
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49000, (n,), generator=g).tolist() for n in (1, 6, 29)]
    with Engine(model_path=path, device="cpu", max_total_tokens=2048) as e:  # the CPU parity, on any machine
        out = e.generate(input_ids=prompts, sampling_params={"max_new_tokens": 10, "temperature": 0,
                                                              "ignore_eos": True},
                         return_logprob=True, logprob_start_len=0)
        # HF's in-memory state_dict (experts fused as [E, 2I, H]) loads into the same parameters
        # as the checkpoint's per-expert tensors (benchmarks load it that way)
        fused = build_model(e.runner.config)
        fused.load_weights(hf.state_dict().items())
        for (n, p), q in zip(e.runner.model.named_parameters(), fused.parameters()):
            assert torch.equal(p, q), n
    for ids, o in zip(prompts, out):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].float()
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert o["output_ids"] == ref
        if len(ids) > 1:
            ref_lp = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
            got = torch.tensor([lp for lp, _, _ in o["meta_info"]["input_token_logprobs"][1:]])
            torch.testing.assert_close(got, ref_lp, atol=1e-4, rtol=1e-4)


def test_checkpoint_missing_an_expert_is_named(tmp_path):
    model = build_model(DUMMY_CONFIGS["tiny-mixtral"])
    torch.manual_seed(0)
    with torch.no_grad():  # build_model leaves memory uninitialised: a NaN there would fail equal()
        for p in model.parameters():
            p.normal_()
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    names = []
    for n, t in full.items():  # Mixtral's checkpoint names, one tensor an expert
        if n.endswith(".experts.gate_up_proj"):
            base = n.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts")
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                names += [(f"{base}.{e}.w1.weight", t[e, :inter]), (f"{base}.{e}.w3.weight", t[e, inter:])]
        elif n.endswith(".experts.down_proj"):
            base = n.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts")
            names += [(f"{base}.{e}.w2.weight", t[e]) for e in range(t.shape[0])]
        elif ".qkv_proj." in n:
            q, k, v = t.split(model.get_submodule(n.rsplit(".", 1)[0]).local_sizes)
            names += [(n.replace("qkv_proj", p), x) for p, x in (("q_proj", q), ("k_proj", k), ("v_proj", v))]
        else:
            names.append((n.replace(".mlp.gate.", ".block_sparse_moe.gate."), t))
    fresh = build_model(DUMMY_CONFIGS["tiny-mixtral"])
    fresh.load_weights(names)
    for (n, p), q in zip(fresh.named_parameters(), model.parameters()):
        assert torch.equal(p, q), n
    with pytest.raises(ValueError, match=r"missing 1 tensor.*layers\.1\.mlp\.experts/3/up"):
        fresh.load_weights([x for x in names if x[0] != "layers.1.block_sparse_moe.experts.3.w3.weight"])
    with pytest.raises(ValueError, match="names expert 4 of 4"):
        fresh.load_weights(names + [("layers.0.block_sparse_moe.experts.4.w1.weight", names[0][1])])


PROMPTS = [[1, 5, 9, 200, 31], [1], list(range(3, 60)), [1, 17] * 11]
PARAMS = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in (20, 16, 14, 20)]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"]}


def _cases(e: Engine) -> list:
    out = [o["output_ids"] for o in e.generate(input_ids=PROMPTS, sampling_params=PARAMS)]
    o = e.generate(input_ids=PROMPTS[2], sampling_params={"max_new_tokens": 8, "temperature": 0.8, "seed": 7})
    out.append(o["output_ids"])
    o = e.generate("Answer in JSON:", {"max_new_tokens": 24, "temperature": 0, "json_schema": SCHEMA})
    out.append(o["text"])
    again = e.generate(input_ids=PROMPTS[2] + [7, 8], sampling_params=PARAMS[0])  # shares a cached prefix
    out.append((again["output_ids"], again["meta_info"]["cached_tokens"] > 0))
    e.check_integrity()
    return out


def test_tp2_and_expert_parallel2_match_tp1():
    # a tight pool and small chunks: chunked prefill and retraction on every rank alike
    kw = dict(device="cpu", max_total_tokens=160, chunked_prefill_size=24, dist_timeout_s=TIMEOUT)
    with Engine(model_path="dummy:tiny-qwen3-moe", **kw) as e:
        want = _cases(e)
    with Engine(model_path="dummy:tiny-qwen3-moe", tp_size=2, **kw) as e:
        assert e.runner.model.layers[0].mlp.experts.gate_up_proj.shape == (8, 32, 64)  # 16 of 32 columns
        tp = _cases(e)
    with Engine(model_path="dummy:tiny-qwen3-moe", tp_size=2, enable_expert_parallel=True, **kw) as e:
        experts = e.runner.model.layers[0].mlp.experts
        assert (experts.num_local, experts.expert_start, experts.gate_up_proj.shape[1]) == (4, 0, 64)
        ep = _cases(e)
    assert tp == want and ep == want
    assert want[5].startswith("{") and want[6][1]


def test_ngram_speculation_on_moe_matches_plain_decoding():
    # the first reply falls into a loop that drafts copy, verified through the MoE extend path
    prompts = [[1, 17, 5] * 9, [5, 9, 200, 31]]
    params = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    out = {}
    for algo in ("none", "ngram"):
        with Engine(model_path="dummy:tiny-mixtral", device="cpu", max_total_tokens=1024,
                    speculative_algorithm=algo) as e:
            out[algo] = [o["output_ids"] for o in e.generate(input_ids=prompts, sampling_params=params)]
            if algo == "ngram":
                assert e.get_server_info()["spec_accepted_tokens"] > 0
    assert out["ngram"] == out["none"]


def test_expert_parallel_needs_divisible_experts():
    with pytest.raises(ValueError, match="tp_size 3 to divide num_experts 4"):
        from treadle.runtime.models.moe import FusedExperts
        from treadle.runtime.models.parallel import ParallelContext

        FusedExperts(4, 16, 8, ParallelContext(rank=0, size=3), expert_parallel=True)


DIGIT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "ok": {"type": "boolean"}}, "required": ["n", "ok"]}


def test_server_serves_a_moe_model_with_json_schema():
    import openai

    from treadle.runtime.server.testing import ServerProcess

    with ServerProcess(["--model-path", "dummy:tiny-mixtral", "--max-total-tokens", "4096",
                        "--log-level", "warning"]) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "a digit and a flag"}], max_tokens=48,
            temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": DIGIT}})
        doc = json.loads(r.choices[0].message.content)
        assert 0 <= doc["n"] <= 9 and isinstance(doc["ok"], bool)


@pytest.mark.gpu
def test_cuda_graphs_cover_moe_decode():
    """Decode batches of 1 (the GEMV path) and 5 (the grouped GEMMs) replayed from CUDA graphs
    give the eager launches' tokens (fp32)."""
    prompts = [[1, 5, 9, 200, 31], [1], list(range(3, 60)), [1, 17] * 11, [7] * 9]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    out = {}
    for graphs in (False, True):
        with Engine(model_path="dummy:tiny-qwen3-moe", device="cuda", dtype="float32", cuda_graph=graphs,
                    max_total_tokens=4096) as e:
            assert (e.runner.graph_runner is not None) == graphs
            out[graphs] = ([o["output_ids"] for o in e.generate(input_ids=prompts, sampling_params=params)],
                           e.generate(input_ids=prompts[0], sampling_params=params)["output_ids"])
    assert out[True] == out[False]
