"""Clients written for SGLang's and vLLM's HTTP servers, unchanged, against treadle's (session 45):
the fields they send at their defaults are taken and change nothing; a value that asks for a
feature treadle lacks is a 400 naming the field; the vLLM fields treadle can serve are honoured;
the info endpoints carry the keys SGLang's clients read."""
from __future__ import annotations

import json

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

T = 60


@pytest.fixture(scope="module")
def url(plain_server):  # conftest's shared server: left idle
    return plain_server.url


def _post(url: str, path: str, body: dict, status: int = 200) -> dict:
    r = requests.post(url + path, json=body, timeout=T)
    assert r.status_code == status, r.text
    return r.json()


# what SGLang's GenerateReqInput sends when its caller leaves these at their defaults
_NATIVE_DEFAULTS = {
    "return_hidden_states": False, "lora_path": None, "lora_id": None, "input_embeds": None, "image_data": None,
    "audio_data": None, "video_data": None, "modalities": None, "token_ids_logprob": None, "session_params": None,
    "custom_logit_processor": None, "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None,
    "bootstrap_pair_key": None, "data_parallel_rank": None, "background": False, "priority": None,
    "extra_key": None, "log_metrics": True, "no_logs": False, "conversation_id": None, "custom_labels": None,
    "return_entropy": False, "return_bytes": False,
}
# vLLM's and SGLang's extras of the OpenAI requests, at their defaults
_OPENAI_DEFAULTS = {
    "use_beam_search": False, "length_penalty": 1.0, "truncate_prompt_tokens": None, "guided_decoding_backend": None,
    "guided_whitespace_pattern": None, "guided_json_object": None, "prompt_logprobs": None, "priority": 0,
    "return_tokens_as_token_ids": False, "add_special_tokens": True, "mm_processor_kwargs": None, "cache_salt": None,
    "kv_transfer_params": None, "vllm_xargs": None, "allowed_token_ids": None, "bad_words": [], "audio": None,
    "web_search_options": None, "lora_path": None, "return_hidden_states": False, "session_params": None,
    "custom_logit_processor": None, "custom_params": None, "bootstrap_host": None, "bootstrap_port": None,
    "bootstrap_room": None, "data_parallel_rank": None, "extra_key": None, "request_id": None,
    "prompt_embeds": None, "logits_processors": None, "media_io_kwargs": None, "return_token_ids": False,
}
# stream_reasoning false asks for nothing unstreamed, or with no reasoning parser (this server's)
_CHAT_ONLY = {"chat_template": None, "documents": None, "stream_reasoning": False}


def test_sglang_generate_fields_at_their_defaults_change_nothing(url):
    """`"return_hidden_states": false`, `"lora_path": null`, ... were 400 "unknown field(s)";
    now taken, the output the same as without them (one prompt, and a batch with a value per
    prompt, as SGLang's batches may send)."""
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    plain = _post(url, "/generate", body)
    assert _post(url, "/generate", {**body, **_NATIVE_DEFAULTS})["output_ids"] == plain["output_ids"]
    batch = _post(url, "/generate", {**body, "text": [body["text"]] * 2, "lora_path": [None, None],
                                     "image_data": [None, None], "data_parallel_rank": 0})
    assert [r["output_ids"] for r in batch] == [plain["output_ids"]] * 2


@pytest.mark.parametrize("field, value", [("return_hidden_states", True), ("lora_path", "my-adapter"),
                                          ("image_data", "cat.png"), ("token_ids_logprob", [1, 2]),
                                          ("priority", 3), ("data_parallel_rank", 1), ("log_metrics", "yes"),
                                          ("lora_path", [None, "my-adapter"])])
def test_sglang_generate_fields_that_ask_for_a_missing_feature_are_a_400_naming_them(url, field, value):
    err = _post(url, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1}, field: value}, 400)["error"]
    assert err["param"] == field and field in err["message"] and "unknown" not in err["message"], err


def test_vllm_and_sglang_openai_extras_at_their_defaults_change_nothing(url):
    chat = {"model": "default", "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 4,
            "temperature": 0}
    plain = _post(url, "/v1/chat/completions", chat)["choices"][0]["message"]["content"]
    got = _post(url, "/v1/chat/completions", {**chat, **_OPENAI_DEFAULTS, **_CHAT_ONLY})
    assert got["choices"][0]["message"]["content"] == plain
    comp = {"model": "default", "prompt": "One, two,", "max_tokens": 3, "temperature": 0}
    plain = _post(url, "/v1/completions", comp)["choices"][0]["text"]
    assert _post(url, "/v1/completions", {**comp, **_OPENAI_DEFAULTS})["choices"][0]["text"] == plain


@pytest.mark.parametrize("path, field, value", [
    ("/v1/completions", "use_beam_search", True), ("/v1/completions", "length_penalty", 0.5),
    ("/v1/completions", "prompt_logprobs", 1), ("/v1/completions", "cache_salt", "tenant-a"),
    ("/v1/completions", "lora_path", "my-adapter"), ("/v1/completions", "return_tokens_as_token_ids", True),
    ("/v1/chat/completions", "chat_template", "{{ messages }}"), ("/v1/chat/completions", "priority", 2),
    ("/v1/chat/completions", "stream_reasoning", "no"), ("/v1/chat/completions", "add_special_tokens", "no"),
    ("/v1/chat/completions", "truncate_prompt_tokens", 0)])
