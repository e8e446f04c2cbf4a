"""select's scoring methods under SGLang's names (`from sglang.lang.choices import ...` ports as
`from treadle.lang.choices import ...`). Here each is the string naming the method, which
`select(..., choices_method=...)` and `gen(..., choices=..., choices_method=...)` take; the
scoring itself is in treadle.lang.backend (pick_choice), the same for every backend."""
from __future__ import annotations

token_length_normalized = "token_length_normalized"
greedy_token_selection = "greedy_token"
unconditional_likelihood_normalized = "unconditional_likelihood_normalized"

__all__ = ["greedy_token_selection", "token_length_normalized", "unconditional_likelihood_normalized"]
