"""CPU engine vs HF transformers `generate` on the embedded SmolLM2-135M-Instruct, fp32.

In one run, on the same token ids and the same weights (the embedded GGUF):
- batch_1:  one chat prompt, --new-tokens (64) new tokens, greedy, EOS banned on both sides
  (min_new_tokens = max_new_tokens);
- batch_16: 16 different chat prompts in one call (HF: one left-padded batch, pad = eos);
- mixed_32: 32 prompts of --min-prompt..--max-prompt tokens (20..400) with 16..128 output tokens,
  against HF as one left-padded batch AND HF one prompt at a time (no padding)
  each, drawn with --seed. HF runs them as one left-padded batch with the batch's max output
  length (every row decodes that many); only each row's requested tokens count as useful
  output. The Engine gets one generate call with per-request max_new_tokens.
Both sides are warmed up first (one short generate); the radix cache is flushed before each
Engine measurement so no workload reuses an earlier one's prompts. Prints one JSON line per
figure and writes benchmarks/results/engine_cpu.json (machine, versions, command).

    nice .venv/bin/python benchmarks/bench_engine_cpu.py [--new-tokens 64] [--mixed 32] [--seed 0]
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

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a haiku about the sea.",
    "How do I reverse a list in Python?",
    "Give three tips for better sleep.",
    "What causes the seasons on Earth?",
    "Summarize the plot of Romeo and Juliet.",
    "Why is the sky blue?",
    "What is a prime number? Give examples.",
    "Suggest a name for a friendly robot.",
    "How does a bicycle stay upright?",
    "List four animals that live in the ocean.",
    "What is the difference between weather and climate?",
    "Describe a good breakfast for a runner.",
    "How many legs does a spider have, and why?",
    "Translate 'good morning' into Spanish and French.",
]

WORDS = ("river mountain quiet engine paper garden silver window market storm lantern harbor "
         "velvet copper meadow signal orchard canyon thunder pocket whisper marble ribbon "
         "compass glacier kettle falcon tunnel saddle crystal bridge feather ladder island "
         "candle meadow voyage anchor prism cedar ember quartz tide maple blossom summit").split()


def chat_ids(engine, user: str) -> list[int]:
    from treadle.runtime.tokenizer import apply_chat_template

    return engine.encode(apply_chat_template(engine.tokenizer, [{"role": "user", "content": user}]))


def mixed_prompts(engine, n: int, lo: int, hi: int, out_lo: int, out_hi: int, seed: int):
    """n chat prompts of exact token lengths in [lo, hi] (a short system + user turn around filler
    tokens taken from different offsets of a random-word text) and output lengths in [out_lo, out_hi]."""
    from treadle.runtime.tokenizer import apply_chat_template

    rng = random.Random(seed)
    marker = "@@@"
    text = apply_chat_template(engine.tokenizer, [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": marker}])
    head, tail = text.split(marker)
    head_ids, tail_ids = engine.encode(head), engine.encode(tail)
    overhead = len(head_ids) + len(tail_ids)
    assert lo > overhead, f"--min-prompt must exceed the template overhead ({overhead} tokens)"
    filler = engine.encode(" ".join(rng.choice(WORDS) for _ in range(4 * hi + 2000)))
    prompts, outs = [], []
    for _ in range(n):
        length = rng.randint(lo, hi)
        k = length - overhead
        off = rng.randint(0, len(filler) - k)
        prompts.append(head_ids + filler[off:off + k] + tail_ids)
        outs.append(rng.randint(out_lo, out_hi))
    return prompts, outs


def hf_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int) -> tuple[float, list[list[int]]]:
    """One left-padded batch, greedy, exactly new_tokens per row. Returns (seconds, new ids per row)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id)
    dt = time.perf_counter() - t0
    return dt, [row[width:].tolist() for row in out]


