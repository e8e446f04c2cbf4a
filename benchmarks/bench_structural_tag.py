"""Structural tags (free text whose tagged segments follow JSON schemas) on CPU, SmolLM2
vocab, in one run, per tag:

1. regex size and time to a usable grammar (token index + first mask): treadle
   (constrained/ebnf/structural_tag.py, holes and calls on) vs xgrammar's structural-tag compile
   (its legacy form: tags + triggers, the same begins, schemas and ends);
2. per-token time (fill bitmask + accept) walking replies as the tokenizer writes them
   (free text around the segments, tokens crossing a trigger or a segment's end included):
   treadle's first walk (rows built) and warm, xgrammar warm;
3. the replies each accepts.

    nice .venv/bin/python benchmarks/bench_structural_tag.py [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from figures import emit, write_results  # benchmarks/figures.py
from grammar_walks import first_and_warm, smollm2_vocabulary, stats_us, warm_walks, xgrammar_uncached  # benchmarks/grammar_walks.py
from machine import machine_info  # benchmarks/machine.py (scripts run from this folder)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}},
          "required": ["query"]}
TREE = {"type": "object", "properties": {"label": {"type": "string"},
                                         "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["label"]}
EVENT = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 60}, "start": {"type": "string", "format": "date-time"},
    "attendees": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "optional": {"type": "boolean"}}, "required": ["name"]}}},
    "required": ["title", "start"]}


def hermes(name: str, schema: dict) -> dict:
    return {"begin": f'<tool_call>\n{{"name": "{name}", "arguments": ', "schema": schema, "end": "}\n</tool_call>"}


TAGS = {
    "hermes_tool_calls": {"structures": [hermes("get_weather", WEATHER), hermes("search", SEARCH),
                                         hermes("make_tree", TREE), hermes("create_event", EVENT)],
                          "triggers": ["<tool_call>"]},
    "function_tags": {"structures": [{"begin": f"<function={n}>", "schema": s, "end": "</function>"}
                                     for n, s in (("get_weather", WEATHER), ("search", SEARCH),
                                                  ("create_event", EVENT))],
                      "triggers": ["<function="]},
    "json_code_blocks": {"structures": [{"begin": "```json\n", "schema": EVENT, "end": "\n```"}], "triggers": ["```"]},
}
PROSE = ("Sure. I will look that up for you, then put the meeting in the calendar; if the weather "
         "turns bad we can move it indoors, which the team said they would prefer anyway. ")


def _tree(d: int) -> dict:
    return {"label": f"n{d}", "kids": [_tree(d - 1), {"label": "leaf"}]} if d else {"label": "leaf"}


EV = {"title": "Team sync", "start": "2026-12-02T10:00:00Z",
      "attendees": [{"name": "Ann"}, {"name": "Bo", "optional": True}]}


def _c(x: object) -> str:
    return json.dumps(x, separators=(",", ":"))


REPLIES = {
    "hermes_tool_calls": [
        PROSE,
        PROSE + '<tool_call>\n{"name": "get_weather", "arguments": ' + _c({"city": "Oslo", "unit": "c"})
        + "}\n</tool_call>",
        "Two calls:\n" + '<tool_call>\n{"name": "search", "arguments": '
        + _c({"query": "venues", "filters": {"seats": {"min": 8}, "tags": ["quiet", "wifi"]}}) + "}\n</tool_call>\n"
        + '<tool_call>\n{"name": "create_event", "arguments": ' + _c(EV) + "}\n</tool_call>\n" + PROSE,
        '<tool_call>\n{"name": "make_tree", "arguments": ' + _c(_tree(6)) + "}\n</tool_call>",
    ],
    "function_tags": [
        PROSE,
        PROSE + '<function=get_weather>' + _c({"city": "Oslo"}) + "</function> " + PROSE,
        "<function=create_event>" + _c(EV) + "</function><function=search>"
        + _c({"query": "x", "filters": {"a": [1, {"b": None}]}}) + "</function>",
    ],
    "json_code_blocks": [
        PROSE,
        "Here is the event:\n```json\n" + _c(EV) + "\n```\n" + PROSE,
    ],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="warm walks over the replies")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "structural_tag_cpu.json"))
    args = ap.parse_args()
    from treadle.constrained import GrammarSpec, build_compiled_grammar

    info = machine_info(("torch", "outlines_core", "xgrammar", "transformers"))
    tok, eos, V, bm, pda, pda_s = smollm2_vocabulary()
    xgr, xcomp, xbm = xgrammar_uncached(tok, V, eos)

    for name, tag in TAGS.items():
        spec = GrammarSpec.from_params(structural_tag=tag)
        paths = [tok.encode(t, add_special_tokens=False) + eos for t in REPLIES[name]]
        emit({"figure": "replies", "tag": name, "tokens": [len(p) for p in paths]})

        t0 = time.perf_counter()
        rx = spec.to_regex(holes=True)
        g = build_compiled_grammar(rx, tok, eos, vocab_size=V, spec=spec, pda=pda)
        g.matcher().fill_next_token_bitmask(bm, 0)
        emit({"figure": "time_to_grammar", "tag": name, "lib": "treadle",
              "seconds": round(time.perf_counter() - t0, 3), "regex_chars": len(rx)})
        cold, warm, ok = first_and_warm(g.matcher, paths, bm, args.reps)
        emit({"figure": "per_token", "tag": name, "lib": "treadle, first walk (rows built)", **cold,
              "replies_accepted": ok, "of": len(paths)})
        emit({"figure": "per_token", "tag": name, "lib": "treadle, warm", **warm, "replies_accepted": ok,
              "of": len(paths)})

        if xgr is not None:
            items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                     for s in tag["structures"]]
            t0 = time.perf_counter()
            xg = xcomp.compile_structural_tag(items, tag["triggers"])
            emit({"figure": "time_to_grammar", "tag": name, "lib": "xgrammar structural tag",
                  "seconds": round(time.perf_counter() - t0, 4)})
            samples, ok = warm_walks(lambda: xgr.GrammarMatcher(xg), paths, xbm, args.reps)
            emit({"figure": "per_token", "tag": name, "lib": "xgrammar, warm", **stats_us(samples),
                  "replies_accepted": ok, "of": len(paths)})
    write_results(args.out, "structural tags (CPU)", machine=info, vocab="SmolLM2-135M-Instruct (49152)")


if __name__ == "__main__":
    main()
