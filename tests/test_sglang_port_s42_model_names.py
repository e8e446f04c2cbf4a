"""The `model` a ported client sends: SGLang's json_logprobs example sends "" (SGLang's server
reads no name), and a client of the embedded model names it by its Hugging Face id (the
--model-path SGLang would be launched with); both were a 404 'the model ... does not exist'
on a server of the embedded model launched without --model-path. Other names stay a 404.
The shared plain_server."""
from __future__ import annotations

import pytest
import requests


@pytest.mark.parametrize("model", ["", "HuggingFaceTB/SmolLM2-135M-Instruct", "huggingfacetb/smollm2-135m-instruct"])
def test_sglangs_model_names_are_served(plain_server, model):
    for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions",
                                                              {"messages": [{"role": "user", "content": "Hi"}]})):
        r = requests.post(plain_server.url + path, json={"model": model, "max_tokens": 1, **body}, timeout=60)
        assert r.status_code == 200, (path, r.text)


def test_another_name_is_still_a_404(plain_server):
    r = requests.post(plain_server.url + "/v1/completions", json={"model": "HuggingFaceTB/SmolLM2-360M-Instruct",
                                                                  "prompt": "Hi", "max_tokens": 1}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
