"""A batch's prompts and one bad grammar of each kind, shared by the Engine's and the server's
batch grammar tests (test_engine_batch_grammar_errors, test_server_batch_grammar_errors)."""
from __future__ import annotations

GREEDY = {"max_new_tokens": 4, "temperature": 0}
PROMPTS = ["The capital of France is", "One, two, three,", "def add(a, b):"]
# grammar field -> (the bad sampling params, a word its error names)
BAD = {
    "regex": ({"regex": "(ab"}, "regex"),
    "json_schema": ({"json_schema": '{"type": "integer", "multipleOf": 7}'}, "multipleOf"),
    "ebnf": ({"ebnf": 'root ::= ("a"'}, "ebnf"),
}
