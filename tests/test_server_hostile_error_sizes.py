"""Error bodies stay small whatever the client sends: a message quotes a client's value (a model
name, an unknown field's name, a role, a tool name, a value of the wrong type, a grammar's rule
name) only by a bounded prefix with its length. Before, a 5 MB model name made a 5 MB 404 and
a 5 MB unknown field name a 10 MB 400 (its name in the message and in `param`). Also: a
`chat_template_kwargs` nested hundreds of levels deep is a 400 naming the field and the limit,
not one quoting Python's "maximum recursion depth exceeded"."""
from __future__ import annotations

import json

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

pytestmark = pytest.mark.slow
T = 120
BIG = "x" * 5_000_000
MAX_BODY = 8192  # an error body's bytes, whatever the request held
MSGS = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f"}}


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


def post(srv, path: str, body: dict) -> requests.Response:
    return requests.post(srv.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"},
                         timeout=T)


def chat(**fields) -> dict:
    return {"model": "default", "messages": MSGS, "max_tokens": 1, **fields}


HOSTILE = {
    "chat_unknown_model": ("/v1/chat/completions", {"model": BIG, "messages": MSGS}, 404, "model"),
    "completions_unknown_model": ("/v1/completions", {"model": BIG, "prompt": "hi"}, 404, "model"),
    "chat_unknown_field_name": ("/v1/chat/completions", chat(**{BIG: 1}), 400, "unknown field"),
    "generate_unknown_field_name": ("/generate", {"text": "hi", BIG: 1}, 400, "unknown field"),
    "generate_unknown_sampling_param": ("/generate", {"text": "hi", "sampling_params": {BIG: 1}}, 400,
                                        "unknown sampling_params field"),
    "tokenize_unknown_field_name": ("/tokenize", {"prompt": "hi", BIG: 1}, 400, "unknown field"),
    "chat_role": ("/v1/chat/completions", chat(messages=[{"role": BIG, "content": "hi"}]), 400, "role"),
    "chat_tool_choice_name": ("/v1/chat/completions",
                              chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": BIG}}), 400,
                              "tool_choice"),
    "generate_seed_string": ("/generate", {"text": "hi", "sampling_params": {"seed": BIG}}, 400, "seed"),
    "generate_lenient_string": ("/generate", {"text": "hi", "sampling_params": {"json_schema_lenient": BIG}}, 400,
                                "json_schema_lenient"),
    # quoted by the grammar compilers: bounded where the error body is made
    "chat_ebnf_rule_name": ("/v1/chat/completions", chat(ebnf="root ::= " + BIG), 400, "ebnf"),
    "chat_json_schema_type": ("/v1/chat/completions",
                              chat(response_format={"type": "json_schema",
                                                    "json_schema": {"name": "x", "schema": {"type": BIG}}}), 400,
                              "json_schema"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_error_quoting_a_5mb_value_stays_small_and_names_the_problem(srv, case):
    path, body, status, says = HOSTILE[case]
    r = post(srv, path, body)
    assert r.status_code == status, r.text[:500]
    assert len(r.content) < MAX_BODY, (len(r.content), r.text[:300])
    err = r.json()["error"]
    assert says in err["message"], err["message"][:500]
    assert err["param"] is None or len(err["param"]) < 300, len(err["param"])


def test_quoted_value_shows_its_start_and_length(srv):
    r = post(srv, "/v1/chat/completions", {"model": "m-" + BIG, "messages": MSGS})
    assert r.status_code == 404
    msg = r.json()["error"]["message"]
    assert "'m-xxx" in msg and "5,000,002 characters" in msg, msg
    assert 'or send "default"' in msg  # the rest of the message is whole


def test_a_hundred_thousand_unknown_fields_list_a_few_and_count_the_rest(srv):
    body = chat(**{f"field{i:06d}": 1 for i in range(100_000)})
    r = post(srv, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text[:300]
    assert len(r.content) < MAX_BODY, len(r.content)
    err = r.json()["error"]
    assert err["message"].startswith("unknown field(s): field000000, field000001"), err["message"][:200]
    assert "and 99,992 more" in err["message"], err["message"][-200:]
    assert err["param"] == "field000000"


def test_chat_template_kwargs_nested_past_the_limit_is_a_400_naming_field_and_limit(srv):
    deep = 1
    for _ in range(900):
        deep = {"a": deep}
    r = post(srv, "/v1/chat/completions", chat(chat_template_kwargs={"x": deep}))
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "chat_template_kwargs", err
    assert "128 levels" in err["message"] and "recursion" not in err["message"], err["message"]
    shallow = 1
    for _ in range(100):
        shallow = {"a": shallow}
    ok = post(srv, "/v1/chat/completions", chat(chat_template_kwargs={"x": shallow}))
    assert ok.status_code == 200, ok.text[:300]
    assert wait_idle(srv.url)["num_in_flight"] == 0


@pytest.mark.parametrize("field", ["n", "top_k", "max_new_tokens", "min_new_tokens"])
def test_a_4300_digit_integer_is_quoted_by_its_first_digits_and_count(srv, field):
    sign = "-" if field in ("top_k", "max_new_tokens") else ""
    raw = '{"text": "hi", "sampling_params": {"%s": %s%s}}' % (field, sign, "9" * 4300)
    r = requests.post(srv.url + "/generate", data=raw, headers={"Content-Type": "application/json"}, timeout=T)
    assert r.status_code == 400, r.text[:300]
    assert len(r.content) < 1024, (len(r.content), r.text[:300])
    assert "(4,300 digits)" in r.json()["error"]["message"], r.text[:500]


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "hi", "rid": "r" * 1_000_000, "sampling_params": {"max_new_tokens": 1, "n": 64}}),
    ("/generate", {"text": ["a", "b"], "rid": ["r" * 1_000_000, "s"], "sampling_params": {"max_new_tokens": 1}}),
    ("/v1/chat/completions", {"model": "default", "messages": MSGS, "max_tokens": 1, "n": 64, "rid": "r" * 1_000_000}),
], ids=["generate_n64", "generate_batch", "chat_n64"])
def test_a_megabyte_rid_is_a_400_not_copied_into_every_sample(srv, path, body):
    # before: a 200 whose 64 results each echoed "<rid>-<i>", a 64 MB answer from a 1 MB body
    r = post(srv, path, body)
    assert r.status_code == 400, (r.status_code, len(r.content))
    err = r.json()["error"]
    assert err["param"] == "rid" and "1,000,000 characters" in err["message"] and "512" in err["message"], err
    ok = post(srv, path, {**body, "rid": "r" * 512} if isinstance(body["rid"], str) else {**body, "rid": ["r" * 512, "s"]})
    assert ok.status_code == 200, ok.text[:300]
