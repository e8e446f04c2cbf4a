"""The fused MoE kernel alone at one model's layer shapes: microseconds a layer (routing + both
GEMMs, replayed from a CUDA graph as decode runs it) and the bandwidth of the expert bytes the
batch activates, for each batch size and a small sweep of launch configurations.

    python benchmarks/bench_fused_moe.py                       # H200: qwen3-30b-a3b, bf16
    python benchmarks/bench_fused_moe.py --tokens 1,32 --sweep  # also try other configs
    python benchmarks/bench_fused_moe.py --fp8 --tokens 1,32 --sweep  # FP8 experts (a scale per row)

Each timed graph runs --layers distinct layers' experts (several times the L2 cache), so
every layer streams its weights from HBM as in the model. One JSON line a measurement; written
to --output (default benchmarks/results/fused_moe_<model>_cuda.json).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch

from machine import copy_bandwidth, machine_info

HERE = os.path.dirname(os.path.abspath(__file__))


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-30b-a3b", help="a dummy config name")
    p.add_argument("--tokens", default="1,2,4,8,32,128,512,4096")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--sweep", action="store_true", help="also time other launch configurations")
    p.add_argument("--fp8", action="store_true", help="FP8 experts with a scale per row (--quantization fp8's)")
    p.add_argument("--write-config", default=None,
                   help="with --sweep: write the fastest config per token count here, in the form "
                        "TREADLE_FUSED_MOE_CONFIG reads (kernels/fused_moe.py pick_config)")
    p.add_argument("--output", default=None)
    return p.parse_args()


def sweep_configs(decode: bool, fp8: bool = False) -> list[dict]:
    if decode:
        bks = (1024, 2048) if fp8 else (1024,)  # one byte a weight: the same bytes in twice the inputs
        downs, warps = ((2, 4), (4,)) if fp8 else ((2, 4, 8), (2, 4))
        return [dict(decode=True, bn_up=a, bk_up=bu, warps_up=wu, bn_down=c, bk_down=bd, split_down=False, warps=w)
                for a, bu, wu, c, bd, w in itertools.product((2, 4, 8), bks, (2, 4), downs, (128, 256), warps)]
    return [dict(decode=False, block_m=m, block_n=n, block_k=k, warps=w, stages=3)
            for m, n, k, w in itertools.product((16, 32), (64, 128), (128, 256), (4, 8))]


def main() -> None:
    args = _parse()
    from treadle.kernels.fused_moe import fused_moe, moe_route, pick_config
    from treadle.runtime.model_config import DUMMY_CONFIGS

    cfg = DUMMY_CONFIGS[args.model]
    e, k, h, inter = cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size
    dev = torch.device("cuda")
    records = [{"figure": "meta", **machine_info(("torch", "triton")), "device": torch.cuda.get_device_name(dev),
                "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": args.model, "experts": e, "top_k": k,
                "hidden": h, "inter": inter, "layers": args.layers, "fp8": args.fp8}]
    bw = copy_bandwidth(dev, 2048)
    records.append({"figure": "copy_bandwidth", "gb_s": round(bw / 1e9, 1)})
    print(json.dumps(records[-1]), flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = [torch.randn(e, 2 * inter, h, device=dev, dtype=torch.bfloat16, generator=g) * h ** -0.5
           for _ in range(args.layers)]
    w2 = [torch.randn(e, h, inter, device=dev, dtype=torch.bfloat16, generator=g) * inter ** -0.5
          for _ in range(args.layers)]
    s13 = s2 = [None] * args.layers
    if args.fp8:
        from treadle.kernels.fp8_linear import quantize_weight_ref

        def fp8(w):
            q, sc = quantize_weight_ref(w.reshape(-1, w.shape[2]))
            return q.reshape(w.shape), sc.reshape(w.shape[0], w.shape[1], 1)
        w13, s13 = map(list, zip(*[fp8(w) for w in w13]))
        w2, s2 = map(list, zip(*[fp8(w) for w in w2]))
    expert_bytes = w13[0][0].nbytes + w2[0][0].nbytes

    def time_us(t: int, config: dict | None) -> float:
        x = torch.randn(t, h, device=dev, dtype=torch.bfloat16, generator=g)
        logits = torch.randn(t, e, device=dev, generator=g)

        def run():
            for a, b, sa, sb in zip(w13, w2, s13, s2):
                wts, ids = moe_route(logits, k, True)
                fused_moe(x, a, b, wts, ids, config=config, w13_scale=sa, w2_scale=sb)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            start.record()
            for _ in range(10):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / 10 / args.layers)
        del graph
        return sorted(times)[len(times) // 2]

    tuned: dict[int, dict] = {}
    for t in [int(x) for x in args.tokens.split(",")]:
        active = e * (1 - (1 - k / e) ** t)
        read = active * expert_bytes
        base = pick_config(t, k, e, h, inter)
        configs = [None] + (sweep_configs(base["decode"], args.fp8) if args.sweep and t <= 512 else [])
        best = None
        for c in configs:
            try:
                us = time_us(t, c)
            except Exception as ex:  # a configuration the compiler refuses: note it, go on
                records.append({"figure": "error", "tokens": t, "config": c, "error": str(ex)[:200]})
                continue
            rec = {"figure": "layer", "tokens": t, "config": c or {**base, "default": True}, "us": round(us, 2),
                   "active_experts": round(active, 2), "expert_gb_s": round(read / us / 1e3, 1),
                   "pct_of_copy_bw": round(100 * read / us / 1e3 / (bw / 1e9), 1)}
            records.append(rec)
            if c is None:
                print(json.dumps(rec), flush=True)
            if best is None or us < best["us"]:
                best = rec
        if len(configs) > 1:
            records.append({"figure": "best", **best})
            print(json.dumps(records[-1]), flush=True)
            tuned[t] = {k: v for k, v in best["config"].items() if k != "default"}
    if args.write_config and tuned:
        with open(args.write_config, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "model": args.model, "shape": [e, k, h, inter],
                       "command": records[0]["command"], "configs": tuned}, f, indent=1)

    out = args.output or os.path.join(HERE, "results", f"fused_moe_{args.model}{'_fp8' if args.fp8 else ''}_cuda.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
