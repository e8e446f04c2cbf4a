"""OpenAI: SGLang's API backend (`sgl.OpenAI("gpt-4o-mini")`), on the real `openai` client.

It runs a program against any OpenAI-compatible server: OpenAI's own, or a treadle (or vLLM,
SGLang) server through the client's `base_url` (or the `OPENAI_BASE_URL` variable):

    sgl.set_default_backend(sgl.OpenAI("default", base_url="http://127.0.0.1:30000/v1", api_key="none"))

As SGLang's, a chat model (the default; `is_chat_model=False` or the model
`gpt-3.5-turbo-instruct` for a completion model) is sent the program's messages: each gen must
be the first thing of an assistant message (`sgl.assistant(sgl.gen("answer"))`), and the
messages before it are the request's. A completion model is sent the program's text (roles
rendered with `chat_template`: unless set, SGLang's "chatgpt" (roles add no text) for OpenAI's
model names, else the one SGLang's registry gives the model name).
A gen without max_tokens asks for 128, as SGLang's.

Where it differs from SGLang's (docs/porting-from-sglang.md has the list):
- constraints are not dropped with a warning: `regex` (and `dtype`'s regex) and `ebnf` go in
  the request's body as treadle's / SGLang's server fields, `json_schema` as a chat request's
  `response_format` (a completion request's `json_schema` field); a server that does not take
  them refuses the request, a ValueError naming it.
- `select` on a completion model scores each choice from the prompt logprobs the server
  returns with `echo=True, logprobs=0, max_tokens=0` (treadle's and vLLM's servers do), with
  the same `choices_method`s as the other backends but `unconditional_likelihood_normalized`
  (which needs each choice scored after a BOS token; no text stands in for one). SGLang's
  backend walks the choices with `logit_bias` and a tiktoken tokenizer, which fits OpenAI's
  models only. On a chat model select is a ValueError, as SGLang's NotImplementedError.
- speculative execution (`@function(num_api_spec_tokens=...)`) is done by the interpreter, as
  SGLang's: an assistant message's text and gens are held, sent as one request at the message's
  end, and the reply split into the gens (interpreter.StreamExecutor._spec_generate).
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from treadle.lang.backend import Backend, ChoiceScores
from treadle.lang.chat_template import ChatTemplate, get_chat_template, get_chat_template_by_model_path

# SGLang's list of completion (not chat) models among OpenAI's
INSTRUCT_MODEL_NAMES = ["gpt-3.5-turbo-instruct"]
# SGLang's default max_new_tokens of a gen, which its OpenAI backend always sends
DEFAULT_MAX_TOKENS = 128
# sampling params with an OpenAI name of their own: runtime name -> OpenAI's
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "stop": "stop", "temperature": "temperature", "top_p": "top_p",
                 "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty", "seed": "seed"}
# the rest go in the body under the names treadle's (and SGLang's) OpenAI server takes them
_EXTRA_NAMES = {"min_new_tokens": "min_tokens", "top_k": "top_k", "min_p": "min_p",
                "repetition_penalty": "repetition_penalty", "ignore_eos": "ignore_eos",
                "stop_token_ids": "stop_token_ids", "regex": "regex", "ebnf": "ebnf", "json_schema": "json_schema",
                "skip_special_tokens": "skip_special_tokens",
                "spaces_between_special_tokens": "spaces_between_special_tokens"}


@dataclass
class TokenUsage:
    """SGLang's `backend.token_usage`: the tokens this backend's requests used, from each reply's `usage`."""

    prompt_tokens: int
    completion_tokens: int

    def reset(self) -> None:
        self.prompt_tokens = self.completion_tokens = 0


