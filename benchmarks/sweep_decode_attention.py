"""Sweep decode-attention launch parameters (splits, key tile, warps, stages) on the GPU for a
bf16 and an fp8_e5m2 KV pool, and print the fastest per shape next to what the defaults in
kernels/decode_attention.py pick; how those defaults were chosen. Each config is timed as
CUDA-graph replays (as the model runs at decode), llama3-8b heads (Hq 32, Hk 8, D 128) unless
--heads says otherwise (qwen3-30b-a3b: 32,4), at the (batch, keys) cases of --cases.

    python benchmarks/sweep_decode_attention.py [--out results/decode_attention_sweep.json]
    python benchmarks/sweep_decode_attention.py --heads 32,4 --cases 1x576 --pools bfloat16
"""
import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench_cudagraph

import treadle.kernels.decode_attention as da

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402

D, DEV = 128, "cuda"
HQ, HK = 32, 8  # --heads


def case(bs: int, seq: int, pool: torch.dtype):
    g = torch.Generator(device=DEV).manual_seed(bs)
    kb = torch.randn(bs * seq + 1, HK, D, device=DEV, generator=g).to(pool)
    vb = torch.randn(bs * seq + 1, HK, D, device=DEV, generator=g).to(pool)
    r2t = (1 + torch.randperm(bs * seq, device=DEV, generator=g)).to(torch.int32).view(bs, seq)
    q = torch.randn(bs, HQ, D, device=DEV, generator=g).to(torch.bfloat16)
    lens = torch.full((bs,), seq, device=DEV, dtype=torch.int32)
    return q, kb, vb, r2t, torch.arange(bs, device=DEV), lens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    p.add_argument("--heads", default="32,8", help="query heads, kv heads")
    p.add_argument("--cases", default="1x4096,32x576,128x576,256x576", help="batch x keys, comma-separated")
    p.add_argument("--pools", default="bfloat16,float8_e5m2")
    p.add_argument("--splits", default="1,2,4,8,32")
    p.add_argument("--block-n", default="32,64,128")
    p.add_argument("--warps", default="2,4")
    p.add_argument("--stages", default="2,3")
    args = p.parse_args()
    global HQ, HK
    HQ, HK = (int(v) for v in args.heads.split(","))
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    pools = [getattr(torch, name) for name in args.pools.split(",")]
    records = [{"figure": "meta", **machine_info(), "command": "python " + " ".join(sys.argv)}]
    for (bs, seq), pool in itertools.product(cases, pools):
        q, kb, vb, r2t, idx, lens = case(bs, seq, pool)
        o, want = torch.empty_like(q), torch.empty_like(q)
        da.decode_attention_ref(q, kb, vb, want, r2t, idx, lens, D ** -0.5)
        kv_bytes = 2 * bs * seq * HK * D * kb.element_size()

        def run(splits: int) -> float:
            ws = torch.empty(da.decode_workspace_numel(bs, HQ, D, splits), device=DEV)
            fn = lambda: da.decode_attention(q, kb, vb, o, r2t, idx, lens, D ** -0.5, max_kv_splits=splits, workspace=ws)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            torch.testing.assert_close(o.float(), want.float(), atol=2e-2, rtol=2e-2)
            return do_bench_cudagraph(fn, rep=20) * 1e3

        default_splits = da.default_kv_splits(bs, HK, seq, DEV)
        default_us = run(default_splits)
        res = []
        ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
        for splits, bn, warps, stages in itertools.product(ints(args.splits), ints(args.block_n), ints(args.warps),
                                                           ints(args.stages)):
            if triton.cdiv(seq, splits) < bn // 2 or (bs > 1 and splits > 8) or (bs == 1 and splits < 8):
                continue
            orig = da._decode_blocks
            da._decode_blocks = lambda on_gpu, block_d, n, bn=bn, w=warps, s=stages: (bn, w, s)
            try:
                res.append((run(splits), splits, bn, warps, stages))
            except Exception as e:  # a config this GPU cannot run
                print(f"# skip {(splits, bn, warps, stages)}: {type(e).__name__}", flush=True)
            finally:
                da._decode_blocks = orig
        res.sort()
        rec = {"figure": "decode_attention_sweep", "heads": [HQ, HK], "bs": bs, "keys": seq, "pool": str(pool).split(".")[-1],
               "kv_mb": round(kv_bytes / 1e6, 1), "default": {"splits": default_splits, "us": round(default_us, 1),
                                                               "gb_s": round(kv_bytes / default_us / 1e3)},
               "best": [{"splits": s, "block_n": bn, "warps": w, "stages": st, "us": round(us, 1),
                         "gb_s": round(kv_bytes / us / 1e3)} for us, s, bn, w, st in res[:4]]}
        records.append(rec)
        print(json.dumps(rec), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
