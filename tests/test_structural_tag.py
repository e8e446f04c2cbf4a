"""Structural tags (constrained/ebnf/structural_tag.py): free text whose tagged segments follow
JSON schemas. The free-text regex against a plain substring check, the whole regex on
examples, and the compiled grammar on the real SmolLM2 vocabulary: the model's own
tokenization of replies with calls (free-form, recursive and any-JSON arguments) accepted,
bad ones refused, the forced text after a trigger jumped, and random token walks that
open segments checked by an independent parser with jsonschema."""
from __future__ import annotations

import itertools
import json
import random
import re

import jsonschema
import pytest

from json_checks import allowed_ids
from treadle.constrained.compile.grammar import GrammarSpec
from treadle.constrained.ebnf.structural_tag import structural_tag_to_regex, trigger_free_regex
from treadle.runtime.sampling_params import SamplingParams

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city"]}
SEARCH = {"type": "object", "properties": {"q": {"type": "string"}, "opts": {"type": "object"}}, "required": ["q"]}
TREE = {"type": "object", "properties": {"label": {"type": "string"},
                                         "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["label"]}
ORDER = {"type": "object", "properties": {"ship_to": {"$ref": "#/$defs/Address"}}, "required": ["ship_to"],
         "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def call(name: str, schema) -> dict:
    return {"begin": f'<tool_call>\n{{"name": "{name}", "arguments": ', "schema": schema, "end": "}\n</tool_call>"}


TOOLS = {"structures": [call("get_weather", WEATHER), call("search", SEARCH), call("tree", TREE),
                        call("order", ORDER), call("any", {})], "triggers": ["<tool_call>"]}
FUNCS = {"structures": [{"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"},
                        {"begin": "<function=get_time>", "schema": {"type": "object", "properties": {},
                                                                     "additionalProperties": False},
                         "end": "</function>"}],
         "triggers": ["<function="]}


def segments(text: str, tag: dict) -> list[tuple[int, object]] | None:
    """The (structure, value) of each segment of ``text``, None unless ``text`` is free text
    and segments as the tag says (one trigger, begins told apart by their text): an
    independent reading with str.find, json.raw_decode and jsonschema."""
    (trigger,) = tag["triggers"]
    out, pos = [], 0
    while (at := text.find(trigger, pos)) >= 0:
        for i, s in enumerate(tag["structures"]):
            if text.startswith(s["begin"], at):
                break
        else:
            return None
        start = at + len(s["begin"])
        try:
            value, end = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            return None
        if not text.startswith(s["end"], end) or not jsonschema.Draft202012Validator(s["schema"]).is_valid(value):
            return None
        out.append((i, value))
        pos = end + len(s["end"])
    return out


# ------------------------------------------------------------------ spec and errors

@pytest.mark.parametrize("value, words", [
    ("{", "not valid JSON"),
    ([], "must be an object"),
    ({"structures": [call("a", {})]}, "triggers must be a non-empty list"),
    ({"structures": [call("a", {})], "triggers": [""]}, "triggers must be a non-empty list"),
    ({"structures": [], "triggers": ["<tool_call>"]}, "structures must be a non-empty list"),
    ({"structures": [{"begin": "<tool_call>", "schema": {}}], "triggers": ["<tool_call>"]}, "end must be non-empty"),
    ({"structures": [{**call("a", {}), "extra": 1}], "triggers": ["<tool_call>"]}, "begin, schema and end only"),
    ({"structures": [{**call("a", {}), "schema": "x"}], "triggers": ["<tool_call>"]}, "schema must be a JSON schema"),
    ({"structures": [call("a", {})], "triggers": ["<function="]}, "does not start with any of the triggers"),
    ({"structures": [call("a", {})], "triggers": ["<tool_call>", "<x>"]}, "triggers[1] '<x>' starts no"),
    ({"structures": [call("a", {})], "triggers": ["<tool_call>"], "tags": []}, "unknown field(s) tags"),
    ({"type": "json_schema", "structures": [call("a", {})], "triggers": ["<tool_call>"]}, "type must be"),
    ({"structures": [{**call("a", {}), "end": "\U0010FFF9"}], "triggers": ["<tool_call>"]}, "reserved"),
])
def test_bad_tags_are_value_errors_naming_the_problem(value, words):
    with pytest.raises(ValueError) as e:
        GrammarSpec.from_params(structural_tag=value)
    assert words in str(e.value)


def test_spec_is_canonical_and_exclusive():
    a = GrammarSpec.from_params(structural_tag=TOOLS)
    b = GrammarSpec.from_params(structural_tag=json.dumps({**TOOLS, "type": "structural_tag"}, indent=2))
    assert a == b and a.kind == "structural_tag"
    assert [t["begin"] for t in json.loads(a.value)["format"]["tags"]] == [s["begin"] for s in TOOLS["structures"]]
    with pytest.raises(ValueError, match="at most one of"):
        GrammarSpec.from_params(regex="a", structural_tag=TOOLS)
    with pytest.raises(ValueError, match="schema at"):  # a bad schema names where it sits
        GrammarSpec.from_params(structural_tag={"structures": [call("a", False)], "triggers": ["<tool_call>"]}
                                ).to_regex()


def test_sampling_params_take_a_dict_and_check_it():
    p = SamplingParams.from_dict({"structural_tag": TOOLS})
    assert isinstance(p.structural_tag, str) and json.loads(p.structural_tag) == TOOLS and p.has_grammar
    with pytest.raises(ValueError, match="sampling_params.structural_tag.triggers"):
        SamplingParams.from_dict({"structural_tag": {"structures": TOOLS["structures"]}})
    with pytest.raises(ValueError, match="at most one of"):
        SamplingParams.from_dict({"structural_tag": TOOLS, "ebnf": 'root ::= "a"'})


# ------------------------------------------------------------------ regexes

def test_trigger_free_regex_is_exactly_the_strings_without_a_trigger():
    rng = random.Random(0)
    cases = [["aab"], ["ab", "b"], ["abab", "bab", "aa"], ["a"], ["abc", "bc", "c"], ["ba", "ab"]]
    cases += [list({"".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))})
              for _ in range(120)]
    for triggers in cases:
        free = re.compile(trigger_free_regex(triggers))
        for n in range(7):
            for chars in itertools.product("abcd", repeat=n):
                s = "".join(chars)
                assert bool(free.fullmatch(s)) == (not any(t in s for t in triggers)), (triggers, s)
    # special characters are escaped, others left free; `hide` leaves a class out
    free = re.compile(trigger_free_regex(["[x]", "a.b"], hide="0-9"))
    assert free.fullmatch("[x a+b ab") and not free.fullmatch("[x]") and not free.fullmatch("a.b")
    assert not free.fullmatch("7")
    assert len(trigger_free_regex(["<tool_call>"])) < 400  # grows with the triggers' automaton, not 2^n
    # a union with the empty string matches it, whatever the other side looks like
    from treadle.constrained.regex.free_text import _union
    for other in ("a", "(?:a|b)(?:c)?", "(?:ab)?c", "[^<]"):
        assert re.fullmatch(_union("", other), "") and re.fullmatch(_union(other, ""), "")


def test_regex_accepts_free_text_with_valid_segments_only():
    r = re.compile(GrammarSpec.from_params(structural_tag=FUNCS).to_regex())
    ok = ["", "hello", "<functio", "<func <fun", "x <function=get_time>{}</function>",
          'I call <function=get_weather>{"city":"Oslo","unit":"c"}</function> then '
          '<function=get_time>{}</function><function=get_time>{}</function> bye']
    bad = ["<function=", "<function=nope>{}</function>", '<function=get_weather>{"unit":"c"}</function>',
           "<function=get_time>{}", "<function=get_time>{} </function>", 'a <function=get_time>{"x":1}</function>']
    for s in ok:
        assert r.fullmatch(s) and segments(s, FUNCS) is not None, s
    for s in bad:
        assert not r.fullmatch(s) and segments(s, FUNCS) is None, s


def test_structures_convert_together_with_their_own_refs():
    """Each schema's local refs mean what they meant alone (ORDER's #/$defs, TREE's #), and the
    recursive ones are calls of one list of definitions."""
    from treadle.constrained.index.json_holes import CALL_CHARS, ENTRY_CHAR

    value = GrammarSpec.from_params(structural_tag=TOOLS).value
    with_calls = structural_tag_to_regex(value, holes=True)
    assert with_calls.count(ENTRY_CHAR) == 1 and CALL_CHARS[0] in with_calls
    unrolled = re.compile(structural_tag_to_regex(value))
    doc = ('<tool_call>\n{"name": "order", "arguments": {"ship_to":{"city":"Rome"}}}\n</tool_call>'
           '<tool_call>\n{"name": "tree", "arguments": {"label":"a","kids":[{"label":"b"}]}}\n</tool_call>')
    assert unrolled.fullmatch(doc) and segments(doc, TOOLS) is not None


# ------------------------------------------------------------------ the real vocabulary

@pytest.fixture(scope="module")
def compiled(smollm2_tokenizer):
    from treadle.constrained.compile.compiler import GrammarCompiler

    tok = smollm2_tokenizer
    with GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok)) as c:
        yield {name: c.compile(GrammarSpec.from_params(structural_tag=tag))
               for name, tag in (("tools", TOOLS), ("funcs", FUNCS))}


