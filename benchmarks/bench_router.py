"""Data-parallel routing: cache_aware vs round_robin over the same two replica servers.

Workload: G groups of few-shot prompts; a group shares a ~500-token prefix (its own task
line and examples) and its R requests differ only in the final question. The G*R requests
are sent in one seeded shuffled order (so groups interleave and round robin cannot line a
group up with a replica by accident), C at a time, max_new_tokens 4. Both policies run in
one process against the same two replicas, whose caches are flushed before each run.

Figures per policy: aggregate cache hit rate (sum cached_tokens / sum prompt_tokens from
the responses' meta_info), the ideal hit rate of the trace (one cache, no eviction), req/s
and prompt tok/s, latency p50 / p90, requests per replica.

    nice .venv/bin/python benchmarks/bench_router.py [--groups 8 --per-group 6 --concurrency 4 \\
        --max-total-tokens 4096 --out benchmarks/results/router_cpu.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from treadle.runtime.server.testing import ServerProcess, free_port

from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

WORDS = ("river mountain lantern copper violin harbor meadow glacier orchard pepper falcon marble "
         "thunder velvet compass saffron willow canyon ember quartz tundra lagoon cedar prism").split()


def group_prefix(g: int, target_words: int = 380) -> str:
    """~500 tokens of few-shot examples, distinct per group from the first characters on."""
    rng = random.Random(1000 + g)
    lines = [f"Task {g}: for each word list, answer with the word that is alphabetically first."]
    n = len(lines[0].split())
    i = 0
    while n < target_words:
        ws = rng.sample(WORDS, 5)
        line = f"Example {i}: {', '.join(ws)} -> {min(ws)}"
        lines.append(line)
        n += len(line.split()) + 5
        i += 1
    return "\n".join(lines) + "\n"


def workload(groups: int, per_group: int, seed: int) -> list[tuple[int, str]]:
    items = []
    for g in range(groups):
        prefix = group_prefix(g)
        rng = random.Random(g)
        for q in range(per_group):
            items.append((g, prefix + f"Question {q}: {', '.join(rng.sample(WORDS, 5))} ->"))
    random.Random(seed).shuffle(items)
    return items


def start_router(workers: list[str], policy: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "treadle.runtime.router", "--port", str(port), "--policy", policy,
           *[a for w in workers for a in ("--worker", w)]]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass  # not listening yet
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise TimeoutError("router did not become healthy")


def run_policy(policy: str, workers: list[str], items: list[tuple[int, str]], concurrency: int,
               max_new_tokens: int) -> dict:
    proc, url = start_router(workers, policy)
    try:
        r = requests.post(url + "/flush_cache", timeout=60)
        assert r.status_code == 200, f"flush failed: {r.text}"

        def one(item: tuple[int, str]) -> dict:
            g, text = item
            t0 = time.perf_counter()
            resp = requests.post(url + "/generate", timeout=600, json={
                "text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
            assert resp.status_code == 200, resp.text
            meta = resp.json()["meta_info"]
            return {"group": g, "replica": resp.headers["X-Treadle-Replica"], "latency_s": time.perf_counter() - t0,
                    "prompt_tokens": meta["prompt_tokens"], "cached_tokens": meta["cached_tokens"]}

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            outs = list(pool.map(one, items))
        print(f"# {policy}: {len(outs)} requests in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        wall = time.perf_counter() - t0
        router_info = requests.get(url + "/get_server_info", timeout=60).json()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    prompt = sum(o["prompt_tokens"] for o in outs)
    cached = sum(o["cached_tokens"] for o in outs)
    lat = sorted(o["latency_s"] for o in outs)
    per_replica: dict[str, int] = {}
    groups_on: dict[int, set[str]] = {}
    for o in outs:
        per_replica[o["replica"]] = per_replica.get(o["replica"], 0) + 1
        groups_on.setdefault(o["group"], set()).add(o["replica"])
    return {"figure": "router", "policy": policy, "requests": len(outs), "prompt_tokens": prompt,
            "cached_tokens": cached, "cache_hit_rate": round(cached / prompt, 4), "wall_s": round(wall, 2),
            "req_s": round(len(outs) / wall, 3), "prompt_tok_s": round(prompt / wall, 1),
            "latency_p50_s": round(lat[len(lat) // 2], 3), "latency_p90_s": round(lat[int(len(lat) * 0.9)], 3),
            "requests_per_replica": sorted(per_replica.values()),
            "groups_split_across_replicas": sum(len(v) > 1 for v in groups_on.values()),
            "router_prefix_match_rate": [round(x["prefix_match_rate"], 3) for x in router_info["replicas"]],
            "replica_dropped_from_rotation": sum(x["times_dropped"] for x in router_info["replicas"]),
            "_outs": outs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--per-group", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--max-total-tokens", type=int, default=4096, help="KV pool per replica, in tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/router_cpu.json")
    a = ap.parse_args()
    items = workload(a.groups, a.per_group, a.seed)
    server_flags = ["--max-total-tokens", str(a.max_total_tokens), "--log-level", "warning"]
    srvs = []
    try:
        for _ in range(2):
            srvs.append(ServerProcess(server_flags))
        workers = [s.url for s in srvs]
        # warm-up: the first request of a fresh server pays one-time costs
        for s in srvs:
            requests.post(s.url + "/generate", timeout=600, json={"text": "warm up", "sampling_params": {"max_new_tokens": 1}})
        results = [run_policy(p, workers, items, a.concurrency, a.max_new_tokens) for p in ("cache_aware", "round_robin")]
    finally:
        for s in srvs:
            s.close()
    # ideal: one cache, never evicting: every request but a group's first hits the group's prefix
    # (its token length: the longest hit seen in that group in either run)
    longest: dict[int, int] = {}
    for r in results:
        for o in r["_outs"]:
            longest[o["group"]] = max(longest.get(o["group"], 0), o["cached_tokens"])
    ideal = sum((a.per_group - 1) * n for n in longest.values()) / results[0]["prompt_tokens"]
    for r in results:
        r.pop("_outs")
        r["ideal_hit_rate"] = round(ideal, 4)
        print(json.dumps(r), flush=True)
    ca, rr = results
    summary = {"figure": "router_compare", "cache_aware_hit_rate": ca["cache_hit_rate"],
               "round_robin_hit_rate": rr["cache_hit_rate"], "ideal_hit_rate": round(ideal, 4),
               "cache_aware_req_s": ca["req_s"], "round_robin_req_s": rr["req_s"],
               "throughput_ratio": round(ca["req_s"] / rr["req_s"], 3)}
    print(json.dumps(summary), flush=True)
    doc = {"benchmark": "router", "model": "SmolLM2-135M-Instruct (embedded GGUF), fp32, CPU",
           "machine": machine_info(("torch",)), "command": "nice .venv/bin/python " + " ".join(sys.argv),
           "workload": {"groups": a.groups, "per_group": a.per_group, "concurrency": a.concurrency,
                        "max_new_tokens": a.max_new_tokens, "replicas": 2, "max_total_tokens_per_replica":
                        a.max_total_tokens, "order": f"shuffled, seed {a.seed}"},
           "notes": "Both policies in one run on the same two replicas (caches flushed between). Shared CPU "
                    "(2 cores, other jobs running): compare the ratios, not absolute times.",
           "results": results, "summary": summary}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
