"""The small interface every backend implements, and choice scoring for `select`.

A backend turns prompt text into results; it knows nothing of program states:

- `chat_template`      role begin/end strings for this model
- `cache_prefix(text)` compute and cache a prompt without generating (before a fork or
                       a batch, so the branches hit the radix cache)
- `generate(text, params)` / `generate_stream(...)` one generation call
- `encode(texts)` / `context_token()` / `prompt_logprobs(ids, start)` token ids, and the
                       prompt logprobs of a batch of token sequences (max_new_tokens=0);
                       `choice_logprobs` scores `select`'s choices with them, here, the same
                       way for every backend

`Backend` is also SGLang's `BaseBackend` (sglang.lang.backend.base_backend): `BaseBackend()`
makes one that generates nothing, whose chat template is SGLang's "default" until set
(`backend.chat_template = get_chat_template("llama-2-chat")`), for tracing a program with roles.
"""
from __future__ import annotations

import math
import sys
import threading
from typing import Any, Iterator, NamedTuple

from treadle.lang.chat_template import ChatTemplate, get_chat_template

# a package path for SGLang's module paths under sglang.lang.backend (runtime_endpoint,
# base_backend, openai, ...), which treadle/__init__.py's finder gives; nothing else is found here
__path__: list[str] = []

CHOICE_METHODS = ("token_length_normalized", "greedy_token", "sum", "unconditional_likelihood_normalized")


class ChoiceScores(NamedTuple):
    """Per choice, the logprobs of the tokens that spell it; plus the request's meta."""

    token_logprobs: list[list[float]]
    meta: dict[str, Any]
    token_ids: list[list[int]]  # the tokens scored, as they follow the text
    # per choice, SGLang's (logprob, token id, token text) entries of those tokens, and the
    # (empty) output_token_logprobs of each choice's request
    entries: list[list[Any]] | None = None
    outputs: list[list[Any]] | None = None


