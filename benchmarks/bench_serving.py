"""Online serving benchmark: a Poisson load generator against any treadle (native API) or
OpenAI-compatible server, reporting throughput and latency as one JSON object.

    # against a running server
    python benchmarks/bench_serving.py --base-url http://127.0.0.1:30000 --num-prompts 64 --request-rate 4
    # launch treadle itself, and compare the radix cache on vs off on a shared-prefix workload
    python benchmarks/bench_serving.py --launch --server-args "--max-total-tokens 16384" \
        --compare-radix --shared-prefix-len 200 --num-prompts 32
    # and HF `generate` over the same prompts and output lengths as a floor (offline batches)
    python benchmarks/bench_serving.py --launch --hf-floor --hf-batch 8 --output results/serving_cpu.json

    # 10x overload: 80 clients at once against a server that holds 8 requests (4 running + 4
    # queued); "overload" reports the 503s' latency (p50 / p99 / max), whether they carry
    # Retry-After, and the goodput of the admitted requests
    python benchmarks/bench_serving.py --launch --server-args "--max-total-tokens 16384 \
        --max-running-requests 4 --max-queued-requests 4" --num-prompts 400 --max-concurrency 80

Prompts are random words (about one token each) drawn with --seed, so a run is repeatable.
Every request streams; TTFT is the time to the first chunk with text, ITL the gaps between
later chunks.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx

from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river stone light music garden paper window city road "
         "table letter market energy answer system story history morning winter summer ocean mountain").split()


@dataclass
class Result:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str | None = None
    status: int | None = None  # the HTTP status (None: no response)
    retry_after: str | None = None  # a refusal's Retry-After header


def make_workload(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(prompt, input words, max output tokens) per request, fixed by --seed."""
    rng = random.Random(args.seed)
    prefix = " ".join(rng.choice(WORDS) for _ in range(args.shared_prefix_len))
    out = []
    for _ in range(args.num_prompts):
        n_in = rng.randint(*args.input_len_range)
        body = " ".join(rng.choice(WORDS) for _ in range(n_in))
        prompt = f"{prefix} {body}" if prefix else body
        out.append((prompt, n_in + args.shared_prefix_len, rng.randint(*args.output_len_range)))
    return out


def request_for(args: argparse.Namespace, prompt: str, max_tokens: int) -> tuple[str, dict]:
    if args.backend == "native":
        sp = {"max_new_tokens": max_tokens, "temperature": args.temperature}
        if not args.no_ignore_eos:
            sp["ignore_eos"] = True
        return "/generate", {"text": prompt, "sampling_params": sp, "stream": True}
    body = {"model": args.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": args.temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    if not args.no_ignore_eos:
        body["ignore_eos"] = True
    return "/v1/completions", body


async def one_request(client: httpx.AsyncClient, args: argparse.Namespace, prompt: str, n_in: int,
                      max_tokens: int) -> Result:
    path, body = request_for(args, prompt, max_tokens)
    res = Result(ok=False, prompt_len=n_in)
    t0 = last = time.perf_counter()
    chunks = seen = 0
    try:
        async with client.stream("POST", args.base_url + path, json=body) as r:
            res.status = r.status_code
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                res.latency = time.perf_counter() - t0  # how long a refusal took
                res.retry_after = r.headers.get("retry-after")
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    res.error = str(obj["error"])[:200]
                    return res
                if args.backend == "native":  # text so far (SGLang's native stream)
                    text, seen = obj["text"][seen:], len(obj["text"])
                    res.output_tokens = obj["meta_info"]["completion_tokens"]
                else:
                    if obj.get("usage"):
                        res.output_tokens = obj["usage"]["completion_tokens"]
                    text = "".join(c.get("text") or "" for c in obj.get("choices", []))
                if not text:
                    continue
                now = time.perf_counter()
                if res.ttft is None:
                    res.ttft = now - t0
                else:
                    res.itls.append(now - last)
                last = now
                chunks += 1
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.output_tokens = res.output_tokens or chunks
    res.latency = time.perf_counter() - t0
    res.ok = True
    return res


async def run_load(args: argparse.Namespace) -> dict:
    work = make_workload(args)
    rng = random.Random(args.seed + 1)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.max_concurrency, max_keepalive_connections=args.max_concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), headers=headers, limits=limits) as client:
        sem = asyncio.Semaphore(args.max_concurrency)

        async def guarded(item: tuple[str, int, int]) -> Result:
            async with sem:
                return await one_request(client, args, *item)

        for i in range(args.warmup_requests):  # first calls JIT-compile kernels: not the load's cost
            text = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(args.input_len_range[1]))  # not a workload prefix
            warm = await one_request(client, args, text, 0, 8)
            if not warm.ok:
                raise RuntimeError(f"warm-up request failed: {warm.error}")
        if args.shared_prefix_len and work:
            # cache the shared prefix once, untimed, as a long-running service would have it
            prefix = " ".join(work[0][0].split(" ")[: args.shared_prefix_len])
            warm = await one_request(client, args, prefix, args.shared_prefix_len, 1)
            if not warm.ok:
                raise RuntimeError(f"warm-up request failed: {warm.error}")
        tasks = []
        start = time.perf_counter()
        for item in work:
            tasks.append(asyncio.ensure_future(guarded(item)))
            if args.request_rate != float("inf"):  # Poisson arrivals: exponential gaps
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return summarize(args, results, duration)


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 2)


