"""SGLang programs as SGLang's examples and tests write them (`import treadle as sgl`, nothing else
changed), on the embedded model in process: a state's str() as SGLang's cot_decoding example
reads it, and the executor's `is_finished` its RAG example polls."""
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
