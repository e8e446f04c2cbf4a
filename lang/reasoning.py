"""`separate_reasoning`: a reasoning model's thinking block split off a generated variable.

As SGLang's `sgl.separate_reasoning(gen("answer"), model_type="deepseek-r1")`: after the gen,
variable `answer` holds the answer alone, `answer_reasoning_content` the reasoning, and the
block leaves the prompt text (so a role's message has the answer only). The model types are
SGLang's reasoning parsers that mark the block with a pair of tags; a "forced" one (DeepSeek-R1's
template opens the block itself) reads a reply that never writes the opening tag as starting
inside it.
"""
from __future__ import annotations

from typing import Any

from treadle.lang import ir

_THINK = ("<think>", "</think>")
# SGLang's model_type -> (opening tag, closing tag, the reply starts inside the block)
REASONING_MODEL_TYPES: dict[str, tuple[str, str, bool]] = {
    **{name: (*_THINK, True) for name in ("deepseek-r1", "qwen3-thinking", "minimax", "step3", "step3p5",
                                          "gigachat35")},
    **{name: (*_THINK, False) for name in ("qwen3", "deepseek-v3", "glm45", "dots", "nanbeige", "interns1",
                                           "mimo")},
    "kimi": ("\u25c1think\u25b7", "\u25c1/think\u25b7", False),
}


def reasoning_name(name: str) -> str:
    """The variable that holds `name`'s reasoning, as SGLang names it."""
    return f"{name}_reasoning_content"


def split_reasoning(text: str, model_type: str, force: bool | None = None) -> tuple[str, str]:
    """(reasoning, answer) of `text`, as SGLang's reasoning parser's one-time parse
    (detect_and_parse) splits it: no block gives ("", text) unchanged; otherwise every opening
    tag is dropped and the rest stripped, the reasoning is what comes before the closing tag and
    the answer what follows it, stripped; a block never closed (cut by max_tokens) is all
    reasoning. `force` (None: the model type's own) reads a reply as starting inside the block."""
    start, end, forced = REASONING_MODEL_TYPES[_model_type(model_type)]
    if not (forced if force is None else force) and start not in text:
        return "", text
    body = text.replace(start, "").strip()
    if end not in body:
        return body, ""
    reasoning, answer = body.split(end, 1)
    return reasoning, answer.strip()


class ReasoningParser:
    """SGLang's `sglang.srt.reasoning_parser.ReasoningParser` (also `sglang.srt.parser.
    reasoning_parser`), for a tagged thinking block (the model types of
    REASONING_MODEL_TYPES): `parse_non_stream(text)` gives (reasoning, answer) as
    separate_reasoning splits a gen; `parse_stream_chunk(delta)` the new (reasoning, answer)
    text of each streamed delta, holding back the end of one that may begin a tag (a tag the
    model spells in several tokens comes in several deltas).
    `stream_reasoning=False` holds the reasoning back until the block closes (the reasoning
    text then comes whole); `force_reasoning` reads the reply as starting inside the block
    (None: the model type's own, as SGLang's)."""

    def __init__(self, model_type: str | None = None, stream_reasoning: bool = True,
                 force_reasoning: bool | None = None) -> None:
        if not model_type:
            raise ValueError("Model type must be specified")
        if not isinstance(model_type, str) or model_type.lower() not in REASONING_MODEL_TYPES:
            raise ValueError(f"Unsupported model type: {model_type} (treadle knows the tagged thinking blocks "
                             f"of {', '.join(REASONING_MODEL_TYPES)})")
        self.model_type = model_type.lower()
        self.think_start_token, self.think_end_token, forced = REASONING_MODEL_TYPES[self.model_type]
        self.force_reasoning = forced if force_reasoning is None else bool(force_reasoning)
        self.stream_reasoning = stream_reasoning
        self._in_reasoning = self.force_reasoning
        self._stripped_start = False
        self._buffer = ""
        self._held = ""  # reasoning held back (stream_reasoning=False) until the block closes

    def parse_non_stream(self, full_text: str) -> tuple[str, str]:
        """(reasoning text, answer text) of a whole reply."""
        return split_reasoning(full_text, self.model_type, self.force_reasoning)

    def parse_stream_chunk(self, chunk_text: str) -> tuple[str, str]:
        """(new reasoning text, new answer text) after one more streamed delta."""
        self._buffer += chunk_text
        text = self._buffer
        start, end = self.think_start_token, self.think_end_token
        if not self._stripped_start and start in text:
            text = text.replace(start, "")
            self._stripped_start = True
            self._in_reasoning = True
        if self._in_reasoning and end in text:
            idx = text.find(end)
            reasoning = self._held + text[:idx]
            self._buffer = self._held = ""
            self._in_reasoning = False
            return reasoning.rstrip(), text[idx + len(end):]
        # a tag the model spells in several tokens ("</", "think", ">") comes in several deltas:
        # hold back text that may begin one, to read it with the next delta: the opening tag
        # while all the text so far may begin it (a reply starts with it), and inside the block
        # the end of the text that may begin the closing tag
        if not self._stripped_start and start.startswith(text) and start != text:
            keep = len(text)
        else:
            keep = max((n for n in range(1, len(end)) if self._in_reasoning and text.endswith(end[:n])), default=0)
        text, self._buffer = text[:len(text) - keep], text[len(text) - keep:]
        if not text:
            return "", ""
        if self._in_reasoning:
            if self.stream_reasoning:
                return text, ""
            self._held += text
            return "", ""
        return "", text


def _model_type(model_type: Any) -> str:
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"separate_reasoning needs model_type=, one of {', '.join(REASONING_MODEL_TYPES)}; "
                         f"got {model_type!r}")
    key = model_type.lower()
    if key not in REASONING_MODEL_TYPES:
        raise ValueError(f"separate_reasoning(model_type={model_type!r}): treadle knows the tagged thinking "
                         f"blocks of {', '.join(REASONING_MODEL_TYPES)}")
    return key


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> ir.Expr:
    """`expr` (text and gens, e.g. `gen("answer")`), each of its gens/selects followed by the
    split of its variable: `name` keeps the answer, `name_reasoning_content` gets the reasoning
    and the block is taken out of the prompt text. Every gen/select in `expr` must be named.
    With no `expr` it adds nothing."""
    key = _model_type(model_type)
    if expr is None:
        return ir.Constant("")
    out: list[ir.Expr] = []
    for node in ir.flatten(ir.to_expr(expr)):
        out.append(node)
        if isinstance(node, (ir.Gen, ir.Select)):
            if node.name is None:
                raise ValueError("separate_reasoning needs a named gen/select (its variable gets the answer, "
                                 "and name + '_reasoning_content' the reasoning); give the gen a name")
            out.append(ir.SeparateReasoning(node.name, key))
    return ir.Concat(out)
