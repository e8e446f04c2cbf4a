"""Schema holes (constrained/index/json_holes.py): any-values inside a JSON schema run on the
pushdown automaton. Masks are checked over the whole SmolLM2 vocabulary against an oracle
that knows nothing of the walk (an NFA over interegular's DFA of the regex and the JSON
oracle of tests/json_checks.py, with hole boundaries allowed anywhere); random walks must end
in schema-valid JSON; the model's own tokenization of deep documents must be accepted; and
jump-forward, rollback and the compiler's routing are checked."""

from __future__ import annotations

import json
import random
import zlib

import jsonschema
import pytest

from treadle.constrained import GrammarCompiler, GrammarSpec, allocate_token_bitmask, build_compiled_grammar
from treadle.constrained import token_bytes_table
from treadle.constrained.index.json_any import JsonPushdown
from treadle.constrained.index.json_holes import CALL_CHARS, ENTRY_CHAR, HOLE_CHARS, schema_allows_holes
from treadle.constrained.schema.json_schema import json_schema_to_regex
from treadle.constrained.decode.matcher import HoleMatcher

from json_checks import HoleOracle, accepted_ids, allowed_ids, random_walk

EOS = 2
V = 49152

TOOL = {"type": "object", "properties": {
    "name": {"type": "string"}, "args": {"type": "object"}, "tags": {"type": "array"}, "v": {}},
    "required": ["name", "args", "tags", "v"]}
LIST_OF_OBJECTS = {"type": "array", "items": {"type": "object"}, "minItems": 1}
UNTYPED = {"type": "object", "properties": {"s": {"minLength": 2}, "n": {"type": "integer"}},
           "required": ["s", "n"]}
AMBIGUOUS = {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"x": {}}, "required": ["x"]}, {}]}
# a free-form object beside a declared one: after '{"x":1' both may go on ('.5' only in the first)
OVERLAP = {"type": "array", "items": {"anyOf": [{"type": "object"}, {"type": "object", "properties": {
    "x": {"type": "integer"}}, "required": ["x"]}]}}
# recursive $refs are calls (json_holes.py): any depth, no unrolling
TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
    "type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v", "kids"]}}, "$ref": "#/$defs/node"}
LINKED = {"$defs": {"list": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
    "head": {"type": "integer"}, "tail": {"$ref": "#/$defs/list"}}, "required": ["head", "tail"]}]}},
    "$ref": "#/$defs/list"}
# mutual recursion, an any-value inside the recursion, and a free-form object beside a call
MUTUAL = {"$defs": {
    "a": {"type": "object", "properties": {"n": {"type": "string"}, "meta": {}, "b": {"$ref": "#/$defs/b"}},
          "required": ["n", "meta", "b"]},
    "b": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "object"}]}}},
    "$ref": "#/$defs/a"}
# Pydantic's Optional[Node] and list[Node]: anyOf [$ref, null] and items $ref
PYDANTIC_NODE = {"$defs": {"Node": {"type": "object", "title": "Node", "properties": {
    "name": {"type": "string", "title": "Name"},
    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": [], "title": "Children"},
    "parent": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}], "default": None}}, "required": ["name"]}},
    "$ref": "#/$defs/Node"}
SCHEMAS = {"tool": TOOL, "list_of_objects": LIST_OF_OBJECTS, "untyped": UNTYPED, "overlap": OVERLAP,
           "tree": TREE, "linked": LINKED, "mutual": MUTUAL, "pydantic_node": PYDANTIC_NODE}


@pytest.fixture(scope="module")
def table(smol):
    return token_bytes_table(smol)


@pytest.fixture(scope="module")
def pda(table):
    return JsonPushdown(table, len(table), V, (EOS,))


_grammars: dict = {}


def grammar(smol, pda, schema, mode="strict"):
    key = (json.dumps(schema), mode)
    if key not in _grammars:
        spec = GrammarSpec.from_params(json_schema=schema)
        rx = spec.to_regex(json_schema_mode=mode, holes=True)
        _grammars[key] = build_compiled_grammar(rx, smol, [EOS], vocab_size=V, spec=spec, pda=pda)
    return _grammars[key]


_single: list = [None, None]  # the last table single_byte_tokens read, and its answer


def single_byte_tokens(table) -> dict[int, int]:
    """byte -> the first token of that one byte; computed once per table (feed_bytes asks at
    every prefix: a scan of the 49k tokens each time was most of the mask tests' time)."""
    if _single[0] is not table:
        out: dict[int, int] = {}
        for i, b in enumerate(table):
            if b and len(b) == 1 and i != EOS:
                out.setdefault(b[0], i)
        _single[:] = [table, out]
    return _single[1]


