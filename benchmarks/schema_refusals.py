"""Why treadle refuses real schemas, from the translation alone (no token index is built):
each schema of the corpus sample goes through the compile worker's first step
(``compiler.spec_regex``, default mode, holes as the compiler writes them, no size cap), and the
refusals are tallied by the keyword they name and the sub-reason (which pattern construct, which
``oneOf`` shape ...).

    python benchmarks/schema_refusals.py [--sample-file sample.json.gz] [--out tally.json]

Prints a JSON object: counts (translated / refused / crashed / timed out), ``by_keyword``,
``by_reason`` (keyword: sub-reason) and, with ``--examples``, one schema id per reason.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import resource
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _sample(args: argparse.Namespace) -> dict[str, Any]:
    if args.sample_file:
        opener = gzip.open if args.sample_file.endswith(".gz") else open
        with opener(args.sample_file, "rt", encoding="utf-8") as f:
            return json.load(f)
    import schema_corpus

    corpus = schema_corpus.load(args.dir)
    return {sid: corpus[sid] for sid in schema_corpus.sample(corpus, args.seed)}


def reason(msg: str) -> tuple[str, str]:
    """(keyword, sub-reason) of a refusal message, the specifics (paths, names, numbers) cut."""
    m = re.search(r"keyword '([^']+)'", msg)
    keyword = m.group(1) if m else "other"
    rest = msg[m.end():] if m else msg
    rest = re.sub(r"^ at \$\S*", "", rest)
    rest = re.sub(r"at \$\S*|'[^']*'|\"[^\"]*\"|\b\d+\b", "_", rest).strip(" :,.")
    return keyword, rest[:140]


class _TimedOut(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _TimedOut


def _one(sid: str, schema: Any, timeout_s: int, mode: str) -> dict:
    """One schema's translation outcome (the alarm may fire anywhere, hence the outer try)."""
    from treadle.constrained.compile.compiler import _holes_apply, spec_regex
    from treadle.constrained.compile.grammar import GrammarSpec

    t0 = time.perf_counter()
    try:
        signal.alarm(timeout_s)
        try:
            spec = GrammarSpec.from_params(json_schema=schema)
            regex = spec_regex(spec, None, mode, _holes_apply(spec), 3)
            rec = {"id": sid, "status": "translated", "chars": len(regex)}
        except ValueError as e:
            rec = {"id": sid, "status": "refused", "msg": str(e)[:600]}
        except MemoryError:
            rec = {"id": sid, "status": "oom"}
        except _TimedOut:
            raise
        except Exception as e:  # noqa: BLE001 - a crash is what this tally looks for
            rec = {"id": sid, "status": "crashed", "msg": f"{type(e).__name__}: {e}"[:600]}
        finally:
            signal.alarm(0)
    except _TimedOut:
        rec = {"id": sid, "status": "timeout"}
    rec["s"] = round(time.perf_counter() - t0, 3)
    return rec


def tally(schemas: dict[str, Any], timeout_s: int, mode: str, log: Any = None) -> tuple[dict, list[dict]]:
    signal.signal(signal.SIGALRM, _alarm)
    recs: list[dict] = []
    for sid, schema in schemas.items():
        rec = _one(sid, schema, timeout_s, mode)
        recs.append(rec)
        if log is not None:
            log.write(json.dumps(rec) + "\n")
            log.flush()
    counts = collections.Counter(r["status"] for r in recs)
    by_kw = collections.Counter()
    by_reason = collections.Counter()
    example: dict[str, str] = {}
    for r in recs:
        if r["status"] in ("refused", "crashed"):
            kw, why = reason(r["msg"]) if r["status"] == "refused" else ("crash", r["msg"][:140])
            by_kw[kw] += 1
            by_reason[f"{kw}: {why}"] += 1
            example.setdefault(f"{kw}: {why}", r["id"])
    out = {"schemas": len(recs), **{k: counts.get(k, 0) for k in ("translated", "refused", "crashed", "timeout", "oom")},
           "by_keyword": dict(by_kw.most_common()), "by_reason": dict(by_reason.most_common()),
           "example": example}
    return out, recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/schema-corpus/site")
    ap.add_argument("--sample-file", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", default="strict")
    ap.add_argument("--timeout", type=int, default=20)
    ap.add_argument("--memory-gb", type=float, default=6)
    ap.add_argument("--records", default="", help="also write every schema's outcome here (JSON lines)")
    ap.add_argument("--examples", action="store_true")
    ap.add_argument("--only", default="", help="a file of schema ids (one a line): run those alone")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    limit = int(args.memory_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    schemas = _sample(args)
    if args.only:
        keep = {line.strip() for line in open(args.only) if line.strip()}
        schemas = {k: v for k, v in schemas.items() if k in keep}
    t0 = time.time()
    log = open(args.records, "w") if args.records else None
    out, recs = tally(schemas, args.timeout, args.mode, log)
    out["seconds"] = round(time.time() - t0, 1)
    out["command"] = " ".join(["python", *sys.argv])
    if not args.examples:
        out.pop("example")
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