class OpenAI(Backend):
    """SGLang's OpenAI backend, in its signature: `model_name`, `is_chat_model` (None: all but
    `gpt-3.5-turbo-instruct` are), `chat_template` (None: "chatgpt" for `gpt-...` / `o1...`
    names, else `get_chat_template_by_model_path`),
    `is_azure` (the client is `openai.AzureOpenAI`), and the client's own arguments (`api_key`,
    `base_url`, `timeout`, `max_retries`, ...; the client reads `OPENAI_API_KEY` and
    `OPENAI_BASE_URL` when they are not given). A client that cannot be made (no API key) is a
    ValueError saying how to give one."""

    def __init__(self, model_name: str, is_chat_model: bool | None = None, chat_template: ChatTemplate | None = None,
                 is_azure: bool = False, *args: Any, **kwargs: Any) -> None:
        import openai

        if not isinstance(model_name, str) or not model_name:
            raise ValueError(f"sgl.OpenAI(model_name): the model's name, as the server knows it; got {model_name!r}")
        try:
            self.client = (openai.AzureOpenAI if is_azure else openai.OpenAI)(*args, **kwargs)
        except openai.OpenAIError as e:
            raise ValueError(f"sgl.OpenAI({model_name!r}): {e}. For another OpenAI-compatible server (a treadle "
                             "server: `python -m treadle.launch_server`), pass base_url='http://HOST:PORT/v1' "
                             "and any api_key (or set OPENAI_BASE_URL and OPENAI_API_KEY)") from e
        self.model_name = model_name
        self.is_chat_model = model_name not in INSTRUCT_MODEL_NAMES if is_chat_model is None else bool(is_chat_model)
        if chat_template is None:  # OpenAI's own models: SGLang's "chatgpt" (roles add no text)
            chat_template = get_chat_template("chatgpt") if re.match(r"(gpt-|chatgpt|o[1-9](-|$))", model_name) \
                else get_chat_template_by_model_path(model_name)
        self.chat_template = chat_template
        self.chat_prefix = self.chat_template.role_prefix_and_suffix["assistant"][0]
        self.token_usage = TokenUsage(0, 0)
        self._usage_lock = threading.Lock()  # run_batch's threads add to token_usage at once

    def __repr__(self) -> str:
        return f"OpenAI({self.model_name!r}, base_url={str(self.client.base_url)!r}, is_chat_model={self.is_chat_model})"

    def template_stop_strs(self) -> list[str]:
        """A chat model ends its message itself; a completion model stops at the template's strings."""
        return [] if self.is_chat_model else super().template_stop_strs()

    def flush_cache(self) -> bool:
        """An API has no cache to flush: False (`sgl.flush_cache()` on it goes on, as SGLang's)."""
        return False

    def get_server_info(self) -> None:
        """None, as SGLang's API backends (an OpenAI API reports no server arguments)."""
        return None

    def shutdown(self) -> None:
        """Close the client's connections (the server keeps running)."""
        self.client.close()

    # ------------------------------------------------------------ requests

    def _kwargs(self, params: dict, logprob: dict | None) -> dict:
        """The OpenAI request fields of runtime sampling `params` and logprob options."""
        kw: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        # SGLang's gen asks for 128 tokens when max_tokens is not given; an OpenAI API without
        # max_tokens would write until the context is full
        params = {"max_new_tokens": DEFAULT_MAX_TOKENS, **params}
        for k, v in params.items():
            if v is None:
                continue
            if k in _OPENAI_NAMES:
                kw[_OPENAI_NAMES[k]] = v
            elif k in _EXTRA_NAMES:
                extra[_EXTRA_NAMES[k]] = v
            else:
                raise ValueError(f"sgl.OpenAI cannot send the sampling parameter {k}={v!r} to an OpenAI API")
        if "json_schema" in extra and self.is_chat_model:  # OpenAI's own field for it
            schema = extra.pop("json_schema")
            schema = json.loads(schema) if isinstance(schema, str) else schema
            kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        if "max_tokens" in kw and self.model_name.startswith(("o1", "o3", "o4", "gpt-5")):
            kw["max_completion_tokens"] = kw.pop("max_tokens")  # OpenAI's reasoning models take only this name
        logprob = {k: v for k, v in (logprob or {}).items() if v is not None}
        if logprob.get("return_logprob"):
            if logprob.get("logprob_start_len", -1) not in (-1, None):
                raise ValueError("sgl.OpenAI returns the logprobs of the output only: logprob_start_len must be unset")
            top = int(logprob.get("top_logprobs_num") or 0)
            if self.is_chat_model:
                kw.update(logprobs=True, top_logprobs=top)
            else:
                kw["logprobs"] = top
        if extra:
            kw["extra_body"] = extra
        return kw

    def _call(self, what: str, **kw: Any) -> Any:
        """One API call; the client's errors as treadle's: a request the server refuses (4xx) is a
        ValueError with its message, an unreachable server a ConnectionError, a 5xx a RuntimeError."""
        import openai

        api = self.client.chat.completions if what == "chat" else self.client.completions
        try:
            return api.create(model=self.model_name, **kw)
        except openai.APIConnectionError as e:
            raise ConnectionError(f"cannot reach the OpenAI API at {self.client.base_url}: {e}") from e
        except openai.APIStatusError as e:
            err = ValueError if e.status_code < 500 else RuntimeError
            raise err(f"the OpenAI API at {self.client.base_url} refused the request (HTTP {e.status_code}): "
                      f"{_message(e)}") from e

    def _prompt(self, prompt: Any) -> dict:
        if self.is_chat_model:
            if not isinstance(prompt, list):
                raise ValueError(self._not_after_assistant())
            return {"messages": prompt}
        return {"prompt": prompt}

    def _not_after_assistant(self) -> str:
        return (f"{self.model_name!r} is a chat model (sgl.OpenAI(..., is_chat_model=True)): each gen must be the "
                "first thing of an assistant message, sgl.assistant(sgl.gen(...)), so that the messages before "
                "it are the request; with @function(num_api_spec_tokens=...) (SGLang's speculative execution) "
                "gens may be anywhere in an assistant message. For a completion model pass is_chat_model=False")

    def _count(self, usage: Any) -> dict:
        if usage is None:
            return {}
        with self._usage_lock:
            self.token_usage.prompt_tokens += usage.prompt_tokens or 0
            self.token_usage.completion_tokens += usage.completion_tokens or 0
        return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}

    supports_n = True  # gen(n=k) asks the API for k samples (SGLang's openai_example_n)
    speculates_text = True  # num_api_spec_tokens on a completion model: the interpreter's _spec_text_gen

    def generate(self, text: Any, params: dict, logprob: dict | None = None) -> tuple[Any, dict]:
        """`text` is the program's text for a completion model, and the list of messages before
        the gen for a chat model (the interpreter sends that when `is_chat_model`). With
        params["n"] = k > 1 the output is the list of the k samples, as SGLang's."""
        n = params.get("n", 1)
        kw = self._kwargs({k: v for k, v in params.items() if k != "n"}, logprob)
        if n != 1:
            kw["n"] = n
        ret = self._call("chat" if self.is_chat_model else "completion", **self._prompt(text), **kw)
        choices = sorted(ret.choices, key=lambda c: c.index)
        outs = [(c.message.content or "") if self.is_chat_model else c.text for c in choices]
        meta = {"id": ret.id, **self._count(ret.usage), "finish_reason": _finish(choices[0])}
        if kw.get("logprobs") not in (None, False):
            meta.update(_logprob_meta(choices[0].logprobs, self.is_chat_model))
        return (outs if n != 1 else outs[0]), meta

    def generate_stream(self, text: Any, params: dict, logprob: dict | None = None) -> Iterator[tuple[str, dict]]:
        if params.get("n", 1) != 1:
            raise ValueError("sgl.OpenAI streams one sample a gen (n=1)")
        kw = self._kwargs({k: v for k, v in params.items() if k != "n"}, logprob)
        stream = self._call("chat" if self.is_chat_model else "completion", **self._prompt(text), stream=True, **kw)
        meta: dict[str, Any] = {}
        with stream:
            for chunk in stream:
                meta = {**meta, "id": chunk.id, **self._count(getattr(chunk, "usage", None))}
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                delta = (choice.delta.content or "") if self.is_chat_model else (choice.text or "")
                if choice.finish_reason is not None:
                    meta["finish_reason"] = _finish(choice)
                if delta or choice.finish_reason is not None:
                    yield delta, dict(meta)

    # ------------------------------------------------------------ select

    def select(self, text: str, choices: list[str], method: Any = "token_length_normalized") -> tuple[str, dict]:
        if self.is_chat_model:
            raise ValueError(f"select / gen(choices=...) needs a completion model: {self.model_name!r} is a chat "
                             "model, whose API returns no logprobs of given text (SGLang's OpenAI backend refuses "
                             "it too); pass is_chat_model=False for a model served on /v1/completions")
        return super().select(text, choices, method)

    def choice_logprobs(self, text: str, choices: list[str]) -> ChoiceScores:
        """Each `text + choice` sent in one completions request with echo=True, logprobs=0 and
        max_tokens=0: the prompt's tokens come back with their logprobs and character offsets.
        A choice's tokens start at the token holding the text's end (a token that spans the
        boundary, "is" + " Paris" written as "is", " Paris", counts for the choice)."""
        ret = self._call("completion", prompt=[text + c for c in choices], echo=True, logprobs=0, max_tokens=0,
                         temperature=0)
        self._count(ret.usage)
        by_index = sorted(ret.choices, key=lambda c: c.index)
        if len(by_index) != len(choices):
            raise ValueError(f"the server at {self.client.base_url} answered {len(by_index)} choices for "
                             f"{len(choices)} prompts")
        entries = []
        for c, choice in zip(by_index, choices):
            lp = c.logprobs
            if lp is None or not lp.tokens or lp.text_offset is None:
                raise ValueError(f"the server at {self.client.base_url} returned no prompt logprobs with echo=True: "
                                 "select needs a server that scores the prompt (treadle's, vLLM's)")
            first = max(i for i, off in enumerate(lp.text_offset) if off <= len(text))
            if lp.token_logprobs[first] is None:
                raise ValueError("select cannot score a choice's first token with no text before it over the "
                                 "OpenAI API; put some text before the select")
            entries.append([[float(lp.token_logprobs[i]), None, lp.tokens[i]] for i in range(first, len(lp.tokens))])
        meta = {"prompt_tokens": ret.usage.prompt_tokens if ret.usage else None, "completion_tokens": 0,
                "finish_reason": None}
        return ChoiceScores([[e[0] for e in es] for es in entries], meta, [[] for _ in choices], entries,
                            [[] for _ in choices])

    def unconditional_logprobs(self, token_ids: list[list[int]]) -> list[list[list]]:
        raise ValueError("sgl.OpenAI cannot use unconditional_likelihood_normalized: it scores each choice after a "
                         "BOS token alone, which an OpenAI API request cannot send; use token_length_normalized or "
                         "greedy_token_selection")


