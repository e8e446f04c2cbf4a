"""N-gram speculative decoding ("prompt lookup"): drafts taken from the request's own text.

When the last `n` tokens of a request (prompt + output) occurred earlier in it, the
tokens that followed that occurrence are a likely continuation: summaries, extraction, code
edits and RAG answers copy spans of their input. They are proposed as a draft and verified
like a verified jump-forward (scheduler `_verify_draft`): one extend step computes the logits
after each draft token, the draft is kept up to the first token the sampler would not have
chosen (greedy, or its own seeded draw at that position), and the output is token for token
what decoding one step at a time gives.
No draft model, no extra weights; a step with a rejected draft costs an extend of k + 1
tokens instead of a decode of one.
"""
from __future__ import annotations


class NgramIndex:
    """One request's n-grams -> the position after their latest occurrence, kept up to date
    as output tokens are appended (a request's prompt and output only grow)."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"n-gram size must be >= 1, got {n}")
        self.n = n
        self.after: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # positions p < indexed have their preceding n-gram recorded

    def draft(self, prompt: list[int], output: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the sequence's last
        n tokens ([] when there is none)."""
        n, lp = self.n, len(prompt)
        length = lp + len(output)
        if k < 1 or length <= n:
            return []

        def at(j: int) -> int:
            return prompt[j] if j < lp else output[j - lp]

        # record every position whose following token is known (not the end itself)
        for p in range(max(self.indexed, n), length):
            self.after[tuple(at(j) for j in range(p - n, p))] = p
        self.indexed = length
        p = self.after.get(tuple(at(j) for j in range(length - n, length)))
        if p is None:
            return []
        return [at(j) for j in range(p, min(p + k, length))]
