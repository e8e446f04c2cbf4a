"""Hypothesis strategies for hostile HTTP requests to every route of the server (issue 32's
fuzz suite, tests/test_hostile_inputs.py): field names each route reads, filled with values
chosen to break parsers and validators (huge and non-finite numbers, deep nesting, lone
surrogates, wrong types, grammars nested or sized past the caps), plus raw bodies that are not
JSON at all. Generation stays short (a few tokens) so a run is bounded in time."""
from __future__ import annotations

import json
from typing import Any, NamedTuple

from hypothesis import strategies as st

from treadle.runtime.sampling_params import SamplingParams

# stand-ins replaced in the serialized body: json.dumps cannot write these itself
HUGE_INT = "\x00huge-int\x00"  # an integer of 5,000 digits (past Python's int parsing limit)
DEEP_LIST = "\x00deep-list\x00"  # 50,000 nested lists
_RAW = {json.dumps(HUGE_INT): "7" * 5000, json.dumps(DEEP_LIST): "[" * 50_000 + "]" * 50_000}

DEEP = 100_000
GRAMMAR_STRINGS = [
    "[" * DEEP, '{"items":' * 5000 + "{}" + "}" * 5000, '{"a":' * DEEP + "1" + "}" * DEEP,
    "root ::= " + "(" * DEEP + '"a"' + ")" * DEEP, "(" * DEEP + "a" + ")" * DEEP, "(?=a)b", "a{99999}",
    "[z-a]", "(", "root ::= undefined", '{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}',
    '{"type": "string", "pattern": "(a|b"}', '{"type": "array", "minItems": 99999999}', "{}", "true", "null",
]

numbers = st.one_of(
    st.integers(-3, 10), st.integers(), st.sampled_from([10 ** 401, -(10 ** 401), 2 ** 63, 2 ** 64, -2 ** 63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-40, 1e-300, 5e-324, 1e300, -0.0]),
    st.just(HUGE_INT),
)
# token budgets: a few tokens, or values no server should take (never a long generation)
budgets = st.one_of(st.integers(0, 3), st.integers(max_value=-1), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([10 ** 401, 2 ** 63, 10 ** 9, True, "2"]), st.just(HUGE_INT))
texts = st.one_of(st.text(max_size=40), st.sampled_from(["", "\ud800", "\x00", "\u202e", "hi"] + GRAMMAR_STRINGS))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12) | st.just(DEEP_LIST)

# sampling params: every field, each either a plausible value or a hostile one
_SP_FIELDS = [f for f in SamplingParams.__dataclass_fields__]
sampling_params = st.fixed_dictionaries(
    {"max_new_tokens": budgets},
    optional={f: values for f in _SP_FIELDS if f != "max_new_tokens"})
token_ids = st.lists(st.one_of(st.integers(0, 1000), numbers), max_size=6)
messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                           "content": st.one_of(texts, values)},
                          optional={"tool_calls": values, "name": values, "tool_call_id": values}),
    values), max_size=3)

_GENERATE = {"text": st.one_of(texts, st.lists(texts, max_size=14)), "input_ids": st.one_of(token_ids, values),
             "sampling_params": st.one_of(sampling_params, st.lists(sampling_params, max_size=2), values),
             "stream": st.one_of(st.booleans(), values), "return_logprob": values, "logprob_start_len": values,
             "top_logprobs_num": values, "return_text_in_logprobs": values, "rid": values}
_OPENAI = {"model": values, "max_tokens": budgets, "temperature": numbers,
           "top_p": numbers, "n": numbers, "stop": values, "seed": numbers, "stream": values, "logprobs": values,
           "top_logprobs": values, "echo": values, "response_format": values, "logit_bias": values,
           "guided_json": values, "guided_regex": values, "guided_choice": values, "guided_grammar": values,
           "repetition_penalty": numbers, "frequency_penalty": numbers, "min_p": numbers, "top_k": numbers,
           "json_schema": values, "ebnf": values, "regex": values, "structural_tag": values, "rid": values,
           "stream_options": values, "best_of": values, "suffix": values, "max_completion_tokens": budgets,
           "min_tokens": budgets}
_COMPLETIONS = {**_OPENAI, "prompt": st.one_of(texts, st.lists(texts, max_size=14), token_ids, values)}
_CHAT = {**_OPENAI, "messages": st.one_of(messages, values), "tools": values, "tool_choice": values,
         "chat_template_kwargs": values, "add_generation_prompt": values, "continue_final_message": values}
_TOKENIZE = {"prompt": values, "messages": st.one_of(messages, values), "add_special_tokens": values,
             "add_generation_prompt": values, "continue_final_message": values, "chat_template_kwargs": values,
             "model": values}
_ROUTES = {"/generate": _GENERATE, "/v1/completions": _COMPLETIONS, "/v1/chat/completions": _CHAT,
           "/tokenize": _TOKENIZE, "/detokenize": {"tokens": st.one_of(token_ids, values), "model": values},
           "/abort_request": {"rid": values}, "/flush_cache": {}}
# generation routes always get a few-token budget unless the fuzz overrode it with a bad one
_BUDGET = {"/generate": None, "/v1/completions": "max_tokens", "/v1/chat/completions": "max_tokens"}
GET_ROUTES = ["/health", "/health_generate", "/version", "/get_model_info", "/get_server_info", "/metrics", "/v1/models",
              "/v1/models/default", "/v1/models/%00..%2f", "/nope", "/generate"]


class Hostile(NamedTuple):
    method: str
    path: str
    body: bytes | None
    content_type: str | None


def serialize(obj: Any) -> bytes:
    text = json.dumps(obj)
    for stand_in, raw in _RAW.items():
        text = text.replace(stand_in, raw)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def json_post(draw) -> Hostile:
    path = draw(st.sampled_from(sorted(_ROUTES)))
    fields = _ROUTES[path]
    body = draw(st.fixed_dictionaries({}, optional={**fields, "unknown_field": values}))
    if path in _BUDGET:
        key = _BUDGET[path]
        if key is None:
            sp = body.get("sampling_params")
            if sp is None:
                body["sampling_params"] = {"max_new_tokens": 2}
            for d in sp if isinstance(sp, list) else [sp]:
                if isinstance(d, dict) and d.get("max_new_tokens") is None:
                    d["max_new_tokens"] = 2
        else:
            body.setdefault(key, 2)
    return Hostile("POST", path, serialize(body), "application/json")


@st.composite
def raw_post(draw) -> Hostile:
    path = draw(st.sampled_from(sorted(_ROUTES)))
    body = draw(st.one_of(st.binary(max_size=64), st.sampled_from(
        [b"", b"{", b"[]", b"null", b"1", b'"x"', b"{\"text\": \"hi\"", b"\xff\xfe{}", b"[" * 100_000,
         b'{"text": "hi", "sampling_params": {"max_new_tokens": 1}}'])))
    ctype = draw(st.sampled_from(["application/json", None, "text/plain", "application/x-www-form-urlencoded",
                                  "application/json; charset=latin-1", "application/vnd.api+json"]))
    return Hostile("POST", path, body, ctype)


requests_ = st.one_of(
    json_post(), json_post(), json_post(), raw_post(),
    st.builds(Hostile, st.just("GET"), st.sampled_from(GET_ROUTES), st.none(), st.none()),
)
