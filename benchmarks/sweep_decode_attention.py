"""Sweep decode-attention launch parameters (splits, key tile, warps, stages) on the GPU and
print the fastest per shape; how the defaults in kernels/decode_attention.py were chosen.

    python benchmarks/sweep_decode_attention.py
"""
import itertools
import torch
import triton
from triton.testing import do_bench
import treadle.kernels.decode_attention as da

hq, hk, d, dev, dt = 32, 8, 128, "cuda", torch.bfloat16
for bs, seq in ((1, 600), (1, 4096), (32, 600), (128, 600), (256, 600)):
    kb = torch.randn(bs * seq + 1, hk, d, device=dev, dtype=dt)
    vb = torch.randn_like(kb)
    r2t = (1 + torch.randperm(bs * seq, device=dev, dtype=torch.int64).to(torch.int32)).view(bs, seq)
    q = torch.randn(bs, hq, d, device=dev, dtype=dt)
    o = torch.empty_like(q)
    lens = torch.full((bs,), seq, device=dev, dtype=torch.int32)
    idx = torch.arange(bs, device=dev)
    ref = torch.empty_like(q)
    da.decode_attention_ref(q, kb, vb, ref, r2t, idx, lens, d ** -0.5)
    kv_gb = 2 * bs * seq * hk * d * 2 / 1e9
    res = []
    for splits, bn, warps, stages in itertools.product([1, 2, 4, 8, 16, 32], [32, 64, 128], [2, 4, 8], [1, 2, 3]):
        if triton.cdiv(seq, splits) < bn // 2:
            continue
        orig = da._decode_blocks
        da._decode_blocks = lambda on_gpu, block_d, bn=bn, w=warps, s=stages: (bn, w, s)
        ws = torch.empty(da.decode_workspace_numel(bs, hq, d, splits), dtype=torch.float32, device=dev)
        try:
            fn = lambda: da.decode_attention(q, kb, vb, o, r2t, idx, lens, d ** -0.5, max_kv_splits=splits, workspace=ws)
            fn()
            err = (o.float() - ref.float()).abs().max().item()
            ms = do_bench(fn, warmup=10, rep=40)
            res.append((ms * 1e3, splits, bn, warps, stages, err))
        except Exception:  # a config this GPU cannot run: skip it
            pass
        finally:
            da._decode_blocks = orig
    res.sort()
    default = da.default_kv_splits(bs, hk, seq, dev)
    print(f"bs={bs} seq={seq} kv={kv_gb:.3f} GB default_splits={default}")
    for us, s, bn, w, st, err in res[:6]:
        print(f"   {us:8.1f} us  {kv_gb / us * 1e6:6.0f} GB/s  splits={s} bn={bn} warps={w} stages={st} err={err:.3g}")
    cur = [r for r in res if r[1] == default and r[2] == 64 and r[3] == 4 and r[4] == 2]
    if cur:
        print(f"   current: {cur[0][0]:.1f} us")
