"""Reasoning output as SGLang splits it: `sgl.separate_reasoning` in a program, and SGLang's
`ReasoningParser` on an offline Engine's output (its separate_reasoning doc), on the embedded
model (a regex makes it write a thinking block laid out as reasoning models do)."""
from __future__ import annotations

import re

import pytest

import treadle as sgl

# the layout Qwen3 and DeepSeek-R1 write: "<think>\n...\n</think>\n\nanswer"
BLOCK = r"<think>\n[a-z ]{3,20}\n</think>\n\n[A-Z][a-z]{2,10}"


@pytest.fixture(scope="module")
def llm():
    eng = sgl.Engine(max_total_tokens=8192)
    yield eng
    eng.shutdown()


def test_separate_reasoning_strips_as_sglangs_parser(llm):
    """SGLang's parser strips the text around the block (`processed_text.strip()`) and the answer
    after it: the answer of "<think>\\n...\\n</think>\\n\\nParis" is "Paris". Here it kept "\\n\\nParis"
    and a reasoning starting with a newline."""
    @sgl.function
    def basic_qa_separate_reasoning(s, question):
        s += sgl.system("You are a helpful assistant than can answer questions.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("answer", max_tokens=40, regex=BLOCK),
                                                  model_type="qwen3"))

    state = basic_qa_separate_reasoning.run("What is the capital of France?", temperature=0, backend=llm)
    answer, reasoning = state["answer"], state["answer_reasoning_content"]
    assert re.fullmatch(r"[A-Z][a-z]{2,10}", answer), answer
    assert re.fullmatch(r"[a-z ]{0,20}\n", reasoning) and not reasoning.startswith(" "), reasoning
    assert state.messages()[-1] == {"role": "assistant", "content": answer}
    assert "think>" not in state.text()


def test_reasoning_parser_on_an_offline_engine_output(llm):
    """SGLang's doc: `from sglang.srt.parser.reasoning_parser import ReasoningParser` (older:
    sglang.srt.reasoning_parser), `parser.parse_non_stream(generated_text)` -> (reasoning, text).
    Neither module existed."""
    from treadle.srt.parser.reasoning_parser import ReasoningParser
    from treadle.srt.reasoning_parser import ReasoningParser as older_path

    assert older_path is ReasoningParser
    sampling_params = {"temperature": 0, "max_new_tokens": 40, "regex": BLOCK}
    generated_text = llm.generate("What is the capital of France? Think first.", sampling_params)["text"]
    parser = ReasoningParser(model_type="qwen3")
    reasoning_text, text = parser.parse_non_stream(generated_text)
    assert generated_text.startswith("<think>\n") and re.fullmatch(r"[A-Z][a-z]{2,10}", text)
    assert reasoning_text == generated_text[len("<think>\n"):generated_text.index("</think>")]

    # streamed (each chunk holds the text so far, as SGLang's), the deltas split into the same
    # reasoning and answer
    parser = ReasoningParser(model_type="qwen3")
    reasoning, answer, so_far = "", "", ""
    for chunk in llm.generate("What is the capital of France? Think first.", sampling_params, stream=True):
        r, a = parser.parse_stream_chunk(chunk["text"][len(so_far):])
        reasoning, answer, so_far = reasoning + r, answer + a, chunk["text"]
    assert reasoning.strip() == reasoning_text.strip() and answer.strip() == text

    # DeepSeek-R1's template opens the block: its reply starts inside it
    assert ReasoningParser("deepseek-r1").parse_non_stream("a plan\n</think>\n\nDone") == ("a plan\n", "Done")
    assert ReasoningParser("qwen3").parse_non_stream("no block here ") == ("", "no block here ")
    assert ReasoningParser("qwen3").parse_non_stream("<think>cut short ") == ("cut short", "")
    held = ReasoningParser("deepseek-r1", stream_reasoning=False)
    assert [held.parse_stream_chunk(c) for c in ["Let me", " think", "</think>", "Four."]] == [
        ("", ""), ("", ""), ("Let me think", ""), ("", "Four.")]
    with pytest.raises(ValueError, match="Unsupported model type"):
        ReasoningParser("no-such-model")
    with pytest.raises(ValueError, match="Model type must be specified"):
        ReasoningParser()