def test_openai_extras_that_ask_for_a_missing_feature_are_a_400_naming_them(url, path, field, value):
    body = {"model": "default", "max_tokens": 1, field: value,
            **({"prompt": "Hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]})}
    err = _post(url, path, body, 400)["error"]
    assert err["param"] == field and field in err["message"] and "unknown" not in err["message"], err


def test_vllm_fields_treadle_serves_are_honoured(url):
    """truncate_prompt_tokens keeps the prompt's last k tokens (a prompt past the context is
    cut, not refused); guided_json_object is response_format json_object; request_id names
    the request as rid does (differing from rid: a 400)."""
    comp = {"model": "default", "prompt": "one two three four five six", "max_tokens": 2, "temperature": 0}
    cut = _post(url, "/v1/completions", {**comp, "truncate_prompt_tokens": 2})
    assert cut["usage"]["prompt_tokens"] == 2
    tail = requests.post(url + "/tokenize", json={"prompt": comp["prompt"]}, timeout=T).json()["tokens"][-2:]
    same = _post(url, "/v1/completions", {**comp, "prompt": tail})
    assert cut["choices"][0]["text"] == same["choices"][0]["text"]
    huge = _post(url, "/v1/completions", {**comp, "prompt": "word " * 9_000, "max_tokens": 1,
                                          "truncate_prompt_tokens": 4})
    assert huge["usage"]["prompt_tokens"] == 4
    chat = {"model": "default", "messages": [{"role": "user", "content": "Describe a cat."}], "max_tokens": 12,
            "temperature": 0}
    reply = _post(url, "/v1/chat/completions", {**chat, "guided_json_object": True})["choices"][0]
    if reply["finish_reason"] == "stop":
        assert isinstance(json.loads(reply["message"]["content"]), dict)
    else:  # cut by max_tokens: still the start of an object
        assert reply["message"]["content"].lstrip().startswith("{")
    _post(url, "/v1/completions", {**comp, "request_id": "h87-req"})
    err = _post(url, "/v1/completions", {**comp, "request_id": "a", "rid": "b"}, 400)["error"]
    assert err["param"] == "request_id"
    wait_idle(url)


def test_info_endpoints_carry_the_keys_sglang_clients_read(url):
    """sglang.bench_serving reads /get_server_info's internal_states[0] (a KeyError before);
    SGLang's /get_model_info has architectures, preferred_sampling_params, weight_version and
    the has_*_understanding flags, and newer SGLang clients ask /model_info and /server_info (404s
    before); vLLM's model cards have root and parent."""
    server = requests.get(url + "/get_server_info", timeout=T).json()
    assert isinstance(server["internal_states"], list) and server["internal_states"][0].get(
        "avg_spec_accept_length") is None
    model = requests.get(url + "/get_model_info", timeout=T).json()
    assert model["architectures"] == [model["architecture"]] and model["preferred_sampling_params"] is None
    assert model["has_image_understanding"] is False and model["weight_version"]
    assert requests.get(url + "/model_info", timeout=T).json()["model_path"] == model["model_path"]
    assert "internal_states" in requests.get(url + "/server_info", timeout=T).json()  # SGLang's newer names
    # vLLM's /tokenize: return_token_strs, and its chat fields at their defaults
    tok = _post(url, "/tokenize", {"prompt": "Hi, you", "return_token_strs": True, "tools": None,
                                   "chat_template": None})
    assert len(tok["token_strs"]) == tok["count"] and tok["token_strs"][0] == "Hi"
    card = requests.get(url + "/v1/models", timeout=T).json()["data"][0]
    assert card["root"] == model["model_path"] and "parent" in card


def test_nulls_and_vllm_defaults_that_were_refused(url):
    """/generate's `"stream": null` and null logprob options (SGLang's client sends its unset
    fields so) were 400 "stream must be a boolean"; vLLM's `top_k: 0` (its "off", and its
    default) was a 400 on /v1 (native, 0 stays SGLang's 400); vLLM's
    stream_options.continuous_usage_stats was taken and dropped: every chunk now has the
    usage so far."""
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    plain = _post(url, "/generate", body)
    nulls = _post(url, "/generate", {**body, "stream": None, "return_logprob": None, "logprob_start_len": None,
                                     "top_logprobs_num": None, "return_text_in_logprobs": None})
    assert nulls["output_ids"] == plain["output_ids"]
    comp = {"model": "default", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    assert (_post(url, "/v1/completions", {**comp, "top_k": 0})["choices"][0]["text"]
            == _post(url, "/v1/completions", comp)["choices"][0]["text"])
    r = requests.post(url + "/v1/completions", json={**comp, "stream": True, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}}, stream=True, timeout=T)
    chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: {")]
    assert all(c["usage"] and c["usage"]["prompt_tokens"] == 1 for c in chunks), chunks
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_vllm_structured_outputs_constrain_the_reply(url):
    """vLLM's newer form of the guided_* fields, `structured_outputs: {"choice": [...]}` (and
    json, regex, grammar, json_object), was a 400 "unknown field(s)"; it constrains the reply
    now, and a member asking for what treadle does not do is a 400 naming it."""
    comp = {"model": "default", "prompt": "Is the sky blue? Answer:", "max_tokens": 4, "temperature": 0}
    got = _post(url, "/v1/completions", {**comp, "structured_outputs": {"choice": ["maybe", "never"],
                                                                         "backend": "xgrammar"}})
    assert got["choices"][0]["text"] in ("maybe", "never")
    err = _post(url, "/v1/completions", {**comp, "structured_outputs": {"disable_any_whitespace": True}}, 400)
    assert err["error"]["param"] == "structured_outputs" and "disable_any_whitespace" in err["error"]["message"]