DOCS = [
    "No call here, just <tool text and a < sign.",
    'Sure! <tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","unit":"c"}}\n</tool_call> done',
    'x<tool_call>\n{"name": "search", "arguments": {"q":"a","opts":{"deep":[1,{"x":null}],"s":"}"}}}\n</tool_call>',
    '<tool_call>\n{"name": "tree", "arguments": {"label":"a","kids":[{"label":"b","kids":[{"label":"c","kids":'
    '[{"label":"d","kids":[{"label":"e","kids":[{"label":"f"}]}]}]}]}]}}\n</tool_call>\n',
    '<tool_call>\n{"name": "any", "arguments": [1,2,{"a":"b"}]}\n</tool_call><tool_call>\n{"name": "order", '
    '"arguments": {"ship_to":{"city":"Rome"}}}\n</tool_call>',
]


def test_model_tokenizations_of_valid_replies_are_accepted(compiled, smollm2_tokenizer):
    from treadle.constrained.decode.bitmask import allocate_token_bitmask

    tok = smollm2_tokenizer
    g = compiled["tools"]
    assert g.holes is not None  # free-form args are holes, the tree's kids calls
    bitmask = allocate_token_bitmask(1, len(tok))
    for doc in DOCS:
        assert segments(doc, TOOLS) is not None
        m = g.matcher()
        for t in tok.encode(doc, add_special_tokens=False):
            m.fill_next_token_bitmask(bitmask, 0)
            assert t in allowed_ids(bitmask[0].numpy()), (doc, tok.decode([t]))
            assert m.accept_token(t), (doc, tok.decode([t]))
        assert m.accept_token(tok.eos_token_id), doc


