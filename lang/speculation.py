"""SGLang's speculative execution on API backends (`@function(num_api_spec_tokens=N)`), for
the interpreter's StreamExecutor `ex`:

- a chat model (sgl.OpenAI's default): an assistant message's text and gens are held
  (`ex._spec`) and sent as one request of N tokens when the message ends (`run_message`); the
  reply is split into the gens (`match`, SGLang's spec_pattern_match).
- a completion model (`is_chat_model=False`): a gen with stop strings asks for
  max(max_tokens, N) tokens without them and takes the text to its earliest stop (`text_gen`);
  the program's next text (`ex._fill`) and gens take the rest while it matches (SGLang's
  _spec_gen).

Backends that are not chat-model APIs (`is_chat_model`) or do not say `speculates_text` ignore N.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from treadle.runtime.sampling_params import GRAMMAR_FIELDS

if TYPE_CHECKING:
    from treadle.lang.interpreter import StreamExecutor


def takes_text(ex: StreamExecutor, params: dict, logprob: dict) -> bool:
    """A gen with stop strings in a program with num_api_spec_tokens, on a completion-model API
    backend (sgl.OpenAI(..., is_chat_model=False)), without constraints, n > 1, logprobs or
    streaming: it takes its text from the speculation (SGLang's _spec_gen)."""
    return (ex.spec_tokens is not None and bool(getattr(ex.backend, "speculates_text", False))
            and not getattr(ex.backend, "is_chat_model", False) and bool(params.get("stop"))
            and not ex.stream and params.get("n", 1) == 1 and not logprob.get("return_logprob")
            and not any(k in params for k in GRAMMAR_FIELDS))


def text_gen(ex: StreamExecutor, params: dict) -> tuple[str, dict]:
    """A gen's text from the speculation, as SGLang's _spec_gen: when there is none, one
    request of max(max_tokens, num_api_spec_tokens) tokens without stop strings; the gen
    takes it up to its earliest stop string (or max_tokens characters, as SGLang's) and the
    rest stays speculated for the program's next text and gens."""
    stop = params["stop"]
    stops = [stop] if isinstance(stop, str) else [x for x in stop if x]
    limit = params.get("max_new_tokens", 128)
    meta: dict = {}
    if not ex.speculated:
        ask = {k: v for k, v in params.items() if k != "stop"}
        ask["max_new_tokens"] = max(limit, ex.spec_tokens or 0)
        ex.speculated, meta = ex.backend.generate(ex.text_, ask, None)
    found = [p for p in (ex.speculated.find(x) for x in stops) if p != -1]
    end = min(found) if found else min(limit, len(ex.speculated))
    out, ex.speculated = ex.speculated[:end], ex.speculated[end:]
    return out, meta


def holds_message(ex: StreamExecutor) -> bool:
    """Inside an assistant message of a program with num_api_spec_tokens, on a chat-model API
    backend: its text and gens are held for one request at the message's end (SGLang's)."""
    return (ex.spec_tokens is not None and ex.role == "assistant"
            and bool(getattr(ex.backend, "is_chat_model", False)))


def run_message(ex: StreamExecutor) -> None:
    """SGLang's speculative execution of an assistant message: one request (the messages
    before it, num_api_spec_tokens tokens, the gens' shared sampling parameters) whose reply
    must read as the message's text with each gen's value in its place: a constant must come
    next in the reply, a gen runs to its first stop string (the last gen to the end). Tried
    up to 3 times (sampling may differ); if no reply matches, a warning, and the gens past
    the first mismatch are empty."""
    try:
        _fill_message(ex, ex._spec)
    finally:  # emptied only now: until the values are set, reads of the gens' names wait
        ex._spec = []


def _fill_message(ex: StreamExecutor, terms: list[dict]) -> None:
    gens = [t for t in terms if "name" in t]
    shared: dict | None = None
    for t in gens:
        p = {k: v for k, v in t["params"].items() if k not in ("stop", "max_new_tokens")}
        if shared is not None and p != shared:
            raise ValueError(f"gen({t['name']!r}): speculative execution (num_api_spec_tokens) sends the "
                             "assistant message as one request, so its gens' sampling parameters (but stop and "
                             "max_tokens) must be the same")
        shared = p
    values: list[str] = []
    meta: dict = {}
    if gens:
        params = {**(shared or {}), "max_new_tokens": ex.spec_tokens}
        for _ in range(3):
            reply, meta = ex.backend.generate([dict(m) for m in ex.messages_], params, None)
            values, complete = match(terms, reply)
            if complete:
                break
        else:
            warnings.warn(f"speculative execution: no reply matched the assistant message's text; the last "
                          f"was {reply!r}, and gens past the mismatch are empty", stacklevel=2)
    values += [""] * (len(gens) - len(values))
    it = iter(values)
    for t in terms:
        if "name" not in t:
            ex._append(t["text"])
            continue
        value = next(it)
        ex.gen_starts[t["name"]] = len(ex.text_)
        ex._append(value, t["name"], meta)
        ex._set_var(t["name"], value, meta)


def match(terms: list[dict], reply: str) -> tuple[list[str], bool]:
    """The gens' values read from `reply` against the message's parts (SGLang's
    spec_pattern_match): each constant must come next; a gen takes the text up to its earliest
    stop string (the stop is left for what follows), the last gen takes the rest. Returns the
    values read and whether the whole message matched."""
    values: list[str] = []
    for i, t in enumerate(terms):
        if "name" not in t:
            if not reply.startswith(t["text"]):
                return values, False
            reply = reply[len(t["text"]):]
            continue
        stops = t["stop"] or []
        stops = [stops] if isinstance(stops, str) else stops
        found = [p for p in (reply.find(s) for s in stops if s) if p != -1]
        if found:
            values.append(reply[:min(found)])
            reply = reply[min(found):]
        elif all("name" not in u for u in terms[i + 1:]) and not any(u["text"] for u in terms[i + 1:]):
            values.append(reply)
            reply = ""
        else:
            return values, False
    return values, True