def feed_bytes(m, data: bytes, table) -> None:
    """Drive a matcher through ``data`` one single-byte token at a time."""
    one = single_byte_tokens(table)
    for b in data:
        assert m.accept_token(one[b]), (data, bytes([b]))


# ------------------------------------------------------------------ masks against the oracle

PREFIXES = {
    "tool": ['', '{"name":"x"', '{"name":"x","args":', '{"name":"x","args":{', '{"name":"x","args":{"k"',
             '{"name":"x","args":{"k":', '{"name":"x","args":{"k":[1,{"a":', '{"name":"x","args":{"k":"s',
             '{"name":"x","args":{"k":12', '{"name":"x","args":{"k":{}', '{"name":"x","args":{}',
             '{"name":"x","args":{},"tags":[', '{"name":"x","args":{},"tags":[1,[[', '{"name":"x","args":{},"tags":[],"v":',
             '{"name":"x","args":{},"tags":[],"v":tr', '{"name":"x","args":{},"tags":[],"v":-1'],
    "list_of_objects": ['[', '[{', '[{"a":1}', '[{"a":{"b":[]}},', '[{"a":"\\u'],
    "untyped": ['{"s":', '{"s":[', '{"s":{"q":', '{"s":[1]', '{"s":"ab"'],
    "overlap": ['[{"x":', '[{"x":1', '[{"x":1.5', '[{"x":12}', '[{"x":1},{"x":[', '[{"y":'],
    "tree": ['{"v":1,"kids":[', '{"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[{', '{"v":1,"kids":[{"v":2,"kids":[]}',
             '{"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]},', '{"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]',
             # nine levels deep, after rows were built at shallower depths (rows shared by depth)
             '{"v":1,"kids":[' * 9 + '{"v":2,"kids":[]}', '{"v":1,"kids":[' * 9 + '{"v":2,"kids":[]}]},'],
    "linked": ['{"head":1,"tail":', '{"head":1,"tail":{"head":2,"tail":{"head":3,"tail":n',
               '{"head":1,"tail":{"head":2,"tail":null}'],
    "mutual": ['{"n":"x","meta":[1,{"a":', '{"n":"x","meta":2,"b":[', '{"n":"x","meta":2,"b":[{"n":"y","meta":{},"b":[{',
               '{"n":"x","meta":2,"b":[{"n":"y","meta":{"q":1}', '{"n":"x","meta":2,"b":[{"n":"y","meta":3,"b":[]},'],
}


@pytest.mark.parametrize("name", list(PREFIXES))
def test_masks_equal_the_oracle_over_the_whole_vocabulary(smol, pda, table, name):
    g = grammar(smol, pda, SCHEMAS[name])
    bm = allocate_token_bitmask(1, V)
    for prefix in PREFIXES[name]:
        data = prefix.encode()
        m = g.matcher()
        feed_bytes(m, data, table)
        o = HoleOracle(g.regex)
        assert o.feed(data), prefix
        m.fill_next_token_bitmask(bm, 0)
        got = allowed_ids(bm[0].numpy())
        want = ({EOS} if o.final() else set()) | accepted_ids(o, table, skip=(EOS,))
        assert got == want, (prefix, sorted(table[i] for i in got - want)[:10],
                             sorted(table[i] for i in want - got)[:10])
        # the mask and acceptance agree on every boundary-crossing token
        for i in g.holes.candidates:
            m2 = g.matcher()
            feed_bytes(m2, data, table)
            assert m2.accept_token(i) == (i in got), (prefix, table[i])


def test_regex_with_holes_is_small_and_holes_only_where_allowed():
    for schema in (TOOL, LIST_OF_OBJECTS, UNTYPED):
        with_holes = json_schema_to_regex(schema, holes=True)
        without = json_schema_to_regex(schema)
        assert any(c in with_holes for c in HOLE_CHARS.values())
        assert not any(c in without for c in HOLE_CHARS.values())
        assert len(with_holes) < 2000 < len(without), (len(with_holes), len(without))
    # a whitespace pattern keeps the bounded regex (the automaton is compact)
    assert not any(c in json_schema_to_regex(TOOL, holes=True, whitespace_pattern="[ ]?") for c in HOLE_CHARS.values())
    # a schema that could write a placeholder itself gets none
    odd = {"type": "object", "properties": {"a": {"const": "x\U0010FFFDy"}, "b": {}}, "required": ["a", "b"]}
    assert not schema_allows_holes(json.dumps(odd, ensure_ascii=False))
    assert "\U0010FFFD" in json_schema_to_regex(odd, holes=True)  # the const, literally
    assert not schema_allows_holes(json.dumps({"pattern": "\\u{10FFFB}"}))


