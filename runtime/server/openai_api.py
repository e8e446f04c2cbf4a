"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

A request body is mapped onto native sampling params (OpenAI names -> treadle names, plus
pass-through extras such as regex / choices / top_k), run through the same TokenizerManager
as /generate, and the results are shaped like OpenAI's, streaming included.
"""
from __future__ import annotations

import codecs
import contextlib
import json
import time
import uuid
from typing import Any, AsyncIterator, Callable, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import Response

from treadle.runtime.io_struct import TokenizedGenerateReq
from treadle.runtime.sampling_params import GRAMMAR_FIELDS, SamplingParams
from treadle.runtime.server.compat_fields import OPENAI, check_compat_fields
from treadle.runtime.server.http_server import (ServerState, batch_part, off_loop_if_large, read_json,
                                                reply_entries)
from treadle.runtime.server.protocol import APIError, ReplyJSON, clip_names, finish_reason, matched_stop, quoted
from treadle.runtime.server.reasoning import ReasoningStream, model_thinks, opens_in_prompt
from treadle.runtime.server.reasoning import split as reasoning_split
from treadle.runtime.server.tool_calls import NAME_RE, ToolPlan, ToolStream, plan_tools
from treadle.runtime.server.streaming import gather_all, merge_streams, sse, stream_or_error, until_done_or_disconnect
from treadle.runtime.server.tokenizer_manager import Accum, Chunk, TokenizerManager, check_rid, merge_chunks

# OpenAI name -> sampling param name, for fields whose meaning is the same
_RENAMED = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
_PASSED = ("temperature", "top_p", "n", "stop", "seed", "frequency_penalty", "presence_penalty",
           # treadle / SGLang extras, sent by clients as extra_body
           "top_k", "min_p", "repetition_penalty", "ignore_eos", "regex", "json_schema", "choices", "ebnf",
           "structural_tag", "stop_token_ids", "skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens", "logit_bias",
           "json_schema_lenient", "include_stop_str_in_output")
# vLLM's names for the same constraints and options (extra_body), accepted so its clients work unchanged
_GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choices", "guided_grammar": "ebnf"}
# accepted and without effect here
_IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "stream_options",
            "stream", "logprobs", "top_logprobs", "response_format", "echo", "best_of")
# response_format json_object: any JSON object, nested to any depth (compiled to the pushdown
# automaton of constrained/index/json_any.py; with --json-whitespace-pattern, to a regex)
JSON_OBJECT_SCHEMA = {"type": "object"}
# chat hints OpenAI's client sends that change no token here (checked for type, then without
# effect, as in vLLM for models without such a control): {field: the type it must have}
_CHAT_HINTS = {"reasoning_effort": str, "verbosity": str, "prediction": dict}
# OpenAI's labels (of _IGNORED), without effect here but checked for type as OpenAI and
# /v1/responses check them: one of another type is a client's mistake, a 400 naming it
_LABELS = {"user": str, "service_tier": str, "prompt_cache_key": str, "safety_identifier": str, "store": bool,
           "metadata": dict}
# vLLM's fields treadle honours: request_id (the rid), add_special_tokens, truncate_prompt_tokens,
# guided_json_object (response_format json_object); and those of features it lacks (compat_fields.OPENAI)
_VLLM = ("request_id", "add_special_tokens", "truncate_prompt_tokens", "guided_json_object", "structured_outputs",
         *OPENAI)
# vLLM's structured_outputs object (its newer form of the guided_* fields): member -> our name
_STRUCTURED = {"json": "json_schema", "regex": "regex", "choice": "choices", "grammar": "ebnf",
               "structural_tag": "structural_tag"}
# its members that tune how a constraint is compiled, without asking for another output: taken
# at their defaults (and `backend`, `json_object` read below); else a 400 naming them
_STRUCTURED_DEFAULTS = {"disable_fallback": False, "disable_any_whitespace": False,
                        "disable_additional_properties": False, "whitespace_pattern": None}
_COMPLETION_FIELDS = {"model", "rid", "prompt", "suffix", *_RENAMED, *_PASSED, *_IGNORED, *_GUIDED, *_VLLM}
_CHAT_FIELDS = {"model", "rid", "messages", "stream_reasoning", *_VLLM, "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                "functions", "function_call",  # OpenAI's legacy function calling (tool_calls.legacy_plan)
                "add_generation_prompt", "continue_final_message", "modalities",
                "separate_reasoning", *_RENAMED, *_PASSED, *_IGNORED, *_GUIDED, *_CHAT_HINTS}


def register_openai_routes(app: FastAPI, state: ServerState) -> None:
    tm = state.tm

    def card() -> dict:
        return {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "treadle",
                "max_model_len": state.model_info["context_len"],
                # vLLM's and SGLang's: the model the served name stands for, and no base model of it
                "root": state.model_info["model_path"], "parent": None}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        state.check_model(model)
        return card()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_json(request)
        reqs, echoes = await tm.off_loop(_build_completion, state, body)
        return await _serve(request, state, body, reqs, chat=False, echoes=echoes)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await read_json(request)
        reqs, tools, think, echo = await build_chat(request, state, body)
        return await _serve(request, state, body, reqs, chat=True, tools=tools, think=think, chat_echo=echo)


async def build_chat(request: Request, state: ServerState, body: dict) -> tuple[list[TokenizedGenerateReq],
                                                                               ToolPlan | None, bool | None,
                                                                               str | None]:
    """A chat body -> its request, tools, reasoning split and echo (_build_chat, on a builder
    thread), with each tool's parameters compiled alone first (ToolPlan.checked_tools): one
    that does not compile is a 400 naming that tool. /v1/responses builds its requests here too."""
    tm = state.tm
    reqs, tools, think, echo, checks = await tm.off_loop(_build_chat, state, body)
    if checks:
        errors = await until_done_or_disconnect(request, tm.grammar_errors(checks))
        if errors:
            first = min(errors)
            raise APIError.bad_request(_tool_error(tools, errors[first], first), _tools_field(tools))
    return reqs, tools, think, echo


# ====================================================================== building requests
# (on a builder thread, TokenizerManager.off_loop: they tokenize)

def _build_completion(state: ServerState, body: dict) -> tuple[list[TokenizedGenerateReq],
                                                               list[tuple[str, list[int]]] | None]:
    """A /v1/completions body -> its requests (one per prompt) and, with echo, the prompts."""
    tm = state.tm
    _check_fields(body, _COMPLETION_FIELDS)
    state.check_model(body.get("model"))
    echo = body.get("echo", False)
    if echo is not None and not isinstance(echo, bool):
        raise APIError.bad_request("echo must be a boolean", "echo")
    if body.get("suffix") not in (None, ""):  # "" is no suffix (OpenAI takes it)
        raise APIError.bad_request("suffix is not supported by this server", "suffix")
    _check_best_of(body)
    lp = body.get("logprobs")
    if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 20):
        raise APIError.bad_request("logprobs must be an integer in [0, 20]", "logprobs")
    fit = body.get("truncate_prompt_tokens") is None  # else a prompt past the context is cut to fit
    prompts = [_truncated(tm, body, ids) for ids in _completion_prompts(tm, body.get("prompt"), _special(body, True),
                                                                         fit)]
    # echo with logprobs scores the prompt too (logprob_start_len 0): loglikelihood requests
    rids = _rids(body, len(prompts))
    reqs = []
    for i, (ids, rid) in enumerate(zip(prompts, rids)):
        with batch_part(i, False) if len(prompts) > 1 else contextlib.nullcontext():
            reqs.append(_make(tm, body, ids, default_max=16, return_logprob=lp is not None, top=lp or 0,
                              prompt_logprobs=bool(echo) and lp is not None, rid=rid))
    echoes = _echoes(tm, body.get("prompt") if fit else prompts, prompts) if echo else None  # cut: its ids' text
    return reqs, echoes


def _build_chat(state: ServerState, body: dict) -> tuple[list[TokenizedGenerateReq], ToolPlan | None, bool | None,
                                                         str | None, list[tuple[int, SamplingParams]]]:
    """A /v1/chat/completions body -> its request, its tools, whether the reply's reasoning
    is split off (True: the prompt opened the <think> block), with vLLM's `echo` the text the
    reply starts with, and the tools' parameters to compile alone first (_tool_checks)."""
    tm = state.tm
    _check_fields(body, _CHAT_FIELDS)
    state.check_model(body.get("model"))
    for name, kind in _CHAT_HINTS.items():
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise APIError.bad_request(f"{name} must be {'a string' if kind is str else 'an object'}", name)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise APIError.bad_request("echo must be a boolean", "echo")
    _check_best_of(body)  # as on completions: never silently one sample
    modalities = body.get("modalities")
    if modalities is not None and (not isinstance(modalities, list) or any(m != "text" for m in modalities)):
        raise APIError.bad_request('modalities: this server writes text only (["text"])', "modalities")
    tools = plan_tools(body)
    lp, top = body.get("logprobs", False), body.get("top_logprobs")
    if lp is not None and not isinstance(lp, bool):
        raise APIError.bad_request("logprobs must be a boolean", "logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise APIError.bad_request("top_logprobs must be an integer in [0, 20]", "top_logprobs")
    if top and not lp:
        raise APIError.bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    # SGLang's stream_reasoning false holds a streamed reply's reasoning back until its block
    # closes: not done here, so refused where it would change what is sent (a stream whose
    # reasoning is split off); elsewhere it asks for nothing
    held = body.get("stream_reasoning")
    if held is not None and not isinstance(held, bool):
        raise APIError.bad_request("stream_reasoning must be a boolean", "stream_reasoning")
    if held is False and body.get("stream") and state.args.reasoning_parser and body.get("separate_reasoning", True):
        raise APIError.bad_request("stream_reasoning=False is not supported: treadle streams the reasoning as it is "
                                   "written (leave it out, or send true)", "stream_reasoning")
    separate = body.get("separate_reasoning", True)
    if not isinstance(separate, bool):
        raise APIError.bad_request("separate_reasoning must be a boolean", "separate_reasoning")
    gen, cont = body.get("add_generation_prompt", True), body.get("continue_final_message", False)
    for name, v in (("add_generation_prompt", gen), ("continue_final_message", cont)):
        if not isinstance(v, bool):
            raise APIError.bad_request(f"{name} must be a boolean", name)
    if gen and cont:
        raise APIError.bad_request("continue_final_message continues the last message: set add_generation_prompt "
                                   "false with it", "continue_final_message")
    prompt = tm.chat_prompt(body.get("messages"), tools, body.get("chat_template_kwargs"), gen, cont)
    last = (body.get("messages") or [{}])[-1]
    last_text = last.get("content") if isinstance(last, dict) else None
    if isinstance(last_text, list):  # content parts: their text (joined as the prompt has them)
        # each part is text or an assistant's refusal, its string under its type (chat_prompt
        # checked them): a refusal's text was left out, and its "text" member, read instead,
        # joined as it came (a number: a TypeError, a 500)
        last_text = "".join(p[p["type"]] for p in last_text)
    if not isinstance(last_text, str):
        last_text = None
    continued = last_text if cont else None
    if tools is not None:  # a message ending inside a <tool_call> block: the reply finishes it
        tools = tools.continuing(continued)
    opened = opens_in_prompt(prompt, continued)
    # vLLM's echo: the last message's text leads the reply when it has the reply's role (the
    # assistant's; with add_generation_prompt false, the last message's own)
    chat_echo = last_text if echo and last_text and (not gen or last.get("role") == "assistant") else None
    think = opened if state.args.reasoning_parser == "think" and separate else None
    # a constraint holds for the answer: the reasoning block before it stays free
    after = None
    if state.args.reasoning_parser == "think":
        after = "open" if opened else "maybe" if model_thinks(tm.tokenizer) else None
    ids = _truncated(tm, body, tm.encode(prompt, "messages", add_special_tokens=_special(body, True),
                                         must_fit=body.get("truncate_prompt_tokens") is None))
    reqs = [_make(tm, body, ids, default_max=None, return_logprob=bool(lp), top=top or 0,
                  tools=tools, grammar_after_reasoning=after, rid=_rids(body, 1)[0])]
    return reqs, tools, think, chat_echo, _tool_checks(tm, tools, reqs[0].sampling_params)


def _tool_checks(tm: TokenizerManager, tools: ToolPlan | None, sp: SamplingParams) -> list[tuple[int, SamplingParams]]:
    """The json_schema params of each tool's parameters that ToolPlan.checked_tools compiles
    alone (index = the tool's), made as the request's own grammar is (its leniency too); a
    schema refused already here is a 400 naming its tool."""
    if tools is None:
        return []
    checks = []
    for i in tools.checked_tools(sp.structural_tag):
        try:
            p = SamplingParams.from_dict({"max_new_tokens": 1, "json_schema_lenient": sp.json_schema_lenient,
                                          "json_schema": json.dumps(tools.tools[i].parameters)})
            p.apply_leniency(tm.args.json_schema_lenient, mode=tm.args.json_schema_mode,
                             whitespace_pattern=tm.args.json_whitespace_pattern,
                             max_recursion_depth=tm.args.grammar_max_recursion_depth)
        except ValueError as e:
            raise APIError.bad_request(_tool_error(tools, str(e), i), _tools_field(tools)) from e
        checks.append((i, p))
    return checks


def _tools_field(tools: ToolPlan) -> str:
    """The field the request sent its tools in."""
    return "functions" if tools.legacy else "tools"


def _tool_error(tools: ToolPlan, message: str, i: int) -> str:
    """An error of tool `i`'s parameters compiled alone, in the request's terms: its paths
    (ToolPlan.locate), and the sampling field it names first ("json_schema: keyword 'type' at
    ...", after "grammar compilation failed: " when it did not compile) named as sent."""
    head = _COMPILE_FAILED if message.startswith(_COMPILE_FAILED) else ""
    rest = tools.locate(message[len(head):], i)
    if rest.startswith("json_schema:"):  # its place follows: "at tools[0].function.parameters..."
        rest = _tools_field(tools) + rest[len("json_schema"):]
    elif rest.startswith("json_schema "):
        rest = tools.where(i) + rest[len("json_schema"):]
    return head + rest


# ====================================================================== request mapping

def _rids(body: dict, n: int) -> list[str | None]:
    """SGLang's `rid` (the name /abort_request ends the request by): one prompt's, or
    "<rid>-<i>" for a list of prompts; None (a fresh id) when not given."""
    rid = body.get("rid")
    if rid is None:
        return [None] * n
    if not isinstance(rid, str) or not rid:
        raise APIError.bad_request("rid must be a non-empty string", "rid")
    check_rid(rid)
    return [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]


def _check_best_of(body: dict) -> None:
    """best_of: taken where it is n (the samples asked for are the ones returned); any other
    number is a 400, as is a value of another type (true and 1.0 equal 1 in Python: they
    passed as n's default), and left out or null as n's default (null n is 1 here too)."""
    best_of, n = body.get("best_of"), body.get("n")
    if best_of is None:
        return
    if type(best_of) is not int:
        raise APIError.bad_request(f"best_of must be an integer, got {quoted(best_of)}", "best_of")
    if best_of != (1 if n is None else n):
        raise APIError.bad_request("best_of is not supported by this server (only a best_of equal to n)", "best_of")


def _check_fields(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise APIError.bad_request(f"unknown field(s): {clip_names(unknown)}", unknown[0])
    check_compat_fields(body, OPENAI)
    for name, kind in _LABELS.items():
        value = body.get(name)
        if value is not None and not isinstance(value, kind):
            what = {str: "a string", bool: "a boolean", dict: "an object of strings"}[kind]
            raise APIError.bad_request(f"{name} must be {what}, got {quoted(value, 60)}", name)
    metadata = body.get("metadata")
    if metadata and not all(isinstance(v, str) for v in metadata.values()):
        raise APIError.bad_request(f"metadata must be an object of strings, got {quoted(metadata, 60)}", "metadata")
    request_id = body.get("request_id")  # vLLM's name of the request: the rid here
    if request_id is not None:
        if not isinstance(request_id, str) or not request_id:
            raise APIError.bad_request("request_id must be a non-empty string", "request_id")
        if body.get("rid") is not None and body["rid"] != request_id:
            raise APIError.bad_request("rid and request_id differ (both name the request; give one)", "request_id")
        body["rid"] = request_id
    if body.get("guided_json_object") not in (None, True, False):
        raise APIError.bad_request("guided_json_object must be a boolean", "guided_json_object")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise APIError.bad_request("stream must be a boolean", "stream")
    so = body.get("stream_options")
    if so is not None:  # as OpenAI's and vLLM's
        if stream is not True:
            raise APIError.bad_request("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(so, dict):
            raise APIError.bad_request("stream_options must be an object", "stream_options")
        # include_usage is what it does, and vLLM's continuous_usage_stats (with it, every
        # chunk carries the usage so far); others (OpenAI's include_obfuscation) are taken and
        # without effect
        for name in ("include_usage", "continuous_usage_stats"):
            if not isinstance(so.get(name, False), bool):
                raise APIError.bad_request(f"stream_options.{name} must be a boolean", "stream_options")


def _structured(body: dict) -> dict[str, Any]:
    """vLLM's `structured_outputs` as our sampling params ({"choice": [...]} -> choices); its
    `json_object: true` is response_format json_object (_make reads it)."""
    so = body.get("structured_outputs")
    if so is None:
        return {}
    if not isinstance(so, dict):
        raise APIError.bad_request("structured_outputs must be an object", "structured_outputs")
    known = {*_STRUCTURED, *_STRUCTURED_DEFAULTS, "json_object", "backend"}
    unknown = sorted(set(so) - known)
    if unknown:
        raise APIError.bad_request(f"structured_outputs: unknown member(s) {clip_names(unknown)}; accepted: "
                                   f"{', '.join(sorted(known))}", "structured_outputs")
    for name, default in _STRUCTURED_DEFAULTS.items():
        if so.get(name) not in (None, default):
            raise APIError.bad_request(f"structured_outputs.{name}={quoted(so[name], 60)} is not supported (leave "
                                       f"it out, or send {json.dumps(default)})", "structured_outputs")
    if so.get("backend") is not None and not isinstance(so["backend"], str):
        raise APIError.bad_request("structured_outputs.backend must be a string", "structured_outputs")
    if so.get("json_object") not in (None, True, False):
        raise APIError.bad_request("structured_outputs.json_object must be a boolean", "structured_outputs")
    out = {ours: so[theirs] for theirs, ours in _STRUCTURED.items() if so.get(theirs) is not None}
    if len(out) + bool(so.get("json_object")) > 1:
        raise APIError.bad_request("structured_outputs: give one constraint", "structured_outputs")
    return out


def _special(body: dict, default: bool) -> bool:
    """vLLM's add_special_tokens: whether the tokenizer adds its special tokens (BOS) to the
    prompt's text (true when not given, as before it was read; vLLM's chat default is false,
    the same prompt for a tokenizer that adds nothing, as SmolLM2's)."""
    v = body.get("add_special_tokens")
    if v is None:
        return default
    if not isinstance(v, bool):
        raise APIError.bad_request("add_special_tokens must be a boolean", "add_special_tokens")
    return v


def _truncated(tm: TokenizerManager, body: dict, ids: list[int]) -> list[int]:
    """vLLM's truncate_prompt_tokens k: the prompt's last k tokens (-1: as many as the context
    holds with a token to write)."""
    k = body.get("truncate_prompt_tokens")
    if k is None:
        return ids
    if type(k) is not int or (k < 1 and k != -1):
        raise APIError.bad_request(f"truncate_prompt_tokens must be -1 or an integer >= 1, got {quoted(k)}",
                                   "truncate_prompt_tokens")
    if k == -1:
        k = tm.context_len - 1
    return ids[-k:]


def _completion_prompts(tm: TokenizerManager, prompt: Any, special: bool = True,
                        must_fit: bool = True) -> list[list[int]]:
    """prompt: a string, a list of strings, a list of token ids, or a list of such lists;
    `special`: vLLM's add_special_tokens (the BOS the tokenizer adds to a text); `must_fit`:
    as TokenizerManager.encode's (false where truncate_prompt_tokens cuts the prompt)."""
    if isinstance(prompt, str):
        return [tm.encode(prompt, "prompt", add_special_tokens=special, must_fit=must_fit)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            tm.check_prompt_count(len(prompt), "prompt")  # before tokenizing them all
            return [tm.encode(p, "prompt", add_special_tokens=special, must_fit=must_fit) for p in prompt]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) for p in prompt):
            tm.check_prompt_count(len(prompt), "prompt")
            return [list(p) for p in prompt]
    raise APIError.bad_request("prompt must be a string, a list of strings, or token ids", "prompt")


def _echoes(tm: TokenizerManager, prompt: Any, prompts: list[list[int]]) -> list[tuple[str, list[int]]]:
    """(text, token ids) of each prompt, to echo: the client's own text, or its ids decoded."""
    texts = [prompt] if isinstance(prompt, str) else prompt if all(isinstance(p, str) for p in prompt) else None
    if texts is None:
        texts = [tm.tokenizer.decode(ids) if tm.tokenizer is not None else "" for ids in prompts]
    return list(zip(texts, prompts))


def _response_format(rf: Any) -> tuple[str, str] | None:
    """response_format -> (sampling param, its value) for constrained decoding (None for text):
    a JSON schema, or a structural tag (SGLang's: free text whose tagged segments follow schemas)."""
    if rf is None:
        return None
    kinds = ("text", "json_object", "json_schema", "structural_tag")
    if not isinstance(rf, dict) or rf.get("type") not in kinds:
        raise APIError.bad_request(f"response_format.type must be one of {', '.join(kinds)}", "response_format")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return "json_schema", json.dumps(JSON_OBJECT_SCHEMA)
    if rf["type"] == "structural_tag":
        return "structural_tag", json.dumps(rf, ensure_ascii=False)
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", True), (dict, bool)):  # OpenAI's is optional
        raise APIError.bad_request("response_format.json_schema must be an object; its `schema`, a JSON Schema",
                                   "response_format")
    # OpenAI's rules (vLLM and SGLang require the name too)
    if not isinstance(spec.get("name"), str) or not NAME_RE.match(spec["name"]):
        raise APIError.bad_request("response_format.json_schema.name must be 1-64 letters, digits, _ or -",
                                   "response_format")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise APIError.bad_request("response_format.json_schema.strict must be a boolean", "response_format")
    return "json_schema", json.dumps(spec.get("schema", True))


def _make(tm: TokenizerManager, body: dict, ids: list[int], default_max: int | None,
          return_logprob: bool, top: int, tools: ToolPlan | None = None,
          prompt_logprobs: bool = False, grammar_after_reasoning: str | None = None,
          rid: str | None = None) -> TokenizedGenerateReq:
    params: dict[str, Any] = {}
    for name in _PASSED:
        if body.get(name) is not None:
            params[name] = body[name]
    if type(params.get("top_k")) is int and params["top_k"] == 0:  # vLLM's "off" (and its default), as -1
        params["top_k"] = -1
    for name, value in _structured(body).items():
        if params.get(name) is not None:
            raise APIError.bad_request(f"set {name} or structured_outputs, not both", "structured_outputs")
        params[name] = value
    for alias, name in _GUIDED.items():
        if body.get(alias) is not None:
            if params.get(name) is not None:
                raise APIError.bad_request(f"set {name} or {alias}, not both", alias)
            params[name] = body[alias]
    for name in ("min_tokens", "max_tokens", "max_completion_tokens"):  # the newer name wins
        if body.get(name) is not None:
            params[_RENAMED[name]] = body[name]
    if "max_new_tokens" not in params:
        # the default fills the rest of the context (chat) or is OpenAI's 16 (completions)
        room = max(1, min(tm.context_len, tm.num_slots) - len(ids))
        params["max_new_tokens"] = room if default_max is None else min(default_max, room)
    rf = body.get("response_format")
    so = body.get("structured_outputs")
    if body.get("guided_json_object") or (isinstance(so, dict) and so.get("json_object")):
        # vLLM's names of response_format json_object
        if rf is not None and rf != {"type": "json_object"}:
            raise APIError.bad_request("set response_format or guided_json_object (structured_outputs.json_object), "
                                       "not both", "guided_json_object" if body.get("guided_json_object")
                                       else "structured_outputs")
        rf = {"type": "json_object"}
    fmt = _response_format(rf)
    if fmt is not None:
        if any(params.get(k) for k in GRAMMAR_FIELDS):
            raise APIError.bad_request("response_format cannot be combined with regex, json_schema, choices, ebnf "
                                       "or structural_tag", "response_format")
        params[fmt[0]] = fmt[1]
    if tools is not None:
        overrides = tools.sampling_overrides(params.get("stop"))
        own = any(params.get(k) for k in GRAMMAR_FIELDS)
        if own and tools.choice == "auto":  # the request's own constraint wins; calls are parsed as before
            overrides.pop("structural_tag", None)
        if own and set(overrides) & set(GRAMMAR_FIELDS):
            choice = f"naming function {quoted(tools.named)}" if tools.choice == "named" else quoted(tools.choice)
            raise APIError.bad_request(f"tool_choice {choice} constrains the reply itself; it cannot be "
                                       "combined with response_format, regex, json_schema, choices, ebnf or "
                                       "structural_tag", "tool_choice")
        params.update(overrides)
    if grammar_after_reasoning is not None and any(params.get(k) for k in GRAMMAR_FIELDS):
        params["grammar_after_reasoning"] = grammar_after_reasoning
    try:
        return tm.make_req(input_ids=ids, params=params, return_logprob=return_logprob, top_logprobs_num=top,
                           logprob_start_len=0 if prompt_logprobs else None, stream=bool(body.get("stream")),
                           rid=rid)
    except APIError as e:  # report the OpenAI field name the client actually sent
        for ours, theirs in (("max_new_tokens", "max_completion_tokens" if "max_completion_tokens" in body
                              else "max_tokens"), ("min_new_tokens", "min_tokens")):
            # also where another field's message quotes it ("min_tokens must be in [0, max_tokens=2]")
            e.message = e.message.replace(f"sampling_params.{ours}", theirs).replace(ours, theirs)
            if e.param == ours:
                e.param = theirs
        e.message = e.message.replace("sampling_params.", "")
        if e.param == "input_ids":  # the prompt: what the client sent it as
            e.param = "messages" if "messages" in body else "prompt"
        _locate_grammar_error(e, body, tools)  # a grammar refused as it is read (empty, too deep, ...)
        raise


# ====================================================================== running and shaping

class Run(NamedTuple):
    """Built requests ready to run: each sample's request, the other rids /abort_request
    reaches each by, and its chunk stream (grammar errors named by the field sent)."""
    reqs: list[TokenizedGenerateReq]
    aliases: dict[str, tuple[str, ...]]
    generate: Callable[[TokenizedGenerateReq], AsyncIterator[Chunk]]


async def prepare(request: Request, state: ServerState, body: dict, base: list[TokenizedGenerateReq], chat: bool,
                  tools: ToolPlan | None = None) -> Run:
    """`base` (a request per prompt) with its n samples expanded and checked against the
    server's capacity and logprob limits; a grammar shared by several is compiled once first."""
    tm = state.tm
    # choice index = prompt * n + sample; /abort_request reaches each part by the request's
    # rid and by its prompt's ("<rid>-<i>" of a list of prompts)
    name = body.get("rid")
    reqs, aliases = [], {}
    for b in base:
        for r in tm.expand_n(b):
            reqs.append(r)
            aliases[r.rid] = tuple(dict.fromkeys(x for x in (name, b.rid) if x is not None and x != r.rid))
    tm.check_capacity(len(reqs))
    tm.check_prompt_logprobs(reqs, "logprobs")
    top = "top_logprobs" if chat else "logprobs"
    tm.check_output_logprobs(reqs, top, "max_completion_tokens" if body.get("max_completion_tokens") is not None
                             else "max_tokens", top if body.get(top) else "logprobs")
    if len(reqs) > 1 and base[0].sampling_params.has_grammar:
        # prompts and n samples share one grammar: a bad one is a 400 before any of them runs
        # (their shared prompt was prefilled first, for nothing)
        try:
            await until_done_or_disconnect(request, tm.check_grammars([(0, base[0].sampling_params)], batch=False))
        except APIError as e:
            _locate_grammar_error(e, body, tools)
            raise

    def generate(r: TokenizedGenerateReq) -> AsyncIterator[Chunk]:
        return _grammar_errors(tm.generate(r, aliases[r.rid]), body, tools)

    return Run(reqs, aliases, generate)


async def stream_items(tm: TokenizerManager, run: Run, shaper: "Shaper") -> AsyncIterator[tuple[int, Chunk]]:
    """Every sample's chunks as (choice index, chunk), in arrival order; the requests hold
    their reservation while it runs (closing it aborts those still running)."""
    with tm.reserve(run.reqs, run.aliases):
        shaper.warm_cached = await tm.warm_prefixes(run.reqs, run.aliases)
        async for item in merge_streams([run.generate(r) for r in run.reqs], merge_chunks):
            yield item


async def run_to_end(request: Request, tm: TokenizerManager, run: Run, shaper: "Shaper") -> list[Accum]:
    """Every sample's whole output (put in shaper.accs too); a client gone first aborts them."""
    async def one(r: TokenizedGenerateReq) -> Accum:
        last = None
        async for c in run.generate(r):
            last = c
        return last.acc

    async def every() -> list[Accum]:
        with tm.reserve(run.reqs, run.aliases):
            shaper.warm_cached = await tm.warm_prefixes(run.reqs, run.aliases)
            return await gather_all([one(r) for r in run.reqs])

    accs = await until_done_or_disconnect(request, every())
    for i, acc in enumerate(accs):
        shaper.accs[i] = acc
    return accs


async def _serve(request: Request, state: ServerState, body: dict, base: list[TokenizedGenerateReq],
                 chat: bool, tools: ToolPlan | None = None,
                 echoes: list[tuple[str, list[int]]] | None = None, think: bool | None = None,
                 chat_echo: str | None = None) -> Response:
    tm = state.tm
    run = await prepare(request, state, body, base, chat, tools)
    reqs = run.reqs

    # the response's id: vLLM's request_id names it as vLLM does (cmpl-{request_id}), else a fresh one
    rid = ("chatcmpl-" if chat else "cmpl-") + (body.get("request_id") or uuid.uuid4().hex)
    shaper = Shaper(tm, rid, state.model_name, chat, int(time.time()), len(reqs) // len(base), tools, echoes,
                    think)
    shaper.json_schema_dropped = reqs[0].sampling_params.json_schema_dropped
    shaper.chat_echo = chat_echo
    if body.get("stream"):
        so = body.get("stream_options") or {}
        include_usage = shaper.include_usage = so.get("include_usage") is True
        shaper.continuous_usage = include_usage and so.get("continuous_usage_stats") is True
        return await stream_or_error(request, stream_items(tm, run, shaper), shaper.render_chunk,
                                     lambda: [sse(shaper.usage_chunk())] if include_usage else [])

    accs = await run_to_end(request, tm, run, shaper)

    def reply() -> ReplyJSON:  # on a builder thread when large (http_server.off_loop_if_large)
        obj = "chat.completion" if chat else "text_completion"
        choices = [shaper.choice(i, acc) for i, acc in enumerate(accs)]
        out = {"id": rid, "object": obj, "created": shaper.created, "model": shaper.model, "choices": choices,
               "usage": shaper.usage()}
        if shaper.json_schema_dropped is not None:  # json_schema_lenient: the keywords dropped, never silently
            out["json_schema_dropped"] = shaper.json_schema_dropped
        return ReplyJSON(out)

    return await off_loop_if_large(tm, reply_entries(accs), reply)


async def _grammar_errors(chunks, body: dict, tools: ToolPlan | None):
    """`chunks`, with a grammar error named by the field the client sent (_locate_grammar_error)."""
    async with contextlib.aclosing(chunks):
        try:
            async for c in chunks:
                yield c
        except APIError as e:
            _locate_grammar_error(e, body, tools)
            raise


_COMPILE_FAILED = "grammar compilation failed: "  # how the scheduler's compile error begins


def _locate_grammar_error(e: APIError, body: dict, tools: ToolPlan | None) -> None:
    """A grammar error (its param a sampling param: json_schema, regex, ...) named by the field
    the client sent it in: response_format, a vLLM guided_* alias, or `tools` when the grammar
    is built around the tools' schemas (its paths would name that wrapper: located in them)."""
    if e.param not in GRAMMAR_FIELDS:
        return
    field = e.param
    # an error of reading the grammar starts with the sampling field's name, and a compile
    # error (the scheduler's) has it after "grammar compilation failed: ": that name becomes
    # the client's
    head = _COMPILE_FAILED if e.message.startswith(_COMPILE_FAILED) else ""
    rest = e.message[len(head):]
    own = rest.startswith(field) and rest[len(field):len(field) + 1] in ("", " ", ".", ":")
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") not in (None, "text"):
        e.param = "response_format"
        sent = "response_format.json_schema.schema" if field == "json_schema" else "response_format"
    elif (alias := next((a for a, name in _GUIDED.items() if name == field and body.get(a) is not None), None)):
        e.param = sent = alias
    elif isinstance(body.get("structured_outputs"), dict) and field in _structured(body):
        theirs = next(t for t, ours in _STRUCTURED.items() if ours == field)
        e.param, sent = "structured_outputs", f"structured_outputs.{theirs}"
    elif tools is not None and body.get(field) is None:
        rest, e.param = tools.locate(rest), _tools_field(tools)
        if own and rest[len(field):len(field) + 1] == ":":  # "json_schema: keyword ... at tools[0]...": located
            sent = e.param
        elif tools.choice == "named":
            sent = tools.where(next(i for i, t in enumerate(tools.tools) if t.name == tools.named))
        else:
            sent = f"{e.param}: the grammar of the calls, built from their parameters,"
        e.message = head + rest
    else:
        return
    if own:
        e.message = head + sent + rest[len(field):]


def _flushed_before(pending: bytes, raw: bytes, out: str) -> int:
    """How many characters of `out` (what `raw` made the incremental decoder write, `pending`
    held before it) are `pending`'s, written as replacement characters because `raw` does not
    complete them: `raw`'s own text begins after them. Prompt ids [<b'\\xf0\\x9f'>, <"Hi">]
    echo as U+FFFD then "Hi", and "Hi" begins at 1, not at 0 where its offset was."""
    if not pending:
        return 0
    flushed = pending.decode("utf-8", "replace")
    own = codecs.getincrementaldecoder("utf-8")("replace").decode(raw)
    return len(flushed) if out == flushed + own else 0


def as_function_call(call: dict) -> dict:
    """An OpenAI tool call (or its streamed piece) as the legacy `function_call`: its function's
    name (the first piece has it) and arguments, without the call's id, type and index."""
    fn = call.get("function", {})
    return {k: fn[k] for k in ("name", "arguments") if k in fn}


def _legacy_finish(finish: str | None) -> str | None:
    return "function_call" if finish == "tool_calls" else finish


class Shaper:
    """Renders results and stream chunks in OpenAI's shapes."""

    def __init__(self, tm: TokenizerManager, rid: str, model: str, chat: bool, created: int, n: int,
                 tools: ToolPlan | None = None, echoes: list[tuple[str, list[int]]] | None = None,
                 think: bool | None = None) -> None:
        self.tm, self.id, self.model, self.chat, self.created, self.n = tm, rid, model, chat, created, n
        self.tools = tools
        # reasoning split off (None: not), True when the prompt opened the <think> block
        self.think = think
        self.reasoning_streams: dict[int, ReasoningStream] = {}
        self.content_sent: dict[int, int] = {}  # per choice: characters of content streamed
        self.echoes = echoes  # completions with echo: (prompt text, prompt ids) per prompt
        self.echoed: set[int] = set()
        self.tool_streams: dict[int, ToolStream] = {}
        self.accs: dict[int, Accum] = {}
        self.warm_cached: dict[str, int] = {}  # rid -> cached prompt tokens before its warm-up (n > 1)
        self.role_sent: set[int] = set()
        self.text_offset: dict[int, tuple[int, Any]] = {}  # per choice: characters so far, their decoder
        self.include_usage = False  # stream_options.include_usage
        self.continuous_usage = False  # vLLM's stream_options.continuous_usage_stats: usage on every chunk
        self.json_schema_dropped: list | None = None  # json_schema_lenient's list, on every chunk
        self.chat_echo: str | None = None  # chat with vLLM's echo: the text each reply starts with

    def _tok(self, tid: int) -> str:
        """A token's text in logprobs: its own bytes as text, or, for a piece of a character,
        OpenAI's "bytes:\\xe6\\x97" (decoding it alone gave U+FFFD, the same for every piece)."""
        raw = self.tm.token_bytes(tid)
        if raw is None:  # a special token (or no tokenizer)
            return self.tm.tokenizer.decode([tid]) if self.tm.tokenizer is not None else str(tid)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def logprobs(self, i: int, ids: list[int], lps: list[float], tops: list) -> dict | None:
        if not lps:
            return None
        if self.chat:
            def entry(tid: int, lp: float) -> dict:
                s, raw = self._tok(tid), self.tm.token_bytes(tid)
                return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8") if raw is None else raw)}
            return {"content": [{**entry(t, lp), "top_logprobs": [entry(tt, tlp) for tlp, tt in (tops[k] if k < len(tops) else [])]}
                                for k, (t, lp) in enumerate(zip(ids, lps))]}
        toks = [self._tok(t) for t in ids]
        # where each token's text begins, in characters: the pieces of a character all begin
        # where it does (an incremental decoder counts whole characters)
        off, dec = self.text_offset.get(i) or (0, codecs.getincrementaldecoder("utf-8")("replace"))
        offsets = []
        for t, s in zip(ids, toks):
            raw = self.tm.token_bytes(t)
            raw = s.encode("utf-8") if raw is None else raw
            pending = dec.getstate()[0]  # an earlier token's bytes of a character not yet whole
            out = dec.decode(raw)
            offsets.append(off + _flushed_before(pending, raw, out))
            off += len(out)
        self.text_offset[i] = (off, dec)
        # each step's top tokens and the chosen one (OpenAI: up to logprobs + 1 entries, vLLM
        # too), even at logprobs=0; an echoed prompt's first token has no score
        return {"tokens": toks, "token_logprobs": list(lps), "text_offset": offsets,
                "top_logprobs": [None if lps[k] is None else
                                 {**{self._tok(tt): tlp for tlp, tt in (tops[k] if k < len(tops) else [])},
                                  toks[k]: lps[k]}
                                 for k in range(len(ids))]}

    def with_echo(self, i: int, acc: Accum, text: str, ids: list[int], lps: list, tops: list) -> tuple:
        """Choice i's output piece with its prompt in front, the first time (completions with
        echo): the prompt text, and the scored prompt tokens when logprobs are on."""
        if self.echoes is None or i in self.echoed:
            return text, ids, lps, tops
        self.echoed.add(i)
        prompt, prompt_ids = self.echoes[i // self.n]
        if acc.input_logprobs is None:
            return prompt + text, ids, lps, tops
        # a request aborted while its prompt was scored in chunks (prompt logprobs are
        # prefilled 256 positions a step) has scores for the first positions only: the rest
        # have none (None, as the first token's), so that each prompt token keeps its own
        # (an IndexError past the scored ones was a 500)
        missing = max(0, len(prompt_ids) - len(acc.input_logprobs))
        scored = list(acc.input_logprobs) + [None] * missing
        scored_tops = list(acc.input_tops or ()) + [None] * (len(scored) - len(acc.input_tops or ()))
        return (prompt + text, prompt_ids + ids, scored + lps,
                scored_tops + tops if tops or any(scored_tops) else tops)

    def choice(self, i: int, acc: Accum) -> dict:
        fin = acc.last.finished
        text, ids, lps, tops = self.with_echo(i, acc, acc.text, acc.ids, acc.logprobs, acc.tops)
        lp = self.logprobs(i, ids, lps, tops)
        c: dict[str, Any] = {"index": i, "logprobs": lp, "finish_reason": finish_reason(fin),
                             "matched_stop": matched_stop(fin)}
        if self.chat:
            reasoning, answer = (None, acc.text) if self.think is None else reasoning_split(acc.text, self.think)
            c["message"] = {"role": "assistant", "content": answer}
            if reasoning is not None:
                c["message"]["reasoning_content"] = reasoning
            if self.tools is not None:
                reply = self.tools.parse(answer, finish_reason(fin))
                c["finish_reason"] = reply.finish_reason
                c["message"]["content"] = reply.content
                if reply.calls and self.tools.legacy:  # the legacy reply: one function_call
                    c["message"]["function_call"] = as_function_call(reply.calls[0].as_openai())
                    c["finish_reason"] = _legacy_finish(c["finish_reason"])
                elif reply.calls:
                    c["message"]["tool_calls"] = [call.as_openai() for call in reply.calls]
            if self.chat_echo is not None:
                c["message"]["content"] = self.chat_echo + (c["message"]["content"] or "")
        else:
            c["text"] = text
        return c

    def usage(self) -> dict:
        # the prompt is counted once per prompt, not once per sample of it
        firsts = [self.accs[i].last for i in sorted(self.accs) if i % self.n == 0]
        prompt = sum(o.prompt_tokens for o in firsts)
        completion = sum(a.last.completion_tokens for a in self.accs.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                # what the cache held before this request: n samples first prefill their prompt once
                "prompt_tokens_details": {"cached_tokens": sum(self.warm_cached.get(o.rid, o.cached_tokens)
                                                               for o in firsts)}}

    def usage_chunk(self) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [],
                "usage": self.usage()}

    def chat_delta(self, i: int, ch: Chunk, c: dict) -> dict:
        """Choice i's delta: reasoning (when split off), then tool calls or content from the
        answer; may set c["finish_reason"] (tool calls)."""
        delta: dict[str, Any] = {}
        answer = ch.acc.text
        if self.think is not None:
            rs = self.reasoning_streams.setdefault(i, ReasoningStream(self.think))
            new, answer = rs.feed(ch.acc.text, final=ch.finished)
            if new:
                delta["reasoning_content"] = new
        if self.tools is not None:
            ts = self.tool_streams.setdefault(i, self.tools.streamer())
            if ch.finished:
                more, c["finish_reason"] = ts.finish(answer, c["finish_reason"])
            else:
                more = ts.feed(answer)
            if self.tools.legacy:  # the legacy delta: function_call's name, then its arguments
                c["finish_reason"] = _legacy_finish(c["finish_reason"])
                calls = more.pop("tool_calls", None)
                if calls:  # one call a reply (legacy_plan)
                    more["function_call"] = as_function_call(calls[0])
            return {**delta, **more}
        sent = self.content_sent.get(i, 0)
        if len(answer) > sent:
            delta["content"], self.content_sent[i] = answer[sent:], len(answer)
        return delta

    def render_chunk(self, item: tuple[int, Chunk]) -> list[str]:
        i, ch = item
        self.accs[i] = ch.acc
        out: list[str] = []
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        head = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.include_usage:  # as OpenAI's: null on every chunk but the last, which has the usage
            head["usage"] = self.usage() if self.continuous_usage else None  # vLLM's: the usage so far
        if self.json_schema_dropped is not None:
            head["json_schema_dropped"] = self.json_schema_dropped
        if self.chat and i not in self.role_sent:
            self.role_sent.add(i)
            # a reply that is only tool calls (a named or required tool_choice) has null content,
            # as OpenAI's first chunk says; streamed, it added up to "" (unstreamed: null)
            content = None if self.tools is not None and self.tools.choice != "auto" else ""
            if self.chat_echo is not None:  # vLLM's echo: it comes first, as the unstreamed reply has it
                content = self.chat_echo
            out.append(sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": content},
                                                 "logprobs": None, "finish_reason": None}]}))
        text, ids, lps, tops = self.with_echo(i, ch.acc, ch.text, ch.ids, ch.logprobs, ch.top_logprobs)
        if not text and not ch.finished and not lps:
            return out
        fin = ch.acc.last.finished if ch.finished else None
        c: dict[str, Any] = {"index": i, "logprobs": self.logprobs(i, ids, lps, tops),
                             "finish_reason": finish_reason(fin)}
        if ch.finished:
            c["matched_stop"] = matched_stop(fin)
        if self.chat:
            c["delta"] = self.chat_delta(i, ch, c)
            if not c["delta"] and not ch.finished and not ch.logprobs:
                return out
            several = len(c["delta"].get("tool_calls") or ()) > 1  # ("required" calls closed in one chunk)
            if (ch.finished or several) and (c["delta"].get("tool_calls") or c["delta"].get("function_call")):
                # calls, then the finish in a chunk of its own with an empty delta, as OpenAI
                # sends them: the openai client's stream helper ends a call (its
                # tool_calls.function.arguments.done event) on a later chunk, so a call that
                # came with the finish_reason never ended there
                calls = {k: v for k, v in c.items() if k != "matched_stop"}
                # one call a chunk, as OpenAI and SGLang stream them (SGLang's function-calling doc
                # reads delta.tool_calls[0] only: a second call in the same delta was lost)
                for j, item in enumerate(calls["delta"].get("tool_calls") or [None]):
                    d = {**calls["delta"], "tool_calls": [item]} if j == 0 and item else {"tool_calls": [item]}
                    out.append(sse({**head, "choices": [{**calls, "delta": d if item else calls["delta"],
                                                         "logprobs": calls["logprobs"] if j == 0 else None,
                                                         "finish_reason": None}]}))
                if not ch.finished:
                    return out
                c = {**c, "logprobs": None, "delta": {}}
        else:
            c["text"] = text
        out.append(sse({**head, "choices": [c]}))
        return out
