"""Schemas with any-values inside (free-form tool parameters, arrays of free-form objects,
untyped members) and recursive schemas (a file tree, an expression tree, a comment thread)
on CPU, SmolLM2 vocab, in one run, per schema:

1. regex size and time to a usable grammar (token index + first mask):
   treadle with holes and calls (constrained/index/json_holes.py: the any-values run on the
   pushdown automaton, recursive $refs as calls) vs the bounded regex they replaced
   (any-values unrolled two levels deep, $ref cycles three) vs xgrammar's JSON-schema compile;
2. per-token time (fill bitmask + accept) walking documents as the tokenizer writes them
   (tokens crossing hole and call boundaries included): holes cold (first walk) and warm,
   the bounded regex warm (only the documents it accepts), xgrammar warm;
3. the documents each accepts (the deep ones exceed the bounded regex).

    nice .venv/bin/python benchmarks/bench_json_holes.py [--reps 3] [--no-bounded]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from figures import emit, write_results  # benchmarks/figures.py
from grammar_walks import depth, first_and_warm, smollm2_vocabulary, stats_us, walk, warm_walks, xgrammar_uncached  # benchmarks/grammar_walks.py
from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

SCHEMAS = {
    "tool_call": {"type": "object", "properties": {
        "name": {"type": "string"}, "arguments": {"type": "object"}}, "required": ["name", "arguments"]},
    "list_of_objects": {"type": "array", "items": {"type": "object"}},
    "record_with_any": {"type": "object", "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
        "payload": {}, "meta": {"type": "object"}}, "required": ["id", "tags", "payload", "meta"]},
    "file_tree": {"$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string"}, "size": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["name", "children"]}},
        "$ref": "#/$defs/node"},
    "expression": {"$defs": {"e": {"anyOf": [
        {"type": "object", "properties": {"op": {"enum": ["+", "-", "*", "/"]},
                                          "args": {"type": "array", "items": {"$ref": "#/$defs/e"}, "minItems": 2}},
         "required": ["op", "args"]},
        {"type": "object", "properties": {"num": {"type": "number"}}, "required": ["num"]},
        {"type": "object", "properties": {"var": {"type": "string"}}, "required": ["var"]}]}},
        "$ref": "#/$defs/e"},
    "comment_thread": {"$defs": {"c": {"type": "object", "properties": {
        "author": {"type": "string"}, "text": {"type": "string"}, "meta": {"type": "object"},
        "replies": {"type": "array", "items": {"$ref": "#/$defs/c"}}}, "required": ["author", "text", "replies"]}},
        "$ref": "#/$defs/c"},
}


def _dir(d: int) -> dict:
    kids = [{"name": f"f{d}.txt", "size": 10 * d, "children": []}]
    return {"name": f"d{d}", "children": kids + [_dir(d - 1)] if d else kids}


def _expr(d: int) -> dict:
    return {"op": "+*"[d % 2], "args": [_expr(d - 1), {"num": d / 2}]} if d else {"var": "x"}


def _thread(d: int) -> dict:
    return {"author": f"u{d}", "text": "ok" if d % 2 else "why?", "replies": [_thread(d - 1)] if d else []}


DOCS = {
    "tool_call": [
        {"name": "search", "arguments": {"query": "weather in Oslo", "limit": 5}},
        {"name": "create_event", "arguments": {"title": "Sync", "when": {"start": "2026-12-01T10:00", "end": None},
                                               "attendees": [{"name": "Ann", "optional": False}]}},
        {"name": "deep", "arguments": {"a": {"b": {"c": {"d": {"e": [1, [2, [3]]]}}}}}},
    ],
    "list_of_objects": [
        [{"id": 1, "ok": True}, {"id": 2, "ok": False, "why": "timeout"}],
        [{"user": {"name": "Bo", "roles": ["admin", "dev"]}}, {}, {"n": -1.5e3}],
        [{"a": [{"b": [{"c": [{"d": 1}]}]}]}],
    ],
    "record_with_any": [
        {"id": 7, "tags": ["x"], "payload": "text", "meta": {}},
        {"id": 8, "tags": [], "payload": {"rows": [[1, 2], [3, 4]], "cols": ["a", "b"]}, "meta": {"src": "api"}},
        {"id": 9, "tags": ["y", "z"], "payload": [{"k": {"v": {"w": [True, None]}}}], "meta": {"t": {"u": {"v": 1}}}},
    ],
    "file_tree": [_dir(1), _dir(3), _dir(8)],
    "expression": [_expr(1), _expr(3), _expr(7)],
    "comment_thread": [_thread(1), {"author": "ann", "text": "+1", "meta": {"votes": {"up": 3}}, "replies": [_thread(1)]},
                       _thread(8)],
}
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="warm walks over the documents")
    ap.add_argument("--no-bounded", action="store_true", help="skip the bounded-regex builds (tens of seconds each)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "json_holes_cpu.json"))
    args = ap.parse_args()
    from treadle.constrained import GrammarSpec, build_compiled_grammar

    info = machine_info(("torch", "outlines_core", "xgrammar", "transformers"))
    tok, eos, V, bm, pda, pda_s = smollm2_vocabulary()
    emit({"figure": "pushdown_vocabulary_setup", "seconds": round(pda_s, 3)})
    xgr, xcomp, xbm = xgrammar_uncached(tok, V, eos)

    for name, schema in SCHEMAS.items():
        spec = GrammarSpec.from_params(json_schema=schema)
        docs = DOCS[name]
        texts = [json.dumps(doc, separators=(",", ":"), ensure_ascii=False) for doc in docs]
        paths = [tok.encode(t, add_special_tokens=False) + eos for t in texts]
        emit({"figure": "documents", "schema": name, "depths": [depth(x) for x in docs],
              "tokens": [len(p) for p in paths]})

        # ------------------------------------------------------------ holes
        t0 = time.perf_counter()
        rx = spec.to_regex(holes=True)
        g = build_compiled_grammar(rx, tok, eos, vocab_size=V, spec=spec, pda=pda)
        g.matcher().fill_next_token_bitmask(bm, 0)
        emit({"figure": "time_to_grammar", "schema": name, "lib": "treadle holes",
              "seconds": round(time.perf_counter() - t0, 3), "regex_chars": len(rx)})
        cold, warm, ok = first_and_warm(g.matcher, paths, bm, args.reps)
        emit({"figure": "per_token", "schema": name, "lib": "treadle holes, first walk (rows built)",
              **cold, "documents_accepted": ok})
        emit({"figure": "per_token", "schema": name, "lib": "treadle holes, warm", **warm,
              "documents_accepted": ok, "of": len(paths)})

        # ------------------------------------------------------------ bounded regex
        if not args.no_bounded:
            t0 = time.perf_counter()
            brx = spec.to_regex(holes=False)
            bg = build_compiled_grammar(brx, tok, eos, vocab_size=V, spec=spec)
            bg.matcher().fill_next_token_bitmask(bm, 0)
            emit({"figure": "time_to_grammar", "schema": name, "lib": "bounded regex (any-values 2 levels, $ref 3)",
                  "seconds": round(time.perf_counter() - t0, 2), "regex_chars": len(brx)})
            accepted = [p for p in paths if walk(bg.matcher, p, bm) is not None]
            samples, _ = warm_walks(bg.matcher, accepted, bm, args.reps)
            emit({"figure": "per_token", "schema": name, "lib": "bounded regex, warm", **stats_us(samples),
                  "documents_accepted": len(accepted), "of": len(paths)})

        # ------------------------------------------------------------ xgrammar
        if xgr is not None:
            t0 = time.perf_counter()
            # compact separators like treadle's; strict_mode=False, or xgrammar's strict mode
            # closes free-form objects (additionalProperties false by default: `{}` only)
            xg = xcomp.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                           strict_mode=False)
            emit({"figure": "time_to_grammar", "schema": name, "lib": "xgrammar json schema",
                  "seconds": round(time.perf_counter() - t0, 4)})
            samples, ok = warm_walks(lambda: xgr.GrammarMatcher(xg), paths, xbm, args.reps)
            emit({"figure": "per_token", "schema": name, "lib": "xgrammar, warm", **stats_us(samples),
                  "documents_accepted": ok, "of": len(paths)})
    write_results(args.out, "schemas with any-values (CPU)", machine=info, vocab="SmolLM2-135M-Instruct (49152)")


if __name__ == "__main__":
    main()
