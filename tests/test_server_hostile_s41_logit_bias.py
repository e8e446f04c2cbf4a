"""logit_bias keys naming one token twice ("5" and "05") against a real server (session 41):
a 400 naming both keys, not one of the two biases silently lost (the later key won)."""
from __future__ import annotations

import pytest
import requests

from treadle.runtime.sampling_params import SamplingParams
from treadle.runtime.server.testing import wait_idle

T = 120


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: this test leaves it idle
    return plain_server


def test_a_token_named_twice_in_logit_bias_is_a_400_naming_both_keys(srv):
    # the later key won: {"5": 100, "05": -100} banned token 5, the same keys swapped forced it
    for bias in ({"5": 100, "05": -100}, {"05": -100, "5": 100}):
        r = requests.post(srv.url + "/v1/completions", timeout=T, json={
            "model": "default", "prompt": "Hi", "max_tokens": 2, "temperature": 0, "logit_bias": bias})
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["param"] == "logit_bias" and "token 5 twice" in err["message"], err
        assert all(f"'{k}'" in err["message"] for k in bias), err
    r = requests.post(srv.url + "/generate", timeout=T, json={
        "text": "Hi", "sampling_params": {"max_new_tokens": 2, "logit_bias": {"7": 1, "007": 2}}})
    assert r.status_code == 400 and "token 7 twice" in r.json()["error"]["message"], r.text[:300]
    # distinct tokens, and a token's one key, are served as before
    r = requests.post(srv.url + "/v1/completions", timeout=T, json={
        "model": "default", "prompt": "Hi", "max_tokens": 2, "temperature": 0, "logit_bias": {"5": 1, "50": -1}})
    assert r.status_code == 200, r.text[:300]
    wait_idle(srv.url)
    # the Python API too: an int key and its string
    with pytest.raises(ValueError, match="token 5 twice"):
        SamplingParams.from_dict({"logit_bias": {5: 1.0, "5": 2.0}})
    assert SamplingParams.from_dict({"logit_bias": {"5": 1.0, "6": 2.0}}).logit_bias == {5: 1.0, 6: 2.0}
