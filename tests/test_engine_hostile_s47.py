"""Session 47: the offline Engine's Python API used as a careless caller would, on a tiny
dummy model in-process; each test a bug found (it failed on the code before its fix), and the
engine still serves afterwards, holding no KV slot."""
from __future__ import annotations

import pytest

from engine_checks import assert_idle, tiny_engine

from treadle.runtime.engine import BatchError


@pytest.fixture(scope="module")
def engine():
    with tiny_engine() as e:
        yield e


OK = {"max_new_tokens": 2}


@pytest.mark.parametrize("call, what", [
    (dict(prompt=["a", "b", "c"], sampling_params=[OK, {"temperature": -1}, OK]), "temperature"),
    (dict(prompt=["a", "b", "c"], sampling_params=[OK, {"bogus": 1}, OK]), "bogus"),
    (dict(prompt=["a", "b", "c"], sampling_params=[OK, "temperature=0", OK]), "sampling_params must be a dict"),
    (dict(prompt=["a", 5, "c"], sampling_params=OK), "prompt must be a string"),
    (dict(prompt=["a", "", "c"], sampling_params=OK), "empty"),
    (dict(input_ids=[[1, 2], [], [3]], sampling_params=OK), "empty"),
    (dict(input_ids=[[1, 2], [1, 10**9], [3]], sampling_params=OK), "1000000000"),
    (dict(input_ids=[[1, 2], [1, 2.5], [3]], sampling_params=OK), "integers"),
    (dict(input_ids=[[1, 2], [1] * 300, [3]], sampling_params=OK), "context length"),
    (dict(prompt=["a", "b", "c"], sampling_params=[OK, {"max_new_tokens": 10**6}, OK]), "max_new_tokens"),
    (dict(prompt=["a", "b", "c"], sampling_params=OK, return_logprob=True, logprob_start_len=[0, 9, 0]),
     "logprob_start_len"),
])
def test_a_bad_element_of_a_batch_is_named_by_its_index(engine, call, what):
    """A batch with one bad prompt or sampling-params dict raised a ValueError with the
    element's problem but not which element it was ("sampling_params.temperature must be in
    [0, 100.0], got -1" in a batch of 100 prompts); the grammar check and the server's
    /generate name it ("prompt 1 of the batch: ..."). Now a BatchError naming index 1."""
    with pytest.raises(BatchError) as info:
        engine.generate(**call)
    assert str(info.value).startswith("prompt 1 of the batch: ") and what in str(info.value), info.value
    assert list(info.value.errors) == [1] and info.value.results is None
    assert len(engine.generate(["a", "b", "c"], OK)) == 3  # nothing of it ran; the engine serves on
    assert_idle(engine)


def test_every_bad_element_of_a_batch_is_named(engine):
    with pytest.raises(BatchError) as info:
        engine.generate(input_ids=[[1], [], [2], [10**9]], sampling_params=OK)
    assert sorted(info.value.errors) == [1, 3] and str(info.value).startswith("prompts 1, 3 of the batch failed")


def test_encode_of_no_string_is_a_value_error(engine):
    """Engine.encode(5) was an AttributeError from inside the tokenizer."""
    with pytest.raises(ValueError, match="encode takes a string, got int"):
        engine.encode(5)
    assert engine.encode("hi")
