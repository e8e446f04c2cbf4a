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


@pytest.mark.parametrize("cuda_graph,overlap", [(True, "on"), (True, "off"), (False, "on")],
                         ids=["graph-overlap", "graph-plain", "eager-overlap"])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_greedy_matches_hf_on_gpu(name, cuda_graph, overlap, tmp_path):
    from transformers import AutoModelForCausalLM

    path = _save_tiny(name, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).cuda().eval()
    g = torch.Generator().manual_seed(1)
    # 5 requests: CUDA graphs pad the batch to 8 with dummy rows
    prompts = [torch.randint(3, 49000, (n,), generator=g).tolist() for n in (5, 17, 33, 100, 2)]
    # fp32 on both sides so greedy choices are comparable token for token
    with Engine(model_path=path, device="cuda", dtype="float32", attention_backend="triton",
                max_total_tokens=4096, cuda_graph=cuda_graph, cuda_graph_max_bs=16, overlap_schedule=overlap) as e:
        assert (e.runner.graph_runner is not None) == cuda_graph
        out = e.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, "temperature": 0,
                                                              "ignore_eos": True})
        e.check_integrity()
        assert (e.get_server_info()["overlap_steps"] > 0) == (overlap == "on")
    for ids, o in zip(prompts, out):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=16, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert o["output_ids"] == ref


