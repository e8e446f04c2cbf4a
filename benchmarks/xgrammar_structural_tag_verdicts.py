"""The structural-tag formats of tests/test_structural_tag.py (FORMAT_CASES) run through
xgrammar: each text's verdict (complete / prefix / reject) from xgrammar's own matcher
against the one the test expects of treadle. The test's verdicts were written from xgrammar's;
this keeps them checkable (needs the ``bench`` extra: xgrammar).

    cd benchmarks && ../.venv/bin/python xgrammar_structural_tag_verdicts.py
"""
from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

from grammar_walks import smollm2_tokenizer  # benchmarks/grammar_walks.py

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    import xgrammar as xgr
    from test_structural_tag import FORMAT_CASES, fmt

    tok = smollm2_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=49152, stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info)
    texts = diffs = 0
    for name, (f, cases) in FORMAT_CASES.items():
        grammar = compiler.compile_structural_tag(json.dumps(fmt(f)))
        for text, want in cases.items():
            m = xgr.GrammarMatcher(grammar)
            got = "reject" if not m.accept_string(text) else "complete" if m.accept_token(tok.eos_token_id) else "prefix"
            texts += 1
            if got != want:
                diffs += 1
                print(f"{name}: {text!r} xgrammar {got}, treadle's test {want}")
    print(json.dumps({"xgrammar": version("xgrammar"), "formats": len(FORMAT_CASES), "texts": texts,
                      "differences": diffs}))


if __name__ == "__main__":
    main()
