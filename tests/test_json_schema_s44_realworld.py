"""Real-world schemas of session 44 (helper-79's run over schemas users send: the anthropic SDK's
and the MCP types' Pydantic models, langchain-core's, check-jsonschema's vendored SchemaStore
schemas, their ``default`` / ``examples`` values): what it found wrong, each failing before its
fix. Compile-level: treadle's regex, read by Python's ``re`` and walked over single bytes,
every finished walk validated by ``jsonschema`` with its format checker."""
from __future__ import annotations

import json
import re
import subprocess
import warnings

import jsonschema
import pytest
from json_checks import byte_walks

from treadle.constrained.schema.json_schema import json_schema_to_regex

# buildkite's pipeline schema (check-jsonschema's vendored copy), its text field's "format":
# "a regular expression ... equivalent to the HTML5 pattern attribute", with its own example;
# the others are the patterns users put in such fields (pydantic constr, SchemaStore's own)
REGEX_FIELD = {"type": "string", "format": "regex", "examples": ["[0-9a-f]+"]}
WRITTEN = ["[0-9a-f]+", "^[a-z]+$", r"\d{3}-\d{4}", "^(https?|ftp)://.+$", "yes|no", "^[A-Z]{2}[0-9]{6}$",
           r"^\w+@\w+\.com$", r"^v?(\d+)\.(\d+)(\.\d+)?$", r"[^\s,]+", r"^\$[0-9]{1,3}(,[0-9]{3})*$",
           "plain text", "a.b/c:d@e=f-g_h"]
NOT_REGEXES = ["(unclosed", "^(abc]", "[z-a]", "a**", "*a", "a{3,1}", "[]", "\\"]


def test_format_regex_writes_regexes_with_classes_quantifiers_groups_and_escapes():
    """(before: only literal text and '.', so a schema's own example "[0-9a-f]+" and every regex
    with a class, quantifier, group, anchor or escape was never written.) Now a regular subset of
    the regexes: literals, '.', escapes, classes of listed characters and ranges, quantifiers
    (lazy too), groups (not nested), alternatives, '^' / '$' at the ends."""
    rx = re.compile(json_schema_to_regex(REGEX_FIELD))
    for text in WRITTEN:
        re.compile(text)
        assert rx.fullmatch(json.dumps(text)), text
    for text in NOT_REGEXES:
        with pytest.raises(re.error):
            re.compile(text)
        assert not rx.fullmatch(json.dumps(text)), text


def test_format_regex_outputs_compile_in_python_and_ecma():
    """Sound: every string walked from the format's automaton is a regex Python's ``re`` and the
    ``regex`` module compile (no FutureWarning either), and so does ECMA-262 (node's RegExp,
    without and with the u flag) where node is installed; ``jsonschema``'s format checker agrees."""
    import regex as regex_module

    schema = {"type": "object", "properties": {"pattern": {"type": "string", "format": "regex"}},
              "required": ["pattern"]}
    rx = json_schema_to_regex(schema)
    check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    values = []
    for data in byte_walks(rx, 400, seed=44, by_state=True, stop_p=0.05):
        if data is not None:
            value = json.loads(data)
            assert check.is_valid(value), data
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                re.compile(value["pattern"])
                regex_module.compile(value["pattern"])
            values.append(value["pattern"])
    assert len(values) >= 300 and sum(any(c in v for c in "[(*+?{") for v in values) >= 100, values
    js = ("let bad=[];for(const x of " + json.dumps(values) + "){for(const f of ['','u']){try{new RegExp(x,f)}"
          "catch(e){bad.push([f,x,e.message])}}};console.log(JSON.stringify(bad))")
    try:
        out = subprocess.run(["node", "-e", js], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return  # no node here: Python's two readers checked above
    assert out.returncode == 0 and json.loads(out.stdout) == [], out.stdout[-2000:] + out.stderr[-2000:]


# gitlab-ci's schema (check-jsonschema's vendored copy): a job's coverage, "a regular expression
# ... surrounded with '/'. Example: '/Code coverage: \d+\.\d+/'"
COVERAGE = {"type": "string", "format": "regex", "pattern": "^/.+/$"}


def test_format_regex_beside_a_pattern_is_still_written():
    """Where the wider subset's product with a pattern cannot be written as a regex, the literal
    text subset is (before this: the gitlab-ci schema, compiled before the subset was widened,
    was refused, "keyword 'pattern' ... together with format 'regex' is not supported")."""
    rx = re.compile(json_schema_to_regex(COVERAGE))
    assert rx.fullmatch(json.dumps("/Code coverage: 12.5/")) and not rx.fullmatch(json.dumps("Code"))
    check = jsonschema.Draft202012Validator(COVERAGE, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    done = [json.loads(d) for d in byte_walks(rx.pattern, 60, seed=4, by_state=True) if d is not None]
    assert len(done) >= 20 and all(check.is_valid(v) and re.compile(v) for v in done), done
