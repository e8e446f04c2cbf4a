"""DSL programs over batches: radix-cache hit rate vs the best possible, and throughput
with the radix cache on vs off.

For each program (few-shot classification, multi-turn chat, tree of thought, ReAct agent)
it runs a batch of inputs with `run_batch` on two in-process Engines (radix cache on, then
off) and reports:
- hit_rate: cached / prompt tokens over the batch, from get_server_info deltas;
- best_hit_rate: replaying the same requests, in submission order, through an infinite
  prefix trie (a prompt hits its longest previously seen prefix; a finished request adds
  prompt + output; at most len-1 tokens, since the last prompt token is always computed);
- programs/s with the cache on and off, and the speedup.
Prints one JSON line per program and writes benchmarks/results/programs_cpu.json.

    python benchmarks/bench_programs.py [--batch 16]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))  # the programs are the examples'

from few_shot_classification import REVIEWS, classify  # noqa: E402
from multi_turn_chat import chat  # noqa: E402
from react_agent import agent  # noqa: E402
from tree_of_thought import tree_of_thought  # noqa: E402

from treadle.lang import EngineBackend  # noqa: E402


class PrefixTrie:
    """An infinite prefix cache over token ids."""

    def __init__(self) -> None:
        self.root: dict = {}

    def match(self, ids: list[int]) -> int:
        node, n = self.root, 0
        for t in ids:
            if t not in node:
                break
            node, n = node[t], n + 1
        return n

    def insert(self, ids: list[int]) -> None:
        node = self.root
        for t in ids:
            node = node.setdefault(t, {})


class RecordingEngine:
    """Forwards to an Engine and logs each request's prompt ids (at submission) and
    prompt + output ids (at completion), in order, for the ideal-cache replay."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.events: list[tuple[str, list[int]]] = []
        self.lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        return self.engine.encode(text)

    def generate(self, prompt: Any = None, sampling_params: Any = None, input_ids: Any = None, **kw: Any) -> Any:
        single = (isinstance(prompt, str) if prompt is not None else not input_ids or not isinstance(input_ids[0], list))
        if prompt is not None:
            ids = [self.encode(p) for p in ([prompt] if single else prompt)]
        else:
            ids = [list(input_ids)] if single else [list(x) for x in input_ids]
        with self.lock:
            self.events += [("submit", x) for x in ids]
        out = self.engine.generate(prompt, sampling_params, input_ids, **kw)
        with self.lock:
            self.events += [("done", x + o["output_ids"]) for x, o in zip(ids, [out] if single else out)]
        return out

    def get_server_info(self) -> dict:
        return self.engine.get_server_info()

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()


def best_hit_rate(events: list[tuple[str, list[int]]]) -> float:
    trie, hit, total = PrefixTrie(), 0, 0
    for kind, ids in events:
        if kind == "submit":
            hit += min(trie.match(ids), max(len(ids) - 1, 0))
            total += len(ids)
        trie.insert(ids)
    return hit / max(total, 1)


def workloads(n: int) -> dict[str, tuple[Any, list[dict]]]:
    countries = ["Italy", "France", "Japan", "Peru", "Kenya", "Canada", "India", "Egypt", "Norway", "Chile",
                 "Spain", "Brazil", "China", "Greece", "Mexico", "Ghana"]
    return {
        "few_shot": (classify, [{"review": f"{REVIEWS[i % len(REVIEWS)][0]} (seen on day {i})"} for i in range(n)]),
        "multi_turn": (chat, [{"questions": [f"What is the capital of {countries[i % 16]}?",
                                             "Name a famous dish from there.", "Describe it in five words."]}
                              for i in range(n)]),
        "tree_of_thought": (tree_of_thought, [{"question": f"A farmer has {i + 2} pens with {i % 5 + 3} sheep each. "
                                                           "How many sheep are there?"} for i in range(n)]),
        "agent": (agent, [{"question": f"What is {i + 11} * {i + 7}?", "max_steps": 2} for i in range(n)]),
    }


def run_all(disable_radix_cache: bool, n: int, only: list[str] | None = None) -> dict[str, dict]:
    from treadle.runtime import Engine

    engine = Engine(max_total_tokens=65536, disable_radix_cache=disable_radix_cache)
    rec = RecordingEngine(engine)
    backend = EngineBackend(rec)
    results = {}
    try:
        for name, (program, inputs) in workloads(n).items():
            if only and name not in only:
                continue
            engine.flush_cache()
            rec.events = []
            before = engine.get_server_info()
            t0 = time.perf_counter()
            states = program.run_batch(inputs, backend=backend, temperature=0, progress_bar=False)
            for st in states:
                st.sync()  # any program error fails the benchmark loudly
            wall = time.perf_counter() - t0
            after = engine.get_server_info()
            prompt = after["prompt_tokens"] - before["prompt_tokens"]
            cached = after["cached_tokens"] - before["cached_tokens"]
            results[name] = {"wall_s": round(wall, 2), "programs_per_s": round(n / wall, 3),
                             "prompt_tokens": prompt, "cached_tokens": cached,
                             "generated_tokens": after["generated_tokens"] - before["generated_tokens"],
                             "hit_rate": round(cached / max(prompt, 1), 4),
                             "best_hit_rate": round(best_hit_rate(rec.events), 4), "requests": len(
                                 [e for e in rec.events if e[0] == "submit"])}
            print(f"# radix {'off' if disable_radix_cache else 'on'}: {name}: {results[name]}", file=sys.stderr)
    finally:
        engine.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="programs per workload")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "programs_cpu.json"))
    parser.add_argument("--programs", nargs="*", default=None,
                        help="subset of few_shot multi_turn tree_of_thought agent (default: all)")
    args = parser.parse_args()
    on = run_all(False, args.batch, args.programs)
    off = run_all(True, args.batch, args.programs)
    rows = []
    for name in on:
        row = {"program": name, "batch": args.batch,
               "hit_rate": on[name]["hit_rate"], "best_hit_rate": on[name]["best_hit_rate"],
               "hit_gap_points": round(100 * (on[name]["best_hit_rate"] - on[name]["hit_rate"]), 2),
               "programs_per_s_cache_on": on[name]["programs_per_s"],
               "programs_per_s_cache_off": off[name]["programs_per_s"],
               "speedup": round(on[name]["programs_per_s"] / off[name]["programs_per_s"], 2),
               "cache_on": on[name], "cache_off": off[name]}
        rows.append(row)
        print(json.dumps(row))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": platform.platform(), "cpu_count": os.cpu_count(), "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