SCHEMA_WALKS = [("tool", TOOL, "strict"), ("list_of_objects", LIST_OF_OBJECTS, "strict"),
                ("untyped", UNTYPED, "strict"), ("ambiguous", AMBIGUOUS, "strict"), ("tool-spec", TOOL, "spec"),
                ("overlap", OVERLAP, "strict"), ("tree", TREE, "strict"), ("linked", LINKED, "strict"),
                ("mutual", MUTUAL, "strict"), ("mutual-spec", MUTUAL, "spec"),
                ("named", {"type": "object", "additionalProperties": {}, "propertyNames": {"enum": ["a", "b", "c"]}},
                 "strict"), ("pydantic_node", PYDANTIC_NODE, "strict"),
                ("patterned", {"type": "object", "patternProperties": {"^n_": {"type": "integer"}, "^s_": {}},
                               "additionalProperties": False}, "strict")]


@pytest.mark.parametrize("name,schema,mode", SCHEMA_WALKS, ids=[w[0] for w in SCHEMA_WALKS])
def test_random_walks_end_in_schema_valid_json(smol, pda, table, name, schema, mode):
    g = grammar(smol, pda, schema, mode)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(zlib.crc32(name.encode()))  # not hash(): it changes between processes
    bm = allocate_token_bitmask(1, V)
    finished = deepest = 0
    for trial in range(8):
        m = g.matcher()
        # at most 600 steps, closers preferred after 80: over 16 seeds every schema finished 5-8 of 8
        out = random_walk(m, bm, table, EOS, rng, steps=600, stop_p=0.3, free_steps=60, steer_after=80)
        if m.is_terminated():
            value = json.loads(out.decode())
            validator.validate(value)
            finished += 1
            deepest = max(deepest, _depth(value))
    assert finished >= 4, finished


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def _tree(d: int) -> dict:
    return {"v": d, "kids": [_tree(d - 1), {"v": -d, "kids": []}] if d else []}


def _linked(n: int):
    return {"head": n, "tail": _linked(n - 1)} if n else None


def _mutual(d: int) -> dict:
    return {"n": f"d{d}", "meta": {"k": [d]}, "b": [_mutual(d - 1), {"free": {"x": 1}}] if d else []}


DOCS = [
    ("tool", {"name": "f", "args": {"a": [1, {"b": {"c": {"d": [[["x"]]]}}}], "e": None}, "tags": ["t", {"u": 1}],
              "v": {"deep": [[[[[[[[1]]]]]]]]}}),
    ("tool", {"name": "g", "args": {}, "tags": [], "v": "s"}),
    ("tool", {"name": "h", "args": {"q": "a\"b", "r": -1.5e3, "s": True}, "tags": [[], {}], "v": -12}),
    ("list_of_objects", [{"a": 1}, {}, {"b": [{"c": {}}]}, {"d": "x"}]),
    ("untyped", {"s": {"x": [1, 2]}, "n": 3}),
    ("untyped", {"s": "ab", "n": -4}),
    ("tree", _tree(12)),
    ("linked", _linked(30)),
    ("mutual", _mutual(8)),
    ("pydantic_node", {"name": "a", "children": [{"name": "b", "parent": {"name": "c", "parent": {"name": "d", "parent": {
        "name": "e", "children": [{"name": "f"}]}}}}], "parent": None}),
]


@pytest.mark.parametrize("name,doc", DOCS, ids=[f"{d[0]}-{i}" for i, d in enumerate(DOCS)])
def test_the_models_own_tokenization_of_deep_documents_is_accepted(smol, pda, table, name, doc):
    """Tokens that cross a hole boundary (``":{"``, ``"},"``, ``}},{"``) are the tokenizer's
    natural choice; documents nested far deeper than the bounded regex allowed are fine."""
    g = grammar(smol, pda, SCHEMAS[name])
    text = json.dumps(doc, separators=(",", ":"))
    ids = smol.encode(text, add_special_tokens=False)
    m = g.matcher()
    bm = allocate_token_bitmask(1, V)
    for i in ids:
        m.fill_next_token_bitmask(bm, 0)
        assert i in allowed_ids(bm[0].numpy()), (text, table[i])
        assert m.accept_token(i), (text, table[i])
    assert m.accept_token(EOS) and m.is_terminated()


