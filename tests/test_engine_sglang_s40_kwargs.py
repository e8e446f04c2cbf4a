"""SGLang offline-Engine programs pass SGLang's keywords at their defaults; treadle takes them.

`Engine.generate` / `async_generate` take SGLang's keywords (lora_path, image_data,
custom_logit_processor, return_hidden_states, token_ids_logprob, bootstrap_*, ...) at their
defaults, and refuse any other value with a ValueError naming the keyword (never a TypeError);
return_logprob / logprob_start_len / top_logprobs_num take a list of one value per prompt;
`sampling_params` take sampling_seed (treadle's seed) and SGLang's stop_regex, custom_params and
stream_interval at their defaults; `Engine(...)` takes SGLang's server arguments at their
defaults (dp_size=1, grammar_backend="xgrammar", ...) and stream_output (treadle's
incremental_streaming_output). All with the real embedded SmolLM2 on the CPU."""
from __future__ import annotations

import asyncio

import pytest

import treadle as sgl

PROMPTS = ["The capital of France is", "List the first ten prime numbers:"]
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}

# SGLang's Engine.generate keywords at SGLang's defaults
SGLANG_GENERATE_DEFAULTS = dict(image_data=None, audio_data=None, video_data=None, token_ids_logprob=None,
                                lora_path=None, custom_logit_processor=None, return_hidden_states=False,
                                bootstrap_host=None, bootstrap_port=None, bootstrap_room=None,
                                data_parallel_rank=None)


@pytest.fixture(scope="module")
def llm():
    engine = sgl.Engine(max_total_tokens=4096)
    yield engine
    engine.shutdown()


def test_generate_takes_sglangs_keywords_at_their_defaults(llm):
    plain = llm.generate(PROMPTS, GREEDY)
    out = llm.generate(PROMPTS, GREEDY, **SGLANG_GENERATE_DEFAULTS)
    assert [o["text"] for o in out] == [o["text"] for o in plain]
    # per prompt, as SGLang's batch form: a list of defaults
    out = llm.generate(PROMPTS, GREEDY, lora_path=[None, None], image_data=[None, None], data_parallel_rank=0)
    assert [o["text"] for o in out] == [o["text"] for o in plain]
    one = asyncio.run(llm.async_generate(PROMPTS[0], GREEDY, **SGLANG_GENERATE_DEFAULTS))
    assert one["text"] == plain[0]["text"]

    async def stream():
        return [c async for c in await llm.async_generate(PROMPTS[0], GREEDY, stream=True,
                                                          **SGLANG_GENERATE_DEFAULTS)]
    assert asyncio.run(stream())[-1]["text"] == plain[0]["text"]


@pytest.mark.parametrize("name, value", [
    ("lora_path", "my-adapter"), ("lora_path", [None, "my-adapter"]), ("image_data", ["img.png"]),
    ("audio_data", b"\x00"), ("video_data", "v.mp4"), ("custom_logit_processor", "{\"callable\": 1}"),
    ("return_hidden_states", True), ("token_ids_logprob", [1, 2]), ("bootstrap_host", "10.0.0.1"),
    ("bootstrap_port", 8998), ("bootstrap_room", 7), ("data_parallel_rank", 1),
])
def test_generate_refuses_what_it_cannot_do_naming_the_keyword(llm, name, value):
    with pytest.raises(ValueError, match=f"{name}=.* is not supported"):
        llm.generate(PROMPTS, GREEDY, **{name: value})
    with pytest.raises(ValueError, match=f"{name}=.* is not supported"):
        asyncio.run(llm.async_generate(PROMPTS[0], GREEDY, **{name: value}))
    llm.check_integrity()  # nothing was queued, nothing leaked


