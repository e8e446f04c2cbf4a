"""N-gram speculative decoding: the lookup against a brute-force reference, and greedy and
seeded sampled outputs of the real SmolLM2 identical with and without it, in fewer forward
steps when the reply copies its prompt."""
from __future__ import annotations

import random

import pytest

from treadle.runtime.engine import Engine
from treadle.runtime.ngram_draft import NgramIndex


def brute_force(seq: list[int], n: int, k: int) -> list[int]:
    """What followed the latest earlier occurrence of seq's last n tokens."""
    key = seq[-n:]
    for p in range(len(seq) - 1, n - 1, -1):  # p: the position after the occurrence
        if seq[p - n:p] == key:
            return seq[p:p + k]
    return []


@pytest.mark.parametrize("n", [1, 2, 3])
def test_index_matches_brute_force_as_the_output_grows(n):
    rng = random.Random(n)
    for _ in range(30):
        prompt = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        output: list[int] = []
        index = NgramIndex(n)
        for _ in range(15):
            k = rng.randrange(1, 5)
            assert index.draft(prompt, output, k) == brute_force(prompt + output, n, k)
            output.append(rng.randrange(4))


def test_index_examples():
    assert NgramIndex(2).draft([1, 2, 3, 4, 1, 2], [], 3) == [3, 4, 1]
    assert NgramIndex(2).draft([1, 2, 3, 1, 2, 9, 1], [2], 2) == [9, 1]  # the latest occurrence wins
    assert NgramIndex(3).draft([1, 2, 3], [4], 5) == []  # no earlier occurrence
    with pytest.raises(ValueError):
        NgramIndex(0)


TEXT = ("The committee met on Tuesday to review the budget for the new library. After a long discussion, "
        "the members agreed to fund the children's reading room, the digital archive, and the roof. ")
COPY = f"<|im_start|>user\nRepeat this text exactly:\n{TEXT}<|im_end|>\n<|im_start|>assistant\n"
FREE = "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n"


def run(prompts, params, **kw):
    with Engine(max_total_tokens=4096, **kw) as e:
        i0 = e.get_server_info()
        outs = e.generate(prompts, params, return_logprob=True)
        i1 = e.get_server_info()
        e.check_integrity()
    return outs, {k: i1[k] - i0[k] for k in ("forward_steps", "spec_draft_tokens", "spec_accepted_tokens")}


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_greedy_output_is_unchanged_in_fewer_steps(overlap):
    greedy = {"max_new_tokens": 48, "temperature": 0}
    prompts = [COPY, FREE, COPY, COPY]
    params = [greedy, greedy, {**greedy, "stop": ["reading"], "max_new_tokens": 40},
              {**greedy, "min_new_tokens": 5, "max_new_tokens": 9}]
    plain, s0 = run(prompts, params, overlap_schedule=overlap)
    spec, s1 = run(prompts, params, overlap_schedule=overlap, speculative_algorithm="ngram")
    for a, b in zip(plain, spec):
        assert b["output_ids"] == a["output_ids"] and b["text"] == a["text"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
        lp_a = [x for x, _, _ in a["meta_info"]["output_token_logprobs"]]
        lp_b = [x for x, _, _ in b["meta_info"]["output_token_logprobs"]]
        assert lp_b == pytest.approx(lp_a, abs=1e-3)
    assert "reading" not in spec[2]["text"] and spec[2]["meta_info"]["finish_reason"]["type"] == "stop"
    assert s1["spec_accepted_tokens"] > 20 and s0["spec_draft_tokens"] == 0
    # a batch steps as often as its longest reply needs (FREE copies nothing); alone, a
    # copying reply takes far fewer steps
    one_plain, c0 = run([COPY], greedy, overlap_schedule=overlap)
    one_spec, c1 = run([COPY], greedy, overlap_schedule=overlap, speculative_algorithm="ngram")
    assert one_spec[0]["output_ids"] == one_plain[0]["output_ids"] == plain[0]["output_ids"]
    assert c1["forward_steps"] < c0["forward_steps"] * 0.5, (c0, c1)


def test_json_extraction_drafts_values_from_the_prompt():
    """With a grammar, a draft is cut where the grammar refuses it and verified on the
    grammar's masks: the JSON is the same, string values copied from the prompt in fewer steps."""
    import json

    schema = {"type": "object", "properties": {"quote": {"type": "string"}}, "required": ["quote"]}
    prompt = (f"<|im_start|>user\nRepeat this text exactly, as JSON with the key quote:\n{TEXT}<|im_end|>\n"
              "<|im_start|>assistant\n")
    params = {"max_new_tokens": 80, "temperature": 0, "json_schema": schema}
    plain, s0 = run([prompt], params)
    spec, s1 = run([prompt], params, speculative_algorithm="ngram")
    assert spec[0]["output_ids"] == plain[0]["output_ids"]
    assert json.loads(spec[0]["text"])["quote"].startswith("The committee met on Tuesday")
    assert s1["spec_accepted_tokens"] > 20 and s1["forward_steps"] < s0["forward_steps"] * 0.5, (s0, s1)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_seeded_sampled_output_is_unchanged(overlap):
    """A sampled request drafts too: a draft token is kept when the request's own draw at that
    output position (its seed's stream, penalties counting the draft tokens before it) is
    that token, so a seeded request writes the same tokens with and without drafts."""
    sampled = {"max_new_tokens": 40, "temperature": 0.7, "top_p": 0.9}
    prompts = [COPY, COPY, FREE]
    params = [{**sampled, "seed": 1}, {**sampled, "seed": 2, "frequency_penalty": 0.4, "repetition_penalty": 1.1},
              {**sampled, "seed": 3, "top_k": 20}]
    plain, s0 = run(prompts, params, overlap_schedule=overlap)
    spec, s1 = run(prompts, params, overlap_schedule=overlap, speculative_algorithm="ngram")
    for a, b in zip(plain, spec):
        assert b["output_ids"] == a["output_ids"], (a["text"], b["text"])
        lp_a = [x for x, _, _ in a["meta_info"]["output_token_logprobs"]]
        lp_b = [x for x, _, _ in b["meta_info"]["output_token_logprobs"]]
        assert lp_b == pytest.approx(lp_a, abs=1e-3)
    assert s1["spec_accepted_tokens"] > 10 and s0["spec_draft_tokens"] == 0, (s0, s1)
