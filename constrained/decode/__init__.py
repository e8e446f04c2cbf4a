"""Stage 5 of treadle.constrained: per-request matching at decode time.

Takes a compiled grammar (compile/) and the tokens a request generates, and gives each step's
token bitmask and the text to jump forward:

- matcher.py: ``GrammarMatcher`` / ``HoleMatcher`` / ``JsonAnyMatcher`` accept tokens, fill
  the next-token bitmask, roll back and find forced text;
- json_keys.py: the keys each open JSON object has had, left out of the mask;
- unique_items.py: the string items each checked array has had (``set[str]``), left out too;
- json_lexer.py: the JSON byte lexer both follow the output with;
- bitmask.py: the int32 bitmask layout (allocate, reset, apply in torch, unpack);
- jump_forward.py: canonical retokenization of forced text (what to roll back, what to add).

Imports the earlier stages; matcher.py and bitmask.py import torch.
"""
