"""Fused grammar-aware sampling vs stock torch, with the one-read-of-the-logits floor.

For each batch size: (a) stock torch = bitmask unpack + masked_fill, softmax, sort, cumsum
top-p, multinomial; (b) ``fused_sample`` with the same temperature / top-p / bitmask;
(c) the floor = bytes of the logits / device-to-device copy bandwidth measured in this run.
Prints one JSON line per figure and writes ``benchmarks/results/sampling_<device>.json``.

    python benchmarks/bench_sampling.py --batch-sizes 1,64,256 --vocab 128256
    python benchmarks/bench_sampling.py --device cpu --batch-sizes 2 --vocab 1000   # smoke
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="1,64,256")
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--mask-density", type=float, default=0.5, help="fraction of allowed tokens")
    p.add_argument("--input-sets", type=int, default=4, help="distinct inputs rotated between calls")
    p.add_argument("--out", default=None)
    return p.parse_args()


def stock_torch(logits: torch.Tensor, bitmask: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The unfused baseline: unpack+mask, softmax, full sort, cumsum top-p, multinomial."""
    V = logits.shape[1]
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(logits.shape[0], -1)[:, :V].bool()
    x = logits.float().masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(x / temperature, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    excl = sorted_p.cumsum(-1) - sorted_p
    sorted_p = sorted_p.masked_fill(excl > top_p, 0.0)
    pick = torch.multinomial(sorted_p, 1)
    return order.gather(1, pick).squeeze(1)


def _time(fn, device: str, reps: int = 50) -> float:
    """Median microseconds per call."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=reps * 2, return_mode="median")) * 1e3
    fn()
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main() -> int:
    args = _parse()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from treadle.kernels.sampling import _fused_sample_launch, fused_sample, make_sampling_batch

    dev, V = args.device, args.vocab
    dtype = getattr(torch, args.dtype)
    env = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "python": platform.python_version(),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    results: list[dict] = []

    def emit(rec: dict) -> None:
        rec = {**rec, **({"env": env} if not results else {})}
        print(json.dumps(rec), flush=True)
        results.append(rec)

    # Device copy bandwidth, measured in this run (read + write of a large buffer).
    n_bytes = (1 << 30) if dev == "cuda" else (1 << 24)
    src = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_us = _time(lambda: dst.copy_(src), dev)
    bw = 2 * n_bytes / (copy_us * 1e-6)  # bytes/s
    emit({"figure": "device_copy_bandwidth", "GB_per_s": round(bw / 1e9, 1), "bytes": n_bytes})
    del src, dst

    for B in [int(b) for b in args.batch_sizes.split(",")]:
        gen = torch.Generator(device=dev).manual_seed(B)
        inputs = []
        for i in range(args.input_sets):
            logits = (torch.randn(B, V, generator=gen, device=dev) * 3).to(dtype)
            bits = (torch.rand(B, (V + 31) // 32 * 32, generator=gen, device=dev) < args.mask_density).long()
            bits[:, 0] = 1
            words = (bits.view(B, -1, 32) << torch.arange(32, device=dev)).sum(-1)
            bitmask = torch.where(words < 2**31, words, words - 2**32).int()
            batch = make_sampling_batch(B, dev, temperatures=args.temperature, top_ps=args.top_p,
                                        top_ks=args.top_k, seeds=list(range(B)), steps=i, bitmask=bitmask)
            inputs.append((logits, bitmask, batch))
        it = {"a": 0, "b": 0}

        def run_stock() -> None:
            logits, bitmask, _ = inputs[it["a"] % len(inputs)]
            it["a"] += 1
            stock_torch(logits, bitmask, args.temperature, args.top_p)

        def run_fused() -> None:
            logits, _, batch = inputs[it["b"] % len(inputs)]
            it["b"] += 1
            fused_sample(logits, batch)

        # Self-check before timing: every token allowed by the mask.
        logits, bitmask, batch = inputs[0]
        tok, _, rounds, search = _fused_sample_launch(logits, batch)
        shifts = torch.arange(32, device=dev, dtype=torch.int32)
        allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(B, -1)[:, :V].bool()
        assert allowed.gather(1, tok[:, None]).all(), "fused_sample drew a masked token"
        stock_us = _time(run_stock, dev)
        fused_us = _time(run_fused, dev)
        floor_us = B * V * logits.element_size() / bw * 1e6
        emit({
            "figure": "sampling", "batch": B, "vocab": V, "dtype": args.dtype, "temperature": args.temperature,
            "top_p": args.top_p, "top_k": args.top_k, "mask_density": args.mask_density,
            "stock_torch_us": round(stock_us, 1), "fused_us": round(fused_us, 1), "floor_us": round(floor_us, 2),
            "speedup_vs_torch": round(stock_us / fused_us, 2), "fused_over_floor": round(fused_us / floor_us, 2),
            # passes over each row: pass 1, top-k search passes, rejection rounds (the kernel's
            # time follows the slowest row of each SM)
            "rounds_mean": round(rounds.float().mean().item(), 3), "rounds_max": int(rounds.max()),
            "passes_mean": round((1 + rounds + search).float().mean().item(), 3),
            "passes_max": int((1 + rounds + search).max()),
            "timing_meaningful": dev == "cuda",
        })

    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / f"sampling_{dev}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
