"""A schema's verdict is a function of the schema, not of the machine's load (session 40).

The translation's bounds on pattern automata were wall-clock budgets (``fsm_crawl.limit(seconds=)``,
json_schema's _LENGTH_SECONDS, _NARROW_SECONDS, _RESHAPE_SECONDS, LENIENT_MAX_SECONDS): the same
schema was written one way on a quiet box and another (narrower, or refused) under load, and the
compiler cached whichever came first. They are now counted in work (fsm_crawl's steps), and the
compile's wall-clock timeout, the last-resort net, is no verdict: remembered for TIMEOUT_MEMORY_S only.

The tests compare verdicts (the regex written, or the refusal's message), never durations: a
slower clock is simulated by scaling ``time.perf_counter`` in a subprocess (deterministic; the
old budgets read it), and a real load by busy-loop subprocesses beside the compile.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys

import interegular
import pytest

from treadle.constrained import GrammarCompiler, GrammarSpec
from treadle.constrained.compile.compiler import GrammarCompileError, GrammarCompileTimeout
from treadle.constrained.regex import fsm_crawl, regex_ecma

# real patterns whose writing under their lengths took the old budgets' paths: CloudFormation's
# Bedrock model ARNs (AWS::Bedrock::Agent FoundationModel, a Flow's / Guardrail's ModelArn),
# SageMaker's space URLs, and a URL pattern under maxLength 40
SCHEMAS = {
    "bedrock-agent": {"type": "string", "minLength": 1, "maxLength": 2048, "pattern":
                      "^arn:aws(-[^:]+)?:bedrock:[a-z0-9-]{1,20}:(([0-9]{12}:custom-model/[a-z0-9-]{1,63}[.]{1}"
                      "[a-z0-9-]{1,63}/[a-z0-9]{12})|(:foundation-model/[a-z0-9-]{1,63}[.]{1}[a-z0-9-]{1,63}))$"},
    "bedrock-model": {"type": "string", "minLength": 1, "maxLength": 2048, "pattern":
                      "^arn:aws(-[^:]+)?:bedrock:[a-z0-9-]{1,20}:(([0-9]{12}:custom-model/[a-z0-9-]{1,63}[.]{1}"
                      "[a-z0-9-]{1,63}(([:][a-z0-9-]{1,63}){0,2})?/[a-z0-9]{12})|(:foundation-model/([a-z0-9-]{1,63}"
                      "[.]{1}[a-z0-9-]{1,63}([.]?[a-z0-9-]{1,63})([:][a-z0-9-]{1,63}){0,2})))|(([0-9a-zA-Z][_-]?)+)$"},
    "sagemaker-url": {"type": "string", "maxLength": 256, "pattern": "^https://([.\\-_a-zA-Z0-9]+/?){3,1016}$"},
    "url-40": {"type": "string", "maxLength": 40, "pattern": "^https?://[a-zA-Z0-9.-]+(:[0-9]+)?(/.*)?$"},
}
# through the opt-in leniency (drop_unenforceable, all its rounds under one budget): a password
# rule of lookaheads (AWS::RedshiftServerless::Namespace) beside a Bedrock ARN (before: on a
# loaded box both patterns were dropped as "too large", or the schema refused outright)
LENIENT = {"type": "object", "properties": {
    "password": {"type": "string", "minLength": 8, "maxLength": 64, "pattern":
                 "^(?=.*[a-z])(?=.*[A-Z])(?=.*\\d)[^\\x00-\\x20\\x22\\x27\\x2f\\x40\\x5c\\x7f-\\uffff]+"},
    "model": SCHEMAS["bedrock-agent"]}}

# prints {name: verdict}; argv: the factor the clock runs slower by (the machine's load, as the
# old budgets saw it), then the names
_VERDICTS = """
import json, sys, time
factor = float(sys.argv[1])
real = time.perf_counter
t0 = real()
time.perf_counter = lambda: t0 + (real() - t0) * factor
from treadle.constrained.schema.json_schema import drop_unenforceable, json_schema_to_regex
schemas = json.loads(sys.stdin.read())
out = {}
for name, schema in schemas.items():
    try:
        if name == "lenient":
            out[name] = "dropped " + json.dumps(drop_unenforceable(schema)[1])
        else:
            out[name] = "regex " + json_schema_to_regex(schema)
    except ValueError as e:
        out[name] = "refused " + str(e)
