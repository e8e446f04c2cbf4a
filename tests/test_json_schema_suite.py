"""Soundness of json_schema_to_regex on the official JSON-Schema-Test-Suite (draft 2020-12).

Every schema we accept must reject every instance the suite marks invalid, in every
serialization we try. Coverage (what we accept, what valid instances we match) is printed
and, with TREADLE_SUITE_REPORT=path, written as JSON.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import interegular

from treadle.constrained.json_schema import json_schema_to_regex

SUITE = Path(__file__).resolve().parents[2] / "shared" / "data" / "JSON-Schema-Test-Suite" / "tests" / "draft2020-12"


def _serializations(value: object) -> list[str]:
    out = []
    for ensure_ascii in (False, True):
        for sort_keys in (False, True):
            out.append(json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii, sort_keys=sort_keys))
    return list(dict.fromkeys(out))


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _run_suite() -> tuple[dict[str, dict[str, int]], list[str], list[str]]:
    assert SUITE.is_dir(), f"JSON-Schema-Test-Suite not found at {SUITE} (it ships in /work/shared/data)"
    table: dict[str, dict[str, int]] = {}
    unsound: list[str] = []
    misses: list[str] = []
    for path in sorted(SUITE.glob("*.json")):
        row = dict(groups=0, accepted=0, valid=0, valid_matched=0, invalid=0, invalid_rejected=0)
        for group in json.loads(path.read_text()):
            row["groups"] += 1
            try:
                pattern = json_schema_to_regex(group["schema"])
            except ValueError:
                continue  # UnsupportedSchemaError is a ValueError: counted as unsupported
            row["accepted"] += 1
            rx = _compiled(pattern)
            for test in group["tests"]:
                forms = _serializations(test["data"])
                hit = [f for f in forms if rx.fullmatch(f)]
                if test["valid"]:
                    row["valid"] += 1
                    row["valid_matched"] += bool(hit)
                    if not hit:
                        misses.append(f"{path.stem}: {group['description']} / {test['description']}")
                else:
                    row["invalid"] += 1
                    row["invalid_rejected"] += not hit
                    if hit:
                        unsound.append(f"{path.stem}: {group['description']} / {test['description']}: {hit[0]}")
        table[path.stem] = row
    return table, unsound, misses


@functools.lru_cache(maxsize=1)
def _results() -> tuple[dict[str, dict[str, int]], list[str], list[str]]:
    return _run_suite()


def test_suite_has_no_unsound_case() -> None:
    table, unsound, misses = _results()
    print(f"\n{'file':28} groups  valid-matched  invalid-rejected")
    for name, r in table.items():
        print(
            f"{name:28} {r['accepted']:3}/{r['groups']:<3} {r['valid_matched']:5}/{r['valid']:<5}"
            f"      {r['invalid_rejected']:5}/{r['invalid']:<5}"
        )
    total = {k: sum(r[k] for r in table.values()) for k in next(iter(table.values()))}
    print(f"{'TOTAL':28} {total['accepted']:3}/{total['groups']:<3} {total['valid_matched']:5}/{total['valid']:<5}"
          f"      {total['invalid_rejected']:5}/{total['invalid']:<5}")
    print(f"valid instances not matched (key order or sound restriction): {len(misses)}")
    for m in misses:
        print("  miss:", m)
    report = os.environ.get("TREADLE_SUITE_REPORT")
    if report:
        Path(report).write_text(json.dumps({"files": table, "total": total, "unsound": unsound}, indent=2))
    assert not unsound, "unsound: the regex accepts invalid instances:\n" + "\n".join(unsound)


def test_suite_coverage_beats_outlines_core() -> None:
    table, _, _ = _results()
    accepted = sum(r["accepted"] for r in table.values())
    # outlines-core compiles 135 of 383 groups (with 16 unsound instances).
    assert accepted > 135, accepted


def test_accepted_suite_regexes_parse_with_interegular() -> None:
    checked = 0
    for path in sorted(SUITE.glob("*.json"))[:12]:
        for group in json.loads(path.read_text()):
            try:
                pattern = json_schema_to_regex(group["schema"])
            except ValueError:
                continue
            if len(pattern) < 3000:  # big generic-value regexes are slow in interegular
                interegular.parse_pattern(pattern).to_fsm()
                checked += 1
    assert checked > 20
