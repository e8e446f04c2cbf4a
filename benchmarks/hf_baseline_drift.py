"""How stable is the HF `generate` baseline that bench_one_batch.py divides by?

HF's eager generate is host-bound on the GPU host (its Python thread is busy the whole time),
so its speed follows the CPU it gets. This times HF decode at batch 1 and 128 (512-token
prompts, 32 new tokens, bench_one_batch's method) on dummy llama3-8b bf16 three times in one
process: before treadle's Engine exists, after a full treadle bs 1/32/128/256 round (the
order bench_one_batch.py uses), and once more.

    python benchmarks/hf_baseline_drift.py
"""
import argparse
import gc
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_one_batch as b  # noqa: E402
from treadle.runtime import Engine  # noqa: E402
from treadle.runtime.model_source import resolve_model_source  # noqa: E402

dev, dt = torch.device("cuda"), torch.bfloat16
cfg = resolve_model_source("dummy:llama3-8b").config
short = argparse.Namespace(input_len=512, output_len=32, repeats=1, seed=0)
hf = b.build_hf(cfg, dev, dt, 0)


def hf_round(tag: str) -> None:
    for bs in (1, 128):
        t0, w0 = time.process_time(), time.perf_counter()
        r = b.bench_hf(hf, bs, short, cfg.vocab_size, dev, False)
        print(tag, "bs", bs, "decode tok/s", r["decode_tok_s"], "ms/step", round(bs / r["decode_tok_s"] * 1e3, 1),
              "cpu/wall", round((time.process_time() - t0) / (time.perf_counter() - w0), 2),
              "load", os.getloadavg()[0], flush=True)


hf_round("HF before treadle")
seq = 640
engine = Engine(model_path="dummy:llama3-8b", dtype="bfloat16", device="cuda", seed=0, max_total_tokens=256 * seq + 2 * seq,
                max_running_requests=256, chunked_prefill_size=8192, max_prefill_tokens=16384, attention_backend="triton",
                cuda_graph=True, overlap_schedule="auto", context_length=seq + 16)
engine.runner.model.load_weights(hf.state_dict().items())
full = argparse.Namespace(input_len=512, output_len=128, repeats=1, seed=0)
for bs in (1, 32, 128, 256):
    print("treadle bs", bs, b.bench_treadle(engine, bs, full, cfg.vocab_size, dev)["decode_tok_s"], flush=True)
engine.shutdown()
del engine
gc.collect()
torch.cuda.empty_cache()
hf_round("HF after treadle")
hf_round("HF after treadle, again")