@pytest.mark.parametrize("bad", [
    '<tool_call>\n{"name": "nope"',
    '<tool_call>\n{"name": "get_weather", "arguments": {"town":"x"}}',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city":"x"}} </tool_call>',
    '<tool_call> {"name": "any"',
])
def test_invalid_replies_are_refused(compiled, smollm2_tokenizer, bad):
    tok = smollm2_tokenizer
    m = compiled["tools"].matcher()
    assert not all(m.accept_token(t) for t in tok.encode(bad, add_special_tokens=False))


def test_forced_text_after_a_trigger_is_jumped(compiled, smollm2_tokenizer):
    tok = smollm2_tokenizer
    m = compiled["tools"].matcher()
    for t in tok.encode("Let me check. <tool_call>", add_special_tokens=False):
        assert m.accept_token(t)
    assert m.find_jump_forward_string() == '\n{"name": "'
    m = compiled["funcs"].matcher()
    for t in tok.encode('<function=get_weather>{"city":"Oslo"}', add_special_tokens=False):
        assert m.accept_token(t)
    assert m.find_jump_forward_string() == "</function>"
    assert not m.can_terminate()


@pytest.mark.parametrize("name", ["tools", "funcs"])
def test_random_walks_through_segments_parse_and_validate(compiled, smollm2_tokenizer, name):
    """Sample allowed tokens; now and then write the trigger (as the model's tokens) to open a
    segment, and steer to an end after a while. Every text must read back as free text and
    valid segments, and a refused token never changes the matcher."""
    from treadle.constrained.decode.bitmask import allocate_token_bitmask

    tok = smollm2_tokenizer
    tag = TOOLS if name == "tools" else FUNCS
    trigger = tok.encode(tag["triggers"][0], add_special_tokens=False)
    g = compiled[name]
    eos = tok.eos_token_id
    table = g.token_bytes
    bitmask = allocate_token_bitmask(1, len(tok))
    rng = random.Random(name)
    opened = ended = 0
    for _ in range(12):
        m = g.matcher()
        out = b""
        for step in range(120):
            m.fill_next_token_bitmask(bitmask, 0)
            allowed_set = allowed_ids(bitmask[0].numpy())
            allowed = sorted(allowed_set)
            assert allowed, out
            if eos in allowed_set and (step > 60 or rng.random() < 0.05):
                assert m.accept_token(eos)
                ended += 1
                break
            if m.can_terminate() and rng.random() < 0.15:  # in free text: open a segment
                assert all(m.accept_token(t) for t in trigger), out
                opened += 1
                out += tag["triggers"][0].encode()
                continue
            pick = [a for a in allowed if a != eos]
            if step > 40:  # steer to an end: closers and the end strings' tokens
                pick = [a for a in pick if table[a][:1] in (b"}", b"]", b'"', b"\n", b"<", b"/")] or pick
            t = rng.choice(pick)
            refused = [i for i in rng.sample(range(len(tok)), 200) if i not in allowed_set]
            state = m.state
            if refused:
                assert not m.accept_token(refused[0]) and m.state == state
            assert m.accept_token(t), (out, table[t])
            out += table[t]
        else:
            continue
        text = out.decode("utf-8", errors="strict")
        assert segments(text, tag) is not None, text
    assert opened >= 3 and ended >= 6, (opened, ended)


