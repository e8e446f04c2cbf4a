"""Per-request sampling parameters: the one place they are declared and validated."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def sample_seed(seed: int, j: int) -> int:
    """The seed of sample `j` of a request's n samples seeded `seed` (any integer: folded into
    the kernels' 63 bits, as the scheduler folds a request's own seed). Sample 0 keeps the seed,
    so n=1 and the first of n samples agree; each later one gets a 63-bit hash of (seed, j).
    `seed + j` (vLLM's choice) made sample j of {seed: s, n} the first sample of {seed: s + j}:
    two requests a client sent with seeds 1 and 2 shared a sample. A hash lands on another
    request's seed, or another sample's, only by a 2^-63 chance; the same request still gives
    the same samples (no process state enters it)."""
    folded = seed % (1 << 63)
    if j == 0:
        return folded
    digest = hashlib.blake2b(folded.to_bytes(8, "little") + j.to_bytes(8, "little"), digest_size=8,
                             person=b"treadle-n-sample").digest()
    return int.from_bytes(digest, "little") >> 1


# Fields a caller may pass in `sampling_params` (native API, Engine). Unknown fields are an error.
GRAMMAR_FIELDS = ("regex", "json_schema", "choices", "ebnf", "structural_tag")  # output constraints: at most one


def schema_of(value: Any) -> Any:
    """A JSON schema given as a Pydantic model class: its ``model_json_schema()``; anything
    else as it is."""
    if isinstance(value, type) and callable(getattr(value, "model_json_schema", None)):
        return value.model_json_schema()
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(text: str) -> int | None:
    """The code point of the first lone surrogate in `text`, or None."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return ord(text[e.start])


def _json_strings(value: Any):
    """Every string of a parsed JSON value, object keys included."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            yield from v.keys()
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


# Error messages quote what a client sent (a field name, a model name, a value) at most this
# many characters: a 5 MB model name made a 5 MB error body
QUOTE_CHARS = 160
QUOTE_ITEMS = 8


def clip(text: Any, limit: int = QUOTE_CHARS) -> str:
    """`text` as an error message quotes it: whole up to `limit` characters, else its first
    `limit`, an ellipsis and its length."""
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def quoted(value: Any, limit: int = QUOTE_CHARS) -> str:
    """repr(value) as an error message quotes it, bounded the same way (a container's repr
    too: a few of its items, each bounded)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool):  # up to 4,300 digits reach here from JSON
        digits = str(value)
        return digits if len(digits) <= limit else f"{digits[:limit]}... ({len(digits.lstrip('-')):,} digits)"
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = limit
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = QUOTE_ITEMS
    r.maxlevel = 4
    return clip(r.repr(value), 4 * limit)


def clip_names(names: Any, items: int = QUOTE_ITEMS, limit: int = QUOTE_CHARS) -> str:
    """A list of client-sent names (unknown fields) as an error message lists them: the first
    `items`, each clipped, then how many more."""
    names = list(names)
    shown = ", ".join(clip(n, limit) for n in names[:items])
    return shown if len(names) <= items else f"{shown} and {len(names) - items:,} more"


def _sglang_fields(d: dict[str, Any]) -> dict[str, Any]:
    """`d` without SGLang's sampling fields that treadle has its own way or ignores at their
    defaults: sampling_seed is treadle's seed (both, unequal: a ValueError); custom_params
    (the data of a custom logit processor), stop_regex and stream_interval are taken at
    SGLang's defaults (None; None or []; None or 1) and refused, by name, at any other value."""
    if not any(k in d for k in ("sampling_seed", "custom_params", "stop_regex", "stream_interval")):
        return d
    d = dict(d)
    if "sampling_seed" in d:
        seed = d.pop("sampling_seed")
        if seed is not None:
            if d.get("seed") is not None and d["seed"] != seed:
                raise ValueError(f"sampling_params: sampling_seed {quoted(seed)} and seed {quoted(d['seed'])} "
                                 "differ (both are the request's seed; give one)")
            d["seed"] = seed
    if d.pop("custom_params", None) is not None:
        raise ValueError("sampling_params.custom_params is not supported: treadle runs no custom logit "
                         "processor (leave it None)")
    regex = d.pop("stop_regex", None)
    if regex is not None and regex != []:
        raise ValueError(f"sampling_params.stop_regex is not supported (got {quoted(regex)}): stop on "
                         "strings (stop) or token ids (stop_token_ids), or constrain the output with regex")
    interval = d.pop("stream_interval", None)
    if interval is not None and (isinstance(interval, bool) or interval != 1):
        raise ValueError(f"sampling_params.stream_interval is not supported (got {quoted(interval)}): "
                         "treadle streams every token (leave it None or 1)")
    return d


