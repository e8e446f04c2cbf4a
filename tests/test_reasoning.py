"""Splitting a reasoning model's <think> block from its answer, finished and streamed (the
server tests in test_server_openai.py run it end to end), and template variables."""
from __future__ import annotations

import copy

import pytest

from treadle.runtime.server.reasoning import ReasoningStream, opens_in_prompt, split


@pytest.mark.parametrize("text, started, reasoning, answer", [
    ("<think>\nStep 1. Step 2.\n</think>\n\nThe answer is 4.", False, "Step 1. Step 2.", "The answer is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("Plain answer <think> inside", False, None, "Plain answer <think> inside"),  # no block first: all answer
    ("<think>cut off by max_tokens", False, "cut off by max_tokens", ""),
    ("opened by the template</think>answer", True, "opened by the template", "answer"),
    ("still thinking", True, "still thinking", ""),
    ("<think></think>", False, "", ""),
])
def test_split(text, started, reasoning, answer):
    assert split(text, started) == (reasoning, answer)


def test_opens_in_prompt():
    assert opens_in_prompt("<|im_start|>assistant\n<think>\n") and not opens_in_prompt("<|im_start|>assistant\n")


def stream(pieces: list[str], started: bool = False) -> tuple[list[str], list[str]]:
    rs, text, reasoning, answers = ReasoningStream(started), "", [], []
    for k, piece in enumerate(pieces):
        text += piece
        new, answer = rs.feed(text, final=k == len(pieces) - 1)
        reasoning.append(new)
        answers.append(answer)
    return reasoning, answers


@pytest.mark.parametrize("pieces, started", [
    (["<th", "ink>\nLet", " me see. ", "</th", "ink>", "\n\nFour."], False),
    (["<think>a <b> c </", "think", ">x"], False),
    (["<", "think>only reasoning, cut"], False),
    (["no block", " at all"], False),
    (["opened ", "by the template", "</think>", " answer"], True),
])
def test_stream_adds_up_to_the_split(pieces, started):
    reasoning, answers = stream(pieces, started)
    want_r, want_a = split("".join(pieces), started)
    assert "".join(reasoning) == (want_r or "") and answers[-1] == want_a
    # the answer only grows, and no reasoning piece carries part of a tag
    assert all(b.startswith(a) for a, b in zip(answers, answers[1:]))
    assert not any("<" in r and "think>" in r for r in reasoning)


def test_stream_waits_while_the_reply_may_open_a_block():
    reasoning, answers = stream(["<", "thi", "nk>x"])
    assert answers == ["", "", ""] and reasoning == ["", "", "x"]
    reasoning, answers = stream(["<", "b>"])  # not a block after all: the answer keeps every character
    assert answers == ["", "<b>"]


def test_chat_template_kwargs_reach_the_template(smollm2_tokenizer):
    from treadle.runtime.tokenizer import apply_chat_template

    tok = copy.copy(smollm2_tokenizer)
    tok.chat_template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                         "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    msgs = [{"role": "user", "content": "hi"}]
    assert apply_chat_template(tok, msgs) == "hi"
    assert apply_chat_template(tok, msgs, enable_thinking=False) == "hi<think></think>"


def test_model_thinks_when_its_vocabulary_has_the_tags(smollm2_tokenizer):
    from treadle.runtime.server.reasoning import model_thinks

    assert not model_thinks(smollm2_tokenizer)  # SmolLM2 never thinks: constraints hold from token one
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.add_tokens(["<think>", "</think>"])  # as Qwen3's and DeepSeek-R1's tokenizers have them
    assert model_thinks(tok) and not model_thinks(None)


def test_a_continued_message_inside_its_block_opens_the_reply():
    """continue_final_message on an assistant message that is partway into its reasoning: the
    reply continues the reasoning (the grammar of a response_format waits for its end; it was
    applied from the first token, writing JSON inside the block)."""
    assert opens_in_prompt("<|im_start|>assistant\n<think>\n")
    assert opens_in_prompt("...<think>\nLet me think.", "<think>\nLet me think.")
    assert not opens_in_prompt("...<think>\nLet me think.")  # not continued: the text is the template's
    assert not opens_in_prompt("...<think>a</think>b", "<think>a</think>b")
    assert not opens_in_prompt("... no tags", "no tags")
    assert opens_in_prompt("...", "<think>x</think> then <think>again")
