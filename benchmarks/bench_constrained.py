"""Constrained-decoding benchmark on CPU (embedded SmolLM2-135M-Instruct), in one run:

1. per-token mask time (fill bitmask + accept token; mean, p50, p99) for treadle's
   GrammarMatcher vs xgrammar vs raw outlines-core (Guide.write_mask_into + advance), over
   the same schemas, the same SmolLM2 vocabulary and the same token paths (random walks
   through tokens all three accept);
2. compile time per schema, cold and cached (treadle through its GrammarCompiler worker
   process; xgrammar with its compile cache; outlines-core Index, which has no cache);
3. jump-forward on vs off: forward/decode steps, jumped tokens, tokens/s, identical outputs;
4. constrained vs unconstrained throughput at batch 1 and 16 with the same prompts and the
   same number of output tokens (unconstrained runs with ignore_eos and max_new_tokens set
   to each constrained output's length).

Prints one JSON object per figure and writes them all, with machine info and the exact
command, to benchmarks/results/constrained_cpu.json.

    nice .venv/bin/python benchmarks/bench_constrained.py
    nice .venv/bin/python benchmarks/bench_constrained.py --temperature 1.0 --engine-only \
        --out benchmarks/results/constrained_cpu_t1.0.json   # sampled, seeded
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from figures import emit, write_results  # benchmarks/figures.py
from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

SCHEMAS: dict[str, dict] = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": ["string", "null"], "maxLength": 16}}, "required": ["name", "age", "email"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                  "id": {"type": "integer", "minimum": 1, "maximum": 999}},
                 "required": ["name", "id"]},
        "active": {"type": "boolean"}}, "required": ["user", "active"]},
    "tags": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 4}},
        "required": ["tags"]},
    "enums": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L", "XL"]}},
        "required": ["color", "size"]},
    "refs": {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -100, "maximum": 100},
        "y": {"type": "integer", "minimum": -100, "maximum": 100}}, "required": ["x", "y"]}},
        "type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"]},
    "numbers": {"type": "object", "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 50}}, "required": ["score", "count"]},
    "optional": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 10}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "note": {"type": "string", "maxLength": 5}}, "required": ["title"]},
    "array_of_objects": {"type": "array", "items": {"type": "object", "properties": {
        "k": {"type": "string", "maxLength": 4}, "v": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["k", "v"]}, "minItems": 1, "maxItems": 3},
    "product": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 99999}, "name": {"type": "string", "maxLength": 20},
        "price": {"type": "number", "minimum": 0}, "in_stock": {"type": "boolean"},
        "category": {"enum": ["book", "toy", "food", "tool"]}},
        "required": ["id", "name", "price", "in_stock", "category"]},
    "event": {"type": "object", "properties": {
        "kind": {"const": "event"}, "day": {"type": "integer", "minimum": 1, "maximum": 31},
        "who": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
        "where": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]}},
        "required": ["kind", "day", "who", "where"]},
}

def stats_us(samples: list[float]) -> dict:
    a = np.asarray(samples) * 1e6
    return {"mean_us": round(float(a.mean()), 2), "p50_us": round(float(np.percentile(a, 50)), 2),
            "p99_us": round(float(np.percentile(a, 99)), 2), "n": int(a.size)}


def unpack(words: np.ndarray, n: int) -> np.ndarray:
    """int32 bitmask row -> bool[n]."""
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)


# ====================================================================== mask + compile


def bench_grammar_libs(tok, eos_ids: list[int], vocab_size: int, args) -> None:
    from outlines_core import Guide, Index
    from outlines_core.json_schema import build_regex_from_schema

    from treadle.constrained import GrammarCompiler, GrammarMatcher, GrammarSpec, allocate_token_bitmask
    from treadle.constrained.index.vocabulary import build_vocabulary

    words = (vocab_size + 31) // 32
    # ---------------------------------------------------------------- treadle compile
    t0 = time.perf_counter()
    compiler = GrammarCompiler(tok, eos_ids, vocab_size=vocab_size)
    compiler.compile(GrammarSpec.from_params(regex="warm[0-9]"))  # worker start, not a schema
    emit({"figure": "compile_worker_startup", "lib": "treadle", "seconds": round(time.perf_counter() - t0, 3)})
    tre, cold, cached = {}, [], []
    for name, schema in SCHEMAS.items():
        t = time.perf_counter()
        tre[name] = compiler.compile(GrammarSpec.from_params(json_schema=schema))
        cold.append(time.perf_counter() - t)
        for _ in range(20):  # cached: a request arriving with the same schema dict
            t = time.perf_counter()
            compiler.compile(GrammarSpec.from_params(json_schema=schema))
            cached.append(time.perf_counter() - t)
    compile_stats = {"treadle": (cold, cached)}

    # ---------------------------------------------------------------- xgrammar compile
    xgr = None
    xg = {}
    try:
        import xgrammar as xgr

        t = time.perf_counter()
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size, stop_token_ids=eos_ids)
        xcomp = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=True)
        emit({"figure": "tokenizer_info_setup", "lib": "xgrammar", "seconds": round(time.perf_counter() - t, 3)})
        cold, cached = [], []
        for name, schema in SCHEMAS.items():
            s = json.dumps(schema)
            t = time.perf_counter()
            # compact separators like treadle's default (any_whitespace=False)
            xg[name] = xcomp.compile_json_schema(s, any_whitespace=False, separators=(",", ":"))
            cold.append(time.perf_counter() - t)
            for _ in range(20):
                t = time.perf_counter()
                xcomp.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
                cached.append(time.perf_counter() - t)
        compile_stats["xgrammar"] = (cold, cached)
    except Exception as e:  # noqa: BLE001 - report the column as unavailable
        xgr = None
        emit({"figure": "xgrammar", "available": False, "reason": f"{type(e).__name__}: {e}"})

    # ---------------------------------------------------------------- outlines-core compile
    vocab, _table = build_vocabulary(tok, eos_ids)
    oc, cold, oc_regex_src = {}, [], {}
    for name, schema in SCHEMAS.items():
        try:
            rx = build_regex_from_schema(json.dumps(schema))
            oc_regex_src[name] = "outlines_core.build_regex_from_schema"
        except Exception:  # noqa: BLE001 - fall back to treadle's regex for the same schema
            rx = tre[name].regex
            oc_regex_src[name] = "treadle regex (outlines-core rejected the schema)"
        t = time.perf_counter()
        oc[name] = Index(rx, vocab)
        cold.append(time.perf_counter() - t)
    compile_stats["outlines_core"] = (cold, None)
    for lib, (cold, cached) in compile_stats.items():
        fig = {"figure": "compile_time", "lib": lib, "schemas": len(cold),
               "cold_ms": {"mean": round(1e3 * statistics.mean(cold), 3), "p50": round(1e3 * statistics.median(cold), 3),
                           "max": round(1e3 * max(cold), 3)}}
        if cached is not None:
            fig["cached_ms"] = {"mean": round(1e3 * statistics.mean(cached), 4),
                                "p99": round(1e3 * float(np.percentile(cached, 99)), 4)}
        else:
            fig["cached_ms"] = None
            fig["note"] = "outlines-core has no compile cache"
        if lib == "treadle":
            fig["note"] = "cold = spec->regex + Index build in the capped worker process + pickling back"
        if lib == "outlines_core":
            fig["regex_source"] = oc_regex_src
        emit(fig)
    compiler.close()

    # ---------------------------------------------------------------- token paths
    rng = random.Random(args.seed)
    paths: dict[str, list[list[int]]] = {}
    eos_set = set(eos_ids)
    bm = allocate_token_bitmask(1, vocab_size)
    xbm = xgr.allocate_token_bitmask(1, vocab_size) if xgr else None
    obm = torch.zeros(words, dtype=torch.int32)
    n_tok = len(_table)
    for name in SCHEMAS:
        paths[name] = []
        for _ in range(args.paths):
            m = GrammarMatcher(tre[name])
            xm = xgr.GrammarMatcher(xg[name]) if xgr else None
            og = Guide(oc[name])
            path: list[int] = []
            while len(path) < args.path_len:
                m.fill_next_token_bitmask(bm, 0)
                allowed = unpack(bm[0].numpy(), vocab_size)
                if xm is not None:
                    xm.fill_next_token_bitmask(xbm, 0)
                    allowed &= unpack(xbm[0].numpy(), vocab_size)
                og.write_mask_into(obm.data_ptr(), obm.numel(), 4)
                allowed &= unpack(obm.numpy(), vocab_size)
                ids = np.flatnonzero(allowed)
                ids = ids[ids < n_tok]
                if ids.size == 0:
                    break
                final = [e for e in eos_ids if allowed[e]]
                # End about a third of the time once a final state is reached.
                t = final[0] if final and rng.random() < 0.35 else int(ids[rng.randrange(ids.size)])
                assert m.accept_token(t)
                if xm is not None:
                    assert xm.accept_token(t)
                path.append(t)
                if t in eos_set:
                    break
                og.advance(t)
            paths[name].append(path)
    total = sum(len(p) for ps in paths.values() for p in ps)
    emit({"figure": "mask_paths", "schemas": len(paths), "paths_per_schema": args.paths,
          "tokens": total, "how": "random walks over tokens allowed by all three libraries; EOS taken w.p. 0.35 in final states"})

    # ---------------------------------------------------------------- timed walks
    def walk_matchers(make_matcher, buf) -> list[float]:
        """fill + accept per token along every path (treadle's and xgrammar's matchers share
        the xgrammar-style API); ``make_matcher(name)`` starts a path."""
        out = []
        pc = time.perf_counter
        for name, ps in paths.items():
            for path in ps:
                m = make_matcher(name)
                for t in path:
                    s = pc()
                    m.fill_next_token_bitmask(buf, 0)
                    m.accept_token(t)
                    out.append(pc() - s)
        return out

    def walk_treadle(grammars) -> list[float]:
        return walk_matchers(lambda name: GrammarMatcher(grammars[name]), bm)

    def walk_xgrammar() -> list[float]:
        return walk_matchers(lambda name: xgr.GrammarMatcher(xg[name]), xbm)

    def walk_outlines() -> list[float]:
        out = []
        pc = time.perf_counter
        ptr, numel = obm.data_ptr(), obm.numel()
        for name, ps in paths.items():
            for path in ps:
                g = Guide(oc[name])
                for t in path:
                    s = pc()
                    g.write_mask_into(ptr, numel, 4)
                    if t not in eos_set:
                        g.advance(t)
                    out.append(pc() - s)
        return out

    # treadle: fresh CompiledGrammars (per-state mask rows not yet cached) for the first
    # pass, then the same grammars again (rows cached: the steady state of a served schema).
    from treadle.constrained.compile.grammar import CompiledGrammar

    fresh = {n: CompiledGrammar(index=g.index, regex=g.regex, vocab_size=g.vocab_size,
                                num_tokens=g.num_tokens, eos_token_ids=g.eos_token_ids, token_bytes=g.token_bytes,
                                spec=g.spec) for n, g in tre.items()}
    emit({"figure": "mask_time_per_token", "lib": "treadle", "pass": "first (mask rows computed on first visit)",
          **stats_us(walk_treadle(fresh))})
    results = {"treadle": walk_treadle(fresh)}
    emit({"figure": "mask_time_per_token", "lib": "treadle", "pass": "warm (rows cached per state)",
          **stats_us(results["treadle"])})
    if xgr is not None:
        walk_xgrammar()  # same footing: second pass
        results["xgrammar"] = walk_xgrammar()
        emit({"figure": "mask_time_per_token", "lib": "xgrammar", "pass": "warm", **stats_us(results["xgrammar"])})
    walk_outlines()
    results["outlines_core"] = walk_outlines()
    emit({"figure": "mask_time_per_token", "lib": "outlines_core", "pass": "warm",
          **stats_us(results["outlines_core"])})
    if "xgrammar" in results:
        tm, xm_ = statistics.mean(results["treadle"]), statistics.mean(results["xgrammar"])
        emit({"figure": "mask_time_vs_xgrammar", "treadle_mean_us": round(tm * 1e6, 2),
              "xgrammar_mean_us": round(xm_ * 1e6, 2), "ratio": round(tm / xm_, 3),
              "target": "treadle mean <= xgrammar mean", "met": tm <= xm_})
    else:
        emit({"figure": "mask_time_vs_xgrammar", "available": False})


# ====================================================================== engine figures


def bench_engine(args) -> None:
    from treadle.runtime import Engine
    from treadle.runtime.tokenizer import apply_chat_template

    names = list(SCHEMAS)
    t = time.perf_counter()
    eng_on = Engine(max_total_tokens=16384)
    eng_off = Engine(max_total_tokens=16384, disable_jump_forward=True)
    eng_any = Engine(max_total_tokens=16384, jump_forward_max_batch=1 << 20)  # jumps at every batch size
    emit({"figure": "engine_load", "seconds_two_engines": round(time.perf_counter() - t, 2)})
    tok = eng_on.tokenizer
    vocab_size = eng_on.runner.config.vocab_size
    eos_ids = sorted(eng_on.scheduler.eos_ids)

    def prompt(name: str, variant: int = 0) -> str:
        who = ["", " Be creative.", " Use realistic values.", " Keep it short."][variant % 4]
        return apply_chat_template(tok, [{"role": "user", "content":
                                          f"Reply with JSON matching this schema:{who} " + json.dumps(SCHEMAS[name])}])

    def cparams(name: str) -> dict:
        # sampled runs are seeded per schema: jump-forward on and off then draw alike
        return {"json_schema": SCHEMAS[name], "max_new_tokens": 64, "temperature": args.temperature,
                "seed": names.index(name)}

    def run(eng, prompts, params, batch: int) -> tuple[list[dict], float, dict]:
        """Run in chunks of ``batch`` requests; returns outputs, wall seconds, stat deltas."""
        eng.flush_cache()
        i0 = eng.get_server_info()
        outs: list[dict] = []
        t0 = time.perf_counter()
        for i in range(0, len(prompts), batch):
            outs.extend(eng.generate(prompts[i:i + batch], params[i:i + batch]))
        wall = time.perf_counter() - t0
        i1 = eng.get_server_info()
        return outs, wall, {k: i1[k] - i0[k] for k in ("forward_steps", "decode_steps", "jump_tokens", "draft_tokens")}

    # warm-up: compile every grammar on both engines (compile time is measured elsewhere)
    for eng in (eng_on, eng_off, eng_any):
        eng.generate([prompt(n) for n in names], [{**cparams(n), "max_new_tokens": 1} for n in names])

    # ---------------------------------------------------------------- jump-forward on vs off
    prompts = [prompt(n) for n in names]
    params = [cparams(n) for n in names]
    for batch, eng_jf in ((1, eng_on), (len(names), eng_on), (len(names), eng_any)):
        rows = {}
        for label, eng in (("on", eng_jf), ("off", eng_off)):
            outs, wall, d = run(eng, prompts, params, batch)
            ntok = sum(o["meta_info"]["completion_tokens"] for o in outs)
            rows[label] = (outs, wall, d, ntok)
        on, off = rows["on"], rows["off"]
        same = sum(a["text"] == b["text"] and a["output_ids"] == b["output_ids"] for a, b in zip(on[0], off[0]))
        valid = all(o["meta_info"]["finish_reason"]["type"] == "stop" for o in on[0] + off[0])
        emit({"figure": "jump_forward", "batch": batch, "requests": len(names), "temperature": args.temperature,
              "policy": "jump at every batch size" if eng_jf is eng_any else "default (CPU: jump while <= 4 run)",
              "on": {"forward_steps": on[2]["forward_steps"], "decode_steps": on[2]["decode_steps"],
                     "jump_tokens": on[2]["jump_tokens"], "draft_tokens_proposed": on[2]["draft_tokens"],
                     "output_tokens": on[3], "seconds": round(on[1], 3),
                     "tokens_per_s": round(on[3] / on[1], 2)},
              "off": {"forward_steps": off[2]["forward_steps"], "decode_steps": off[2]["decode_steps"],
                      "jump_tokens": off[2]["jump_tokens"], "output_tokens": off[3], "seconds": round(off[1], 3),
                      "tokens_per_s": round(off[3] / off[1], 2)},
              "forward_steps_saved_pct": round(100 * (1 - on[2]["forward_steps"] / max(1, off[2]["forward_steps"])), 1),
              "identical_outputs": f"{same}/{len(names)}", "identical_fraction": round(same / len(names), 3),
              "all_finished_by_stop": valid})

    # ---------------------------------------------------------------- constrained vs unconstrained
    for batch, nreq in ((1, args.bs1_requests), (4, 4), (16, 16)):
        sel = [names[i % len(names)] for i in range(nreq)]
        ps = [prompt(n, i // len(names)) for i, n in enumerate(sel)]
        cp = [cparams(n) for n in sel]
        eng_on.generate(ps, [{**c, "max_new_tokens": 1} for c in cp])  # compile (variants share specs)
        best: dict[str, float] = {}
        lens = None
        for rep in range(args.reps):
            outs_on, w_on, _ = run(eng_on, ps, cp, batch)
            outs_off, w_off, _ = run(eng_off, ps, cp, batch)
            if lens is None:
                lens = [o["meta_info"]["completion_tokens"] for o in outs_off]
                lens_on = [o["meta_info"]["completion_tokens"] for o in outs_on]
            up = [{"max_new_tokens": n, "ignore_eos": True, "temperature": 0} for n in lens]
            outs_u, w_u, _ = run(eng_off, ps, up, batch)
            assert [o["meta_info"]["completion_tokens"] for o in outs_u] == lens
            for k, w in (("jf_on", w_on), ("jf_off", w_off), ("unconstrained", w_u)):
                best[k] = min(best.get(k, float("inf")), w)
        n_off, n_on = sum(lens), sum(lens_on)
        tps = {"unconstrained": n_off / best["unconstrained"], "constrained_jf_off": n_off / best["jf_off"],
               "constrained_jf_on": n_on / best["jf_on"]}
        emit({"figure": "constrained_vs_unconstrained", "batch": batch, "requests": nreq,
              "output_tokens": {"constrained_jf_off_and_unconstrained": n_off, "constrained_jf_on": n_on},
              "best_of_reps": args.reps, "seconds": {k: round(v, 3) for k, v in best.items()},
              "tokens_per_s": {k: round(v, 2) for k, v in tps.items()},
              "ratio_jf_off_vs_unconstrained": round(tps["constrained_jf_off"] / tps["unconstrained"], 3),
              "ratio_jf_on_vs_unconstrained": round(tps["constrained_jf_on"] / tps["unconstrained"], 3),
              "target": "constrained >= 0.90 x unconstrained",
              "met_jf_off": tps["constrained_jf_off"] >= 0.9 * tps["unconstrained"],
              "met_jf_on": tps["constrained_jf_on"] >= 0.9 * tps["unconstrained"]})
    eng_on.check_integrity()
    eng_off.check_integrity()
    for eng in (eng_on, eng_off, eng_any):
        eng.shutdown()
    return tok, eos_ids, vocab_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", type=int, default=4, help="random token paths per schema")
    ap.add_argument("--path-len", type=int, default=48)
    ap.add_argument("--reps", type=int, default=2, help="throughput repetitions (best is kept)")
    ap.add_argument("--bs1-requests", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0, help="of the constrained requests (seeded)")
    ap.add_argument("--engine-only", action="store_true", help="skip the grammar-library comparisons")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "constrained_cpu.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    info = machine_info(("torch", "outlines_core", "xgrammar", "transformers"))
    print(json.dumps({"machine": info}), flush=True)
    tok, eos_ids, vocab_size = bench_engine(args)
    if not args.engine_only:
        bench_grammar_libs(tok, eos_ids, vocab_size, args)
    info["loadavg_end"] = os.getloadavg()
    write_results(args.out, "constrained decoding (CPU)", cwd=os.getcwd(), machine=info,
                  model="SmolLM2-135M-Instruct (embedded GGUF), fp32", schemas=SCHEMAS,
                  total_seconds=round(time.perf_counter() - t0, 1))


if __name__ == "__main__":
    main()
