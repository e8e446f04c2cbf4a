"""Compressed-FSM jump strings (matcher) and the retokenization planner."""

from __future__ import annotations

import random
import re

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from treadle.constrained import GrammarMatcher, JumpPlan, build_compiled_grammar, plan_jump_forward
from treadle.constrained.index.vocabulary import token_bytes_table

EOS = 2
V = 49152
PERSON = r'\{"name":"[a-z]+","age":[0-9]+\}'


@pytest.fixture(scope="module")
def table(smol):
    return token_bytes_table(smol)


@pytest.fixture(scope="module")
def person(smol):
    return build_compiled_grammar(PERSON, smol, [EOS], vocab_size=V)


@pytest.fixture(scope="module")
def tiny():
    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + [(f"<0x{i:02X}>", 0.0) for i in range(256)]
    vocab += [(p, -1.0) for p in ["▁", "a", "b", "▁a", "▁hello", "{", "}", '"', ":", '":', "▁{", '"k', "k"]]
    tk = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>")


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def check_plan(tok, table, output_ids: list[int], jump: str, plan: JumpPlan, tail_start: int) -> None:
    """The plan's text extends the output, is a prefix of output + jump, and is canonical."""
    def text(ids: list[int]) -> bytes:
        return b"".join(table[t] or b"" for t in ids)  # special tokens add no text

    full = text(output_ids) + jump.encode()
    kept = output_ids[: len(output_ids) - plan.num_rollback]
    new_text = text(kept + plan.new_token_ids)
    assert full.startswith(new_text)
    assert len(new_text) > len(text(output_ids))
    tail_text = b"".join(table[t] for t in output_ids[tail_start:]).decode() + jump
    canon = enc(tok, tail_text)
    common = len(output_ids) - tail_start - plan.num_rollback
    assert common >= 0 and output_ids[tail_start : tail_start + common] == canon[:common]
    assert plan.new_token_ids == canon[common : common + len(plan.new_token_ids)]


def test_jump_strings_of_person_regex(person, smol):
    m = GrammarMatcher(person)
    assert m.find_jump_forward_string() == '{"name":"'
    for tid in enc(smol, '{"name":"bob'):
        assert m.accept_token(tid)
    assert m.find_jump_forward_string() == ""  # more letters or the closing quote
    assert m.accept_token(enc(smol, '"')[0])
    assert m.find_jump_forward_string() == ',"age":'
    m.rollback(1)
    assert m.find_jump_forward_string() == ""


def test_jump_is_empty_mid_character_and_resumes(smol):
    g = build_compiled_grammar(r'(é|ü)ab"cd', smol, [EOS], vocab_size=V)
    m = GrammarMatcher(g)
    assert m.find_jump_forward_string() == ""  # two choices
    lead, cont = smol.convert_tokens_to_ids("Ã"), smol.convert_tokens_to_ids("©")  # bytes C3, A9
    assert m.accept_token(lead)
    assert m.find_jump_forward_string() == ""  # inside "é": nothing forced at char level yet
    assert m.accept_token(cont)
    assert m.find_jump_forward_string() == 'ab"cd'
    m.rollback(1)
    assert m.find_jump_forward_string() == ""
    assert m.accept_token(cont) and m.find_jump_forward_string() == 'ab"cd'


def test_forced_text_rules(smol):
    g = build_compiled_grammar(r"ab(c|d)e[x]f.(yz)?", smol, [EOS], vocab_size=V)
    m = GrammarMatcher(g)
    assert m.find_jump_forward_string() == "ab"
    for t in enc(smol, "ab"):
        assert m.accept_token(t)
    assert m.find_jump_forward_string() == ""  # c or d
    assert m.accept_token(enc(smol, "c")[0])
    assert m.find_jump_forward_string() == "exf"
    for t in enc(smol, "exf"):
        assert m.accept_token(t)
    assert m.find_jump_forward_string() == ""  # "." is any character
    assert m.accept_token(enc(smol, "q")[0])
    assert m.can_terminate() and m.find_jump_forward_string() == ""  # "yz" or the end
    assert m.accept_token(enc(smol, "y")[0]) and m.find_jump_forward_string() == ""  # one character
    assert g.jump_string(m.state) == "z"


def test_plan_merges_with_previous_quote(smol, table):
    out = enc(smol, '{"name":"bob"')
    assert table[out[-1]] == b'"'
    plan = plan_jump_forward(smol, table, out, ',"age":')
    assert plan.num_rollback == 1 and table[plan.new_token_ids[0]] == b'","'  # fused `","`
    check_plan(smol, table, out, ',"age":', plan, len(out) - 3)


def test_plan_leading_space_and_holdback(smol, table):
    out = enc(smol, "Hello")
    plan = plan_jump_forward(smol, table, out, " world is")
    assert plan == JumpPlan(0, enc(smol, " world"))  # " is" held back: it can merge on
    check_plan(smol, table, out, " world is", plan, 0)
    plan0 = plan_jump_forward(smol, table, out, " world is", holdback=0)
    assert plan0 == JumpPlan(0, enc(smol, " world is"))


