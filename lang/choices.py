"""select's scoring methods under SGLang's names (`from sglang.lang.choices import ...` ports as
`from treadle.lang.choices import ...`).

As SGLang's, a method is a `ChoicesSamplingMethod`: called with the choices' scores (keywords
`choices`, `normalized_prompt_logprobs`, `input_token_logprobs`, `output_token_logprobs`,
`unconditional_token_logprobs`) it returns a `ChoicesDecision`. `select(...,
choices_method=...)` and `gen(..., choices=..., choices_method=...)` take the three named
methods or a subclass of one's own; each backend scores the choices (treadle.lang.backend) and
a subclass's `__call__` decides. The named methods are also the strings naming them
(`greedy_token_selection == "greedy_token"`), which treadle's scoring goes by; "sum" (total
logprob) is treadle's own, a string only.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any


@dataclass
class ChoicesDecision:
    """The choice a method picked, and what it adds to the select's meta info."""

    decision: str
    meta_info: dict[str, Any] | None = None


class ChoicesSamplingMethod(abc.ABC):
    """SGLang's base class of select's methods. A subclass implements `__call__` (keyword-only,
    the arguments below) and returns a ChoicesDecision whose `decision` is one of `choices`;
    `requires_unconditional_logprobs` True also gets `unconditional_token_logprobs` (each choice
    scored with no text before it)."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abc.abstractmethod
    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float],
                 input_token_logprobs: list[list[Any]], output_token_logprobs: list[list[Any]],
                 unconditional_token_logprobs: list[list[Any]] | None = None) -> ChoicesDecision:
        """Per choice: the mean logprob of its tokens, its tokens' [logprob, token id, text]
        entries, what its scoring request generated (nothing), and (if asked for) its tokens'
        entries scored alone. Returns the pick."""


class _NamedMethod(str, ChoicesSamplingMethod):
    """A named method: the string treadle's scoring goes by, and SGLang's callable."""

    def __new__(cls, name: str) -> "_NamedMethod":
        return super().__new__(cls, name)

    def __reduce__(self) -> Any:
        return (type(self), (str(self),))


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


class TokenLengthNormalized(_NamedMethod):
    """The choice with the highest mean logprob over its tokens (the default)."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        return ChoicesDecision(decision=choices[_argmax(normalized_prompt_logprobs)])


class GreedyTokenSelection(_NamedMethod):
    """The choice a greedy decoder would start: the highest first-token logprob, ties broken by
    the next tokens; a choice with fewer tokens counts its own mean logprob where it has none."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        logprobs = [[entry[0] for entry in entries] for entries in input_token_logprobs]
        width = max(len(lp) for lp in logprobs)
        matrix = [lp + [sum(lp) / len(lp)] * (width - len(lp)) for lp in logprobs]
        best = max(range(len(matrix)), key=lambda i: matrix[i])  # lexicographic: the first max on ties
        return ChoicesDecision(decision=choices[best], meta_info={"greedy_logprob_matrix": matrix})


class UnconditionalLikelihoodNormalized(_NamedMethod):
    """The choice whose tokens the text raises most over their logprobs with no text before them
    (the mean difference), so a common word does not win for being common."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional_token_logprobs")
        values = []
        for given, alone in zip(input_token_logprobs, unconditional_token_logprobs):
            # a first token scored with nothing before it has no logprob (None): it counts as 0
            diffs = [g[0] - (a[0] or 0.0) for g, a in zip(given, alone)]
            values.append(sum(diffs) / max(len(diffs), 1))
        return ChoicesDecision(decision=choices[_argmax(values)],
                               meta_info={"normalized_unconditional_prompt_logprobs": values})


token_length_normalized = TokenLengthNormalized("token_length_normalized")
greedy_token_selection = GreedyTokenSelection("greedy_token")
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized("unconditional_likelihood_normalized")

__all__ = ["ChoicesDecision", "ChoicesSamplingMethod", "GreedyTokenSelection", "TokenLengthNormalized",
           "UnconditionalLikelihoodNormalized", "greedy_token_selection", "token_length_normalized",
           "unconditional_likelihood_normalized"]