def _message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(e)


def _finish(choice: Any) -> dict | None:
    """SGLang's finish_reason shape ({"type": "stop" | "length", "matched": ...}) from an OpenAI choice."""
    if choice.finish_reason is None:
        return None
    out: dict[str, Any] = {"type": choice.finish_reason}
    matched = (getattr(choice, "model_extra", None) or {}).get("matched_stop")  # treadle's and SGLang's servers
    if matched is not None:
        out["matched"] = matched
    return out


def _logprob_meta(lp: Any, chat: bool) -> dict:
    """The output's logprobs as the runtime's meta_info has them: `output_token_logprobs`
    (logprob, token id, token text) per token, the id None (the API gives text only), and
    `output_top_logprobs` per token."""
    if lp is None:
        return {"output_token_logprobs": [], "output_top_logprobs": []}
    if chat:
        items = lp.content or []
        toks = [(t.logprob, None, t.token) for t in items]
        tops = [[(a.logprob, None, a.token) for a in (t.top_logprobs or [])] for t in items]
    else:
        toks = [(l, None, t) for l, t in zip(lp.token_logprobs or [], lp.tokens or [])]
        tops = [[(v, None, k) for k, v in (d or {}).items()] for d in (lp.top_logprobs or [])]
    return {"output_token_logprobs": toks, "output_top_logprobs": tops}
