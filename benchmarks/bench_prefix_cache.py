"""Prefix sharing, few-shot and multi-turn chat: radix cache on vs off, and the hit rate vs
an ideal cache (CPU by default; --device cuda --model-path dummy:llama3-8b on a GPU).

--requests (64) requests share one long few-shot prefix (--shots, default 21, headline ->
topic examples; about 600-1000 tokens), each followed by a distinct short headline to
classify; --new-tokens (16) greedy new tokens each (ignore_eos). Two in-process Engines on
the embedded SmolLM2-135M-Instruct, fp32: radix cache on, and `disable_radix_cache=True`.
Each is timed on the same trace sent two ways: all requests in one batch generate call, and
--waves (4) sequential generate calls. The cache is flushed before each measurement.
Figures per mode: requests/s, total (prompt + output) tokens/s and output tokens/s on and
off, the speed-up (off time / on time), the cache hit rate (cached / prompt tokens, from
get_server_info deltas) and the ideal hit rate for that trace: the prompts replayed in
submission order through an infinite prefix trie, each prompt hitting its longest prefix
seen before, capped at len-1 (the last prompt token is always computed).
Multi-turn (--conversations 16, --turns 4): each conversation's next prompt is its last
prompt, the reply it got and a new user message, so every turn after the first continues
into the previous reply's KV; a turn of all conversations is one generate call.
Prints one JSON line per figure and writes benchmarks/results/prefix_cache_cpu.json.

    nice .venv/bin/python benchmarks/bench_prefix_cache.py [--requests 64] [--waves 4] [--shots 20]
    python bench_prefix_cache.py --device cuda --dtype bfloat16 --model-path dummy:llama3-8b \
        --tokenizer-path ../.gpu_assets/smollm2-tokenizer --requests 256 --new-tokens 64 \
        --conversations 64 --out results/prefix_cache_cuda.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time

import torch

from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHOTS = [
    ("The home side scored twice in the final ten minutes to win the championship in front of a sold-out stadium.",
     "sports"),
    ("Parliament passed the new budget after a long night of debate between the ruling coalition and the opposition.",
     "politics"),
    ("Astronomers have detected water vapour in the atmosphere of a planet orbiting a distant red dwarf star.",
     "science"),
    ("Shares of the largest chip maker fell sharply after the company cut its revenue forecast for the next quarter.",
     "business"),
    ("The veteran goalkeeper announced his retirement after twenty seasons and more than six hundred appearances.",
     "sports"),
    ("The prime minister reshuffled the cabinet, naming a new foreign minister and a new minister of finance.",
     "politics"),
    ("A new study shows that bees can learn to count and recognise small numbers of objects in the lab.",
     "science"),
    ("The central bank raised interest rates by half a point to slow inflation, surprising many economists.",
     "business"),
    ("The young tennis player beat the world number one in straight sets to reach her first grand slam final.",
     "sports"),
    ("Voters in the northern provinces went to the polls on Sunday to elect a new regional government.",
     "politics"),
    ("Researchers have built a battery that charges in five minutes and keeps most of its capacity for years.",
     "science"),
    ("The airline reported record profits as passenger numbers finally returned to their levels before the pandemic.",
     "business"),
    ("The cycling team won the time trial by eleven seconds and took the leader's yellow jersey for the first time.",
     "sports"),
    ("The senate committee opened hearings on the proposed changes to the country's immigration rules.",
     "politics"),
    ("Geologists found that the volcano's magma chamber is larger and closer to the surface than once believed.",
     "science"),
    ("The retail group will close forty stores and move more of its sales online over the next two years.",
     "business"),
    ("The marathon runner broke the course record despite strong winds along the coastal section of the route.",
     "sports"),
    ("The president vetoed the bill, saying it would give too much power to the regional governors.",
     "politics"),
    ("A fossil discovered in the desert suggests that early whales once walked on four legs along the shore.",
     "science"),
    ("The car maker agreed to buy a smaller electric vehicle start-up in a deal worth two billion dollars.",
     "business"),
    ("The rugby captain was named player of the tournament after leading his team to an unbeaten season.",
     "sports"),
    ("The opposition leader called for an early election after the government lost a key vote on taxes.",
     "politics"),
    ("Doctors report that a new gene therapy restored partial sight to patients with a rare inherited disease.",
     "science"),
    ("The coffee chain raised its prices for the second time this year, blaming higher bean and milk costs.",
     "business"),
]

SUBJECTS = ["The national football team", "The finance minister", "A team of biologists", "The tech giant",
            "The city council", "The Olympic swimmer", "Physicists in Geneva", "The oil company"]
EVENTS = ["announced a surprising plan on Monday", "faced sharp criticism this week", "reported unexpected results",
          "celebrated a historic milestone", "was forced to change its strategy", "revealed new details today",
          "signed a long-awaited agreement", "set a new record after months of work"]


def build_trace(engine, n: int, shots: int) -> tuple[list[int], list[list[int]]]:
    """The shared few-shot prefix ids and n prompts (prefix + a distinct headline) as ids."""
    text = "Classify each news headline into one topic: sports, politics, science or business.\n\n"
    for i in range(shots):
        headline, topic = SHOTS[i % len(SHOTS)]
        text += f"Headline: {headline}\nTopic: {topic}\n\n"
    prefix = engine.encode(text)
    combos = [(s, e) for s in SUBJECTS for e in EVENTS]
    random.Random(0).shuffle(combos)
    prompts = []
    for i in range(n):
        s, e = combos[i % len(combos)]
        prompts.append(prefix + engine.encode(f"Headline: {s} {e} (report {i + 1}).\nTopic:"))
    return prefix, prompts


def ideal_hit_rate(prompts: list[list[int]], outputs: list[list[int]] | None = None) -> float:
    """Infinite prefix trie over token ids, prompts in submission order; hit capped at len-1.
    With `outputs`, each prompt's output is cached after it too (a multi-turn trace), but its
    last token: no forward ever computed that one's KV."""
    root: dict = {}
    hit = total = 0
    for i, ids in enumerate(prompts):
        node, n = root, 0
        for t in ids:
            if t not in node:
                break
            node, n = node[t], n + 1
        hit += min(n, len(ids) - 1)
        total += len(ids)
        node = root
        for t in ids + (outputs[i][:-1] if outputs else []):
            node = node.setdefault(t, {})
    return hit / max(total, 1)