print(json.dumps(out))
"""


def _verdicts(factor: float, schemas: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", _VERDICTS, str(factor)], input=json.dumps(schemas),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@functools.lru_cache(maxsize=None)
def _quiet() -> str:
    """The verdicts at the real clock with no load beside, computed once for both tests below."""
    return json.dumps(_verdicts(1.0, {**SCHEMAS, "lenient": LENIENT}))


def test_a_slower_clock_gives_the_same_verdicts():
    """A clock 4x slower is a machine 4x busier to a wall-clock budget (before: the Bedrock ARNs
    and the SageMaker URL were written narrower, the loaded box's regex differing)."""
    quiet = json.loads(_quiet())
    assert quiet.pop("lenient") == "dropped []"  # (nothing: both patterns are written)
    assert all(v.startswith("regex ") for v in quiet.values()), quiet
    assert _verdicts(4.0, {**SCHEMAS, "lenient": LENIENT}) == {**quiet, "lenient": "dropped []"}


def test_a_loaded_cpu_gives_the_same_verdicts():
    """Two busy loops beside the translation (the box has two cores)."""
    quiet = json.loads(_quiet())
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        loaded = _verdicts(1.0, {**SCHEMAS, "lenient": LENIENT})
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert loaded == quiet


# ------------------------------------------------------------------ fsm_crawl's work budget

HARD = "[ab]{0,40}a[ab]{8}"  # its DFA remembers the last 9 letters: ~440,000 steps of work


def _build() -> None:
    interegular.parse_pattern(HARD).to_fsm()  # (a fresh parse: a parsed pattern keeps its alphabet)


def test_a_work_budget_stops_a_crawl_and_counts_every_crawl_inside():
    with fsm_crawl.limit():
        _build()
        cost = fsm_crawl.spent()
    assert 100_000 < cost < 2_000_000, cost
    with fsm_crawl.limit(steps=cost):  # the same work again fits exactly ...
        _build()
    with pytest.raises(fsm_crawl.TooLarge) as e, fsm_crawl.limit(steps=cost - 1):  # ... less does not
        _build()
    assert e.value.work
    with pytest.raises(fsm_crawl.TooLarge), fsm_crawl.limit(steps=cost + cost // 2):  # two crawls add up
        _build()
        _build()


def test_an_inner_limit_does_not_swallow_its_outer_budget():
    """Inside a limit whose budget is spent, the handler of an inner limit (which would try a
    narrower pattern) is passed: the work stops at the limit whose budget it was."""
    tried = []
    with pytest.raises(fsm_crawl.TooLarge), fsm_crawl.limit(steps=50_000):
        for _ in range(3):
            try:
                with fsm_crawl.limit(steps=10**9):
                    _build()
            except fsm_crawl.TooLarge:
                tried.append("narrower")
    assert tried == []
    with fsm_crawl.limit(steps=10**9):  # an inner budget of its own is the inner handler's
        with pytest.raises(fsm_crawl.TooLarge), fsm_crawl.limit(steps=50_000):
            _build()


def test_a_remembered_automaton_is_charged_its_work():
    """regex_ecma's automata are remembered per regex: the first call in a translation (an
    outermost limit) costs what building it costs, later ones in it are free, as if the memory
    were empty when the translation began; so a verdict does not depend on what the process
    built before (before: a remembered automaton passed any limit at no cost)."""
    regex_ecma._fsm.cache_clear()
    regex_ecma._fsm(HARD)  # built outside any limit, remembered
    with pytest.raises(fsm_crawl.TooLarge), fsm_crawl.limit(states=200):
        regex_ecma._fsm(HARD)
    with pytest.raises(fsm_crawl.TooLarge), fsm_crawl.limit(steps=50_000):
        regex_ecma._fsm(HARD)
    with fsm_crawl.limit():
        regex_ecma._fsm(HARD)
        charged = fsm_crawl.spent()
        regex_ecma._fsm(HARD)  # (remembered within this translation: as a fresh memory would)
        assert fsm_crawl.spent() == charged
    with fsm_crawl.limit():
        _build()
        assert charged == fsm_crawl.spent()


# ------------------------------------------------------------------ the compile's timeout

EOS, V = 2, 49152
HEAVY = r"[a-z]{0,1000}"  # outlines-core's index of it takes seconds


def test_a_timeout_is_remembered_a_while_not_for_good(smol, monkeypatch):
    """The compile's wall-clock timeout is the last-resort net, not a verdict: a spec that timed
    out answers with that timeout for TIMEOUT_MEMORY_S (a client repeating it holds no worker),
    then is compiled afresh (before c394793: remembered for good; between it and this: never,
    so each repeat held a worker for the whole limit)."""
    from treadle.constrained.compile import compiler

    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=0.2, token_index="outlines") as c:
        spec = GrammarSpec.from_params(regex=HEAVY)
        first = c.compile_async(spec)
        with pytest.raises(GrammarCompileTimeout, match="timed out after 0.2s"):
            first.result()
        assert isinstance(first.exception(), GrammarCompileError)  # (still what callers catch)
        assert c.compile_async(spec) is first  # within TIMEOUT_MEMORY_S: the same answer, at once
        monkeypatch.setattr(compiler, "TIMEOUT_MEMORY_S", 0.0)
        other = GrammarSpec.from_params(regex=HEAVY + "x")
        timed_out = c.compile_async(other)
        with pytest.raises(GrammarCompileTimeout):
            timed_out.result()
        again = c.compile_async(other)  # remembered no longer: compiled again
        assert again is not timed_out
        with pytest.raises(GrammarCompileTimeout):
            again.result()
        bad = GrammarSpec.from_params(regex="a(?=b)")  # a refusal on the grammar's merits stays cached
        with pytest.raises(ValueError, match="lookahead"):
            c.compile(bad)
        assert c.compile_async(bad) is c.compile_async(bad)
