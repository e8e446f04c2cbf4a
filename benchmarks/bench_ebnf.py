"""EBNF grammars (GBNF dialect: constrained/ebnf/ebnf.py) on CPU, SmolLM2 vocab, treadle vs xgrammar
in one run, per grammar (arithmetic, a right-recursive list, SQL SELECT, CSV, JSON-like, the
JSON-like one with strings spelled as runs of a class, which xgrammar walks much faster, JSON
with whitespace, s-expressions with items apart and side by side, nested function calls):

1. time to a usable grammar (compile + first mask), cold, three ways: treadle as it serves
   (nesting recursion as calls where it can, ebnf_calls.py; else unrolled), treadle with the
   recursion unrolled 3 levels (the regex it used before calls, compiled the same way), each
   through a fresh ``GrammarCompiler`` (its worker started beforehand on a trivial regex, so
   the figure is the grammar's own compile: EBNF -> regex -> token FSM), with the regex's size;
   xgrammar ``compile_grammar`` with its cache off;
2. per-token time (fill bitmask + accept) walking 3 documents per grammar as the tokenizer
   writes them, plus EOS: treadle's first walk (mask rows built lazily) and warm walks over
   the documents it accepts, xgrammar warm;
3. the documents each accepts, and the text up to the token treadle refuses: each nesting
   grammar has one document 5-6 levels deep, past what the unrolled regex allows; and, along
   the documents both accept, the steps where the two token masks differ (special tokens
   such as ``<|im_start|>`` counted apart).

    cd benchmarks && nice ../.venv/bin/python bench_ebnf.py [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from figures import emit, write_results  # benchmarks/figures.py
from grammar_walks import stats_us, walk, warm_walks, xgrammar_uncached  # benchmarks/grammar_walks.py
from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

GRAMMARS = {
    "arithmetic": r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
''',
    "shopping_list": r'''
root ::= list
list ::= item ", " list | item
item ::= qty " " word (" " word)*
qty  ::= [1-9] [0-9]*
word ::= [a-z]+
''',
    "sql_select": r'''
root    ::= "SELECT " columns " FROM " ident where? order? limit
columns ::= "*" | ident (", " ident)*
where   ::= " WHERE " cond ((" AND " | " OR ") cond)*
cond    ::= ident " " op " " value
op      ::= "=" | "!=" | "<>" | "<" | "<=" | ">" | ">="
value   ::= number | "'" [^'\n]* "'"
number  ::= "-"? [0-9]+ ("." [0-9]+)?
order   ::= " ORDER BY " ident (" ASC" | " DESC")? (", " ident (" ASC" | " DESC")?)*
limit   ::= " LIMIT " [0-9]+
ident   ::= [a-z_] [a-z0-9_]*
''',
    "csv": r'''
root   ::= header ("\n" row)+ "\n"?
header ::= name ("," name)*
name   ::= [A-Za-z_] [A-Za-z0-9_]*
row    ::= field ("," field)*
field  ::= bare | quoted
bare   ::= [^,"\n]*
quoted ::= "\"" ([^"] | "\"\"")* "\""
''',
    "json_like": r'''
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" (member ("," member)*)? "}"
member ::= string ":" value
array  ::= "[" (value ("," value)*)? "]"
string ::= "\"" ([^"\\] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
''',
}
# the same language, strings spelled as runs of a class (llama.cpp's json.gbnf spells them like
# json_like, a repetition of single characters, which xgrammar checks token by token at run time)
GRAMMARS["json_like_runs"] = GRAMMARS["json_like"].replace(
    r'''string ::= "\"" ([^"\\] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""''',
    r'''string ::= "\"" [^"\\]* ("\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) [^"\\]*)* "\""''')
assert GRAMMARS["json_like_runs"] != GRAMMARS["json_like"]
# JSON with whitespace anywhere between tokens (pretty-printed output), s-expressions with
# items apart and side by side, and nested function calls (a call may begin after a space
# with a word: ~21k tokens can cross into one, decided in bulk, json_holes.py's simple_entries)
GRAMMARS["json_ws"] = r'''
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws (member (ws "," ws member)*)? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws (value (ws "," ws value)*)? ws "]"
string ::= "\"" [^"\\]* "\""
number ::= "-"? [0-9]+ ("." [0-9]+)?
ws     ::= [ \t\n]*
'''
GRAMMARS["sexp"] = r'''
root ::= sexp
sexp ::= atom | "(" ws? (sexp (ws sexp)*)? ws? ")"
atom ::= [a-z+*/<>=-]+ | [0-9]+
ws   ::= [ \n]+
'''
GRAMMARS["sexp_juxt"] = r'''
root ::= sexp
sexp ::= atom | "(" sexp* ")"
atom ::= [a-z]+
'''
GRAMMARS["function_calls"] = r'''
root ::= expr
expr ::= name "(" (expr (", " expr)*)? ")" | [0-9]+ | "\"" [^"]* "\""
name ::= [a-z_]+
'''
_GROCERIES = ["apples", "bread", "eggs", "milk", "rice", "olive oil", "red onions", "tea", "butter", "lemons",
              "green beans", "salt", "flour", "oats", "dark chocolate", "carrots", "honey", "garlic", "pasta", "leeks"]
DOCS = {
    "arithmetic": [
        "12+3*4-5",
        "(1+2)*((30-4)/5)",
        "(((((1+2)*3)-4)/5)+6)*7",  # 5 levels of parentheses
    ],
    "shopping_list": [
        "2 apples, 1 bread, 6 eggs",
        "1 olive oil, 3 red onions, 12 free range eggs, 2 dark chocolate",
        ", ".join(f"{i % 9 + 1} {w}" for i, w in enumerate(_GROCERIES * 2)),  # 40 items: the exact loop
    ],
    "sql_select": [
        "SELECT * FROM users LIMIT 10",
        "SELECT id, name, email FROM customers WHERE country = 'NO' AND age >= 18 LIMIT 50",
        "SELECT order_id, total FROM orders WHERE status != 'cancelled' OR total > 99.5 AND region = 'eu_west' "
        "ORDER BY total DESC, order_id LIMIT 100",
    ],
    "csv": [
        "name,qty,price\napple,3,0.5\nbread,1,2.25\n",
        'id,title,note\n1,"Hello, world","said ""hi"""\n2,plain,\n3,"two\nlines",x',
        "date,city,temp_c,rain_mm\n" + "".join(f"2026-01-{d:02d},Oslo,{d - 8},{d * 0.3:.1f}\n" for d in range(1, 13)),
    ],
    "json_like": [
        '{"name":"Ann","age":31,"tags":["a","b"]}',
        '[{"id":1,"ok":true,"pos":[1.5,-2e3]},{"id":2,"ok":false,"note":"say \\"hi\\" \\u00e9"},null]',
        '{"a":{"b":{"c":{"d":{"e":1}}}}}',  # 5 levels of objects
    ],
}
DOCS["json_like_runs"] = DOCS["json_like"]
DOCS["json_ws"] = [
    '{\n  "name": "Ann",\n  "age": 31,\n  "tags": [\n    "a",\n    "b"\n  ]\n}',
    '[\n  {\n    "id": 1,\n    "pos": [1.5, -2]\n  },\n  {\n    "id": 2,\n    "ok": false\n  }\n]',
    '{\n  "a": {\n    "b": {\n      "c": {\n        "d": {\n          "e": 1\n        }\n      }\n    }\n  }\n}',
]
DOCS["sexp"] = [
    "(define (square x) (* x x))",
    "(if (< n 2) 1 (* n (fact (- n 1))))",
    "(a (b (c (d (e f)))))",  # 5 levels
]
DOCS["sexp_juxt"] = [
    "(define(square(x))(mul(x)(x)))",
    "(if(lt(n)(two))(one)(mul(n)(fact(sub(n)(one)))))",
    "(a(b(c(d(e(f))))))",  # 6 levels
]
DOCS["function_calls"] = [
    'send_email("ann", subject("hi"), body(greeting("Ann"), 3))',
    'max(min(1, 2), abs(sub(3, mul(4, 5))))',
    'a(b(c(d(e(1)))))',  # 5 levels
]
def nesting(text: str) -> int:
    """Deepest bracket nesting (``( [ {``) outside double-quoted strings."""
    d = best = 0
    in_str = esc = False
    for c in text:
        if in_str:
            esc, in_str = (False, True) if esc else (c == "\\", c != '"')
        elif c == '"':
            in_str = True
        elif c in "([{":
            d += 1
            best = max(best, d)
        elif c in ")]}":
            d -= 1
    return best


