"""Hostile requests found against a real server (session 39), checked here where they went
wrong, without a server: a prompt one token short of the context that hung the scheduler, a
reply of forced special tokens that made every step quadratic, a reply of invalid bytes that
made the shared detokenizer quadratic, stream events cut by line separators, and error
messages that quoted a 4,000-digit integer whole. Each test fails on the code before its fix.
tests/test_server_hostile_s39_server.py drives the same requests through a server."""
from __future__ import annotations

import json
import random
import types

import pytest

from fake_runner import VOCAB, FakeRunner, collect, drain, greedy, make_scheduler, reference_greedy, req
from treadle.runtime.io_struct import TokenizedGenerateReq
from treadle.runtime.sampling_params import SamplingParams
from treadle.runtime.request_checks import check_context, validate_request
from treadle.runtime.scheduler import Scheduler


def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


# ---------------------------------------------------------------- the context's last token


def test_a_prompt_one_short_of_the_context_with_the_default_max_new_tokens_is_served():
    """A prompt of context - 1 tokens, max_new_tokens left at its default (128): valid (the
    context cuts the reply to one token), but the scheduler's admission reserved slots for
    128 new tokens, more than the pool holds beside the prompt even on an idle server. It
    waited forever, and, first in line, so did every request after it (the server hung: a
    3-token /generate behind it got no answer in 100 s)."""
    rng = random.Random(0)
    sched, _ = make_scheduler(FakeRunner(num_slots=256, context_len=256))
    edge, after = toks(rng, 255), toks(rng, 5)
    sched.add_request(req("edge", edge, SamplingParams(temperature=0.0)))
    sched.add_request(req("after", after, greedy(3)))
    res = collect(drain(sched, max_steps=500))
    assert res["edge"][0] == reference_greedy(edge, 128, context_len=256) and len(res["edge"][0]) == 1
    assert res["edge"][1].finished["type"] == "length"
    assert res["after"][0] == reference_greedy(after, 3)


def test_a_running_request_near_the_context_reserves_only_what_it_can_write():
    """The decode reserve of a running request counts the tokens the context leaves it, not
    its whole max_new_tokens: a request beside it is admitted at once."""
    rng = random.Random(1)
    sched, _ = make_scheduler(FakeRunner(num_slots=300, context_len=256))
    long, short = toks(rng, 250), toks(rng, 20)
    sched.add_request(req("long", long, SamplingParams(temperature=0.0)))  # 128 new tokens; the context allows 6
    sched.step()  # its prefill
    sched.add_request(req("short", short, greedy(4)))
    sched.step()
    assert any(r.rid == "short" for r in sched.running), "the short request waited behind a reserve never used"
    res = collect(drain(sched, max_steps=500))
    assert res["short"][0] == reference_greedy(short, 4)


# ---------------------------------------------------------------- stop strings over special tokens


def old_stop_window(self, r) -> int:
    """Scheduler._stop_window before its fix (the window recounted at each widening)."""
    need = min(max(len(s.encode()) for s in r.params.stop) + 2, len(r.output_ids))
    k = need
    while k < len(r.output_ids):
        skipped = sum(t in self.special_ids for t in r.output_ids[-k:])
        if k - skipped >= need:
            break
        k = need + skipped
    return k


def window_request(ids: list[int], stop: list[str]):
    return types.SimpleNamespace(params=SamplingParams(stop=stop), stop_bytes=None, output_ids=list(ids))


class ReadCounted(list):
    """A list counting the items read from it (by index, slice or iteration)."""

    read = 0

    def __getitem__(self, i):
        got = super().__getitem__(i)
        self.read += len(got) if isinstance(i, slice) else 1
        return got

    def __iter__(self):
        self.read += len(self)
        return super().__iter__()

    def __reversed__(self):
        self.read += len(self)
        return super().__reversed__()


def test_the_stop_window_over_special_tokens_takes_one_walk():
    """logit_bias 100 on a special token with a 1-character stop string: every output token is
    one that decoding skips, so the window widens to the whole output at each step. It was
    recounted at each widening: 8,000 tokens took 2.2 s of every step (every request in the
    batch waited for it), 12,000 about 7 s. Now one walk back from the end: the output's
    tokens read once each (the old recount read 24,000,000)."""
    sched = types.SimpleNamespace(special_ids=frozenset(range(17)))
    r = window_request([5] * 12_000, ["x"])
    r.output_ids = ReadCounted(r.output_ids)
    k = Scheduler._stop_window(sched, r)
    assert k == 12_000
    assert r.output_ids.read <= 12_000, r.output_ids.read


