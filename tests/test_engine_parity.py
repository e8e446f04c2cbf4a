"""Greedy outputs of treadle's Engine equal HF transformers token for token: the embedded
SmolLM2 GGUF (ragged batch and one by one) and tiny random Llama / Qwen2 / Qwen3 checkpoints."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from treadle.runtime import Engine
from treadle.runtime.model_config import DUMMY_CONFIGS
from treadle.runtime.sampling_params import SamplingParams
from treadle.runtime.request_checks import check_context
from treadle.runtime.tokenizer import apply_chat_template

QUESTIONS = [
    "Hi",
    "What is the capital of France?",
    "Write a short poem about the sea and the wind, in four lines.",
    "Explain in two sentences why the sky is blue, and then list three colours of a rainbow.",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def engine():
    with Engine(max_total_tokens=8192) as e:
        yield e


@pytest.fixture(scope="module")
def hf_model(hf_smollm2):
    return hf_smollm2  # HF's float32 model of the embedded GGUF (conftest.py; test_weights reads it too)


def _hf_greedy(model, ids: list[int], n: int, eos: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, pad_token_id=eos)[0, len(ids):].tolist()
    return out[: out.index(eos) + 1] if eos in out else out


def test_embedded_greedy_matches_hf_batch_and_single(engine, hf_model):
    tok = engine.tokenizer
    prompts = [apply_chat_template(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    ids = [engine.encode(p) for p in prompts]
    assert len({len(x) for x in ids}) == len(ids), "prompts must be ragged"
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0}
    batch = engine.generate(prompts, params)
    engine.flush_cache()
    single = [engine.generate(input_ids=x, sampling_params=params) for x in ids]
    for x, b, s in zip(ids, batch, single):
        ref = _hf_greedy(hf_model, x, NEW_TOKENS, tok.eos_token_id)
        assert b["output_ids"] == ref
        assert s["output_ids"] == ref
        assert b["meta_info"]["prompt_tokens"] == len(x)
        assert b["meta_info"]["completion_tokens"] == len(ref)
        expected = "stop" if ref[-1] == tok.eos_token_id else "length"
        assert b["meta_info"]["finish_reason"]["type"] == expected
    assert batch[1]["text"].startswith("The capital of France is Paris")


def _save_tiny(name: str, tmp_path) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = DUMMY_CONFIGS[name].to_hf_dict()
    cfg = AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # larger weights than the default init so greedy choices are not ties
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return str(tmp_path)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-qwen2"])
def test_tiny_random_models_match_hf(name, tmp_path):
    from transformers import AutoModelForCausalLM

    path = _save_tiny(name, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49000, (n,), generator=g).tolist() for n in (5, 17, 33)]
    with Engine(model_path=path, max_total_tokens=2048) as e:
        out = e.generate(input_ids=prompts, sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                              "ignore_eos": True},
                         return_logprob=True, logprob_start_len=0)
    for ids, o in zip(prompts, out):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].float()
        ref_lp = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        got = torch.tensor([lp for lp, _, _ in o["meta_info"]["input_token_logprobs"][1:]])
        assert o["meta_info"]["input_token_logprobs"][0] == (None, ids[0], None)
        # fp32 on both sides; the paged attention sums in another order: 1e-4 absolute
        torch.testing.assert_close(got, ref_lp, atol=1e-4, rtol=1e-4)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert o["output_ids"] == ref


def test_bad_input_raises_value_error(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.generate(input_ids=[], sampling_params={"max_new_tokens": 1})
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate("hi", {"max_new_tokens": -1})
    with pytest.raises(ValueError, match="context length"):
        engine.generate(input_ids=[5] * (engine.runner.context_len + 1), sampling_params={"max_new_tokens": 1})
    ctx = engine.runner.context_len
    with pytest.raises(ValueError, match=f"at most {ctx - 10} new tokens fit"):  # set by the caller: no silent cap
        engine.generate(input_ids=[5] * 10, sampling_params={"max_new_tokens": ctx - 9})
    check_context(10, {"max_new_tokens": ctx - 10}, ctx)  # exactly fills the context: fine
    with pytest.raises(ValueError, match="unknown sampling_params"):
        engine.generate("hi", {"max_tokens": 3})
    for bad in ("greedy", 5, [1]):  # a SamplingParams object is taken (below), other things named
        with pytest.raises(ValueError, match="sampling_params must be a dict"):
            engine.generate("hi", bad)
    with pytest.raises(ValueError, match="prompt must be a string or a list"):
        engine.generate(5)
    # half an emoji (a lone surrogate): a TypeError from deep in the tokenizer before
    with pytest.raises(ValueError, match=r"lone surrogate \(U\+D83D\) at character 3"):
        engine.generate("cut\ud83d", {"max_new_tokens": 1})
    params = SamplingParams(max_new_tokens=2, temperature=0)
    assert engine.generate("hi", params)["output_ids"] == engine.generate("hi", params.to_dict())["output_ids"]
    for ids in ([1.5, 2], [True, 5], ["a"], [[1, 2], [None]], 7):  # floats were truncated, bools taken as ids
        with pytest.raises(ValueError, match="input_ids must be"):
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
    assert engine.generate(input_ids=(np.int64(5), 6), sampling_params={"max_new_tokens": 1})["output_ids"]
    # logprob options of the wrong type: named, and refused before they reach a batch step (a
    # boolean top_logprobs_num used to fail the whole step as an internal error)
    for kw, field in ((dict(return_logprob="yes"), "return_logprob must be a boolean"),
                      (dict(return_logprob=True, top_logprobs_num=True), "top_logprobs_num must be an integer"),
                      (dict(return_logprob=True, top_logprobs_num="2"), "top_logprobs_num must be an integer"),
                      (dict(return_logprob=True, logprob_start_len=1.5), "logprob_start_len must be an integer"),
                      (dict(return_logprob=True, return_text_in_logprobs=1), "return_text_in_logprobs must be")):
        with pytest.raises(ValueError, match=field):
            engine.generate("hi there", {"max_new_tokens": 2}, **kw)
    # the engine is unaffected and leaks nothing
    assert engine.generate("hi", {"max_new_tokens": 2, "temperature": 0})["meta_info"]["completion_tokens"] == 2
    engine.check_integrity()


@pytest.mark.parametrize("kwargs,needle", [
    ({"context_length": 0}, "context_length must be >= 1"),  # was the default, silently
    ({"context_length": -5}, "context_length must be >= 1"),  # was "max_positions must be positive"
    ({"max_total_tokens": 0}, "max_total_tokens must be >= 1"),
    ({"chunked_prefill_size": "x"}, "chunked_prefill_size must be an integer"),  # was a TypeError
    ({"context_length": 4096.0}, "context_length must be an integer"),
    ({"cuda_graph": 1}, "cuda_graph must be a boolean"),
    ({"device": "bogus"}, "device 'bogus'"),  # was torch's RuntimeError
    ({"context_length": 100000}, "more than the model's max_position_embeddings 8192"),  # was accepted
    ({"no_such_option": 1}, "unknown engine argument"),  # (random_seed, SGLang's name, is taken)
])
def test_bad_engine_arguments_are_named(kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        Engine(**kwargs)


def test_bad_model_path_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="model"):
        Engine(model_path=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="dummy"):
        Engine(model_path="dummy:not-a-model")
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        Engine(model_path=str(tmp_path))