# ------------------------------------------------------------------ xgrammar's format tree

INT = {"type": "json_schema", "json_schema": {"type": "integer"}}
F_TAG = {"type": "tag", "begin": "<f>", "content": INT, "end": "</f>"}
A_TEXT = {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": "</a>"}


def fmt(f: dict) -> dict:
    return {"type": "structural_tag", "format": f}


# (format, {text: "complete" | "prefix" | "reject"}): each verdict as xgrammar 0.2.9 gave it
# for the same format and text (its GrammarMatcher.accept_string, then EOS), and the same here
FORMAT_CASES = {
    "triggered": ({"type": "triggered_tags", "triggers": ["<f"], "tags": [F_TAG]},
                  {"hi <f>1</f> x <f>22</f>": "complete", "hi": "complete", "hi <f>x": "reject", "<f>1": "prefix"}),
    "at_least_one": ({"type": "triggered_tags", "triggers": ["<f"], "tags": [F_TAG], "at_least_one": True},
                     {"hi <f>1</f>": "reject", "<f>1</f> bye": "complete", "hi": "reject", "": "prefix"}),
    "stop_after_first": ({"type": "triggered_tags", "triggers": ["<f"], "tags": [F_TAG], "stop_after_first": True},
                         {"hi <f>1</f>": "complete", "hi <f>1</f> x": "reject", "hi": "complete", "": "complete"}),
    "one_tag_only": ({"type": "triggered_tags", "triggers": ["<f"], "tags": [F_TAG], "stop_after_first": True,
                      "at_least_one": True}, {"hi <f>1</f>": "reject", "<f>1</f>": "complete", "hi": "reject"}),
    "excludes": ({"type": "triggered_tags", "triggers": ["<f"], "tags": [F_TAG], "excludes": ["NO"]},
                 {"a<f>1</f>b": "complete", "aNOb": "reject", "<f>1</f>NO": "reject"}),
    "any_text_tag": (A_TEXT, {"<a>x</a>": "complete", "<a>x</a>y</a>": "reject", "<a>x": "prefix"}),
    "ends": ({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": ["</a>", "</b>"]},
             {"<a>x</b>": "complete", "<a>x</a>": "complete", "<a>x</a>y": "reject"}),
    "any_then_const": ({"type": "sequence", "elements": [{"type": "any_text"}, {"type": "const_string", "value": "END"}]},
                       {"abEND": "complete", "abENDxEND": "complete", "END": "complete"}),
    "triggered_then_const": ({"type": "sequence", "elements": [
        {"type": "triggered_tags", "triggers": ["<f"], "tags": [F_TAG]}, {"type": "const_string", "value": "END"}]},
        {"ab<f>1</f>cEND": "complete", "abEND": "complete", "aEND<f>1</f>END": "complete"}),
    "separator": ({"type": "tags_with_separator", "tags": [F_TAG], "separator": ","},
                  {"": "complete", "<f>1</f>": "complete", "<f>1</f>,<f>2</f>": "complete", "<f>1</f>,": "prefix",
                   "<f>1</f><f>2</f>": "reject"}),
    "any_text": ({"type": "any_text"}, {"": "complete", "abc\n<x>": "complete"}),
    "any_text_excludes": ({"type": "any_text", "excludes": ["bad"]}, {"good": "complete", "a bad b": "reject"}),
    "or": ({"type": "or", "elements": [{"type": "const_string", "value": "yes"}, INT]},
           {"yes": "complete", "12": "complete", "no": "reject"}),
    "triggered_in_tag": ({"type": "tag", "begin": "<r>", "content": {"type": "triggered_tags", "triggers": ["<f"],
                                                                     "tags": [F_TAG]}, "end": "</r>"},
                         {"<r>a<f>1</f>b</r>": "complete", "<r></r>": "complete", "<r>a</r>b": "reject"}),
    "seq_any_in_tag": ({"type": "tag", "begin": "<a>", "content": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "k:"}, {"type": "any_text"}]}, "end": "</a>"},
        {"<a>k:x</a>": "complete", "<a>k:x</a>y</a>": "reject"}),
    "star": ({"type": "star", "content": A_TEXT}, {"<a>x</a><a>y</a>": "complete", "": "complete"}),
    "plus": ({"type": "plus", "content": {"type": "const_string", "value": "ab"}},
             {"ab": "complete", "abab": "complete", "": "prefix"}),
    "repeat": ({"type": "repeat", "min": 1, "max": 2, "content": {"type": "const_string", "value": "ab"}},
               {"ab": "complete", "abab": "complete", "ababab": "reject"}),
    "regex_grammar": ({"type": "sequence", "elements": [{"type": "regex", "pattern": "[a-c]+"},
                                                        {"type": "grammar", "grammar": 'root ::= "x" | "y"'}]},
                      {"abx": "complete", "ay": "complete", "x": "reject"}),
    "regex_shorthands": ({"type": "regex", "pattern": r"\d{2}\s\w"}, {"12 a": "complete", "12": "prefix", "1a": "reject"}),
    "any_text_in_triggered_tag": ({"type": "triggered_tags", "triggers": ["<a"], "tags": [A_TEXT]},
                                  {"x<a>y</a>z": "complete", "x<a>y</a>z</a>": "complete"}),
    # free-form JSON (a hole) between a begin and an end: tokens cross ">{" and "}<"
    "hole_in_tag": ({"type": "tags_with_separator", "separator": "\n", "at_least_one": True, "tags": [
        {"begin": "<call>", "content": {"type": "json_schema", "json_schema": {"type": "object"}}, "end": "</call>"}]},
        {'<call>{"a":[1,{"b":{}}]}</call>\n<call>{}</call>': "complete", "<call>[]</call>": "reject"}),
}


