"""What one forward costs by kind on a GPU, in one run: a greedy JSON-schema request with
jump-forward on (its jumps are extend forwards of 1-4 tokens) and off, every forward timed
with a device sync before and after (decode forwards replay the CUDA graph; extends of up
to 16 tokens a request replay theirs, or run eagerly with --cuda-graph-extend-max-tokens 0),
then a torch.profiler table of the CPU side of the same request.

    python benchmarks/profile_forward_kinds.py --model-path dummy:llama3-8b \
        --tokenizer-path .gpu_assets/smollm2-tokenizer
"""
from __future__ import annotations

import argparse
import json
import time

import torch

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "email": {"type": ["string", "null"], "maxLength": 16}}, "required": ["name", "age", "email"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default="dummy:llama3-8b")
    ap.add_argument("--tokenizer-path", default=None)
    ap.add_argument("--cuda-graph-extend-max-tokens", type=int, default=256, help="0: extends run eagerly")
    args = ap.parse_args()
    from treadle.runtime import Engine

    prompt, params = "Record 0: reply in JSON.", {"json_schema": SCHEMA, "max_new_tokens": 64, "temperature": 0}
    for jf in (64, 0):
        e = Engine(model_path=args.model_path, tokenizer_path=args.tokenizer_path, context_length=2048,
                   max_total_tokens=32768, jump_forward_max_batch=jf,
                   cuda_graph_extend_max_tokens=args.cuda_graph_extend_max_tokens)
        for _ in range(3):
            e.generate(prompt, params)
        runner = e.scheduler.runner
        real, log = runner.forward, []

        def timed(fb, *a, **k):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = real(fb, *a, **k)
            torch.cuda.synchronize()
            log.append((fb.mode.name, int(fb.input_ids.numel()), (time.perf_counter() - t0) * 1e3))
            return out

        runner.forward = timed
        out = e.generate(prompt, params)
        runner.forward = real
        t0 = time.perf_counter()
        e.generate(prompt, params)
        plain = time.perf_counter() - t0
        kinds: dict[str, list[float]] = {}
        for mode, n, ms in log:
            kinds.setdefault(mode if mode == "DECODE" else f"{mode} {n} tokens", []).append(ms)
        print(json.dumps({"jump_forward_max_batch": jf, "request_s": round(plain, 4),
                          "tokens": out["meta_info"]["completion_tokens"], "forwards": len(log),
                          "ms_per_forward": {k: {"n": len(v), "mean": round(sum(v) / len(v), 2)}
                                             for k, v in sorted(kinds.items())}}), flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            e.generate(prompt, params)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=40))
        e.shutdown()


if __name__ == "__main__":
    main()
