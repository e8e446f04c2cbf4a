"""SGLang programs as SGLang's docs and examples write them (`import treadle.lang as sgl`, nothing
else changed), run in process (`sgl.Engine`) and over HTTP (a server this module starts with
`sgl.Runtime`): the keys they read from meta info and server info, and their streaming."""
from __future__ import annotations

import asyncio
import os
import re

import pytest

import treadle.lang as sgl


@pytest.fixture(scope="module")
def engine():
    eng = sgl.Engine(max_total_tokens=8192)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def runtime(sgl_runtime):  # conftest's shared Runtime
    return sgl_runtime


@pytest.fixture(scope="module", params=["engine", "http"])
def backend(request, sgl_runtime):  # named here, so conftest sees this module among the Runtime's users
    be = request.getfixturevalue(request.param if request.param == "engine" else "runtime")
    sgl.set_default_backend(be)
    yield be
    sgl.global_config.default_backend = None


# SGLang's examples/frontend_language/usage/choices_logprob.py, unchanged but for the import
@sgl.function
def tool_use(s, question):
    s += "To answer this question: " + question + ", "
    s += "I need to use a " + sgl.gen("tool", choices=["calculator", "search engine"])


def _check_choice_entries(entries, choices):
    """SGLang's input_token_logprobs of a select: per choice, (logprob, token id, token text)
    for the tokens that spell the choice."""
    assert isinstance(entries, list) and len(entries) == len(choices)
    for choice, toks in zip(choices, entries):
        assert toks and all(len(t) == 3 for t in toks)
        assert all(isinstance(lp, float) and lp <= 0 and isinstance(tid, int) for lp, tid, _ in toks)
        assert "".join(text for _, _, text in toks).endswith(choice)


def test_choices_logprob_example_reads_sglang_keys(backend):
    state = tool_use.run("What is 5 + 5?")
    meta = state.get_meta_info("tool")
    choices = ["calculator", "search engine"]
    _check_choice_entries(meta["input_token_logprobs"], choices)
    means = [sum(lp for lp, _, _ in toks) / len(toks) for toks in meta["input_token_logprobs"]]
    assert meta["normalized_prompt_logprobs"] == pytest.approx(means)
    assert state["tool"] == choices[max(range(2), key=lambda i: means[i])]
    assert meta["output_token_logprobs"] == [[], []]  # nothing is generated after a choice
    assert meta["scores"] == pytest.approx(meta["normalized_prompt_logprobs"])  # treadle's keys stay
    assert meta["token_logprobs"] == [[lp for lp, _, _ in toks] for toks in meta["input_token_logprobs"]]

    states = tool_use.run_batch([{"question": q} for q in ["What is 5 + 6?", "Who is Michael Jordan?"]])
    for st in states:
        _check_choice_entries(st.get_meta_info("tool")["input_token_logprobs"], choices)


def test_select_meta_of_the_other_choices_methods(backend):
    """SGLang's greedy method adds greedy_logprob_matrix; the unconditional one adds
    unconditional_token_logprobs (per choice, entries as input_token_logprobs) and
    normalized_unconditional_prompt_logprobs (the score it picks by)."""
    @sgl.function
    def sky(s):
        s += "The sky is" + sgl.select("g", [" blue", " green tea"], choices_method=sgl.greedy_token_selection)
        s += ". The grass is" + sgl.select("u", [" green", " blue"],
                                           choices_method=sgl.unconditional_likelihood_normalized)

    state = sky.run()
    g = state.get_meta_info("g")
    _check_choice_entries(g["input_token_logprobs"], [" blue", " green tea"])
    lps = [[lp for lp, _, _ in toks] for toks in g["input_token_logprobs"]]
    width = max(map(len, lps))
    want = [row + [sum(row) / len(row)] * (width - len(row)) for row in lps]
    assert [pytest.approx(row) for row in want] == g["greedy_logprob_matrix"]
    u = state.get_meta_info("u")
    _check_choice_entries(u["input_token_logprobs"], [" green", " blue"])
    _check_choice_entries(u["unconditional_token_logprobs"], [" green", " blue"])
    gains = [sum(c - a for (c, _, _), (a, _, _) in zip(cond, alone)) / len(cond)
             for cond, alone in zip(u["input_token_logprobs"], u["unconditional_token_logprobs"])]
    assert u["normalized_unconditional_prompt_logprobs"] == pytest.approx(gains)
    assert state["u"] == [" green", " blue"][max(range(2), key=lambda i: gains[i])]


