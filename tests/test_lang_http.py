"""A subset of the DSL through RuntimeEndpoint against a real server subprocess."""
from __future__ import annotations

import json
import re

import pytest
import requests

from treadle.lang import RuntimeEndpoint, assistant, function, gen, select, system, user
from treadle.runtime.server.testing import free_port


@pytest.fixture(scope="module")
def server(plain_server):  # conftest's shared server: these programs leave it idle
    return plain_server.url


@pytest.fixture(scope="module")
def backend(server):
    return RuntimeEndpoint(server)


def test_unreachable_url_names_it():
    port = free_port()  # nothing listens there
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        RuntimeEndpoint(f"http://127.0.0.1:{port}")


def test_gen_and_variables(backend):
    @function
    def prog(s):
        s += "The capital of France is"
        s += gen("x", max_tokens=6, temperature=0, stop="\n")

    st = prog.run(backend=backend)
    assert "Paris" in st["x"]
    assert st.text() == "The capital of France is" + st["x"]
    assert st.get_meta_info("x")["prompt_tokens"] > 0


def test_select_over_http(backend):
    @function
    def capital(s):
        s += "The capital of France is "
        s += select("city", ["Paris", "London", "banana"])

    assert capital.run(backend=backend)["city"] == "Paris"

    @function
    def sentiment(s, review):
        s += f"Review: {review}\nSentiment (positive or negative):"
        s += select("label", [" positive", " negative"])

    good = sentiment.run(review="I loved it, wonderful and delightful, best movie ever!", backend=backend)
    bad = sentiment.run(review="Terrible, boring and awful. I hated every minute.", backend=backend)
    assert (good["label"], bad["label"]) == (" positive", " negative")


def test_select_scores_equal_the_engine_backends(backend):
    """The endpoint tokenizes on the server (/tokenize) and scores as the Engine backend does:
    the same token logprobs, also with no text before the select, a one-token text, and a
    text merged into the choice's first token."""
    from treadle.lang import EngineBackend
    from treadle.runtime import Engine

    cases = [("", ["Hello", "Zyzzyva quibble", "The"]), ("Hi", [" there", "!", "gh"]), ("x", ["y", "yz"]),
             ("The capital of France is ", ["Paris", "London"]), ("The capital of France is", [" Paris", " London"])]
    with Engine(max_total_tokens=4096) as engine:
        local = EngineBackend(engine)
        for text, choices in cases:
            want = local.choice_logprobs(text, choices).token_logprobs
            got = backend.choice_logprobs(text, choices).token_logprobs
            assert [len(x) for x in got] == [len(x) for x in want], (text, choices)
            assert sum(got, []) == pytest.approx(sum(want, []), abs=1e-3), (text, choices)

    @function
    def first(s):
        s += select("c", choices=["Hello", "Zyzzyva quibble", "The"])

    assert first.run(backend=backend)["c"] in ("Hello", "Zyzzyva quibble", "The")


def test_tokenize_and_detokenize(server):
    text = "<|im_start|>user\nHi there<|im_end|>"
    r = requests.post(server + "/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] > 0
    assert requests.post(server + "/detokenize", json={"tokens": body["tokens"]}).json()["prompt"] == text
    many = requests.post(server + "/tokenize", json={"prompt": [text, "Hi"]}).json()
    assert many["tokens"][0] == body["tokens"] and many["count"] == [len(body["tokens"]), len(many["tokens"][1])]
    info = requests.get(server + "/get_model_info").json()
    assert info["eos_token_id"] == requests.post(server + "/tokenize", json={"prompt": info["eos_token"]}).json()["tokens"][0]
    for path, payload, field in [("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {"prompt": []}, "prompt"),
                                 ("/tokenize", {"prompt": "a", "add_special_tokens": "no"}, "add_special_tokens"),
                                 ("/tokenize", {"text": "a"}, "text"), ("/detokenize", {"tokens": [1, "a"]}, "tokens"),
                                 ("/detokenize", {"tokens": [10**9]}, "tokens")]:
        r = requests.post(server + path, json=payload)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (path, payload, r.text)


def test_generate_streams_the_text_so_far(server):
    """SGLang's native stream: every chunk carries the whole output so far (the server's
    default; --incremental-streaming-output sends only what is new, test_server_native.py)."""
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                                    "ignore_eos": True}}
    full = requests.post(server + "/generate", json=body, timeout=120).json()
    with requests.post(server + "/generate", json={**body, "stream": True}, stream=True, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True) if line.startswith("data: {")]
    assert len(chunks) >= 2
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"]) and b["output_ids"][:len(a["output_ids"])] == a["output_ids"]
    assert (chunks[-1]["text"], chunks[-1]["output_ids"]) == (full["text"], full["output_ids"])


def test_roles_and_fork_over_http(backend):
    @function
    def chat(s):
        s += system("You are terse.")
        s += user("Name a color.")
        forks = s.fork(2)
        for f in forks:
            f += assistant(gen("color", max_tokens=6, temperature=0))
        forks.join()

    st = chat.run(backend=backend)
    assert st.text().startswith("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName a color.")
    assert len(st["color"]) == 2
    assert all(m["cached_tokens"] > 0 for m in st.get_meta_info("color")["branches"])


def test_constrained_and_batch_over_http(backend):
    @function
    def prog(s, q):
        s += f"Q: {q}\nA (a number): "
        s += gen("n", dtype=int, max_tokens=6, temperature=0)
        s += "\nDate: " + gen("d", regex=r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", max_tokens=12, temperature=0)
        s += "\nSum: " + gen("e", ebnf='root ::= num (" + " num){1,2} " = " num\nnum ::= [0-9]{1,3}', max_tokens=32,
                              temperature=0)

    states = prog.run_batch([{"q": "How many legs does a cat have?"}, {"q": "What is 2+2?"}],
                            backend=backend, progress_bar=False)
    for st in states:
        assert re.fullmatch(r"[-+]?[0-9]+", st["n"]), st["n"]  # the text, as SGLang's; it parses
        assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", st["d"])
        assert re.fullmatch(r"[0-9]{1,3}( \+ [0-9]{1,3}){1,2} = [0-9]{1,3}", st["e"]), st["e"]


def test_streaming_over_http(backend):
    @function
    def prog(s):
        s += "Count: one, two,"
        s += gen("rest", max_tokens=8, temperature=0)

    st = prog.run(backend=backend, stream=True)
    pieces = list(st.text_iter("rest"))
    assert len(pieces) > 1 and "".join(pieces) == st["rest"]

    @function
    def scored(s):  # logprobs asked for in gen reach the server and come back in the meta
        s += "Count: one, two," + gen("rest", max_tokens=4, temperature=0, return_logprob=True,
                                      return_text_in_logprobs=True)

    st = scored.run(backend=backend)
    assert "".join(text for _, _, text in st.get_meta_info("rest")["output_token_logprobs"]) == st["rest"]
