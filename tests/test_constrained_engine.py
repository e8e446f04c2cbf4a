"""End-to-end constrained decoding through the real Engine (embedded SmolLM2-135M, CPU).

Every output of a JSON-schema request must parse and validate, regex outputs must
fullmatch, choices outputs must be one of the choices; bad grammars raise ValueError
naming the problem without breaking the batch or the engine; jump-forward saves forward
steps; it is verified, so the output (greedy, or sampled with a seed) is exactly what plain
decoding writes.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from treadle.constrained import GrammarSpec
from treadle.runtime import Engine
from treadle.runtime.tokenizer import apply_chat_template

MAX_NEW = 64

SCHEMAS: dict[str, dict] = {
    "nested_object": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                },
                "required": ["name", "id"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    "array_min_max_items": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3}
        },
        "required": ["tags"],
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
    },
    "ref_defs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -10, "maximum": 10},
                    "y": {"type": "integer", "minimum": -10, "maximum": 10},
                },
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "number_bounds": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 50},
        },
        "required": ["score", "count"],
    },
    "optional_props": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 10},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "note": {"type": "string", "maxLength": 5},
        },
        "required": ["title"],
    },
    "nullable": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "email": {"type": ["string", "null"], "maxLength": 10},
            "age": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "null"}]},
        },
        "required": ["name", "email", "age"],
    },
    "array_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "k": {"type": "string", "maxLength": 4},
                "v": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["k", "v"],
        },
        "minItems": 2,
        "maxItems": 2,
    },
    "const_and_range": {
        "type": "object",
        "properties": {"ok": {"const": True}, "code": {"type": "integer", "minimum": 100, "maximum": 599}},
        "required": ["ok", "code"],
    },
    "any_of_types": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 4}]}
        },
        "required": ["value"],
    },
}

REGEXES = [
    r"\d{3}-\d{4}",  # shorthands mean their ASCII classes (hence re.ASCII below)
    r"(19|20)[0-9][0-9]-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"^[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?$",  # boundary anchors: no-ops, as in outlines
    r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])",
    r"(yes|no), because[^\S\n][a-z ]{1,20}\.",  # [^\S\n]: whitespace but the newline
    r"[\u4e00-\u9fff]{2,4}",  # \uXXXX escapes in a class
]

CHOICES = [
    ["positive", "negative", "neutral"],
    ["café ☕", "thé 🍵", "water"],
    ["New York", "New Delhi", "Newcastle"],
    ["A", "B", "C"],
]


def _chat(tok, content: str) -> str:
    return apply_chat_template(tok, [{"role": "user", "content": content}])


def _schema_prompt(tok, schema: dict) -> str:
    return _chat(tok, "Reply with JSON matching this schema: " + json.dumps(schema))


@pytest.fixture(scope="module")
def engine():
    # jumps at any batch size here (by default a CPU engine jumps only at batch <= 4)
    with Engine(max_total_tokens=16384, jump_forward_max_batch=64) as e:
        yield e


@pytest.fixture(scope="module")
def engine_nojf():
    with Engine(max_total_tokens=16384, disable_jump_forward=True) as e:
        yield e


def _assert_valid_json(out: dict, schema: dict, what: str) -> None:
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "stop", f"{what}: finished by {reason} with text {out['text']!r}"
    try:
        value = json.loads(out["text"])
    except json.JSONDecodeError as e:
        raise AssertionError(f"{what}: output is not JSON: {out['text']!r} ({e})") from e
    jsonschema.validate(value, schema)


def _unconstrained_ok(out: dict) -> None:
    assert out["meta_info"]["completion_tokens"] > 0
    assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert out["text"] == out["text"].strip("\x00")  # decoded, no error


# ------------------------------------------------------------------ valid outputs


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_json_schemas_valid_batched_with_unconstrained(engine, mode):
    tok = engine.tokenizer
    names = list(SCHEMAS)
    prompts = [_schema_prompt(tok, SCHEMAS[n]) for n in names]
    if mode == "greedy":
        params = [{"json_schema": SCHEMAS[n], "max_new_tokens": MAX_NEW, "temperature": 0} for n in names]
    else:
        params = [{"json_schema": SCHEMAS[n], "max_new_tokens": MAX_NEW, "temperature": 0.8, "seed": 1000 + i}
                  for i, n in enumerate(names)]
    # Interleave unconstrained requests so masked and unmasked rows share decode steps.
    free_prompts = [_chat(tok, "Tell me a short story."), _chat(tok, "What is 2 + 2?"), "The capital of France is"]
    free_params = [{"max_new_tokens": 24, "temperature": 0},
                   {"max_new_tokens": 24, "temperature": 0.8, "seed": 5},
                   {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}]
    outs = engine.generate(prompts[:5] + free_prompts[:2] + prompts[5:] + free_prompts[2:],
                           params[:5] + free_params[:2] + params[5:] + free_params[2:])
    constrained = outs[:5] + outs[7:-1]
    free = outs[5:7] + outs[-1:]
    for name, out in zip(names, constrained):
        _assert_valid_json(out, SCHEMAS[name], f"{mode} {name}")
    for out in free:
        _unconstrained_ok(out)
    assert free[2]["meta_info"]["completion_tokens"] == 24  # ignore_eos runs to the limit
    engine.check_integrity()


def test_json_schema_given_as_string_equals_dict(engine):
    tok = engine.tokenizer
    schema = SCHEMAS["enums"]
    p = _schema_prompt(tok, schema)
    a, b = engine.generate([p, p], [{"json_schema": schema, "max_new_tokens": MAX_NEW, "temperature": 0},
                                    {"json_schema": json.dumps(schema), "max_new_tokens": MAX_NEW, "temperature": 0}])
    _assert_valid_json(a, schema, "dict schema")
    assert a["text"] == b["text"]


def _deepest(value, depth: int = 0) -> int:
    if isinstance(value, dict):
        return max([_deepest(v, depth + 1) for v in value.values()], default=depth + 1)
    if isinstance(value, list):
        return max([_deepest(v, depth + 1) for v in value], default=depth + 1)
    return depth


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_any_json_schemas_unbounded_nesting(engine, temperature):
    """{} / {"type": "object"} / {"type": "array"} go to the pushdown grammar: outputs parse,
    have the root kind asked for, and may nest deeper than the regex backend's three levels."""
    tok = engine.tokenizer
    asks = [({}, "Write any JSON value."), ({"type": "object"}, "Describe a family tree as nested JSON."),
            ({"type": "array"}, "List three cities as JSON."),
            ({"type": "object"}, "Write JSON nested five levels deep: a in b in c in d in e.")]
    params = [{"json_schema": s, "max_new_tokens": 96, "temperature": temperature, "seed": 7 + i}
              for i, (s, _) in enumerate(asks)]
    outs = engine.generate([_chat(tok, q) for _, q in asks], params)
    for (schema, _), out in zip(asks, outs):
        if out["meta_info"]["finish_reason"]["type"] == "length":
            continue  # cut by max_new_tokens: a prefix, checked below with a forced depth
        _assert_valid_json(out, schema, f"any-json {schema}")
    engine.check_integrity()
    rx = {"json_schema": {"type": "object"}, "max_new_tokens": 64, "temperature": 0}
    deep = engine.generate(_chat(tok, 'Reply with exactly this JSON: {"a":{"b":{"c":{"d":{"e":1}}}}}'), rx)
    _assert_valid_json(deep, {"type": "object"}, "deep object")
    assert _deepest(json.loads(deep["text"])) >= 4, deep["text"]


