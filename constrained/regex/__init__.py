"""Stage 1 of treadle.constrained: the regex dialect every constraint is written in.

Takes a user's regex, a JSON Schema ``pattern`` (ECMA-262) or the pieces a translator needs
(literals, choices, JSON strings and formats, free text that avoids a set of strings); gives
regex text in treadle's small dialect, which means the same thing in Python ``re``,
outlines-core and interegular (regex_text.py says what it allows). Also the character-FSM
tools the translators use: interegular's product crawl made linear (fsm_crawl.py) and a
character FSM written back as a regex (fsm_regex.py).

Imports nothing of the later stages at import time (regex_ecma.py reads one helper of
schema/json_schema.py inside a function). Importing it does not import torch.
"""
