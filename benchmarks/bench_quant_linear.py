"""How fast do the quantized linears stream their weights? FP8 (kernels/fp8_linear.py) and
4-bit (kernels/int4_linear.py, Triton: format int4; kernels/int4_mma.py, CUDA on the tensor
cores: format int4mma; int4read: the int4mma launch loading its weights and doing nothing
else, its bound) against bf16 (ops.linear: cuBLAS, or the Triton GEMV at one
row), one llama3-8b layer's four projections, `--layers` distinct weights of each so nothing
is served from L2, at several row counts, each call replayed from a CUDA graph.

For each (format, M): microseconds for the four projections of one layer, the GB/s of the
weight bytes that format reads (packed weights, scales and zeros) and the % of the copy
bandwidth measured in the same run; the speed-up over bf16 at the same M. At M = 1 the
roofline is bytes / copy bandwidth: FP8 reads half of bf16's bytes, 4-bit about a quarter.

    python benchmarks/bench_quant_linear.py [--m 1,4,16,128,8192] [--out results/quant_linear_cuda.json]

--sweep times every launch config the kernels offer for each projection on its own
(``candidate_configs`` of kernels/fp8_linear.py and kernels/int4_linear.py), the choice behind
their ``pick_config`` defaults; --precompile N compiles the configs in N processes first (the
GPU timing stays in one process, reading Triton's cache).

    python benchmarks/bench_quant_linear.py --sweep --formats fp8,int4 --m 1,128 --precompile 12
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import copy_bandwidth, machine_info  # noqa: E402

# llama3-8b: hidden 4096, 32 q heads / 8 kv heads of 128, intermediate 14336
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def timed(fn, reps: int) -> float:
    """Median seconds of one CUDA-graph replay of ``fn`` (CUDA events)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    out.sort()
    return out[len(out) // 2]


def make_weights(fmt: str, layers: int, dev: torch.device) -> list[dict]:
    """`layers` copies of the four projections in `fmt`, each a dict with the call's tensors."""
    from treadle.kernels.fp8_linear import quantize_weight_ref
    from treadle.kernels.int4_linear import pack_cols, pack_rows

    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for _ in range(layers):
        layer = {}
        for name, (n, k) in SHAPES.items():
            w = torch.randn(n, k, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
            if fmt == "bf16":
                layer[name] = {"w": w}
            elif fmt == "fp8":
                wq, s = quantize_weight_ref(w)
                layer[name] = {"w": wq, "s": s}
            else:
                from treadle.kernels.int4_mma import pack_mma
                q = torch.randint(0, 16, (k, n), device=dev, generator=g, dtype=torch.int32)
                z = torch.randint(0, 16, (k // 128, n), device=dev, generator=g, dtype=torch.int32)
                layer[name] = {"q": pack_mma(q) if fmt in ("int4mma", "int4read") else pack_rows(q), "z": pack_cols(z),
                               "s": (torch.rand(k // 128, n, device=dev, generator=g) * 0.01).half()}
            del w
        out.append(layer)
    return out


def call(fmt: str, x: torch.Tensor, t: dict, config=None) -> torch.Tensor:
    """One projection in `fmt` (a config only for the quantized formats)."""
    from treadle.kernels.fp8_linear import fp8_linear
    from treadle.kernels.int4_linear import int4_linear
    from treadle.runtime.models import ops

    if fmt == "bf16":
        return ops.linear(x, t["w"])
    if fmt == "fp8":
        return fp8_linear(x, t["w"], t["s"], config=config)
    if fmt == "int4mma":
        from treadle.kernels.int4_mma import int4_mma_linear
        return int4_mma_linear(x, t["q"], t["s"], t["z"], 128, config=config)
    if fmt == "int4read":  # the bound of int4mma: its loads alone
        from treadle.kernels.int4_mma import int4_mma_read_bound, pick_mma_config
        n, k = t["q"].shape[0] * 16, t["q"].shape[1] * 64
        t.setdefault("sink", torch.zeros(1, dtype=torch.int32, device=x.device))
        return int4_mma_read_bound(t["q"], config or pick_mma_config(x.shape[0], n, k), t["sink"])
    return int4_linear(x, t["q"], t["s"], t["z"], 128, config=config)


def run(fmt: str, weights: list[dict], x: dict, m: int, names=None, config=None):
    def step() -> None:
        for layer in weights:
            for name, t in layer.items():
                if names is None or name in names:
                    call(fmt, x[name][:m], t, config)

    return step


def matches_ref(fmt: str, x: torch.Tensor, t: dict, config) -> bool:
    """The config's output against its format's torch reference (the GPU suite's tolerances), so
    a launch the sweep picks is known to be right on this GPU too."""
    from treadle.kernels.fp8_linear import fp8_linear_ref
    from treadle.kernels.int4_linear import int4_linear_ref

    x = x[:min(x.shape[0], 256)]  # the reference dequantizes in fp32: keep it small
    y = call(fmt, x, t, config).float()
    if fmt == "fp8":
        ref = fp8_linear_ref(x, t["w"], t["s"], out_dtype=torch.float32, config=config)
        return bool(torch.allclose(y, ref, atol=2e-2, rtol=2e-2))
    q = t["q"]
    if fmt == "int4mma":
        from treadle.kernels.int4_mma import mma_to_rows
        q = mma_to_rows(q)
    ref = int4_linear_ref(x, q, t["s"], t["z"], 128, out_dtype=torch.float32)
    return bool(torch.allclose(y, ref, atol=0.5, rtol=2e-2))


def candidates(fmt: str, m: int, n: int, k: int) -> list:
    if fmt == "fp8":
        from treadle.kernels.fp8_linear import candidate_configs
        return candidate_configs(m, n, k)
    if fmt == "int4mma":
        from treadle.kernels.int4_mma import candidate_mma_configs
        return candidate_mma_configs(m, n, k)
    from treadle.kernels.int4_linear import candidate_configs
    return candidate_configs(m, n, k, 128)


def _sweep_tasks(formats: list[str], ms: list[int]) -> list[tuple]:
    return [(fmt, m, name, cfg) for fmt in formats for m in ms for name, (n, k) in SHAPES.items()
            for cfg in candidates(fmt, m, n, k)]


def _compile_some(tasks: list[tuple]) -> list[str]:
    """Run each (format, m, projection, config) once on small random data: Triton compiles and
    caches it. Returns the failures, named."""
    dev = torch.device("cuda")
    weights = make_weights_for(sorted({t[0] for t in tasks}), dev)
    failed = []
    for fmt, m, name, cfg in tasks:
        k = SHAPES[name][1]
        try:
            call(fmt, torch.randn(m, k, device=dev, dtype=torch.bfloat16), weights[fmt][name], cfg)
            torch.cuda.synchronize()
        except Exception as e:  # a config the compiler or the GPU refuses: reported, not fatal
            failed.append(f"{fmt} m={m} {name} {cfg}: {type(e).__name__}: {str(e)[:200]}")
    return failed


def make_weights_for(formats: list[str], dev: torch.device) -> dict:
    return {fmt: make_weights(fmt, 1, dev)[0] for fmt in formats}


def sweep(args, ms: list[int], bw: float, recs: list) -> None:
    """Every candidate config of each projection, timed from CUDA graphs over `--layers`
    distinct weights; the best per (format, m, projection) last."""
    formats = [f for f in args.formats.split(",") if f != "bf16"]
    tasks = _sweep_tasks(formats, ms)
    if args.precompile > 1:
        import multiprocessing as mp
        chunks = [tasks[i::args.precompile] for i in range(args.precompile)]
        with mp.get_context("spawn").Pool(args.precompile) as pool:
            for failed in pool.map(_compile_some, chunks):
                for line in failed:
                    print("compile failed:", line, flush=True)
    dev = torch.device("cuda")
    x = {name: torch.randn(max(ms), k, device=dev, dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}
    for fmt in formats:
        weights = make_weights(fmt, args.layers, dev)
        for m in ms:
            for name, (n, k) in SHAPES.items():
                b = sum(t.nbytes for t in weights[0][name].values())
                best = None
                for cfg in candidates(fmt, m, n, k):
                    try:
                        t = timed(run(fmt, weights, x, m, {name}, cfg), args.reps) / args.layers
                    except Exception as e:
                        print(json.dumps({"figure": "failed", "format": fmt, "m": m, "proj": name, "config": repr(cfg),
                                          "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
                        continue
                    rec = {"figure": "config", "format": fmt, "m": m, "proj": name, "config": cfg._asdict(),
                           "us": round(t * 1e6, 2), "gb_s": round(b / t / 1e9, 1),
                           "pct_of_copy_bw": round(100 * b / t / bw, 1),
                           "matches_ref": matches_ref(fmt, x[name][:m], weights[0][name], cfg)}
                    recs.append(rec)
                    print(json.dumps(rec), flush=True)
                    if rec["matches_ref"] and (best is None or rec["us"] < best["us"]):
                        best = rec
                if best is not None:
                    recs.append({**best, "figure": "best"})
                    print(json.dumps(recs[-1]), flush=True)
                    if fmt == "int4mma":  # the same launch reading the same weights and nothing else
                        from treadle.kernels.int4_mma import MmaConfig
                        for order in (0, 1):  # and with the block's warps reading in the other order
                            cfg = MmaConfig(**best["config"])._replace(order=order)
                            t = timed(run("int4read", weights, x, m, {name}, cfg), args.reps) / args.layers
                            qb = weights[0][name]["q"].nbytes
                            recs.append({"figure": "read_bound", "format": fmt, "m": m, "proj": name,
                                         "config": cfg._asdict(), "us": round(t * 1e6, 2),
                                         "qweight_gb_s": round(qb / t / 1e9, 1), "pct_of_copy_bw": round(100 * qb / t / bw, 1),
                                         "gemv_share_of_bound": round(t * 1e6 / best["us"], 3)})
                            print(json.dumps(recs[-1]), flush=True)
        del weights
        torch.cuda.empty_cache()


def nbytes(layer: dict) -> int:
    return sum(t.nbytes for proj in layer.values() for t in proj.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", default="1,4,16,128,8192")
    p.add_argument("--layers", type=int, default=8, help="distinct weights per projection (> L2)")
    p.add_argument("--formats", default="bf16,fp8,int4")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=None)
    p.add_argument("--sweep", action="store_true", help="time every candidate launch config per projection")
    p.add_argument("--precompile", type=int, default=1, help="with --sweep: compile in this many processes first")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs CUDA (the kernels' CPU checks are tests/test_quantization_kernels.py)")
    dev = torch.device("cuda")
    ms = [int(v) for v in args.m.split(",")]
    bw = copy_bandwidth(dev, 2048)
    recs = [{"figure": "meta", **machine_info(("torch", "triton")), "device": torch.cuda.get_device_name(dev),
             "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "copy_gb_s": round(bw / 1e9, 1)}]
    print(json.dumps(recs[0]), flush=True)
    if args.sweep:
        sweep(args, ms, bw, recs)
        out = args.out or str(Path(__file__).resolve().parent / "results" / "quant_linear_sweep_cuda.json")
        with open(out, "w") as f:
            json.dump(recs, f, indent=1)
        print(f"wrote {out}")
        return
    x = {name: torch.randn(max(ms), k, device=dev, dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}
    base: dict[int, float] = {}
    for fmt in args.formats.split(","):
        weights = make_weights(fmt, args.layers, dev)
        b = nbytes(weights[0])
        for m in ms:
            t = timed(run(fmt, weights, x, m), args.reps) / args.layers  # one layer's four projections
            if fmt == "bf16":
                base[m] = t
            rec = {"figure": "layer", "format": fmt, "m": m, "us": round(t * 1e6, 1), "weight_mb": round(b / 1e6, 1),
                   "gb_s": round(b / t / 1e9, 1), "pct_of_copy_bw": round(100 * b / t / bw, 1),
                   "speedup_over_bf16": round(base[m] / t, 2) if m in base else None}
            recs.append(rec)
            print(json.dumps(rec), flush=True)
        del weights
        torch.cuda.empty_cache()
    out = args.out or str(Path(__file__).resolve().parent / "results" / "quant_linear_cuda.json")
    with open(out, "w") as f:
        json.dump(recs, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
