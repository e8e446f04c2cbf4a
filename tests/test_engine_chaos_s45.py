"""The offline Engine used as a careless or hostile caller would: each test a bug found (it
failed on the code before its fix), on a tiny dummy model in-process, checking after each
that the engine still serves and holds no KV slot."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine_checks import assert_idle, tiny_engine

from treadle.runtime import Engine
from treadle.runtime.engine import EngineDeadError


@pytest.fixture(scope="module")
def engine():
    with tiny_engine() as e:
        yield e


def test_numpy_scalars_as_logprob_options(engine):
    """return_logprob / logprob_start_len / top_logprobs_num as numpy scalars (an index or a
    length from an array, a comparison's np.bool_), as max_new_tokens already took them: they
    were a ValueError ("top_logprobs_num must be an integer, got np.int64(2)")."""
    out = engine.generate(input_ids=[5, 6, 7, 8], sampling_params={"max_new_tokens": 3, "temperature": 0},
                          return_logprob=np.bool_(True), logprob_start_len=np.int64(1),
                          top_logprobs_num=np.int32(2))
    meta = out["meta_info"]
    assert len(meta["input_token_logprobs"]) == 3  # positions 1..3 of the prompt
    assert len(meta["output_token_logprobs"]) == 3
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    # one per prompt, as lists
    outs = engine.generate(input_ids=[[5, 6, 7], [9, 10]], sampling_params={"max_new_tokens": 2},
                           return_logprob=[np.True_, np.False_], top_logprobs_num=[np.uint8(1), np.int64(0)])
    assert "output_token_logprobs" in outs[0]["meta_info"]
    assert "output_token_logprobs" not in outs[1]["meta_info"]
    # a numpy float is still no position
    with pytest.raises(ValueError, match="logprob_start_len must be an integer"):
        engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                        logprob_start_len=np.float64(1.0))
    assert_idle(engine)


def test_abort_of_a_rid_that_is_no_string(engine):
    """abort(["a", "b"]) (the rids of a batch, as a list) was a TypeError from a dict lookup
    ('unhashable type'); a rid is a string, and anything else is a ValueError saying so."""
    for rid in (["a", "b"], {"rid": "a"}, None, 3):
        with pytest.raises(ValueError, match="rid must be a string"):
            engine.abort(rid)
    assert engine.generate("Hi", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    assert_idle(engine)


def test_a_list_of_rids_names_each_prompt(engine):
    """SGLang's Engine.generate (and treadle's /generate) take `rid` as a list, one per prompt;
    the Engine refused it ("rid must be a string"). Each prompt's request is named by its rid
    ("<rid>-<j>" for its n samples), abort(rid) stops that prompt alone, and a list of the
    wrong length, or naming two requests alike, is a ValueError."""
    out = engine.generate(["a", "b"], {"max_new_tokens": 2, "n": 2}, rid=["p", "q"])
    assert [o["meta_info"]["id"] for o in out] == ["p-0", "p-1", "q-0", "q-1"]
    chunks = list(engine.generate(input_ids=[[3], [4]], sampling_params={"max_new_tokens": 2}, rid=["s", ""],
                                  stream=True))
    assert chunks[0]["meta_info"]["id"] in ("s", chunks[-1]["meta_info"]["id"])
    assert {c["index"] for c in chunks if c["meta_info"]["id"] == "s"} == {0}
    res = []
    t = threading.Thread(target=lambda: res.append(engine.generate(
        ["a", "b"], [{"max_new_tokens": 200, "ignore_eos": True}, {"max_new_tokens": 40, "ignore_eos": True}],
        rid=["y1", "y2"])))
    t.start()
    end = time.monotonic() + 30
    while engine.get_server_info()["num_running"] < 2 and t.is_alive():
        assert time.monotonic() < end
        time.sleep(0.01)
    engine.abort("y1")
    t.join(60)
    assert [(o["meta_info"]["id"], o["meta_info"]["finish_reason"]["type"]) for o in res[0]] == \
        [("y1", "abort"), ("y2", "length")]
    for rid, match in ((["r1"], "1 rids for 2 prompts"), (["r1", "r1"], "given to two prompts"),
                       (["a", 3], "list of strings")):
        with pytest.raises(ValueError, match=match):
            engine.generate(["a", "b"], {"max_new_tokens": 2}, rid=rid)
    with pytest.raises(ValueError, match="names two requests"):  # "a-0": a sample of "a", and a prompt
        engine.generate(["a", "b"], {"max_new_tokens": 2, "n": 2}, rid=["a", "a-0"])
    assert not engine._groups and not engine._prompt_groups and not engine._outboxes
    assert_idle(engine)


def test_a_numpy_max_new_tokens_past_the_context_is_refused_as_an_int_is(engine):
    """max_new_tokens=10**6 with a 256-token context is a ValueError; np.int64(10**6) ran,
    silently cut at the context (the context check skipped what was not a Python int)."""
    for value in (10**6, np.int64(10**6), np.uint64(2**63), np.int32(300)):
        with pytest.raises(ValueError, match="exceed the context length 256"):
            engine.generate("a", {"max_new_tokens": value, "ignore_eos": True})
    assert engine.generate("a", {"max_new_tokens": np.int64(3)})["meta_info"]["completion_tokens"] == 3
    assert_idle(engine)


def test_shutdown_while_a_batch_waits_for_its_grammars_and_after():
    """A batch's grammars compile before any of it is queued; an engine shut down meanwhile
    (its compiler closed, failing the compiles) made the call raise a BatchError, a ValueError
    blaming the input ("prompts 0, 1 of the batch failed; ... GrammarCompiler was closed
    before the compile finished"). After shutdown, such a batch asked the closed compiler
    first (a BatchError "GrammarCompiler is closed"), and a stream call returned a generator
    as if it would run. Each raises EngineDeadError, as a plain generate did."""
    slow = "(" + "|".join(f"zz{i}[a-z]{{0,5}}" for i in range(4000)) + ")"  # outlines' index: a minute
    e = Engine(model_path="dummy:tiny-llama", max_total_tokens=128, context_length=64, grammar_compile_workers=1,
               grammar_compile_timeout_s=600, grammar_max_size=10**9, grammar_index="outlines")
    try:
        compiler = e._call(lambda s: s.grammar_compiler)
        errors = []

        def call() -> None:
            try:
                e.generate(["a", "b"], {"regex": slow, "max_new_tokens": 2})
            except Exception as ex:  # noqa: BLE001 - the test looks at which
                errors.append(ex)

        t = threading.Thread(target=call)
        t.start()
        end = time.monotonic() + 60
        while compiler._idle.qsize():  # until the worker has taken the slow grammar
            assert time.monotonic() < end
            time.sleep(0.01)
    finally:
        e.shutdown()
    t.join(30)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], EngineDeadError), errors
    with pytest.raises(EngineDeadError, match="shut down"):
        e.generate(["a", "b"], {"regex": "(yes|no)", "max_new_tokens": 4})
    with pytest.raises(EngineDeadError, match="shut down"):
        e.generate("a", {"max_new_tokens": 4}, stream=True)
    e.shutdown()  # twice: nothing more to do


@pytest.mark.parametrize("name", ["starvation_bound_s", "grammar_compile_timeout_s", "stream_write_timeout_s"])
def test_a_nan_engine_argument_is_refused(name):
    """Engine(starvation_bound_s=float("nan")) was taken, and its first generate hung for
    good: a request waiting was neither past the bound nor within it (both comparisons with
    NaN are False), so order_waiting listed it nowhere and it was never admitted. A NaN
    argument is a ValueError naming it (before any model loads)."""
    with pytest.raises(ValueError, match=f"{name} must be a number, got nan"):
        Engine(model_path="dummy:tiny-llama", **{name: float("nan")})


def test_a_seed_past_torchs_range_is_refused_by_name():
    """Engine(seed=2**70) failed loading the model with torch's "Overflow when unpacking long
    long", naming nothing; it is a ValueError naming seed and its range."""
    with pytest.raises(ValueError, match=r"seed must be in \[-2\*\*63, 2\*\*64\), got 1180591620717411303424"):
        Engine(model_path="dummy:tiny-llama", seed=2**70)


@pytest.mark.parametrize("timeout_s", [0, -1.0])
def test_a_grammar_compile_timeout_of_zero_is_refused_at_the_engine(timeout_s):
    """Engine(grammar_compile_timeout_s=0) was taken, and then every request with a grammar
    failed with a ValueError (a BatchError) listing the compiler's settings, as if the
    request's fault; the engine argument is refused by name instead."""
    with pytest.raises(ValueError, match="grammar_compile_timeout_s must be > 0"):
        Engine(model_path="dummy:tiny-llama", grammar_compile_timeout_s=timeout_s)
