"""Strings under minLength / maxLength whose pattern's automaton is too large to build whole
(issue #31's corpus timeouts and 'the automaton is too large' refusals): the written body is a
subset of the pattern under the lengths, found in bounded time (fsm_crawl.limit), and its
random strings match the pattern and lie within the lengths."""

from __future__ import annotations

import contextlib
import json
import re
import types
from typing import Iterator

import interegular
import pytest
from test_json_schema_patterns import body_of, check_subset, random_strings, tree_strings

from treadle.constrained.regex import fsm_crawl


@contextlib.contextmanager
def within(steps: int) -> Iterator[None]:
    """Fails the test past ``steps`` of fsm_crawl work (the old code spent minutes on these
    schemas). Work, not seconds: the same on any machine at any load (about 2.5M steps a
    CPU-second here, so 25M is the ten seconds this once allowed)."""
    with fsm_crawl.limit():
        yield
        assert fsm_crawl.spent() <= steps, f"{fsm_crawl.spent():,} steps of work, past {steps:,}"


# ------------------------------------------------------------------ fsm_crawl.limit

def test_a_crawl_past_its_limit_stops_and_the_limit_ends_with_its_block() -> None:
    pattern = interegular.parse_pattern("[ab]{0,40}a[ab]{8}")  # the DFA remembers the last 9 letters
    with pytest.raises(fsm_crawl.TooLarge):
        with fsm_crawl.limit(states=200):
            pattern.to_fsm()
    with fsm_crawl.limit(states=10_000_000, seconds=60):
        with pytest.raises(fsm_crawl.TooLarge):
            with fsm_crawl.limit(states=200, seconds=120):  # the tighter bound of each holds
                pattern.to_fsm()
    small = interegular.parse_pattern("x{2,5}").to_fsm()
    with fsm_crawl.limit(states=200):
        assert interegular.parse_pattern("x{2,5}").to_fsm().equivalent(small)
    assert len(pattern.to_fsm().states) > 200  # no limit outside the block


def test_a_deadline_stops_a_long_crawl(monkeypatch) -> None:
    """The clock is the crawl's own, advanced 5 ms each time it is read: 0.2 s pass after 40
    reads, whatever the machine's load. The crawl (minutes of work unbounded) reads it at each
    alphabet union and every 64 states, and stops at the first read past its deadline (some
    280,000 steps in); a crawl that never read it would run into the steps bound around it."""
    clock = [0.0]

    def tick() -> float:
        clock[0] += 0.005
        return clock[0]

    monkeypatch.setattr(fsm_crawl, "time", types.SimpleNamespace(perf_counter=tick))
    with fsm_crawl.limit(steps=5_000_000):
        with pytest.raises(fsm_crawl.TooLarge, match="deadline"):
            with fsm_crawl.limit(seconds=0.2):
                interegular.parse_pattern("^https://([.\\-_a-zA-Z0-9]+/?){3,1016}$"[1:-1]).to_fsm()
    assert 0.2 < clock[0] <= 0.2 + 3 * 0.005, clock[0]  # read until the deadline passed, then no more


def test_too_large_passes_through_code_that_catches_exception() -> None:
    with pytest.raises(fsm_crawl.TooLarge):
        with fsm_crawl.limit(states=50):
            try:
                interegular.parse_pattern("[ab]*a[ab]{8}").to_fsm()
            except Exception:  # noqa: BLE001 (what interegular's callers write)
                pytest.fail("caught as an Exception")


# ------------------------------------------------------------------ the corpus timeouts

@pytest.mark.parametrize("schema", [
    # AWS::SageMaker::Space / Domain / UserProfile: a nested counted repetition under maxLength
    {"pattern": "^https://([.\\-_a-zA-Z0-9]+/?){3,1016}$", "maxLength": 256},
    # AWS::DataSync::LocationAzureBlob: a counted group holding '.', under maxLength
    {"pattern": "^https://[A-Za-z0-9]((.|-+)?[A-Za-z0-9]){0,252}/[a-z0-9](-?[a-z0-9]){2,62}$", "maxLength": 325},
    # AWS::Omics::SequenceStore: a minLength of 0 says nothing
    {"pattern": "^$|^s3://([a-z0-9][a-z0-9-.]{1,61}[a-z0-9])/?((.{1,1024})/)?$", "minLength": 0},
    # AWS::RedshiftServerless::Namespace: lookaheads under 8..64
    {"pattern": "^(?=.*[a-z])(?=.*[A-Z])(?=.*\\d)[^\\x00-\\x20\\x22\\x27\\x2f\\x40\\x5c\\x7f-\\uffff]+",
     "minLength": 8, "maxLength": 64},
])
def test_big_patterns_under_lengths_are_written_in_bounded_time(schema: dict) -> None:
    with within(25_000_000):
        body = body_of(schema)
    strings = check_subset(schema, 80, sample=tree_strings)
    assert len(set(strings)) > 10, body[:300]


# ------------------------------------------------------------------ refused before as too large

@pytest.mark.parametrize("schema", [
    # AWS::RTBFabric::Link: ECMA binds ^ to the first branch and $ to the last; each branch fitted
    {"pattern": "^DEFAULT|4XX|5XX|\\d{3}$", "minLength": 3, "maxLength": 7},
    # AWS::HealthImaging::Datastore: the optional image set alone passes maxLength 127
    {"pattern": "^arn:aws((-us-gov)|(-iso)|(-iso-b)|(-cn))?:medical-imaging:[a-z0-9-]+:[0-9]{12}:datastore/"
                "[0-9a-z]{32}(/imageset/[0-9a-z]{32})?$", "minLength": 1, "maxLength": 127},
])
def test_patterns_too_large_under_lengths_are_written(schema: dict) -> None:
    with within(25_000_000):
        body_of(schema)
    strings = check_subset(schema, 80)
    assert len(set(strings)) > 10


