"""Sampling params given as other numeric types than Python's (numpy's scalars, as a sweep over
np.arange or a pandas row hands them over; a Fraction) are read as the int or float they are,
and what is not a number of the field's kind is still refused by name."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from treadle.runtime.sampling_params import SamplingParams


def test_numpy_scalars_are_read_as_python_numbers() -> None:
    p = SamplingParams.from_dict({"max_new_tokens": np.int64(2), "min_new_tokens": np.uint8(1), "top_k": np.int32(5),
                                  "n": np.int16(1), "seed": np.uint64(2**63 + 1), "temperature": np.float32(0.5),
                                  "top_p": Fraction(1, 2), "min_p": np.float16(0.25), "repetition_penalty": np.int64(1),
                                  "frequency_penalty": np.float64(0.5), "presence_penalty": np.float32(-0.5)})
    got = {k: getattr(p, k) for k in ("max_new_tokens", "min_new_tokens", "top_k", "n", "seed", "temperature",
                                      "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")}
    assert got == {"max_new_tokens": 2, "min_new_tokens": 1, "top_k": 5, "n": 1, "seed": 2**63 + 1, "temperature": 0.5,
                   "top_p": 0.5, "min_p": 0.25, "repetition_penalty": 1, "frequency_penalty": 0.5,
                   "presence_penalty": -0.5}
    assert all(type(v) in (int, float) for v in got.values())


@pytest.mark.parametrize("field,value,message", [
    ("max_new_tokens", np.float32(2.0), "max_new_tokens has the wrong type"),  # as 2.0 is (OpenAI refuses it)
    ("max_new_tokens", "2", "max_new_tokens has the wrong type"),
    ("temperature", np.float32("nan"), "temperature must be a finite number"),
    ("top_k", np.int64(-5), "top_k"),
])
def test_what_is_not_a_number_of_the_fields_kind_is_still_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams.from_dict({field: value})


def test_top_p_zero_is_the_most_likely_token_alone() -> None:
    """OpenAI takes top_p 0 (the nucleus of no mass: only the most likely token); it was refused
    as outside (0, 1]. Read as top_k 1, whatever top_k was."""
    greedy = SamplingParams.from_dict({"top_p": 0, "top_k": 50, "temperature": 0.8})
    assert (greedy.top_p, greedy.top_k) == (1.0, 1)
    assert SamplingParams.from_dict({"top_p": 0.0}).top_k == 1
    for bad in ({"top_p": -0.1}, {"top_p": False}, {"top_p": 1.5}):
        with pytest.raises(ValueError, match="top_p"):
            SamplingParams.from_dict(bad)
