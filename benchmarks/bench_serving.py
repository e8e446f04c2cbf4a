"""Online serving benchmark: a Poisson load generator against any treadle (native API) or
OpenAI-compatible server, reporting throughput and latency as one JSON object.

    # against a running server
    python benchmarks/bench_serving.py --base-url http://127.0.0.1:30000 --num-prompts 64 --request-rate 4
    # launch treadle itself, and compare the radix cache on vs off on a shared-prefix workload
    python benchmarks/bench_serving.py --launch --server-args "--max-total-tokens 16384" \
        --compare-radix --shared-prefix-len 200 --num-prompts 32

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
import time
from dataclasses import dataclass, field

import httpx

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
    chunks = 0
    try:
        async with client.stream("POST", args.base_url + path, json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    res.error = str(obj["error"])[:200]
                    return res
                if args.backend == "native":
                    text, res.output_tokens = obj["text"], obj["meta_info"]["completion_tokens"]
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
    }


def run_once(args: argparse.Namespace, server_args: list[str]) -> dict:
    """One benchmark run, launching treadle first when --launch is given."""
    if not args.launch:
        return asyncio.run(run_load(args))
    from treadle.runtime.server.testing import ServerProcess

    with ServerProcess(server_args) as srv:
        args.base_url = srv.url
        report = asyncio.run(run_load(args))
        info = httpx.get(srv.url + "/get_server_info", timeout=30, headers=(
            {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})).json()
        report["server"] = {"args": server_args, "cache_hit_rate": round(info["cache_hit_rate"], 4)}
        return report


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
    args = p.parse_args()
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
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