def hf_generate_each(model, prompts: list[list[int]], new_tokens: list[int], pad_id: int) -> float:
    """HF `generate` one prompt at a time (no padding), each with its own output length: how
    mixed-length prompts run with HF when padding is not wanted. Returns seconds."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        for p, n in zip(prompts, new_tokens):
            ids = torch.tensor([p])
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - t0


def engine_generate(engine, prompts: list[list[int]], new_tokens: list[int]) -> tuple[float, list[dict]]:
    engine.flush_cache()
    # min_new_tokens bans EOS as HF's min_new_tokens does (ignore_eos would let the model emit
    # EOS and go on, and the two greedy outputs would part there)
    params = [{"max_new_tokens": n, "min_new_tokens": n, "temperature": 0} for n in new_tokens]
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    return time.perf_counter() - t0, outs


def agreement(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two greedy outputs."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64, help="new tokens per request in batch_1 / batch_16")
    ap.add_argument("--batch", type=int, default=16, help="prompts in the batch workload (at most 16)")
    ap.add_argument("--mixed", type=int, default=32, help="prompts in the mixed workload")
    ap.add_argument("--min-prompt", type=int, default=20)
    ap.add_argument("--max-prompt", type=int, default=400)
    ap.add_argument("--min-out", type=int, default=16)
    ap.add_argument("--max-out", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hf-sequential", action="store_true", help="skip HF one prompt at a time on the mixed set")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "engine_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from treadle.runtime import Engine
    from treadle.runtime.model_source import embedded_model_path

    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    t0 = time.perf_counter()
    engine = Engine(None, dtype="float32", device="cpu")
    engine_load = time.perf_counter() - t0
    gguf = embedded_model_path()
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                              dtype=torch.float32).eval()
    hf_load = time.perf_counter() - t0
    eos = engine.tokenizer.eos_token_id
    print(json.dumps({"engine_load_s": round(engine_load, 2), "hf_load_s": round(hf_load, 2)}), flush=True)

    # warm-up: one short generate each
    warm = chat_ids(engine, "Hello!")
    engine_generate(engine, [warm], [8])
    hf_generate(hf, [warm], 8, eos)

    def compare(name: str, prompts: list[list[int]], outs: list[int], extra: dict | None = None) -> None:
        useful = sum(outs)
        t_eng, res = engine_generate(engine, prompts, outs)
        got = sum(r["meta_info"]["completion_tokens"] for r in res)
        assert got == useful, f"{name}: engine produced {got} tokens, expected {useful}"
        t_hf, hf_out = hf_generate(hf, prompts, max(outs), eos)
        # greedy fp32 on both: how far do the outputs agree (tokens of the common prefix)?
        agree = sum(agreement(r["output_ids"], h[:n]) for r, h, n in zip(res, hf_out, outs))
        emit({"figure": name, "batch": len(prompts), "prompt_tokens": sum(len(p) for p in prompts),
              "useful_output_tokens": useful, "hf_decoded_tokens": len(prompts) * max(outs),
              "engine_s": round(t_eng, 3), "hf_s": round(t_hf, 3),
              "engine_tok_s": round(useful / t_eng, 2), "hf_tok_s": round(useful / t_hf, 2),
              "speedup": round(t_hf / t_eng, 2), "greedy_agreement": round(agree / useful, 3), **(extra or {})})

    # (a) batch 1
    compare("batch_1", [chat_ids(engine, QUESTIONS[0])], [args.new_tokens])
    # (b) batch of different chat prompts
    bs = min(args.batch, len(QUESTIONS))
    compare(f"batch_{bs}", [chat_ids(engine, q) for q in QUESTIONS[:bs]], [args.new_tokens] * bs)
    # (c) mixed lengths
    prompts, outs = mixed_prompts(engine, args.mixed, args.min_prompt, args.max_prompt, args.min_out, args.max_out,
                                  args.seed)
    extra = {"prompt_len_range": [min(map(len, prompts)), max(map(len, prompts))],
             "output_len_range": [min(outs), max(outs)], "seed": args.seed, "target_speedup": 5.0}
    if not args.no_hf_sequential:
        t_seq = hf_generate_each(hf, prompts, outs, eos)
        extra.update({"hf_sequential_s": round(t_seq, 3), "hf_sequential_tok_s": round(sum(outs) / t_seq, 2)})
    compare(f"mixed_{args.mixed}", prompts, outs, extra)
    if "hf_sequential_s" in extra:
        row = rows[-1]
        row["speedup_vs_hf_sequential"] = round(extra["hf_sequential_s"] / row["engine_s"], 2)
        print(json.dumps({"figure": "mixed_vs_hf_sequential", "engine_tok_s": row["engine_tok_s"],
                          "hf_sequential_tok_s": row["hf_sequential_tok_s"], "hf_padded_batch_tok_s": row["hf_tok_s"],
                          "speedup_vs_hf_sequential": row["speedup_vs_hf_sequential"],
                          "speedup_vs_hf_padded_batch": row["speedup"]}), flush=True)

    info = engine.get_server_info()
    engine.shutdown()
    result = {"benchmark": "engine_cpu", "model": "SmolLM2-135M-Instruct (embedded GGUF), fp32",
              "machine": machine_info(),
              "command": "nice " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT)] + sys.argv),
              "notes": "Engine and HF get the same token ids; greedy; exactly the requested new tokens (EOS banned "
                       "on both sides by min_new_tokens). tok/s = useful output tokens / wall time. HF pads "
                       "each batch on the left (pad = eos) and decodes the batch's max output length for every row.",
              "engine_forward_steps": info.get("forward_steps"),
              "results": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
