"""uniqueItems over free strings (Pydantic's ``set[str]``): the regex writes a plain list of
strings and the matcher keeps each array's string items distinct (unique_strings.py,
unique_items.py). Before, such an array was written with at most one item (or, under a
minItems, exactly that many items of lengths 1, 2, 3, ...)."""

from __future__ import annotations

import json
import random
from enum import Enum
from typing import Annotated, Literal

import jsonschema
import numpy as np
import pytest
from pydantic import BaseModel, Field

from treadle.constrained import GrammarSpec, allocate_token_bitmask, build_compiled_grammar, token_bytes_table
from treadle.constrained.schema.json_schema import drop_unenforceable
from treadle.constrained.schema.unique_strings import unique_string_slots

from json_checks import random_walk


class Shopping(BaseModel):
    items: set[str]


class Tagged(BaseModel):
    name: str
    tags: Annotated[set[str], Field(min_length=3)]
    aliases: list[str] = []


class Coded(BaseModel):
    """A set of free strings beside a list whose strings a pattern limits: the check keeps to
    the arrays under the key "tags" (checking "codes" too could leave the matcher no token once
    its two codes are written)."""
    tags: set[str]
    codes: list[Annotated[str, Field(pattern=r"^[AB]$")]]


@pytest.fixture(scope="module")
def table(smollm2_tokenizer):
    return token_bytes_table(smollm2_tokenizer)


def _grammar(tok, schema: dict, **spec_kw):
    spec = GrammarSpec.from_params(json_schema=schema, **spec_kw)
    return build_compiled_grammar(spec.to_regex(holes=True), tok, [tok.eos_token_id], vocab_size=len(tok), spec=spec)


def _allowed(m, width: int) -> set[int]:
    bm = allocate_token_bitmask(1, width)
    m.fill_next_token_bitmask(bm, 0)
    row = bm[0].numpy().view(np.uint32)
    return {int(i) for i in np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))}


def _feed(m, tok, text: str) -> None:
    for t in tok.encode(text, add_special_tokens=False):
        assert m.accept_token(t), (text, t)


def test_set_of_str_writes_several_items_and_never_repeats_one(smollm2_tokenizer, table):
    tok = smollm2_tokenizer
    g = _grammar(tok, Shopping.model_json_schema())
    assert g.unique_strings
    ids = {b: i for i, b in enumerate(table) if b}
    m = g.matcher()
    _feed(m, tok, '{"items":["red","green","re')  # a second and third item (at most one was written)
    closers = [ids[b] for b in (b'"', b'",', b'"]', b'","')]
    assert m.accept_token(ids[b"d"])  # "red" again, up to its last letter
    allowed = _allowed(m, len(tok))
    for closer in closers:
        assert closer not in allowed and not m.accept_token(closer), table[closer]
    assert ids[b"s"] in allowed and m.accept_token(ids[b"s"]) and m.accept_token(ids[b'"]'])  # "reds" is new
    m.rollback(2)  # back after "red": refused again
    assert not _allowed(m, len(tok)) & set(closers) and not any(m.accept_token(c) for c in closers)
    # the same value in another spelling is the same item: "\u0072ed" is "red", "gr\/een" no other
    for spelt in ('\\u0072ed', 'gre\\u0065n'):
        m2 = g.matcher()
        _feed(m2, tok, '{"items":["red","green","')
        tokens = tok.encode(spelt + '"', add_special_tokens=False)
        assert all(m2.accept_token(t) for t in tokens[:-1])
        assert not m2.accept_token(tokens[-1]), spelt
    # rolled back and forth, the check follows the text
    m3 = g.matcher()
    _feed(m3, tok, '{"items":["a"')
    m3.rollback(1)
    _feed(m3, tok, '"]}')
    assert m3.can_terminate()


def test_set_of_str_walks_validate_with_more_items_than_min_items(smollm2_tokenizer, table):
    """Random walks over a two-letter alphabet (so repeats are likely): every text validates, and
    some write more than minItems tags, some of one length (the old narrowing wrote exactly 3, of
    lengths 1, 2 and 3)."""
    tok = smollm2_tokenizer
    schema = Tagged.model_json_schema()
    g = _grammar(tok, schema)
    assert g.unique_strings
    small = [i for i, b in enumerate(table) if b and set(b) <= set(b'ab"[]{},:') and len(b) <= 3
             or b in (b'"name', b'"tags', b'"aliases', b'":', b'":["', b'":"', b'","', b'"],"', b'"],')]
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(7)
    bm = allocate_token_bitmask(1, len(tok))
    finished, lengths = 0, []
    for _ in range(12):
        m = g.matcher()
        out = _walk_within(m, bm, table, set(small), tok.eos_token_id, rng)
        if out is None:
            continue
        value = json.loads(out)
        validator.validate(value)
        Tagged.model_validate_json(out)
        finished += 1
        lengths.append([len(t) for t in value["tags"]])
    assert finished >= 8, finished
    assert any(len(ls) > 3 for ls in lengths) and any(len(set(ls)) < len(ls) for ls in lengths), lengths


