"""cfn-lint's rules (cfnlint/data/schemas/extensions, aws_rds_dbcluster/engine_version.json) are
an allOf of if / then rules over a discriminator that is not required: "if Engine is X and
EngineVersion is given, then EngineVersion is one of ...". Each rule is met by its ``then`` or
by each way its ``if`` fails (Engine absent, EngineVersion absent, Engine not X, ...), and the
ways to meet every rule at once pass treadle's cap: a 400, rightly, but one that named only
``anyOf``, a keyword the schema does not hold. It now says the if / then / else rules count."""

from __future__ import annotations

import pytest

from treadle.constrained.schema.json_schema import json_schema_to_regex


def _engine_rules(engines: list[str]) -> dict:
    rules = [{"if": {"properties": {"Engine": {"type": "string"}}, "required": ["Engine"]},
              "then": {"properties": {"Engine": {"enum": engines}}}}]
    for i, engine in enumerate(engines):
        rules.append({"if": {"properties": {"Engine": {"const": engine}, "EngineVersion": {"type": ["string", "number"]}},
                             "required": ["Engine", "EngineVersion"]},
                      "then": {"properties": {"EngineVersion": {"enum": [f"{i}.{j}" for j in range(5)]}}}})
    return {"type": "object", "allOf": rules}


def test_too_many_ways_to_meet_if_rules_names_the_rules() -> None:
    with pytest.raises(ValueError) as e:
        json_schema_to_regex(_engine_rules(["aurora-mysql", "aurora-postgresql", "mysql", "postgres"]))
    msg = str(e.value)
    assert "too many combined branches" in msg and "if / then / else" in msg, msg


def test_fewer_rules_are_written() -> None:
    assert json_schema_to_regex(_engine_rules(["mysql"]))
