"""Hostile request bodies found by a sweep over /generate's and the OpenAI routes' fields (types,
NaN/Infinity, huge numbers, empty lists, nested nulls, lone surrogates, out-of-vocabulary ids,
batches with one bad item, pathological grammars): the ones that were still wrong, and 400s that
named a field the client never sent. Each test failed on the code before its fix."""
from __future__ import annotations

import json

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

pytestmark = pytest.mark.slow
T = 60


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


def post(srv, path: str, body: dict, timeout: float = T) -> requests.Response:
    return requests.post(srv.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"},
                         timeout=timeout)


@pytest.mark.parametrize("text", [["hi", None], ["hi", 5], ["hi", ["nested"]], [None]])
def test_a_non_string_in_a_text_batch_is_a_400_naming_text(srv, text):
    """It was answered as if the client had sent input_ids ("input_ids must be a list of
    integers", param input_ids), a field the request did not have."""
    r = post(srv, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "text", r.text
    assert "input_ids" not in r.json()["error"]["message"]


PROMPT_IDS = [(i * 37) % 40000 + 100 for i in range(2000)]


@pytest.mark.parametrize("path,body,param", [
    # n samples score the same prompt n times: 128 x 2,000 positions x 21 values
    ("/v1/completions", {"prompt": PROMPT_IDS, "echo": True, "logprobs": 20, "n": 128, "max_tokens": 1}, "logprobs"),
    ("/generate", {"input_ids": [PROMPT_IDS] * 128, "return_logprob": True, "logprob_start_len": 0,
                   "top_logprobs_num": 20, "sampling_params": {"max_new_tokens": 1}}, "logprob_start_len"),
])
def test_prompt_logprobs_past_the_per_request_cap_are_400(srv, path, body, param):
    """Such a request was accepted: hours of CPU steps scoring prompt positions, and its
    values (5.4M here) kept as Python objects in every process the reply passes through. Now
    it is refused before anything is queued."""
    try:
        r = post(srv, path, body, timeout=20)
    except requests.Timeout:
        pytest.fail("the request was accepted (it would run for hours)")
    finally:
        wait_idle(srv.url, timeout_s=120)  # the old code: the timed-out client's requests are aborted
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param and "prompt logprob values" in err["message"], err


def test_prompt_logprobs_within_the_cap_are_served(srv):
    r = post(srv, "/v1/completions", {"prompt": PROMPT_IDS[:40], "echo": True, "logprobs": 1, "n": 2,
                                      "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        assert len(c["logprobs"]["token_logprobs"]) == 41 and c["logprobs"]["token_logprobs"][0] is None
    i = wait_idle(srv.url)
    assert i["protected_slots"] == 0 and i["free_slots"] + i["evictable_slots"] == i["total_slots"]


# OpenAI requests answered with a 400 that named a field or value the client never sent

@pytest.mark.parametrize("path,body,name", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "min_tokens": 3},
     "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2,
                              "min_tokens": 3}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 20}, "max_tokens"),  # OpenAI's default of 16
])
def test_min_tokens_over_max_tokens_names_the_fields_the_client_sent(srv, path, body, name):
    """The message said "min_tokens must be in [0, max_new_tokens=2]": a field (treadle's
    native name) the OpenAI request did not have."""
    r = post(srv, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "min_tokens" and "max_new_tokens" not in err["message"], err
    assert f"{name}=" in err["message"], err


def test_a_named_tool_choice_with_a_response_format_names_the_function(srv):
    """The 400 said "tool_choice 'named' constrains the reply itself": 'named' is treadle's word
    for the object the client sent, not a tool_choice value."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = post(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_object"}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "tool_choice" and "'named'" not in err["message"], err
    assert "get_weather" in err["message"], err