def test_logprob_keywords_take_one_value_per_prompt(llm):
    out = llm.generate(PROMPTS, GREEDY, return_logprob=[True, False], top_logprobs_num=[2, 0],
                       logprob_start_len=[0, None])
    first, second = (o["meta_info"] for o in out)
    assert len(first["output_token_logprobs"]) == GREEDY["max_new_tokens"]
    assert all(len(tops) == 2 for tops in first["output_top_logprobs"])
    assert len(first["input_token_logprobs"]) == len(llm.encode(PROMPTS[0]))  # from position 0
    assert "output_token_logprobs" not in second and "output_top_logprobs" not in second
    # each prompt's as a call of its own
    alone = llm.generate(PROMPTS[0], GREEDY, return_logprob=True, top_logprobs_num=2, logprob_start_len=0)
    assert [t[1] for t in first["output_token_logprobs"]] == [t[1] for t in alone["meta_info"]["output_token_logprobs"]]
    assert [[t[1] for t in tops] for tops in first["output_top_logprobs"]] == \
        [[t[1] for t in tops] for tops in alone["meta_info"]["output_top_logprobs"]]
    plain = llm.generate(PROMPTS[1], GREEDY)
    assert out[1]["text"] == plain["text"]
    with pytest.raises(ValueError, match="return_logprob: a list of 3 values for 2 prompts"):
        llm.generate(PROMPTS, GREEDY, return_logprob=[True, False, True])
    with pytest.raises(ValueError, match="top_logprobs_num"):
        llm.generate(PROMPTS, GREEDY, return_logprob=True, top_logprobs_num=[1, -3])
    llm.check_integrity()


def test_sampling_params_take_sglangs_fields(llm):
    sampled = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True}
    a = llm.generate(PROMPTS[1], {**sampled, "sampling_seed": 1234})
    b = llm.generate(PROMPTS[1], {**sampled, "sampling_seed": 1234})
    c = llm.generate(PROMPTS[1], {**sampled, "seed": 1234})
    assert a["output_ids"] == b["output_ids"] == c["output_ids"]  # sampling_seed is the request's seed
    others = {tuple(llm.generate(PROMPTS[1], {**sampled, "sampling_seed": s})["output_ids"]) for s in range(1, 5)}
    assert len(others | {tuple(a["output_ids"])}) > 1  # ... which it changes
    # SGLang's fields at their defaults change nothing
    plain = llm.generate(PROMPTS[0], GREEDY)
    same = llm.generate(PROMPTS[0], {**GREEDY, "stop_regex": None, "custom_params": None, "stream_interval": 1})
    assert same["text"] == plain["text"]
    for field, value in [("stop_regex", "[0-9]+"), ("stop_regex", ["a+"]), ("custom_params", {"bias": 1}),
                         ("stream_interval", 8)]:
        with pytest.raises(ValueError, match=f"sampling_params.{field} is not supported"):
            llm.generate(PROMPTS[0], {**GREEDY, field: value})
    with pytest.raises(ValueError, match="sampling_seed 1 and seed 2 differ"):
        llm.generate(PROMPTS[0], {**GREEDY, "sampling_seed": 1, "seed": 2})
    llm.check_integrity()


# SGLang's server arguments at SGLang's defaults (or a backend treadle replaces with its own)
SGLANG_SERVER_DEFAULTS = dict(dp_size=1, enable_torch_compile=False, is_embedding=False, chat_template=None,
                              quantization=None, speculative_algorithm=None, grammar_backend="xgrammar",
                              skip_tokenizer_init=False, load_format="auto", tokenizer_mode="auto", page_size=1,
                              sampling_backend="flashinfer", schedule_conservativeness=1.0, tool_call_parser=None,
                              reasoning_parser=None, stream_interval=1)


@pytest.mark.parametrize("name, value", [
    ("dp_size", 2), ("enable_torch_compile", True), ("is_embedding", True), ("chat_template", "chatml"),
    ("grammar_backend", "my-backend"), ("load_format", "pt"),
    ("tokenizer_mode", "slow"), ("page_size", 16), ("schedule_conservativeness", 0.3),
    ("tool_call_parser", "mistral"), ("stream_interval", 4),  # qwen25 / llama3: the formats the server reads
])
def test_engine_refuses_sglang_server_args_it_cannot_honour(name, value):
    with pytest.raises(ValueError, match=f"SGLang's {name}: .*not supported: {name}="):
        sgl.Engine(**{name: value})  # refused before any model loads


