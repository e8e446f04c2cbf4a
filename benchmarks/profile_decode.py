"""Where a decode step's time goes on the GPU: kernel time per step vs wall time per step.

Runs `generate` twice per batch size (a short and a long output, cache flushed), so the
difference is pure decode steps, under torch.profiler; prints the top kernels by total GPU
time per decode step and the GPU-busy fraction of the step's wall time.

    python benchmarks/profile_decode.py --batch-sizes 1,128 [--no-cuda-graph] [--overlap-schedule off] [--tp-size 2]
        [--quantization fp8] [--prefill]

--prefill also prints the top kernels of the prefill (the one-token run: prefill + one step).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="dummy:llama3-8b")
    p.add_argument("--batch-sizes", default="1,128")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=32, help="decode steps profiled per batch size")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--overlap-schedule", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--tp-size", type=int, default=1, help="tensor parallel ranks (rank 0, this process, is profiled)")
    p.add_argument("--top", type=int, default=18)
    p.add_argument("--quantization", default=None, choices=["fp8", "awq", "gptq"], help="serve the model quantized")
    p.add_argument("--prefill", action="store_true", help="also print the prefill's top kernels")
    p.add_argument("--host-profile", action="store_true", help="also cProfile the scheduler's step() (host time)")
    p.add_argument("--gaps", action="store_true",
                   help="also list where the GPU sits idle between kernels, with the host calls made meanwhile")
    args = p.parse_args()
    from treadle.runtime.engine import Engine

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    seq = args.input_len + args.steps + 2
    engine = Engine(model_path=args.model, dtype="bfloat16", device="cuda", max_total_tokens=max(sizes) * seq + 2 * seq,
                    max_running_requests=max(sizes), context_length=seq + 16, cuda_graph=args.cuda_graph,
                    overlap_schedule=args.overlap_schedule, chunked_prefill_size=16384, max_prefill_tokens=65536,
                    tp_size=args.tp_size, quantization=args.quantization or "auto")
    vocab = engine.runner.config.vocab_size
    g = torch.Generator().manual_seed(0)
    for bs in sizes:
        prompts = torch.randint(0, vocab, (bs, args.input_len), generator=g).tolist()

        def run(new: int) -> float:
            while not engine.flush_cache():
                time.sleep(0.01)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": new, "temperature": 0, "ignore_eos": True})
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        run(args.steps + 1)  # warm-up
        t_short = run(1)
        t_long = run(args.steps + 1)
        wall_step = (t_long - t_short) / args.steps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(1)
        short = {e.key: e.device_time_total for e in prof.key_averages()}
        if args.prefill:
            total = sum(short.values())
            print(json.dumps({"bs": bs, "prefill_tokens": bs * args.input_len, "prefill_wall_ms": round(t_short * 1e3, 1),
                              "prefill_gpu_kernel_ms": round(total / 1e3, 1)}), flush=True)
            for k, t in sorted(short.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"   {t / 1e3:9.2f} ms prefill  {100 * t / total:5.1f}%  {k[:110]}")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(args.steps + 1)
        rows = []
        for e in prof.key_averages():
            t = (e.device_time_total - short.get(e.key, 0.0)) / args.steps  # us per decode step
            if t > 0:
                rows.append((t, e.key, e.count))
        rows.sort(reverse=True)
        busy = sum(t for t, _, _ in rows)
        print(json.dumps({"bs": bs, "wall_ms_per_step": round(wall_step * 1e3, 3),
                          "gpu_kernel_ms_per_step": round(busy / 1e3, 3),
                          "gpu_busy_pct": round(100 * busy / 1e3 / (wall_step * 1e3), 1),
                          "cuda_graph": args.cuda_graph, "overlap": args.overlap_schedule, "tp_size": args.tp_size}), flush=True)
        for t, k, n in rows[: args.top]:
            print(f"   {t:9.1f} us/step  {100 * t / busy:5.1f}%  {k[:110]}")
        if args.gaps:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run(args.steps + 1)
            print_gaps(prof, args.top)
        if args.host_profile:
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            orig = engine.scheduler.step

            def step():  # runs on the engine's thread: profile it there
                prof.enable()
                try:
                    return orig()
                finally:
                    prof.disable()

            engine.scheduler.step = step
            run(args.steps + 1)
            engine.scheduler.step = orig
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
            print(buf.getvalue())
    engine.shutdown()


def print_gaps(prof, top: int) -> None:
    """GPU idle time between consecutive kernels, the biggest gaps, and the host calls in them."""
    events = list(prof.profiler.kineto_results.events())
    gpu = sorted((e.start_ns(), e.start_ns() + e.duration_ns(), e.name()) for e in events
                 if e.device_type() == torch.autograd.DeviceType.CUDA and e.duration_ns() > 0)
    host = sorted((e.start_ns(), e.start_ns() + e.duration_ns(), e.name()) for e in events
                  if e.device_type() == torch.autograd.DeviceType.CPU)
    gaps = []
    for (s0, e0, n0), (s1, _, n1) in zip(gpu, gpu[1:]):
        if s1 - e0 > 3000:
            gaps.append((s1 - e0, e0, s1, n0, n1))
    span = (gpu[-1][1] - gpu[0][0]) if gpu else 0
    busy = sum(e - s for s, e, _ in gpu)
    print(json.dumps({"gaps_over_3us": len(gaps), "gap_ms_total": round(sum(g[0] for g in gaps) / 1e6, 3),
                      "gpu_span_ms": round(span / 1e6, 3), "gpu_busy_ms": round(busy / 1e6, 3)}), flush=True)
    by_pair: dict = {}
    for g, _, _, n0, n1 in gaps:
        key = (n0[:50], n1[:50])
        c = by_pair.setdefault(key, [0, 0])
        c[0] += 1
        c[1] += g
    for (n0, n1), (c, g) in sorted(by_pair.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"   {g / 1e3:9.1f} us in {c:4d} gaps  after {n0}  before {n1}")
    for g, s, e, n0, n1 in sorted(gaps, reverse=True)[:5]:
        calls = [n for hs, he, n in host if hs < e and he > s - 20000]
        print(f"   gap {g / 1e3:.1f} us after {n0[:40]} before {n1[:40]}; host: {', '.join(dict.fromkeys(calls))[:600]}")


if __name__ == "__main__":
    sys.exit(main())