class Backend:
    """What the interpreter needs from a serving runtime. Each runtime's backend implements the
    methods below that raise NotImplementedError here."""

    _template: ChatTemplate | None = None

    @property
    def chat_template(self) -> ChatTemplate:
        """How roles render: derived once from the model's chat template, unless set (SGLang's
        `backend.chat_template = get_chat_template(name)`)."""
        if self._template is None:
            self._template = self._load_chat_template()
        return self._template

    @chat_template.setter
    def chat_template(self, template: ChatTemplate) -> None:
        if not isinstance(template, ChatTemplate):
            raise TypeError(f"a backend's chat_template is a ChatTemplate, got {template!r}; "
                            "take one from treadle.lang.chat_template.get_chat_template(name)")
        self._template = template

    def get_chat_template(self) -> ChatTemplate:
        """SGLang's BaseBackend.get_chat_template: `chat_template`."""
        return self.chat_template

    def template_stop_strs(self) -> list[str]:
        """The stop strings of a template set on this backend (a named one, as SGLang adds them to
        every gen); none for the model-derived template, or before roles load it."""
        return list(self._template.stop_str) if self._template is not None else []

    @property
    def endpoint(self) -> "Backend":
        """This backend: `set_default_backend(runtime)` keeps the Runtime's endpoint, and SGLang
        programs reach it as `sgl.global_config.default_backend.endpoint` (SGLang keeps the
        Runtime there)."""
        return self

    def _load_chat_template(self) -> ChatTemplate:
        """The template roles render with when none is set: SGLang's BaseBackend has "default"."""
        return get_chat_template("default")

    def cache_prefix(self, text: str) -> dict:
        """Prefill `text` (max_new_tokens=0) so later requests sharing it hit the cache.
        Returns the request's meta_info (SGLang's BaseBackend caches nothing: an empty one)."""
        return {}

    def generate(self, text: str, params: dict, logprob: dict | None = None) -> tuple[str, dict]:
        """Generate after `text` with sampling `params`; returns (output text, meta_info).
        `logprob`: return_logprob / logprob_start_len / top_logprobs_num /
        return_text_in_logprobs, as the runtime takes them (the logprobs land in meta_info).
        Raises ValueError for a request the runtime rejects (bad regex, ...)."""
        raise self._cannot("generate")

    def generate_stream(self, text: str, params: dict, logprob: dict | None = None) -> Iterator[tuple[str, dict]]:
        """Like `generate`, yielding (text delta, meta_info so far) as tokens arrive."""
        raise self._cannot("generate")

    def encode(self, texts: list[str]) -> list[list[int]]:
        """The token ids of each text, as the runtime tokenizes a prompt."""
        raise self._cannot("tokenize")

    def context_token(self) -> int | None:
        """A token to put before a sequence whose first token must be scored (BOS, else EOS)."""
        return None

    def prompt_logprobs(self, seqs: list[list[int]], start: int) -> list[dict]:
        """Prefill each token sequence (max_new_tokens=0) in one batched request; returns each
        one's meta_info, whose input_token_logprobs (with token texts) cover positions start..
        of its sequence. With start = 0 only the prefill is wanted (the sequence is cached for what follows)."""
        raise self._cannot("score a select")

    def _cannot(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} cannot {what}: it serves no model (run the program on "
                                   "an Engine, a Runtime or a RuntimeEndpoint)")

    def choice_logprobs(self, text: str, choices: list[str]) -> ChoiceScores:
        """Per choice, the logprobs of the tokens that spell it after `text`: tokenize the
        prefix and each prefix + choice, find where each choice starts (`choice_start`),
        compute the shared prefix once, then read every choice's prompt logprobs from one
        batched request. A choice whose tokens start the sequence (an empty `text`, or a one-
        token `text` merged into the choice's first token) has no context for its first
        token: then every sequence gets the context token in front, so all are scored alike."""
        ids = self.encode([text] + [text + c for c in choices])
        prefix_ids, fulls = ids[0], ids[1:]
        starts = [choice_start(prefix_ids, full) for full in fulls]
        if min(starts) == 0:
            ctx = self.context_token()
            if ctx is None:
                raise ValueError("select cannot score a choice's first token with no text before it: this "
                                 "tokenizer has no BOS or EOS token to stand in; put some text before the select")
            prefix_ids, fulls, starts = [ctx] + prefix_ids, [[ctx] + f for f in fulls], [s + 1 for s in starts]
        if prefix_ids:  # the choices share this prefix: compute it once
            self.prompt_logprobs([prefix_ids], 0)
        first = min(starts)
        metas = self.prompt_logprobs(fulls, first)
        entries = [_entries(m["input_token_logprobs"][start - first:])  # aligned with ids[first:]
                   for m, start in zip(metas, starts)]
        return ChoiceScores([[lp for lp, _, _ in es] for es in entries],
                            {"prompt_tokens": sum(m["prompt_tokens"] for m in metas),
                             "cached_tokens": sum(m.get("cached_tokens", 0) for m in metas),
                             "completion_tokens": 0, "finish_reason": None},
                            [full[start:] for full, start in zip(fulls, starts)],
                            entries, [_entries(m.get("output_token_logprobs") or []) for m in metas])

    def unconditional_logprobs(self, token_ids: list[list[int]]) -> list[list[list]]:
        """Each choice's tokens scored with nothing before them but the context token (BOS,
        else EOS): how likely the model finds the choice anywhere. Per choice, SGLang's
        [logprob, token id, token text] entries."""
        ctx = self.context_token()
        if ctx is None:
            raise ValueError("unconditional_likelihood_normalized needs a BOS or EOS token to score a choice "
                             "on its own, and this tokenizer has neither")
        metas = self.prompt_logprobs([[ctx] + ids for ids in token_ids], 1)
        return [_entries(m["input_token_logprobs"]) for m in metas]

    def get_server_info(self) -> dict:
        """As SGLang's: the runtime's arguments at the top level (`model_path` the model it
        loaded, `tp_size`, `max_total_tokens`, ...) and `version`, beside treadle's cache and
        scheduler counters (prompt/cached tokens, hit rate, free slots, ...) and, under
        "engine_args", the arguments as given."""
        raise NotImplementedError(f"{type(self).__name__} does not report server info")

    def flush_cache(self) -> bool:
        raise NotImplementedError(f"{type(self).__name__} cannot flush its cache")

    def shutdown(self) -> None:
        """SGLang's BaseBackend.shutdown: release what the backend holds. A backend that only
        connects to a server (RuntimeEndpoint) holds nothing, and the server keeps running; an
        Engine's backend stops its engine."""

    def select(self, text: str, choices: list[str], method: Any = "token_length_normalized") -> tuple[str, dict]:
        """Pick the choice the model finds most likely after `text`.

        `method` names one of CHOICE_METHODS, or is a ChoicesSamplingMethod of the program's
        own (treadle.lang.choices), called with the scores to decide. Returns (choice, meta)
        where meta has the per-choice scores and token counts."""
        from treadle.lang.choices import ChoicesSamplingMethod

        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"select needs a non-empty list of non-empty strings, got {choices!r}")
        if method not in CHOICE_METHODS and not isinstance(method, ChoicesSamplingMethod):
            raise ValueError(f"unknown choices_method {method!r}; use one of {', '.join(CHOICE_METHODS)} "
                             "or a ChoicesSamplingMethod")
        scores = self.choice_logprobs(text, choices)
        lps = scores.token_logprobs
        # SGLang's keys first: per choice, the mean logprob of its tokens, its tokens'
        # [logprob, id, text] entries, and what its scoring request generated (nothing)
        meta = {"normalized_prompt_logprobs": [sum(lp) / max(len(lp), 1) for lp in lps],
                "input_token_logprobs": scores.entries, "output_token_logprobs": scores.outputs,
                **scores.meta}
        if method not in CHOICE_METHODS:  # the program's own method decides
            return self._select_by(method, choices, meta, scores.token_ids)
        uncond = None
        if method == "unconditional_likelihood_normalized":
            meta["unconditional_token_logprobs"] = entries = self.unconditional_logprobs(scores.token_ids)
            uncond = [[lp for lp, _, _ in es] for es in entries]
        best, values = pick_choice(lps, method, uncond)
        if method == "unconditional_likelihood_normalized":
            meta["normalized_unconditional_prompt_logprobs"] = values
        elif method == "greedy_token":
            width = max(len(lp) for lp in lps)
            meta["greedy_logprob_matrix"] = [lp + [sum(lp) / len(lp)] * (width - len(lp)) for lp in lps]
        meta.update({"choices": list(choices), "scores": values, "method": method, "token_logprobs": lps})
        return choices[best], meta


    def _select_by(self, method: Any, choices: list[str], meta: dict, token_ids: list[list[int]]) -> tuple[str, dict]:
        """A ChoicesSamplingMethod's pick, given SGLang's keywords (and each choice scored alone
        when it requires that); its meta_info joins the select's."""
        uncond = None
        if method.requires_unconditional_logprobs:
            meta["unconditional_token_logprobs"] = uncond = self.unconditional_logprobs(token_ids)
        decision = method(choices=list(choices), normalized_prompt_logprobs=meta["normalized_prompt_logprobs"],
                          input_token_logprobs=meta["input_token_logprobs"],
                          output_token_logprobs=meta["output_token_logprobs"], unconditional_token_logprobs=uncond)
        if getattr(decision, "decision", None) not in choices:
            raise ValueError(f"choices_method {type(method).__name__} returned {decision!r}: it must return a "
                             f"ChoicesDecision whose decision is one of {choices!r}")
        meta.update(decision.meta_info or {})
        meta.update({"choices": list(choices), "method": type(method).__name__,
                     "token_logprobs": [[e[0] for e in es] for es in meta["input_token_logprobs"]]})
        return decision.decision, meta


