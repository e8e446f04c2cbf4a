"""CPU prefill with the embedded SmolLM2-135M: where a long prompt's time goes, in one run.

1. Attention of one layer (9 query heads, 3 KV heads, head dim 64, fp32) as the CPU runtime
   computes it, side by side: SDPA on 3-D tensors (the runtime's call before this bench;
   PyTorch runs those in its math path, which materializes every score) and on 4-D tensors
   (its fused flash kernel), without and with a cached prefix; with a prefix, also the
   runtime's call now for a chunk of >= 256 tokens (`split_ms`: the prefix keys unmasked plus
   the chunk's own keys causal, merged by log-sum-exp; no mask tensor).
2. The Engine's prefill tok/s (one new token, radix cache flushed) at 256 / 1,024 / 1,800
   prompt tokens, and for 512 new tokens after a cached 1,300-token prefix and for a 4,096-token
   prompt in chunks of 1,024, these two A/B interleaved: the split path on and off.

    nice .venv/bin/python benchmarks/bench_cpu_prefill.py --output benchmarks/results/cpu_prefill.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from machine import machine_info  # benchmarks/machine.py

HQ, HK, D = 9, 3, 64


def _ms(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(ts), 2)


def attention_rows(reps: int) -> list[dict]:
    rows = []
    g = torch.Generator().manual_seed(0)
    from treadle.kernels.extend_attention import _prefix_then_causal

    for prefix, ext in ((0, 256), (0, 1024), (0, 1800), (1300, 512), (2048, 2048)):
        seq = prefix + ext
        q = torch.randn(HQ, ext, D, generator=g)
        k = torch.randn(HK, seq, D, generator=g)
        v = torch.randn(HK, seq, D, generator=g)
        mask = None if prefix == 0 else torch.arange(seq)[None, :] <= torch.arange(prefix, seq)[:, None]
        kw = dict(is_causal=prefix == 0, scale=D ** -0.5)
        # 3-D, as before: a causal call with GQA, or query heads grouped by KV head with a mask
        if prefix == 0:
            def three_d():
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        else:
            qg = q.reshape(HK, (HQ // HK) * ext, D)
            mg = mask.repeat(HQ // HK, 1)

            def three_d():
                return F.scaled_dot_product_attention(qg, k, v, attn_mask=mg, scale=D ** -0.5)

        def four_d():
            return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True, **kw)

        same = torch.allclose(three_d().reshape(HQ, ext, D), four_d()[0], atol=1e-5)
        a, b = _ms(three_d, reps), _ms(four_d, reps)
        rows.append({"figure": "attention_one_layer", "prefix": prefix, "new_tokens": ext, "sdpa_3d_ms": a,
                     "sdpa_4d_ms": b, "speedup": round(a / b, 2), "same_output": same})
        if prefix:
            def split():
                return _prefix_then_causal(q[None], k, v, prefix, D ** -0.5)

            rows[-1]["split_ms"] = _ms(split, reps)
            rows[-1]["split_max_err"] = float((split() - four_d()).abs().max())
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _split_on(on: bool) -> None:
    """The Engine runs in this process: turn the split extend path on or off (off: the masked
    SDPA call it replaced)."""
    from treadle.kernels import extend_attention as ea

    ea._SPLIT_MIN_EXT = 256 if on else 1 << 30


def engine_rows(reps: int) -> list[dict]:
    from treadle.runtime import Engine

    rows = []
    words = "the quick brown fox jumps over the lazy dog "
    with Engine(max_total_tokens=16384) as e:
        tok = e.tokenizer
        base = tok.encode(words * 500)
        e.generate(input_ids=base[:64], sampling_params={"max_new_tokens": 1})
        for n in (256, 1024, 1800):
            ids = base[:n]
            ts = []
            for _ in range(reps):
                e.flush_cache()
                t0 = time.perf_counter()
                e.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
                ts.append(time.perf_counter() - t0)
            s = statistics.median(ts)
            rows.append({"figure": "engine_prefill", "prompt_tokens": n, "cached_tokens": 0,
                         "seconds": round(s, 3), "prefill_tok_s": round(n / s, 1)})
            print(json.dumps(rows[-1]), flush=True)
        prefix, ext = base[:1300], base[1300:1812]
        ts = {True: [], False: []}
        for _ in range(reps):
            for on in (True, False):  # interleaved: the box is shared
                _split_on(on)
                e.flush_cache()
                e.generate(input_ids=prefix, sampling_params={"max_new_tokens": 1})
                t0 = time.perf_counter()
                out = e.generate(input_ids=prefix + ext, sampling_params={"max_new_tokens": 1})
                ts[on].append(time.perf_counter() - t0)
        _split_on(True)
        cached = out["meta_info"]["cached_tokens"]
        for on in (True, False):
            s = statistics.median(ts[on])
            rows.append({"figure": "engine_prefill", "prompt_tokens": len(prefix) + len(ext),
                         "cached_tokens": cached, "split": on, "seconds": round(s, 3),
                         "prefill_tok_s": round((len(prefix) + len(ext) - cached) / s, 1)})
            print(json.dumps(rows[-1]), flush=True)
    with Engine(max_total_tokens=16384, chunked_prefill_size=1024) as e:
        ids = base[:4096]
        e.generate(input_ids=ids[:64], sampling_params={"max_new_tokens": 1})
        ts = {True: [], False: []}
        for _ in range(reps):
            for on in (True, False):
                _split_on(on)
                e.flush_cache()
                t0 = time.perf_counter()
                e.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
                ts[on].append(time.perf_counter() - t0)
        _split_on(True)
        for on in (True, False):
            s = statistics.median(ts[on])
            rows.append({"figure": "engine_prefill", "prompt_tokens": len(ids), "cached_tokens": 0,
                         "chunked_prefill_size": 1024, "split": on, "seconds": round(s, 3),
                         "prefill_tok_s": round(len(ids) / s, 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    meta = {"figure": "meta", "command": "python " + " ".join(sys.argv), **machine_info()}
    rows = [meta] + attention_rows(args.reps) + engine_rows(args.reps)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
