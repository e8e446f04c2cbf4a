"""Real JSON schemas compiled by treadle (default mode), xgrammar and outlines-core, on the same
schemas and the same vocabulary (SmolLM2's tokenizer, as the project loads it); treadle's
compiled grammars walked at random and every text validated against the original schema.

    python benchmarks/schema_corpus.py install            # the corpus, into /tmp/schema-corpus/site
    pip install --target /tmp/schema-corpus/xgr --no-deps xgrammar apache-tvm-ffi   # the bench extra
    PYTHONPATH=/tmp/schema-corpus/xgr python benchmarks/bench_schema_corpus.py \
        --out benchmarks/results/schema_corpus_cpu.json

Every compile is bounded: treadle's through its own ``GrammarCompiler`` (a worker process with
``--memory-gb`` of address space, killed after ``--timeout`` seconds), the peers' in a child
process of this script with the same two bounds (outlines-core can take tens of GB). Outcomes:
compiled / refused (an error naming the problem, grouped by the keyword it names) / timed out /
out of memory / crashed (the process died otherwise), and compile seconds p50 / p90 / max over the
compiled ones. Walks: ``--walks`` random token paths through each treadle grammar (benchmarks/
grammar_walks.py); a finished walk's text must validate under ``jsonschema.validators.
validator_for(schema)`` with its format checker (date-time, time, duration and hostname checked
here where jsonschema's own checkers need packages this environment lacks); one that does not is
"unsound". ``--pydantic`` adds schema_corpus.py's ``pydantic`` source.

``--engine N``: N compiled schemas (seeded) through ``treadle.Engine`` with the embedded model,
each greedy and sampled, in one batch with unconstrained requests; every finished output must
validate. Outcomes go to ``--state`` (JSON lines per engine), so an interrupted run resumes;
``--every K`` / ``--limit N`` take a sub-sample for quick iterations.
"""
from __future__ import annotations

import argparse
import calendar
import collections
import gzip
import hashlib
import json
import os
import pickle
import random
import re
import resource
import select
import struct
import subprocess
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import schema_corpus  # noqa: E402

ENGINES = ("treadle", "xgrammar", "outlines")
_HEADER = struct.Struct("<Q")


# ---------------------------------------------------------------- the peers' child process

def _with_ecma_patterns(cls: Any) -> Any:
    """``cls`` reading ``pattern`` with the ``regex`` module, which knows ECMA's ``\\p{L}``
    (Python's ``re``, jsonschema's reader, raises on it); other patterns read as ``re`` does.
    The key patterns of patternProperties (and of the additional / unevaluated properties
    they leave) are read with it too: jsonschema's modules that search them use it instead
    of ``re`` in this process."""
    import jsonschema
    import jsonschema._keywords
    import jsonschema._legacy_keywords
    import jsonschema._utils
    import regex

    for module in (jsonschema._keywords, jsonschema._legacy_keywords, jsonschema._utils):
        module.re = regex  # (their one use of it: re.search)

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Any:
        if validator.is_type(instance, "string") and not regex.search(patrn, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")

    return jsonschema.validators.extend(cls, {"pattern": pattern})


# RFC 3339's date-time, time and duration and RFC 1123's hostname, checked here where
# jsonschema's own checkers need packages this environment may lack (rfc3339-validator,
# isoduration, fqdn): without them those formats went unchecked and a walk writing
# "2021-02-30T25:00:00Z" would have passed. Each is added only for the drafts that define it.
_DATE = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
_TIME = r"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DURATION = re.compile(r"P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:%s)?|%s|[0-9]+W)"
                       % (_DUR_TIME, _DUR_TIME), re.ASCII)
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)


def _time_ok(m: Any, at: int) -> bool:
    h, mi, sec, sign, oh, om = (m.group(at + i) for i in range(6))
    h, mi, sec = int(h), int(mi), int(sec)
    if h > 23 or mi > 59 or sec > 60 or sign and (int(oh) > 23 or int(om) > 59):
        return False
    if sec == 60:  # a leap second: only at 23:59:60 UTC
        off = 0 if not sign else (1 if sign == "+" else -1) * (int(oh) * 60 + int(om))
        return (h * 60 + mi - off) % 1440 == 1439
    return True


def _date_time(value: Any) -> bool:
    m = re.fullmatch(_DATE + "[Tt]" + _TIME, value, re.ASCII) if isinstance(value, str) else None
    if m is None:
        return not isinstance(value, str)
    y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
    return 1 <= mo <= 12 and 1 <= d <= calendar.monthrange(max(y, 1), mo)[1] and _time_ok(m, 4)


