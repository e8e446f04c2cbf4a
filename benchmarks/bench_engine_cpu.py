"""CPU engine vs HF transformers `generate` and llama.cpp on the embedded SmolLM2-135M-Instruct.

treadle runs twice: from the GGUF's packed Q4_1/Q8_0 blocks (`packed`, the default) and with
every weight dequantized to float32 (`fp32`, --gguf-dequantize); HF transformers dequantizes the
same GGUF to float32; llama.cpp (llama-cpp-python, the `bench` extra) runs the same GGUF file on
batch_1 only, loaded with use_extra_bufts=False (its weight repacking crashes on the 2-core
dev box). In one run, on the same token ids and the same weights (the embedded GGUF):
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

batch_1 runs --repeats times per side, interleaved (packed, fp32, llama.cpp, ...): its figures
are medians, with every run listed (the dev box is shared; load averages are recorded).

    nice .venv/bin/python benchmarks/bench_engine_cpu.py [--new-tokens 64] [--mixed 32] [--seed 0]
        [--engines packed,fp32] [--figures batch_1,batch_16,mixed] [--repeats 3] [--no-llama-cpp]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
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


def llama_cpp_model(path: str, threads: int):
    """llama.cpp on the GGUF file, or None when llama-cpp-python is not installed. Weight
    repacking off (llama_model_params.use_extra_bufts, which 0.3.x's Llama() does not expose:
    set through the default-params function it calls)."""
    try:
        import llama_cpp.llama_cpp as low
        from llama_cpp import Llama
    except ImportError:
        return None
    defaults = low.llama_model_default_params

    def no_repack():
        params = defaults()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = no_repack
    try:
        return Llama(model_path=path, n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads,
                     verbose=False, seed=0)
    finally:
        low.llama_model_default_params = defaults


def llama_cpp_generate(llm, prompt: list[int], new_tokens: int, eos: int) -> tuple[float, list[int]]:
    """Greedy (top-1) new_tokens tokens after `prompt`, EOS banned as min_new_tokens bans it.
    Returns (seconds, ids)."""
    import numpy as np

    def ban_eos(_ids, logits):
        logits[eos] = -np.inf
        return logits

    llm.reset()
    out: list[int] = []
    t0 = time.perf_counter()
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True,
                            logits_processor=[ban_eos]):
        out.append(int(tok))
        if len(out) == new_tokens:
            break
    return time.perf_counter() - t0, out


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
    ap.add_argument("--engines", default="packed,fp32", help="treadle weight paths to run: packed, fp32")
    ap.add_argument("--figures", default="batch_1,batch_16,mixed")
    ap.add_argument("--repeats", type=int, default=3, help="batch_1 runs per side (medians reported)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even when installed")
    ap.add_argument("--no-hf-sequential", action="store_true", help="skip HF one prompt at a time on the mixed set")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "engine_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    figures = set(args.figures.split(","))

    from transformers import AutoModelForCausalLM

    from treadle.runtime import Engine
    from treadle.runtime.model_source import embedded_model_path

    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    loads = {"load_avg_start": os.getloadavg()}
    engines = {}
    for name in args.engines.split(","):
        t0 = time.perf_counter()
        engines[name] = Engine(None, dtype="float32", device="cpu", gguf_dequantize=(name == "fp32"))
        loads[f"{name}_load_s"] = round(time.perf_counter() - t0, 2)
    gguf = embedded_model_path()
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                              dtype=torch.float32).eval()
    loads["hf_load_s"] = round(time.perf_counter() - t0, 2)
    llm = None if args.no_llama_cpp else llama_cpp_model(gguf, args.threads)
    any_engine = next(iter(engines.values()))
    eos = any_engine.tokenizer.eos_token_id
    print(json.dumps(loads), flush=True)

    # warm-up: one short generate each
    warm = chat_ids(any_engine, "Hello!")
    for engine in engines.values():
        engine_generate(engine, [warm], [8])
    hf_generate(hf, [warm], 8, eos)
    if llm is not None:
        llama_cpp_generate(llm, warm, 8, eos)

    def compare(name: str, prompts: list[list[int]], outs: list[int], extra: dict | None = None) -> None:
        useful = sum(outs)
        row = {"figure": name, "batch": len(prompts), "prompt_tokens": sum(len(p) for p in prompts),
               "useful_output_tokens": useful, "hf_decoded_tokens": len(prompts) * max(outs)}
        results = {}
        for ename, engine in engines.items():
            t_eng, res = engine_generate(engine, prompts, outs)
            got = sum(r["meta_info"]["completion_tokens"] for r in res)
            assert got == useful, f"{name}: engine {ename} produced {got} tokens, expected {useful}"
            results[ename] = res
            row[f"{ename}_s"] = round(t_eng, 3)
            row[f"{ename}_tok_s"] = round(useful / t_eng, 2)
        t_hf, hf_out = hf_generate(hf, prompts, max(outs), eos)
        row.update(hf_s=round(t_hf, 3), hf_tok_s=round(useful / t_hf, 2))
        for ename, res in results.items():
            # greedy on both: how far do the outputs agree (tokens of the common prefix)?
            agree = sum(agreement(r["output_ids"], h[:n]) for r, h, n in zip(res, hf_out, outs))
            row[f"{ename}_speedup_vs_hf"] = round(t_hf / row[f"{ename}_s"], 2)
            row[f"{ename}_greedy_agreement_hf"] = round(agree / useful, 3)
        emit({**row, **(extra or {})})

    if "batch_1" in figures:
        prompt = chat_ids(any_engine, QUESTIONS[0])
        n = args.new_tokens
        runs: dict[str, list[float]] = {k: [] for k in [*engines, *(["llama_cpp"] if llm is not None else [])]}
        outs: dict[str, list[int]] = {}
        for _ in range(args.repeats):  # interleaved, so a burst of load hits every side alike
            for ename, engine in engines.items():
                t, res = engine_generate(engine, [prompt], [n])
                runs[ename].append(t)
                outs[ename] = res[0]["output_ids"]
            if llm is not None:
                t, outs["llama_cpp"] = llama_cpp_generate(llm, prompt, n, eos)
                runs["llama_cpp"].append(t)
        t_hf, hf_out = hf_generate(hf, [prompt], n, eos)
        row = {"figure": "batch_1", "batch": 1, "prompt_tokens": len(prompt), "useful_output_tokens": n,
               "repeats": args.repeats, "load_avg": os.getloadavg(), "hf_s": round(t_hf, 3),
               "hf_tok_s": round(n / t_hf, 2)}
        for k, ts in runs.items():
            med = statistics.median(ts)
            row[f"{k}_s"] = round(med, 3)
            row[f"{k}_tok_s"] = round(n / med, 2)
            row[f"{k}_runs_tok_s"] = [round(n / t, 2) for t in ts]
            row[f"{k}_greedy_agreement_hf"] = round(agreement(outs[k], hf_out[0]) / n, 3)
        if "llama_cpp" in runs:
            for k in engines:
                row[f"{k}_vs_llama_cpp"] = round(row[f"{k}_tok_s"] / row["llama_cpp_tok_s"], 3)
        emit(row)
    if "batch_16" in figures:
        bs = min(args.batch, len(QUESTIONS))
        compare(f"batch_{bs}", [chat_ids(any_engine, q) for q in QUESTIONS[:bs]], [args.new_tokens] * bs)
    if "mixed" in figures:
        prompts, outs = mixed_prompts(any_engine, args.mixed, args.min_prompt, args.max_prompt, args.min_out,
                                      args.max_out, args.seed)
        extra = {"prompt_len_range": [min(map(len, prompts)), max(map(len, prompts))],
                 "output_len_range": [min(outs), max(outs)], "seed": args.seed}
        if not args.no_hf_sequential:
            t_seq = hf_generate_each(hf, prompts, outs, eos)
            extra.update({"hf_sequential_s": round(t_seq, 3), "hf_sequential_tok_s": round(sum(outs) / t_seq, 2)})
        compare(f"mixed_{args.mixed}", prompts, outs, extra)

    steps = {k: e.get_server_info().get("forward_steps") for k, e in engines.items()}
    for engine in engines.values():
        engine.shutdown()
    result = {"benchmark": "engine_cpu",
              "model": "SmolLM2-135M-Instruct (embedded GGUF: Q4_1 layers, Q8_0 embeddings); treadle packed "
                       "(default) and fp32 (--gguf-dequantize), HF fp32, llama.cpp on the same file",
              "machine": {**machine_info(("torch", "transformers", "llama-cpp-python")),
                          "load_avg_end": os.getloadavg()},
              "command": ("nice " if os.nice(0) > 0 else "") + " ".join(
                  shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT)] + sys.argv),
              "niceness": os.nice(0),
              "notes": "Every side gets the same token ids; greedy; exactly the requested new tokens (EOS banned "
                       "on every side: min_new_tokens, a logits processor for llama.cpp). tok/s = useful output "
                       "tokens / wall time, prefill included. HF pads each batch on the left (pad = eos) and "
                       "decodes the batch's max output length for every row. greedy_agreement_hf = common-prefix "
                       "tokens with HF's greedy output / tokens.",
              "loads": loads, "engine_forward_steps": steps, "results": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