def _walk_within(m, bm, table, small: set[int], eos: int, rng: random.Random) -> str | None:
    """A walk that takes tokens of ``small`` where the mask allows one (any allowed token else),
    EOS as soon as allowed; None where 300 steps did not finish."""
    out = b""
    for step in range(300):
        m.fill_next_token_bitmask(bm, 0)
        ids = np.flatnonzero(np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")).tolist()
        assert ids, out
        if eos in ids:
            assert m.accept_token(eos)
            return out.decode()
        pick = [i for i in ids if i in small] or ids
        if step > 150:  # close up: prefer tokens that end strings and containers
            pick = [i for i in pick if b'"' in table[i] or b"]" in table[i] or b"}" in table[i]] or pick
        t = rng.choice(pick)
        assert m.accept_token(t), (out, table[t])
        out += table[t]
    return None


def test_set_of_str_with_the_model_writes_distinct_items(smollm2_tokenizer):
    """SmolLM2, shown a list that repeats a word, repeats it under list[str]; under set[str] it
    writes several items, all distinct (before: at most one)."""
    from treadle.runtime import Engine

    schema = Shopping.model_json_schema()
    prompt = '{"items":["apple","apple","apple"]}\n' * 3
    with Engine(max_total_tokens=4096) as e:
        out = e.generate(prompt, {"json_schema": schema, "max_new_tokens": 40, "temperature": 0})
        plain = e.generate(prompt, {"json_schema": {"type": "object", "required": ["items"], "properties": {
            "items": {"type": "array", "items": {"type": "string"}}}}, "max_new_tokens": 40, "temperature": 0})
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    value = json.loads(out["text"])
    jsonschema.validate(value, schema)
    assert len(value["items"]) >= 2 and len(set(value["items"])) == len(value["items"]), value
    assert len(json.loads(plain["text"])["items"]) > len(set(json.loads(plain["text"])["items"]))  # it would repeat


def test_unique_check_keeps_to_the_keys_of_unique_arrays(smollm2_tokenizer, table):
    tok = smollm2_tokenizer
    coded = Coded.model_json_schema()
    assert unique_string_slots(coded) == {"tags"}
    g = _grammar(tok, coded)
    m = g.matcher()
    _feed(m, tok, '{"tags":["x","y"],"codes":["A","A","B","A"]}')  # codes may repeat, tags may not
    assert m.can_terminate()
    m = g.matcher()
    _feed(m, tok, '{"tags":["x","')
    x = tok.encode("x", add_special_tokens=False)[0]
    assert m.accept_token(x) and not m.accept_token(tok.encode('"', add_special_tokens=False)[0])
    bm = allocate_token_bitmask(1, len(tok))
    rng = random.Random(3)
    for _ in range(4):
        m = g.matcher()
        out = random_walk(m, bm, table, tok.eos_token_id, rng, steps=300, stop_p=0.3, free_steps=60, steer_after=100)
        if m.is_terminated():
            jsonschema.validate(json.loads(out), coded)
    assert unique_string_slots({"type": "array", "uniqueItems": True, "items": {"type": "array", "uniqueItems": True,
                                                                                "items": {"type": "string"}}}) == {0, 1}
    # a oneOf of disjoint types (a string or a list of strings, compose-spec's string_or_list) is
    # written as it is: its list is checked like any other
    either = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "uniqueItems": True}]}
    assert unique_string_slots({"type": "object", "properties": {"env_file": either}}) == {"env_file"}


@pytest.mark.parametrize("other", [
    {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 3},  # under the same key: enum items
    {"type": "array", "items": {"type": "string", "maxLength": 1}},
    {"type": "array", "items": {"$ref": "#/$defs/Code"}},
    # a oneOf whose branches overlap: one is written where the other fails (strings under 2 characters)
    {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "array", "items": {"type": "string",
                                                                                             "minLength": 2}}]},
])
def test_unique_check_stays_off_where_an_array_under_the_same_key_limits_its_strings(smollm2_tokenizer, table,
                                                                                      other):
    tok = smollm2_tokenizer
    schema = {"type": "object", "$defs": {"Code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
              "properties": {"tags": {"anyOf": [{"type": "array", "uniqueItems": True, "items": {"type": "string"}},
                                                other]},
                             "more": {"type": "object", "properties": {"tags": other}}}}
    assert unique_string_slots(schema) is None
    for elsewhere in ({"type": "object", "additionalProperties": other},  # under any key
                      {"type": "array", "items": other}):  # as an item, beside list[set[str]]
        assert unique_string_slots({"type": "object", "properties": {
            "tags": {"type": "array", "uniqueItems": True, "items": {"type": "string"}},
            "lists": {"type": "array", "items": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}},
            "x": elsewhere}, "$defs": schema["$defs"]}) is None, elsewhere
    g = _grammar(tok, schema)
    assert not g.unique_strings  # the regex narrows the set as before: every output still validates
    bm = allocate_token_bitmask(1, len(tok))
    rng = random.Random(5)
    for _ in range(3):
        m = g.matcher()
        out = random_walk(m, bm, table, tok.eos_token_id, rng, steps=300, stop_p=0.3, free_steps=60, steer_after=100)
        if m.is_terminated():
            jsonschema.validate(json.loads(out), schema)


