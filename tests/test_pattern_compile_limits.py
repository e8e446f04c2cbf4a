"""A JSON schema's pattern compiles as cheaply as the same regex sent as a ``regex`` constraint,
and what cannot be cheap is refused within seconds instead of holding a compile worker for the
whole compile time limit.

A hostile client's ``{"type": "string", "pattern": "(a|b)*a(a|b){30}"}`` (a DFA of 2^31 states)
ran into the 60 s compile timeout while the regex compiled in a fraction of a second: the
schema path checked that the pattern writes no character JSON must escape on interegular's
DFA. That check now reads the pattern's parse tree (regex_text._tree_verdict); the automata a
schema still needs exactly (a pattern under assertions, a ``not`` of a pattern, ...) stop at
json_schema.MAX_AUTOMATON_STATES. Each test failed on the code before the fix (the patterns are
smaller copies of the reported ones where the shape is all that matters).

No test here reads a clock (session 40): a compile once ran 7.9 s under load past a "< 3 s"
assertion. They check the verdict, and the work the translation did in fsm_crawl's steps (the
budgets are counted in work, so that work is the same on any machine at any load).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import interegular
import pytest
import requests

from treadle.constrained import GrammarCompiler, GrammarSpec
from treadle.constrained.regex import fsm_crawl, regex_text
from treadle.constrained.schema.json_schema import MAX_AUTOMATON_STATES, json_schema_to_regex

EOS = 2
V = 49152  # the embedded SmolLM2's
BLOWUP = "(a|b)*a(a|b){%d}"  # the classic: its DFA remembers the last k+1 letters


@pytest.fixture(scope="module")
def compiler(smol):
    # a limit that only a hang reaches (the verdicts below do not depend on the load)
    c = GrammarCompiler(smol, [EOS], vocab_size=V, max_workers=2, timeout_s=120)
    yield c
    c.close()


def test_a_plain_pattern_builds_no_dfa(monkeypatch):
    """The JSON-escape check of a pattern reads its parse tree: no interegular automaton."""
    def refuse(pattern):
        raise AssertionError(f"interegular asked to build the automaton of {pattern!r}")

    monkeypatch.setattr(interegular, "parse_pattern", refuse)
    for k in (20, 30):
        body = regex_text.pattern_to_body(BLOWUP % k)
        assert body.endswith(f"(?:{BLOWUP % k})" + regex_text.SAFE_RAW_CHAR + "*")
        json_schema_to_regex({"type": "string", "pattern": "^" + BLOWUP % k + "$"})


@pytest.mark.parametrize("pattern, matches, unsafe", [
    ("(a|b)*a(a|b){3}", True, False),
    ('a|"', True, True),
    ('a("){0}', True, False),          # a part that never repeats writes nothing
    ('(a|"){2}', True, True),
    ("(\\n){0}x", True, False),
    ("x(\\t)?", True, True),
    ("x(\\t)*y|z", True, True),
    ("x|\\\\", True, True),
    ("[^a-z]{2}", True, False),        # (its translation leaves out what JSON escapes)
    ("\\d+(\\.\\d+)?", True, False),
])
def test_the_tree_verdict_is_the_automatons(pattern, matches, unsafe):
    """(matches some string, may write a character JSON escapes): as interegular's DFA says."""
    translated = regex_text._scan(pattern, ecma=True, subset=True)
    fsm = interegular.parse_pattern(translated).to_fsm()
    safe = interegular.parse_pattern(regex_text.SAFE_RAW_CHAR + "*").to_fsm()
    assert (not fsm.empty(), not (fsm - safe).empty()) == (matches, unsafe)
    assert regex_text._tree_verdict(translated) == (matches, unsafe)


def test_the_tree_verdict_of_a_part_that_matches_nothing():
    nothing = "[^\\x00-\\U0010ffff]"  # (no translation writes it; the parse tree reads it)
    assert regex_text._tree_verdict(nothing + "\\n|y") == (True, False)  # that branch adds nothing
    assert regex_text._tree_verdict(nothing + "\\n") == (False, False)
    assert regex_text._tree_verdict("(" + nothing + "|\\n)*x") == (True, True)


CHEAP = [
    ({"type": "string", "pattern": BLOWUP % 20}, "xxbab" + "a" * 20 + "b", "b" * 40),
    ({"type": "string", "pattern": "^" + BLOWUP % 30 + "$"}, "ba" + "ab" * 15, "a" + "b" * 31),
    ({"type": "string", "pattern": "(x+x+)+y"}, "-xxxy-", "xxxx"),
    ({"type": "object", "properties": {"email": {"type": "string",
                                                 "pattern": "^[a-z]{1,60}@[a-z]{1,60}\\.[a-z]{2,10}$"}},
      "required": ["email"]}, None, None),
    ({"type": "string", "pattern": ".{0,5000}"}, "anything", None),
]