def test_engine_takes_sglang_server_args_at_their_defaults():
    engine = sgl.Engine(max_total_tokens=4096, stream_output=True, **SGLANG_SERVER_DEFAULTS)
    try:
        assert engine.args.incremental_streaming_output  # SGLang's stream_output: disjoint chunks
        whole = engine.generate(PROMPTS[1], GREEDY)
        chunks = list(engine.generate(PROMPTS[1], GREEDY, stream=True))
        assert len(chunks) > 1
        assert "".join(c["text"] for c in chunks) == whole["text"]
        assert sum((c["output_ids"] for c in chunks), []) == whole["output_ids"]
        # grammars compile with treadle's own engine under grammar_backend="xgrammar"
        out = engine.generate(PROMPTS[0], {"temperature": 0, "max_new_tokens": 8, "regex": "(Paris|Lyon)"})
        assert out["text"] in ("Paris", "Lyon")
    finally:
        engine.shutdown()


def test_sglang_reasoning_parser_names_of_a_think_block_are_treadles_think():
    # the one table of SGLang's names serves ServerArgs, Runtime and Engine alike (no model loads here)
    assert sgl.ServerArgs(reasoning_parser="qwen3").reasoning_parser == "think"
    assert sgl.ServerArgs(reasoning_parser=None).reasoning_parser == "none"
    # deepseek-r1 reads an untagged reply as reasoning: treadle's think does not
    with pytest.raises(ValueError, match="reasoning_parser must be one of none, think, got 'deepseek-r1'"):
        sgl.ServerArgs(reasoning_parser="deepseek-r1")


def test_engine_with_skip_tokenizer_init_takes_input_ids_and_gives_output_ids(llm):
    ids = llm.encode(PROMPTS[0])
    want = llm.generate(input_ids=ids, sampling_params=GREEDY)
    engine = sgl.Engine(max_total_tokens=4096, skip_tokenizer_init=True)
    try:
        assert engine.tokenizer is None  # as SGLang's tokenizer_manager.tokenizer
        out = engine.generate(input_ids=ids, sampling_params=GREEDY)
        assert out["output_ids"] == want["output_ids"] and out["text"] == ""
        batch = engine.generate(input_ids=[ids, llm.encode(PROMPTS[1])], sampling_params=GREEDY)
        assert batch[0]["output_ids"] == want["output_ids"]
        chunks = list(engine.generate(input_ids=ids, sampling_params=GREEDY, stream=True))
        assert chunks[-1]["output_ids"] == want["output_ids"]
        with pytest.raises(ValueError, match="skip_tokenizer_init=True\\) takes input_ids, not text"):
            engine.generate(PROMPTS[0], GREEDY)
        # a DSL program on it: a select's scoring says why it cannot run (AttributeError before)
        from treadle.lang.backend_engine import EngineBackend
        backend = EngineBackend(engine)
        with pytest.raises(ValueError, match="skip_tokenizer_init=True"):
            backend.context_token()
        with pytest.raises(ValueError, match="skip_tokenizer_init=True"):
            backend.unconditional_logprobs([[5, 6]])
        engine.check_integrity()
    finally:
        engine.shutdown()


def test_tokenizer_manager_tokenizer_renders_chat_as_sglangs_docs_use_it(llm):
    """SGLang's function-calling doc: `llm.tokenizer_manager.tokenizer.apply_chat_template(...)`
    then `llm.generate(prompt, ...)`: the model's own tokenizer (AttributeError before)."""
    tok = llm.tokenizer_manager.tokenizer
    assert tok is llm.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say hi."}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.rstrip().endswith("assistant")
    out = llm.generate(prompt, GREEDY)
    assert out["text"] and llm.tokenizer_manager.model_path == llm.args.model_path
