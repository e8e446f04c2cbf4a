"""Attention kernels on the paged KV pool (GPU): decode vs the bytes floor, extend TFLOP/s.

    .venv/bin/python benchmarks/bench_attention.py [--quick]

Shapes are Llama-3-8B's (Hq 32, Hk 8, D 128, bf16). Prints one JSON object per figure and
writes them all to benchmarks/results/attention_<device>.json.

- copy bandwidth: device-to-device copy of 2 GiB, measured in this run (the floor's denominator)
- decode: batch 1/32/128/256 x seq 512/2048/8192; Triton eager (wrapper + 2 launches) and
  replayed in a CUDA graph (fixed max_kv_splits + workspace), vs the bytes floor
  (K+V bytes read / copy bandwidth) and vs `decode_attention_ref`
- extend: 512-token prompts (batch 1/8/32, no prefix; and after a 1536-token cached prefix):
  TFLOP/s vs `extend_attention_ref` and vs torch SDPA (causal, contiguous K/V: no gather)
Every request's slots are one contiguous run of the pool (as after a fresh prefill).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

import torch
import torch.nn.functional as F

HQ, HK, D, DTYPE = 32, 8, 128, torch.bfloat16


def _bench(fn, graph: bool = False) -> float:
    """Median milliseconds of fn (triton.testing, cache flushed between runs)."""
    from triton.testing import do_bench, do_bench_cudagraph

    if graph:
        return do_bench_cudagraph(fn, rep=100, return_mode="median")
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def copy_bandwidth() -> float:
    """Bytes/s of a device-to-device copy (read + write counted) of 2 GiB."""
    src = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _bench(lambda: dst.copy_(src))
    del src, dst
    return 2 * (1 << 31) / (ms * 1e-3)


def _pool(batch: int, seq: int):
    kb = torch.randn(batch * seq + 1, HK, D, device="cuda", dtype=DTYPE)
    vb = torch.randn_like(kb)
    r2t = (1 + torch.arange(batch * seq, device="cuda", dtype=torch.int32)).view(batch, seq)
    return kb, vb, r2t


def bench_decode(batch: int, seq: int, bw: float, with_ref: bool) -> dict:
    from treadle.kernels.decode_attention import (
        decode_attention, decode_attention_ref, decode_workspace_numel, default_kv_splits,
    )

    kb, vb, r2t = _pool(batch, seq)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=DTYPE)
    o = torch.empty_like(q)
    idx = torch.arange(batch, device="cuda", dtype=torch.int32)
    lens = torch.full((batch,), seq, device="cuda", dtype=torch.int32)
    splits = default_kv_splits(batch, HK, seq, "cuda")
    ws = torch.empty(decode_workspace_numel(batch, HQ, D, splits), device="cuda")
    scale = D**-0.5

    def run() -> None:
        decode_attention(q, kb, vb, o, r2t, idx, lens, scale, max_kv_splits=splits, workspace=ws)

    eager_ms = _bench(lambda: decode_attention(q, kb, vb, o, r2t, idx, lens, scale))  # default path: syncs on seq_lens
    graph_ms = _bench(run, graph=True)
    ref_ms = None
    if with_ref:
        try:
            ref_ms = _bench(lambda: decode_attention_ref(q, kb, vb, o, r2t, idx, lens, scale))
        except torch.OutOfMemoryError:
            ref_ms = None
    kv_bytes = 2 * batch * seq * HK * D * kb.element_size()
    floor_ms = kv_bytes / bw * 1e3
    del kb, vb
    torch.cuda.empty_cache()
    return {
        "figure": "decode_attention", "batch": batch, "seq": seq, "kv_splits": splits,
        "triton_eager_us": round(eager_ms * 1e3, 2), "triton_graph_us": round(graph_ms * 1e3, 2),
        "ref_us": None if ref_ms is None else round(ref_ms * 1e3, 2),
        "kv_mb": round(kv_bytes / 1e6, 1),
        # graph replays do not flush L2: K/V that fit in it can beat the DRAM floor
        "kv_fits_l2": kv_bytes < torch.cuda.get_device_properties(0).L2_cache_size,
        "floor_us": round(floor_ms * 1e3, 2), "graph_vs_floor": round(graph_ms / floor_ms, 2),
        "kv_gbps_graph": round(kv_bytes / (graph_ms * 1e-3) / 1e9, 1),
        "speedup_vs_ref": None if ref_ms is None else round(ref_ms / graph_ms, 1),
    }


def bench_extend(batch: int, ext: int, prefix: int) -> dict:
    from treadle.kernels.extend_attention import extend_attention, extend_attention_ref

    seq = prefix + ext
    kb, vb, r2t = _pool(batch, seq)
    q = torch.randn(batch * ext, HQ, D, device="cuda", dtype=DTYPE)
    o = torch.empty_like(q)
    idx = torch.arange(batch, device="cuda", dtype=torch.int32)
    pre = torch.full((batch,), prefix, device="cuda", dtype=torch.int32)
    lens = torch.full((batch,), ext, device="cuda", dtype=torch.int32)
    starts = torch.arange(batch, device="cuda", dtype=torch.int32) * ext
    args = (q, kb, vb, o, r2t, idx, pre, lens, starts, D**-0.5)
    tri_ms = _bench(lambda: extend_attention(*args, max_extend_len=ext))
    ref_ms = _bench(lambda: extend_attention_ref(*args))
    # SDPA on contiguous K/V: the same FLOPs with no gather (bottom-right aligned causal mask)
    qs = q.view(batch, ext, HQ, D).transpose(1, 2)
    ks = kb[1:].view(batch, seq, HK, D).transpose(1, 2)
    vs = vb[1:].view(batch, seq, HK, D).transpose(1, 2)
    if prefix == 0:
        sdpa = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)  # noqa: E731
    else:
        mask = torch.ones(ext, seq, dtype=torch.bool, device="cuda").tril(prefix)
        sdpa = lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)  # noqa: E731
    sdpa_ms = _bench(sdpa)
    pairs = batch * (ext * prefix + ext * (ext + 1) / 2)  # visible (query, key) pairs
    flops = 4 * pairs * HQ * D  # QK^T and PV, 2 FLOPs per multiply-add
    tf = lambda ms: round(flops / (ms * 1e-3) / 1e12, 1)  # noqa: E731
    del kb, vb
    torch.cuda.empty_cache()
    return {
        "figure": "extend_attention", "batch": batch, "extend": ext, "prefix": prefix,
        "triton_us": round(tri_ms * 1e3, 1), "triton_tflops": tf(tri_ms),
        "ref_us": round(ref_ms * 1e3, 1), "ref_tflops": tf(ref_ms),
        "sdpa_contiguous_us": round(sdpa_ms * 1e3, 1), "sdpa_tflops": tf(sdpa_ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset of the sweep")
    parser.add_argument("--out", default=None, help="result file (default benchmarks/results/attention_<device>.json)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention needs a CUDA GPU")
    import triton

    name = torch.cuda.get_device_name()
    meta = {
        "figure": "meta", "device": name, "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "command": " ".join(sys.argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "shape": f"Hq {HQ}, Hk {HK}, D {D}, bf16",
    }
    records = [meta]
    print(json.dumps(meta), flush=True)

    bw = copy_bandwidth()
    records.append({"figure": "copy_bandwidth", "gbps": round(bw / 1e9, 1)})
    print(json.dumps(records[-1]), flush=True)

    batches, seqs = ([1, 32], [512, 2048]) if args.quick else ([1, 32, 128, 256], [512, 2048, 8192])
    for batch in batches:
        for seq in seqs:
            rec = bench_decode(batch, seq, bw, with_ref=batch * seq <= 256 * 2048)
            records.append(rec)
            print(json.dumps(rec), flush=True)

    shapes = [(1, 512, 0), (8, 512, 0)] if args.quick else [(1, 512, 0), (8, 512, 0), (32, 512, 0), (8, 512, 1536)]
    for batch, ext, prefix in shapes:
        rec = bench_extend(batch, ext, prefix)
        records.append(rec)
        print(json.dumps(rec), flush=True)

    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"attention_{slug}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(records, f, indent=1)
    print(json.dumps({"figure": "written", "path": out}), flush=True)


if __name__ == "__main__":
    main()