def test_crossing_tokens_occur_in_natural_tokenizations(smol, table):
    """The documents above really exercise crossing: the test would be vacuous otherwise."""
    text = json.dumps(DOCS[0][1], separators=(",", ":")) + json.dumps(DOCS[3][1], separators=(",", ":"))
    pieces = {table[i] for i in smol.encode(text, add_special_tokens=False)}
    assert pieces & {b'":"', b'","', b'},"', b'"],"', b'},{"', b']],'}, pieces


def test_jump_forward_stops_at_holes_and_resumes_after(smol, pda, table):
    schema = {"type": "object", "properties": {"a": True, "b": {"type": "integer"}}, "required": ["a", "b"]}
    g = grammar(smol, pda, schema)
    m = g.matcher()
    assert m.find_jump_forward_string() == '{"a":'  # not the placeholder after it
    feed_bytes(m, b'{"a":', table)
    assert m.find_jump_forward_string() == ""
    feed_bytes(m, b"t", table)
    assert m.in_hole and m.find_jump_forward_string() == "rue"
    feed_bytes(m, b"rue", table)
    assert not m.in_hole  # a literal cannot go on: the hole is left at once
    assert m.find_jump_forward_string() == ',"b":'
    m2 = g.matcher()
    feed_bytes(m2, b'{"a":12', table)
    assert m2.in_hole and m2.find_jump_forward_string() == ""  # 12 may go on
    assert not m2.can_terminate()


def test_rollback_across_hole_boundaries(smol, pda, table):
    g = grammar(smol, pda, TOOL)
    text = json.dumps(DOCS[0][1], separators=(",", ":"))
    ids = smol.encode(text, add_special_tokens=False)
    m = g.matcher(max_rollback=len(ids))
    bm, bm2 = allocate_token_bitmask(1, V), allocate_token_bitmask(1, V)
    states = []
    for i in ids:
        m.fill_next_token_bitmask(bm, 0)
        states.append((m.state, m.in_hole, bm[0].clone()))
        assert m.accept_token(i)
    for k in (1, 5, 17, len(ids)):
        m.rollback(k)
        st, hole, row = states[len(ids) - k]
        m.fill_next_token_bitmask(bm2, 0)
        assert (m.state, m.in_hole) == (st, hole) and bool((bm2[0] == row).all())
        for i in ids[len(ids) - k:]:
            assert m.accept_token(i)
    assert m.accept_token(EOS)


def test_placeholders_are_never_written_but_strings_in_holes_may_hold_them(smol, pda, table):
    g = grammar(smol, pda, TOOL)
    lead = single_byte_tokens(table)[0xF4]
    m = g.matcher()
    feed_bytes(m, b'{"name":"x","args":{},"tags":[],"v":', table)
    bm = allocate_token_bitmask(1, V)
    m.fill_next_token_bitmask(bm, 0)
    assert lead not in allowed_ids(bm[0].numpy()) and not m.accept_token(lead)
    # the same character inside a string of a hole is an ordinary character; the regex's own
    # strings never write the reserved plane (index_markers.py)
    m = g.matcher()
    feed_bytes(m, '{"name":"x","args":{"k":"\U0010FFFD"},"tags":[["\U0010FFFD"]],"v":1}'.encode(), table)
    assert m.accept_token(EOS)
    m = g.matcher()
    feed_bytes(m, b'{"name":"', table)
    assert not m.accept_token(lead)


def test_compiler_gives_schemas_with_any_values_holes(smol):
    with GrammarCompiler(smol, [EOS], vocab_size=V) as c:
        g = c.compile(GrammarSpec.from_params(json_schema=TOOL))
        assert g.holes is not None and isinstance(g.matcher(), HoleMatcher)
        # a schema naming the reserved plane gets no holes, and no grammar: never generated
        odd = {"type": "object", "properties": {"a": {"const": "\U0010FFFD"}}, "required": ["a"]}
        with pytest.raises(ValueError, match="U\\+10FFFD is reserved"):
            c.compile(GrammarSpec.from_params(json_schema=odd))


# ------------------------------------------------------------------ recursive $refs as calls