@pytest.mark.parametrize("schema, good, bad", CHEAP, ids=["unanchored", "anchored", "nested-plus", "email", "dot-5000"])
def test_a_blowup_pattern_in_a_schema_compiles_with_no_automaton(compiler, schema, good, bad):
    """The translation crawls no automaton at all (before: the DFA of BLOWUP % 20, 2^21 states,
    past the 5 s limit: "timed out"), and the grammar compiles."""
    with fsm_crawl.limit():
        json_schema_to_regex(schema)
        assert fsm_crawl.spent() == 0
    g = compiler.compile(GrammarSpec.from_params(json_schema=schema))
    if good is not None:
        assert re.fullmatch(g.regex, json.dumps(good))
    if bad is not None:
        assert not re.fullmatch(g.regex, json.dumps(bad))


@pytest.mark.parametrize("schema", [
    {"type": "string", "not": {"pattern": BLOWUP % 30}},
    {"type": "string", "pattern": "^(?!c)" + BLOWUP % 30 + "$"},
], ids=["not-pattern", "lookahead"])
def test_an_exponential_automaton_is_refused_after_bounded_work(smol, schema):
    """The automata a schema needs exactly stop at MAX_AUTOMATON_STATES: a 400 naming it after
    a few million steps of work (a second or two), not the whole compile time limit (before:
    "timed out", or out of memory: the DFA has 2^31 states)."""
    with fsm_crawl.limit():
        with pytest.raises(ValueError, match=r"automaton the schema needs passes 100,000 states"):
            json_schema_to_regex(schema)
        assert fsm_crawl.spent() < 60 * MAX_AUTOMATON_STATES
    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=120) as c:
        with pytest.raises(ValueError, match=r"automaton the schema needs passes 100,000 states"):
            c.compile(GrammarSpec.from_params(json_schema=schema))


def test_the_lenient_translation_stops_too():
    """json_schema_lenient translates the schema where the request arrives, with no compile
    worker's timeout around it: it stops at the same cap, after the same bounded work (before:
    minutes and gigabytes). In a subprocess, so that a regression costs no test process memory."""
    code = ("from treadle.constrained.regex import fsm_crawl\n"
            "from treadle.constrained.schema.json_schema import drop_unenforceable\n"
            "with fsm_crawl.limit():\n"
            "    try:\n"
            f"        drop_unenforceable({{'type': 'string', 'not': {{'pattern': {BLOWUP % 30!r}}}}})\n"
            "    except ValueError as e:\n"
            "        print(e)\n"
            "    print(fsm_crawl.spent())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "automaton the schema needs passes" in out.stdout, out.stdout + out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) < 60 * MAX_AUTOMATON_STATES


# ------------------------------------------------------------------ a real server

T = 300
SLOW = {"type": "string", "not": {"pattern": BLOWUP % 14}}  # ~10 s of exact automata, under the cap


@pytest.fixture(scope="module")
def srv():
    from treadle.runtime.server.testing import ServerProcess

    s = ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning", "--grammar-compile-timeout-s", "2"])
    yield s
    s.close()


@pytest.mark.slow
def test_a_slow_grammar_is_a_400_and_the_others_complete(srv):
    """Under a 2 s compile time limit: a grammar that needs longer is a 400 naming the limit,
    while a grammar request, a plain one and the reported schema (through the OpenAI API) that
    arrive meanwhile complete (before: the reported schema was a 400, timed out)."""
    sp = {"max_new_tokens": 6, "temperature": 0}
    jobs = {
        "slow": ("/generate", {"text": "x", "sampling_params": {**sp, "json_schema": json.dumps(SLOW)}}),
        "reported": ("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "a or b"}], "max_tokens": 6, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "ab", "schema": {"type": "string", "pattern": BLOWUP % 30}}}}),
        "grammar": ("/generate", {"text": "y", "sampling_params": {**sp, "regex": "[0-9]{3}"}}),
        "plain": ("/generate", {"text": "z", "sampling_params": sp}),
    }
    got: dict = {}

    def post(name: str) -> None:
        path, body = jobs[name]
        got[name] = requests.post(srv.url + path, json=body, timeout=T)

    threads = [threading.Thread(target=post, args=(name,)) for name in jobs]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(T)
    for name in ("reported", "grammar", "plain"):
        assert got[name].status_code == 200, (name, got[name].text)
    slow = got["slow"]
    assert slow.status_code == 400, slow.text
    assert "grammar compile time limit" in slow.json()["error"]["message"] and "timed out after 2s" in slow.text
    text = got["reported"].json()["choices"][0]["message"]["content"]
    assert re.fullmatch(r'"[^"]*', text) or re.fullmatch(r'"[^"]*"', text), text
    assert re.fullmatch("[0-9]{1,3}", got["grammar"].json()["text"])
    # asked again within TIMEOUT_MEMORY_S, the timeout is answered at once (no worker held): the
    # same 400
    again = requests.post(srv.url + "/generate", json=jobs["slow"][1], timeout=T)
    assert again.status_code == 400
    assert again.json()["error"]["message"] == slow.json()["error"]["message"]