def summarize(args: argparse.Namespace, results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    itls = [x for r in ok for x in r.itls]
    out_tokens = sum(r.output_tokens for r in ok)
    errors = [r.error for r in results if not r.ok]
    refused = [r for r in results if r.status == 503]
    overload = {}
    if refused:  # the server's in-flight limit was reached: how fast, and how, it said no
        overload = {"overload": {
            "refused_503": len(refused), "admitted": len(results) - len(refused),
            "refusal_ms": {"p50": _pct([r.latency for r in refused], 0.5),
                           "p99": _pct([r.latency for r in refused], 0.99),
                           "max": round(1000 * max(r.latency for r in refused), 2)},
            "refusals_with_retry_after": sum(r.retry_after is not None for r in refused),
            # goodput: what the admitted requests got done (a refused request takes nothing)
            "goodput_requests_per_s": round(len(ok) / duration, 3),
            "goodput_output_tokens_per_s": round(out_tokens / duration, 2),
            "admitted_failed": sum(1 for r in results if not r.ok and r.status != 503)}}
    return {
        "backend": args.backend, "base_url": args.base_url, "num_prompts": len(results),
        "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
        "completed": len(ok), "errors": len(errors), "first_errors": errors[:3],
        "duration_s": round(duration, 3),
        "request_throughput": round(len(ok) / duration, 3),
        "input_throughput": round(sum(r.prompt_len for r in ok) / duration, 2),
        "output_throughput": round(out_tokens / duration, 2),
        "ttft_ms": {"mean": round(1000 * statistics.fmean(ttfts), 2) if ttfts else None,
                    "p50": _pct(ttfts, 0.5), "p99": _pct(ttfts, 0.99)},
        "itl_ms": {"p50": _pct(itls, 0.5), "p99": _pct(itls, 0.99)},
        "e2e_ms": {"p50": _pct([r.latency for r in ok], 0.5), "p99": _pct([r.latency for r in ok], 0.99)},
        **overload,
    }


def hf_floor(args: argparse.Namespace, server_args: list[str]) -> dict:
    """HF `generate` on the same model, prompts and output lengths: offline, all requests
    present from the start, in batches of --hf-batch in arrival order (left-padded, greedy; a
    batch runs to its longest output and only each request's own tokens count). No arrival
    gaps and no streaming, so it bounds what HF would serve: a floor for the server."""
    import torch
    import transformers

    from treadle.runtime.model_source import resolve_model_source
    from treadle.runtime.tokenizer import load_tokenizer

    sp = argparse.ArgumentParser(add_help=False)
    for flag in ("--model-path", "--tokenizer-path", "--dtype", "--seed"):
        sp.add_argument(flag)
    known, _ = sp.parse_known_args(server_args)
    src = resolve_model_source(known.model_path, tokenizer_path=known.tokenizer_path)
    tok = load_tokenizer(src)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"auto": torch.bfloat16 if dev.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16}[known.dtype or "auto"]
    t0 = time.perf_counter()
    if src.kind == "dummy":
        d = src.config.to_hf_dict()
        cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
        torch.manual_seed(int(known.seed or 0))
        with torch.device(dev):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    elif src.kind == "gguf":
        import os

        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(src.path), gguf_file=os.path.basename(src.path), dtype=dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(src.path, dtype=dtype)
    model = model.to(dev).eval()
    load_s = time.perf_counter() - t0
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    work = make_workload(args)
    batches = [work[i:i + args.hf_batch] for i in range(0, len(work), args.hf_batch)]

    @torch.inference_mode()
    def run(batch: list[tuple[str, int, int]]) -> int:
        ids = [tok(p, add_special_tokens=False).input_ids for p, _, _ in batch]
        width = max(map(len, ids))
        x = torch.tensor([[pad] * (width - len(i)) + i for i in ids], device=dev)
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=dev)
        new = max(m for _, _, m in batch)
        model.generate(x, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=pad)
        return sum(m for _, _, m in batch)

    run(batches[0])  # warm-up: a full batch, untimed (as the server's first requests are not)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    useful = sum(run(b) for b in batches)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    duration = time.perf_counter() - start
    return {"what": "HF generate, offline batches", "hf_batch": args.hf_batch, "device": dev.type,
            "dtype": str(dtype).replace("torch.", ""), "transformers": transformers.__version__,
            "model_load_s": round(load_s, 2), "num_prompts": len(work), "duration_s": round(duration, 3),
            "request_throughput": round(len(work) / duration, 3), "output_throughput": round(useful / duration, 2)}


