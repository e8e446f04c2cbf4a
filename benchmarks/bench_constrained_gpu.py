"""Constrained vs unconstrained decoding on a GPU, in one run (BENCHMARKS.md "constrained
decoding": JSON-schema outputs at batch 1 and 64 against unconstrained decoding of the same
lengths).

One engine (CUDA graphs and overlap scheduling as configured), sampled requests
(temperature 1 by default, a seed each) over a mix of schemas: plain objects, a tool call with a
free-form ``arguments`` (a hole, constrained/index/json_holes.py) and ``{"type": "object"}`` (the
pushdown grammar). Each batch runs constrained with jump-forward on at every batch size
(CUDA's default is off: this is the figure behind that), constrained with it off (a second
engine), then unconstrained with ``ignore_eos`` and each request's constrained
length; output tok/s, forward steps and the ratios. Constrained outputs are replayed through
a fresh matcher (they must be accepted), so the figure is of valid work.

    python benchmarks/bench_constrained_gpu.py --model-path dummy:llama3-8b \
        --tokenizer-path .gpu_assets/smollm2-tokenizer --batch-sizes 1,64 [--schema-set recursive]

``--schema-set recursive`` runs recursive schemas instead ($ref cycles as calls, nested as
deep as the model's samples go); ``--schema-set tags`` structural tags (free text whose
segments follow schemas).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from figures import emit, write_results  # benchmarks/figures.py
from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": ["string", "null"], "maxLength": 16}}, "required": ["name", "age", "email"]},
    "product": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 99999}, "name": {"type": "string", "maxLength": 20},
        "price": {"type": "number", "minimum": 0}, "in_stock": {"type": "boolean"},
        "category": {"enum": ["book", "toy", "food", "tool"]}},
        "required": ["id", "name", "price", "in_stock", "category"]},
    "tool_call": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16}, "arguments": {"type": "object"}}, "required": ["name", "arguments"]},
    "json_object": {"type": "object"},
}
# --schema-set recursive: $ref cycles as calls (json_holes.py), nested as deep as the model goes
RECURSIVE = {
    "file_tree": {"$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}}, "required": ["name", "children"]}},
        "$ref": "#/$defs/node"},
    "expression": {"$defs": {"e": {"anyOf": [
        {"type": "object", "properties": {"op": {"enum": ["+", "*"]},
                                          "args": {"type": "array", "items": {"$ref": "#/$defs/e"}, "minItems": 2,
                                                   "maxItems": 2}}, "required": ["op", "args"]},
        {"type": "object", "properties": {"num": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["num"]}]}},
        "$ref": "#/$defs/e"},
    "optional_parent": {"$defs": {"n": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "parent": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}},
        "required": ["name", "parent"]}}, "$ref": "#/$defs/n"},
}
# --schema-set tags: structural tags (constrained/ebnf/structural_tag.py), free text whose segments
# follow schemas; random weights write a 1-char trigger often, the others seldom (free-text masks)
_CALL = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
TAGS = {
    "letter_e": {"structures": [{"begin": "e:", "schema": {"type": "integer", "minimum": 0, "maximum": 99},
                                 "end": ";"}], "triggers": ["e"]},
    "tool_calls": {"structures": [{"begin": f'<tool_call>\n{{"name": "{n}", "arguments": ', "schema": s,
                                   "end": "}\n</tool_call>"} for n, s in (("get_weather", _CALL), ("search", {}))],
                   "triggers": ["<tool_call>"]},
    "json_blocks": {"structures": [{"begin": "```json\n", "schema": _CALL, "end": "\n```"}], "triggers": ["```"]},
}
SCHEMA_SETS = {"mixed": SCHEMAS, "recursive": RECURSIVE, "tags": TAGS}


def _constraint(schema_set: str, value: dict) -> dict:
    return {"structural_tag": value} if schema_set == "tags" else {"json_schema": value}
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default="dummy:llama3-8b")
    ap.add_argument("--tokenizer-path", default=None)
    ap.add_argument("--batch-sizes", default="1,64")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0, help="0: greedy (jump-forward drafts are verified)")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions (best kept)")
    ap.add_argument("--max-total-tokens", type=int, default=65536, help="KV pool of each engine")
    ap.add_argument("--cuda-graph-extend-max-tokens", type=int, default=256, help="0: extends run eagerly")
    ap.add_argument("--schema-set", choices=list(SCHEMA_SETS), default="mixed")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "constrained_cuda.json"))
    args = ap.parse_args()
    schemas = SCHEMA_SETS[args.schema_set]
    from treadle.constrained import GrammarSpec
    from treadle.runtime import Engine

    info = machine_info(("torch", "triton", "outlines_core", "transformers"))
    common = dict(model_path=args.model_path, tokenizer_path=args.tokenizer_path, context_length=2048,
                  max_total_tokens=args.max_total_tokens,  # two engines share the device
                  cuda_graph_extend_max_tokens=args.cuda_graph_extend_max_tokens)
    t0 = time.perf_counter()
    eng_on = Engine(**common, jump_forward_max_batch=1 << 20)  # jumps at every batch size (off by default on CUDA)
    eng_off = Engine(**common, disable_jump_forward=True)
    emit({"figure": "engine_load", "seconds_two_engines": round(time.perf_counter() - t0, 1)})
    names = list(schemas)
    grammars = {n: eng_on.scheduler.grammar_compiler.compile(GrammarSpec.from_params(**_constraint(args.schema_set, s)))
                for n, s in schemas.items()}

    def run(eng, prompts, params):
        eng.flush_cache()
        i0 = eng.get_server_info()
        t = time.perf_counter()
        outs = eng.generate(prompts, params)
        wall = time.perf_counter() - t
        i1 = eng.get_server_info()
        return outs, wall, {k: i1[k] - i0[k] for k in ("forward_steps", "decode_steps", "jump_tokens")}

    for bs in [int(x) for x in args.batch_sizes.split(",")]:
        sel = [names[i % len(names)] for i in range(bs)]
        prompts = [f"Record {i}: reply in JSON ({n})." for i, n in enumerate(sel)]
        cp = [{**_constraint(args.schema_set, schemas[n]), "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
               "seed": 100 + i}
              for i, n in enumerate(sel)]
        for eng in (eng_on, eng_off):  # warm-up: graphs, grammars, kernels for these shapes
            run(eng, prompts, cp)
        best: dict[str, tuple] = {}
        for _ in range(args.reps):
            for label, eng in (("constrained_jf_on", eng_on), ("constrained_jf_off", eng_off)):
                outs, wall, d = run(eng, prompts, cp)
                if label not in best or wall < best[label][1]:
                    best[label] = (outs, wall, d)
            lens = [o["meta_info"]["completion_tokens"] for o in best["constrained_jf_off"][0]]
            up = [{"max_new_tokens": n, "ignore_eos": True, "temperature": args.temperature, "seed": 100 + i}
                  for i, n in enumerate(lens)]
            outs, wall, d = run(eng_off, prompts, up)
            if [o["meta_info"]["completion_tokens"] for o in outs] != lens:
                raise RuntimeError("unconstrained lengths differ from the constrained ones")
            if "unconstrained" not in best or wall < best["unconstrained"][1]:
                best["unconstrained"] = (outs, wall, d)
        replayed = finished = segments = 0
        for label in ("constrained_jf_on", "constrained_jf_off"):
            for n, o in zip(sel, best[label][0]):
                m = grammars[n].matcher()
                if not all(m.accept_token(t) for t in o["output_ids"]):
                    raise RuntimeError(f"{label} output of {n} is refused by its grammar: {o['text']!r}")
                replayed += 1
                finished += o["meta_info"]["finish_reason"]["type"] == "stop"
                if args.schema_set == "tags":  # segments the output opened
                    segments += sum(o["text"].count(t) for t in schemas[n]["triggers"])
        row = {}
        for label, (outs, wall, d) in best.items():
            ntok = sum(o["meta_info"]["completion_tokens"] for o in outs)
            row[label] = {"output_tokens": ntok, "seconds": round(wall, 4), "tok_s": round(ntok / wall, 1),
                          "forward_steps": d["forward_steps"], "jump_tokens": d["jump_tokens"]}
        u = row["unconstrained"]["tok_s"]
        emit({"figure": "constrained_vs_unconstrained", "batch": bs, "temperature": args.temperature,
              "schemas": sel[:len(names)],
              "max_new_tokens": args.max_new_tokens, "best_of_reps": args.reps, **row,
              "ratio_jf_off": round(row["constrained_jf_off"]["tok_s"] / u, 3),
              "ratio_jf_on": round(row["constrained_jf_on"]["tok_s"] / u, 3),
              "outputs_replayed_through_grammar": replayed, "finished_by_stop": finished,
              **({"segments_opened": segments} if args.schema_set == "tags" else {})})
    eng_on.check_integrity()
    eng_off.check_integrity()
    eng_on.shutdown()
    eng_off.shutdown()
    write_results(args.out, "constrained vs unconstrained decoding (GPU)", machine=info, model=args.model_path,
                  schema_set=args.schema_set, schemas=schemas)


if __name__ == "__main__":
    main()
