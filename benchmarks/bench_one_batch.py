"""One batch, end to end: treadle's decode tok/s vs the weight-read roofline, and output tok/s
vs HF `generate` on the same weights, in one run.

    python benchmarks/bench_one_batch.py                      # H200: llama3-8b dummy, bf16
    python benchmarks/bench_one_batch.py --no-hf              # treadle + roofline only
    nice python benchmarks/bench_one_batch.py --device cpu --model dummy:tiny-llama \
        --batch-sizes 1,4 --input-len 16 --output-len 8       # smoke

Figures (one JSON line each, all written to --output, default
benchmarks/results/one_batch_<device>.json):
- copy_bandwidth: device-to-device copy (bytes read + written), median of several
  (CUDA events on GPU, perf_counter on CPU).
- roofline: weight bytes (every parameter once: weight_gb) and the bytes a batch-1 decode step
  reads (bs1_step_weight_gb: the same but for an untied embedding table, of which a step
  reads one row; llama3-8b's is 1.05 GB of its 16.06), and the batch-1 decode ceiling copy
  bandwidth / step bytes (tok/s).
- treadle (per batch size): random prompts of --input-len tokens (fixed seed), the radix cache
  flushed before every timed call. t_full = generate(max_new_tokens=output_len),
  t_prefill = generate(max_new_tokens=1) (~ prefill + one sample).
  decode tok/s = bs * (output_len - 1) / (t_full - t_prefill); output tok/s = bs * output_len / t_full.
  step_roofline_ms = (weight bytes + bs * (input_len + output_len / 2) * KV bytes per token) /
  copy bandwidth: what one decode step must read, at the mean context of the run;
  pct_of_step_roofline = step_roofline_ms / itl_ms (the memory bound at every batch size).
  One untimed full warm-up per batch size; median over --repeats. --kv-cache-dtype fp8_e5m2
  stores treadle's KV cache as fp8 (half the KV bytes decode reads; HF keeps the model
  dtype, so greedy_tokens_matching_treadle may be shorter).
- hf (per HF batch size): HF `generate` (greedy, min_new_tokens = max_new_tokens = output_len)
  on an HF LlamaForCausalLM whose random weights are loaded into treadle before any timing, so
  both sides run the same weights. One untimed full warm-up per batch size, as for treadle.
- compute_peak: FLOP/s of one large square matmul in the model dtype (median of several): the
  prefill's ceiling, measured in the same run.
- bound (per batch size, in the treadle record): the fastest any engine could run the same
  batch on this device: the prefill at the compute peak (2 FLOPs per linear weight per prompt
  token, the causal attention's QK and PV, the lm_head once per request) and each of the
  output_len - 1 decode steps at max(its bytes / copy bandwidth, its FLOPs / compute peak), the
  KV read growing a token per step. bound_output_tok_s = bs * output_len / bound_s;
  pct_of_output_bound = output tok/s / bound_output_tok_s; in the hf record bound_over_hf =
  bound_output_tok_s / HF output tok/s: the largest ratio over HF any engine could show.
- "weight bytes" in the roofline, the step roofline and the bound are the bytes a forward
  over n tokens actually reads: every parameter except an untied embedding table (and a
  mixture of experts' experts), the embedding rows of the n tokens, and, for mixtures of
  experts (--model dummy:qwen3-30b-a3b, dummy:mixtral-8x7b), per MoE layer the experts the n tokens activate, E (1 - (1 - K/E)^n)
  (the expectation under uniform routing, which random routers are close to; exactly K for one
  token); the FLOPs per token count K experts. The roofline record gives both figures.
- summary: table of bs, treadle output tok/s, decode tok/s, HF tok/s, ratio, % of roofline at bs 1,
  % of the step roofline, % of the output bound, the bound over HF.
- --quantization fp8|awq|gptq: after the float (bf16) engine, the same dummy model runs again with
  its linears quantized at load (random weights, the format's real packed layout), in the same
  run, and every treadle figure is repeated for it ("figure": "treadle_quantized"): its
  roofline uses that format's weight bytes (packed weights, scales and zeros; the embeddings
  and lm_head stay bf16) over the same copy bandwidth, and its bound those bytes and the
  matmul peak of what its matmuls run on (fp8: a measured torch._scaled_mm FP8 peak,
  "fp8_compute_peak"; awq/gptq dequantize to bf16: the bf16 peak). "quantized_vs_float" gives,
  per batch size, quantized / float output tok/s and each one's % of its own roofline and bound.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch

# benchmarks/machine.py (scripts run from this folder)
from machine import copy_bandwidth, cpu_model, machine_info, matmul_flops

HERE = os.path.dirname(os.path.abspath(__file__))


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="dummy:llama3-8b")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--batch-sizes", default="1,32,128,256")
    p.add_argument("--hf-batch-sizes", default="1,32,128")
    p.add_argument("--no-hf", action="store_true", help="skip HF generate (treadle keeps its dummy weights)")
    p.add_argument("--hf-static", action="store_true",
                   help="also time HF with cache_implementation='static' (compiles the forward)")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1, help="timed runs per batch size (median)")
    p.add_argument("--attention-backend", default=None, help="default: triton on cuda, torch on cpu")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e5m2"],
                   help="treadle's KV cache storage: auto = the model dtype; fp8_e5m2 halves KV bytes "
                        "(outputs change slightly; the HF side is unchanged)")
    p.add_argument("--overlap-schedule", default="auto", choices=["auto", "on", "off"],
                   help="overlap scheduling (auto: on with CUDA)")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True, help="decode through CUDA graphs (--no-cuda-graph: plain launches)")
    p.add_argument("--max-prefill-tokens", type=int, default=16384,
                   help="prefill batch token budget (larger batches prefill in several forwards)")
    p.add_argument("--copy-mib", type=int, default=None, help="copy size (default 2048 on cuda, 256 on cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tp-size", type=int, default=1,
                   help="tensor-parallel GPUs (> 1 skips HF: its weights are loaded into rank 0 only)")
    p.add_argument("--custom-all-reduce", action=argparse.BooleanOptionalAction, default=True,
                   help="tp > 1: decode-sized all-reduces through peer memory (--no-custom-all-reduce: NCCL only)")
    p.add_argument("--quantization", default=None, choices=["fp8", "awq", "gptq"],
                   help="also run the model quantized at load in this format, beside the float run")
    p.add_argument("--output", default=None)
    a = p.parse_args()
    a.batch_sizes = _ints(a.batch_sizes)
    a.hf_batch_sizes = [] if a.no_hf or a.tp_size > 1 else _ints(a.hf_batch_sizes)
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    a.attention_backend = a.attention_backend or ("triton" if a.device == "cuda" else "torch")
    if a.output_len < 2:
        p.error("--output-len must be >= 2 (decode time is t(output_len) - t(1))")
    return a


RECORDS: list[dict] = []


def emit(rec: dict) -> dict:
    RECORDS.append(rec)
    print(json.dumps(rec), flush=True)
    return rec


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def linear_params(model: torch.nn.Module) -> int:
    """Weights of the linears every token runs through (the decoder layers' matrices; in a
    mixture of experts, the K experts a token is routed to)."""
    dense = sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2)
    k = getattr(model.config, "num_experts_per_tok", 0)
    return dense + sum(k * (m.gate_up_proj[0].numel() + m.down_proj[0].numel()) for m in moe_experts(model))


def batch_bound_s(bs: int, args, cfg, tp: int, per_token: int, wb, kv_token_bytes: int, bw: float,
                  peak: float) -> float:
    """Seconds the batch takes at best on this device (the module docstring's `bound`)."""
    heads_dim, layers = cfg.num_heads // tp * cfg.head_dim, cfg.num_layers
    head = cfg.vocab_size * cfg.hidden_size // tp
    n = args.input_len
    prefill_flops = bs * (2 * per_token * n + 2 * head + 4 * layers * heads_dim * n * (n + 1) // 2)
    # wb(tokens): weight bytes a forward over that many tokens reads
    t = max(prefill_flops / peak, (wb(bs * n) + bs * n * kv_token_bytes) / bw)
    for step in range(1, args.output_len):
        ctx = n + step  # keys the step's query attends to
        flops = bs * (2 * per_token + 2 * head + 4 * layers * heads_dim * ctx)
        t += max(flops / peak, (wb(bs) + bs * ctx * kv_token_bytes) / bw)
    return t


def fp8_matmul_flops(dev: torch.device, n: int, reps: int = 10) -> float:
    """FLOP/s of one n x n x n float8_e4m3fn matmul through torch._scaled_mm (row-wise scales,
    bf16 out, as the FP8 linears run it above 16 rows), median of `reps`."""
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=dev, generator=g).to(torch.float8_e4m3fn).T  # column-major, as cuBLAS wants
    sa = torch.ones(n, 1, device=dev)
    sb = torch.ones(1, n, device=dev)
    out = torch.bfloat16 if dev.type == "cuda" else torch.float32

    def mm():
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out)

    for _ in range(3):
        mm()
    times = []
    for _ in range(reps):
        sync(dev)
        t0 = time.perf_counter()
        mm()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def moe_experts(model: torch.nn.Module) -> list:
    from treadle.runtime.models.moe import FusedExperts

    return [m for m in model.modules() if isinstance(m, FusedExperts)]


