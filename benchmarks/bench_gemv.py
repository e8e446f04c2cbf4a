"""Batch-1 decode is one pass over the weights: how fast does each matmul stream them?

For each llama3-8b projection shape, 32 distinct weight matrices (one per layer, so nothing
is served from L2) are multiplied in turn by one token, with cuBLAS (`F.linear`) and with
`kernels/gemv.py` under every config of a small sweep; then one whole decode step's worth
of matmuls (32 layers x qkv/o/gate_up/down + lm_head, in model order) is timed with cuBLAS
and with the best config per shape, against the copy-bandwidth roofline of the same bytes.

    python benchmarks/bench_gemv.py [--m 1] [--out results/gemv_cuda.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import copy_bandwidth, machine_info  # noqa: E402

# llama3-8b: hidden 4096, 32 q heads / 8 kv heads of 128, intermediate 14336, vocab 128256
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
LAYERS = 32


def timed(fn, reps: int) -> float:
    """Median seconds of one replay of ``fn`` captured in a CUDA graph (as the model runs
    at decode), CUDA events; no host launch cost inside the timed region."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    del g
    out.sort()
    return out[len(out) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=1)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from treadle.kernels.gemv import gemv, gemv_ref, pick_config

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    records = [{"figure": "meta", **machine_info(), "command": "python " + " ".join(sys.argv), "m": args.m}]

    def emit(rec: dict) -> None:
        records.append(rec)
        print(json.dumps(rec), flush=True)

    bw = copy_bandwidth("cuda", 4096)
    emit({"figure": "copy_bandwidth", "gb_s": round(bw / 1e9, 1)})
    x = torch.randn(args.m, 14336, device=dev, dtype=dt)
    sweep = list(itertools.product((1, 2, 4, 8, 16), (256, 512, 1024), (2, 4, 8), (1,)))
    weights = {}
    best = {}
    records_by_name = {}
    for name, (n, k) in SHAPES.items():
        count = 1 if name == "lm_head" else LAYERS
        ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(count)]
        weights[name] = ws
        xs = x[:, :k]
        nbytes = count * n * k * 2
        # correctness of the default config against the reference, on one matrix
        torch.testing.assert_close(gemv(xs, ws[0]).float(), gemv_ref(xs, ws[0]).float(), atol=2e-2, rtol=2e-2)
        t_cublas = timed(lambda: [F.linear(xs, w) for w in ws], args.reps)
        rows = []
        for cfg in sweep:
            if cfg[1] > k:
                continue
            try:
                t = timed(lambda: [gemv(xs, w, config=cfg) for w in ws], args.reps)
            except Exception as e:  # a config the compiler rejects (e.g. out of registers)
                print(f"# {name} {cfg}: {type(e).__name__}", flush=True)
                continue
            rows.append((t, cfg))
        rows.sort()
        t_default = timed(lambda: [gemv(xs, w) for w in ws], args.reps)
        best[name] = rows[0][1]
        records_by_name[name] = rec = {"figure": "shape", "name": name, "n": n, "k": k, "matrices": count,
              "cublas_us": round(t_cublas / count * 1e6, 2), "cublas_gb_s": round(nbytes / t_cublas / 1e9, 1),
              "gemv_default": list(pick_config(args.m, n, k)), "gemv_default_us": round(t_default / count * 1e6, 2),
              "gemv_default_gb_s": round(nbytes / t_default / 1e9, 1),
              "gemv_best": list(rows[0][1]), "gemv_best_us": round(rows[0][0] / count * 1e6, 2),
              "gemv_best_gb_s": round(nbytes / rows[0][0] / 1e9, 1),
              "top5": [[list(c), round(nbytes / t / 1e9, 1)] for t, c in rows[:5]]}
        emit(rec)

    step = []
    for i in range(LAYERS):
        step += [("qkv", i), ("o", i), ("gate_up", i), ("down", i)]
    step.append(("lm_head", 0))
    total = sum(weights[n][i].numel() * 2 for n, i in step)
    xs = {n: x[:, :k] for n, (_, k) in SHAPES.items()}
    t_cublas = timed(lambda: [F.linear(xs[n], weights[n][i]) for n, i in step], args.reps)
    t_default = timed(lambda: [gemv(xs[n], weights[n][i]) for n, i in step], args.reps)
    t_best = timed(lambda: [gemv(xs[n], weights[n][i], config=best[n]) for n, i in step], args.reps)
    faster = {n for n in SHAPES if records_by_name[n]["gemv_best_us"] < records_by_name[n]["cublas_us"]}
    t_hybrid = timed(lambda: [gemv(xs[n], weights[n][i], config=best[n]) if n in faster
                              else F.linear(xs[n], weights[n][i]) for n, i in step], args.reps)
    emit({"figure": "decode_step_matmuls", "gemv_where_faster": sorted(faster),
          "hybrid_ms": round(t_hybrid * 1e3, 3), "weight_gb": round(total / 1e9, 3),
          "roofline_ms": round(total / bw * 1e3, 3), "cublas_ms": round(t_cublas * 1e3, 3),
          "gemv_default_ms": round(t_default * 1e3, 3), "gemv_best_ms": round(t_best * 1e3, 3),
          "cublas_gb_s": round(total / t_cublas / 1e9, 1), "gemv_best_gb_s": round(total / t_best / 1e9, 1)})
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