@pytest.fixture(scope="module")
def format_grammars(smollm2_tokenizer):
    from treadle.constrained.compile.compiler import GrammarCompiler

    tok = smollm2_tokenizer
    with GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok)) as c:
        yield {name: c.compile(GrammarSpec.from_params(structural_tag=fmt(f))) for name, (f, _) in FORMAT_CASES.items()}


def verdict(g, tok, text: str) -> str:
    m = g.matcher()
    if not all(m.accept_token(t) for t in tok.encode(text, add_special_tokens=False)):
        return "reject"
    return "complete" if m.accept_token(tok.eos_token_id) else "prefix"


@pytest.mark.parametrize("name", FORMAT_CASES)
def test_formats_accept_what_xgrammar_accepts(format_grammars, smollm2_tokenizer, name):
    _, texts = FORMAT_CASES[name]
    got = {text: verdict(format_grammars[name], smollm2_tokenizer, text) for text in texts}
    assert got == texts
    if name == "hole_in_tag":
        assert format_grammars[name].holes is not None


def test_legacy_form_is_a_triggered_tags_format():
    legacy = GrammarSpec.from_params(structural_tag=FUNCS)
    tags = [{"begin": s["begin"], "content": {"type": "json_schema", "json_schema": s["schema"]}, "end": s["end"]}
            for s in FUNCS["structures"]]
    new = GrammarSpec.from_params(structural_tag=fmt({"type": "triggered_tags", "triggers": FUNCS["triggers"],
                                                      "tags": tags}))
    assert legacy == new  # one canonical form: one cache entry, one regex


