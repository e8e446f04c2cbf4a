"""What unique keys (constrained/decode/json_keys.py) cost per token, on CPU, SmolLM2 vocab, in one
run: the same matchers walking the same documents with the key check on (the default for
JSON grammars) and off, warm (rows cached), per token: fill the bitmask + accept.

Documents: a declared object (keys fixed by the schema: the compiler finds no free keys and
the check is skipped, ``checked`` false), a string-to-int map of 8 and of 200 keys (every key free: the check looks at
every seen key that starts like the one being written), and any JSON (``json_object``)
with nested objects.

    nice .venv/bin/python benchmarks/bench_json_keys.py [--reps 5]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from figures import emit, write_results  # benchmarks/figures.py
from grammar_walks import smollm2_vocabulary, stats_us, warm_walks  # benchmarks/grammar_walks.py
from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

DECLARED = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]}}, "required": ["name", "age", "email", "address"]}
MAP = {"type": "object", "additionalProperties": {"type": "integer"}}
CASES = {
    "declared_object": (DECLARED, [{"name": "Ann Lee", "age": 41, "email": "ann@example.com",
                                    "address": {"city": "Oslo", "zip": "0150"}}]),
    "map_8_keys": (MAP, [{w: i for i, w in enumerate("red green blue cyan magenta yellow black white".split())}]),
    "map_200_keys": (MAP, [{f"word_{i}": i for i in range(200)}]),
    "any_json": ({"type": "object"}, [{"user": {"name": "Bo", "roles": ["admin", "dev"], "meta": {"a": 1, "b": 2}},
                                       "items": [{"id": i, "ok": i % 2 == 0} for i in range(6)]}]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--output", default=str(Path(__file__).parent / "results" / "json_keys_cpu.json"))
    args = ap.parse_args()

    from treadle.constrained import GrammarCompiler, GrammarSpec

    tok, eos, vocab, bitmask, _, _ = smollm2_vocabulary()
    info = machine_info(("outlines_core",))
    with GrammarCompiler(tok, eos, vocab_size=vocab) as compiler:
        for name, (schema, docs) in CASES.items():
            g = compiler.compile(GrammarSpec.from_params(json_schema=schema))
            paths = [tok.encode(json.dumps(d, separators=(",", ":")), add_special_tokens=False) + eos for d in docs]

            def plain():
                m = g.matcher()
                m._key_index = None  # the same matcher with the key check off
                return m

            warm_walks(g.matcher, paths, bitmask, 1)  # build the rows both read
            on, ok_on = warm_walks(g.matcher, paths, bitmask, args.reps)
            off, ok_off = warm_walks(plain, paths, bitmask, args.reps)
            row = {"figure": "per_token", "case": name, "checked": g.matcher().keys_unique, "tokens": sum(map(len, paths)),
                   "documents_accepted": [ok_on, ok_off], "keys_unique": stats_us(on), "keys_off": stats_us(off)}
            row["overhead_us_mean"] = round(row["keys_unique"]["mean_us"] - row["keys_off"]["mean_us"], 2)
            emit(row)
    write_results(args.output, "json_keys", machine=info, reps=args.reps)


if __name__ == "__main__":
    main()
