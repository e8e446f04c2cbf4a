"""`sgl.Engine(...).get_server_info()` as SGLang's: the server arguments at the top level,
with `model_path`, `version` and its scheduler's `max_total_num_tokens` / `max_req_input_len`
(treadle's had them only under "engine_args", and no pool size: a KeyError for a ported
`llm.get_server_info()["max_total_num_tokens"]`). A tiny random-weight Engine: what is tested
is the surface."""
from __future__ import annotations

import pytest

import treadle as sgl


@pytest.fixture(scope="module")
def llm():
    engine = sgl.Engine(model_path="dummy:tiny-llama", max_total_tokens=1024)
    yield engine
    engine.shutdown()


def test_get_server_info_has_sglangs_top_level_keys(llm):
    info = llm.get_server_info()
    assert info["max_total_num_tokens"] == info["total_slots"] == 1024
    assert 0 < info["max_req_input_len"] < min(info["context_length"], 1024)
    assert info["model_path"] == "dummy:tiny-llama" and info["tp_size"] == 1 and isinstance(info["version"], str)
    assert info["engine_args"]["max_total_tokens"] == info["max_total_tokens"] == 1024
    assert "api_key" not in info and "free_slots" in info  # the scheduler's counters, as before
    # the DSL's view over it (EngineBackend) is the same
    assert sgl.EngineBackend(llm).get_server_info()["max_total_num_tokens"] == 1024
