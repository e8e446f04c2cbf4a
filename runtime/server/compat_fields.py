"""Request fields of SGLang's and vLLM's servers for features treadle does not have.

Clients written for those servers send them, most often at their defaults (SGLang's Python
client sends `"return_hidden_states": false`, `"lora_path": null`, ...). A value that asks for
nothing is taken and has no effect; a value that asks for the feature is a 400 naming the
field and saying why, never silently dropped. Fields that only label or log a request
(`log_metrics`, `no_logs`, ...) are taken at any value of their type.

`check_compat_fields(body, table)` checks the fields of `table` present in `body`;
the caller's own unknown-field check then skips them (`table`'s keys are accepted names).
"""
from __future__ import annotations

from typing import Any, Callable

from treadle.runtime.server.protocol import APIError
from treadle.runtime.sampling_params import quoted


def _none(v: Any) -> bool:
    return v is None


def _off(v: Any) -> bool:
    return v is None or v is False


def _empty(v: Any) -> bool:
    return v is None or (type(v) in (list, dict) and not v)


def _zero(v: Any) -> bool:  # a priority or rank of 0 (the only replica, the default priority)
    return v is None or (type(v) is int and v == 0)


def _one(v: Any) -> bool:  # vLLM's length_penalty default (only read by beam search)
    return v is None or (type(v) in (int, float) and v == 1)


def _labels(kind: type) -> Callable[[Any], bool]:
    """A field that only labels or logs the request: any value of `kind` (or null) is taken."""
    return lambda v: v is None or isinstance(v, kind)


_MULTIMODAL = "treadle serves text-only models"
_PD = "treadle has no prefill/decode disaggregation"
_LORA = "treadle serves no LoRA adapters"
_LOGIT_PROC = "treadle runs no custom logit processor"

# the checks each field's value must pass, and why another value cannot be served
Table = dict[str, tuple[Callable[[Any], bool], str]]

# SGLang's GenerateReqInput (POST /generate), beyond what treadle serves
NATIVE: Table = {
    "input_embeds": (_none, "treadle takes text or input_ids, not embeddings"),
    "image_data": (_none, _MULTIMODAL),
    "audio_data": (_none, _MULTIMODAL),
    "video_data": (_none, _MULTIMODAL),
    "modalities": (_empty, _MULTIMODAL),
    "token_ids_logprob": (_none, "treadle returns the sampled and top-k tokens' logprobs only (top_logprobs_num)"),
    "lora_path": (_none, _LORA),
    "lora_id": (_none, _LORA),
    "session_params": (_none, "treadle has no sessions (the radix cache shares a conversation's prefix by itself)"),
    "custom_logit_processor": (_none, _LOGIT_PROC),
    "return_hidden_states": (_off, "treadle returns no hidden states"),
    "return_entropy": (_off, "treadle returns no entropy"),
    "return_bytes": (_off, "treadle returns text, not bytes"),
    "bootstrap_host": (_none, _PD),
    "bootstrap_port": (_none, _PD),
    "bootstrap_room": (_none, _PD),
    "bootstrap_pair_key": (_none, _PD),
    "data_parallel_rank": (_zero, "a treadle server is one replica (rank 0); route with treadle's router"),
    "background": (_off, "treadle has no background requests (send the request and wait, or stream)"),
    "priority": (_zero, "treadle schedules without priorities"),
    "extra_key": (_none, "treadle's prefix cache has no per-request namespaces"),
    "log_metrics": (_labels(bool), "must be a boolean"),
    "no_logs": (_labels(bool), "must be a boolean"),
    "conversation_id": (_labels(str), "must be a string"),
    "custom_labels": (_labels(dict), "must be an object"),
}

# SGLang's and vLLM's extras of /v1/completions and /v1/chat/completions, beyond what treadle serves
OPENAI: Table = {
    # vLLM
    "use_beam_search": (_off, "treadle has no beam search"),
    "length_penalty": (_one, "length_penalty weighs beam search, which treadle does not have"),
    "guided_decoding_backend": (_labels(str), "must be a string"),  # one backend here: the constraint is the same
    "guided_whitespace_pattern": (_none, "the JSON whitespace pattern is the server's (--json-whitespace-pattern)"),
    "chat_template": (_none, "treadle renders the model's own chat template"),
    "documents": (_none, "treadle's chat template takes no documents"),
    "prompt_logprobs": (_none, "on /v1/completions, ask for the prompt's logprobs with echo and logprobs"),
    "priority": (_zero, "treadle schedules without priorities"),
    "return_tokens_as_token_ids": (_off, "treadle writes logprob tokens as text"),
    "mm_processor_kwargs": (_empty, _MULTIMODAL),
    "cache_salt": (_none, "treadle's prefix cache has no per-request salt"),
    "kv_transfer_params": (_none, _PD),
    "vllm_xargs": (_empty, "treadle takes no vLLM extension arguments"),
    "allowed_token_ids": (_none, "ban tokens with logit_bias instead"),
    "bad_words": (_empty, "treadle has no bad-words filter"),
    "prompt_embeds": (_none, "treadle takes text or token ids, not embeddings"),
    "logits_processors": (_empty, _LOGIT_PROC),
    "media_io_kwargs": (_empty, _MULTIMODAL),
    "return_token_ids": (_off, "the native /generate returns the token ids (output_ids)"),
    # OpenAI
    "audio": (_none, _MULTIMODAL),
    "web_search_options": (_none, "treadle has no web search"),
    # SGLang
    "lora_path": (_none, _LORA),
    "return_hidden_states": (_off, "treadle returns no hidden states"),
    "session_params": (_none, "treadle has no sessions (the radix cache shares a conversation's prefix by itself)"),
    "custom_logit_processor": (_none, _LOGIT_PROC),
    "custom_params": (_none, _LOGIT_PROC),
    "bootstrap_host": (_none, _PD),
    "bootstrap_port": (_none, _PD),
    "bootstrap_room": (_none, _PD),
    "data_parallel_rank": (_zero, "a treadle server is one replica (rank 0); route with treadle's router"),
    "extra_key": (_none, "treadle's prefix cache has no per-request namespaces"),
}


def check_compat_fields(body: dict, table: Table) -> None:
    """A 400 naming the first field of `table` in `body` whose value asks for what treadle
    does not do (or, for a label, is not of its type)."""
    for name in sorted(table.keys() & body.keys()):
        ok, why = table[name]
        value = body[name]
        # SGLang's batches may give one value per prompt: a list of values that ask for nothing
        per_prompt = type(value) is list and value and not why.startswith("must be") and all(ok(v) for v in value)
        if not ok(value) and not per_prompt:
            if why.startswith("must be"):
                raise APIError.bad_request(f"{name} {why}, got {quoted(value, 60)}", name)
            raise APIError.bad_request(f"{name}={quoted(value, 60)} is not supported: {why} "
                                       "(leave it out, or send its default)", name)
