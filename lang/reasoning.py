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


def split_reasoning(text: str, model_type: str) -> tuple[str, str]:
    """(reasoning, answer) of `text`, as SGLang's reasoning parser splits it: no block gives
    ("", text); a block never closed (cut by max_tokens) is all reasoning."""
    start, end, forced = REASONING_MODEL_TYPES[_model_type(model_type)]
    if not forced and start not in text:
        return "", text
    body = text
    while body.startswith(start):
        body = body[len(start):]
    if end not in body:
        return body, ""
    reasoning, answer = body.split(end, 1)
    return reasoning, answer


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
