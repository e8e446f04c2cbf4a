"""Stage 2 of treadle.constrained (beside schema/): grammars and free text around them -> regex.

Takes an EBNF grammar (GBNF, ebnf.py), a structural tag (free text whose tagged segments
follow a schema, a regex or a grammar, structural_tag.py) or a reasoning mode (a
``<think>`` block before the answer, reasoning_prefix.py), and gives one regex of the regex/
dialect, with the recursive rules left as calls; ebnf_calls.py gives the bytes around those
calls that the matcher's walk needs.

Imports regex/, schema/ (a tag's JSON schemas) and index/json_holes.py (the call
placeholders). Does not import torch.
"""
