"""How should a one-row GEMV's loop hold its weights? The loop variants of kernels/gemv.py, side by side.

A batch-1 decode step's matmuls, in model order and each reading the previous one's output:
32 layers of llama3-8b's qkv -> o -> gate_up (+ SiLU, the FP8 step's fused gate/up kernel, or
the bf16 step's normed one) -> down, distinct weights (nothing served from L2), captured in one
CUDA graph and replayed; and each shape alone, 32 of it chained. Every loop variant runs on the
same weights in the same process:

- plain: chunk i's load, then its products (one chunk in flight a program);
- roll (`TREADLE_GEMV_ROLL=1`): chunk i + 1 issued before chunk i's products;
- fold (`TREADLE_GEMV_FOLD=1`): each thread's 16-byte run of products summed at once, so a
  program holds BLOCK_K / 16 (FP8) or / 8 (bf16) partial sums a row: fewer registers, more
  programs resident an SM;
- roll+fold: both.

Reports microseconds, the share of the measured copy bandwidth, and each variant's largest
difference from the plain loop's output relative to its largest magnitude.

    python benchmarks/bench_gemv_loops.py [--out results/gemv_loops_cuda.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemv import timed  # noqa: E402
from machine import copy_bandwidth, machine_info  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
LAYERS = 32
VARIANTS = {"plain": ("0", "0"), "roll": ("1", "0"), "fold": ("0", "1"), "roll+fold": ("1", "1")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--formats", default="fp8,bf16")
    p.add_argument("--tiles", action="store_true",
                   help="also sweep the rows a program takes (BLOCK_N) on small-N shapes, plain and fold")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from treadle.kernels.gemv import gemv
    from treadle.kernels.rmsnorm import NormedInput

    torch.manual_seed(0)
    dev = "cuda"
    records = [{"figure": "meta", **machine_info(("torch", "triton")), "command": "python " + " ".join(sys.argv)}]

    def emit(rec: dict) -> None:
        records.append(rec)
        print(json.dumps(rec), flush=True)

    bw = copy_bandwidth("cuda", 4096)
    emit({"figure": "copy_bandwidth", "gb_s": round(bw / 1e9, 1)})
    for fmt in args.formats.split(","):
        ws = {}
        for name, (n, k) in SHAPES.items():
            w = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
            if fmt == "fp8":
                w = [(t.to(torch.float8_e4m3fn), torch.rand(n, device=dev) + 0.5) for t in w]
            else:
                w = [(t, None) for t in w]
            ws[name] = w
        x0 = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
        norm_w = torch.rand(4096, device=dev, dtype=torch.bfloat16) + 0.5

        def gate_up(x, wt):
            # as the model's batch-1 step: bf16 normalises x inside the gate/up GEMV, FP8 takes
            # a normed x; both write silu(gate) * up
            if fmt == "bf16":
                return gemv(NormedInput(x, norm_w, 1e-5), wt[0], act="silu")
            return gemv(x, wt[0], w_scale=wt[1], act="silu")

        def step():
            x = x0
            for layer in range(LAYERS):
                x = gemv(x, ws["qkv"][layer][0], w_scale=ws["qkv"][layer][1])[:, :4096]
                x = gemv(x, ws["o"][layer][0], w_scale=ws["o"][layer][1])
                x = gate_up(x, ws["gate_up"][layer])
                x = gemv(x, ws["down"][layer][0], w_scale=ws["down"][layer][1])
            return x

        def alone(name):
            n, k = SHAPES[name]

            def run():
                x = torch.nn.functional.pad(x0, (0, k - 4096)) if k > 4096 else x0
                for layer in range(LAYERS):
                    if name == "gate_up":
                        y = gate_up(x, ws[name][layer])
                    else:
                        y = gemv(x, ws[name][layer][0], w_scale=ws[name][layer][1])
                    x = y[:, :k] if y.shape[1] >= k else torch.nn.functional.pad(y, (0, k - y.shape[1]))
                return x
            return run

        plans = {"step": step, **{name: alone(name) for name in SHAPES}}
        for plan, run in plans.items():
            names = list(SHAPES) if plan == "step" else [plan]
            nbytes = LAYERS * sum(ws[nm][0][0].numel() * ws[nm][0][0].element_size() for nm in names)
            rec = {"figure": "loops", "format": fmt, "plan": plan, "mb": round(nbytes / 1e6, 1)}
            ref = None
            for variant, (roll, fold) in VARIANTS.items():
                os.environ["TREADLE_GEMV_ROLL"], os.environ["TREADLE_GEMV_FOLD"] = roll, fold
                try:
                    out = run().float()
                    if ref is None:
                        ref = out
                    else:
                        rec[f"{variant}_rel_diff"] = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                    s = timed(run, args.reps)
                    rec[f"{variant}_us"] = round(s * 1e6, 1)
                    rec[f"{variant}_pct_of_copy_bw"] = round(100 * nbytes / s / bw, 1)
                except Exception as e:  # report and go on: the other variants still say something
                    rec[f"{variant}_error"] = f"{type(e).__name__}: {e}"[:300]
            os.environ.pop("TREADLE_GEMV_ROLL")
            os.environ.pop("TREADLE_GEMV_FOLD")
            emit(rec)
        del ws
        torch.cuda.empty_cache()
        if args.tiles:
            tiles(fmt, emit, bw, args.reps)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1) + "\n")


# shapes with few outputs, where 4-row programs are few a streaming multiprocessor:
# llama3-8b's o and down (1,024 programs), qwen3-30b-a3b's o (N 2,048: 512) and q/k/v (1,280)
TILE_SHAPES = {"llama_o": (4096, 4096), "llama_down": (4096, 14336), "moe_o": (2048, 4096), "moe_qkv": (5120, 2048)}


def tiles(fmt: str, emit, bw: float, reps: int) -> None:
    """32 of each TILE_SHAPES weight chained, at BLOCK_N 1, 2, 4 and 8 (1,024-wide chunks, 2
    warps), plain and fold: which tile a one-row GEMV of that shape should take."""
    from treadle.kernels.gemv import gemv

    dev = "cuda"
    for name, (n, k) in TILE_SHAPES.items():
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
        ws = [(t.to(torch.float8_e4m3fn), torch.rand(n, device=dev) + 0.5) if fmt == "fp8" else (t, None) for t in ws]
        x0 = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        nbytes = LAYERS * ws[0][0].numel() * ws[0][0].element_size()
        rec = {"figure": "tiles", "format": fmt, "shape": name, "n": n, "k": k, "mb": round(nbytes / 1e6, 1)}
        for block_n in (1, 2, 4, 8):
            for fold in ("0", "1"):
                os.environ["TREADLE_GEMV_FOLD"] = fold

                def run(block_n=block_n):
                    out = x0
                    for w, sc in ws:  # every product reads x0: one chain of launches, no data dependence
                        out = gemv(x0, w, w_scale=sc, config=(block_n, 1024, 2, 1))
                    return out
                key = f"bn{block_n}_{'fold' if fold == '1' else 'plain'}"
                try:
                    s = timed(run, reps)
                    rec[f"{key}_us"] = round(s * 1e6, 1)
                    rec[f"{key}_pct"] = round(100 * nbytes / s / bw, 1)
                except Exception as e:
                    rec[f"{key}_error"] = f"{type(e).__name__}: {e}"[:200]
        os.environ.pop("TREADLE_GEMV_FOLD")
        emit(rec)
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
