"""Request parameters as other callers give them (each test failed on the code before its fix):
numpy values from a Python caller of the offline Engine, and vLLM's request_id over the
OpenAI endpoints, whose response id vLLM builds from it."""
from __future__ import annotations

import numpy as np
import openai
import pytest
import requests

from engine_checks import tiny_engine

from treadle.runtime.server.testing import sse_events, wait_idle

T = 120
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def engine():
    with tiny_engine() as e:
        yield e


def _greedy(engine, **params) -> dict:
    return engine.generate(input_ids=PROMPT, sampling_params={"max_new_tokens": 5, "temperature": 0,
                                                              "ignore_eos": True, **params})


def test_numpy_stop_token_ids_logit_bias_and_flags(engine):
    """stop_token_ids=[np.int64(t)] or an integer array, and logit_bias with numpy keys, were a
    ValueError ("must be a list of non-negative integers"), as were numpy bools in the boolean
    fields, while top_k / n / seed / max_new_tokens took numpy ints."""
    ids = _greedy(engine)["output_ids"]
    t = ids[1]
    for stop in ([np.int64(t)], np.array([t]), np.array([t, 0], dtype=np.uint32), [np.int32(t), 0]):
        out = engine.generate(input_ids=PROMPT, sampling_params={"max_new_tokens": 5, "temperature": 0,
                                                                 "stop_token_ids": stop})
        assert out["output_ids"][:2] == ids[:2] and len(out["output_ids"]) == 2, (stop, out)
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
    forced = _greedy(engine, logit_bias={np.int64(77): np.float32(100.0)})
    assert forced["output_ids"] == [77] * 5
    forced = _greedy(engine, logit_bias={np.uint16(78): np.int8(100)}, ignore_eos=np.bool_(True),
                     skip_special_tokens=np.False_, no_stop_trim=np.True_)
    assert forced["output_ids"] == [78] * 5
    # what is refused as a Python value (a bool as an int, NaN, a float token id) still is as
    # a numpy one, naming the field
    for params, field in REFUSED:
        with pytest.raises(ValueError, match=f"sampling_params.{field}"):
            engine.generate(input_ids=PROMPT, sampling_params={"max_new_tokens": 1, **params})
    _idle(engine)


REFUSED = [
    ({"stop_token_ids": [np.bool_(True)]}, "stop_token_ids"),
    ({"stop_token_ids": np.array([True, False])}, "stop_token_ids"),
    ({"stop_token_ids": np.array([2.0])}, "stop_token_ids"),
    ({"stop_token_ids": np.array([[2, 3]])}, "stop_token_ids"),
    ({"stop_token_ids": np.array([-1])}, "stop_token_ids"),
    ({"stop_token_ids": [np.float64(2.0)]}, "stop_token_ids"),
    ({"logit_bias": {np.bool_(True): 1.0}}, "logit_bias"),
    ({"logit_bias": {np.float64(2.0): 1.0}}, "logit_bias"),
    ({"logit_bias": {5: np.float64("nan")}}, "logit_bias"),
    ({"logit_bias": {5: np.bool_(True)}}, "logit_bias"),
    ({"ignore_eos": np.int64(1)}, "ignore_eos"),
    ({"top_k": np.bool_(True)}, "top_k"),
]


def _idle(engine) -> None:
    engine.check_integrity()
    info = engine.get_server_info()
    assert info["num_running"] == 0 and info["num_waiting"] == 0


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: left idle
    return plain_server


def test_request_id_names_the_response(srv):
    """vLLM's request_id was taken as the rid, but the response id was a fresh cmpl-<uuid>;
    vLLM answers cmpl-{request_id} / chatcmpl-{request_id}, streamed chunks too."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=T, max_retries=0)
    c = client.completions.create(model="default", prompt="Hi", max_tokens=2, extra_body={"request_id": "req-s45-a"})
    assert c.id == "cmpl-req-s45-a"
    c = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       extra_body={"request_id": "req-s45-b"})
    assert c.id == "chatcmpl-req-s45-b"
    for path, prefix, body in (("/v1/completions", "cmpl-", {"prompt": "Hi"}),
                               ("/v1/chat/completions", "chatcmpl-",
                                {"messages": [{"role": "user", "content": "Hi"}]})):
        r = requests.post(srv.url + path, json={**body, "model": "default", "max_tokens": 2, "stream": True,
                                               "request_id": "req-s45-c", "n": 2}, stream=True, timeout=T)
        assert r.status_code == 200, r.text
        events = sse_events(r)
        assert events[-1] == "[DONE]"
        assert {e["id"] for e in events[:-1]} == {prefix + "req-s45-c"}, events
    # without one, a fresh id as before
    c = client.completions.create(model="default", prompt="Hi", max_tokens=1)
    assert c.id.startswith("cmpl-") and "req-s45" not in c.id
    wait_idle(srv.url)
