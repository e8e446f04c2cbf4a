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
from treadle.constrained.regex import regex_text
from treadle.constrained.schema.json_schema import json_schema_to_regex

EOS = 2
V = 49152  # the embedded SmolLM2's
BLOWUP = "(a|b)*a(a|b){%d}"  # the classic: its DFA remembers the last k+1 letters


@pytest.fixture(scope="module")
def compiler(smol):
    # a short limit: before the fix, the schema path of BLOWUP % 20 ran into it
    c = GrammarCompiler(smol, [EOS], vocab_size=V, max_workers=2, timeout_s=5)
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
def test_a_blowup_pattern_in_a_schema_compiles_in_a_second(compiler, schema, good, bad):
    t0 = time.perf_counter()
    g = compiler.compile(GrammarSpec.from_params(json_schema=schema))
    took = time.perf_counter() - t0
    assert took < 3, took  # (before: the 5 s limit, "timed out")
    if good is not None:
        assert re.fullmatch(g.regex, json.dumps(good))
    if bad is not None:
        assert not re.fullmatch(g.regex, json.dumps(bad))


@pytest.mark.parametrize("schema", [
    {"type": "string", "not": {"pattern": BLOWUP % 30}},
    {"type": "string", "pattern": "^(?!c)" + BLOWUP % 30 + "$"},
], ids=["not-pattern", "lookahead"])
def test_an_exponential_automaton_is_refused_within_seconds(smol, schema):
    """The automata a schema needs exactly stop at MAX_AUTOMATON_STATES: a 400 naming it in a
    few seconds, not the whole compile time limit (before: "timed out", or out of memory)."""
    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=30) as c:
        c.compile(GrammarSpec.from_params(regex="[0-9]"))  # the worker started
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=r"automaton the schema needs passes 100,000 states"):
            c.compile(GrammarSpec.from_params(json_schema=schema))
        assert time.perf_counter() - t0 < 20


def test_the_lenient_translation_stops_too():
    """json_schema_lenient translates the schema where the request arrives, with no compile
    worker's timeout around it: it stops at the same cap (before: minutes and gigabytes)."""
    code = ("from treadle.constrained.schema.json_schema import drop_unenforceable\n"
            "try:\n"
            f"    drop_unenforceable({{'type': 'string', 'not': {{'pattern': {BLOWUP % 30!r}}}}})\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "automaton the schema needs passes" in out.stdout, out.stdout + out.stderr[-2000:]
    assert time.perf_counter() - t0 < 30


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
        t0 = time.monotonic()
        r = requests.post(srv.url + path, json=body, timeout=T)
        got[name] = (r, time.monotonic() - t0)

    threads = [threading.Thread(target=post, args=(name,)) for name in jobs]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(T)
    for name in ("reported", "grammar", "plain"):
        assert got[name][0].status_code == 200, (name, got[name][0].text)
    slow, took = got["slow"]
    assert slow.status_code == 400, slow.text
    assert "grammar compile time limit" in slow.json()["error"]["message"] and "timed out after 2s" in slow.text
    assert took < 120, took
    text = got["reported"][0].json()["choices"][0]["message"]["content"]
    assert re.fullmatch(r'"[^"]*', text) or re.fullmatch(r'"[^"]*"', text), text
    assert re.fullmatch("[0-9]{1,3}", got["grammar"][0].json()["text"])
    # the refusal is remembered: asked again, it is at once
    t0 = time.monotonic()
    again = requests.post(srv.url + "/generate", json=jobs["slow"][1], timeout=T)
    assert again.status_code == 400 and time.monotonic() - t0 < 10
    assert again.json()["error"]["message"] == slow.json()["error"]["message"]
