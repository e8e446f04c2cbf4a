"""treadle.constrained: grammar compilation, token FSM, bitmasks, jump-forward.

Staged API (xgrammar-style): ``GrammarSpec`` -> ``GrammarCompiler.compile`` (cached,
bounded, off-thread) -> ``CompiledGrammar`` -> per-request ``GrammarMatcher``
(``accept_token`` / ``fill_next_token_bitmask`` / ``rollback`` /
``find_jump_forward_string``) -> ``apply_token_bitmask_ref`` (or the fused kernel), and
``plan_jump_forward`` for canonical retokenization of forced text. Schemas that ask for
any JSON (``{}``, ``{"type": "object"}``, ...) compile to a ``JsonAnyGrammar``, a pushdown
automaton with unbounded nesting, whose ``JsonAnyMatcher`` has the same interface;
``grammar.matcher()`` makes the right one. Any-values *inside* a schema (a free-form
``{"type": "object"}`` member) are holes in its regex, run on that automaton by a
``HoleMatcher`` (index/json_holes.py); recursive ``$ref``s and an EBNF grammar's nesting rules
are calls that the same matcher runs as a stack (ebnf/ebnf_calls.py).

Subpackages, in the order the data flows (docs/contributing.md, "constrained/ layout"):
``regex/`` (the regex dialect) -> ``schema/`` (JSON Schema -> regex) and ``ebnf/`` (EBNF,
structural tags, reasoning prefix -> regex) -> ``index/`` (the regex over the vocabulary; the
any-JSON pushdown and its holes) -> ``compile/`` (spec -> compiled grammar: worker, caches) ->
``decode/`` (matchers, bitmask, jump-forward).

Names are resolved lazily so that importing the package (e.g. in a compile worker
process) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "token_bytes_table": "index.vocabulary",
    "build_vocabulary": "index.vocabulary",
    "GrammarSpec": "compile.grammar",
    "CompiledGrammar": "compile.grammar",
    "GrammarCompiler": "compile.compiler",
    "GrammarCompileError": "compile.compiler",
    "GrammarCompileTimeout": "compile.compiler",
    "GrammarTooLarge": "compile.compiler",
    "build_compiled_grammar": "compile.compiler",
    "GrammarMatcher": "decode.matcher",
    "HoleMatcher": "decode.matcher",
    "JsonAnyGrammar": "index.json_any",
    "JsonAnyMatcher": "decode.matcher",
    "json_any_root": "index.json_any",
    "allocate_token_bitmask": "decode.bitmask",
    "reset_bitmask_row": "decode.bitmask",
    "apply_token_bitmask_ref": "decode.bitmask",
    "bitmask_to_bool": "decode.bitmask",
    "JumpPlan": "decode.jump_forward",
    "plan_jump_forward": "decode.jump_forward",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'treadle.constrained' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"treadle.constrained.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
