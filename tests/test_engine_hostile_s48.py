"""Session 48: the offline Engine's Python API used as a careless caller would, on a tiny
dummy model in-process; each test a bug found (it failed on the code before its fix), and the
engine still serves afterwards, holding no KV slot."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from treadle.runtime import Engine


@pytest.fixture(scope="module")
def engine():
    with Engine(model_path="dummy:tiny-llama", max_total_tokens=512, context_length=256) as e:
        yield e


def _all_free(engine) -> None:
    engine.check_integrity()
    info = engine.get_server_info()
    assert info["num_running"] == 0 and info["num_waiting"] == 0
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"]


OK = {"max_new_tokens": 2}


@pytest.mark.parametrize("input_ids", [
    [np.array([1, 2, 3]), np.array([4, 5])],  # a batch as a list of arrays
    [torch.tensor([1, 2, 3])],
    [1, 2, np.array([3, 4])],
], ids=["numpy-rows", "tensor-row", "array-among-ids"])
def test_a_list_of_arrays_as_input_ids_is_a_value_error_naming_tolist(engine, input_ids):
    # was StopIteration (an array of several ids has __index__, which raised TypeError, and the
    # search for the element without __index__ found none)
    with pytest.raises(ValueError, match=r"input_ids must be integers.*\.tolist\(\)"):
        engine.generate(input_ids=input_ids, sampling_params=OK)
    assert len(engine.generate(input_ids=[1, 2, 3], sampling_params=OK)["output_ids"]) == 2
    _all_free(engine)