def pick_choice(token_logprobs: list[list[float]], method: str,
                unconditional: list[list[float]] | None = None) -> tuple[int, list[float]]:
    """Index of the winning choice and each choice's score under `method`.

    token_length_normalized: mean logprob (long choices are not penalised for length);
    sum: total logprob; greedy_token: compare first-token logprobs, ties broken by the
    following tokens (the choice a greedy decoder would start with), a shorter choice's
    missing tokens counting as its own mean logprob (as SGLang's greedy selection);
    unconditional_likelihood_normalized: the mean, over the choice's tokens, of its logprob
    after the text minus its logprob with no text (`unconditional`): how much the text raises
    the choice over its own prior, so a common word does not win for being common."""
    if method == "unconditional_likelihood_normalized":
        if unconditional is None or [len(u) for u in unconditional] != [len(c) for c in token_logprobs]:
            raise ValueError("unconditional_likelihood_normalized needs each choice's unconditional logprobs")
        values = [sum(c - u for c, u in zip(cs, us)) / max(len(cs), 1)
                  for cs, us in zip(token_logprobs, unconditional)]
    elif method == "sum":
        values = [sum(lp) for lp in token_logprobs]
    elif method == "token_length_normalized":
        values = [sum(lp) / max(len(lp), 1) for lp in token_logprobs]
    elif method == "greedy_token":
        width = max(len(lp) for lp in token_logprobs)
        keys = [tuple(lp) + (sum(lp) / len(lp),) * (width - len(lp)) for lp in token_logprobs]
        best = max(range(len(keys)), key=lambda i: keys[i])
        return best, [lp[0] if lp else -math.inf for lp in token_logprobs]
    else:
        raise ValueError(f"unknown choices_method {method!r}; use one of {', '.join(CHOICE_METHODS)}")
    return max(range(len(values)), key=lambda i: values[i]), values