def test_recursive_refs_are_calls_not_unrolled():
    from treadle.constrained.index.json_holes import MAX_CALLS

    rx = json_schema_to_regex(TREE, holes=True)
    assert sum(c in rx for c in CALL_CHARS) == 1 and rx.count(ENTRY_CHAR) == 1  # one definition
    assert len(rx) < 2000 < len(json_schema_to_regex(TREE)), len(rx)
    # the depth bound only applies without holes (a whitespace pattern keeps the unrolled regex)
    assert CALL_CHARS[0] in json_schema_to_regex(TREE, holes=True, max_recursion_depth=0)
    unrolled = json_schema_to_regex(TREE, holes=True, whitespace_pattern="[ ]?", max_recursion_depth=1)
    assert not any(c in unrolled for c in CALL_CHARS)
    mutual = json_schema_to_regex(MUTUAL, holes=True)
    assert CALL_CHARS[0] in mutual and len(mutual) < 4000 < len(json_schema_to_regex(MUTUAL)), len(mutual)
    # past MAX_CALLS recursive definitions the rest unroll as before
    many = {"type": "object", "properties": {f"p{i}": {"$ref": f"#/$defs/d{i}"} for i in range(MAX_CALLS + 2)},
            "required": [], "$defs": {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i}"}, "maxItems": 1}
                                      for i in range(MAX_CALLS + 2)}}
    rx = json_schema_to_regex(many, holes=True, max_recursion_depth=1)
    assert all(c in rx for c in CALL_CHARS) and rx.count(ENTRY_CHAR) == MAX_CALLS
    # a definition whose every value holds another has no finite value: refused, not run until
    # the tokens run out; where the recursion is optional it is fine
    loop = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
    with pytest.raises(ValueError, match="'#' has no finite value"):
        json_schema_to_regex(loop, holes=True)
    via = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                     "b": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#/$defs/a"}}]}},
           "$ref": "#/$defs/a"}
    assert ENTRY_CHAR in json_schema_to_regex(via, holes=True)
    no_exit = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                         "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1}}, "$ref": "#/$defs/a"}
    with pytest.raises(ValueError, match="no finite value|no array of that length"):
        json_schema_to_regex(no_exit, holes=True)


def test_mask_rows_are_shared_across_call_depths(smol, pda, table):
    """A row depends on the open calls only as far as its walks read them, and is cached so:
    a tree's rows at depth 12 are the ones built at depth 3 (masks at depth are checked
    against the oracle above)."""
    spec = GrammarSpec.from_params(json_schema=TREE)
    g = build_compiled_grammar(spec.to_regex(holes=True), smol, [EOS], vocab_size=V, spec=spec, pda=pda)
    bm = allocate_token_bitmask(1, V)
    one = single_byte_tokens(table)
    m = g.matcher()
    rows = []
    for level in range(12):
        for b in b'{"v":1,"kids":[':
            m.fill_next_token_bitmask(bm, 0)
            assert m.accept_token(one[b])
        m.fill_next_token_bitmask(bm, 0)
        rows.append(len(g.holes._rows))
    assert m.call_depth == 11
    assert rows[11] == rows[3] > 0, rows


def test_calls_return_and_jump_forward_sees_what_follows(smol, pda, table):
    schema = {"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}},
                                                              "end": {"const": True}}, "required": ["kids", "end"]}},
              "$ref": "#/$defs/n"}
    g = grammar(smol, pda, schema)
    m = g.matcher()
    assert m.find_jump_forward_string() == '{"kids":['
    feed_bytes(m, b'{"kids":[{"kids":[{"kids":[', table)
    assert m.call_depth == 2 and not m.can_terminate()
    feed_bytes(m, b"]", table)
    assert m.find_jump_forward_string() == ',"end":true}'  # inside the innermost call
    feed_bytes(m, b',"end":true}', table)
    assert m.call_depth == 1  # the call's value cannot go on: returned at once
    feed_bytes(m, b'],"end":true}]', table)
    assert m.call_depth == 0 and m.find_jump_forward_string() == ',"end":true}'
    feed_bytes(m, b',"end":true}', table)
    assert m.can_terminate() and m.accept_token(EOS)


def test_a_value_read_two_ways_keeps_both_until_one_dies(smol, pda, table):
    """OVERLAP: after '[{"x":1' the free-form object and the declared one both go on; '.5'
    is valid in the first only, '}' in both."""
    g = grammar(smol, pda, OVERLAP)
    m = g.matcher()
    feed_bytes(m, b'[{"x":1', table)
    assert len(m.state) == 2 and m.find_jump_forward_string() == ""
    feed_bytes(m, b".5}", table)
    assert len(m.state) == 1
    feed_bytes(m, b"]", table)
    assert m.accept_token(EOS)
