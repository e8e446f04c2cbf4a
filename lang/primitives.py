"""The DSL's building blocks: gen, select and the role expressions."""
from __future__ import annotations

from typing import Any

from treadle.lang import ir
from treadle.lang.backend import CHOICE_METHODS
# SGLang's names for select's choices_method values, re-exported (treadle.lang.choices has them)
from treadle.lang.choices import (ChoicesSamplingMethod, greedy_token_selection, token_length_normalized,
                                  unconditional_likelihood_normalized)
from treadle.lang.interpreter import DTYPE_REGEX
from treadle.runtime.sampling_params import schema_of


_DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str}


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
        n: int | None = None, stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None, stop_regex: str | list[str] | None = None,
        temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
        min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, ignore_eos: bool | None = None,
        return_logprob: bool | None = None, logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None, return_text_in_logprobs: bool | None = None,
        dtype: type | str | None = None, choices: list[str] | None = None, choices_method: Any = None,
        regex: str | None = None, json_schema: str | dict | type | None = None, *,
        repetition_penalty: float | None = None, seed: int | None = None, ebnf: str | None = None) -> ir.Gen | ir.Select:
    """Generate text into variable `name` (readable as `s[name]`).

    Unset arguments fall back to the run() defaults, then to the runtime's. `regex`,
    `json_schema` (a dict, its JSON text, or a Pydantic model class) and `ebnf` (a grammar
    whose rule `root` is the output) constrain the output (enforced by the runtime); `dtype`
    (int, float, bool or str, or their names) constrains it to a literal of that type and, as
    SGLang, stores its text: '24', 'True', '"Paris"' (a string keeps its JSON quotes); a number
    ends at a space or newline (REGEX_INT / REGEX_FLOAT, with " " and "\\n" as stop strings),
    and text that does not parse (cut by max_tokens) is a ValueError. `n` > 1 makes the variable
    the list of n samples on sgl.OpenAI (as SGLang's), and is refused when it runs on other
    backends; `stop_regex` (none only) is SGLang's, refused otherwise.
    With `choices` it is `select(name, choices, temperature, choices_method)`, as in
    SGLang: every choice is scored and the best one taken (for a grammar over the choices,
    decoded token by token, use `regex`). `return_logprob` (with `logprob_start_len`,
    `top_logprobs_num`, `return_text_in_logprobs`) puts the logprobs in
    `s.get_meta_info(name)`, as the runtime's meta_info has them. The parameters are SGLang's, in
    its order, so a positional call means what it means there (`gen("x", 16, None, None, "\\n")`
    stops at a newline); treadle's own (`repetition_penalty`, `seed`, `ebnf`) are keyword-only."""
    _check_name("gen", name)
    # n > 1: several samples, which only sgl.OpenAI makes (the interpreter refuses it on others)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"gen({name!r}): n={n!r}: the number of samples is a positive int")
    check_n_and_stop_regex(f"gen({name!r})", None, stop_regex)
    if choices is not None:
        if regex is not None or json_schema is not None or ebnf is not None or dtype is not None:
            raise ValueError(f"gen({name!r}): choices cannot be combined with regex/json_schema/ebnf/dtype")
        return select(name, choices, 0.0 if temperature is None else temperature,
                      token_length_normalized if choices_method is None else choices_method)
    if isinstance(dtype, str):
        dtype = _DTYPE_NAMES.get(dtype, dtype)
    if dtype is not None and dtype not in DTYPE_REGEX:
        raise ValueError(f"gen({name!r}): dtype must be one of int, float, bool, str; got {dtype!r}")
    if isinstance(stop, str):
        stop = [stop]
    elif isinstance(stop, tuple):  # SGLang's default is (), and its JSON makes any tuple a list
        stop = list(stop)
    if isinstance(stop_token_ids, tuple):
        stop_token_ids = list(stop_token_ids)
    if regex is not None:
        _check_regex(name, regex)
    json_schema = schema_of(json_schema)  # a Pydantic model class: its schema
    params = {"max_tokens": max_tokens, "min_new_tokens": min_tokens, "stop": stop, "stop_token_ids": stop_token_ids,
              "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
              "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
              "repetition_penalty": repetition_penalty, "ignore_eos": ignore_eos, "seed": seed,
              "regex": regex, "json_schema": json_schema, "ebnf": ebnf, "n": n if n != 1 else None}
    logprob = {"return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
               "top_logprobs_num": top_logprobs_num, "return_text_in_logprobs": return_text_in_logprobs}
    return ir.Gen(name, {k: v for k, v in params.items() if v is not None}, dtype,
                  {k: v for k, v in logprob.items() if v is not None})


