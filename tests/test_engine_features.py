"""Issue 3 end to end with the embedded model: identical greedy output with the radix cache on
and off, with chunked prefill and under forced retraction; cache hits; seeds; streaming; n;
stop strings; logprobs; no leaked KV slot afterwards."""
from __future__ import annotations

import time

import pytest

from treadle.runtime import Engine
from treadle.runtime.engine import BatchError
from treadle.runtime.io_struct import TokenizedGenerateReq
from treadle.runtime.sampling_params import SamplingParams
from treadle.runtime.request_checks import validate_request
from treadle.runtime.tokenizer import apply_chat_template

QUESTIONS = ["Name a fruit.", "What is 2 + 2?", "Tell me about the moon in one sentence.",
             "Write a haiku about autumn leaves falling slowly.", "Hi", "Why do cats purr?"]
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    with Engine(max_total_tokens=8192) as e:
        yield e


@pytest.fixture(scope="module")
def prompts(engine):
    return [apply_chat_template(engine.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(engine, prompts):
    engine.flush_cache()
    return [o["output_ids"] for o in engine.generate(prompts, GREEDY)]


@pytest.mark.parametrize("kwargs", [
    {"disable_radix_cache": True},
    {"chunked_prefill_size": 8},
    {"chunked_prefill_size": 0, "schedule_policy": "fcfs"},
    # a pool too small for all six at once: requests are retracted and resumed
    {"max_total_tokens": 140, "chunked_prefill_size": 16},
    # overlap scheduling (on by default only with CUDA): step N's tokens are processed after
    # step N+1 is launched; with retraction too
    {"overlap_schedule": "on"},
    {"overlap_schedule": "on", "max_total_tokens": 140, "chunked_prefill_size": 16},
    # running requests' decode tokens ride along in the prefill chunks
    {"enable_mixed_chunk": True, "chunked_prefill_size": 16},
], ids=["cache-off", "chunked-8", "no-chunk-fcfs", "retraction", "overlap", "overlap-retraction", "mixed-chunk"])
def test_greedy_batch_identical_across_scheduling(prompts, reference, kwargs):
    with Engine(**{"max_total_tokens": 8192, **kwargs}) as e:
        out = e.generate(prompts, GREEDY)
        assert [o["output_ids"] for o in out] == reference
        info = e.get_server_info()
        if kwargs.get("overlap_schedule") == "on":
            assert info["decode_steps"] > 0
        if kwargs.get("max_total_tokens") == 140:
            assert info["retractions"] > 0
        if kwargs.get("enable_mixed_chunk"):
            assert info["mixed_steps"] > 0
        assert info["free_slots"] + info["evictable_slots"] == info["total_slots"]
        e.check_integrity()


def test_repeated_prompt_is_served_from_cache(engine, prompts):
    first = engine.generate(prompts[2], GREEDY)
    again = engine.generate(prompts[2], GREEDY)
    n = again["meta_info"]["prompt_tokens"]
    assert again["meta_info"]["cached_tokens"] >= n - 1
    assert again["output_ids"] == first["output_ids"]
    assert engine.get_server_info()["cache_hit_rate"] > 0


def test_max_new_tokens_zero_caches_the_prompt(engine):
    text = "A long shared document about rivers, mountains and valleys. " * 4
    engine.flush_cache()
    warm = engine.generate(text, {"max_new_tokens": 0})
    assert warm["output_ids"] == [] and warm["meta_info"]["finish_reason"]["type"] == "length"
    hit = engine.generate(text + "Question: what is it about?", {"max_new_tokens": 2, "temperature": 0})
    assert hit["meta_info"]["cached_tokens"] >= warm["meta_info"]["prompt_tokens"] - 1


def test_same_seed_same_text(engine, prompts):
    p = {"max_new_tokens": 24, "temperature": 0.9, "top_p": 0.95, "top_k": 50, "seed": 1234}
    a = engine.generate(prompts[0], p)
    b = engine.generate([prompts[0], prompts[1], prompts[3]], [p, {**p, "seed": 7}, {**p, "seed": 8}])[0]
    assert a["text"] == b["text"]
    c = engine.generate(prompts[0], {**p, "seed": 4321})
    d = engine.generate(prompts[0], {**p, "seed": 999})
    assert len({a["text"], c["text"], d["text"]}) > 1  # other seeds draw other tokens


def test_stream_yields_the_same_text(engine, prompts):
    full = engine.generate(prompts[3], GREEDY)
    chunks = list(engine.generate(prompts[3], GREEDY, stream=True))
    assert len(chunks) > 1
    # SGLang's: each chunk holds the text and ids so far
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    # e2e_latency (SGLang's meta_info) on the finished output only; a batch's from the call's start
    assert chunks[-1]["meta_info"]["e2e_latency"] > 0 and "e2e_latency" not in chunks[0]["meta_info"]
    t0 = time.monotonic()
    both = engine.generate([prompts[3], prompts[3] + " Again."], {**GREEDY, "max_new_tokens": 24})
    spent = time.monotonic() - t0
    assert all(spent / 2 < o["meta_info"]["e2e_latency"] <= spent for o in both), (spent, both)


def test_a_batch_and_n_samples_stream(engine, prompts):
    """stream=True takes a batch and n samples too (it took one prompt with n=1): the chunks
    of all arrive as they are made, each with the index of its result in the unstreamed list,
    and each index's last chunk is that result (the text and ids so far, as SGLang's). A
    consumer that stops early aborts the rest."""
    params = [GREEDY, {**GREEDY, "max_new_tokens": 12}]
    full = engine.generate(prompts[:2], params)
    chunks = list(engine.generate(prompts[:2], params, stream=True))
    for i, want in enumerate(full):
        mine = [c for c in chunks if c["index"] == i]
        assert mine[-1]["text"] == want["text"]
        assert mine[-1]["output_ids"] == want["output_ids"]
        assert mine[-1]["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
    last = {c["index"]: k for k, c in enumerate(chunks)}
    assert last[1] < last[0]  # the shorter one ended first: they ran side by side
    twice = engine.generate(prompts[0], {**GREEDY, "n": 2}, stream=True)
    got = {}
    for c in twice:
        got[c["index"]] = c["text"]
    assert got == {0: full[0]["text"], 1: full[0]["text"]}
    it = engine.generate(prompts[:2], {**GREEDY, "max_new_tokens": 400}, stream=True, rid="cut")
    first = next(it)
    it.close()  # the consumer stops: both are aborted and their slots freed
    assert first["meta_info"]["id"] in ("cut-0", "cut-1")
    engine.check_integrity()
    info = engine.get_server_info()
    assert info["num_running"] == 0 and info["num_waiting"] == 0, info


def test_a_request_id_in_use_is_refused_without_harm_to_its_owner(engine, prompts):
    """A call whose rid (or a part's, "<rid>-0") another running call holds is a ValueError,
    streamed or not, and the other call finishes normally: the refused call used to abort
    the owner's request and drop its outbox, so the owner waited forever."""
    import threading

    long = {**GREEDY, "max_new_tokens": 80}
    owner: dict = {}
    threads = [threading.Thread(target=lambda: owner.update(x=engine.generate(prompts[0], long, rid="x"))),
               threading.Thread(target=lambda: owner.update(y=engine.generate(prompts[:2], long, rid="y")))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while engine.get_server_info()["num_running"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    for kw in ({"rid": "x"}, {"rid": "x", "stream": True}, {"rid": "y-0"}, {"rid": "y-1", "stream": True}):
        with pytest.raises(ValueError, match="already in use"):
            out = engine.generate(prompts[1], {"max_new_tokens": 2}, **kw)
            list(out) if kw.get("stream") else out
    with pytest.raises(ValueError, match="'y' is already in use"):  # a batch again under the batch's rid
        engine.generate(prompts[:2], {"max_new_tokens": 2}, rid="y")
    with pytest.raises(ValueError, match="'x' is already in use"):  # n samples whose prompt id is x
        engine.generate(prompts[1], {"max_new_tokens": 2, "n": 2}, rid="x")
    for t in threads:
        t.join(120)
    assert owner["x"]["meta_info"]["completion_tokens"] == 80, owner["x"]["meta_info"]
    assert [o["meta_info"]["completion_tokens"] for o in owner["y"]] == [80, 80]
    engine.check_integrity()


def test_a_tiny_temperature_is_greedy_and_harms_no_batch(engine, prompts):
    """temperature 1e-40 is greedy (below 1e-5, as vLLM's): it made NaN probabilities, and
    torch.multinomial failed the whole batch step, every other request in it included."""
    params = [{"max_new_tokens": 8, "temperature": t} for t in (0.0, 1e-40, 2e-39, 0.7)]
    outs = engine.generate([prompts[1]] * 4, params)
    assert outs[0]["output_ids"] == outs[1]["output_ids"] == outs[2]["output_ids"]
    assert all(o["meta_info"]["completion_tokens"] >= 1 for o in outs)


def test_n_samples_share_the_prompt(engine, prompts):
    outs = engine.generate(prompts[5], {"max_new_tokens": 8, "temperature": 1.0, "n": 3, "seed": 5})
    assert len(outs) == 3
    assert all(o["meta_info"]["cached_tokens"] >= o["meta_info"]["prompt_tokens"] - 1 for o in outs)
    # sample 0 draws with the seed itself, the others with seeds of their own (sample_seed), not
    # seed + j: {seed: 5, n: 3}'s second sample was {seed: 6}'s
    p = {"max_new_tokens": 8, "temperature": 1.0}
    one, six = engine.generate([prompts[5], prompts[5]], [{**p, "seed": 5}, {**p, "seed": 6}])
    assert outs[0]["output_ids"] == one["output_ids"]
    assert outs[1]["output_ids"] != six["output_ids"]


def test_stop_string_is_trimmed(engine, prompts):
    full = engine.generate(prompts[3], GREEDY)["text"]
    word = full.split()[2]
    out = engine.generate(prompts[3], {**GREEDY, "stop": [word], "ignore_eos": False})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in out["text"] and full.startswith(out["text"])


def test_stop_string_on_the_last_allowed_token_is_a_stop(engine, prompts):
    ids = engine.generate(prompts[3], GREEDY)["output_ids"]
    k = next(i for i in range(3, len(ids)) if engine.tokenizer.decode(ids[i:i + 1]).strip())
    word = engine.tokenizer.decode(ids[k:k + 1])  # the text of output token k alone
    out = engine.generate(prompts[3], {**GREEDY, "max_new_tokens": k + 1, "stop": [word]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert out["text"] == engine.tokenizer.decode(ids[:k])


def test_two_stops_ending_in_one_token_name_the_one_the_text_is_cut_at(engine, prompts):
    """Stops ["he", " the"] completing in the token " the": the text is cut at the earlier one,
    " the", and matched names it (the scheduler named the first stop of the list)."""
    tok = engine.tokenizer
    ids = engine.generate(prompts[3], GREEDY)["output_ids"]
    full = tok.decode(ids)
    for k in range(1, len(ids)):
        start, piece = len(tok.decode(ids[:k])), tok.decode(ids[k:k + 1])
        inner = piece[1:]
        if len(piece) >= 3 and full.find(piece) == start and full.find(inner) == start + 1:
            break
    else:
        pytest.fail(f"no token of {full!r} has text found nowhere earlier")
    out = engine.generate(prompts[3], {**GREEDY, "stop": [inner, piece]})
    assert out["text"] == full[:start], (out["text"], piece)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": piece}


def test_a_stop_string_before_min_new_tokens_is_text(engine):
    """A stop string counts only if it ends in token min_new_tokens or later (SGLang's rule);
    one written before is ordinary text, in the text as in the finish reason, streamed or
    not. Before, the scheduler went on past it while the text was cut there ('2 ' with the
    reply '2 + 2 = 4' and finish_reason EOS)."""
    chat = apply_chat_template(engine.tokenizer, [{"role": "user", "content": "What is 2+2? Answer with a "
                                                   "number only."}])
    base = {"max_new_tokens": 16, "temperature": 0}
    plain = engine.generate(chat, base)
    tokens = [engine.tokenizer.decode([t]) for t in plain["output_ids"]]
    assert tokens[:7] == ["2", " +", " ", "2", " =", " ", "4"], tokens  # what the cases below rely on
    for stop, m, text, matched in ((["+"], 5, "2 + 2 = 4", plain["meta_info"]["finish_reason"]["matched"]),
                                   (["="], 3, "2 + 2 ", "="),  # ends in token 5: counts
                                   (["2"], 2, "2 + ", "2"),  # the first "2" is before; the second counts
                                   (["2"], 0, "", "2"),
                                   (["+", "4"], 3, "2 + 2 = ", "4"),
                                   # begins in token 4, before min_new_tokens, and ends in token 5:
                                   # counts, and its "2" was streamed before it ended
                                   (["2 ="], 5, "2 + ", "2 =")):
        sp = {**base, "stop": stop, "min_new_tokens": m}
        out = engine.generate(chat, sp)
        assert (out["text"], out["meta_info"]["finish_reason"]["matched"]) == (text, matched), (stop, m, out)
        assert list(engine.generate(chat, sp, stream=True))[-1]["text"] == text


def test_a_stop_string_of_multibyte_characters_is_a_stop(engine):
    """An emoji is several byte tokens: a stop string of two of them spans 6 tokens, more than
    the window the scheduler decoded (its length in characters + 2), so it never matched and
    the request ran to max_new_tokens, finish_reason "length", while the text was cut at it.
    Streamed, the last chunk's output_ids are the output's (chunks without new text dropped
    theirs: a piece of a character has none)."""
    prompt, greedy = "Emoji story: 🐶🐱🐭", {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    plain = engine.generate(prompt, greedy)
    assert plain["text"].startswith("🐧🐧🐧"), plain["text"]  # what the case relies on
    per = len(engine.tokenizer.encode("🐧", add_special_tokens=False))
    assert per >= 2
    out = engine.generate(prompt, {**greedy, "stop": ["🐧🐧"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "🐧🐧"}, out["meta_info"]
    assert out["text"] == "" and out["meta_info"]["completion_tokens"] == 2 * per
    chunks = list(engine.generate(prompt, greedy, stream=True))
    assert chunks[-1]["output_ids"] == plain["output_ids"]
    assert chunks[-1]["text"] == plain["text"]
    assert all(b["output_ids"][:len(a["output_ids"])] == a["output_ids"] for a, b in zip(chunks, chunks[1:]))


def test_stop_token_is_trimmed_from_the_text(engine, prompts):
    """As in SGLang: the matched stop token (stop_token_ids, EOS) stays in output_ids, not in the
    text; no_stop_trim keeps it, streaming gives the same text."""
    tok = engine.tokenizer
    ids = engine.generate(prompts[3], GREEDY)["output_ids"]
    k = next(i for i in range(2, len(ids)) if tok.decode(ids[i:i + 1]).strip() and ids[i] not in ids[:i])
    p = {**GREEDY, "stop_token_ids": [ids[k]]}
    out = engine.generate(prompts[3], p)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[k]}
    assert out["output_ids"] == ids[:k + 1] and out["text"] == tok.decode(ids[:k])
    assert list(engine.generate(prompts[3], p, stream=True))[-1]["text"] == out["text"]
    assert engine.generate(prompts[3], {**p, "no_stop_trim": True})["text"] == tok.decode(ids[:k + 1])
    eos = {"max_new_tokens": 64, "temperature": 0, "skip_special_tokens": False}
    out = engine.generate(prompts[1], eos)
    assert out["meta_info"]["finish_reason"]["type"] == "stop" and out["output_ids"][-1] == tok.eos_token_id
    assert out["text"] == tok.decode(out["output_ids"][:-1], skip_special_tokens=False)
    kept = engine.generate(prompts[1], {**eos, "no_stop_trim": True})["text"]
    assert kept == out["text"] + tok.decode(out["output_ids"][-1:], skip_special_tokens=False)


def test_logprobs(engine, prompts):
    out = engine.generate(prompts[1], {"max_new_tokens": 4, "temperature": 0}, return_logprob=True,
                          logprob_start_len=3, top_logprobs_num=2)
    m = out["meta_info"]
    assert len(m["output_token_logprobs"]) == m["completion_tokens"]
    # greedy: the chosen token is the top alternative
    for (lp, tok, text), tops in zip(m["output_token_logprobs"], m["output_top_logprobs"]):
        assert tops[0][1] == tok and tops[0][0] == lp and lp <= 0 and text is None
    # sampled: a chosen token listed among the top ones shows the very same value
    sampled = engine.generate(prompts[1], {"max_new_tokens": 12, "temperature": 1.0, "seed": 3}, return_logprob=True,
                              top_logprobs_num=5)["meta_info"]
    listed = [(lp, dict((t, v) for v, t, _ in tops)[tok]) for (lp, tok, _), tops in
              zip(sampled["output_token_logprobs"], sampled["output_top_logprobs"]) if tok in {t for _, t, _ in tops}]
    assert listed and all(a == b for a, b in listed), listed
    assert len(m["input_token_logprobs"]) == m["prompt_tokens"] - 3
    assert all(lp <= 0 for lp, _, _ in m["input_token_logprobs"])
    ids = engine.encode(prompts[1])
    assert [t for _, t, _ in m["input_token_logprobs"]] == ids[3:]


def test_logprobs_with_token_texts(engine, prompts):
    out = engine.generate(prompts[1], {"max_new_tokens": 6, "temperature": 0}, return_logprob=True,
                          logprob_start_len=0, top_logprobs_num=2, return_text_in_logprobs=True)
    m = out["meta_info"]
    assert "".join(text for _, _, text in m["output_token_logprobs"]) == out["text"]
    assert "".join(text for _, _, text in m["input_token_logprobs"]) == prompts[1]
    assert m["input_token_logprobs"][0][0] is None and m["input_top_logprobs"][0] is None
    assert all(isinstance(e[2], str) for t in m["output_top_logprobs"] + m["input_top_logprobs"][1:] for e in t)
    with pytest.raises(ValueError, match="return_text_in_logprobs"):
        engine.generate(prompts[1], {"max_new_tokens": 2}, return_logprob=True, return_text_in_logprobs=1)


def test_prompt_logprobs_arrive_with_the_first_streamed_chunk(engine, prompts):
    kw = dict(return_logprob=True, logprob_start_len=0)
    full = engine.generate(prompts[1], {"max_new_tokens": 4, "temperature": 0}, **kw)["meta_info"]
    chunks = list(engine.generate(prompts[1], {"max_new_tokens": 4, "temperature": 0}, stream=True, **kw))
    first = chunks[0]["meta_info"]["input_token_logprobs"]
    assert len(chunks) > 1 and len(first) == full["prompt_tokens"] and first[0][0] is None
    assert [lp for lp, _, _ in first[1:]] == pytest.approx([lp for lp, _, _ in full["input_token_logprobs"][1:]],
                                                           abs=1e-3)
    assert chunks[-1]["meta_info"]["input_token_logprobs"] == first
    # each chunk's output lists hold what was made so far, and stay as they were handed out
    outs = [c["meta_info"]["output_token_logprobs"] for c in chunks]
    assert all(outs[-1][:len(o)] == o for o in outs) and len(outs[-1]) == full["completion_tokens"]
    assert len(outs[0]) < len(outs[-1])


def test_logit_bias(engine, prompts, reference):
    # +100 forces a token, -100 bans one; requests without a bias in the same batch are unchanged
    forced, banned = reference[1][5], reference[0][0]
    outs = engine.generate(prompts[:3], [{**GREEDY, "max_new_tokens": 6, "logit_bias": {forced: 100}},
                                         {**GREEDY, "logit_bias": {str(banned): -100.0}}, GREEDY])
    assert outs[0]["output_ids"] == [forced] * 6
    assert banned not in outs[1]["output_ids"]
    assert outs[2]["output_ids"] == reference[2]
    sampled = engine.generate(prompts[3], {"max_new_tokens": 8, "temperature": 1.0, "seed": 5,
                                           "logit_bias": {banned: -100, forced: -100}})
    assert not {banned, forced} & set(sampled["output_ids"])
    for bad, words in [({1: 101}, "in \\[-100, 100\\]"), ({-1: 1}, "token ids"), ({"x": 1}, "token ids"),
                       ({10**9: 1}, "vocab size")]:
        with pytest.raises(ValueError, match=words):
            engine.generate(prompts[0], {**GREEDY, "logit_bias": bad})


def test_penalties_and_min_tokens(engine, prompts):
    out = engine.generate(prompts[4], {"max_new_tokens": 12, "min_new_tokens": 12, "temperature": 0,
                                       "frequency_penalty": 1.5, "presence_penalty": 0.5,
                                       "repetition_penalty": 1.3})
    assert out["meta_info"]["completion_tokens"] == 12
    assert engine.tokenizer.eos_token_id not in out["output_ids"]


def test_min_tokens_on_the_greedy_path(engine, prompts):
    """min_new_tokens bans the stop tokens as a logits ban, so an all-greedy batch keeps the
    plain argmax: a reply that would end early goes on as if EOS were biased away."""
    eos = engine.tokenizer.eos_token_id
    short = engine.generate(prompts[1], {"max_new_tokens": 40, "temperature": 0})
    n = short["meta_info"]["completion_tokens"]
    assert n < 20 and short["meta_info"]["finish_reason"]["type"] == "stop"
    held = engine.generate(prompts[1], {"max_new_tokens": 40, "min_new_tokens": 20, "temperature": 0})
    biased = engine.generate(prompts[1], {"max_new_tokens": 20, "temperature": 0, "logit_bias": {eos: -100}})
    assert held["meta_info"]["completion_tokens"] >= 20
    assert held["output_ids"][:20] == biased["output_ids"]
    assert held["output_ids"][:n - 1] == short["output_ids"][:n - 1]  # the same until the EOS


def test_out_of_range_params_raise(engine):
    for bad, field in [({"temperature": -1}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"top_k": 0}, "top_k"),
                       ({"n": 0}, "n"), ({"n": 129}, "n"), ({"temperature": float("nan")}, "finite"),
                       ({"top_p": float("inf")}, "finite"), ({"regex": "a", "choices": ["a"]}, "at most one")]:
        with pytest.raises(ValueError, match=field):
            engine.generate("hi", bad)
    with pytest.raises(ValueError, match="exceed the context length"):
        engine.generate("hi", {"max_new_tokens": 10**6})
    # more top logprobs than the limit (here more than the vocabulary: topk would fail the
    # whole batch step) is the caller's error, raised before anything is queued
    for top in (21, 50_000, -1):
        with pytest.raises(ValueError, match=r"top_logprobs_num must be in \[0, 20\]"):
            engine.generate("hi", {"max_new_tokens": 2}, return_logprob=True, top_logprobs_num=top)
    engine.check_integrity()
    # a KV pool smaller than the context: what fits the context may still never fit the pool
    r = TokenizedGenerateReq("x", [1, 2], SamplingParams(max_new_tokens=100))
    with pytest.raises(ValueError, match="never fit the KV pool of 50 slots"):
        validate_request(r, vocab_size=100, context_len=1000, num_slots=50)
    r = TokenizedGenerateReq("x", list(range(1, 61)), SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError, match=r"the prompt \(60 tokens\) can never fit the KV pool of 50 slots.*shorten it"):
        validate_request(r, vocab_size=100, context_len=1000, num_slots=50)
    # the default max_new_tokens (128) is cut by the context, so it needs only what the context holds
    validate_request(TokenizedGenerateReq("x", list(range(1, 41)), SamplingParams()), 100, context_len=80,
                     num_slots=100)
    with pytest.raises(ValueError, match=r"max_new_tokens \(60\) can never fit the KV pool of 80 slots"):
        validate_request(TokenizedGenerateReq("x", list(range(1, 41)), SamplingParams()), 100, context_len=100,
                         num_slots=80)


def test_a_default_max_new_tokens_is_cut_by_the_context_on_a_small_pool():
    """A pool smaller than prompt + the default 128 new tokens, but not than the context: the
    request runs to the context (it was refused as "can never fit the KV pool")."""
    with Engine(max_total_tokens=200, context_length=160) as e:
        ids = list(range(1000, 1100))
        out = e.generate(input_ids=ids, sampling_params={"temperature": 0, "ignore_eos": True})
        assert out["meta_info"]["completion_tokens"] == 60, out["meta_info"]
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        with pytest.raises(ValueError, match="exceed the context length"):  # set by the caller: refused
            e.generate(input_ids=ids, sampling_params={"max_new_tokens": 61})
        e.check_integrity()


def test_integers_beyond_int64_are_served(engine, prompts):
    """Seeds are any integers (OpenAI sets no range) and a top_k past the vocabulary is no cut:
    neither may reach the kernels' int64 / int32 tensors as is (it once killed the scheduler)."""
    base = {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    outs = engine.generate([prompts[0]] * 4, [{**base, "seed": 10**20}, {**base, "seed": 10**20 % (1 << 63)},
                                              {**base, "seed": 7, "top_k": 10**12}, {**base, "seed": 7}])
    assert outs[0]["output_ids"] == outs[1]["output_ids"] and outs[2]["output_ids"] == outs[3]["output_ids"]
    assert engine.generate(prompts[0], {**base, "seed": -(10**30)})["meta_info"]["completion_tokens"] == 6
    engine.check_integrity()


def test_overlap_schedule_matches_plain_path(prompts):
    """Every feature whose host work moves behind the next forward with overlap scheduling:
    seeded sampling, grammars (masks filled for step N+1 while it runs, jump-forward drafts
    dropping their row), stop strings, min tokens, penalties, logprobs, streaming, abort."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"]}
    params = [
        {"max_new_tokens": 20, "temperature": 0.8, "top_p": 0.9, "seed": 11},
        {"max_new_tokens": 40, "temperature": 0, "json_schema": schema},
        {"max_new_tokens": 40, "temperature": 0.7, "seed": 2, "regex": r"[A-Z][a-z]{2,6}, [0-9]{1,3}"},
        {"max_new_tokens": 30, "temperature": 0, "stop": ["."]},
        {"max_new_tokens": 12, "temperature": 0, "min_new_tokens": 12, "frequency_penalty": 0.5},
        {"max_new_tokens": 3, "temperature": 0},
    ]
    outs = {}
    for mode in ("off", "on"):
        with Engine(max_total_tokens=8192, overlap_schedule=mode) as e:
            res = e.generate(prompts, params, return_logprob=True, top_logprobs_num=2)
            streamed = list(e.generate(prompts[0], params[3], stream=True))[-1]["text"]
            # abort while the step is in flight: the others finish, no slot leaks
            it = e.generate(prompts[1], {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}, stream=True)
            next(it)
            it.close()
            e.check_integrity()
            info = e.get_server_info()
            assert info["num_running"] == 0 and info["free_slots"] + info["evictable_slots"] == info["total_slots"]
            outs[mode] = ([(o["output_ids"], o["meta_info"]["finish_reason"]) for o in res],
                          [[t for _, t, _ in o["meta_info"]["output_token_logprobs"]] for o in res], streamed)
    assert outs["on"][0] == outs["off"][0]
    assert outs["on"][1] == outs["off"][1]
    assert outs["on"][2] == outs["off"][2]


def test_a_failed_step_costs_only_the_request_that_makes_it_fail(engine, prompts, reference):
    """An exception inside a batch step (injected into the real model's forward), once, mid-decode
    of a batch of three: the three run again (their output so far kept, their KV rebuilt), and
    give the reference outputs token for token, no error. A request that makes every step it is
    in fail (from its 5th token on) ends alone with an error of its own (a BatchError, a
    ValueError), the two beside it with their reference outputs; no KV slot leaks. Before, a
    failed step ended every request in it with a RuntimeError."""
    sched = engine.scheduler
    real = sched.runner.forward
    calls = {"n": 0}

    def flaky(fb):
        calls["n"] += 1
        if calls["n"] == 3:  # mid-decode of the batch
            raise RuntimeError("injected forward failure")
        return real(fb)

    poison = {**GREEDY, "max_new_tokens": GREEDY["max_new_tokens"] - 1}  # how `poisoned` knows it

    def poisoned(fb):
        rows = set(fb.req_pool_indices.tolist())
        if any(r.req_pool_idx in rows and r.params.max_new_tokens == poison["max_new_tokens"]
               and len(r.output_ids) >= 5 for r in list(sched._live.values())):
            raise RuntimeError("injected poison")
        return real(fb)

    sched.runner.forward = flaky
    try:
        out = engine.generate(prompts[:3], GREEDY)
        assert calls["n"] > 3 and [o["output_ids"] for o in out] == reference[:3]
        engine.check_integrity()
        sched.runner.forward = poisoned
        with pytest.raises(BatchError, match="made its batch step fail.*injected poison") as e:
            engine.generate(prompts[:3], [GREEDY, poison, GREEDY])
    finally:
        sched.runner.forward = real
    assert list(e.value.errors) == [1] and len(e.value.results[1]["output_ids"]) == 5
    assert [e.value.results[i]["output_ids"] for i in (0, 2)] == [reference[0], reference[2]]
    engine.check_integrity()
    again = engine.generate(prompts, GREEDY)
    assert [o["output_ids"] for o in again] == reference
    engine.check_integrity()
    # a request's own bad input is still a ValueError
    with pytest.raises(ValueError):
        engine.generate(prompts[0], {"max_new_tokens": 4, "temperature": -1})


def _wait_running(engine, n: int, timeout_s: float = 60.0) -> None:
    import time

    end = time.monotonic() + timeout_s
    while engine.get_server_info()["num_running"] != n:
        assert time.monotonic() < end, f"never {n} running"
        time.sleep(0.05)


def test_cancelling_async_generate_aborts_its_requests(engine, prompts):
    """A cancelled non-streamed async_generate frees its KV at once rather than decoding on
    for nobody (a cancelled stream already aborted)."""
    import asyncio

    async def main():
        task = asyncio.create_task(engine.async_generate(prompts[:2], {"max_new_tokens": 2000,
                                                                       "ignore_eos": True}))
        await asyncio.to_thread(_wait_running, engine, 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(_wait_running, engine, 0, 10.0)  # 2000 tokens would take minutes
        # cancelled as soon as it starts: nothing may be submitted behind the aborts
        task = asyncio.create_task(engine.async_generate(prompts[2], {"max_new_tokens": 2000, "ignore_eos": True}))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.0)
        await asyncio.to_thread(_wait_running, engine, 0, 10.0)
        assert engine.get_server_info()["num_waiting"] == 0

    asyncio.run(main())
    info = engine.get_server_info()
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"]
    engine.check_integrity()
    out = engine.generate(prompts[0], GREEDY)  # and it serves on
    assert out["meta_info"]["completion_tokens"] == GREEDY["max_new_tokens"]


def test_abort_by_the_rid_given_for_a_batch_or_n_samples(engine, prompts):
    """As the server's /abort_request: abort(rid) reaches every part of the batch or of the n
    samples sent as `rid`, parts not yet sent (their shared prompt still being warmed) too.
    Before, only an exact part id ("<rid>-0") was found and the rest ran to the end."""
    import threading

    long_prompt = " ".join(prompts) * 6  # a warm-up long enough to abort in
    for rid, args in (("nsamp", (long_prompt, {"max_new_tokens": 2000, "ignore_eos": True, "n": 3,
                                              "temperature": 1.0})),
                      ("pair", (prompts[:2], {"max_new_tokens": 2000, "ignore_eos": True}))):
        for wait_for_decode in (False, True):
            out = []
            t = threading.Thread(target=lambda: out.append(engine.generate(*args, rid=rid)))
            t.start()
            deadline = time.time() + 30
            while rid not in engine._groups and time.time() < deadline:
                time.sleep(0.001)
            while wait_for_decode and engine.get_server_info()["num_running"] < 2:
                assert time.time() < deadline, "never decoding"
                time.sleep(0.05)
            engine.abort(rid)
            t.join(60)
            assert not t.is_alive(), "aborted requests still running"
            assert [o["meta_info"]["finish_reason"]["type"] for o in out[0]] == ["abort"] * len(out[0])
            assert all(o["meta_info"]["completion_tokens"] < 2000 for o in out[0])
            # named as the server names them: "<rid>-<j>" for samples too (was "<rid>-0-<j>")
            assert [o["meta_info"]["id"] for o in out[0]] == [f"{rid}-{j}" for j in range(len(out[0]))]
            assert rid not in engine._groups
    _wait_running(engine, 0, 10.0)
    engine.check_integrity()
    info = engine.get_server_info()
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"]


def test_an_interrupted_generate_aborts_and_frees_its_ids(engine, prompts):
    """A blocking generate stopped by an exception in its thread (Ctrl-C in a notebook: here
    a timer signal) aborts its requests and releases their ids. Before, they decoded on to
    max_new_tokens and the rid stayed "already in use" for the engine's life."""
    import signal

    class Interrupt(Exception):
        pass

    def interrupt(*_):
        raise Interrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(Interrupt):
            engine.generate(prompts[:2], {"max_new_tokens": 2000, "ignore_eos": True}, rid="interrupted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    _wait_running(engine, 0, 10.0)  # 2000 tokens would take minutes
    assert not engine._outboxes and not engine._groups
    out = engine.generate(prompts[0], GREEDY, rid="interrupted")  # the id is free again
    assert out["meta_info"]["completion_tokens"] == GREEDY["max_new_tokens"]
    engine.check_integrity()


def test_exit_without_shutdown_while_a_request_runs_is_clean(tmp_path):
    """An Engine never shut down is shut down at interpreter exit. Before, a stream left open
    at exit took the process down with SIGABRT ("terminate called without an active
    exception") as the engine thread was torn down mid-step."""
    import subprocess
    import sys

    script = tmp_path / "leave.py"
    script.write_text(
        "from treadle.runtime import Engine\n"
        "e = Engine(max_total_tokens=4096)\n"
        "it = e.generate('Tell me a long story.', {'max_new_tokens': 2000, 'ignore_eos': True}, stream=True)\n"
        "next(it); next(it)\n"
        "print('leaving', flush=True)\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "leaving" in run.stdout, (run.returncode, run.stderr[-2000:])
    assert "terminate called" not in run.stderr


def test_async_stream_checks_its_input_at_the_call(engine, prompts):
    """async_generate(stream=True) raises a bad input's ValueError when called, as the
    unstreamed call does (it raised only once iterated), and streams what generate streams."""
    import asyncio

    async def main():
        with pytest.raises(ValueError, match="temperature"):
            await engine.async_generate(prompts[0], {"temperature": -1}, stream=True)
        it = await engine.async_generate(prompts[0], GREEDY, stream=True)
        return [c["text"] async for c in it][-1]  # the text so far, as SGLang's

    assert asyncio.run(main()) == engine.generate(prompts[0], GREEDY)["text"]


def test_shutdown_ends_every_caller_still_waiting():
    """Requests in flight when the engine shuts down (a blocking call in another thread, a
    stream half read) raise EngineDeadError instead of waiting forever; so does every call
    after it, the control calls included."""
    import threading

    from treadle.runtime.engine import EngineDeadError

    e = Engine(max_total_tokens=4096)
    got: list = []

    def blocking():
        try:
            got.append(e.generate("Count to a thousand:", {"max_new_tokens": 3000, "ignore_eos": True}))
        except Exception as exc:  # what the caller sees
            got.append(exc)

    t = threading.Thread(target=blocking)
    t.start()
    stream = e.generate("Tell me a long story.", {"max_new_tokens": 3000, "ignore_eos": True}, stream=True)
    next(stream)
    _wait_running(e, 2)
    e.shutdown()
    t.join(timeout=30)
    assert not t.is_alive(), "the blocked caller still waits"
    assert isinstance(got[0], EngineDeadError) and "shut down" in str(got[0])
    with pytest.raises(EngineDeadError, match="shut down"):
        list(stream)
    for call in (e.get_server_info, e.flush_cache, e.check_integrity, lambda: e.generate("hi")):
        with pytest.raises(EngineDeadError, match="the engine is shut down"):
            call()
