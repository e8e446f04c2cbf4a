"""Cold compile time of the same grammars under two source trees, one after the other in one
command: the 10 schemas of bench_constrained.py and two EBNF grammars of bench_ebnf.py, each
through a fresh GrammarCompiler whose worker has already started. Used to measure a change
to the compile path against the commit before it.

    git worktree add /tmp/ab-old <commit>
    for t in old new; do mkdir -p /tmp/shim-$t/treadle; done
    for d in lang runtime radix_cache constrained kernels; do
      ln -sfn /tmp/ab-old/$d /tmp/shim-old/treadle/$d; ln -sfn $PWD/$d /tmp/shim-new/treadle/$d; done
    for t in old new old new; do PYTHONPATH=/tmp/shim-$t nice .venv/bin/python benchmarks/ab_compile_time.py; done
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

if __name__ == "__main__":
    import bench_ebnf
    from bench_constrained import SCHEMAS

    import treadle.constrained
    from treadle.constrained import GrammarCompiler, GrammarSpec
    from treadle.runtime.model_source import resolve_model_source
    from treadle.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model_source(None))
    specs = {k: GrammarSpec.from_params(json_schema=v) for k, v in SCHEMAS.items()}
    specs["ebnf_arithmetic"] = GrammarSpec("ebnf", bench_ebnf.GRAMMARS["arithmetic"])
    specs["ebnf_json_like"] = GrammarSpec("ebnf", bench_ebnf.GRAMMARS["json_like"])
    out: dict = {"tree": treadle.constrained.__path__[0]}
    for name, spec in specs.items():
        with GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok)) as c:
            c.compile(GrammarSpec("regex", "warm-up"))
            t0 = time.perf_counter()
            c.compile(spec)
            out[name] = round(time.perf_counter() - t0, 3)
    schemas = [out[k] for k in SCHEMAS]
    out["schemas_mean_s"] = round(sum(schemas) / len(schemas), 4)
    print(json.dumps(out), flush=True)