def refused_at(m, path: list[int], tok) -> str | None:
    """The text up to and including the first token ``m`` refuses along ``path`` (None: all accepted)."""
    for i, t in enumerate(path):
        if not m.accept_token(t):
            return tok.decode(path[: i + 1])
    return None


def mask_diff(make_a, make_b, path: list[int], bm_a, bm_b, vocab: int, special: set[int], tok) -> dict:
    """Walk ``path`` with both matchers (a: treadle, b: xgrammar): the steps whose token masks
    differ, and the tokens allowed by one only, summed over steps, special tokens (``<|im_start|>``
    and the like) apart; the first step that differs in other tokens."""
    import torch

    from treadle.constrained import bitmask_to_bool

    a, b = make_a(), make_b()
    sp = torch.zeros(vocab, dtype=torch.bool)
    sp[sorted(special)] = True
    out = {"steps": len(path), "steps_differ": 0, "only_treadle": 0, "only_xgrammar": 0,
           "only_xgrammar_special": 0, "only_treadle_special": 0, "first_other": None}
    for i, t in enumerate(path):
        a.fill_next_token_bitmask(bm_a, 0)
        b.fill_next_token_bitmask(bm_b, 0)
        x, y = bitmask_to_bool(bm_a, vocab)[0], bitmask_to_bool(bm_b, vocab)[0]
        if not torch.equal(x, y):
            oa, ob = x & ~y, y & ~x
            out["steps_differ"] += 1
            out["only_treadle"] += int((oa & ~sp).sum())
            out["only_xgrammar"] += int((ob & ~sp).sum())
            out["only_treadle_special"] += int((oa & sp).sum())
            out["only_xgrammar_special"] += int((ob & sp).sum())
            if out["first_other"] is None and bool(((oa | ob) & ~sp).any()):
                out["first_other"] = {
                    "after": tok.decode(path[:i]),
                    "only_treadle": tok.convert_ids_to_tokens((oa & ~sp).nonzero().flatten().tolist()[:8]),
                    "only_xgrammar": tok.convert_ids_to_tokens((ob & ~sp).nonzero().flatten().tolist()[:8])}
        if not (a.accept_token(t) and b.accept_token(t)):
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="warm walks over the documents")
    ap.add_argument("--timeout", type=float, default=60.0, help="treadle compile timeout (seconds)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "ebnf_cpu.json"))
    args = ap.parse_args()

    from treadle.constrained import GrammarSpec, allocate_token_bitmask
    from treadle.constrained.compile.compiler import GrammarCompiler
    from treadle.constrained.ebnf.ebnf import ebnf_to_regex
    from treadle.runtime.model_source import resolve_model_source
    from treadle.runtime.tokenizer import load_tokenizer

    info = machine_info(("torch", "outlines_core", "xgrammar", "transformers"))
    tok = load_tokenizer(resolve_model_source(None))
    eos, V = [tok.eos_token_id], len(tok)
    bm = allocate_token_bitmask(1, V)
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special and i not in eos}
    xgr, xcomp, xbm = xgrammar_uncached(tok, V, eos)

    for name, text in GRAMMARS.items():
        docs = DOCS[name]
        paths = [tok.encode(d, add_special_tokens=False) + eos for d in docs]
        emit({"figure": "documents", "grammar": name, "nesting": [nesting(d) for d in docs],
              "chars": [len(d) for d in docs], "tokens": [len(p) for p in paths]})

        # ------------------------------------------------------------ treadle
        g = None
        for lib in ("treadle", "treadle, unrolled 3 levels"):
            t0 = time.perf_counter()
            comp = GrammarCompiler(tok, eos, vocab_size=V, timeout_s=args.timeout)
            comp.compile(GrammarSpec.from_params(regex="a"))  # the worker process is up and has the vocabulary
            worker_s = time.perf_counter() - t0
            gl = None
            try:
                t0 = time.perf_counter()
                if lib == "treadle":
                    spec = GrammarSpec("ebnf", text)
                else:  # the regex treadle built before calls, through the same compiler
                    spec = GrammarSpec.from_params(regex=ebnf_to_regex(text))
                gl = comp.compile_async(spec).result()
                gl.matcher().fill_next_token_bitmask(bm, 0)
                emit({"figure": "time_to_grammar", "grammar": name, "lib": lib,
                      "seconds": round(time.perf_counter() - t0, 4), "index_build_s": round(gl.compile_time_s, 4),
                      "regex_chars": len(gl.regex), "calls": gl.holes is not None,
                      "tokens_that_can_cross_a_call": len(gl.holes.candidates) if gl.holes else None,
                      "worker_start_s_not_counted": round(worker_s, 2)})
            except Exception as e:  # a refused, too slow (> --timeout) or too large grammar is a result too
                emit({"figure": "time_to_grammar", "grammar": name, "lib": lib,
                      "error": f"{type(e).__name__}: {e}", "seconds": round(time.perf_counter() - t0, 2)})
            finally:
                comp.close()
            if gl is None:
                continue
            if lib == "treadle":
                g = gl
            cold, ok = [], []
            for i, p in enumerate(paths):
                w = walk(gl.matcher, p, bm)
                if w is not None:
                    ok.append(i)
                cold += w or []
            refused = {i: refused_at(gl.matcher(), paths[i], tok) for i in range(len(paths)) if i not in ok}
            emit({"figure": "per_token", "grammar": name, "lib": f"{lib}, first walk (rows built)",
                  **stats_us(cold), "documents_accepted": len(ok), "of": len(paths)})
            warm, _ = warm_walks(gl.matcher, [paths[i] for i in ok], bm, args.reps)
            emit({"figure": "per_token", "grammar": name, "lib": f"{lib}, warm", **stats_us(warm),
                  "documents_accepted": len(ok), "of": len(paths),
                  "refused": {f"doc {i} (nesting {nesting(docs[i])})": f"at {t!r}" for i, t in refused.items()}})
            if lib == "treadle":
                ok_treadle = ok

        # ------------------------------------------------------------ xgrammar
        if xgr is not None:
            xg = None
            t0 = time.perf_counter()
            try:
                xg = xcomp.compile_grammar(text)
                xgr.GrammarMatcher(xg).fill_next_token_bitmask(xbm, 0)
                emit({"figure": "time_to_grammar", "grammar": name, "lib": "xgrammar compile_grammar",
                      "seconds": round(time.perf_counter() - t0, 4)})
            except Exception as e:
                emit({"figure": "time_to_grammar", "grammar": name, "lib": "xgrammar compile_grammar",
                      "error": f"{type(e).__name__}: {e}"})
            if xg is not None:
                samples, ok_x = [], []
                for rep in range(args.reps):
                    for i, p in enumerate(paths):
                        w = walk(lambda: xgr.GrammarMatcher(xg), p, xbm)
                        if w is not None:
                            samples += w
                            if rep == 0:
                                ok_x.append(i)
                emit({"figure": "per_token", "grammar": name, "lib": "xgrammar, warm", **stats_us(samples),
                      "documents_accepted": len(ok_x), "of": len(paths)})
                if g is not None:  # token masks side by side, untimed
                    both = [i for i in ok_x if i in ok_treadle]
                    diffs = [mask_diff(g.matcher, lambda: xgr.GrammarMatcher(xg), paths[i], bm, xbm, V, special, tok)
                             for i in both]
                    emit({"figure": "mask_agreement", "grammar": name, "documents": both,
                          **{k: sum(d[k] for d in diffs) for k in ("steps", "steps_differ", "only_treadle",
                                                                   "only_xgrammar", "only_treadle_special",
                                                                   "only_xgrammar_special")},
                          "first_other": next(({"doc": i, **d["first_other"]} for i, d in zip(both, diffs)
                                               if d["first_other"]), None)})
    write_results(args.out, "EBNF grammars, treadle vs xgrammar (CPU)",
                  machine={**info, "loadavg_end": os.getloadavg()}, vocab=f"SmolLM2-135M-Instruct ({V})",
                  grammars=GRAMMARS, documents=DOCS)


if __name__ == "__main__":
    main()