TOOL_CALL = {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
             "required": ["name", "arguments"]}
FREE_FORM_LIST = {"type": "array", "items": {"type": "object"}, "minItems": 1}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_schemas_with_free_form_members_nest_to_any_depth(engine, temperature):
    """A free-form member (a tool call's ``arguments: {"type": "object"}``, items of free-form
    objects) is a hole run on the pushdown automaton (json_holes.py), not a regex unrolled two
    levels: outputs validate, and a document nested past that bound comes out as asked."""
    tok = engine.tokenizer
    deep = '{"name":"f","arguments":{"a":{"b":{"c":{"d":[1,{"e":null}]}}}}}'
    asks = [(TOOL_CALL, "Reply with exactly this JSON: " + deep),
            (TOOL_CALL, "Call the function search with a query, as JSON."),
            (FREE_FORM_LIST, "List two people with name and address objects as JSON.")]
    params = [{"json_schema": s, "max_new_tokens": 64, "temperature": temperature, "seed": 11 + i}
              for i, (s, _) in enumerate(asks)]
    outs = engine.generate([_chat(tok, q) for _, q in asks], params)
    for (schema, _), out in zip(asks, outs):
        if out["meta_info"]["finish_reason"]["type"] == "length":
            continue  # a small model may ramble on inside a free-form value until max_new_tokens
        _assert_valid_json(out, schema, f"free-form members {schema}")
    if temperature == 0.0:
        assert outs[0]["text"] == deep and _deepest(json.loads(deep)) == 7
    engine.check_integrity()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_regex_outputs_fullmatch(engine, temperature):
    tok = engine.tokenizer
    prompts = [_chat(tok, q) for q in ("Give a phone number.", "Give a date.", "Name a person.",
                                         "Give an IP address.", "Is the sky blue? Explain.",
                                         "Write a word in Chinese.")]
    params = [{"regex": rx, "max_new_tokens": MAX_NEW, "temperature": temperature, "seed": 20 + i}
              for i, rx in enumerate(REGEXES)]
    outs = engine.generate(prompts + ["Once upon a time"],
                           params + [{"max_new_tokens": 16, "temperature": temperature, "seed": 3}])
    for rx, out in zip(REGEXES, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (rx, out)
        assert re.fullmatch(rx, out["text"], re.ASCII), (rx, out["text"])
    _unconstrained_ok(outs[-1])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_grammar_that_can_only_end_wins_over_min_new_tokens(engine, temperature):
    """min_new_tokens bans the stop tokens, but where the grammar allows nothing but its end the
    end wins: the reply is complete and finishes "stop" (every token used to be masked, token 0
    was drawn and the grammar aborted the request). Where the grammar can go on, the ban holds.
    A batch of 4 takes CPU jump-forward drafts (their masks too); one request alone as well."""
    prompt = _chat(engine.tokenizer, "Is the sky blue? Answer yes or no.")
    params = [{"regex": "(yes|no)", "min_new_tokens": 5}, {"choices": ["yes", "no"], "min_new_tokens": 5},
              {"json_schema": {"type": "boolean"}, "min_new_tokens": 4},
              {"regex": "[a-z ]{1,60}", "min_new_tokens": 6}]
    params = [{**p, "max_new_tokens": 16, "temperature": temperature, "seed": 50 + i} for i, p in enumerate(params)]
    for outs in (engine.generate([prompt] * 4, params), [engine.generate(prompt, params[1])]):
        for p, out in zip(params, outs):
            info = out["meta_info"]
            if "regex" in p and "60" in p["regex"]:
                assert info["finish_reason"]["type"] in ("stop", "length") and info["completion_tokens"] >= 6, info
                assert re.fullmatch("[a-z ]{1,60}", out["text"]), out["text"]
            else:
                assert info["finish_reason"]["type"] == "stop", (p, info)
                assert out["text"] in ("yes", "no", "true", "false"), out["text"]
    engine.check_integrity()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_choices_outputs_are_one_of_the_choices(engine, temperature):
    tok = engine.tokenizer
    questions = ["Is 'I love it' positive, negative or neutral?", "What do you drink in the morning?",
                 "Name a city.", "Pick A, B or C."]
    prompts = [_chat(tok, q) for q in questions]
    params = [{"choices": c, "max_new_tokens": 32, "temperature": temperature, "seed": 40 + i}
              for i, c in enumerate(CHOICES)]
    outs = engine.generate(prompts, params)
    for choices, out in zip(CHOICES, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert out["text"] in choices, (choices, out["text"])
        assert engine.tokenizer.decode(out["output_ids"], skip_special_tokens=True) == out["text"]


EBNF_TASKS = [
    ("Write an arithmetic expression that equals 10.",
     'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor ("*" factor)*\n'
     'factor ::= [0-9]+ | "(" expr ")"'),
    ("List three fruits.", 'root ::= "- " item ("\\n- " item){2}\nitem ::= [A-Za-z]+ (" " [a-z]+)?'),
    ("Write a SQL query for the names of users older than 30.",
     'root ::= "SELECT " cols " FROM " name (" WHERE " cond)? ";"\ncols ::= name (", " name)* | "*"\n'
     'name ::= [a-z_]+\ncond ::= name (" > " | " < " | " = ") [0-9]+'),
    ("Is the sky blue? Answer and give a confidence.", 'root ::= ("yes" | "no") ", confidence " [0-9] "/10"'),
]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_ebnf_outputs_are_in_the_grammar(engine, temperature):
    from json_checks import HoleOracle

    from treadle.constrained.ebnf.ebnf import ebnf_to_regex

    tok = engine.tokenizer
    prompts = [_chat(tok, q) for q, _ in EBNF_TASKS]
    params = [{"ebnf": g, "max_new_tokens": 48, "temperature": temperature, "seed": 60 + i}
              for i, (_, g) in enumerate(EBNF_TASKS)]
    outs = engine.generate(prompts + ["Once upon a time"],
                           params + [{"max_new_tokens": 12, "temperature": temperature, "seed": 5}])
    finished = 0
    for (_, grammar), out in zip(EBNF_TASKS, outs):
        reason = out["meta_info"]["finish_reason"]["type"]
        if reason == "stop":  # in the grammar, nesting run as calls by an oracle (tests/json_checks.py)
            o = HoleOracle(ebnf_to_regex(grammar, calls=True))
            assert o.feed(out["text"].encode()) and o.final(), (grammar, out["text"])
            finished += 1
        else:  # ran out of tokens: a viable prefix of the grammar
            assert reason == "length", out
            m = engine.scheduler.grammar_compiler.compile(GrammarSpec("ebnf", grammar)).matcher()
            assert all(m.accept_token(t) for t in out["output_ids"]), out["text"]
    assert finished >= 3, [o["text"] for o in outs]
    _unconstrained_ok(outs[-1])
    engine.check_integrity()


FILE_TREE = {"$defs": {"node": {"type": "object", "properties": {
    "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["name", "children"]}}, "$ref": "#/$defs/node"}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_recursive_schemas_nest_to_any_depth(engine, temperature):
    """A recursive ``$ref`` is a call of its definition (json_holes.py), not a regex unrolled
    three levels: outputs validate, and a tree nested past that bound comes out as asked."""
    tok = engine.tokenizer
    deep = ('{"name":"a","children":[{"name":"b","children":[{"name":"c","children":[{"name":"d","children":'
            '[{"name":"e","children":[]}]}]}]},{"name":"f","children":[]}]}')
    asks = ["Reply with exactly this JSON: " + deep, "Describe a small folder tree with two files as JSON."]
    params = [{"json_schema": FILE_TREE, "max_new_tokens": 96, "temperature": temperature, "seed": 21 + i}
              for i in range(len(asks))]
    outs = engine.generate([_chat(tok, q) for q in asks], params)
    for out in outs:
        if out["meta_info"]["finish_reason"]["type"] == "length":
            continue  # a small model may nest on until max_new_tokens
        _assert_valid_json(out, FILE_TREE, "recursive schema")
    if temperature == 0.0:  # the copy nests deeper than the unrolled regex would allow
        from treadle.constrained.schema.json_schema import json_schema_to_regex

        text = outs[0]["text"]
        assert text.startswith(deep[:100]) and _deepest(json.loads(text)) >= 9, text
        assert re.fullmatch(json_schema_to_regex(FILE_TREE), text) is None
    engine.check_integrity()


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("params,needle", [
    ({"regex": "(ab"}, "regex"),
    ({"regex": "[a-"}, "regex"),
    ({"json_schema": {"type": "number", "multipleOf": 0.3}}, "multipleOf"),
    ({"json_schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?<=x)y$"}}}},
     "pattern"),
    ({"json_schema": "{not json"}, "json"),
    ({"choices": []}, "choices"),
    ({"regex": "[a-z]+", "choices": ["a", "b"]}, "at most one"),
    ({"ebnf": 'root ::= "(" root ")"'}, "matches nothing (does some rule recurse"),
    ({"json_schema": {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}}, "no finite value"),
    ({"ebnf": "root ::= value\nvalue ::= [0-9"}, "line 2 col 11: unterminated character class"),
    ({"ebnf": 'root ::= "a"', "json_schema": {"type": "string"}}, "at most one"),
])
def test_bad_grammar_raises_value_error_naming_it(engine, params, needle):
    with pytest.raises(ValueError) as info:
        engine.generate("Hello", {**params, "max_new_tokens": 8, "temperature": 0})
    assert needle.lower() in str(info.value).lower(), str(info.value)


def test_bad_grammar_in_batch_leaves_others_and_engine_intact(engine):
    tok = engine.tokenizer
    schema = SCHEMAS["nested_object"]
    good_prompt = _schema_prompt(tok, schema)
    good = {"json_schema": schema, "max_new_tokens": MAX_NEW, "temperature": 0}
    free = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    before = engine.generate([good_prompt, "The weather today"], [good, free])
    _assert_valid_json(before[0], schema, "before")

    gen0 = engine.get_server_info()["generated_tokens"]
    with pytest.raises(ValueError, match="multipleOf"):
        engine.generate([good_prompt, "Hello", "The weather today"],
                        [good, {"json_schema": {"type": "number", "multipleOf": 0.3}, "max_new_tokens": 8}, free])
    # Nothing of the failed batch ran: its grammars are compiled before any of it is queued
    # (its good requests once ran to completion, their results then dropped)
    ran = engine.get_server_info()["generated_tokens"] - gen0
    assert ran == 0
    with pytest.raises(ValueError, match="regex"):
        engine.generate(["Hi", "The weather today"], [{"regex": "(unclosed", "max_new_tokens": 8}, free])
    engine.check_integrity()
    info = engine.get_server_info()
    assert info["num_running"] == 0 and info["num_waiting"] == 0

    after = engine.generate([good_prompt, "The weather today"], [good, free])
    assert [o["text"] for o in after] == [o["text"] for o in before]
    engine.check_integrity()


def test_a_slow_grammar_does_not_stall_other_requests():
    """A grammar whose compile does not end (it waits for a gate the test holds, as a regex whose
    outlines-core index takes a minute kept its worker: 4,000 alternatives) compiles off the
    scheduler: a plain request queued right after it is served while it compiles, which the old
    scheduler, blocked in the compile, had not even admitted; and a new grammar compiles on the
    other worker meanwhile (with one worker it waited for the slow one: 58.6 s in the tester's
    run). Both are checked by the gate: it is still closed when their requests return."""
    import threading

    gate = threading.Event()
    with Engine(max_total_tokens=4096) as e:
        e.generate("Hi", {"max_new_tokens": 1, "regex": "ok"})  # the compile worker is up
        compiler = e.scheduler.grammar_compiler
        real = compiler._regex_in

        def held(w, spec, *args):  # the slow grammar holds its worker until the gate opens
            if spec.value == "slow[0-9]":
                gate.wait()
            return real(w, spec, *args)

        compiler._regex_in = held
        # only a scheduler or a compiler that waits for the held compile needs this: it ends
        # the wait (the test then fails), it does not decide the outcome
        rescue = threading.Timer(120, gate.set)
        rescue.start()
        try:
            (r_slow,), _, _ = e._build("Hi", None, {"regex": "slow[0-9]", "max_new_tokens": 4}, False, None, 0,
                                       False, "slow")
            (r_plain,), _, _ = e._build("The weather today", None,
                                        {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
                                        False, None, 0, False, "plain")
            slow_box = e._submit(r_slow)
            plain = e._collect(r_plain, e._submit(r_plain))
            assert not gate.is_set(), "the plain request waited for the slow grammar's compile"
            assert plain["meta_info"]["completion_tokens"] == 8
            assert slow_box.empty(), "the slow grammar's outcome came first: the scheduler waited on it"
            small = e.generate("Pick a number:", {"regex": "[0-9]{3}q", "max_new_tokens": 8})
            assert not gate.is_set(), "the new grammar waited for the slow one's worker"
            assert re.fullmatch("[0-9]{3}q", small["text"]), small
            assert slow_box.empty()
            e.abort("slow")
        finally:
            rescue.cancel()
            gate.set()
        out = e._collect(r_slow, slow_box)
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        e.check_integrity()


def test_aborting_a_request_whose_grammar_compiles_frees_its_worker():
    """One compile worker, busy with a grammar that takes a minute; its request is aborted:
    the compile is cancelled (the worker killed and replaced), so the next request's new
    grammar compiles at once. Before, the worker built the aborted grammar to its end while
    every new grammar waited (173 s in a run with the slowest one of the test above)."""
    slow = "(" + "|".join(f"zz{i}[a-z]{{0,5}}" for i in range(4000)) + ")"  # outlines' index: a minute
    with Engine(max_total_tokens=4096, grammar_compile_timeout_s=600, grammar_compile_workers=1,
                grammar_max_size=10**9, grammar_index="outlines") as e:  # the default cap would refuse it at once
        e.generate("Hi", {"max_new_tokens": 1, "regex": "ok"})  # the compile worker is up
        compiler = e.scheduler.grammar_compiler
        before = [w.proc.proc.pid for w in compiler._workers]
        (r_slow,), _, _ = e._build("Hi", None, {"regex": slow, "max_new_tokens": 4}, False, None, 0, False, "slow")
        box = e._submit(r_slow)
        import time

        deadline = time.monotonic() + 60
        while compiler._idle.qsize():  # until the worker has taken the slow grammar
            assert time.monotonic() < deadline
            time.sleep(0.05)
        e.abort("slow")
        assert e._collect(r_slow, box)["meta_info"]["finish_reason"]["type"] == "abort"
        small = e.generate("Pick a number:", {"regex": "[0-9]{3}q", "max_new_tokens": 8})
        assert re.fullmatch("[0-9]{3}q", small["text"]), small
        after = [w.proc.proc.pid for w in compiler._workers]
        assert len(after) == 1 and after != before, (before, after)
        # a grammar two requests wait for (its checks take seconds) survives the abort of one
        mid = "(" + "|".join(f"zz{i}[a-z]{{0,5}}" for i in range(400)) + ")"
        both = [e._build("Hi", None, {"regex": mid, "max_new_tokens": 8}, False, None, 0, False, rid)[0][0]
                for rid in ("a", "b")]
        box_a, box_b = e._submit(both[0]), e._submit(both[1])
        e.abort("a")
        assert e._collect(both[0], box_a)["meta_info"]["finish_reason"]["type"] == "abort"
        assert re.fullmatch(mid, e._collect(both[1], box_b)["text"])
        e.check_integrity()


# ------------------------------------------------------------------ jump-forward


def test_forced_text_longer_than_the_matcher_history_is_jumped_in_parts(engine):
    # a single choice of ~70 tokens: all of it is forced, more than the 64 tokens the grammar
    # matcher can roll back. The draft used to be the whole text, its rollback raised, and the
    # batch step failed every request in it (a 500 for the plain request beside it too).
    # Digits: SmolLM2 has one token per digit and none of two, so the only spelling the mask
    # allows is the draft's and each part is taken whole (a sentence was written a character
    # at a time beside 64-token drafts, ~170 steps, 30-117 s)
    tok = engine.tokenizer
    forced = "0123456789" * 7
    assert len(tok.encode(forced)) > 64
    i0 = engine.get_server_info()
    outs = engine.generate([_chat(tok, "Say it."), _chat(tok, "Count to three.")],
                           [{"choices": [forced], "max_new_tokens": 400, "temperature": 0},
                            {"max_new_tokens": 24, "temperature": 0}])
    assert outs[0]["text"] == forced and outs[0]["meta_info"]["finish_reason"]["type"] == "stop"
    assert outs[1]["meta_info"]["finish_reason"]["type"] in ("stop", "length") and outs[1]["text"]
    assert engine.get_server_info()["jump_tokens"] - i0["jump_tokens"] > 0  # the forced text was jumped over
    engine.check_integrity()


def test_jump_forward_on_vs_off_greedy(engine, engine_nojf):
    tok = engine.tokenizer
    specs = [({"json_schema": s}, _schema_prompt(tok, s)) for s in SCHEMAS.values()]
    specs += [({"regex": rx}, _chat(tok, "Answer in the given format.")) for rx in REGEXES]
    specs += [({"choices": c}, _chat(tok, "Pick one.")) for c in CHOICES]
    prompts = [p for _, p in specs]
    params = [{**g, "max_new_tokens": MAX_NEW, "temperature": 0} for g, _ in specs]

    results = {}
    for name, eng in (("on", engine), ("off", engine_nojf)):
        i0 = eng.get_server_info()
        outs = eng.generate(prompts, params, return_logprob=True)
        i1 = eng.get_server_info()
        results[name] = (outs, i1["forward_steps"] - i0["forward_steps"], i1["jump_tokens"] - i0["jump_tokens"])
    on, steps_on, jumped_on = results["on"]
    off, steps_off, jumped_off = results["off"]

    assert jumped_off == 0
    assert jumped_on > 0
    assert steps_on < steps_off, (steps_on, steps_off)
    for (g, _), a, b in zip(specs, on, off):
        for out in (a, b):
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out
            if "json_schema" in g:
                jsonschema.validate(json.loads(out["text"]), g["json_schema"])
            elif "regex" in g:
                assert re.fullmatch(g["regex"], out["text"]), out["text"]
            else:
                assert out["text"] in g["choices"]
        # greedy jumps are verified against the model's own choice: same tokens, same text
        assert a["output_ids"] == b["output_ids"], (g, a["text"], b["text"])
        assert a["text"] == b["text"]
        # jumped tokens carry their real logprob (the logits were computed in the extend)
        lp_on = [lp for lp, _, _ in a["meta_info"]["output_token_logprobs"]]
        lp_off = [lp for lp, _, _ in b["meta_info"]["output_token_logprobs"]]
        assert lp_on == pytest.approx(lp_off, abs=1e-3)
    # Jump-forward tokens count as completion tokens, and outputs still decode to the text.
    for a in on:
        assert tok.decode(a["output_ids"], skip_special_tokens=True) == a["text"]
    engine.check_integrity()
    engine_nojf.check_integrity()


RETOKENIZE_CASES = [
    # (grammar, question): forced text at tricky token boundaries.
    # forced `", "b": "` right after a closing quote: the quote can merge into `",` etc.
    ({"regex": r'\{"a": "[a-z]{1,8}", "b": "[a-z]{1,8}"\}'}, 'Fill in: {"a": "...", "b": "..."}'),
    # a forced unicode literal (const) followed by free text
    ({"json_schema": {"type": "object", "properties": {"drink": {"const": "café ☕"},
                                                       "cups": {"type": "integer", "minimum": 1, "maximum": 9}},
                      "required": ["drink", "cups"]}}, "How many cups of coffee?"),
    # choices sharing a forced unicode prefix
    ({"choices": ["café ☕ au lait", "café ☕ noir"]}, "How do you take your coffee?"),
    ({"choices": ["Ünïcödé ✓ done"]}, "Say it."),
    # forced newline + indentation: SmolLM2 writes "\n", " ", " A", "g", "e" under the mask
    # where the canonical tokens are "\n ", " Age"
    ({"regex": r"Name: [A-Z][a-z]{1,8}\n  Age: [0-9]{1,2}\n  City: [A-Z][a-z]{1,8}"}, "Describe a person."),
]


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def _check_grammar_output(g: dict, text: str) -> None:
    if "regex" in g:
        assert re.fullmatch(g["regex"], text), text
    elif "choices" in g:
        assert text in g["choices"]
    else:
        value = json.loads(text)
        jsonschema.validate(value, g["json_schema"])
        assert value["drink"] == "café ☕"


def test_retokenization_at_jump_boundaries_greedy_is_exact(engine, engine_nojf):
    """Greedy: drafts at tricky boundaries are verified, so the output equals plain decoding."""
    tok = engine.tokenizer
    prompts = [_chat(tok, q) for _, q in RETOKENIZE_CASES]
    params = [{**g, "max_new_tokens": MAX_NEW, "temperature": 0} for g, _ in RETOKENIZE_CASES]
    i0 = engine.get_server_info()
    on = engine.generate(prompts, params)
    i1 = engine.get_server_info()
    off = engine_nojf.generate(prompts, params)
    assert i1["jump_tokens"] > i0["jump_tokens"]
    assert i1["draft_tokens"] - i0["draft_tokens"] >= i1["jump_tokens"] - i0["jump_tokens"]
    for (g, _), a, b in zip(RETOKENIZE_CASES, on, off):
        assert a["meta_info"]["finish_reason"]["type"] == "stop", a
        assert a["output_ids"] == b["output_ids"], (g, a["text"], b["text"])
        _check_grammar_output(g, a["text"])
    engine.check_integrity()


def test_jump_forward_on_vs_off_sampled(engine, engine_nojf):
    """Sampled requests take verified jumps too: each draft position is sampled with its own
    mask, penalties and random draw (the RNG position moves on with the draft), so a seeded
    request writes the same tokens, with the same logprobs, with jump-forward on or off."""
    tok = engine.tokenizer
    prompts = [_chat(tok, q) for _, q in RETOKENIZE_CASES]
    params = [{**g, "max_new_tokens": MAX_NEW, "temperature": 0.8, "top_p": 0.95, "seed": 5 + i}
              for i, (g, _) in enumerate(RETOKENIZE_CASES)]
    # penalties move with the draft as well: row j counts the draft tokens before it
    params[-1] = {**params[-1], "frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.2}
    i0 = engine.get_server_info()
    on = engine.generate(prompts, params, return_logprob=True, top_logprobs_num=2)
    i1 = engine.get_server_info()
    off = engine_nojf.generate(prompts, params, return_logprob=True, top_logprobs_num=2)
    assert i1["jump_tokens"] > i0["jump_tokens"]
    for (g, _), a, b in zip(RETOKENIZE_CASES, on, off):
        assert a["meta_info"]["finish_reason"]["type"] == "stop", a
        assert a["output_ids"] == b["output_ids"], (g, a["text"], b["text"])
        _check_grammar_output(g, a["text"])
        # jumped tokens carry their real logprobs, not 0.0 for "forced"
        lp_on = [lp for lp, _, _ in a["meta_info"]["output_token_logprobs"]]
        lp_off = [lp for lp, _, _ in b["meta_info"]["output_token_logprobs"]]
        assert lp_on == pytest.approx(lp_off, abs=1e-3)
        tops_on = [[t for _, t, _ in row] for row in a["meta_info"]["output_top_logprobs"]]
        tops_off = [[t for _, t, _ in row] for row in b["meta_info"]["output_top_logprobs"]]
        assert tops_on == tops_off
    # the all-forced literal is mostly jumped, yet its tokens are the model's own choices
    lit = on[3]
    assert lit["text"] == "Ünïcödé ✓ done"
    assert sum(lp == 0.0 for lp, _, _ in lit["meta_info"]["output_token_logprobs"]) < len(lit["output_ids"])
    engine.check_integrity()
    engine_nojf.check_integrity()


def test_jump_forward_waits_for_small_batches():
    """The default policy on CPU: a jump is proposed only while at most 4 requests run."""
    schema = SCHEMAS["nested_object"]
    with Engine(max_total_tokens=8192) as e:
        sched = e.scheduler
        seen: list[int] = []
        orig = sched._propose_draft

        def propose(req):
            seen.append(len(sched.running))
            return orig(req)

        sched._propose_draft = propose
        tok = e.tokenizer
        p = {"json_schema": schema, "max_new_tokens": MAX_NEW, "temperature": 0}
        outs = e.generate([_schema_prompt(tok, schema)] * 8, [p] * 8)
        assert len({o["text"] for o in outs}) == 1  # same greedy output whatever the batch did
        assert seen and max(seen) <= 4, seen
        assert e.get_server_info()["draft_tokens"] > 0


def test_the_engine_loop_does_not_spin_while_a_grammar_compiles(engine, monkeypatch):
    """While the only work is a grammar compiling, the loop waits up to GRAMMAR_POLL_S on its
    inbox before each look at it, instead of running empty steps back to back (it took 138k
    steps in 1.4 s, a core the compile worker needed on a small box). Counted, not timed: the
    compile is held until the loop has waited 20 times (or, spinning, has run 500 empty steps),
    and every empty step but the one right after the request arrived follows such a wait."""
    import threading
    import uuid

    from treadle.runtime.scheduler import GRAMMAR_POLL_S

    sched = engine.scheduler
    compiler = sched.grammar_compiler
    counts = {"idle_steps": 0, "waits": 0}
    gate = threading.Event()
    # a regex no earlier request compiled (hex: no digit of it can end the class early)
    rx = r"[a-z]{3,9}@[a-z]{2,8}\.(com|org|net)-" + uuid.uuid4().hex

    def only_compiling() -> bool:
        return bool(sched.grammar_queue) and not sched.has_runnable_work()

    real_step, real_get, real_regex_in = sched.step, engine._inbox.get, compiler._regex_in

    def step():
        if only_compiling():
            counts["idle_steps"] += 1
            if counts["idle_steps"] >= 500:
                gate.set()
        return real_step()

    def get(block=True, timeout=None):  # the engine thread's inbox wait
        if block and timeout is not None and timeout >= GRAMMAR_POLL_S and only_compiling():
            counts["waits"] += 1
            if counts["waits"] >= 20:
                gate.set()
        return real_get(block, timeout)

    def held(w, spec, *args):
        if spec.value == rx:
            gate.wait()
        return real_regex_in(w, spec, *args)

    monkeypatch.setattr(sched, "step", step)
    monkeypatch.setattr(engine._inbox, "get", get)
    monkeypatch.setattr(compiler, "_regex_in", held)
    try:
        out = engine.generate("Write an address:", {"regex": rx, "max_new_tokens": 40, "temperature": 0})
    finally:
        gate.set()
    assert re.fullmatch(rx, out["text"]) or out["meta_info"]["finish_reason"]["type"] == "length", out
    assert counts["waits"] >= 20, counts
    assert counts["idle_steps"] <= counts["waits"] + 1, counts


def test_drafts_the_model_leaves_at_once_shrink(engine):
    """A sentence the greedy model spells in smaller pieces than the draft's tokens: each jump
    draft is left at its first token. The next draft is then shorter (down to one token) rather
    than the whole forced rest, a 30-token extend a step for nothing; the output is the same
    (draft lengths change the work, not the tokens)."""
    tok = engine.tokenizer
    forced = "The quick brown fox jumps over the lazy dog. " * 2
    i0 = engine.get_server_info()
    out = engine.generate(_chat(tok, "Say it."), {"choices": [forced], "max_new_tokens": 200, "temperature": 0})
    assert out["text"] == forced
    i1 = engine.get_server_info()
    proposed, steps = i1["draft_tokens"] - i0["draft_tokens"], len(out["output_ids"])
    assert proposed <= 2 * steps + len(tok.encode(forced)), (proposed, steps)
    engine.check_integrity()