def test_format_bounds_are_the_bytes_around_json_values():
    from treadle.constrained.index.json_holes import ENTRY_AFTER, EXIT_AT
    from treadle.constrained.ebnf.structural_tag import structural_tag_bounds

    f = fmt({"type": "sequence", "elements": [
        {"type": "tag", "begin": "<x>", "content": {"type": "json_schema", "json_schema": {}}, "end": ["|", "</x>"]},
        {"type": "const_string", "value": "="}, {"type": "json_schema", "json_schema": {"type": "object"}}]})
    value = GrammarSpec.from_params(structural_tag=f).value
    regex = structural_tag_to_regex(value, holes=True)
    before, _, _, after = structural_tag_bounds(value, regex)
    assert before == ENTRY_AFTER | {ord(">"), ord("=")}
    assert after == EXIT_AT | {ord("|"), ord("<")}  # the last value ends the text: nothing after it


@pytest.mark.parametrize("f, words", [
    ({"type": "token", "token": 5}, "type 'token' is not supported"),
    ({"type": "const_string", "value": "a", "x": 1}, "unknown field(s) x"),
    ({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}, "style = 'qwen_xml' is not supported"),
    ({"type": "json_schema", "json_schema": "x"}, "format.json_schema must be a JSON schema"),
    ({"type": "triggered_tags", "triggers": ["<", "<f"], "tags": [F_TAG]}, "more than one of the triggers"),
    ({"type": "triggered_tags", "triggers": ["<g"], "tags": [F_TAG]}, "tags[0].begin '<f>' does not start with any"),
    ({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": ""}, "needs a non-empty end"),
    ({"type": "tag", "begin": "<a>", "content": INT}, "end must be a string or a non-empty list"),
    ({"type": "repeat", "min": 3, "max": 2, "content": INT}, "max >= min"),
    ({"type": "repeat", "min": 0, "max": 1000, "content": INT}, "at most 32"),
    ({"type": "sequence", "elements": []}, "elements must be a non-empty list"),
    ({"type": "regex", "pattern": "(a"}, "format.pattern"),
    ({"type": "const_string", "value": "\U0010FFFD"}, "reserved"),
    ({"type": "any_text", "max_tokens": 5}, "max_tokens = 5 is not supported"),
    # xgrammar takes these two; their token index would blow up here
    ({"type": "sequence", "elements": [{"type": "any_text"}, INT]}, "must begin with fixed text"),
    ({"type": "star", "content": {"type": "any_text"}}, "cannot repeat"),
    ("x", "format must be an object"),
])
def test_bad_formats_are_value_errors_naming_the_problem(f, words):
    with pytest.raises(ValueError) as e:
        GrammarSpec.from_params(structural_tag=fmt(f))
    assert words in str(e.value)
    with pytest.raises(ValueError, match="unknown field"):
        GrammarSpec.from_params(structural_tag={**fmt(INT), "structures": []})


def test_schema_errors_name_the_node():
    bad = {"type": "number", "multipleOf": 0.3}  # a multipleOf not 1/k is still refused (if/then is enforced)
    f = fmt({"type": "sequence", "elements": [{"type": "const_string", "value": "x"},
                                              {"type": "or", "elements": [INT, {"type": "json_schema", "json_schema": bad}]}]})
    with pytest.raises(ValueError, match=r"'multipleOf' at \$\.format\.elements\[1\]\.elements\[1\]\.json_schema"):
        GrammarSpec.from_params(structural_tag=f).to_regex()
    legacy = {"structures": [call("a", WEATHER), call("b", bad)], "triggers": ["<tool_call>"]}
    with pytest.raises(ValueError, match=r"'multipleOf' at \$\.structures\[1\]\.schema"):
        GrammarSpec.from_params(structural_tag=legacy).to_regex()