def _time(value: Any) -> bool:
    m = re.fullmatch(_TIME, value, re.ASCII) if isinstance(value, str) else None
    return not isinstance(value, str) if m is None else _time_ok(m, 1)


def _duration(value: Any) -> bool:
    return not isinstance(value, str) or _DURATION.fullmatch(value) is not None


def _hostname(value: Any) -> bool:
    if not isinstance(value, str):
        return True
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


_STRICT_FORMATS = {"date-time": (_date_time, 4), "hostname": (_hostname, 4), "time": (_time, 7),
                   "duration": (_duration, 2019)}
_DRAFT_OF = {"draft-03": 3, "draft-04": 4, "draft-06": 6, "draft-07": 7, "2019-09": 2019, "2020-12": 2020}


def _format_checker(cls: Any) -> Any:
    """``cls``'s format checker, with the formats above checked where it leaves them out."""
    import jsonschema

    own = cls.FORMAT_CHECKER
    uri = str(cls.META_SCHEMA.get("$id", cls.META_SCHEMA.get("id", "")))
    draft = next((n for name, n in _DRAFT_OF.items() if name in uri), 2020)
    checker = jsonschema.FormatChecker(())
    checker.checkers = dict(own.checkers)
    for fmt, (fn, since) in _STRICT_FORMATS.items():
        if fmt not in checker.checkers and draft >= since:
            checker.checks(fmt)(fn)
    return checker


def _send(f: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEADER.pack(len(data)) + data)
    f.flush()