def test_plan_without_rollback(smol, table):
    out = enc(smol, "a")
    plan = plan_jump_forward(smol, table, out, '{"name":"')
    assert plan.num_rollback == 0 and plan.new_token_ids
    check_plan(smol, table, out, '{"name":"', plan, 0)


def test_plan_unicode_cases(smol, table):
    lead, cont = smol.convert_tokens_to_ids("Ã"), smol.convert_tokens_to_ids("©")
    # Output ends in the middle of "é": nothing canonical can follow yet.
    assert plan_jump_forward(smol, table, enc(smol, "caf") + [lead], '":1') == JumpPlan(0, [])
    # The lookback window starts on a continuation byte: the tail widens to whole chars.
    out = enc(smol, "caf") + [lead, cont] + enc(smol, "xy")
    jump = '","né":"'
    plan = plan_jump_forward(smol, table, out, jump, lookback=len(enc(smol, "xy")) + 1)
    assert plan.new_token_ids
    check_plan(smol, table, out, jump, plan, len(out) - len(enc(smol, "xy")) - 2)
    # Multi-byte jump after a multi-byte tail.
    out2 = enc(smol, '{"名前":"太郎')
    plan2 = plan_jump_forward(smol, table, out2, '","年齢":')
    check_plan(smol, table, out2, '","年齢":', plan2, len(out2) - 3)


def test_plan_never_crosses_special_tokens(smol, table):
    out = enc(smol, "ab") + [1] + enc(smol, "x")
    plan = plan_jump_forward(smol, table, out, ' = "')
    assert plan.num_rollback <= 1
    check_plan(smol, table, out, ' = "', plan, len(out) - 1)
    assert plan_jump_forward(smol, table, out, "") == JumpPlan(0, [])
    with pytest.raises(ValueError):
        plan_jump_forward(smol, table, out, "x", lookback=-1)


def test_plan_byte_fallback_tokenizer(tiny):
    table = token_bytes_table(tiny)
    out = enc(tiny, "a hello")  # "▁a", "▁hello": the tail starts with a space
    plan = plan_jump_forward(tiny, table, out, '{"k":', holdback=0)
    assert plan.new_token_ids
    new_text = b"".join(table[t] for t in out[: len(out) - plan.num_rollback] + plan.new_token_ids)
    assert new_text == b' a hello{"k":'
    # No space to anchor the sentencepiece prefix within reach: no jump rather than a wrong one.
    bare = [tiny.convert_tokens_to_ids("a")]
    assert plan_jump_forward(tiny, table, bare, '{"k":') == JumpPlan(0, [])


def test_scheduler_loop_with_jumps_stays_valid(person, smol, table):
    """Random generation applying every plan the way the scheduler does."""
    rng = random.Random(3)
    jumps = 0
    for _ in range(6):
        m = GrammarMatcher(person)
        out: list[int] = []
        for _step in range(60):
            jump = m.find_jump_forward_string()
            if jump:
                plan = plan_jump_forward(smol, table, out, jump)
                if plan.new_token_ids:
                    m.rollback(plan.num_rollback)
                    del out[len(out) - plan.num_rollback :]
                    for t in plan.new_token_ids:
                        assert m.accept_token(t)
                        out.append(t)
                    jumps += 1
                    continue
            allowed = sorted(a for a in person.index.get_allowed_tokens(m.state)
                             if a < person.num_tokens and a != EOS and a not in person.reserved_tokens)
            if m.can_terminate() and (not allowed or rng.random() < 0.5):
                assert m.accept_token(EOS)
                break
            # Favour structure-closing tokens so walks end within the step budget.
            closing = [a for a in allowed if not table[a].isalnum()]
            t = rng.choice(closing if closing and rng.random() < 0.5 else allowed)
            assert m.accept_token(t)
            out.append(t)
        assert m.is_terminated()
        assert re.fullmatch(PERSON, b"".join(table[t] for t in out).decode())
    assert jumps >= 6


def test_a_long_forced_literal_is_jumped_in_bounded_pieces(smol):
    """A grammar forcing 5,000 characters (a user's regex "Q" + "b" * 5000, or a schema's long
    property name) yields its forced text JUMP_MAX_BYTES at a time: each byte costs a mask row
    on the scheduler's thread, and the whole literal at once held every other request for
    seconds (23 s for 30,000 characters on a server). The pieces still add up to the literal."""
    from treadle.constrained.compile.grammar import JUMP_MAX_BYTES

    literal = "Q" + "b" * 5000
    m = GrammarMatcher(build_compiled_grammar(re.escape(literal), smol, [EOS], vocab_size=V))
    text, steps = "", 0
    while True:
        jump = m.find_jump_forward_string()
        if not jump:
            break
        assert len(jump.encode()) <= JUMP_MAX_BYTES
        steps += 1
        for t in enc(smol, jump):
            assert m.accept_token(t)
        text += jump
    assert literal.startswith(text) and len(literal) - len(text) <= 1 and steps >= 5000 // JUMP_MAX_BYTES