def _tiny_with_tokenizer(path) -> str:
    """A tiny random model plus a small byte-level BPE tokenizer trained here (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    _save_tiny("tiny-llama", path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ['{"name": "Ann", "age": 31}', "hello world", "the quick brown fox 0123456789"] * 50
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(path)
    for name in ("config.json", "generation_config.json"):  # EOS must be this tokenizer's <eos> (id 0)
        f = path / name
        if f.exists():
            cfg = json.loads(f.read_text())
            cfg["eos_token_id"] = cfg["bos_token_id"] = 0
            f.write_text(json.dumps(cfg))
    return str(path)


def _replay_sampled(e, constraint: dict, prompt: str, check, max_new_tokens: int = 48):
    """Four sampled outputs under ``constraint`` (the grammar's masks through the fused GPU
    sampler): each replays through a fresh matcher, and ``check(text)`` is true for the
    finished ones. Returns the compiled grammar."""
    from treadle.constrained import GrammarSpec

    grammar = e.scheduler.grammar_compiler.compile(GrammarSpec.from_params(**constraint))
    params = [{"max_new_tokens": max_new_tokens, "temperature": 1.0, "seed": s, **constraint} for s in range(4)]
    for o in e.generate([prompt] * 4, params):
        m = grammar.matcher()
        assert all(m.accept_token(t) for t in o["output_ids"]), o
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            assert check(o["text"]), o["text"]
    return grammar


def test_constrained_outputs_validate_on_gpu(tmp_path):
    import jsonschema

    path = _tiny_with_tokenizer(tmp_path)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}},
              "required": ["name", "age", "ok"]}
    with Engine(model_path=path, device="cuda", max_total_tokens=8192) as e:  # bf16, graphs on
        params = [{"max_new_tokens": 64, "temperature": 0, "json_schema": schema}] + [
            {"max_new_tokens": 64, "temperature": 1.0, "seed": s, "json_schema": schema} for s in range(6)]
        outs = e.generate(["A person:"] * 7 + ["Hello"], params + [{"max_new_tokens": 8, "temperature": 0}])
        for o in outs[:7]:
            assert o["meta_info"]["finish_reason"]["type"] == "stop", o
            jsonschema.validate(json.loads(o["text"]), schema)
        regex = e.generate("Code:", {"max_new_tokens": 16, "temperature": 1.0, "seed": 1,
                                     "regex": "[0-9]{3}-[a-c]{2}"})
        import re

        assert re.fullmatch("[0-9]{3}-[a-c]{2}", regex["text"])
        # any JSON object (the pushdown grammar's masks through the fused GPU sampler)
        _replay_sampled(e, {"json_schema": {"type": "object"}}, "A person:", lambda t: isinstance(json.loads(t), dict))
        # a schema with a free-form member (a hole on the pushdown automaton, json_holes.py)
        tool = {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
                "required": ["name", "arguments"]}
        g = _replay_sampled(e, {"json_schema": tool}, "A call:", lambda t: jsonschema.validate(json.loads(t), tool) is None)
        assert g.holes is not None
        # a recursive schema (its $ref a call, json_holes.py)
        tree = {"$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
            "type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v", "kids"]}}, "$ref": "#/$defs/n"}
        g = _replay_sampled(e, {"json_schema": tree}, "A tree:", lambda t: jsonschema.validate(json.loads(t), tree) is None,
                            max_new_tokens=64)
        assert g.holes is not None and g.holes.entries[0] is not None
        # an EBNF grammar whose outputs may end early and go on (index_markers.py)
        from treadle.constrained.ebnf.ebnf import ebnf_to_regex

        ebnf = 'root ::= num ("," num)*\nnum ::= "-"? [0-9]+ ("." [0-9]+)?'
        _replay_sampled(e, {"ebnf": ebnf}, "Numbers:", lambda t: re.fullmatch(ebnf_to_regex(ebnf), t),
                        max_new_tokens=32)
        # an EBNF grammar that nests (its recursion a call, ebnf_calls.py)
        arith = 'root ::= e\ne ::= t (("+" | "-") t)*\nt ::= f (("*" | "/") f)*\nf ::= [0-9]+ | "(" e ")"'
        g = _replay_sampled(e, {"ebnf": arith}, "Sum:", _arithmetic, max_new_tokens=48)
        assert g.holes is not None and g.holes.entries[0] is not None
        # a structural tag: free text, each "e" opening a segment "e:<0-99>;" (structural_tag.py)
        tag = {"structures": [{"begin": "e:", "schema": {"type": "integer", "minimum": 0, "maximum": 99},
                               "end": ";"}], "triggers": ["e"]}
        _replay_sampled(e, {"structural_tag": tag}, "hello", _e_segments, max_new_tokens=48)
        e.check_integrity()


def _e_segments(text: str) -> bool:
    """Whether every "e" in ``text`` opens a segment ``e:N;`` with 0 <= N <= 99."""
    import re

    pos = 0
    while (at := text.find("e", pos)) >= 0:
        m = re.match(r"e:(-?[0-9]+);", text[at:])
        if m is None or not 0 <= int(m.group(1)) <= 99:
            return False
        pos = at + m.end()
    return True


def _arithmetic(text: str) -> bool:
    """Whether ``text`` is in the arithmetic grammar above: innermost groups folded to a number."""
    import re

    flat = r"[0-9]+(?:[-+*/][0-9]+)*"
    while (m := re.search(r"\(([^()]*)\)", text)) is not None:
        if not re.fullmatch(flat, m.group(1)):
            return False
        text = text[:m.start()] + "1" + text[m.end():]
    return re.fullmatch(flat, text) is not None


def test_logit_bias_on_gpu(tmp_path):
    """Biased rows (greedy, and sampled through the fused kernel) beside an unbiased one."""
    path = _tiny_with_tokenizer(tmp_path)
    base = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=path, device="cuda", max_total_tokens=8192) as e:  # bf16, graphs, overlap
        # the reference from the same schedule (a batch of 4, nothing cached): bf16 batches of
        # other shapes run other GEMM kernels, whose roundings may flip a near-tie of these
        # random weights
        ref = e.generate(["Hello"] * 4, base)[3]["output_ids"]
        t = ref[0]
        assert e.flush_cache()
        outs = e.generate(["Hello"] * 4, [{**base, "logit_bias": {t: -100}}, {**base, "logit_bias": {7: 100}},
                                          {**base, "temperature": 1.0, "seed": 3, "logit_bias": {t: -100}}, base])
        assert t not in outs[0]["output_ids"] and outs[1]["output_ids"] == [7] * 6
        assert t not in outs[2]["output_ids"] and outs[3]["output_ids"] == ref
        e.check_integrity()


def test_a_grammar_that_can_only_end_wins_over_min_new_tokens_on_gpu(tmp_path):
    """min_new_tokens clears the stop tokens of grammar rows in their mask, unless the grammar
    allows nothing else: then its end wins (greedy and sampled rows, the fused sampler, beside
    an unconstrained row whose ban is a logits one)."""
    path = _tiny_with_tokenizer(tmp_path)
    with Engine(model_path=path, device="cuda", max_total_tokens=8192) as e:  # bf16, graphs, overlap
        params = [{"regex": "(yes|no)", "min_new_tokens": 5, "temperature": 0},
                  {"choices": ["yes", "no"], "min_new_tokens": 5, "temperature": 1.0, "seed": 2},
                  {"json_schema": {"type": "boolean"}, "min_new_tokens": 4, "temperature": 1.0, "seed": 3},
                  {"min_new_tokens": 6, "temperature": 0}]
        outs = e.generate(["Answer:"] * 4, [{**p, "max_new_tokens": 8} for p in params])
        for o in outs[:3]:
            assert o["meta_info"]["finish_reason"]["type"] == "stop", o["meta_info"]
            assert o["text"] in ("yes", "no", "true", "false"), o["text"]
        assert outs[3]["meta_info"]["completion_tokens"] >= 6
        e.check_integrity()
    # the graphs went at shutdown, not when the garbage collector reaches them (perhaps while a
    # later engine in this process captures its own: the capture then fails)
    assert e.runner.graph_runner is None


def test_ngram_speculation_keeps_greedy_output_on_gpu(tmp_path):
    """Drafts verified in extend steps between graph-replayed, overlapped decode steps."""
    path = _tiny_with_tokenizer(tmp_path)
    prompts = ["hello world hello world hello", "the quick brown fox the quick brown", "0123456789 0123456789 01"]
    params = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    outs, stats = {}, {}
    for algo in ("none", "ngram"):
        # fp32: extend (a verified draft) and decode logits then agree on every argmax
        with Engine(model_path=path, device="cuda", dtype="float32", max_total_tokens=8192,
                    speculative_algorithm=algo, speculative_ngram_size=2) as e:
            outs[algo] = [o["output_ids"] for o in e.generate(prompts, params)]
            stats[algo] = e.get_server_info()
            e.check_integrity()
    assert outs["ngram"] == outs["none"]
    assert stats["ngram"]["spec_draft_tokens"] > 0 and stats["none"]["spec_draft_tokens"] == 0


def test_a_prompt_continuing_an_earlier_reply_reuses_its_kv_on_gpu(tmp_path):
    """Turn 2 of a chat: the prompt is turn 1's prompt, its reply and more. The match crosses
    the prompt's nodes (cached while it ran, from the GPU request table) and the reply's
    (cached at its end): it reuses both, and turn 2 writes what it writes uncached."""
    path = _tiny_with_tokenizer(tmp_path)
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    prompt = list(range(3, 60))
    with Engine(model_path=path, device="cuda", dtype="float32", max_total_tokens=8192) as e:
        first = e.generate(input_ids=prompt, sampling_params=params)
        turn2 = prompt + first["output_ids"] + [7, 8, 9]
        cached = e.generate(input_ids=turn2, sampling_params=params)
        assert cached["meta_info"]["finish_reason"]["type"] == "length", cached["meta_info"]
        assert cached["meta_info"]["cached_tokens"] >= len(prompt) + len(first["output_ids"]) - 1, cached["meta_info"]
        assert {n.value.device.type for n in e.scheduler.tree._iter_nodes()} == {"cpu"}
        e.check_integrity()
        e.flush_cache()
        fresh = e.generate(input_ids=turn2, sampling_params=params)
        assert fresh["meta_info"]["cached_tokens"] == 0
    assert cached["output_ids"] == fresh["output_ids"]


def test_seeded_sampling_is_unchanged_by_drafts_on_gpu(tmp_path):
    """The fused sampler draws row j of a draft verification at output position len + j: a
    seeded sampled request writes the same tokens with jump-forward and n-gram drafts as without."""
    path = _tiny_with_tokenizer(tmp_path)
    prompts = ["A person:", "hello world hello world hello", "Tags:", "the quick brown fox the quick brown"]
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}
    sampled = {"max_new_tokens": 32, "temperature": 0.8, "top_p": 0.95}
    params = [{**sampled, "seed": 1, "json_schema": schema}, {**sampled, "seed": 2, "ignore_eos": True},
              {**sampled, "seed": 3, "regex": "(ab|cd){2,5}!"},
              {**sampled, "seed": 4, "ignore_eos": True, "frequency_penalty": 0.5}]
    outs, stats = {}, {}
    for name, kw in (("plain", {"disable_jump_forward": True}),
                     ("drafts", {"jump_forward_max_batch": 64, "speculative_algorithm": "ngram",
                                 "speculative_ngram_size": 2})):
        with Engine(model_path=path, device="cuda", dtype="float32", max_total_tokens=8192, **kw) as e:
            outs[name] = [o["output_ids"] for o in e.generate(prompts, params)]
            stats[name] = e.get_server_info()
            e.check_integrity()
    assert outs["drafts"] == outs["plain"]
    assert stats["drafts"]["jump_tokens"] > 0 and stats["plain"]["jump_tokens"] == 0


def test_extend_cuda_graphs_keep_greedy_output_on_gpu(tmp_path):
    """Short extends (short prompts, verified jump-forward and n-gram drafts) replay CUDA graphs
    captured per (batch, tokens per request) on first use (cuda_graph_runner.py): greedy
    outputs equal the eager path's, and no KV slot leaks."""
    path = _tiny_with_tokenizer(tmp_path)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "tags": {"type": "array", "items": {"enum": ["a", "bb"]},
                                                        "maxItems": 3}},
              "required": ["name", "tags"]}
    prompts = ["A person:", "hello world hello world hello", "the quick brown fox the quick brown",
               "Tags:", "0123456789 0123456789 01"]
    params = [{"max_new_tokens": 40, "temperature": 0, "json_schema": schema},
              {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True},
              {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True},
              {"max_new_tokens": 24, "temperature": 0, "regex": "(ab|cd){2,5}!"},
              {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}]
    outs, captured = {}, {}
    for ext in (256, 0):
        # fp32: extend and decode logits then agree on every argmax
        with Engine(model_path=path, device="cuda", dtype="float32", max_total_tokens=8192,
                    jump_forward_max_batch=64, speculative_algorithm="ngram", speculative_ngram_size=2,
                    cuda_graph_extend_max_tokens=ext) as e:
            outs[ext] = [o["output_ids"] for o in e.generate(prompts, params)]
            outs[ext] += [o["output_ids"] for o in e.generate(prompts[:1], params[:1])]  # alone: batch 1
            long = " ".join(["the quick brown fox jumps over the lazy dog"] * 5)  # a 32-64 token slot
            outs[ext] += [o["output_ids"] for o in e.generate([long, long[::-1]], params[1:3])]
            captured[ext] = len(e.scheduler.runner.graph_runner.ext_graphs)
            e.check_integrity()
    assert outs[256] == outs[0]
    assert captured[256] >= 2 and captured[0] == 0, captured


