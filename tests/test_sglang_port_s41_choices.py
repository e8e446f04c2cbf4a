"""select's choices methods as SGLang's sglang.lang.choices has them: callable
ChoicesSamplingMethod objects returning a ChoicesDecision (SGLang's test/lang/test_choices.py
calls them on scores directly), and a program's own subclass as a select's choices_method. The
named methods were bare strings (not callable) and any other choices_method a ValueError
(session 41)."""
from __future__ import annotations

import math

import pytest

import treadle as sgl
from treadle.lang.choices import (ChoicesDecision, ChoicesSamplingMethod, greedy_token_selection,
                                  token_length_normalized, unconditional_likelihood_normalized)

# scores as a backend hands them to a method: per choice, the mean logprob of its tokens, its
# tokens' [logprob, token id, text] entries, and the same tokens scored with nothing before them
# (the first has no logprob there: None)
SCORES = {
    "choices": ["organ", "organism", "antidisestablishmentarianism"],
    "normalized_prompt_logprobs": [-0.1, -0.3, -0.05],
    "input_token_logprobs": [
        [[-0.1, 1, None]],
        [[-0.1, 1, None], [-0.5, 2, None]],
        [[-0.3, 3, None], [-0.01, 4, None], [-0.01, 5, None]],
    ],
    "output_token_logprobs": [[], [], []],
    "unconditional_token_logprobs": [
        [[None, 1, None]],
        [[None, 1, None], [-2.0, 2, None]],
        [[None, 3, None], [-0.01, 4, None], [-0.01, 5, None]],
    ],
}


def test_token_length_normalized_picks_the_highest_mean():
    decision = token_length_normalized(**SCORES)
    assert isinstance(decision, ChoicesDecision) and decision.decision == "antidisestablishmentarianism"


def test_greedy_token_selection_picks_by_first_tokens_padding_short_choices_with_their_mean():
    decision = greedy_token_selection(**SCORES)
    assert decision.decision == "organ"  # ties organism's first token; its mean -0.1 beats -0.5 next
    assert decision.meta_info["greedy_logprob_matrix"] == [[-0.1, -0.1, -0.1], [-0.1, -0.5, -0.3],
                                                           [-0.3, -0.01, -0.01]]


def test_unconditional_likelihood_normalized_needs_and_uses_the_unconditional_logprobs():
    decision = unconditional_likelihood_normalized(**SCORES)
    assert decision.decision == "organism"
    assert [round(v, 6) for v in decision.meta_info["normalized_unconditional_prompt_logprobs"]] == [-0.1, 0.7, -0.1]
    assert unconditional_likelihood_normalized.requires_unconditional_logprobs
    assert not token_length_normalized.requires_unconditional_logprobs
    with pytest.raises(ValueError, match="unconditional_token_logprobs"):
        unconditional_likelihood_normalized(**{**SCORES, "unconditional_token_logprobs": None})


def test_the_named_methods_are_still_the_strings_naming_them():
    assert sgl.greedy_token_selection is greedy_token_selection and greedy_token_selection == "greedy_token"
    assert token_length_normalized == "token_length_normalized"
    assert all(isinstance(m, ChoicesSamplingMethod) for m in (greedy_token_selection, token_length_normalized,
                                                               unconditional_likelihood_normalized))


@pytest.fixture(scope="module")
def backend():
    engine = sgl.Engine(max_total_tokens=4096)
    sgl.set_default_backend(engine)
    yield engine
    sgl.set_default_backend(None)
    engine.shutdown()


class LeastLikely(ChoicesSamplingMethod):
    """A program's own method: the choice the model finds least likely (so it differs from the
    default's pick), with what it was given in its meta info."""

    def __init__(self, unconditional: bool = False) -> None:
        self.unconditional = unconditional

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return self.unconditional

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None):
        worst = min(range(len(choices)), key=lambda i: normalized_prompt_logprobs[i])
        return ChoicesDecision(choices[worst], {"given_unconditional": unconditional_token_logprobs is not None})


def test_a_programs_own_choices_method_decides_the_select(backend):
    @sgl.function
    def capital(s, method):
        s += "The capital of France is"
        s += sgl.select("city", choices=[" Paris", " a banana", " London"], choices_method=method)
        s += "\nColor of the sky:" + sgl.gen("color", choices=[" blue", " wooden"], choices_method=method)

    default = capital.run(method=token_length_normalized)
    own = capital.run(method=LeastLikely())
    meta = own.get_meta_info("city")
    scores = meta["normalized_prompt_logprobs"]
    assert scores == default.get_meta_info("city")["normalized_prompt_logprobs"]
    assert own["city"] == [" Paris", " a banana", " London"][scores.index(min(scores))] != default["city"]
    assert own.text() == "The capital of France is" + own["city"] + "\nColor of the sky:" + own["color"]
    assert meta["given_unconditional"] is False and "unconditional_token_logprobs" not in meta
    assert len(meta["input_token_logprobs"]) == 3 and all(len(e) == 3 for es in meta["input_token_logprobs"]
                                                           for e in es)
    uncond = capital.run(method=LeastLikely(unconditional=True)).get_meta_info("city")
    assert uncond["given_unconditional"] is True
    assert [len(u) for u in uncond["unconditional_token_logprobs"]] == [len(e) for e in uncond["input_token_logprobs"]]
    assert all(math.isfinite(u[0][0]) for u in uncond["unconditional_token_logprobs"])


def test_a_method_that_returns_no_choice_is_a_value_error_naming_it(backend):
    class Wrong(ChoicesSamplingMethod):
        def __call__(self, **scores):
            return ChoicesDecision("Rome")

    @sgl.function
    def capital(s):
        s += "The capital of France is" + sgl.select("city", choices=[" Paris", " London"], choices_method=Wrong())

    with pytest.raises(ValueError, match="Wrong returned .*Rome"):
        capital.run()
    with pytest.raises(ValueError, match="unknown choices_method"):
        sgl.select("city", choices=["a", "b"], choices_method=max)
