"""/generate with a list of prompts, one of them with a bad grammar (an invalid regex, a refused
JSON schema, an EBNF that does not parse): a 400 naming the bad prompt by its index and the
field, before any of the batch runs (it was a 400 with the grammar's error alone, after the
good prompts had started; a stream could start streaming the good ones, then end in an error
event). The same for stream=True and for n samples of one prompt (their shared prompt was
prefilled first, for nothing)."""
from __future__ import annotations

import json
import os
import re

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, wait_idle
from batch_grammar_cases import BAD, GREEDY, PROMPTS  # tests/batch_grammar_cases.py

pytestmark = pytest.mark.slow
T = 120


@pytest.fixture(scope="module")
def srv(plain_server):
    return plain_server  # shared with other modules (conftest.py); its counters are read as differences


def post(srv, body: dict, **kw) -> requests.Response:
    return requests.post(srv.url + "/generate", data=json.dumps(body), headers={"Content-Type": "application/json"},
                         timeout=T, **kw)


def ran(srv) -> tuple[int, int]:
    """(requests the scheduler took, prompt tokens it computed) so far, once idle."""
    info = wait_idle(srv.url)
    return info["requests"], info["prompt_tokens"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_grammar_in_a_batch_is_a_400_naming_its_index_and_nothing_runs(srv, kind, stream):
    bad, word = BAD[kind]
    before = ran(srv)
    r = post(srv, {"text": PROMPTS, "stream": stream,
                   "sampling_params": [GREEDY, {**GREEDY, **bad}, {**GREEDY, "regex": "[a-z]+"}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith("prompt 1 of the batch: ") and word in err["message"], err
    assert err["param"] == f"sampling_params[1].{kind}", err
    assert ran(srv) == before  # nothing of the batch reached the scheduler
    good = post(srv, {"text": [PROMPTS[0], PROMPTS[2]], "sampling_params": [GREEDY, {**GREEDY, "regex": "[a-z]+"}]})
    assert good.status_code == 200, good.text
    assert good.json()[1]["text"].isalpha(), good.text


def test_every_bad_prompt_is_named(srv):
    r = post(srv, {"text": PROMPTS, "sampling_params": [{**GREEDY, "ebnf": "root ::= ("}, GREEDY,
                                                         {**GREEDY, "regex": "(ab"}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith("prompts 0, 2 of the batch "), err
    assert err["param"] == "sampling_params[0].ebnf", err


def test_n_samples_of_a_bad_grammar_prefill_nothing(srv):
    before = ran(srv)
    for body in ({"text": PROMPTS[0], "sampling_params": {**GREEDY, "regex": "(ab", "n": 3}},
                 {"text": PROMPTS[:2], "sampling_params": {**GREEDY, "regex": "(ab"}}):
        r = post(srv, body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]  # one params object for all: the grammar's own error, as one request's
        assert err["param"] == "regex" and err["message"].startswith("grammar compilation failed"), err
    assert ran(srv) == before
    ok = post(srv, {"text": PROMPTS[0], "sampling_params": {**GREEDY, "regex": "[0-9]{2}", "n": 2}})
    assert ok.status_code == 200 and [x["text"].isdigit() for x in ok.json()] == [True, True], ok.text


def compile_workers(server: ServerProcess) -> set[int]:
    """The pids of a server's grammar compile workers (processes of its session)."""
    pids = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            if b"treadle.constrained.compile.compile_worker" in cmd and os.getsid(int(entry)) == server.proc.pid:
                pids.add(int(entry))
        except (ValueError, OSError):
            continue  # not a process, or one that ended meanwhile
    return pids


def test_a_client_leaving_while_its_batch_grammars_compile_frees_the_compile_worker():
    """The grammars of a batch compile before any of it is sent: a client that leaves then
    stops those compiles (the worker building one is replaced at once), as an aborted request
    stops its own; before, the one worker built the left batch's minute-long grammar to its
    end while the next client's grammar queued behind it. Checked by what happened, not by
    seconds: the next grammar compiled on a new worker, and the left one never joined the
    cache (built to its end, it would have; timed out, it would be there as failed)."""
    slow = "(" + "|".join(f"zz{i}[a-z]{{0,5}}" for i in range(4000)) + ")"  # outlines' index: a minute or more
    with ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning", "--grammar-index", "outlines",
                        "--grammar-compile-workers", "1", "--grammar-compile-timeout-s", "600",
                        "--grammar-max-size", str(10 ** 9)]) as s:
        ok = post(s, {"text": "Hi", "sampling_params": {**GREEDY, "regex": "ok"}})  # the worker is up
        assert ok.status_code == 200, ok.text
        (first,) = compile_workers(s)
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(s.url + "/generate", json={"text": PROMPTS[:2], "sampling_params": [
                GREEDY, {**GREEDY, "regex": slow}]}, timeout=3)
        r = post(s, {"text": "Pick a number:", "sampling_params": {"max_new_tokens": 8, "regex": "[0-9]{3}q"}})
        assert r.status_code == 200 and re.fullmatch("[0-9]{3}q", r.json()["text"]), r.text
        info = wait_idle(s.url)
        assert info["requests"] == 2 and info["free_slots"] + info["evictable_slots"] == info["total_slots"]
        cache = info["grammar_cache"]
        assert cache["entries"] == cache["compiled"] == 2, f"the left batch's grammar was compiled: {cache}"
        assert first not in compile_workers(s), "the worker that built the left batch's grammar went on"
