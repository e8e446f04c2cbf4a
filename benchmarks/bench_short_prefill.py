"""Time to first token of one short prompt on a GPU, extend CUDA graphs on vs off, in one run:
a 45-token prompt, one new token, radix cache off, the median of 20 requests after 3
warm-ups, llama3-8b dummy weights (bf16).

    python benchmarks/bench_short_prefill.py .gpu_assets/smollm2-tokenizer
"""
import json, statistics, sys, time
from treadle.runtime import Engine
tokp = sys.argv[1]
prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 5)
for ext in (256, 0):
    e = Engine(model_path="dummy:llama3-8b", tokenizer_path=tokp, context_length=2048, max_total_tokens=32768,
               cuda_graph_extend_max_tokens=ext, disable_radix_cache=True)
    n = len(e.tokenizer.encode(prompt))
    for _ in range(3):
        e.generate(prompt, {"max_new_tokens": 1, "temperature": 0})
    ts = []
    for _ in range(20):
        t0 = time.perf_counter(); e.generate(prompt, {"max_new_tokens": 1, "temperature": 0}); ts.append(time.perf_counter() - t0)
    print(json.dumps({"cuda_graph_extend_max_tokens": ext, "prompt_tokens": n, "one_token_request_ms_median": round(1e3 * statistics.median(ts), 2), "min": round(1e3 * min(ts), 2)}))
    e.shutdown()