MAX_N = 128  # parallel samples of one prompt (OpenAI's limit); each is a request of its own
MAX_TEMPERATURE = 100.0  # far past any useful one (OpenAI allows 2); 1e300 was inf in float32
MIN_REPETITION_PENALTY = 0.01  # a seen logit grows at most 100x; 1e-40 made it inf and failed the batch


# the numeric fields: normalize() reads another numeric type in them (numpy's) as Python's
_NUMBER_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "seed", "temperature", "top_p", "min_p",
                  "frequency_penalty", "presence_penalty", "repetition_penalty")

_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                "include_stop_str_in_output", "json_schema_lenient")


def _as_int(v: Any) -> Any:
    """Another integer type (numpy's int64, uint16) as Python's int; anything else (a bool,
    numpy's bool_, which is no Integral, a float) as it is, for validate to refuse."""
    if type(v) is not int and not isinstance(v, bool) and isinstance(v, numbers.Integral):
        return int(v)
    return v


def _as_ints(v: Any) -> Any:
    """A list of token ids as Python ints: a 1-D numpy integer array as its list, numpy
    integers in a list as ints; anything else as it is (validate names what is wrong)."""
    dtype = getattr(v, "dtype", None)
    if not isinstance(v, list) and getattr(dtype, "kind", None) in ("i", "u") and getattr(v, "ndim", None) == 1:
        return v.tolist()
    if isinstance(v, list) and any(type(t) is not int for t in v):
        return [_as_int(t) for t in v]
    return v


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0  # stop tokens banned until then; a grammar that can only end still ends
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    # vLLM's: the text ends right after a matched stop string (no_stop_trim keeps the rest of its
    # token too, as SGLang's), and a matched stop token's text stays
    include_stop_str_in_output: bool = False
    regex: str | None = None
    json_schema: str | None = None
    choices: list[str] | None = None
    ebnf: str | None = None  # a GBNF grammar whose rule "root" is the output (constrained/ebnf/ebnf.py)
    # free text whose tagged segments follow schemas (constrained/ebnf/structural_tag.py), as JSON text
    structural_tag: str | None = None
    # a reasoning block (<think>...</think>) comes before the constrained answer, and is free:
    # "open" (the prompt opened it) or "maybe" (the reply may open one); the chat endpoint sets
    # it under --reasoning-parser think (constrained/ebnf/reasoning_prefix.py)
    grammar_after_reasoning: str | None = None
    # token id -> added to its logit before sampling (OpenAI's logit_bias: -100 bans, 100 forces)
    logit_bias: dict[int, float] | None = None
    # opt-in leniency (docs/json-schema.md): json_schema's assertion keywords treadle cannot
    # enforce are dropped instead of refused (None: the server's --json-schema-lenient) ...
    json_schema_lenient: bool | None = None
    # ... and listed here, [{"keyword", "path", "reason"}], by treadle (never by the client):
    # meta_info and the OpenAI response carry it
    json_schema_dropped: list[dict] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SamplingParams":
        """Build and validate from a user dict; unknown fields raise ValueError naming them."""
        if d is None:
            d = {}
        if isinstance(d, SamplingParams):
            d.validate()
            return d
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be an object, got {type(d).__name__}")
        d = _sglang_fields(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown sampling_params field(s): {clip_names(unknown)}; "
                f"accepted: {', '.join(sorted(known))}"
            )
        if d.get("json_schema_dropped") is not None:
            raise ValueError("sampling_params.json_schema_dropped is set by treadle (set json_schema_lenient instead)")
        kwargs = {k: v for k, v in d.items() if v is not None or k in ("seed",)}
        p = cls(**kwargs)
        p.normalize()
        p.validate()
        return p

    def normalize(self) -> None:
        """Coerce convenient forms: a single stop string, a json_schema given as a dict, a
        number of another numeric type (numpy's int64 or float32, a Fraction) as int or float,
        top_p 0 (OpenAI takes it) as top_k 1,
        numpy's bool as bool, token ids (stop_token_ids, logit_bias's keys) of numpy's
        integer types, or a 1-D numpy integer array of them, as ints, and a Python caller's
        tuple of stop strings, choices or stop ids (or a set of stop ids) as a list."""
        for name in _NUMBER_FIELDS:
            v = getattr(self, name)
            if type(v) not in (int, float, bool, type(None)):  # (bool has no subclasses)
                if isinstance(v, numbers.Integral):
                    setattr(self, name, int(v))
                elif isinstance(v, numbers.Real):
                    setattr(self, name, float(v))
        if type(self.top_p) in (int, float) and self.top_p == 0:
            # OpenAI takes top_p 0: the nucleus of no mass, the most likely token alone (its
            # filter here keeps tokens until top_p is reached, so it reads as top_k 1)
            self.top_p, self.top_k = 1.0, 1
        for name in _BOOL_FIELDS:  # numpy's bool (a comparison's np.True_), not its ints
            v = getattr(self, name)
            if isinstance(v, np.bool_):
                setattr(self, name, bool(v))
        # a Python caller's tuple (or set of ids) as the list JSON gives (SGLang iterates them)
        if isinstance(self.stop_token_ids, (tuple, set, frozenset)):
            self.stop_token_ids = sorted(self.stop_token_ids) if not isinstance(self.stop_token_ids, tuple) \
                and all(isinstance(t, numbers.Integral) for t in self.stop_token_ids) else list(self.stop_token_ids)
        for name in ("stop", "choices"):
            if isinstance(getattr(self, name), tuple):
                setattr(self, name, list(getattr(self, name)))
        self.stop_token_ids = _as_ints(self.stop_token_ids)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        self.json_schema = schema_of(self.json_schema)
        if isinstance(self.json_schema, (dict, bool)):
            self.json_schema = json.dumps(self.json_schema, separators=(",", ":"))
        if isinstance(self.structural_tag, dict):
            self.structural_tag = json.dumps(self.structural_tag, separators=(",", ":"), ensure_ascii=False)
        if isinstance(self.logit_bias, dict):  # JSON object keys are strings: "1234" -> 1234
            # ASCII digits only ("٥" and "５" are no token id; int() read them as 5), and not
            # past what int() converts (5,000 digits raised its own error): validate names it
            bias: dict = {}
            named: dict = {}  # token id -> the key that named it
            for k, v in self.logit_bias.items():
                t = int(k) if isinstance(k, str) and k.isascii() and k.isdecimal() and len(k) <= 20 else _as_int(k)
                if type(v) not in (int, float, bool) and isinstance(v, numbers.Real):  # numpy's float32, int8
                    v = int(v) if isinstance(v, numbers.Integral) else float(v)
                if t in named and isinstance(t, int):  # "5" and "05": one bias silently lost
                    raise ValueError(f"sampling_params.logit_bias names token {t} twice ({quoted(named[t])} and "
                                     f"{quoted(k)}): give each token once")
                named[t], bias[t] = k, v
            self.logit_bias = bias or None

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the first out-of-range field."""
        def check_type(name: str, types: tuple[type, ...]) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) and bool not in types:
                raise ValueError(f"sampling_params.{name} must be a number, got {quoted(v)}")
            if not isinstance(v, types):
                raise ValueError(f"sampling_params.{name} has the wrong type: {type(v).__name__}")

        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            check_type(name, (int,))
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty"):
            check_type(name, (int, float))
            v = getattr(self, name)
            if isinstance(v, int) and v.bit_length() > 1000:  # past float's range: math.isfinite overflows
                raise ValueError(f"sampling_params.{name} must be a finite number, got an integer of "
                                 f"{v.bit_length()} bits")
            if not math.isfinite(v):  # JSON parsers accept NaN / Infinity
                raise ValueError(f"sampling_params.{name} must be a finite number, got {v}")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                     "include_stop_str_in_output"):
            check_type(name, (bool,))
        if self.json_schema_lenient is not None and not isinstance(self.json_schema_lenient, bool):
            raise ValueError("sampling_params.json_schema_lenient must be a boolean, got "
                             f"{quoted(self.json_schema_lenient)}")
        if self.max_new_tokens < 0:
            raise ValueError(f"sampling_params.max_new_tokens must be >= 0, got {quoted(self.max_new_tokens)}")
        if self.min_new_tokens < 0 or self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"sampling_params.min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {quoted(self.min_new_tokens)}"
            )
        # the kernels compute in float32: 1 / temperature past MAX_TEMPERATURE, and a logit over
        # repetition_penalty under MIN_REPETITION_PENALTY, could leave its range and turn the
        # request's logits non-finite
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"sampling_params.temperature must be in [0, {MAX_TEMPERATURE}], "
                             f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling_params.top_p must be in [0, 1], got {self.top_p}")
        if self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"sampling_params.top_k must be -1 (off) or >= 1, got {quoted(self.top_k)}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"sampling_params.min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"sampling_params.{name} must be in [-2, 2], got {getattr(self, name)}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= 2:
            raise ValueError(f"sampling_params.repetition_penalty must be in [{MIN_REPETITION_PENALTY}, 2], "
                             f"got {self.repetition_penalty}")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"sampling_params.n must be in [1, {MAX_N}], got {quoted(self.n)}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"sampling_params.seed must be an integer, got {quoted(self.seed)}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("sampling_params.stop must be a string or a list of non-empty strings")
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError("sampling_params.stop_token_ids must be a list of non-negative integers")
        if vocab_size is not None and any(t >= vocab_size for t in self.stop_token_ids):
            raise ValueError(f"sampling_params.stop_token_ids must be < vocab size {vocab_size}")
        if self.logit_bias is not None:
            b = self.logit_bias
            if not isinstance(b, dict) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in b):
                raise ValueError("sampling_params.logit_bias must map token ids (non-negative integers) to numbers")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and -100 <= v <= 100 for v in b.values()):
                raise ValueError("sampling_params.logit_bias values must be numbers in [-100, 100]")
            if vocab_size is not None and any(t >= vocab_size for t in b):
                raise ValueError(f"sampling_params.logit_bias token ids must be < vocab size {vocab_size}")
        grammars = [f for f in GRAMMAR_FIELDS if getattr(self, f) is not None]
        if len(grammars) > 1:
            raise ValueError(
                "sampling_params: at most one of regex, json_schema, choices, ebnf, structural_tag may be set; "
                f"got {', '.join(grammars)}"
            )
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError("sampling_params.regex must be a non-empty string")
        if self.ebnf is not None and (not isinstance(self.ebnf, str) or not self.ebnf.strip()):
            raise ValueError("sampling_params.ebnf must be a non-empty string (a grammar with a 'root' rule)")
        if self.structural_tag is not None and not isinstance(self.structural_tag, str):
            raise ValueError("sampling_params.structural_tag must be an object (or its JSON text)")
        self._check_nesting()
        self._check_whole_chars()
        if self.structural_tag is not None or self.grammar_after_reasoning is not None:
            # checked where they are defined (constrained/), named as sampling params here
            from treadle.constrained.ebnf.reasoning_prefix import check_mode
            from treadle.constrained.ebnf.structural_tag import StructuralTag

            try:
                if self.structural_tag is not None:
                    StructuralTag.parse(self.structural_tag)
                if self.grammar_after_reasoning is not None:
                    check_mode(self.grammar_after_reasoning)
            except ValueError as e:
                raise ValueError(f"sampling_params.{e}") from None
        if self.choices is not None and (
            not isinstance(self.choices, list) or not self.choices
            or not all(isinstance(c, str) and c for c in self.choices)
        ):
            raise ValueError("sampling_params.choices must be a non-empty list of non-empty strings")

    def apply_leniency(self, default: bool, *, mode: str = "strict", whitespace_pattern: str | None = None,
                       max_recursion_depth: int = 3) -> None:
        """With leniency on (json_schema_lenient, else ``default``, the server's flag): json_schema
        rewritten without the assertion keywords treadle cannot enforce, and json_schema_dropped
        set to what was dropped (``[]`` when nothing was). Once per request; the options are the
        grammar compiler's. Raises ValueError (naming the keyword) where leniency cannot help."""
        lenient = default if self.json_schema_lenient is None else self.json_schema_lenient
        if not lenient or self.json_schema is None or self.json_schema_dropped is not None:
            return
        from treadle.constrained.schema.json_schema import drop_unenforceable

        schema, dropped = drop_unenforceable(self.json_schema, mode=mode, whitespace_pattern=whitespace_pattern,
                                             max_recursion_depth=max_recursion_depth,
                                             holes=whitespace_pattern is None)
        if dropped:
            self.json_schema = json.dumps(schema, separators=(",", ":"))
        self.json_schema_dropped = dropped

    def _check_nesting(self) -> None:
        """A grammar text nesting past nesting.MAX_GRAMMAR_NESTING is a ValueError here, where the
        request is validated, not a RecursionError where it is compiled."""
        from treadle.runtime import nesting

        if isinstance(self.json_schema, str):
            nesting.check_json_text(self.json_schema, "json_schema")
        if isinstance(self.structural_tag, str):
            nesting.check_json_text(self.structural_tag, "structural_tag")
        if isinstance(self.ebnf, str):
            nesting.check_grammar_text(self.ebnf, "ebnf")
        if isinstance(self.regex, str):
            nesting.check_grammar_text(self.regex, "regex", nesting.REGEX_LITERALS)

    def _check_whole_chars(self) -> None:
        """A grammar or stop string with a lone surrogate (JSON's "\\ud800" escape, half of a
        character) is a ValueError naming the field: no UTF-8 output can match it, and the
        grammar compiler failed on it with a message about its token index."""
        choices = self.choices if isinstance(self.choices, list) else []
        fields = [("regex", self.regex), ("ebnf", self.ebnf), *(("choices", c) for c in choices),
                  *(("stop", t) for t in self.stop), ("json_schema", self.json_schema),
                  ("structural_tag", self.structural_tag)]
        for name, text in fields:
            if not isinstance(text, str):
                continue
            bad = _lone_surrogate(text)
            if bad is None and name in ("json_schema", "structural_tag") and _SURROGATE_ESCAPE.search(text):
                # JSON text: its escapes ("\\udc00") decode to the strings the grammar holds
                try:
                    bad = next(filter(None, map(_lone_surrogate, _json_strings(json.loads(text)))), None)
                except (ValueError, RecursionError):
                    pass  # not JSON: the compiler names that
            if bad is not None:
                raise ValueError(f"sampling_params.{name} has a lone surrogate (U+{bad:04X}), half of a character, "
                                 "which no output can contain: send whole characters")

    @property
    def is_greedy(self) -> bool:
        # a temperature below 1e-5 is greedy, as vLLM's (kernels.sampling.MIN_TEMPERATURE): 1 / T
        # of a tiny one overflowed float32, which failed the whole batch step on a CPU
        return self.temperature < 1e-5 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1)

    @property
    def has_grammar(self) -> bool:
        return any(getattr(self, f) is not None for f in GRAMMAR_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
