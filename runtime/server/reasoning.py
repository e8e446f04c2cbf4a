"""A reasoning model's thinking, kept apart from its answer (`--reasoning-parser think`).

Qwen3, QwQ, DeepSeek-R1 and their kind write their reasoning between `<think>` and
`</think>`, then the answer. With the parser on, /v1/chat/completions returns the reasoning
as `message.reasoning_content` (streamed as `delta.reasoning_content`) and only the answer
as `content`, as SGLang and vLLM do; tool calls are parsed from the answer alone. A chat
template that opens the block itself (the prompt ends in `<think>`, as DeepSeek-R1's does)
starts the reply inside it. A reply cut by `max_tokens` inside the block is all reasoning.
A request keeps the raw text with `separate_reasoning: false`.

A constraint (response_format, a grammar, a tool choice) then holds for the answer only: the
block before it stays free (constrained/ebnf/reasoning_prefix.py), when the template opened the
block or the model has `<think>` tokens (`model_thinks`); a grammar that names `</think>`
itself holds from the first token.
"""
from __future__ import annotations

from treadle.constrained.ebnf.reasoning_prefix import CLOSE, OPEN
from treadle.runtime.detokenizer import partial_suffix_len

_thinks: dict[int, tuple[object, bool]] = {}


def model_thinks(tokenizer: object) -> bool:
    """Whether the model writes thinking blocks: its vocabulary has `<think>` and `</think>`
    as tokens of their own (Qwen3, QwQ and DeepSeek-R1 do). Cached per tokenizer."""
    hit = _thinks.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        vocab = tokenizer.get_vocab() if tokenizer is not None and hasattr(tokenizer, "get_vocab") else {}
        hit = _thinks[id(tokenizer)] = (tokenizer, OPEN in vocab and CLOSE in vocab)
    return hit[1]


def opens_in_prompt(prompt: str, continued: str | None = None) -> bool:
    """The reply starts inside the block: the template opened it, or the assistant message
    the reply continues (``continued``, with continue_final_message) left one open."""
    if prompt.rstrip().endswith(OPEN):
        return True
    return continued is not None and continued.rfind(OPEN) > continued.rfind(CLOSE)


def split(text: str, started: bool) -> tuple[str | None, str]:
    """(reasoning, answer) of a reply; reasoning is None when the reply has no block."""
    body = text
    if not started:
        lead = text.lstrip()
        if not lead.startswith(OPEN):
            return None, text
        body = lead[len(OPEN):]
    end = body.find(CLOSE)
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(CLOSE):].lstrip()


class ReasoningStream:
    """One streamed reply: how much of its reasoning is new, and its answer so far."""

    def __init__(self, started: bool) -> None:
        self.started = started
        self.sent = 0  # characters of the (stripped) reasoning already sent

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(new reasoning, the answer so far) given all of the reply so far, `text`."""
        if not self.started and not final:
            lead = text.lstrip()
            if len(lead) < len(OPEN) and OPEN.startswith(lead):
                return "", ""  # may still become "<think>": wait
        reasoning, answer = split(text, self.started)
        if reasoning is None:
            return "", answer
        if not final and not answer and CLOSE not in text:
            # hold back what may be the start of "</think>", and trailing whitespace, which the
            # finished reasoning drops
            reasoning = reasoning[:len(reasoning) - partial_suffix_len(reasoning, CLOSE)].rstrip()
        new, self.sent = reasoning[self.sent:], max(self.sent, len(reasoning))
        return new, answer
