"""Long stop strings in the detokenizer. The detokenizer (one process for every request of a
server) held back the text that could still become a stop string by trying every length of
every stop string's prefix at every token, each a copy of that prefix: per token, the square
of min(output, stop) characters. Eight stop strings of 20,000 characters (a 160 KB request)
and 3,000 output tokens took it over 20 s, during which no other stream moved (the first test
failed on the code before the fix: 20.7 s). The others hold the streamed text to the naive
rule the detokenizer had: cut at the first stop string, hold back a tail that may start one."""
from __future__ import annotations

import random

import pytest

from treadle.runtime.detokenizer import IncrementalDetokenizer, partial_suffix_len


def _naive_partial(text: str, marker: str) -> int:
    return max((k for k in range(1, min(len(marker) - 1, len(text)) + 1) if text.endswith(marker[:k])), default=0)


def _naive_cut(text: str, stops: list[str], include: bool) -> int | None:
    """Where the text ends if a stop string is in `text`: at the first one in it (of two
    starting at one place, the first listed), after it with `include`; None if none is."""
    found = [(text.find(s), j) for j, s in enumerate(stops) if text.find(s) >= 0]
    if not found:
        return None
    at, j = min(found)
    return at + len(stops[j]) if include else at


def _naive_visible(text: str, stops: list[str], finished: bool, include: bool = False,
                   cut: int | None = None) -> str:
    """What the client may see of `text` (min_new_tokens 0), `cut` where the text of an earlier
    token already held a stop string (the request ended there: the scheduler stops at the first
    token a stop string appears in, so a longer one that would complete later, or start at the
    same place, never does): cut at the first stop string in it, else without a tail that may
    still grow into one."""
    if cut is None:
        cut = _naive_cut(text, stops, include)
    if cut is not None:
        return text[:cut]
    hold = 0 if finished else max(_naive_partial(text, s) for s in stops)
    return text[:len(text) - hold]


@pytest.fixture(scope="module")
def ids(smollm2_tokenizer):
    rnd = random.Random(0)
    text = " ".join(rnd.choice(["the", "a", "cat", "sat", "on", "mat", "and", "ab", "ba"]) for _ in range(3000))
    return smollm2_tokenizer.encode(text, add_special_tokens=False)[:3000]


def test_long_stop_strings_cost_about_the_new_text_per_token(smollm2_tokenizer, ids):
    stops = ["Z" * 20000 + str(i) for i in range(8)]
    d = IncrementalDetokenizer(smollm2_tokenizer, stop=stops)
    for tid in ids:
        assert d.add([tid]) is not None
    full = smollm2_tokenizer.decode(ids)
    assert d.output_text == full
    # work, not seconds: each stop string's checks look at the new text of each token (and a
    # few characters of context), not at min(output, stop) characters again (the old code:
    # about 8 x 3,000 x 6,000 / 2 = 7e7 prefix copies, each of thousands of characters)
    assert d.stop_scan_chars <= len(stops) * (len(full) + 8 * len(ids)), d.stop_scan_chars


def test_a_stop_string_the_output_follows_for_long_is_still_cheap(smollm2_tokenizer, ids):
    """The held-back tail is as long as the output while it matches the stop string's start:
    only the new text of each token is compared with the stop string's next characters (not
    the whole tail again, the output's length squared over the request)."""
    full = smollm2_tokenizer.decode(ids)
    d = IncrementalDetokenizer(smollm2_tokenizer, stop=[full + "!"])
    out = "".join(d.add([tid]) for tid in ids)
    assert out == ""
    assert d.stop_scan_chars <= len(full) + 8 * len(ids), d.stop_scan_chars
    assert d.add([], {"type": "length"}) == full


# 199, 227, 305, 1490: a stop string completes at a later token than another one, starting at
# the same place or before it (199: stops ['baba', ..., 'b'] with include_stop_str). The request
# ends at the token the first one completes in (the detokenizer as the scheduler), so the later
# one never counts; a rule that looked at each token's text anew cut there (after 'baba')
@pytest.mark.parametrize("seed", [*range(40), 199, 227, 305, 1490])
def test_streamed_text_equals_the_naive_rule(smollm2_tokenizer, seed):
    rnd = random.Random(seed)
    words = ["a", "b", "ab", " ", "ba", "é", "中", "🙂", "aab"]
    text = "".join(rnd.choice(words) for _ in range(rnd.randint(5, 60)))
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    stops = ["".join(rnd.choice(words) for _ in range(rnd.randint(1, 6))) for _ in range(rnd.randint(1, 4))]
    include = rnd.random() < 0.3
    d = IncrementalDetokenizer(smollm2_tokenizer, stop=stops, include_stop_str=include)
    out = ""
    cut = None  # where the first token's text that held a stop string ends the output
    for k, tid in enumerate(ids):
        last = k == len(ids) - 1
        out += d.add([tid], {"type": "length"} if last else None)
        shown = smollm2_tokenizer.decode(ids[:k + 1])
        if not last and shown.endswith("\ufffd"):
            continue  # a character not yet whole: the detokenizer waits for it
        if cut is None:
            cut = _naive_cut(shown, stops, include)
        want = _naive_visible(shown, stops, last, include, cut)
        if len(want) >= len(out) or d.stopped:
            assert out == want, (text, stops, k)


@pytest.mark.parametrize("seed", range(200))
def test_partial_suffix_len_bounded_equals_naive(seed):
    rnd = random.Random(seed)
    text = "".join(rnd.choice("ab") for _ in range(rnd.randint(0, 30)))
    marker = "".join(rnd.choice("ab") for _ in range(rnd.randint(1, 30)))
    assert partial_suffix_len(text, marker) == _naive_partial(text, marker)


def test_the_scheduler_measures_stop_strings_once_a_request():
    """The scheduler's stop window (the trailing tokens a stop string ending now can span) used
    to re-encode every stop string at every token: 128 stops of 50,000 characters made a
    100-token request take 8.8 s on a server instead of 2.1, delaying the others. Now it is
    measured once a request, and never wider than the output."""
    from types import SimpleNamespace

    from treadle.runtime.request import Req
    from treadle.runtime.sampling_params import SamplingParams
    from treadle.runtime.scheduler import Scheduler

    encodes = []

    class Counted(str):
        def encode(self, *a, **k):
            encodes.append(1)
            return super().encode(*a, **k)

    req = Req(rid="r", input_ids=[1, 2], params=SamplingParams(stop=[Counted("x" * 50_000), Counted("ab")]), seed=0)
    sched = SimpleNamespace(special_ids=set())
    for n in range(1, 40):
        req.output_ids.append(5)
        assert Scheduler._stop_window(sched, req) == min(50_002, n)
    assert len(encodes) == 2 and req.stop_bytes == 50_000