def _recv(f: Any) -> Any:
    head = f.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (n,) = _HEADER.unpack(head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def _child(engine: str, memory_bytes: int) -> None:
    """A peer's compile loop: schema text in, (status, seconds, message) out."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr
    from grammar_walks import smollm2_tokenizer

    tok = smollm2_tokenizer()
    eos = [tok.eos_token_id]
    if engine == "xgrammar":
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=49152, stop_token_ids=eos)
        comp = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

        def compile_one(text: str) -> None:
            # compact output, as treadle's default; strict_mode (no undeclared members) is its default
            comp.compile_json_schema(text, any_whitespace=False)
    else:
        from outlines_core import Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema

        from treadle.constrained import token_bytes_table

        groups: dict[bytes, list[int]] = {}
        for tid, b in enumerate(token_bytes_table(tok)):
            if b and tid not in eos:
                groups.setdefault(b, []).append(tid)
        vocab = Vocabulary(eos[0], groups)

        def compile_one(text: str) -> None:
            Index(build_regex_from_schema(text, None), vocab)  # compact output, as treadle's default
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    _send(stdout, ("ready",))
    while True:
        try:
            text = _recv(stdin)
        except EOFError:
            return
        t0 = time.perf_counter()
        try:
            compile_one(text)
        except MemoryError:
            _send(stdout, ("oom", time.perf_counter() - t0, "MemoryError"))
            continue
        except BaseException as e:  # noqa: BLE001 - the peer's refusal, reported as such
            msg = f"{type(e).__name__}: {e}"
            oom = "bad_alloc" in msg or "memory" in msg.lower() and "Error" in type(e).__name__
            _send(stdout, ("oom" if oom else "refused", time.perf_counter() - t0, msg[:600]))
            continue
        _send(stdout, ("compiled", time.perf_counter() - t0, ""))


class PeerRunner:
    """A peer's child process, restarted after a timeout or a crash."""

    def __init__(self, engine: str, timeout_s: float, memory_bytes: int) -> None:
        self.engine, self.timeout_s, self.memory = engine, timeout_s, memory_bytes
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", self.engine,
                                      "--memory-gb", str(self.memory / (1 << 30))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if not select.select([self.proc.stdout], [], [], 300)[0]:
            raise RuntimeError(f"{self.engine} child did not start")
        assert _recv(self.proc.stdout)[0] == "ready"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def compile(self, text: str) -> dict:
        if self.proc is None:
            self._start()
        assert self.proc is not None
        t0 = time.perf_counter()
        _send(self.proc.stdin, text)
        if not select.select([self.proc.stdout], [], [], self.timeout_s)[0]:
            self.stop()
            return {"status": "timeout", "s": round(time.perf_counter() - t0, 3)}
        try:
            status, seconds, msg = _recv(self.proc.stdout)
        except EOFError:
            code = self.proc.wait()
            self.proc = None
            return {"status": "oom" if code in (-9, -6) else "crashed", "s": round(time.perf_counter() - t0, 3),
                    "msg": f"exit code {code}"}
        if status == "oom":
            self.stop()  # a process that ran out of memory is not trusted further
        return {"status": status, "s": round(seconds, 4), "msg": msg}


# ---------------------------------------------------------------- treadle

class TreadleRunner:
    """treadle's GrammarCompiler in its default mode, bounded by its own worker process."""

    def __init__(self, timeout_s: float, memory_bytes: int, walks: int, steps: int) -> None:
        from grammar_walks import smollm2_tokenizer

        from treadle.constrained import GrammarCompiler, allocate_token_bitmask

        self.tok = smollm2_tokenizer()
        self.eos = [self.tok.eos_token_id]
        self.compiler = GrammarCompiler(self.tok, self.eos, vocab_size=49152, timeout_s=timeout_s,
                                        memory_limit_bytes=memory_bytes, max_workers=1)
        self.bitmask = allocate_token_bitmask(1, 49152)
        self.walks, self.steps = walks, steps

    def compile(self, sid: str, schema: Any) -> tuple[dict, Any]:
        from treadle.constrained import GrammarSpec

        spec = GrammarSpec.from_params(json_schema=schema)
        t0 = time.perf_counter()
        try:
            grammar = self.compiler.compile(spec)
        except ValueError as e:
            s, msg = time.perf_counter() - t0, str(e)
            status = ("timeout" if "timed out after" in msg else
                      "oom" if "out of memory" in msg or "memory limit" in msg else
                      "crashed" if "internal error" in msg or "crashed" in msg else "refused")
            return {"status": status, "s": round(s, 4), "msg": msg[:600]}, None
        return {"status": "compiled", "s": round(time.perf_counter() - t0, 4)}, grammar

    def walk(self, sid: str, schema: Any, grammar: Any) -> dict:
        """``self.walks`` random walks of ``grammar``; each finished text validated."""
        from grammar_walks import DeadEnd, random_text
        from jsonschema.validators import validator_for

        cls = _with_ecma_patterns(validator_for(schema))
        validator = cls(schema, format_checker=_format_checker(cls))
        rng = random.Random(int(hashlib.sha256(sid.encode()).hexdigest()[:12], 16))
        out = {"walks": 0, "unfinished": 0, "unsound": 0}
        t0 = time.perf_counter()
        for _ in range(self.walks):
            try:
                text = random_text(grammar.matcher(), self.bitmask, self.compiler.token_bytes, self.eos[0], rng,
                                   steps=self.steps)
            except (DeadEnd, UnicodeDecodeError) as e:
                out["walks"] += 1
                out["unsound"] += 1
                out.setdefault("examples", []).append({"text": "", "why": f"{type(e).__name__}: {e}"[:2000]})
                continue
            if text is None:
                out["unfinished"] += 1
                continue
            out["walks"] += 1
            try:
                value = json.loads(text)
                error = next(iter(validator.iter_errors(value)), None)
                why = None if error is None else f"{error.message[:200]} at {error.json_path}"
            except ValueError as e:
                why = f"not JSON: {e}"
            if why is not None:
                out["unsound"] += 1
                out.setdefault("examples", []).append({"text": text[:2000], "why": why})
        out["walk_s"] = round(time.perf_counter() - t0, 3)
        return out

    def close(self) -> None:
        self.compiler.close()


# ---------------------------------------------------------------- summaries

def _reason(engine: str, msg: str) -> str:
    """A refusal grouped by the keyword it names (or its message with the specifics cut)."""
    if "max_grammar_size" in msg:
        return "too large (max_grammar_size)"
    m = re.search(r"keyword '([^']+)'", msg)
    if m:
        return m.group(1)
    m = re.search(r"Unsupported JSON Schema structure (\{\"(\$?\w+)\"|\w+|\[)", msg)  # outlines-core
    if m:
        return "structure " + (m.group(2) or m.group(1))
    m = re.search(r"Format (\S+) is not supported", msg)
    if m:
        return "format " + re.sub(r"^AWS::.*", "AWS::...", m.group(1))
    msg = re.sub(r"^\w+Error: (\[[\d:]+\] \S+:\d+: )?", "", msg.split("\n")[0])  # xgrammar's source location
    return re.sub(r"at \$\S*|'[^']*'|\"[^\"]*\"|\d+", "_", msg)[:80]


def _pct(a: list[float], q: float) -> float | None:
    return round(float(np.percentile(a, q)), 4) if a else None


def summarize(engine: str, recs: list[dict]) -> dict:
    counts = collections.Counter(r["status"] for r in recs)
    times = [r["s"] for r in recs if r["status"] == "compiled"]
    reasons = collections.Counter(_reason(engine, r.get("msg", "")) for r in recs if r["status"] == "refused")
    by_source: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in recs:
        by_source[r["id"].split("/", 1)[0]][r["status"]] += 1
    out = {"schemas": len(recs), **{k: counts.get(k, 0) for k in ("compiled", "refused", "timeout", "oom", "crashed")},
           "compiled_share": round(counts.get("compiled", 0) / max(len(recs), 1), 4),
           "compile_s": {"p50": _pct(times, 50), "p90": _pct(times, 90), "max": max(times, default=None)},
           "slowest_any_s": max((r["s"] for r in recs), default=None),
           "by_source": {k: dict(v) for k, v in sorted(by_source.items())},
           "refused_by_reason": dict(reasons.most_common())}
    if engine == "treadle":
        walked = [r for r in recs if "walks" in r]
        out["soundness"] = {"schemas_walked": len(walked), "walks_finished": sum(r["walks"] for r in walked),
                            "walks_unfinished": sum(r["unfinished"] for r in walked),
                            "unsound_walks": sum(r["unsound"] for r in walked),
                            "unsound_schemas": [r["id"] for r in walked if r["unsound"]]}
    return out


# ---------------------------------------------------------------- the model

def engine_check(corpus: dict, compiled: list[str], n: int, seed: int, max_new: int, max_compile_s: float) -> dict:
    """``n`` of the ``compiled`` schemas (seeded) through ``treadle.runtime.Engine`` with the
    embedded model, each once greedy and once sampled, shuffled into one batch with unconstrained
    requests. A reply that ended (EOS, not ``max_new``) must parse and validate; one cut at
    ``max_new`` is counted apart (its text is a prefix, not a value)."""
    from jsonschema.validators import validator_for

    from treadle.runtime import Engine

    rng = random.Random(seed)
    pick = rng.sample(sorted(compiled), min(n, len(compiled)))
    jobs: list[tuple[str | None, str, dict]] = []
    for i, sid in enumerate(pick):
        schema = corpus[sid]
        ask = f"Reply with one JSON value valid under this JSON schema ({sid.split('/')[0]}): "
        ask += json.dumps(schema)[:300]
        jobs.append((sid, ask, {"json_schema": schema, "max_new_tokens": max_new, "temperature": 0}))
        jobs.append((sid, ask, {"json_schema": schema, "max_new_tokens": max_new, "temperature": 1.0, "seed": i}))
        if i % 4 == 0:
            jobs.append((None, "Tell me about the sea.", {"max_new_tokens": 32, "temperature": 0.7, "seed": i}))
    rng.shuffle(jobs)
    out: dict[str, Any] = {"schemas": len(pick), "requests": len(jobs), "valid": 0, "invalid": 0, "cut_at_max_new": 0,
                           "failed": 0, "unconstrained_ok": 0, "max_new_tokens": max_new, "invalid_examples": []}
    t0 = time.perf_counter()
    with Engine(grammar_compile_timeout_s=max_compile_s) as engine:
        chat = [engine.tokenizer.apply_chat_template([{"role": "user", "content": a}], tokenize=False,
                                                     add_generation_prompt=True) for _, a, _ in jobs]
        try:
            results = engine.generate(chat, [p for _, _, p in jobs])
        except ValueError as e:  # one bad request fails the call: report it, do not hide it
            out["error"] = str(e)[:500]
            return out
    out["seconds"] = round(time.perf_counter() - t0, 1)
    for (sid, _, _), res in zip(jobs, results):
        if sid is None:
            out["unconstrained_ok"] += bool(res.get("text"))
            continue
        reason = res["meta_info"]["finish_reason"]
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind == "length":
            out["cut_at_max_new"] += 1
            continue
        if kind not in ("stop",):
            out["failed"] += 1
            out["invalid_examples"].append({"id": sid, "finish": str(reason)[:300]})
            continue
        schema = corpus[sid]
        cls = _with_ecma_patterns(validator_for(schema))
        try:
            error = next(iter(cls(schema, format_checker=_format_checker(cls)).iter_errors(json.loads(res["text"]))), None)
            why = None if error is None else f"{error.message[:200]} at {error.json_path}"
        except ValueError as e:
            why = f"not JSON: {e}"
        if why is None:
            out["valid"] += 1
        else:
            out["invalid"] += 1
            out["invalid_examples"].append({"id": sid, "text": res["text"][:2000], "why": why})
    return out


# ---------------------------------------------------------------- the run

def _load_state(path: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if os.path.exists(path):
        for line in open(path):
            if line.strip():
                r = json.loads(line)
                out[r["id"]] = r
    return out


def run(args: argparse.Namespace) -> dict:
    if args.sample_file:  # schema_corpus.py dump: the sample alone, for a machine without the corpus
        with gzip.open(args.sample_file, "rt", encoding="utf-8") as f:
            corpus = json.load(f)
        ids = list(corpus)
    else:
        corpus = schema_corpus.load(args.dir, pydantic_models=args.pydantic)
        ids = schema_corpus.sample(corpus, args.seed)
    ids = ids[args.shard::args.every][: args.limit or None]
    os.makedirs(args.state, exist_ok=True)
    report: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "seed": args.seed,
                              "sample": len(ids), "timeout_s": args.timeout, "memory_gb": args.memory_gb,
                              "walks_per_schema": args.walks, "walk_steps": args.steps, "engines": {}}
    for engine in [e for e in args.engines.split(",") if e]:
        path = os.path.join(args.state, f"{engine}{args.state_suffix}.jsonl")
        done = {} if args.fresh else _load_state(path)
        if args.summarize:  # the report of outcomes already in --state (e.g. shards run elsewhere)
            recs = [done[i] for i in ids if i in done]
            report["engines"][engine] = {**summarize(engine, recs), "not_run": len(ids) - len(recs)}
            continue
        todo = [i for i in ids if i not in done]
        runner: Any = (TreadleRunner(args.timeout, int(args.memory_gb * (1 << 30)), args.walks, args.steps)
                       if engine == "treadle" else PeerRunner(engine, args.timeout, int(args.memory_gb * (1 << 30))))
        t0 = time.time()
        with open(path, "a" if not args.fresh else "w") as f:
            for n, sid in enumerate(todo):
                schema = corpus[sid]
                if engine == "treadle":
                    rec, grammar = runner.compile(sid, schema)
                    if grammar is not None and args.walks:
                        rec.update(runner.walk(sid, schema, grammar))
                else:
                    rec = runner.compile(json.dumps(schema))
                rec["id"] = sid
                done[sid] = rec
                f.write(json.dumps(rec) + "\n")
                f.flush()
                if n % 50 == 0:
                    print(f"{engine}: {n}/{len(todo)} {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
        (runner.close if engine == "treadle" else runner.stop)()
        report["engines"][engine] = summarize(engine, [done[i] for i in ids])
    if args.engine_check:
        done = _load_state(os.path.join(args.state, f"treadle{args.state_suffix}.jsonl"))
        ok = [i for i in ids if done.get(i, {}).get("status") == "compiled" and done[i]["s"] <= args.engine_max_compile_s]
        report["engine_check"] = engine_check(corpus, ok, args.engine_check, args.seed, args.max_new, args.timeout)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=schema_corpus.DEFAULT_DIR, help="the corpus (schema_corpus.py install)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pydantic", action="store_true",
                    help="also schema_corpus.py's pydantic source (Pydantic models of installed packages)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per compile")
    ap.add_argument("--memory-gb", type=float, default=4.0, help="address space per compile process")
    ap.add_argument("--walks", type=int, default=8, help="random walks per treadle grammar")
    ap.add_argument("--steps", type=int, default=1000, help="tokens per walk at most")
    ap.add_argument("--sample-file", default="", help="the sample from schema_corpus.py dump (instead of --dir)")
    ap.add_argument("--every", type=int, default=1, help="every K-th schema of the sample")
    ap.add_argument("--shard", type=int, default=0, help="start at the K-th schema (with --every: one of K shards)")
    ap.add_argument("--limit", type=int, default=0, help="at most N schemas")
    ap.add_argument("--state", default="/tmp/schema-corpus/state", help="per-engine outcomes (resumable)")
    ap.add_argument("--state-suffix", default="", help="a shard's own state file name suffix")
    ap.add_argument("--summarize", action="store_true", help="only report the outcomes already in --state")
    ap.add_argument("--fresh", action="store_true", help="ignore outcomes already in --state")
    ap.add_argument("--out", default="", help="also write the JSON report here")
    ap.add_argument("--engine-check", type=int, default=0,
                    help="N compiled schemas through treadle's Engine with the embedded model (greedy + sampled)")
    ap.add_argument("--engine-max-compile-s", type=float, default=5.0,
                    help="--engine-check draws from schemas that compiled within this many seconds")
    ap.add_argument("--max-new", type=int, default=256, help="--engine-check: max_new_tokens")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, int(args.memory_gb * (1 << 30)))
        return
    report = run(args)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