@pytest.mark.parametrize("ids,stop", [
    ([100, 5, 5, 101, 5, 102, 103], ["ab"]), ([5, 5, 5], ["ab"]), ([100] * 10, ["ab"]),
    ([100, 5, 100, 5, 5, 100, 100], ["abcd"]), ([5, 100, 5, 5, 5], ["a"]), ([7], ["longer stop"]),
])
def test_the_stop_window_still_holds_the_stop_strings_bytes_of_other_tokens(ids, stop):
    sched = types.SimpleNamespace(special_ids=frozenset(range(17)))
    k = Scheduler._stop_window(sched, window_request(ids, stop))
    need = min(len(stop[0].encode()) + 2, len(ids))
    # the shortest end of the output with `need` tokens decoding keeps (or all of it)
    assert sum(t >= 17 for t in ids[-k:]) >= need or k == len(ids)
    assert k == len(ids) or sum(t >= 17 for t in ids[-(k - 1):]) < need
    assert k <= old_stop_window(sched, window_request(ids, stop))


# ---------------------------------------------------------------- invalid bytes in a reply


@pytest.fixture(scope="module")
def byte_token(smollm2_tokenizer):
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    return lambda b: smollm2_tokenizer.convert_tokens_to_ids(b2u[b])


class CountingTokenizer:
    """The tokenizer, counting the tokens it is asked to decode."""

    def __init__(self, tok) -> None:
        self.tok, self.decoded = tok, 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kw)


def stream(tok, ids: list[int], step: int = 1) -> list[str]:
    from treadle.runtime.detokenizer import IncrementalDetokenizer

    d, out = IncrementalDetokenizer(tok), []
    for i in range(0, len(ids), step):
        out.append(d.add(ids[i:i + step], {"type": "length"} if i + step >= len(ids) else None))
    return out


def test_a_reply_of_invalid_bytes_is_decoded_once_and_streams(smollm2_tokenizer, byte_token):
    """A reply whose text keeps ending in U+FFFD (logit_bias forcing the byte 0x80, never valid
    UTF-8): the detokenizer held all of it as a character still to come, and decoded the whole
    held tail again at every token (the detokenizer process, shared by every request, spent
    half a minute on one 8,000-token reply), and its stream sent nothing until the end."""
    tok = CountingTokenizer(smollm2_tokenizer)
    n = 2000
    deltas = stream(tok, [byte_token(0x80)] * n)
    assert tok.decoded < 40 * n  # was n * n: 4,000,000
    assert "".join(deltas) == "\ufffd" * n == smollm2_tokenizer.decode([byte_token(0x80)] * n)
    assert len("".join(deltas[:100])) >= 80  # it streams


@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_text_after_invalid_bytes_is_still_the_tokenizers(smollm2_tokenizer, byte_token, step):
    """Characters whose bytes come one token at a time, after invalid bytes and between them,
    come out whole: the text is final only up to where the last character may still be coming."""
    b = byte_token
    cases = [
        [b(0x80)] * 20 + [b(0xE6), b(0x97), b(0xA5)] + smollm2_tokenizer.encode(" ok"),
        [b(0x80)] * 12 + [b(0xF0), b(0x9F), b(0x98), b(0x80)] + [b(0x80)] * 9 + [b(0xE6), b(0x97), b(0xA5)],
        smollm2_tokenizer.encode("\ufffd" * 30 + "x"),  # the U+FFFD character itself, written by the model
        smollm2_tokenizer.encode("👨‍👩‍👧 日本語 " * 10),
    ]
    for ids in cases:
        assert "".join(stream(smollm2_tokenizer, ids, step)) == smollm2_tokenizer.decode(ids)


# ---------------------------------------------------------------- stream events


def test_a_stream_event_is_one_line_for_any_line_reader():
    """JSON leaves U+2028, U+2029 and U+0085 as they are; str.splitlines() ends a line at each,
    and so does requests' iter_lines(decode_unicode=True) (treadle's own sse_events helper): a
    reply holding one was read as two halves of an event, neither JSON."""
    from treadle.runtime.server.streaming import sse

    obj = {"text": "a\u2028b\u2029c\x85d é 日", "n": [1]}
    event = sse(obj)
    assert event.splitlines() == [event[:-2], ""]
    assert json.loads(event[len("data: "):]) == obj
    assert sse({"text": "plain"}) == 'data: {"text": "plain"}\n\n'


# ---------------------------------------------------------------- error messages


@pytest.mark.parametrize("field", ["top_logprobs_num", "logprob_start_len"])
def test_a_4000_digit_logprob_option_is_quoted_by_its_first_digits(field):
    big = -(10 ** 4000) if field == "logprob_start_len" else 10 ** 4000
    r = TokenizedGenerateReq("r", [1, 2, 3], SamplingParams(), return_logprob=True, **{field: big})
    with pytest.raises(ValueError) as e:
        validate_request(r, 100, 64, 64)
    assert len(str(e.value)) < 400 and "4,001 digits" in str(e.value), str(e.value)[:300]


def test_a_4000_digit_token_id_and_max_new_tokens_are_quoted_by_their_first_digits():
    r = TokenizedGenerateReq("r", [1, 10 ** 4000], SamplingParams())
    with pytest.raises(ValueError) as e:
        validate_request(r, 100, 64, 64)
    assert len(str(e.value)) < 400 and "4,001 digits" in str(e.value)
    with pytest.raises(ValueError) as e:
        check_context(3, {"max_new_tokens": 10 ** 4000}, 64)
    assert len(str(e.value)) < 500 and "4,001 digits" in str(e.value)

