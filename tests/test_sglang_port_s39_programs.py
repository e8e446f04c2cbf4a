"""SGLang programs as SGLang's examples and tests write them (`import treadle as sgl`, nothing else
changed), on the embedded model in process: a state's str() as SGLang's cot_decoding example
reads it, the executor's `is_finished` its RAG example polls, and `sglang.lang.chat_template`
(named templates on a backend, SGLang's BaseBackend for tracing with one)."""
from __future__ import annotations

from math import exp

import pytest

import treadle as sgl


@pytest.fixture(scope="module")
def engine():
    eng = sgl.Engine(max_total_tokens=8192)
    sgl.set_default_backend(eng)
    yield eng
    sgl.global_config.default_backend = None
    eng.shutdown()


# SGLang's examples/frontend_language/usage/cot_decoding.py, shortened (fewer paths and tokens)
@sgl.function
def cot_decoding(s, question, get_top_k, is_chat_model, verbose):
    """CoT Decoding: http://arxiv.org/abs/2402.10200"""
    if is_chat_model:
        s += sgl.user("Question: " + question + "\nAnswer:")
        s += sgl.assistant_begin()
    else:
        s += "Question: " + question + "\nAnswer:"

    step_0 = s.fork(1)[0]
    forks = s.fork(get_top_k)
    answer_forks = s.fork(get_top_k)

    step_0 += sgl.gen("get_top_k", max_tokens=0, return_logprob=True, top_logprobs_num=get_top_k,
                      return_text_in_logprobs=True)
    logprobs = step_0.get_meta_info("get_top_k")["output_top_logprobs"][0]

    texts = []
    for idx, (f, token) in enumerate(zip(forks, logprobs)):
        logprob, token_id, text = token
        f += text
        f += sgl.gen("answer", temperature=0, max_tokens=8, return_logprob=True, top_logprobs_num=2,
                     return_text_in_logprobs=True)
        x1s = [exp(xt[0][0]) for xt in f.get_meta_info("answer")["output_top_logprobs"]]
        x2s = [exp(xt[1][0]) for xt in f.get_meta_info("answer")["output_top_logprobs"]]
        assert (sum(x1s) - sum(x2s)) / len(x1s) >= 0
        answer_forks[idx] += text + f["answer"] + "\nSo the answer is"
        answer_forks[idx] += sgl.gen("answer_span", temperature=0, max_tokens=8, return_logprob=True,
                                     top_logprobs_num=2, return_text_in_logprobs=True)
        generated_text = str(answer_forks[idx])[len("ProgramState("):-1]
        texts.append((generated_text, answer_forks[idx].text()))
    return texts


def test_str_of_a_state_is_programstate_of_its_text(engine):
    """SGLang's ProgramState repr is `ProgramState(<text>)`; its cot_decoding example cuts the text
    out of str(state). Before, it was `ProgramState(text='<last 60 characters>', variables=[...])`."""
    state = cot_decoding.run(question="Claire makes a 3 egg omelet every morning. How many eggs in a week?",
                             get_top_k=2, is_chat_model=True, verbose=False)
    assert len(state.ret_value) == 2
    for generated_text, text in state.ret_value:
        assert generated_text == text and "\nSo the answer is" in text
    assert repr(state) == f"ProgramState({state.text()})"


