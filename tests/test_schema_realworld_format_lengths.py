"""A string ``format`` with a ``minLength`` above its shortest strings (a webhook URL of
``minLength: 10``, a non-empty ``uri-template`` / ``uri-reference``, ``format: regex`` under
``1..1000``) was a 400 "a key set's regex would exceed 20000 characters": the exact product of
the format's automaton with the lengths could not be written as a regex. Such a schema is now
written as a subset that meets the lengths (one repetition of the format raised to enough
rounds, the rest as they were), and a format that still cannot be fitted is refused naming
``format`` and its lengths, not a "key set". Every string written is of the format and within
the lengths (jsonschema's format checker, Python's ``len``)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from treadle.constrained.schema.json_schema import json_schema_to_regex

from json_checks import byte_walks

CASES = [
    ("uri", 10, None), ("uri", 20, None), ("iri", 10, None), ("uri-reference", 2, None),
    ("iri-reference", 5, None), ("uri-template", 1, None), ("uri-template", 1, 500),
    ("uri-template", 12, 200), ("json-pointer", 10, None),
    ("regex", 1, 1000), ("regex", 12, 200), ("ipv6", 20, None),
]


def _schema(fmt: str, lo: int, hi: int | None) -> dict:
    schema = {"type": "string", "format": fmt, "minLength": lo}
    if hi is not None:
        schema["maxLength"] = hi
    return schema


@pytest.mark.parametrize("fmt,lo,hi", CASES, ids=[f"{f}-{lo}-{hi}" for f, lo, hi in CASES])
def test_a_format_under_a_min_length_is_written_within_it(fmt: str, lo: int, hi: int | None) -> None:
    schema = _schema(fmt, lo, hi)
    rx = json_schema_to_regex(schema)
    check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    texts = [t for t in byte_walks(rx, 40, seed=lo, steps=1200, stop_p=0.2, by_state=True) if t is not None]
    assert len(texts) >= 10, len(texts)
    for t in texts:
        value = json.loads(t)
        assert lo <= len(value) <= (hi or len(value)), value
        assert check.is_valid(value), value


@pytest.mark.parametrize("fmt", ["uri", "uri-reference", "uri-template"])
def test_a_min_length_the_format_meets_leaves_it_whole(fmt: str) -> None:
    """A minLength no longer than the format's shortest strings says nothing: the format's
    own strings are written (as before)."""
    whole = json_schema_to_regex({"type": "string", "format": fmt})
    assert json_schema_to_regex(_schema(fmt, 0, None)) == whole


def test_uri_template_prefixes_are_what_its_checker_takes() -> None:
    """jsonschema checks ``uri-template`` with the ``uri_template`` package where it is
    installed (its ``format`` extra), which takes a prefix modifier of 3 digits at most
    (``{v:999}``, not ``{v:1000}``, though RFC 6570 allows up to 9999): a walk wrote
    ``{v:3754}``, which that checker refuses."""
    import re

    rx = json_schema_to_regex({"type": "string", "format": "uri-template"})
    assert re.fullmatch(rx, '"a{v:999}"') and re.fullmatch(rx, '"{x,y:1*}"') is None
    assert re.fullmatch(rx, '"a{v:1000}"') is None and re.fullmatch(rx, '"{v:3754}"') is None


def test_a_format_that_cannot_be_fitted_names_format_and_the_lengths() -> None:
    """``relative-json-pointer`` strings may end in ``#`` after a few digits (``2#``): no one
    repetition raised lengthens them all, and the product with 10..None is too long to write:
    a 400 that names the keyword and the lengths, not a "key set"."""
    with pytest.raises(ValueError) as e:
        json_schema_to_regex(_schema("relative-json-pointer", 10, None))
    msg = str(e.value)
    assert "keyword 'format'" in msg and "10..None" in msg and "key set" not in msg, msg


_IN_CHILD = """
import json, sys
from treadle.constrained.schema.json_schema import json_schema_to_regex
try:
    print(json.dumps(json_schema_to_regex(json.loads(sys.argv[1]))))
except ValueError as e:
    print(json.dumps("refused: " + str(e)))
"""


@pytest.mark.parametrize("fmt,lo,hi", [("duration", 10, None), ("uri-template", 12, 200)])
def test_the_same_schema_compiles_alike_in_every_process(fmt: str, lo: int, hi: int | None) -> None:
    """The product's regex (fsm_regex.fsm_to_regex) was written in an order that followed
    interegular's state numbers, which follow the hash order of its alphabet: ``duration``
    under minLength 10 fit the 20,000-character cap under some PYTHONHASHSEEDs and was a 400
    under others. Now the regex is the same text in every process."""
    import os
    import subprocess
    import sys

    outs = set()
    for seed in ("0", "1", "2", "4", "7"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", _IN_CHILD, json.dumps(_schema(fmt, lo, hi))], env=env,
                             capture_output=True, text=True, check=True, timeout=120)
        outs.add(json.loads(run.stdout))
    assert len(outs) == 1, sorted(o[:120] for o in outs)
    assert not next(iter(outs)).startswith("refused"), outs
