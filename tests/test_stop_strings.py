"""Where the text ends at a stop: trimmed (the default, SGLang's and vLLM's), `no_stop_trim`
(SGLang's: the whole text of the tokens written, the stop token's too) and
`include_stop_str_in_output` (vLLM's: the text ends right after the stop string, even inside a
token; a stop token's text stays). The detokenizer with the embedded model's real tokenizer,
streamed token by token and at once, and the OpenAI endpoint's mapping."""
from __future__ import annotations

import pytest

from treadle.runtime.detokenizer import IncrementalDetokenizer
from treadle.runtime.sampling_params import SamplingParams

TEXT = " is a great day"


def _render(tok, ids, finished, stream, **kw) -> str:
    d = IncrementalDetokenizer(tok, **kw)
    if not stream:
        return d.add(ids, finished)
    return "".join(d.add([t], finished if i == len(ids) - 1 else None) for i, t in enumerate(ids))


def _upto_stop(tok, stop: str) -> list[int]:
    """The ids of TEXT up to the token the first `stop` ends in (where the scheduler stops)."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    for k in range(1, len(ids) + 1):
        if stop in tok.decode(ids[:k]):
            return ids[:k]
    raise AssertionError(f"{stop!r} not in {TEXT!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_inside_a_token(smollm2_tokenizer, stream):
    tok = smollm2_tokenizer
    ids = _upto_stop(tok, "e")
    whole = tok.decode(ids)
    assert whole.endswith("great") or not whole.endswith("e"), whole  # "e" is inside its token
    fin = {"type": "stop", "matched": "e"}
    assert _render(tok, ids, fin, stream, stop=["e"]) == " is a gr"
    assert _render(tok, ids, fin, stream, stop=["e"], include_stop_str=True) == " is a gre"
    assert _render(tok, ids, fin, stream, stop=["e"], no_stop_trim=True) == whole


@pytest.mark.parametrize("stream", [False, True])
def test_the_first_stop_in_the_text_is_kept_up_to_its_end(smollm2_tokenizer, stream):
    tok = smollm2_tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    fin = {"type": "stop", "matched": "a g"}
    # "a g" starts before "eat" ends: the text ends after the first found, not the longest
    assert _render(tok, ids, fin, stream, stop=["eat", "a g"], include_stop_str=True) == " is a g"
    assert _render(tok, ids, fin, stream, stop=["eat", "a g"]) == " is "


def test_a_stop_token_stays_with_include_stop_str(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    fin = {"type": "stop", "matched": ids[-1]}
    assert _render(tok, ids, fin, False) == tok.decode(ids[:-1])
    assert _render(tok, ids, fin, False, include_stop_str=True) == tok.decode(ids)


def test_sampling_params_take_the_flag_as_a_boolean():
    assert SamplingParams(include_stop_str_in_output=True).include_stop_str_in_output is True
    with pytest.raises(ValueError, match="include_stop_str_in_output"):
        SamplingParams(include_stop_str_in_output="yes").validate()