def test_every_branch_that_fits_is_kept() -> None:
    body = body_of({"pattern": "^DEFAULT|4XX|5XX|\\d{3}$", "minLength": 3, "maxLength": 7})
    for s in ("DEFAULT", "4XX", "5XXb", "123", "xy123"):
        assert re.fullmatch(body, s), s


# ------------------------------------------------------------------ minLength past 256

@pytest.mark.parametrize("schema", [
    {"pattern": ".*", "minLength": 1000, "maxLength": 10_000_000},  # AWS::FinSpace::Environment
    {"pattern": "^[a-z]+$", "minLength": 1000, "maxLength": 2000},
    {"pattern": "^x[a-z]*", "minLength": 300},
])
def test_a_long_minimum_length_is_written(schema: dict) -> None:
    body = body_of(schema)
    strings = check_subset(schema, 20, sample=tree_strings)
    assert any(len(s) >= schema["minLength"] for s in strings), body


# ------------------------------------------------------------------ a pattern every string holds

def test_a_pattern_found_in_every_string_asserts_nothing() -> None:
    schema = {"type": "string", "pattern": "(\\w|\\d|\\s|\\\\|-|\\.:=+-)*", "maxLength": 128}  # RDS::DBProxyEndpoint
    body = body_of(schema)
    for s in tree_strings(body, 40, seed=3):
        value = json.loads('"' + s + '"')
        assert re.search(schema["pattern"], value) and len(value) <= 128
    assert re.fullmatch(body, 'a\\"b\\n')  # any string, escapes too
    for pattern in ("^a*", "a*$", "a*\\b", "(?!x)", "a"):  # these may assert something
        assert body_of({"type": "string", "pattern": pattern, "maxLength": 3}) != body_of({"type": "string", "maxLength": 3})


def test_a_cron_pattern_with_word_boundaries_under_lengths_is_written() -> None:
    # AWS::DataZone::DataSource (its walks validated in the corpus run: the body's automaton
    # is too large for random_strings)
    schema = {"pattern": "cron\\((\\b[0-5]?[0-9]\\b) (\\b2[0-3]\\b|\\b[0-1]?[0-9]\\b) (.*){1,5} (.*){1,5} (.*){1,5} "
                         "(.*){1,5}\\)", "minLength": 1, "maxLength": 256}
    with within(25_000_000):
        body = body_of(schema)
    for s in ("cron(0 12 * * ? *)", "cron(15 10 ? * 6L 2002)"):
        assert re.search(schema["pattern"], s) and re.fullmatch(body, s), s
    assert not re.fullmatch(body, "cron(0 24 * * ? *)")


# ------------------------------------------------------------------ a format under a maxLength

@pytest.mark.parametrize("fmt,hi", [("email", 100), ("hostname", 30), ("email", 12)])
def test_a_format_under_a_max_length_is_written_shorter(fmt: str, hi: int) -> None:
    # schemastore band-manifest.json: contactEmail, format email, maxLength 100 (refused before:
    # the format's strings reach 175 characters)
    import jsonschema

    from treadle.constrained.regex.regex_text import FORMATS

    schema = {"type": "string", "format": fmt, "maxLength": hi}
    body = body_of(schema)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    strings = random_strings(body, 60, max_len=hi)
    assert len(set(strings)) > 20
    for s in strings:
        assert re.fullmatch(FORMATS[fmt], s) and len(s) <= hi and checker.conforms(s, fmt), s


# ------------------------------------------------------------------ a format with a pattern

def test_a_format_with_a_pattern_keeps_the_branches_inside_it() -> None:
    # the 2019-09 / 2020-12 core vocabularies' $id: format uri-reference, pattern ^[^#]*#?$
    # (their product's regex passed 20,000 characters: refused before)
    from treadle.constrained.regex.regex_text import FORMATS

    schema = {"format": "uri-reference", "pattern": "^[^#]*#?$"}
    body = body_of(schema)
    strings = random_strings(body, 80)
    assert any("://" in s for s in strings) and any("://" not in s for s in strings)
    for s in strings:
        assert re.search(schema["pattern"], s) and re.fullmatch(FORMATS["uri-reference"], s), s


@pytest.mark.parametrize("fmt", ["uri", "iri", "uri-reference", "iri-reference"])
def test_a_uri_format_under_a_url_pattern_writes_the_web_urls_it_matches(fmt: str) -> None:
    # gitlab-ci's include remote: format uri-reference, pattern ^https?://.+\.ya?ml$ (the product
    # of the whole URI format with the pattern writes past 20,000 characters: refused before)
    import jsonschema
    import rfc3987

    from treadle.constrained.schema.json_schema import _WEB_URLS
    from treadle.constrained.regex.regex_text import FORMATS

    web, whole = interegular.parse_pattern(_WEB_URLS).to_fsm(), interegular.parse_pattern(FORMATS[fmt]).to_fsm()
    assert (web - whole).empty()  # every web URL is of the format
    schema = {"format": fmt, "pattern": "^https?://.+\\.ya?ml$"}
    strings = random_strings(body_of(schema), 60)
    assert len(set(strings)) > 20
    for s in strings:
        assert re.search(schema["pattern"], s), s
        assert rfc3987.match(s, rule="URI") and jsonschema.Draft202012Validator.FORMAT_CHECKER.conforms(s, fmt), s