def test_server_info_has_sglang_top_level_keys(backend):
    info = sgl.get_server_info()
    # SGLang's test_programs.test_gen_min_new_tokens reaches the default Runtime's endpoint so
    # (an AttributeError here before: the default backend is the endpoint itself)
    endpoint = sgl.global_config.default_backend.endpoint
    assert endpoint is sgl.get_default_backend()
    if isinstance(endpoint, sgl.RuntimeEndpoint):
        assert endpoint.get_model_name() == info["model_path"]
    assert isinstance(info["version"], str) and info["version"]
    assert isinstance(info["model_path"], str) and os.path.exists(info["model_path"])  # the resolved model file
    assert info["max_total_tokens"] == 8192
    assert "prompt_tokens" in info and "cache_hit_rate" in info  # treadle's counters stay
    assert "api_key" not in info  # a key is no server information (the server leaves it out too)


@sgl.function
def numbered(s):
    for i in range(3):
        s += f"\nItem {i + 1}:" + sgl.gen("item", max_tokens=4, stop="\n")
    with s.var_scope("all"):
        s += " done"
    s["note"] = "set by the program"


def test_text_iter_of_a_name_written_again(backend):
    """Without stream=True SGLang's text_iter(var) yields the variable's value once (what
    s[var] reads: the last gen's); it yielded every gen's value, and nothing for a var_scope
    or s[var] = value variable. With stream=True treadle yields the deltas of every gen of the
    name, in order (SGLang's keeps one offset across the gens: see the porting doc)."""
    state = numbered.run(temperature=0)
    items = [line.split(":", 1)[1] for line in state.text().split("\n")[1:]]
    assert items[-1].endswith(" done") and items[-1][:-len(" done")] == state["item"]
    assert list(state.text_iter("item")) == [state["item"]]
    assert list(state.text_iter("all")) == [" done"] and list(state.text_iter("note")) == ["set by the program"]

    async def collect(st, name):
        return [x async for x in st.text_async_iter(name, return_meta_data=True)]

    # not streamed, the value alone, return_meta_data or not, as SGLang's (it yielded (value, meta))
    assert asyncio.run(collect(state, "item")) == [state["item"]]

    # without a variable name the text comes alone, return_meta_data or not (it yielded
    # (text, meta) pairs, None for the program's own text)
    for stream in (False, True):
        st = numbered.run(temperature=0, stream=stream)
        pieces = asyncio.run(collect(st, None))
        assert all(isinstance(p, str) for p in pieces) and "".join(pieces) == st.text()

    streamed = numbered.run(temperature=0, stream=True)
    assert "".join(streamed.text_iter("item")) == "".join(items[:2]) + streamed["item"]
    assert "".join(text for text, _ in asyncio.run(collect(streamed, "item"))) == "".join(items[:2]) + streamed["item"]