def test_mixed_chunk_keeps_greedy_output_on_gpu(tmp_path):
    """Decode tokens riding along in prefill chunks (extend kernels, no graph) give the same
    greedy tokens as separate decode steps (graph-replayed, overlapped)."""
    path = _tiny_with_tokenizer(tmp_path)
    prompts = ["Hi", "Hello there", "word " * 40, "the quick brown fox " * 12]
    params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    outs, stats = {}, {}
    for mixed in (False, True):
        with Engine(model_path=path, device="cuda", dtype="float32", max_total_tokens=8192, chunked_prefill_size=16,
                    enable_mixed_chunk=mixed) as e:
            outs[mixed] = [o["output_ids"] for o in e.generate(prompts, params)]
            stats[mixed] = e.get_server_info()
            e.check_integrity()
    assert outs[True] == outs[False]
    assert stats[True]["mixed_steps"] > 0 and stats[False]["mixed_steps"] == 0


def test_overlap_and_jump_forward_keep_greedy_output_on_gpu(tmp_path):
    """Overlap scheduling (grammar masks filled while the next forward runs) and verified
    jump-forward both leave greedy constrained output unchanged on the GPU."""
    path = _tiny_with_tokenizer(tmp_path)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "tags": {"type": "array", "items": {"enum": ["a", "bb"]},
                                                        "maxItems": 3}},
              "required": ["name", "tags"]}
    prompts = ["A person:", "Another one:", "Hello", "Tags:"]
    params = [{"max_new_tokens": 48, "temperature": 0, "json_schema": schema}] * 2 + [
        {"max_new_tokens": 12, "temperature": 0}, {"max_new_tokens": 24, "temperature": 0, "regex": "(ab|cd){2,5}!"}]
    outs = {}
    jf = {"jump_forward_max_batch": 64}  # on CUDA jump-forward is off unless asked for
    for kw in ({"overlap_schedule": "on", **jf}, {"overlap_schedule": "off", **jf},
               {"overlap_schedule": "on", "disable_jump_forward": True}):
        # fp32: extend (a verified draft) and decode logits then agree on every argmax
        with Engine(model_path=path, device="cuda", dtype="float32", max_total_tokens=8192, **kw) as e:
            outs[tuple(kw.items())] = [o["output_ids"] for o in e.generate(prompts, params)]
            e.check_integrity()
    first, *rest = outs.values()
    for other in rest:
        assert other == first


def test_fp8_kv_cache_triton_graphs_match_torch_backend_on_gpu(tmp_path):
    """An fp8_e5m2 KV cache on the GPU: the Triton path (store, extend and decode kernels, CUDA
    graphs) reads the same fp8 pool as the torch reference backend and gives the same greedy
    tokens; the pool really is fp8 and no slot leaks."""
    path = _save_tiny("tiny-llama", tmp_path)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 49000, (n,), generator=g).tolist() for n in (5, 17, 33, 100, 2)]
    params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    outs = []
    for backend, graphs in (("triton", True), ("torch", False)):
        with Engine(model_path=path, device="cuda", dtype="float32", attention_backend=backend,
                    kv_cache_dtype="fp8_e5m2", max_total_tokens=4096, cuda_graph=graphs,
                    cuda_graph_max_bs=16) as e:
            assert e.runner.kv_pool.dtype == torch.float8_e5m2
            outs.append([o["output_ids"] for o in e.generate(input_ids=prompts, sampling_params=params)])
            e.check_integrity()
    assert outs[0] == outs[1]
    assert all(len(o) == 16 for o in outs[0])
