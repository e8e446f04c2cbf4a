"""SGLang programs written as SGLang's docs and examples write them, run on the embedded model,
where they needed an edit beyond the import (session 40)."""
from __future__ import annotations

import re
import warnings

import pytest

import treadle as sgl


@pytest.fixture(scope="module")
def backend():
    engine = sgl.Engine(max_total_tokens=8192)
    sgl.set_default_backend(engine)
    yield engine
    sgl.set_default_backend(None)
    engine.shutdown()


def test_a_typed_gen_cut_short_is_stored_as_generated(backend):
    """SGLang's backends turn dtype into a regex and store whatever comes back: a gen_string
    cut by max_tokens is the program's value and the program goes on. treadle raised a
    ValueError that ended the program."""
    @sgl.function
    def typed(s):
        s += "Q: Name a fruit.\nA: " + sgl.gen_string("name", max_tokens=3)
        s += "\nQ: 2+2=" + sgl.gen_int("n")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = typed.run(temperature=0)
    assert state["name"].startswith('"') and not state["name"].endswith('"')  # cut short
    assert state.text().endswith(state["name"] + "\nQ: 2+2=" + state["n"])
    assert re.fullmatch(r"[-+]?[0-9]+", state["n"])
    assert any("max_tokens" in str(w.message) for w in caught)


def test_dtype_with_a_regex_uses_the_dtype_as_sglang_warns(backend):
    """SGLang's RuntimeEndpoint warns "Both dtype and regex are set. Only dtype will be used."
    and generates the dtype; treadle refused the gen with a ValueError."""
    @sgl.function
    def both(s):
        s += "A day has " + sgl.gen("hours", dtype=int, regex=r"[a-z]+", max_tokens=8) + " hours."

    with pytest.warns(UserWarning, match="Only dtype will be used"):
        state = both.run(temperature=0)
    assert re.fullmatch(r"[-+]?[0-9]+", state["hours"]), state["hours"]
