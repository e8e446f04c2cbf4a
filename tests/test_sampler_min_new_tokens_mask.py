"""Sampler.forbid_early_stop: the stop tokens of a grammar row's bitmask are cleared while a
request is under min_new_tokens, for any bit of a word (bit 31 of a negative int32 word
included: clearing it once went out of int32's range and failed the whole step)."""
from __future__ import annotations

import torch

from treadle.runtime.request import Req
from treadle.runtime.sampler import Sampler
from treadle.runtime.sampling_params import SamplingParams

VOCAB = 200  # 7 words, the last one partly used


def _mask_of(allowed: set[int]) -> torch.Tensor:
    words = [0] * ((VOCAB + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor([[w - (1 << 32) if w >= 1 << 31 else w for w in words]], dtype=torch.int32)


def _allowed(mask: torch.Tensor) -> set[int]:
    return {t for t in range(VOCAB) if (int(mask[0, t // 32]) >> (t % 32)) & 1}


def _req(stops: list[int], min_new: int = 3) -> Req:
    return Req("r", [1, 2], SamplingParams(max_new_tokens=8, min_new_tokens=min_new, stop_token_ids=stops), 0)


def test_stop_tokens_on_every_bit_of_a_word_are_cleared_under_min_new_tokens() -> None:
    s = Sampler(VOCAB, torch.device("cpu"), (5,))
    allowed = set(range(VOCAB))  # every word all ones: -1 as int32
    stops = [31, 63, 95, 127, 0, 32, 150, 191]  # bit 31 (the sign bit) and bit 0 of several words
    mask = _mask_of(allowed)
    s.forbid_early_stop(mask, 0, _req(stops), num_output=0)
    assert mask.dtype == torch.int32
    assert _allowed(mask) == allowed - set(stops) - {5}  # the EOS too


def test_the_mask_is_left_alone_past_min_new_tokens_or_when_only_stops_remain() -> None:
    s = Sampler(VOCAB, torch.device("cpu"), (5,))
    mask = _mask_of({31, 40, 63})
    s.forbid_early_stop(mask, 0, _req([31, 63]), num_output=3)  # min_new_tokens reached
    assert _allowed(mask) == {31, 40, 63}
    only_stops = _mask_of({31, 63, 5})
    s.forbid_early_stop(only_stops, 0, _req([31, 63]), num_output=0)  # the grammar can only end
    assert _allowed(only_stops) == {31, 63, 5}
    ignore = _mask_of({5, 6})
    req = _req([])
    req.params.ignore_eos = True
    s.forbid_early_stop(ignore, 0, req, num_output=0)  # no stop token at all
    assert _allowed(ignore) == {5, 6}


def test_a_requests_stop_ban_is_built_once_and_banned_as_logits(monkeypatch) -> None:
    """Rows without a grammar under min_new_tokens get -inf at their stop tokens. The ban is made
    from the request's lists once, not at every step: 32 requests with 40,000 stop_token_ids
    each cost a batch 560 ms a step rebuilt (helper-68)."""
    s = Sampler(VOCAB, torch.device("cpu"), (5,))
    built = []
    stop_ids = s._stop_ids
    monkeypatch.setattr(s, "_stop_ids", lambda r: built.append(r.rid) or stop_ids(r))
    reqs = [_req([7, 150, 199]), Req("plain", [1], SamplingParams(max_new_tokens=8), 0), _req([], min_new=2)]
    reqs[2].rid = "eos-only"
    logits = torch.zeros(3, VOCAB)
    for step in range(4):
        out = s._biased(logits, reqs, True)
        assert torch.isinf(out[0, [5, 7, 150, 199]]).all() and torch.isfinite(out[0]).sum() == VOCAB - 4
        assert torch.isfinite(out[1]).all()
        assert torch.isinf(out[2, 5]) and torch.isfinite(out[2]).sum() == VOCAB - 1
        mask = _mask_of(set(range(VOCAB)))
        s.forbid_early_stop(mask, 0, reqs[0], num_output=0)
        assert _allowed(mask) == set(range(VOCAB)) - {5, 7, 150, 199}
    assert torch.isfinite(logits).all()  # a new tensor: the step's logits are left as they were
    assert sorted(built) == ["eos-only", "r"]  # once per request, over four steps
