"""What programmatic dependent launch (kernels/pdl.py) buys a chain of decode GEMVs.

A batch-1 decode step's matmuls, in model order and each reading the previous one's output:
32 layers of llama3-8b's qkv -> o -> gate_up -> down (distinct weights, so nothing is served
from L2), bf16 and FP8 (one byte a weight, a scale per row), captured in one CUDA graph and
replayed, with the kernels launched with PDL and without. Also each shape alone (32 of it
chained). Reports time, GB/s and the share of the measured copy bandwidth, and checks that
both launches give the same bits.

    python benchmarks/bench_pdl.py [--out results/pdl_cuda.json]
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from treadle.kernels import pdl
    from treadle.kernels.gemv import gemv

    torch.manual_seed(0)
    dev = "cuda"
    records = [{"figure": "meta", **machine_info(("torch", "triton")), "command": "python " + " ".join(sys.argv),
                "have_gdc": pdl.HAVE_GDC}]

    def emit(rec: dict) -> None:
        records.append(rec)
        print(json.dumps(rec), flush=True)

    bw = copy_bandwidth("cuda", 4096)
    emit({"figure": "copy_bandwidth", "gb_s": round(bw / 1e9, 1)})
    for fmt in ("bf16", "fp8"):
        ws = {}
        for name, (n, k) in SHAPES.items():
            w = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
            if fmt == "fp8":
                w = [(t.to(torch.float8_e4m3fn), torch.rand(n, device=dev) + 0.5) for t in w]
            else:
                w = [(t, None) for t in w]
            ws[name] = w
        x0 = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)

        def lin(x, wt):
            return gemv(x, wt[0], w_scale=wt[1])

        def chain(names):
            def run():
                x = x0
                for layer in range(LAYERS):
                    for name in names:
                        y = lin(x, ws[name][layer])
                        x = y[:, : 4096] if name in ("qkv", "o", "down") else y[:, : 14336]
                return x
            return run

        plans = {"step": ["qkv", "o", "gate_up", "down"], **{name: None for name in SHAPES}}
        for plan, names in plans.items():
            if names is None:  # one shape chained with itself: its output (first K columns) feeds the next
                n, k = SHAPES[plan]

                def run(plan=plan, k=k):
                    x = torch.nn.functional.pad(x0, (0, k - 4096)) if k > 4096 else x0
                    for layer in range(LAYERS):
                        y = lin(x, ws[plan][layer])
                        x = y[:, :k] if y.shape[1] >= k else torch.nn.functional.pad(y, (0, k - y.shape[1]))
                    return x
                nbytes = LAYERS * ws[plan][0][0].numel() * ws[plan][0][0].element_size()
            else:
                run = chain(names)
                nbytes = LAYERS * sum(ws[nm][0][0].numel() * ws[nm][0][0].element_size() for nm in names)
            rec = {"figure": "chain", "format": fmt, "plan": plan, "mb": round(nbytes / 1e6, 1)}
            outs = {}
            for mode in ("off", "on"):
                os.environ["TREADLE_PDL"] = "0" if mode == "off" else "1"
                try:
                    outs[mode] = run().clone()
                    s = timed(run, args.reps)
                    rec[f"{mode}_us"] = round(s * 1e6, 1)
                    rec[f"{mode}_pct_of_copy_bw"] = round(100 * nbytes / s / bw, 1)
                except Exception as e:  # report, keep going: the point is to learn whether PDL works here
                    rec[f"{mode}_error"] = f"{type(e).__name__}: {e}"[:300]
            if len(outs) == 2:
                rec["same_bits"] = bool(torch.equal(outs["off"], outs["on"]))
            emit(rec)
        del ws
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