# SGLang's examples/frontend_language/usage/rag_using_parea: a program with *context, run with the
# arguments in order, polled until its executor is finished
@sgl.function
def generation_sglang(s, question: str, *context: str):
    context = "\n".join(context)
    s += sgl.user(f"Given this question:\n{question}\n\nAnd this context:\n{context}\n\nAnswer the question.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=12))


def test_stream_executor_is_finished_as_sglangs_rag_example_polls_it(engine):
    import time

    def generation(question: str, *context):
        state = generation_sglang.run(question, *context)
        while not state.stream_executor.is_finished:
            time.sleep(0.05)
        return state.stream_executor.variables["answer"]

    assert generation("What is the capital of France?", "France's capital is Paris.", "It is big.")

    state = generation_sglang.run("Why is the sky blue?", "Light scatters.", stream=True, temperature=0)
    state.sync()
    assert state.stream_executor.is_finished and state["answer"]

    @sgl.function
    def fails(s):
        s += "x" + sgl.gen("a", max_tokens=2)
        raise RuntimeError("boom")

    failed = fails.run(stream=True)
    deadline = time.monotonic() + 60
    while not failed.stream_executor.is_finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failed.stream_executor.is_finished and isinstance(failed.error(), RuntimeError)


# SGLang's test/lang/test_tracing.py, test_role: a BaseBackend with a named template, for compile
@sgl.function
def multi_turn_chat(s):
    s += sgl.user("Who are you?")
    s += sgl.assistant(sgl.gen("answer_1"))
    s += sgl.user("Who created you?")
    s += sgl.assistant(sgl.gen("answer_2"))


def test_base_backend_with_a_named_template_traces_roles_as_sglang():
    """`BaseBackend()` failed (an abstract class), `backend.chat_template = ...` had no setter and
    `get_chat_template` did not exist. The llama-2 template puts a first system message in the
    first user turn, as SGLang's get_prompt does."""
    from treadle.lang.backend.base_backend import BaseBackend
    from treadle.lang.chat_template import ChatTemplateStyle, get_chat_template

    backend = BaseBackend()
    assert backend.chat_template is get_chat_template("default") and backend.get_chat_template().name == "default"
    backend.chat_template = get_chat_template("llama-2-chat")
    compiled = multi_turn_chat.compile(backend=backend)
    assert "RoleBegin('user')" in compiled.print_graph()
    assert compiled.trace.text() == "[INST] Who are you? [/INST]{answer_1} </s><s>[INST] Who created you? [/INST]" \
                                    "{answer_2} </s><s>"

    @sgl.function
    def with_system(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Hi")
        s += sgl.assistant("Hello")
        s += sgl.user("Bye")

    template = get_chat_template("llama-2-chat")
    assert template.style is ChatTemplateStyle.LLAMA2
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    assert with_system.trace(backend=backend).text() == template.get_prompt(messages) == (
        "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello </s><s>[INST] Bye [/INST]")
    with pytest.raises(TypeError, match="get_chat_template"):
        backend.chat_template = "chatml"
    with pytest.raises(KeyError, match="chatml"):
        get_chat_template("no-such-template")
    with pytest.raises(NotImplementedError, match="serves no model"):
        multi_turn_chat.run(backend=backend)


def test_sglang_template_names_and_model_path_matching():
    from treadle.lang.chat_template import get_chat_template, get_chat_template_by_model_path

    # SGLang's registry names and the matching its RuntimeEndpoint does by model path
    assert get_chat_template("chatml").role_prefix_and_suffix["user"] == ("<|im_start|>user\n", "<|im_end|>\n")
    assert get_chat_template("qwen").default_system_prompt == "You are a helpful assistant."
    assert get_chat_template("llama-3-instruct").stop_str == ("<|eot_id|>",)
    assert get_chat_template_by_model_path("meta-llama/Meta-Llama-3.1-8B-Instruct").name == "llama-3-instruct"
    assert get_chat_template_by_model_path("Qwen/Qwen2.5-7B-Instruct").name == "qwen"
    assert get_chat_template_by_model_path("meta-llama/Llama-2-7b-chat-hf").name == "llama-2-chat"
    assert get_chat_template_by_model_path("deepseek-ai/DeepSeek-V3").name == "deepseek-v3"
    assert get_chat_template_by_model_path("HuggingFaceTB/SmolLM2-135M-Instruct").name == "default"


@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=16))


def test_a_named_template_on_the_default_backend_renders_roles_and_adds_its_stop_strings(engine):
    """A named template set on a backend renders the roles (a default system prompt becomes a
    system message, as SGLang's), and its stop_str joins every gen's stop strings, as SGLang's
    _resolve_sampling_params does; the model's own template adds none."""
    from treadle.lang.chat_template import (ChatTemplate, chat_template_registry, get_chat_template,
                                            register_chat_template)

    plain = qa.run(question="Name three colors.", temperature=0)
    assert " " in plain["answer"]  # no stop strings from the model's own template

    backend = sgl.global_config.default_backend
    register_chat_template(ChatTemplate("s39-chatml-space", "You are terse.",
                                        get_chat_template("chatml").role_prefix_and_suffix, stop_str=(" ",)))
    try:
        backend.chat_template = get_chat_template("s39-chatml-space")
        state = qa.run(question="Name three colors.", temperature=0)
    finally:
        backend._template = None  # the model's own again
        del chat_template_registry["s39-chatml-space"]
    assert state.messages()[0] == {"role": "system", "content": "You are terse."}
    assert state.text().startswith("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n"
                                   "Name three colors.<|im_end|>\n<|im_start|>assistant\n")
    assert " " not in state["answer"] and state.get_meta_info("answer")["finish_reason"]["matched"] == " "
    assert qa.run(question="Name three colors.", temperature=0)["answer"] == plain["answer"]


def test_run_batch_argument_tuples_and_bind_are_checked_against_the_signature(engine):
    """SGLang's run_batch raises "Given arguments mismatch the SGL function signature" for an
    argument tuple shorter than the required parameters, before running any; here each run
    failed on its own with a TypeError kept on its state. SGLang's bind asserts each name is a
    parameter; here an unknown one was taken and every run failed later."""
    @sgl.function
    def p(s, a, b, c="!"):
        s += a + b + c + sgl.gen("x", max_tokens=2)

    with pytest.raises(ValueError, match="mismatch the program's signature"):
        p.run_batch([("one", "two"), ("one",)])
    with pytest.raises(ValueError, match="mismatch the program's signature"):
        p.run_batch([("one", "two", "three", "four")])
    states = p.run_batch([("Hi", " there"), ("Hi", " there", "?")], temperature=0)
    assert all(st.error() is None and st["x"] for st in states)
    assert states[1].text().startswith("Hi there?")
    with pytest.raises(ValueError, match="no such parameter"):
        p.bind(zzz=1)
    bound = p.bind(b=" you")  # a bound parameter need not be in the tuples
    assert bound.run_batch([("Hey",)], temperature=0)[0].text().startswith("Hey you!")

    @sgl.function
    def takes_any(s, **kwargs):
        s += kwargs["greeting"] + sgl.gen("x", max_tokens=2)

    assert takes_any.bind(greeting="Hello").run(temperature=0)["x"]
