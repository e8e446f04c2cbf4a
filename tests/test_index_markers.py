"""Regexes whose text may end before the output does (``[0-9]+(\\.[0-9]+)?``, ``a|ab``): the
token index is built marked (index_markers.py), so no token is lost where a match could
end. Masks are checked against an independent viable-prefix oracle (interegular's DFA) over
the whole SmolLM2 vocabulary, and the model's own tokenization of each text is accepted."""

from __future__ import annotations

import interegular
import pytest

from treadle.constrained import GrammarSpec, allocate_token_bitmask
from treadle.constrained.compile.compiler import GrammarCompiler
from treadle.constrained.index.vocabulary import token_bytes_table
from json_checks import allowed_ids, live_states

EOS = 2
# (regex, texts it matches): each text reaches a complete match before its end
CASES = [
    (r"[0-9]+(?:\.[0-9]+)?", ["12.5", "3.14159", "7"]),
    (r"[a-z]+(?: [a-z]+)*", ["hello big world", "a b c"]),
    (r"a|ab|abc", ["a", "ab", "abc"]),
    (r"(?:x|xy)z?", ["xz", "xyz", "xy"]),
    (r"-?[0-9]+(?:,[0-9]+)*;?", ["1,22,333;", "-4,5"]),
]


class Viable:
    """Viable prefixes of an ASCII regex, from interegular's character DFA (no outlines-core)."""

    def __init__(self, regex: str) -> None:
        self.fsm = interegular.parse_pattern(regex).to_fsm()
        self.live = live_states(self.fsm)

    def run(self, state, text: str):
        for ch in text:
            sym = self.fsm.alphabet[ch] if ch in self.fsm.alphabet else self.fsm.alphabet[interegular.fsm.anything_else]
            state = self.fsm.map.get(state, {}).get(sym)
            if state is None or state not in self.live:
                return None
        return state


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    with GrammarCompiler(smollm2_tokenizer, [EOS], vocab_size=len(smollm2_tokenizer)) as c:
        yield c


@pytest.mark.parametrize("regex,texts", CASES, ids=[c[0] for c in CASES])
def test_masks_equal_the_viable_prefix_oracle(compiler, smollm2_tokenizer, regex, texts):
    tok = smollm2_tokenizer
    table = token_bytes_table(tok)
    g = compiler.compile(GrammarSpec("regex", regex))
    oracle = Viable(regex)
    bm = allocate_token_bitmask(1, len(tok))
    for text in texts:
        m = g.matcher()
        state = oracle.fsm.initial
        ids = tok.encode(text, add_special_tokens=False)
        for step in range(len(ids) + 1):
            m.fill_next_token_bitmask(bm, 0)
            got = allowed_ids(bm[0].numpy())
            want = set()
            for i, b in enumerate(table):
                if not b or i == EOS:
                    continue
                try:
                    chars = b.decode("ascii")
                except UnicodeDecodeError:
                    continue  # an ASCII regex allows no other byte
                if oracle.run(state, chars) is not None:
                    want.add(i)
            if state in oracle.fsm.finals:
                want.add(EOS)
            assert got == want, (regex, tok.decode(ids[:step]), sorted(got ^ want)[:10])
            if step == len(ids):
                break
            assert m.accept_token(ids[step]), (regex, text, step)
            state = oracle.run(state, tok.decode([ids[step]]))
        assert m.can_terminate() and m.accept_token(EOS)


def test_a_root_number_schema_takes_its_fraction(compiler, smollm2_tokenizer):
    g = compiler.compile(GrammarSpec.from_params(json_schema={"type": "number"}))
    m = g.matcher()
    for i in smollm2_tokenizer.encode("12.5e-3", add_special_tokens=False):
        assert m.accept_token(i)
    assert m.accept_token(EOS)


def test_reserved_plane_is_never_allowed_nor_asked_for(compiler, smollm2_tokenizer):
    table = token_bytes_table(smollm2_tokenizer)
    lead = [i for i, b in enumerate(table) if b == b"\xf4"]
    assert lead
    g = compiler.compile(GrammarSpec("regex", '"[^"]*"'))  # the class also matches the end marker
    assert set(lead) <= g.reserved_tokens
    m = g.matcher()
    bm = allocate_token_bitmask(1, len(smollm2_tokenizer))
    for i in smollm2_tokenizer.encode('"x', add_special_tokens=False):
        assert m.accept_token(i)
    m.fill_next_token_bitmask(bm, 0)
    assert not set(lead) & allowed_ids(bm[0].numpy()) and not m.accept_token(lead[0])
    assert not m.can_terminate()
    assert m.accept_token(smollm2_tokenizer.encode('"', add_special_tokens=False)[0]) and m.can_terminate()
    with pytest.raises(ValueError, match="U\\+10FFF9 is reserved"):
        compiler.compile(GrammarSpec("regex", "a\U0010FFF9"))