def flush(args: argparse.Namespace) -> None:
    """Empty the server's prefix cache (treadle's /flush_cache), so a run does not hit the
    prompts of the run before it; retried while requests still drain."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    for _ in range(120):
        if httpx.post(args.base_url + "/flush_cache", timeout=30, headers=headers).status_code == 200:
            return
        time.sleep(0.5)
    raise RuntimeError("the server did not flush its cache within 60 s")


def run_once(args: argparse.Namespace, server_args: list[str]) -> dict:
    """One benchmark run, launching treadle first when --launch is given; with
    --request-rates, one run per rate on the same server, its cache flushed before each."""
    if not args.launch:
        return run_rates(args)
    from treadle.runtime.server.testing import ServerProcess

    with ServerProcess(server_args) as srv:
        args.base_url = srv.url
        report = run_rates(args)
        info = httpx.get(srv.url + "/get_server_info", timeout=30, headers=(
            {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})).json()
        report["server"] = {"args": server_args, "cache_hit_rate": round(info["cache_hit_rate"], 4)}
        return report


def run_rates(args: argparse.Namespace) -> dict:
    if not args.request_rates:
        return asyncio.run(run_load(args))
    sweep = []
    for r in args.request_rates.split(","):
        args.request_rate = float(r)
        flush(args)
        sweep.append(asyncio.run(run_load(args)))
        print(json.dumps({k: sweep[-1][k] for k in ("request_rate", "completed", "output_throughput", "ttft_ms",
                                                     "itl_ms")}), flush=True)
    return {"sweep": sweep}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--backend", choices=["native", "openai"], default="native")
    p.add_argument("--model", default="default", help="model name sent to OpenAI-compatible servers")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once")
    p.add_argument("--max-concurrency", type=int, default=256)
    p.add_argument("--input-len-range", type=int, nargs=2, default=[32, 128], metavar=("MIN", "MAX"))
    p.add_argument("--output-len-range", type=int, nargs=2, default=[16, 64], metavar=("MIN", "MAX"))
    p.add_argument("--shared-prefix-len", type=int, default=0, help="words shared by every prompt (cache reuse)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (for servers without it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--output", default=None, help="also write the JSON report to this file")
    p.add_argument("--launch", action="store_true", help="start treadle (python -m treadle.runtime.launch_server)")
    p.add_argument("--server-args", default="--max-total-tokens 16384", help="flags for the launched server")
    p.add_argument("--compare-radix", action="store_true",
                   help="with --launch: run the workload with and without --disable-radix-cache")
    p.add_argument("--request-rates", default=None,
                   help="comma-separated rates (e.g. 8,16,inf): one run each on the same server, cache flushed between")
    p.add_argument("--warmup-requests", type=int, default=2, help="untimed requests before the load")
    p.add_argument("--hf-floor", action="store_true",
                   help="also time HF generate on the same model (--model-path in --server-args), prompts and lengths")
    p.add_argument("--hf-batch", type=int, default=32, help="HF floor batch size")
    args = p.parse_args()
    machine = machine_info(("torch", "transformers"))
    if args.compare_radix and args.request_rates:
        p.error("--compare-radix runs one rate (--request-rate)")
    if args.compare_radix and not args.launch:
        p.error("--compare-radix needs --launch (it starts the server twice)")
    server_args = shlex.split(args.server_args)
    if args.api_key:
        server_args += ["--api-key", args.api_key]
    if args.compare_radix:
        on = run_once(args, server_args)
        off = run_once(args, server_args + ["--disable-radix-cache"])
        report = {"radix_cache_on": on, "radix_cache_off": off,
                  "speedup_output_throughput": round(on["output_throughput"] / max(off["output_throughput"], 1e-9), 3),
                  "ttft_p50_ratio_off_over_on": (round(off["ttft_ms"]["p50"] / on["ttft_ms"]["p50"], 3)
                                                 if on["ttft_ms"]["p50"] and off["ttft_ms"]["p50"] else None)}
    else:
        report = run_once(args, server_args)
    if args.hf_floor:
        report["hf_floor"] = hf_floor(args, server_args)
        served = max([r["output_throughput"] for r in report["sweep"]] if "sweep" in report
                     else [report.get("radix_cache_on", report)["output_throughput"]])
        report["output_throughput_over_hf"] = round(served / max(report["hf_floor"]["output_throughput"], 1e-9), 2)
    report = {"command": shlex.join(["python"] + sys.argv), "machine": machine,
              "workload": {k: getattr(args, k) for k in ("num_prompts", "input_len_range", "output_len_range",
                                                          "shared_prefix_len", "temperature", "seed")},
              **report}
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
