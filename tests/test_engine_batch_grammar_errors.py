"""One request with a bad grammar in an offline Engine batch (an invalid regex, a JSON schema
that is refused, an EBNF that does not parse): the call raises a ValueError naming the prompt
(its index) and the problem before any of the batch is queued, so nothing is half-run and no
KV slot is taken; the same batch without the bad request then runs as it would have. The
same for n > 1, stream=True and async_generate."""
from __future__ import annotations

import asyncio

import pytest

from treadle.runtime import Engine
from treadle.runtime.engine import BatchError
from batch_grammar_cases import BAD, GREEDY, PROMPTS  # tests/batch_grammar_cases.py

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    with Engine(max_total_tokens=4096) as e:
        yield e


def _requests(e) -> int:
    return e.get_server_info()["requests"]


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_grammar_in_a_batch_names_its_index_and_runs_nothing(engine, kind):
    bad, word = BAD[kind]
    params = [GREEDY, {**GREEDY, **bad}, {**GREEDY, "regex": "[a-z]+"}]
    before = _requests(engine)
    with pytest.raises(ValueError) as info:
        engine.generate(PROMPTS, params)
    msg = str(info.value)
    assert "prompt 1 of the batch" in msg and word in msg, msg
    assert isinstance(info.value, BatchError) and set(info.value.errors) == {1}
    assert _requests(engine) == before  # nothing of the batch reached the scheduler
    engine.check_integrity()
    # the good ones, sent again without the bad one, are served
    good = engine.generate([PROMPTS[0], PROMPTS[2]], [GREEDY, {**GREEDY, "regex": "[a-z]+"}])
    assert good[0]["meta_info"]["finish_reason"]["type"] == "length"
    assert good[1]["text"].isalpha() or good[1]["text"] == ""


def test_every_bad_index_is_named(engine):
    params = [{**GREEDY, "regex": "(ab"}, GREEDY, {**GREEDY, "ebnf": "root ::= ("}]
    with pytest.raises(BatchError) as info:
        engine.generate(PROMPTS, params)
    assert set(info.value.errors) == {0, 2}
    assert "prompts 0, 2 of the batch" in str(info.value)


def test_n_samples_and_streams_are_checked_before_anything_is_queued(engine):
    before = _requests(engine)
    bad = {**GREEDY, "regex": "(ab", "n": 3}
    with pytest.raises(ValueError, match="regex"):
        engine.generate(PROMPTS[0], bad)  # a single prompt: the message is the grammar's
    with pytest.raises(BatchError, match="prompt 1 of the batch"):
        engine.generate(PROMPTS[:2], [{**GREEDY, "n": 2}, bad])
    with pytest.raises(BatchError, match="prompt 1 of the batch"):  # at the call, not while iterating
        engine.generate(PROMPTS[:2], [GREEDY, {**GREEDY, "ebnf": "root ::= ("}], stream=True)

    async def go():
        with pytest.raises(BatchError, match="prompt 2 of the batch"):
            await engine.async_generate(PROMPTS, [GREEDY, GREEDY, {**GREEDY, "regex": "(ab"}])
        with pytest.raises(BatchError, match="prompt 0 of the batch"):
            await engine.async_generate(PROMPTS[:2], [{**GREEDY, "regex": "(ab"}, GREEDY], stream=True)

    asyncio.run(go())
    assert _requests(engine) == before
    engine.check_integrity()


def test_grammar_errors_do_not_disturb_the_results_of_good_batches(engine):
    params = [GREEDY, {**GREEDY, "regex": "[0-9]{3}"}, {**GREEDY, "choices": ["yes", "no"]}]
    first = engine.generate(PROMPTS, params)
    with pytest.raises(BatchError):
        engine.generate(PROMPTS, [*params[:2], {**GREEDY, "regex": "(ab"}])
    again = engine.generate(PROMPTS, params)
    assert [r["output_ids"] for r in again] == [r["output_ids"] for r in first]
    assert again[1]["text"].isdigit() and again[2]["text"] in ("yes", "no")


def test_a_request_failing_while_running_loses_the_others_results(engine):
    """An error no check can find before running (here a row whose logits go NaN, as in
    test_hostile_batch) fails its request alone: a batch still raises, but carries every
    result, the others' as they are alone; a batch's stream yields the others to their end
    first. Before, the others' results were dropped, and a stream stopped at the error."""
    from test_hostile_batch import POISON_TOKENS, poison_rows

    alone = engine.generate([PROMPTS[0], PROMPTS[2]], GREEDY)
    engine._call(lambda s: poison_rows(s, after=1))
    params = [GREEDY, {**GREEDY, "max_new_tokens": POISON_TOKENS}, GREEDY]
    with pytest.raises(RuntimeError, match="result 1 of the batch") as info:
        engine.generate(PROMPTS, params)
    results = info.value.results
    assert [results[0]["output_ids"], results[2]["output_ids"]] == [r["output_ids"] for r in alone]
    assert results[1]["meta_info"]["error"]
    chunks = []
    with pytest.raises(RuntimeError, match="result 1 of the batch"):
        for c in engine.generate(PROMPTS, params, stream=True):
            chunks.append(c)
    streamed = {i: [c for c in chunks if c["index"] == i][-1]["output_ids"] for i in (0, 2)}  # the ids so far
    assert [streamed[0], streamed[2]] == [r["output_ids"] for r in alone]
    engine.check_integrity()