USER_TURNS = ["Tell me more about that.", "Can you give an example?", "Why does that matter?",
              "Summarize it in one sentence.", "What would you do next?", "Is there another view?"]


def multi_turn(engine, conversations: int, turns: int, new_tokens: int) -> dict:
    """Every conversation's turn k + 1 prompt = its turn k prompt + reply + a user message."""
    engine.flush_cache()
    before = engine.get_server_info()
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    prompts = [engine.encode(f"Conversation {c}: you are a helpful assistant.\nUser: Hello, who are you?\n")
               for c in range(conversations)]
    sent, outs = [], []
    t0 = time.perf_counter()
    for k in range(turns):
        res = engine.generate(input_ids=prompts, sampling_params=[params] * len(prompts))
        sent += prompts
        outs += [r["output_ids"] for r in res]
        if k + 1 < turns:
            user = engine.encode(f"\nUser: {USER_TURNS[k % len(USER_TURNS)]}\n")
            prompts = [p + r["output_ids"] + user for p, r in zip(prompts, res)]
    dt = time.perf_counter() - t0
    after = engine.get_server_info()
    prompt_tokens = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    return {"seconds": dt, "prompt_tokens": prompt_tokens, "cached_tokens": cached, "prompts": sent,
            "output_tokens": sum(len(o) for o in outs), "hit_rate": cached / max(prompt_tokens, 1),
            "output_ids": outs}