def gen_int(name: str | None = None, max_tokens: int | None = None, n: int | None = None,
            stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
            stop_regex: str | list[str] | None = None, temperature: float | None = None,
            top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
            frequency_penalty: float | None = None, presence_penalty: float | None = None,
            ignore_eos: bool | None = None, return_logprob: bool | None = None,
            logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
            return_text_in_logprobs: bool | None = None, **kwargs: Any) -> ir.Gen:
    """gen(..., dtype=int): an integer's text ('24'), ended by a space or newline. The
    parameters are SGLang's gen_int's, in its order (`gen_int("n", 8)` is max_tokens=8); other
    gen keywords may follow by name."""
    return gen(name, max_tokens, None, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
               frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
               top_logprobs_num, return_text_in_logprobs, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, n: int | None = None,
               stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
               stop_regex: str | list[str] | None = None, temperature: float | None = None,
               top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
               frequency_penalty: float | None = None, presence_penalty: float | None = None,
               ignore_eos: bool | None = None, return_logprob: bool | None = None,
               logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
               return_text_in_logprobs: bool | None = None, **kwargs: Any) -> ir.Gen:
    """gen(..., dtype=str): a JSON string literal, stored with its quotes ('"Paris"'), as SGLang;
    json.loads(s[name]) gives the string. The parameters are SGLang's gen_string's, in its order."""
    return gen(name, max_tokens, None, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
               frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
               top_logprobs_num, return_text_in_logprobs, dtype=str, **kwargs)


def build_regex_from_object(object: Any, whitespace_pattern: str | None = None) -> str:
    """SGLang's helper (sglang.srt.constrained): the regex of the JSON texts a schema allows, for
    `gen(regex=...)`. `object` is a Pydantic model class, a schema dict or its JSON text;
    `whitespace_pattern` is the regex allowed between JSON tokens (None: at most one space,
    `[ ]?`, as SGLang's, whose outlines helper puts that there: `{"n": 1}` and `{"n":1}` both
    match). Written by treadle's own JSON Schema compiler (gen(json_schema=...) takes the schema
    directly, and is the better way: it has no regex size limits)."""
    from treadle.constrained.schema.json_schema import json_schema_to_regex

    schema = schema_of(object)
    return json_schema_to_regex(schema, whitespace_pattern=r"[ ]?" if whitespace_pattern is None else whitespace_pattern)


def image(expr: Any) -> ir.Expr:
    """SGLang's image input (`expr`: a path, URL or bytes). treadle serves text-only models:
    always a ValueError."""
    raise ValueError(f"image({expr!r}): treadle serves text-only models, so a program cannot add an image; "
                     "describe it in text, or run this program on SGLang with a vision model")


def video(path: Any, num_frames: int = 0) -> ir.Expr:
    """SGLang's video input. treadle serves text-only models: always a ValueError."""
    raise ValueError(f"video({path!r}): treadle serves text-only models, so a program cannot add a video; "
                     "run this program on SGLang with a vision model")


