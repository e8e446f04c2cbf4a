"""Two versions of kernels/int4_linear.py side by side, in one run: today's and an earlier
copy of the file, each on its own default configs (``pick_config``), llama3-8b's four
projections at 1 and 4 rows, 8 distinct weights each so nothing is served from L2, each
call replayed from a CUDA graph (bench_quant_linear.py's weights and timer).

    git show a37e096:kernels/int4_linear.py > /tmp/int4_old.py
    python benchmarks/bench_int4_versions.py --old /tmp/int4_old.py [--out results/int4_gemv_versions_h100.json]

Prints, per (rows, projection): microseconds and % of the copy bandwidth of each version,
their configs, and whether today's output matches the dequantize-first reference.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_quant_linear as B  # noqa: E402
from machine import copy_bandwidth, machine_info  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=True, help="an earlier copy of kernels/int4_linear.py")
    p.add_argument("--m", default="1,4")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("int4_old", args.old)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    from treadle.kernels import int4_linear as new

    dev = torch.device("cuda")
    weights = B.make_weights("int4", 8, dev)
    gb_s = copy_bandwidth(dev, 2048) / 1e9
    rows = [dict(machine_info(), figure="meta", command=" ".join(["python3"] + sys.argv), copy_gb_s=round(gb_s, 1))]
    print(json.dumps(rows[0]), flush=True)
    for m in [int(v) for v in args.m.split(",")]:
        for name, (n, k) in B.SHAPES.items():
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            nbytes = sum(t[name]["q"].numel() * 4 + t[name]["s"].numel() * 2 + t[name]["z"].numel() * 4
                         for t in weights) / len(weights)
            row = {"figure": "projection", "m": m, "proj": name}
            for tag, mod in (("old", old), ("new", new)):
                def step(mod=mod) -> None:
                    for layer in weights:
                        t = layer[name]
                        mod.int4_linear(x, t["q"], t["s"], t["z"], 128)

                us = B.timed(step, args.reps) * 1e6 / len(weights)
                row[f"{tag}_us"] = round(us, 2)
                row[f"{tag}_pct_of_copy_bw"] = round(nbytes / (us * 1e-6) / 1e9 / gb_s * 100, 1)
                row[f"{tag}_config"] = mod.pick_config(m, n, k, 128)._asdict()
            row["new_matches_ref"] = B.matches_ref("int4", x, weights[0][name], None)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
