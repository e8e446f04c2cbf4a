"""``format: idn-email`` was a 400 though every ASCII address of the ``email`` subset is an
internationalized one too (RFC 6531 extends RFC 5321): it is written as ``email`` is. Walks of
the compiled regex are addresses jsonschema's idn-email checker takes; under a ``maxLength`` its
parts shrink as email's do."""

from __future__ import annotations

import json
import re

import jsonschema

from json_checks import byte_walks
from treadle.constrained.schema.json_schema import json_schema_to_regex

ADDRESS = re.compile(r"[A-Za-z0-9_.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")


def _strings(schema: dict, n: int = 60) -> list[str]:
    out = [json.loads(t) for t in byte_walks(json_schema_to_regex(schema), n, steps=300, stop_p=0.15) if t is not None]
    assert len(out) >= n // 2
    return out


def test_idn_email_is_written_as_email() -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string", "format": "idn-email"}
    check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for s in _strings(schema):
        assert check.is_valid(s) and ADDRESS.fullmatch(s), s
    rx = re.compile(json_schema_to_regex(schema))
    assert rx.fullmatch('"a.b@example.com"') and not rx.fullmatch('"ab"') and not rx.fullmatch('"a@b"')


def test_idn_email_under_max_length_in_an_object() -> None:
    schema = {"type": "object", "properties": {"mail": {"type": "string", "format": "idn-email", "maxLength": 40},
                                               "name": {"type": "string"}},
              "required": ["mail", "name"], "additionalProperties": False}
    for value in _strings(schema, 30):
        assert len(value["mail"]) <= 40 and ADDRESS.fullmatch(value["mail"]), value
    assert re.compile(json_schema_to_regex(schema)).fullmatch('{"mail":"a.b@ex.io","name":"x"}')