def step_weight_bytes(model: torch.nn.Module, cfg):
    """n tokens -> the weight bytes a forward over them reads (the module docstring's
    "weight bytes"): every parameter once, but an untied embedding table only its n rows and,
    in a mixture of experts, only the experts the n tokens activate."""
    wb = weight_bytes(model)
    experts = moe_experts(model)
    emb = model.embed_tokens.weight
    untied = not cfg.tie_word_embeddings
    if not experts:
        base = wb - (emb.nbytes if untied else 0)
        return lambda n: base + (min(n, emb.shape[0]) * emb[0].nbytes if untied else 0)
    expert_bytes = sum(m.gate_up_proj.nbytes + m.down_proj.nbytes for m in experts)
    base = wb - expert_bytes - (emb.nbytes if untied else 0)
    e, k = cfg.num_experts, cfg.num_experts_per_tok

    def read(n: int) -> float:
        active = e * (1 - (1 - k / e) ** n)  # experts of a layer n tokens activate
        rows = min(n, emb.shape[0]) * emb[0].nbytes if untied else 0
        return base + rows + sum(active * m.num_local / e * (m.gate_up_proj[0].nbytes + m.down_proj[0].nbytes)
                                 for m in experts)

    return read


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter, each counted once (tied weights once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


# ------------------------------------------------------------------------------ prompts

def make_prompts(bs: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """bs distinct random prompts (fixed seed); ids avoid the first/last few (special) ids."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab - 10, (bs, length), generator=g).tolist()


# ------------------------------------------------------------------------------ HF

def build_hf(cfg, dev: torch.device, dtype: torch.dtype, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    d = cfg.to_hf_dict()
    hf_cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(seed)
    with torch.device(dev):
        try:
            hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype)
        except TypeError:  # older transformers
            hf = AutoModelForCausalLM.from_config(hf_cfg, torch_dtype=dtype)
    if next(hf.parameters()).dtype != dtype:
        hf = hf.to(dtype)
    return hf.to(dev).eval()


@torch.inference_mode()
def hf_generate(hf, ids: torch.Tensor, new: int, static: bool) -> torch.Tensor:
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    if static:
        kw["cache_implementation"] = "static"
    return hf.generate(ids, **kw)


def bench_hf(hf, bs: int, args, vocab: int, dev: torch.device, static: bool) -> dict:
    ids = torch.tensor(make_prompts(bs, args.input_len, vocab, args.seed), device=dev)
    # warm-up: one full-length untimed run, as treadle gets. A short one left HF's first timed
    # run cold (the dynamic cache growing through a cold CUDA allocator, first calls of each
    # shape): 2-3x slower per step than later runs (benchmarks/hf_baseline_drift.py)
    hf_generate(hf, ids, args.output_len, static)
    times, pres = [], []
    for _ in range(args.repeats):
        for new, acc in ((1, pres), (args.output_len, times)):
            sync(dev)
            t0 = time.perf_counter()
            out = hf_generate(hf, ids, new, static)
            sync(dev)
            acc.append(time.perf_counter() - t0)
    if out.shape != (bs, args.input_len + args.output_len):
        raise RuntimeError(f"HF generated shape {tuple(out.shape)}")
    t, t_pre = statistics.median(times), statistics.median(pres)
    rec = {"figure": "hf_static" if static else "hf", "bs": bs, "t_s": round(t, 4), "t_prefill_s": round(t_pre, 4),
           "output_tok_s": round(bs * args.output_len / t, 2),
           "decode_tok_s": round(bs * (args.output_len - 1) / (t - t_pre), 2) if t > t_pre else None}
    rec["_first_ids"] = out[0, args.input_len:].tolist()
    return rec


# ------------------------------------------------------------------------------ treadle

def _flush(engine) -> None:
    for _ in range(100):
        if engine.flush_cache():
            return
        time.sleep(0.01)
    raise RuntimeError("could not flush the radix cache (engine busy)")


def _timed_generate(engine, prompts, new: int, dev: torch.device) -> tuple[float, list[dict]]:
    _flush(engine)
    sync(dev)
    t0 = time.perf_counter()
    out = engine.generate(input_ids=prompts,
                          sampling_params={"max_new_tokens": new, "temperature": 0, "ignore_eos": True})
    sync(dev)
    t = time.perf_counter() - t0
    bad = [o["meta_info"]["completion_tokens"] for o in out if o["meta_info"]["completion_tokens"] != new]
    if bad:
        raise RuntimeError(f"expected {new} tokens per request, got e.g. {bad[:3]}")
    cached = sum(o["meta_info"]["cached_tokens"] for o in out)
    if cached:
        raise RuntimeError(f"{cached} prompt tokens came from the prefix cache: the timing is not a cold prefill")
    return t, out


def bench_treadle(engine, bs: int, args, vocab: int, dev: torch.device) -> dict:
    prompts = make_prompts(bs, args.input_len, vocab, args.seed)
    _timed_generate(engine, prompts, args.output_len, dev)  # warm-up (kernels for these shapes)
    fulls, pres = [], []
    for _ in range(args.repeats):
        t_pre, _ = _timed_generate(engine, prompts, 1, dev)
        t_full, out = _timed_generate(engine, prompts, args.output_len, dev)
        pres.append(t_pre)
        fulls.append(t_full)
    t_full, t_pre = statistics.median(fulls), statistics.median(pres)
    decode_t = t_full - t_pre
    rec = {"figure": "treadle", "bs": bs, "t_full_s": round(t_full, 4), "t_prefill_s": round(t_pre, 4),
           "prefill_tok_s": round(bs * args.input_len / t_pre, 1),
           "decode_tok_s": round(bs * (args.output_len - 1) / decode_t, 2) if decode_t > 0 else None,
           "itl_ms": round(decode_t / (args.output_len - 1) * 1e3, 3),
           "output_tok_s": round(bs * args.output_len / t_full, 2)}
    if args.repeats > 1:
        rec["t_full_all_s"] = [round(x, 4) for x in fulls]
    rec["_first_ids"] = out[0]["output_ids"]
    return rec


def run_batches(engine, args, cfg, wb, kv_token_bytes: int, bw: float, peak: float, per_token: int,
                dev: torch.device, figure: str) -> dict[int, dict]:
    """Time every batch size on `engine`; emit and return its records (figure names them)."""
    roof = bw / wb(1)
    tre: dict[int, dict] = {}
    for bs in args.batch_sizes:
        rec = bench_treadle(engine, bs, args, cfg.vocab_size, dev)
        rec["figure"] = figure
        if rec["itl_ms"] > 0:
            # a decode step reads the weights once and each request's KV once; over the run
            # the context averages input_len + output_len / 2 tokens
            step_bytes = wb(bs) + bs * (args.input_len + args.output_len / 2) * kv_token_bytes
            rec["step_weight_gb"] = round(wb(bs) / 1e9, 3)
            rec["step_roofline_ms"] = round(step_bytes / bw * 1e3, 3)
            rec["pct_of_step_roofline"] = round(100 * step_bytes / bw * 1e3 / rec["itl_ms"], 1)
        bound = batch_bound_s(bs, args, cfg, args.tp_size, per_token, wb, kv_token_bytes, bw, peak)
        rec["bound_s"] = round(bound, 4)
        rec["bound_output_tok_s"] = round(bs * args.output_len / bound, 1)
        rec["pct_of_output_bound"] = round(100 * rec["output_tok_s"] / rec["bound_output_tok_s"], 1)
        first = rec.pop("_first_ids")
        if bs == 1:
            rec["pct_of_roofline"] = round(100 * rec["decode_tok_s"] / roof, 1) if rec["decode_tok_s"] else None
            rec["_first_ids"] = first
        tre[bs] = rec
        emit({k: v for k, v in rec.items() if not k.startswith("_")})
    return tre


def run_quantized(args, dev: torch.device, dtype: torch.dtype, bw: float, peak: float, per_token: int,
                  float_recs: dict[int, dict]) -> None:
    """The same dummy model quantized at load (--quantization): its roofline, bound and batches,
    beside the float run's (the module docstring's --quantization paragraph)."""
    from treadle.runtime.engine import Engine

    max_bs, seq = max(args.batch_sizes), args.input_len + args.output_len
    t0 = time.perf_counter()
    engine = Engine(model_path=args.model, dtype=args.dtype, device=args.device, seed=args.seed,
                    quantization=args.quantization,
                    max_total_tokens=max_bs * seq + 2 * seq, max_running_requests=max_bs,
                    chunked_prefill_size=max(8192, args.input_len), max_prefill_tokens=args.max_prefill_tokens,
                    attention_backend=args.attention_backend, kv_cache_dtype=args.kv_cache_dtype,
                    cuda_graph=args.cuda_graph, overlap_schedule=args.overlap_schedule, context_length=seq + 16,
                    tp_size=args.tp_size, custom_all_reduce=args.custom_all_reduce)
    load_s = time.perf_counter() - t0
    try:
        cfg = engine.runner.config
        wb_all = weight_bytes(engine.runner.model)  # packed weights, scales, zeros; bf16 embeddings
        wb = step_weight_bytes(engine.runner.model, cfg)
        pool = engine.runner.kv_pool
        kv_token_bytes = 2 * pool.num_layers * pool.k_buffers[0][0].nbytes
        peak_q = peak
        if args.quantization == "fp8":
            n = 8192 if dev.type == "cuda" else 1024
            peak_q = fp8_matmul_flops(dev, n)
            emit({"figure": "fp8_compute_peak", "matmul_tflops": round(peak_q / 1e12, 3), "n": n,
                  "over_float_peak": round(peak_q / peak, 2)})
        emit({"figure": "roofline_quantized", "quantization": engine.runner.quantization.describe(),
              "weight_bytes": wb_all, "weight_gb": round(wb_all / 1e9, 3), "bs1_step_weight_gb": round(wb(1) / 1e9, 3),
              "copy_gb_s": round(bw / 1e9, 1), "bs1_decode_roofline_tok_s": round(bw / wb(1), 2), "engine_load_s": round(load_s, 2),
              "matmul_peak_tflops": round(peak_q / 1e12, 3)})
        recs = run_batches(engine, args, cfg, wb, kv_token_bytes, bw, peak_q, per_token, dev, "treadle_quantized")
    finally:
        engine.shutdown()
    rows = []
    for bs, q in recs.items():
        f = float_recs.get(bs, {})
        rows.append({"bs": bs, "float_output_tok_s": f.get("output_tok_s"), "quantized_output_tok_s": q["output_tok_s"],
                     "quantized_over_float": round(q["output_tok_s"] / f["output_tok_s"], 2) if f else None,
                     "float_pct_of_roofline": f.get("pct_of_roofline"), "quantized_pct_of_roofline": q.get("pct_of_roofline"),
                     "float_pct_of_output_bound": f.get("pct_of_output_bound"),
                     "quantized_pct_of_output_bound": q["pct_of_output_bound"],
                     "quantized_bound_output_tok_s": q["bound_output_tok_s"]})
    emit({"figure": "quantized_vs_float", "quantization": args.quantization, "rows": rows})
    if dev.type == "cuda":
        del engine
        gc.collect()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ main

def main() -> None:
    args = _parse()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available: use --device cpu")
    from treadle.runtime.engine import Engine
    from treadle.runtime.model_runner import resolve_dtype

    dev = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, dev)
    emit({"figure": "meta", **machine_info(("torch", "triton", "transformers")),
          "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model(),
          "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
          "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": args.model, "dtype": args.dtype,
          "input_len": args.input_len, "output_len": args.output_len, "repeats": args.repeats,
          "attention_backend": args.attention_backend, "kv_cache_dtype": args.kv_cache_dtype,
          "cuda_graph": args.cuda_graph, "overlap_schedule": args.overlap_schedule, "tp_size": args.tp_size,
          "custom_all_reduce": args.custom_all_reduce, "quantization": args.quantization,
          "treadle_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TREADLE_")}})

    bw = copy_bandwidth(dev, args.copy_mib or (2048 if dev.type == "cuda" else 256))
    emit({"figure": "copy_bandwidth", "gb_s": round(bw / 1e9, 1)})

    max_bs = max(args.batch_sizes)
    seq = args.input_len + args.output_len
    t0 = time.perf_counter()
    engine = Engine(model_path=args.model, dtype=args.dtype, device=args.device, seed=args.seed,
                    max_total_tokens=max_bs * seq + 2 * seq, max_running_requests=max_bs,
                    chunked_prefill_size=max(8192, args.input_len), max_prefill_tokens=args.max_prefill_tokens,
                    attention_backend=args.attention_backend, kv_cache_dtype=args.kv_cache_dtype,
                    cuda_graph=args.cuda_graph, overlap_schedule=args.overlap_schedule, context_length=seq + 16,
                    tp_size=args.tp_size, custom_all_reduce=args.custom_all_reduce)
    load_s = time.perf_counter() - t0
    cfg = engine.runner.config
    wb_all = weight_bytes(engine.runner.model)
    wb = step_weight_bytes(engine.runner.model, cfg)  # tokens -> bytes a forward reads
    roof = bw / wb(1)
    pool = engine.runner.kv_pool  # (rank 0's shard with tensor parallelism, like wb)
    kv_token_bytes = 2 * pool.num_layers * pool.k_buffers[0][0].nbytes  # K and V, every layer
    per_token = linear_params(engine.runner.model)
    peak_n = 8192 if dev.type == "cuda" else 1024
    peak = matmul_flops(dev, dtype, peak_n)
    # with tensor parallelism, rank 0's shard: each GPU streams its own shard at the same time
    emit({"figure": "roofline", "weight_bytes": wb_all, "weight_gb": round(wb_all / 1e9, 3),
          "bs1_step_weight_bytes": round(wb(1)), "bs1_step_weight_gb": round(wb(1) / 1e9, 3),
          "copy_gb_s": round(bw / 1e9, 1), "bs1_decode_roofline_tok_s": round(roof, 2),
          "engine_load_s": round(load_s, 2), "kv_slots": engine.runner.num_slots,
          "kv_bytes_per_token": kv_token_bytes})
    emit({"figure": "compute_peak", "matmul_tflops": round(peak / 1e12, 3), "n": peak_n, "dtype": str(dtype),
          "linear_params_per_token": per_token})

    hf = None
    if args.hf_batch_sizes:
        t0 = time.perf_counter()
        hf = build_hf(cfg, dev, dtype, args.seed)
        engine.runner.model.load_weights(hf.state_dict().items())  # treadle now runs HF's weights
        sync(dev)
        emit({"figure": "hf_weights_loaded_into_treadle", "s": round(time.perf_counter() - t0, 2),
              "hf_weight_bytes": weight_bytes(hf)})

    try:
        tre = run_batches(engine, args, cfg, wb, kv_token_bytes, bw, peak, per_token, dev, "treadle")
    finally:
        engine.shutdown()
    if dev.type == "cuda":
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    if args.quantization:
        run_quantized(args, dev, dtype, bw, peak, per_token, tre)

    hfr: dict[tuple[str, int], dict] = {}
    if hf is not None:
        modes = [False, True] if args.hf_static else [False]
        for static in modes:
            for bs in args.hf_batch_sizes:
                try:
                    rec = bench_hf(hf, bs, args, cfg.vocab_size, dev, static)
                except torch.OutOfMemoryError as e:  # record it and go on
                    rec = {"figure": "hf_static" if static else "hf", "bs": bs, "error": f"OOM: {e}"[:300]}
                    torch.cuda.empty_cache()
                first = rec.pop("_first_ids", None)
                if bs in tre and "output_tok_s" in rec:
                    rec["treadle_output_tok_s"] = tre[bs]["output_tok_s"]
                    rec["treadle_over_hf"] = round(tre[bs]["output_tok_s"] / rec["output_tok_s"], 2)
                    rec["bound_over_hf"] = round(tre[bs]["bound_output_tok_s"] / rec["output_tok_s"], 2)
                    if rec.get("decode_tok_s") and tre[bs].get("decode_tok_s"):
                        rec["treadle_decode_tok_s"] = tre[bs]["decode_tok_s"]
                        rec["treadle_decode_over_hf_decode"] = round(tre[bs]["decode_tok_s"] / rec["decode_tok_s"], 2)
                if bs == 1 and first is not None and "_first_ids" in tre.get(1, {}):
                    a, b = tre[1]["_first_ids"], first
                    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    rec["greedy_tokens_matching_treadle"] = n  # sanity: same weights (bf16 ties may diverge)
                hfr[(rec["figure"], bs)] = rec
                emit(rec)
        del hf
        gc.collect()

    # ---- summary table
    rows = []
    for bs in sorted(set(args.batch_sizes) | set(args.hf_batch_sizes)):
        t, h = tre.get(bs, {}), hfr.get(("hf", bs), {})
        row = {"bs": bs, "treadle_output_tok_s": t.get("output_tok_s"), "treadle_decode_tok_s": t.get("decode_tok_s"),
               "treadle_prefill_s": t.get("t_prefill_s"), "hf_output_tok_s": h.get("output_tok_s"),
               "treadle_over_hf": h.get("treadle_over_hf"), "hf_decode_tok_s": h.get("decode_tok_s"),
               "treadle_decode_over_hf_decode": h.get("treadle_decode_over_hf_decode")}
        if ("hf_static", bs) in hfr:
            row["hf_static_output_tok_s"] = hfr[("hf_static", bs)].get("output_tok_s")
        row["pct_of_step_roofline"] = t.get("pct_of_step_roofline")
        row["bound_output_tok_s"] = t.get("bound_output_tok_s")
        row["pct_of_output_bound"] = t.get("pct_of_output_bound")
        row["bound_over_hf"] = h.get("bound_over_hf")
        if bs == 1:
            row["pct_of_roofline"] = t.get("pct_of_roofline")
        rows.append(row)
    emit({"figure": "summary", "bs1_decode_roofline_tok_s": round(roof, 2), "rows": rows})
    for r in tre.values():
        r.pop("_first_ids", None)

    out = args.output or os.path.join(HERE, "results", f"one_batch_{args.device}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(RECORDS, f, indent=1)

    def f(x, w=10):
        return f"{x:>{w}}" if x is not None else f"{'-':>{w}}"

    print(f"\nroofline (bs 1 decode) = {bw / 1e9:.1f} GB/s / {wb(1) / 1e9:.2f} GB = {roof:.1f} tok/s")
    print(f"compute peak = {peak / 1e12:.2f} TFLOP/s ({peak_n}^3 {dtype} matmul); bound: the fastest any engine "
          "could run the batch here; bound/HF: the largest ratio over HF it allows")
    print(f"{'bs':>5} {'out tok/s':>10} {'dec tok/s':>10} {'prefill s':>10} {'HF tok/s':>10} {'ratio':>7}"
          f" {'HF dec':>10} {'dec ratio':>9} {'%roof':>6} {'%step':>6} {'bound':>10} {'%bound':>6}"
          f" {'bound/HF':>8}")
    for r in rows:
        print(f"{r['bs']:>5} {f(r['treadle_output_tok_s'])} {f(r['treadle_decode_tok_s'])} {f(r['treadle_prefill_s'])}"
              f" {f(r['hf_output_tok_s'])} {f(r['treadle_over_hf'], 7)} {f(r['hf_decode_tok_s'])}"
              f" {f(r['treadle_decode_over_hf_decode'], 9)} {f(r.get('pct_of_roofline'), 6)}"
              f" {f(r.get('pct_of_step_roofline'), 6)} {f(r['bound_output_tok_s'])} {f(r['pct_of_output_bound'], 6)}"
              f" {f(r['bound_over_hf'], 8)}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
