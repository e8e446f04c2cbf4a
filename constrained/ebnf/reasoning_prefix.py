"""A reasoning block before a constrained answer: the grammar applies after ``</think>``.

A reasoning model (Qwen3, QwQ, DeepSeek-R1) thinks between ``<think>`` and ``</think>``, then
answers. A grammar that held from the first token would stop it thinking; with a reasoning
parser on, the server constrains only the answer (as SGLang's reasoner grammar backend does).
Here that is one more regex around the grammar's:

* ``"open"`` (the prompt opened the block, as DeepSeek-R1's template does): free text
  without ``</think>``, then ``</think>``, a little whitespace, and the grammar;
* ``"maybe"`` (the reply may open one, or answer at once): that block behind ``<think>``,
  optional, then the grammar.

The text is matched, not token ids, so ``</think>`` may be one added token (Qwen3's) or
several. A grammar that names ``</think>`` itself says what the block holds, and is used as
it is, from the first token (``GrammarSpec.from_params``). The prefix goes before the grammar's root only, not before the definitions its calls
name (json_holes.with_definitions), and its free text never takes a placeholder.

Importing this module does not import torch.
"""

from __future__ import annotations

from treadle.constrained.index.json_holes import ENTRY_CHAR, PLACEHOLDER_RANGE, WRITTEN
from treadle.constrained.regex.regex_text import escape_literal
from treadle.constrained.regex.free_text import trigger_free_regex

__all__ = ["MODES", "after_reasoning", "check_mode"]

OPEN, CLOSE = "<think>", "</think>"
MODES = ("open", "maybe")
_WS = r"[ \t\n\r]{0,8}"  # between the block and the answer (Qwen3 writes "\n\n")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"grammar_after_reasoning must be 'open' or 'maybe', got {mode!r}")


def after_reasoning(regex: str, mode: str) -> str:
    """``regex`` (a grammar's, maybe with definitions) with a reasoning block before its root."""
    check_mode(mode)
    hide = PLACEHOLDER_RANGE if any(c in regex for c in WRITTEN) else ""
    block = f"(?:{trigger_free_regex([CLOSE], hide)}){escape_literal(CLOSE)}{_WS}"
    prefix = block if mode == "open" else f"(?:{escape_literal(OPEN)}{block})?"
    cut = regex.find("|" + ENTRY_CHAR)  # where the definitions' branches begin, if any
    root, definitions = (regex, "") if cut < 0 else (regex[:cut], regex[cut:])
    return f"{prefix}(?:{root}){definitions}"
