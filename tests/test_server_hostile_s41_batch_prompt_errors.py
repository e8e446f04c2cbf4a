"""A 400 for one prompt of a batch names that prompt, against a real server (session 41): "the
prompt has 9001 tokens" or "input_ids must be in [0, 49152)" for a batch of many prompts said
nothing of which one (a batch's grammar errors already said "prompt 1 of the batch")."""
from __future__ import annotations

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

T = 120
LONG = "word " * 9000  # past the 8,192-token context


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


@pytest.mark.parametrize("path, body, starts", [
    ("/generate", {"text": ["Hi", LONG, "Yo"], "sampling_params": {"max_new_tokens": 2}},
     "prompt 1 of the batch: the prompt has 9001 tokens"),
    ("/generate", {"input_ids": [[1, 2], [5, 99999]], "sampling_params": {"max_new_tokens": 2}},
     "prompt 1 of the batch: input_ids must be in [0, 49152)"),
    ("/generate", {"text": ["Hi", "Yo"], "sampling_params": [{"max_new_tokens": 2}, {"temperature": -1}]},
     "prompt 1 of the batch: sampling_params.temperature must be in"),
    ("/generate", {"text": ["Hi", "Yo"], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True,
                   "logprob_start_len": [0, 7]}, "prompt 1 of the batch: logprob_start_len 7 must be <"),
    ("/v1/completions", {"model": "default", "prompt": ["Hi", LONG], "max_tokens": 2},
     "prompt 1 of the batch: the prompt has 9001 tokens"),
    ("/v1/completions", {"model": "default", "prompt": [[1, 2], [5, 99999]], "max_tokens": 2},
     "prompt 1 of the batch: input_ids must be in [0, 49152)"),
    # options all the prompts share: as for one prompt
    ("/generate", {"text": ["Hi", "Yo"], "sampling_params": {"max_new_tokens": 2, "temperature": -1}},
     "sampling_params.temperature must be in"),
    ("/v1/completions", {"model": "default", "prompt": ["Hi", "Yo"], "max_tokens": 2, "temperature": -1},
     "temperature must be in"),
    # one prompt: as before
    ("/generate", {"text": LONG, "sampling_params": {"max_new_tokens": 2}}, "the prompt has 9001 tokens"),
], ids=["text", "input-ids", "own-params", "own-logprob-start", "completions-text", "completions-ids",
        "shared-params", "completions-shared", "single"])
def test_a_bad_prompt_of_a_batch_is_named_by_its_index(srv, path, body, starts):
    r = requests.post(srv.url + path, json=body, timeout=T)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["message"].startswith(starts), r.json()["error"]
    wait_idle(srv.url)
