"""N-gram speculative decoding (`--speculative-algorithm ngram`) on vs off, CPU, SmolLM2 fp32.

Greedy chat requests whose replies copy their prompt to different degrees: `copy` (repeat a
passage), `extract` (list items from it), `code` (rewrite a function with one change),
`json_quote` (the passage as a JSON string value, under a JSON schema: drafts are cut where the
grammar refuses them, jump-forward on in both runs), and `free` (a poem: nothing to copy, the
cost of trying). Each runs alone (bs 1) and all five
together (bs 5), with the same engine settings but the algorithm; outputs must be identical
(checked), so tokens per second compare like for like. The radix cache is flushed before each
measurement. Prints one JSON line per figure; --output writes them all.

    nice .venv/bin/python benchmarks/bench_speculative.py --output benchmarks/results/speculative_cpu.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

from figures import write_figures  # benchmarks/figures.py
from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

PASSAGE = ("The committee met on Tuesday to review the budget for the new library. After a long discussion, "
           "the members agreed to fund the children's reading room, the digital archive, the repair of the "
           "roof, and longer opening hours on weekends. The vote was seven to two.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(values)\n")
TASKS = {
    "copy": f"Repeat this text exactly:\n{PASSAGE}",
    "extract": f"{PASSAGE}\n\nList the things the members agreed to fund, one per line.",
    "code": f"Rewrite this Python function so that it returns 0.0 for an empty list:\n{CODE}",
    "json_quote": f"Repeat this text exactly, as JSON with the key quote:\n{PASSAGE}",
    "free": "Write a short poem about the sea.",
}
EXTRA = {"json_quote": {"json_schema": {"type": "object", "properties": {"quote": {"type": "string"}},
                                        "required": ["quote"]}}}


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def measure(engine, names: list[str], new_tokens: int) -> tuple[list[dict], dict]:
    while not engine.flush_cache():
        time.sleep(0.01)
    i0 = engine.get_server_info()
    t0 = time.perf_counter()
    outs = engine.generate([chat(TASKS[n]) for n in names],
                           [{"max_new_tokens": new_tokens, "temperature": 0, **EXTRA.get(n, {})} for n in names])
    wall = time.perf_counter() - t0
    i1 = engine.get_server_info()
    d = {k: i1[k] - i0[k] for k in ("forward_steps", "spec_draft_tokens", "spec_accepted_tokens")}
    d["wall_s"] = wall
    return outs, d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--draft-tokens", type=int, default=8)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    from treadle.runtime.engine import Engine

    figures = [{"figure": "meta", **machine_info(), "model": "embedded SmolLM2-135M-Instruct (fp32)",
                "command": "python " + shlex.join(sys.argv), "new_tokens": args.new_tokens,
                "draft_tokens": args.draft_tokens, "ngram": args.ngram}]
    print(json.dumps(figures[0]), flush=True)
    workloads = [(n, [n]) for n in TASKS] + [("all_five_bs5", list(TASKS))]
    results: dict[str, dict] = {}
    for algo in ("none", "ngram"):
        with Engine(speculative_algorithm=algo, speculative_num_draft_tokens=args.draft_tokens,
                    speculative_ngram_size=args.ngram) as e:
            e.generate(chat("Hello"), {"max_new_tokens": 8, "temperature": 0})  # warm-up
            for name, names in workloads:
                results[f"{name}/{algo}"] = measure(e, names, args.new_tokens)
    for name, _ in workloads:
        (o0, d0), (o1, d1) = results[f"{name}/none"], results[f"{name}/ngram"]
        same = [a["output_ids"] for a in o0] == [b["output_ids"] for b in o1]
        tokens = sum(o["meta_info"]["completion_tokens"] for o in o0)
        fig = {"figure": "workload", "name": name, "output_tokens": tokens, "identical_outputs": same,
               "off_tok_s": round(tokens / d0["wall_s"], 1), "ngram_tok_s": round(tokens / d1["wall_s"], 1),
               "speedup": round(d0["wall_s"] / d1["wall_s"], 2),
               "off_forward_steps": d0["forward_steps"], "ngram_forward_steps": d1["forward_steps"],
               "draft_tokens": d1["spec_draft_tokens"], "accepted_tokens": d1["spec_accepted_tokens"],
               "acceptance": round(d1["spec_accepted_tokens"] / max(1, d1["spec_draft_tokens"]), 3)}
        figures.append(fig)
        print(json.dumps(fig), flush=True)
    print(f"\n{'workload':>14} {'tokens':>6} {'off tok/s':>9} {'ngram tok/s':>11} {'speedup':>7} "
          f"{'steps off/on':>12} {'accept':>6} same")
    for f in figures[1:]:
        print(f"{f['name']:>14} {f['output_tokens']:>6} {f['off_tok_s']:>9} {f['ngram_tok_s']:>11} "
              f"{f['speedup']:>7} {f['off_forward_steps']:>5}/{f['ngram_forward_steps']:<6} {f['acceptance']:>6} "
              f"{f['identical_outputs']}")
    write_figures(figures, args.output)


if __name__ == "__main__":
    sys.exit(main())