def sglang_server_info(info: dict, model_path: str | None, version: str | None) -> dict:
    """`info` (a /get_server_info, or an Engine's) with SGLang's top-level keys added: each
    engine argument not already there, `model_path` the model loaded (the argument is None
    for the embedded model), `version`, and its scheduler's `max_total_num_tokens` (the KV
    pool's size in tokens, `total_slots`) and `max_req_input_len` (the longest prompt the
    runtime takes: less than both the context length and the pool). Keys the runtime already
    reports win."""
    args = {k: v for k, v in (info.get("engine_args") or {}).items() if k != "api_key"}  # as the server's
    out = {**args, **info}
    if model_path:
        out["model_path"] = model_path
    out.setdefault("version", version or package_version())
    if isinstance(info.get("total_slots"), int):
        out.setdefault("max_total_num_tokens", info["total_slots"])
        if isinstance(info.get("context_length"), int):
            out.setdefault("max_req_input_len", min(info["context_length"], info["total_slots"]) - 1)
    return out


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("treadle")
    except PackageNotFoundError:  # run from a checkout without installing
        return "unknown"


def _entries(logprobs: list) -> list[list]:
    """A runtime's (logprob, token id, text) logprob triples as SGLang's select meta has them:
    [float logprob, int id, text] lists (the same over HTTP, where JSON makes them lists)."""
    return [[float(lp), int(tid), text] for lp, tid, text in logprobs]


def choice_start(prefix_ids: list[int], full_ids: list[int]) -> int:
    """Where scoring starts in `full_ids` (the tokens of prefix + choice).

    Normally the prefix tokens come first unchanged and this is len(prefix_ids). When the
    last prefix tokens merge with the start of the choice ("is " + "Paris" -> "is", " Paris"),
    scoring starts at the first token that differs, so the merged token is counted. 0 means
    the choice's first scored token is the sequence's first, which has no logprob."""
    n = 0
    limit = min(len(prefix_ids), len(full_ids) - 1)  # always score at least one token
    while n < limit and prefix_ids[n] == full_ids[n]:
        n += 1
    return n


# ---------------------------------------------------------------- default backend

_default: Backend | None = None
_default_lock = threading.Lock()


def set_default_backend(backend: Any) -> Backend | None:
    """Use `backend` (a Backend, an Engine, a Runtime, or a server URL) when `run` is given none;
    None clears it, as SGLang's (`global_config.default_backend = None`)."""
    global _default
    with _default_lock:
        _default = None if backend is None else as_backend(backend)
        return _default


def clear_default_backend() -> None:
    """Forget the default backend (`global_config.default_backend = None`)."""
    global _default
    with _default_lock:
        _default = None


def get_default_backend() -> Backend:
    if _default is None:
        raise ValueError("no backend: pass backend=... to run()/run_batch() or call set_default_backend() "
                         "with an Engine, EngineBackend or RuntimeEndpoint")
    return _default


def flush_cache(backend: Any = None) -> bool:
    """Empty the runtime's prefix cache (SGLang's `sgl.flush_cache`): `backend`'s, else the
    default backend's. False when there is no backend at all, as SGLang."""
    be = as_backend(backend) if backend is not None else _default
    return False if be is None else be.flush_cache()


def get_server_info(backend: Any = None) -> dict | None:
    """The runtime's /get_server_info (cache counters, ...) for `backend`, else the default
    backend. None when there is no backend at all, as SGLang."""
    be = as_backend(backend) if backend is not None else _default
    return None if be is None else be.get_server_info()


def as_backend(obj: Any) -> Backend:
    """Accept a Backend, an in-process Engine, a `Runtime` (its endpoint), or an
    "http://host:port" URL."""
    if obj is None:
        return get_default_backend()
    if isinstance(obj, Backend):
        return obj
    runtime_mod = sys.modules.get("treadle.lang.runtime_process")
    if runtime_mod is not None and isinstance(obj, runtime_mod.Runtime):
        return obj.endpoint
    if isinstance(obj, str):
        from treadle.lang.backend_http import RuntimeEndpoint

        return RuntimeEndpoint(obj)
    engine_mod = sys.modules.get("treadle.runtime.engine")  # an Engine instance implies it is imported
    if engine_mod is not None and isinstance(obj, engine_mod.Engine):
        from treadle.lang.backend_engine import EngineBackend

        return EngineBackend(obj)
    raise TypeError(f"not a backend: {obj!r}; pass an Engine, EngineBackend, RuntimeEndpoint, Runtime or URL")
