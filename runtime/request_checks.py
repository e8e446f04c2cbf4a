"""The checks of a request that need no model: whether its max_new_tokens fits the context
(`check_context`) and whether it could ever be served (`validate_request`: token ids, the
context, the KV pool, the logprob fields), each a ValueError naming the problem before the
request touches any KV. The server's HTTP process runs them on every request, so this module
imports nothing heavy (the scheduler, which runs them too, imports torch and the model)."""
from __future__ import annotations

from typing import Any

from treadle.runtime.io_struct import TokenizedGenerateReq
from treadle.runtime.sampling_params import quoted

# the most top logprobs a token may ask for (vLLM's max_logprobs default, OpenAI's limit): each
# prompt position with logprobs keeps that many (id, logprob) pairs as Python objects
MAX_TOP_LOGPROBS = 20


def check_context(prompt_tokens: int, params: Any, context_len: int) -> None:
    """A max_new_tokens the caller set (in the ``params`` dict) that the context cannot hold is
    a ValueError, as in SGLang and vLLM; one left to its default is cut by the context."""
    m = params.get("max_new_tokens") if isinstance(params, dict) else None
    if isinstance(m, int) and not isinstance(m, bool) and prompt_tokens < context_len < prompt_tokens + m:
        raise ValueError(
            f"sampling_params.max_new_tokens ({quoted(m)}) + the prompt ({prompt_tokens} tokens) exceed the context "
            f"length {context_len}: at most {context_len - prompt_tokens} new tokens fit; lower it or shorten "
            "the prompt")


def validate_request(r: TokenizedGenerateReq, vocab_size: int, context_len: int, num_slots: int) -> None:
    """Raise ValueError naming the problem with a request before it touches any KV."""
    p = r.sampling_params
    p.validate(vocab_size)
    ids = r.input_ids
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise ValueError("input_ids must be a list of integer token ids")
    if not ids:
        raise ValueError("the prompt is empty: give at least one token")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise ValueError(f"input_ids must be in [0, {vocab_size}); got token id "
                         f"{quoted(max(ids) if max(ids) >= vocab_size else min(ids))}")
    if len(ids) >= context_len:
        raise ValueError(
            f"the prompt has {len(ids)} tokens, more than the context length {context_len} allows "
            f"(at most {context_len - 1}); shorten it")
    # what the request can write: the scheduler ends it at the context (a default max_new_tokens
    # is cut there; one the caller set past it was refused by check_context)
    new = min(p.max_new_tokens, context_len - len(ids))
    if len(ids) + min(new, 1) > num_slots:
        raise ValueError(f"the prompt ({len(ids)} tokens) can never fit the KV pool of {num_slots} slots with a "
                         "token to generate; shorten it")
    if len(ids) + new > num_slots:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({new}) can never fit the KV pool "
            f"of {num_slots} slots; lower max_new_tokens")
    for name in ("return_logprob", "return_text_in_logprobs"):
        if not isinstance(getattr(r, name), bool):
            raise ValueError(f"{name} must be a boolean, got {quoted(getattr(r, name))}")
    for name in ("logprob_start_len", "top_logprobs_num"):
        v = getattr(r, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an integer, got {quoted(v)}")
    if r.logprob_start_len < -1:
        raise ValueError(f"logprob_start_len must be -1 (the default: the last prompt token) or a position >= 0, "
                         f"got {quoted(r.logprob_start_len)}")
    if r.return_logprob and r.logprob_start_len >= len(ids):
        raise ValueError(f"logprob_start_len {quoted(r.logprob_start_len)} must be < the prompt length {len(ids)}")
    if not 0 <= r.top_logprobs_num <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {quoted(r.top_logprobs_num)}")
