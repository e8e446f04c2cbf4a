"""Incremental detokenization: turn a growing list of output ids into text deltas that never
end inside a UTF-8 character, and trim stops: a stop string (holding back text that might be the
start of one while streaming) and the stop token that finished the request (a `stop_token_ids`
entry or EOS, as SGLang trims it; `output_ids` keep it). `no_stop_trim` keeps both, and the
rest of the text of the token a stop string ended in (SGLang's); `include_stop_str` (vLLM's
`include_stop_str_in_output`) keeps the stop token, and the text up to the end of the stop string.

With `min_new_tokens`, a stop string counts only if it ends in the text of token number
min_new_tokens or a later one, as the scheduler decides (Scheduler._check_finished): one
written before that is ordinary text."""
from __future__ import annotations

from typing import Any

# Byte-level BPE decodes an incomplete UTF-8 sequence to U+FFFD; such text is not final yet.
_REPLACEMENT = "\ufffd"
# Tokens decoded together with the new ones so that merges and leading spaces come out right.
_CONTEXT_TOKENS = 5
# Tokens a text ending in U+FFFD is held for, waiting for the rest of a character (UTF-8 has at
# most 4 bytes a character, a token at least 1): past this it holds invalid bytes, and is final
_MAX_HELD_TOKENS = 8


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True, stop: list[str] | None = None,
                 no_stop_trim: bool = False, spaces_between_special_tokens: bool = True,
                 min_new_tokens: int = 0, include_stop_str: bool = False) -> None:
        self.tokenizer = tokenizer
        self.include_stop_str = include_stop_str
        self.min_new_tokens = min_new_tokens
        self._stops_from: int | None = 0 if min_new_tokens <= 1 else None  # see _stop_search_start
        self.skip_special_tokens = skip_special_tokens
        self.stop = [s for s in (stop or []) if s]
        self.no_stop_trim = no_stop_trim
        self.ids: list[int] = []
        self.text = ""  # decoded text of ids[:read_offset]
        self.prefix_offset = 0  # context window start
        self.read_offset = 0  # ids whose text is final
        self.sent = 0  # characters of `visible` already returned
        self.stopped = False
        self._cut: int | None = None  # where the text ends once a stop string was found
        self._searched = 0  # characters of the text searched for stop strings (none ends before)
        self._holds = [0] * len(self.stop)  # per stop string: its start the text ended with ...
        self._held_at = 0  # ... when the text had this many characters
        # characters the stop-string checks looked at (the windows searched for a whole stop
        # string, and those of the tails held back): their cost, about the new text per token
        self.stop_scan_chars = 0

    @classmethod
    def for_params(cls, tokenizer: Any, p: Any) -> "IncrementalDetokenizer":
        """The detokenizer of a request from its SamplingParams, or from the DetokInit the
        scheduler sends the detokenizer process (the same fields)."""
        return cls(tokenizer, p.skip_special_tokens, list(p.stop), p.no_stop_trim, p.spaces_between_special_tokens,
                   p.min_new_tokens, p.include_stop_str_in_output)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_ids: list[int], finished: dict | None = None) -> str:
        """Append token ids; return the new text that is safe to show. ``finished`` is the
        request's finish reason on its last output (a stop token is its last new id)."""
        done = finished is not None
        if done and isinstance(finished.get("matched"), int) and not (self.no_stop_trim or self.include_stop_str):
            new_ids = new_ids[:-1]
        self.ids.extend(new_ids)
        if len(self.ids) > self.read_offset:
            prefix_text = self._decode(self.ids[self.prefix_offset: self.read_offset])
            full = self._decode(self.ids[self.prefix_offset:])
            if done or not full.endswith(_REPLACEMENT):
                self._commit(full, prefix_text, len(self.ids))
            elif len(self.ids) - self.read_offset > _MAX_HELD_TOKENS:
                # still U+FFFD at the end after more tokens than a character has bytes: invalid
                # bytes (or the U+FFFD character itself), not a character yet to come. Held on,
                # every token decoded the whole held tail again (8,000 forced byte tokens took
                # the detokenizer, which every request shares, half a minute) and a stream sent
                # nothing. The text is final up to where the last character may still be
                # coming: the first of the last 3 tokens' starts where it is a prefix of `full`
                n = len(self.ids)
                for end in range(n - 3, n + 1):
                    part = full if end == n else self._decode(self.ids[self.prefix_offset:end])
                    if full.startswith(part):
                        break
                self._commit(part, prefix_text, end)
        return self._visible_delta(done)

    def _commit(self, text: str, prefix_text: str, end: int) -> None:
        """The text of ids[prefix_offset:end] is final: keep what it adds, read on from `end`."""
        self.text += text[len(prefix_text):]
        self.read_offset = end
        self.prefix_offset = max(0, end - _CONTEXT_TOKENS)

    def _visible_delta(self, finished: bool) -> str:
        visible = self.text
        hold = 0
        if self.stop and not self.no_stop_trim and self._cut is None:
            start = self._stop_search_start()
            # the first stop string that ends at or after `start` (none before min_new_tokens);
            # the text only grows, and one found earlier would have ended it: search where a
            # stop string can end in the new text only
            found = []
            if start is not None:
                for j, s in enumerate(self.stop):
                    at = max(0, start - len(s) + 1, self._searched - len(s) + 1)
                    if len(visible) - at < len(s):
                        continue  # no room for it yet
                    self.stop_scan_chars += len(visible) - at
                    i = visible.find(s, at)
                    if i >= 0:
                        found.append((i, j))
                self._searched = len(visible)
            if found:  # the first in the text (of two there, the first listed: the scheduler's `matched`)
                cut, j = min(found)
                self._cut, self.stopped = cut + len(self.stop[j]) if self.include_stop_str else cut, True
            elif not finished:
                # keep back a tail that could still grow into a stop string (before
                # min_new_tokens too: the stop may end in a token that counts). A tail that
                # starts a stop string now began where one did before, or in the new text:
                # it is at most the last one plus the new characters long
                grown = len(visible) - self._held_at
                self._holds = [self._hold(visible, s, h, grown) for s, h in zip(self.stop, self._holds)]
                self._held_at = len(visible)
                hold = max(self._holds)
        if self._cut is not None:
            visible = visible[:self._cut]
        if hold:
            visible = visible[:-hold]
        if len(visible) <= self.sent:
            return ""
        delta = visible[self.sent:]
        self.sent = len(visible)
        return delta

    def _hold(self, visible: str, stop: str, held: int, grown: int) -> int:
        """The tail of `visible` to hold back for `stop`, which its first len(visible) - grown
        characters ended `held` characters of (the text only grows). Where the new text goes
        on with `stop`, the tail is the old one plus it: compared in the new text only (a
        tail as long as the output, all of it a stop string's start, was copied and compared
        whole at every token); else the longest shorter tail, bounded by that one."""
        most = held + grown
        if held and most < len(stop):
            self.stop_scan_chars += grown
            if stop.startswith(visible[len(visible) - grown:], held):
                return most
        work = [0]
        hold = partial_suffix_len(visible, stop, most, work)
        self.stop_scan_chars += work[0]
        return hold

    def _stop_search_start(self) -> int | None:
        """Where in the text a stop string may end: after the text of the first
        min_new_tokens - 1 tokens; None while there are fewer tokens than that (nothing is
        cut then)."""
        if self._stops_from is None and len(self.ids) >= self.min_new_tokens:
            self._stops_from = len(self._decode(self.ids[:self.min_new_tokens - 1]))
        return self._stops_from

    @property
    def output_text(self) -> str:
        return self.text[: self.sent]


def partial_suffix_len(text: str, marker: str, most: int | None = None, work: list[int] | None = None) -> int:
    """Length of the longest end of `text` that is a proper start of `marker` (text to hold
    back while streaming: it may still become `marker`); at most `most` (a bound the caller
    knows, which keeps a long marker from costing its length squared at every call). Adds
    the characters it looks at to ``work[0]``, where given."""
    top = min(len(marker) - 1, len(text))
    if most is not None:
        top = min(top, most)
    first = marker[:1]
    k = top
    while k > 0:
        if work is not None:
            work[0] += k  # searched for `first`, then copied from there and compared
        # an end that starts `marker` begins with its first character: jump to the next one
        at = text.find(first, len(text) - k)
        if at < 0:
            return 0
        k = len(text) - at
        if marker.startswith(text[at:]):
            return k
        k -= 1
    return 0