def check_n_and_stop_regex(where: str, n: Any, stop_regex: Any) -> None:
    """SGLang's `n` and `stop_regex`: here a gen makes one sample and stops at strings only."""
    if n is not None and n != 1:
        raise ValueError(f"{where}: n={n!r}: a gen makes one sample here; for several, use s.fork(n) and a gen "
                         "in each branch")
    if stop_regex:
        raise ValueError(f"{where}: stop_regex is not supported; use stop strings (stop=[...]) or a regex "
                         "constraint (regex=...)")


def select(name: str | None = None, choices: list[str] | None = None, temperature: float = 0.0,
           choices_method: Any = token_length_normalized) -> ir.Select:
    """Append the choice the model scores highest after the current text, into `name`.

    All choices are scored in one batched request from the prompt logprobs of
    `text + choice`; `choices_method` is "token_length_normalized" (mean logprob, default),
    "sum", "greedy_token", or "unconditional_likelihood_normalized" (the mean gain of each
    token's logprob over the choice scored alone: one more batched request), or a
    ChoicesSamplingMethod (treadle.lang.choices) of the program's own, called with the scores.
    The pick is the best score: `temperature` is 0, as in SGLang's runtime backend."""
    _check_name("select", name)
    if temperature != 0:
        raise ValueError(f"select({name!r}) takes the best-scored choice: temperature must be 0, got {temperature!r}")
    # a list or tuple, or any other sequence of them (a numpy array of strings, as SGLang takes one)
    if isinstance(choices, (list, tuple)) or (choices is not None and not isinstance(choices, (str, bytes, dict))
                                              and hasattr(choices, "__len__") and hasattr(choices, "__iter__")):
        choices = list(choices)
    if not choices or not isinstance(choices, list) or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"select({name!r}) needs a non-empty list of non-empty strings, got {choices!r}")
    if choices_method not in CHOICE_METHODS and not isinstance(choices_method, ChoicesSamplingMethod):
        raise ValueError(f"select({name!r}): unknown choices_method {choices_method!r}; "
                         f"use one of {', '.join(CHOICE_METHODS)} or a ChoicesSamplingMethod")
    return ir.Select(name, [str(c) for c in choices], choices_method)


def system(expr: Any = None) -> ir.Role:
    """A system message: `s += system("You are ...")` (`expr`: text or DSL expressions, SGLang's
    parameter name; None, its default, is an empty message, as SGLang's)."""
    return ir.Role("system", [ir.to_expr("" if expr is None else expr)])


def user(expr: Any = None) -> ir.Role:
    """A user message: `s += user("Hi")`. None (SGLang's default) is an empty message."""
    return ir.Role("user", [ir.to_expr("" if expr is None else expr)])


def assistant(expr: Any = None) -> ir.Role:
    """An assistant message: `s += assistant(gen("answer", max_tokens=32))`. None (SGLang's
    default) is an empty message."""
    return ir.Role("assistant", [ir.to_expr("" if expr is None else expr)])


def system_begin() -> ir.RoleBegin:
    """`s += system_begin()`; ... `s += system_end()` (SGLang's form of `with s.system():`)."""
    return ir.RoleBegin("system")


def system_end() -> ir.RoleEnd:
    return ir.RoleEnd("system")


def user_begin() -> ir.RoleBegin:
    return ir.RoleBegin("user")


def user_end() -> ir.RoleEnd:
    return ir.RoleEnd("user")


def assistant_begin() -> ir.RoleBegin:
    return ir.RoleBegin("assistant")


def assistant_end() -> ir.RoleEnd:
    return ir.RoleEnd("assistant")


def _check_name(what: str, name: Any) -> None:
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{what}(): the variable name must be a string, got {name!r}")


def _check_regex(name: str | None, regex: str) -> None:
    """Reject a regex outside the runtime's dialect (constrained/regex/regex_text.py) here, at the
    gen() call, naming the variable."""
    from treadle.constrained.regex.regex_text import translate_regex

    try:
        translate_regex(regex)
    except ValueError as e:
        raise ValueError(f"gen({name!r}): invalid regex {regex!r}: {e}") from e
