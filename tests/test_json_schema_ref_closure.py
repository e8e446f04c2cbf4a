"""The refs a definition reaches (json_schema._Converter._reaches, which keys the reuse of a
definition's conversion) are found by walking each definition once. Walking every target again
for each ref that reaches it made renovate's schema (schemastore, as check-jsonschema vendors
it: hundreds of definitions that reach each other) take 20 s of its 22 s translation; 2 s now."""

from __future__ import annotations

from treadle.constrained.schema import json_schema as js


def _linked(n: int) -> dict:
    """n definitions, each an object whose properties refer to every other one (the shape of
    renovate's options: each may hold the others)."""
    defs = {f"d{i}": {"type": "object", "additionalProperties": False,
                      "properties": {f"p{j}": {"$ref": f"#/$defs/d{j}"} for j in range(n) if j != i}}
            for i in range(n)}
    return {"$defs": defs, "type": "object", "properties": {"root": {"$ref": "#/$defs/d0"}}}


def test_each_definition_is_walked_once_for_the_refs_it_reaches(monkeypatch):
    n = 40
    schema = _linked(n)
    conv = js._Converter(schema, "", 3)
    resolved: list[str] = []
    real = conv.merger.resolve

    def counting(ref, path):
        resolved.append(ref)
        return real(ref, path)

    monkeypatch.setattr(conv.merger, "resolve", counting)
    for i in range(n):
        reach = conv._reaches(f"#/$defs/d{i}", "$")
        assert reach == {f"#/$defs/d{j}" for j in range(n)}  # all of them (itself too: it recurses)
    assert len(resolved) == n, len(resolved)  # (walking every closure again: n * n = 1,600)

