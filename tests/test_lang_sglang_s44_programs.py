"""Session 44's porting checks: SGLang programs and benchmark scripts, their import changed to
treadle's and nothing else, on a RuntimeEndpoint of the shared plain_server (the real embedded
model behind real HTTP). Each is something the port did differently from SGLang before."""
from __future__ import annotations

import logging

import pytest

import treadle as sgl
from treadle.utils import dump_state_text


@pytest.fixture(scope="module")
def backend(plain_server):
    be = sgl.RuntimeEndpoint(plain_server.url)
    sgl.set_default_backend(be)
    yield be
    sgl.set_default_backend(None)


def _requests(backend) -> int:
    return backend.get_server_info()["requests"]


@sgl.function
def expand(s, tip):
    s += "Please expand the following tip into a detailed paragraph: " + tip + "\n"
    s += sgl.gen("detailed_tip", max_tokens=2)


@sgl.function
def tip_suggestion(s, topic):
    # SGLang's tip_suggestion benchmark: a program calls another one directly, before its own gens
    tip = expand(tip="Sleep eight hours.")
    s += tip["detailed_tip"] + "\nTopic: " + topic + "\n" + sgl.gen("summary", max_tokens=2)


def test_run_batch_traces_a_program_the_body_calls_without_generating(backend):
    """run_batch traces its program once to cache the constant prefix; a program the body calls
    (`expand(tip=...)`) is traced too, as in SGLang's tracing scope, and generates nothing. It ran
    for real before: one more gen, and its output cached as the batch's constant prefix (6
    requests where SGLang makes 4)."""
    before = _requests(backend)
    states = tip_suggestion.run_batch([{"topic": "health"}, {"topic": "money"}], temperature=0)
    assert all(st.error() is None for st in states)
    assert states[0].text().endswith("\nTopic: health\n" + states[0]["summary"])
    assert _requests(backend) - before == 4  # each run: expand's gen and its own; no tracing request


@sgl.function
def few_shot(s, question, n):
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=n, stop="\n")


def test_dump_state_text_writes_a_failed_states_text(backend, tmp_path):
    """SGLang's benchmarks end with `dump_state_text(file, states)`; a run_batch item whose gen the
    server refused keeps its error (`state.error()`), and its text is written, as SGLang's
    `text()` gives it. It raised the item's error before, losing the whole file."""
    states = few_shot.run_batch([{"question": "What is 1+1?", "n": 3}, {"question": "Why?", "n": -1}],
                                temperature=0)
    assert states[0].error() is None and isinstance(states[1].error(), ValueError)
    path = tmp_path / "tmp_output_srt.txt"
    dump_state_text(str(path), states)
    written = path.read_text()
    assert states[0].text() in written and "=" * 40 + " 1 " in written and "Q: Why?\nA:" in written


@sgl.function
def number(s, i):
    s += f"Number {i}:" + sgl.gen("a", max_tokens=1)


def test_run_batch_over_http_keeps_every_connection(backend, caplog):
    """run_batch's threads (num_threads="auto": one per program here) share the endpoint's
    HTTP connections. The pool held 10: each request past that opened a connection and dropped
    it, urllib3 logging "Connection pool is full, discarding connection" once per request."""
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        states = number.run_batch([{"i": i} for i in range(24)], temperature=0)
    assert all(st.error() is None for st in states)
    assert [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()] == []


@sgl.function
def colors(s, n):
    s += "Name a color:"
    forks = s.fork(n, position_ids_offset=[0] * int(n))  # SGLang takes the offsets and uses none of them
    forks += sgl.gen("color", max_tokens=2)
    forks.join()
    with s.copy(position_ids_offset=[0]) as branch:
        branch += sgl.gen("again", max_tokens=2)


def test_fork_takes_sglangs_arguments_as_sglang_does(backend):
    """SGLang's fork takes `int(size)` (a numpy int from a config or an array) and a
    `position_ids_offset` it does not use (the branches continue the parent's positions, here
    too); run_batch's `num_threads` is any int. Each was a ValueError before."""
    import numpy as np

    states = colors.run_batch([{"n": np.int64(2)}, {"n": np.int32(1)}], num_threads=np.int64(2), temperature=0)
    assert [len(st["color"]) for st in states] == [2, 1]
    assert states[0]["color"][0] == states[0]["color"][1] == states[1]["color"][0]
    assert states[0]["again"] == [states[0]["color"][0]]  # the copy continues the same text


def test_the_tutorials_image_cell_fails_naming_text_only_models(backend, tmp_path):
    """SGLang's frontend tutorial loads its image with `from sglang.srt.utils import load_image`
    (and the vision docs encode one with `sglang.utils.encode_image_base64`): the imports were an
    ImportError ("cannot import name 'load_image'") that says nothing of images. Now the import
    works, encoding works as SGLang's, and using an image says treadle serves text-only models."""
    import base64

    from treadle.srt.utils import load_image
    from treadle.utils import encode_image_base64

    path = tmp_path / "example_image.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n not really an image")
    assert encode_image_base64(str(path)) == encode_image_base64(path.read_bytes()) \
        == base64.b64encode(path.read_bytes()).decode()
    with pytest.raises(ValueError, match="text-only models"):
        load_image(str(path))

    @sgl.function
    def image_qa(s, image_file, question):
        s += sgl.user(sgl.image(image_file) + question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=8))

    with pytest.raises(ValueError, match="text-only models"):
        image_qa(encode_image_base64(str(path)), "What is in the image?")


@sgl.function
def answer_from(s, question, documents):
    # SGLang's multi-document QA, with as many branches as documents: none retrieved is none forked
    s += "Question: " + question + "\n"
    forks = s.fork(len(documents))
    forks += lambda i: "Document: " + documents[i] + "\nRelevant:" + sgl.select("relevant", ["yes", "no"])
    forks.join()
    s += "Answer:" + sgl.gen("answer", max_tokens=2)


def test_fork_of_zero_branches_is_an_empty_group(backend):
    """SGLang's fork(0) makes no branches and its join gathers nothing; it was a ValueError
    ("fork needs n >= 1"), so a program forking once per retrieved document failed when none was
    found. A negative size stays refused."""
    none, one = answer_from.run_batch([{"question": "Why?", "documents": []},
                                       {"question": "Why?", "documents": ["Because."]}], temperature=0)
    assert none.error() is None and "relevant" not in none
    assert none.text() == "Question: Why?\nAnswer:" + none["answer"]
    assert one["relevant"][0] in ("yes", "no")

    @sgl.function
    def negative(s):
        s += "x"
        s.fork(-1)

    with pytest.raises(ValueError, match="fork"):
        negative.run()