def test_separate_reasoning(backend):
    """SGLang's frontend reasoning example: sgl.separate_reasoning(gen("answer"), model_type=...)
    leaves the answer in `answer`, the thinking in `answer_reasoning_content`, and the block out
    of the text and the message (a regex makes the small model write a block)."""
    @sgl.function
    def basic_qa_separate_reasoning(s, question, model_type, regex):
        s += sgl.system("You are a helpful assistant than can answer questions.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("answer", max_tokens=40, regex=regex),
                                                  model_type=model_type))
        s += sgl.user("Thanks.") + sgl.assistant(sgl.gen("bye", max_tokens=3))

    question = "What is the capital of France?"
    for model_type, regex in [("qwen3", r"<think>[a-z ]{3,20}</think>[A-Z][a-z]{2,10}"),
                              ("deepseek-r1", r"[a-z ]{3,20}</think>[A-Z][a-z]{2,10}")]:
        state = basic_qa_separate_reasoning(question, model_type, regex, temperature=0)
        answer, reasoning = state["answer"], state["answer_reasoning_content"]
        assert re.fullmatch(r"[A-Z][a-z]{2,10}", answer) and re.fullmatch(r"[a-z ]{3,20}", reasoning)
        assert state.messages()[2] == {"role": "assistant", "content": answer}
        assert "think>" not in state.text() and reasoning not in state.text()
        assert state["bye"] and state.messages()[-1] == {"role": "assistant", "content": state["bye"]}

    state = basic_qa_separate_reasoning(question, "qwen3", r"[A-Z][a-z]{2,10}", temperature=0)
    assert state["answer_reasoning_content"] == "" and state.messages()[2]["content"] == state["answer"]
    with pytest.raises(ValueError, match="model_type"):
        sgl.separate_reasoning(sgl.gen("x"))
    with pytest.raises(ValueError, match="named"):
        sgl.separate_reasoning(sgl.gen(), model_type="qwen3")


def test_split_reasoning_as_sglang_parsers():
    from treadle.lang.reasoning import split_reasoning

    assert split_reasoning("<think>a</think>b", "qwen3") == ("a", "b")
    assert split_reasoning("no block", "qwen3") == ("", "no block")
    assert split_reasoning("a</think>b", "deepseek-r1") == ("a", "b")  # its template opens the block
    assert split_reasoning("cut short", "deepseek-r1") == ("cut short", "")
    assert split_reasoning("\u25c1think\u25b7a\u25c1/think\u25b7b", "Kimi") == ("a", "b")


def test_messages_strip_leading_whitespace_as_sglang(backend):
    """SGLang's messages() holds each message's text with its leading whitespace stripped (the
    prompt text keeps it); treadle's kept it."""
    @sgl.function
    def chat(s):
        s += sgl.system("\n Be brief.")
        s += sgl.user("  What is the capital of France?")
        s += sgl.assistant(" The capital is" + sgl.gen("city", max_tokens=3, stop="."))

    state = chat(temperature=0)
    assert state.messages() == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "What is the capital of France?"},
                                {"role": "assistant", "content": "The capital is" + state["city"]}]
    assert "<|im_start|>user\n  What is the capital of France?<|im_end|>" in state.text()


def test_stream_logprobs_as_sglang_test_programs(backend):
    """SGLang's test_programs.test_stream_logprobs: each chunk's meta from
    text_async_iter(var, return_meta_data=True) has only that chunk's output_token_logprobs and
    output_token_logprobs_length counting them all (the chunks had every logprob so far, and
    no length key); get_meta_info keeps them all."""
    @sgl.function
    def qa(s, question):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", return_logprob=True, top_logprobs_num=2))

    async def collect_chunks():
        ret = qa(question="Compose a short travel blog post about Hawaii.", stream=True, temperature=0,
                 max_new_tokens=16, ignore_eos=True)
        return ret, [x async for x in ret.text_async_iter("answer", return_meta_data=True)]

    state, chunks = asyncio.run(collect_chunks())
    assert len(chunks) > 1
    prev_completion_tokens = prev_length = 0
    for chunk_text, meta_info in chunks:
        assert chunk_text
        completion_tokens, length = meta_info["completion_tokens"], meta_info["output_token_logprobs_length"]
        assert completion_tokens == length
        assert len(meta_info["output_token_logprobs"]) == completion_tokens - prev_completion_tokens
        assert len(meta_info["output_top_logprobs"]) == length - prev_length
        prev_completion_tokens = prev_length = completion_tokens
    full = state.get_meta_info("answer")
    assert [t for _, meta in chunks for t in meta["output_token_logprobs"]] == full["output_token_logprobs"]
    assert len(full["output_token_logprobs"]) == full["completion_tokens"] == 16