def test_unique_strings_in_spec_mode_after_a_reasoning_block_and_when_lenient(smollm2_tokenizer):
    tok = smollm2_tokenizer
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2}
    # spec mode refused it (no subset written); now it is served, every list of distinct strings
    spec = GrammarSpec.from_params(json_schema=schema)
    assert spec.to_regex(json_schema_mode="spec")
    assert drop_unenforceable(schema, mode="spec") == (schema, [])  # leniency drops nothing
    # after a reasoning block: the block's text is not looked at, the answer's items are
    g = _grammar(tok, schema, reasoning="open")
    assert g.unique_strings
    m = g.matcher()
    _feed(m, tok, 'Say ["a","a"] twice.</think>\n["a","b","')
    q = tok.encode('"', add_special_tokens=False)[0]
    assert m.accept_token(tok.encode("c", add_special_tokens=False)[0]) and m.accept_token(q)
    m.rollback(1)
    m.rollback(1)
    assert m.accept_token(tok.encode("a", add_special_tokens=False)[0]) and not m.accept_token(q)


class Palette(BaseModel):
    """A set of a 12-value Enum (and of 8 literals): past 6 values, every order of every subset is
    too many to spell out; at most one item was written."""
    colours: set[Enum("Colour", {f"c{i}": f"colour-{i}" for i in range(12)}, type=str)]
    flags: set[Literal["a", "b", "c", "d", "e", "f", "g", "h"]] = set()


def test_set_of_a_large_enum_writes_any_subset_in_the_order_listed(smollm2_tokenizer, table):
    import regex

    tok = smollm2_tokenizer
    schema = Palette.model_json_schema()
    rx = GrammarSpec.from_params(json_schema=schema).to_regex()
    assert regex.fullmatch(rx, '{"colours":["colour-0","colour-5","colour-11"],"flags":["a","b","h"]}')
    assert regex.fullmatch(rx, '{"colours":[],"flags":["g"]}')
    for repeated in ('{"colours":["colour-5","colour-5"]}', '{"colours":[],"flags":["a","a"]}'):
        assert not regex.fullmatch(rx, repeated)
    assert not regex.fullmatch(rx, '{"colours":["colour-5","colour-1"]}')  # (in the order listed only)
    g = _grammar(tok, schema)
    bm = allocate_token_bitmask(1, len(tok))
    rng = random.Random(11)
    sizes = []
    for _ in range(8):
        m = g.matcher()
        out = random_walk(m, bm, table, tok.eos_token_id, rng, steps=300, stop_p=0.05, free_steps=200, steer_after=250)
        if m.is_terminated():
            value = json.loads(out)
            jsonschema.validate(value, schema)
            Palette.model_validate_json(out)
            sizes.append(len(value["colours"]))
    assert len(sizes) >= 5 and max(sizes) >= 2, sizes
    # up to 64 values, with minItems 1, inside nested objects
    many = {"type": "array", "uniqueItems": True, "minItems": 1, "items": {"enum": [f"v{i}" for i in range(64)]}}
    rx = GrammarSpec.from_params(json_schema={"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": many}}}}).to_regex()
    assert regex.fullmatch(rx, '{"a":{"b":["v0","v9","v63"]}}') and not regex.fullmatch(rx, '{"a":{"b":[]}}')


def test_draft7_metaschema_writes_several_required_names_and_dependencies(smollm2_tokenizer):
    """The draft-07 metaschema as a schema (a property holding a schema, or a schema generator):
    its "required" and the lists of its "dependencies" (under any key) are unique free strings,
    its "type" a unique list of the 7 type names: all written with several items now."""
    import jsonschema_specifications

    tok = smollm2_tokenizer
    meta = jsonschema_specifications.REGISTRY["http://json-schema.org/draft-07/schema#"].contents
    g = _grammar(tok, meta)
    assert g.unique_strings
    m = g.matcher()
    text = '{"required":["id","name"],"dependencies":{"id":["name","kind"]},"type":["integer","string"]}'
    _feed(m, tok, text)  # (in the metaschema's order of properties)
    assert m.can_terminate()
    jsonschema.Draft7Validator.check_schema(json.loads(text))
    q = tok.encode('"', add_special_tokens=False)[0]
    for start in ('{"required":["id","name","id', '{"dependencies":{"a":["x","x'):
        m = g.matcher()
        _feed(m, tok, start)
        assert not m.accept_token(q), start