def timed_run(engine, prompts: list[list[int]], waves: int, new_tokens: int) -> dict:
    """Send the prompts as `waves` sequential generate calls (1 = one batch); time and cache deltas."""
    engine.flush_cache()
    before = engine.get_server_info()
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    size = -(-len(prompts) // waves)
    outs = []
    t0 = time.perf_counter()
    for w in range(0, len(prompts), size):
        chunk = prompts[w:w + size]
        outs += engine.generate(input_ids=chunk, sampling_params=[params] * len(chunk))
    dt = time.perf_counter() - t0
    after = engine.get_server_info()
    prompt_tokens = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    return {"seconds": dt, "prompt_tokens": prompt_tokens, "cached_tokens": cached,
            "output_tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
            "hit_rate": cached / max(prompt_tokens, 1), "output_ids": [o["output_ids"] for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--waves", type=int, default=4, help="the second mode sends the requests in this many calls")
    ap.add_argument("--shots", type=int, default=21, help="few-shot examples in the shared prefix")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--conversations", type=int, default=16, help="multi-turn: conversations at once")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2")
    ap.add_argument("--tokenizer-path", default=None)
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "prefix_cache_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from treadle.runtime import Engine

    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    kw = {"dtype": args.dtype, "device": args.device, "tokenizer_path": args.tokenizer_path}
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    on = Engine(args.model_path, **kw)
    off = Engine(args.model_path, disable_radix_cache=True, **kw)
    prefix, prompts = build_trace(on, args.requests, args.shots)
    lens = [len(p) for p in prompts]
    print(json.dumps({"prefix_tokens": len(prefix), "prompt_tokens_range": [min(lens), max(lens)],
                      "requests": len(prompts)}), flush=True)
    ideal = ideal_hit_rate(prompts)  # the same for any number of waves: submission order is the same

    warm = prompts[0][:32]
    for eng in (on, off):  # warm-up: one short generate each
        eng.generate(input_ids=warm, sampling_params={"max_new_tokens": 4, "temperature": 0})

    for waves in (1, args.waves):
        r_on = timed_run(on, prompts, waves, args.new_tokens)
        r_off = timed_run(off, prompts, waves, args.new_tokens)
        same = sum(a == b for a, b in zip(r_on["output_ids"], r_off["output_ids"]))
        n = len(prompts)
        total_tokens = r_on["prompt_tokens"] + r_on["output_tokens"]
        emit({"figure": "few_shot_prefix", "mode": "one_batch" if waves == 1 else f"{waves}_waves",
              "requests": n, "prefix_tokens": len(prefix), "prompt_tokens": r_on["prompt_tokens"],
              "output_tokens": r_on["output_tokens"],
              "on_s": round(r_on["seconds"], 3), "off_s": round(r_off["seconds"], 3),
              "on_req_s": round(n / r_on["seconds"], 3), "off_req_s": round(n / r_off["seconds"], 3),
              "on_tok_s": round(total_tokens / r_on["seconds"], 1),
              "off_tok_s": round(total_tokens / r_off["seconds"], 1),
              "on_out_tok_s": round(r_on["output_tokens"] / r_on["seconds"], 2),
              "off_out_tok_s": round(r_off["output_tokens"] / r_off["seconds"], 2),
              "speedup": round(r_off["seconds"] / r_on["seconds"], 2), "target_speedup": 3.0,
              "hit_rate": round(r_on["hit_rate"], 4), "ideal_hit_rate": round(ideal, 4),
              "hit_rate_off": round(r_off["hit_rate"], 4),
              "outputs_identical_on_off": f"{same}/{n}"})

    m_on = multi_turn(on, args.conversations, args.turns, args.new_tokens)
    m_off = multi_turn(off, args.conversations, args.turns, args.new_tokens)
    same = sum(a == b for a, b in zip(m_on["output_ids"], m_off["output_ids"]))
    total_tokens = m_on["prompt_tokens"] + m_on["output_tokens"]
    emit({"figure": "multi_turn_prefix", "conversations": args.conversations, "turns": args.turns,
          "requests": args.conversations * args.turns, "prompt_tokens": m_on["prompt_tokens"],
          "output_tokens": m_on["output_tokens"], "on_s": round(m_on["seconds"], 3), "off_s": round(m_off["seconds"], 3),
          "on_tok_s": round(total_tokens / m_on["seconds"], 1), "off_tok_s": round(total_tokens / m_off["seconds"], 1),
          "speedup": round(m_off["seconds"] / m_on["seconds"], 2), "hit_rate": round(m_on["hit_rate"], 4),
          "ideal_hit_rate": round(ideal_hit_rate(m_on["prompts"], m_on["output_ids"]), 4), "hit_rate_off": round(m_off["hit_rate"], 4),
          "outputs_identical_on_off": f"{same}/{len(m_on['output_ids'])}"})

    on.shutdown()
    off.shutdown()
    result = {"benchmark": f"prefix_cache_{args.device}",
              "model": f"{args.model_path or 'SmolLM2-135M-Instruct (embedded GGUF)'}, {args.dtype}",
              "machine": machine_info(),
              "command": "nice " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT)] + sys.argv),
              "notes": "tok/s counts prompt + output tokens; speedup = off time / on time; hit_rate = cached / prompt "
                       "tokens over the measurement (cache flushed before each); ideal_hit_rate from an infinite "
                       "prefix trie over the same prompts in submission order (hit <= len-1).",
              "results": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
