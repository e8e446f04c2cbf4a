"""Stage 3 of treadle.constrained: a regex over the tokenizer's vocabulary.

Takes a regex (marked with index_markers.py's start and end code points) and the tokenizer,
and gives what a matcher walks token by token:

- vocabulary.py: each token's output bytes, and the outlines-core ``Vocabulary`` built from
  them (with a pseudo-token per marker and placeholder);
- lazy_index.py: the token index built lazily (a byte NFA whose DFA states and token masks
  are made on demand), or outlines-core's ``Index``, both read through index_markers.py;
  grammar_size.py estimates an outlines-core index's size before it is built;
- json_any.py: the pushdown automaton for any JSON, which a regex cannot write, and
  json_holes.py: the holes and calls by which a regex hands over to it (or to a recursive
  definition) mid-output.

The private code points that translators write (index markers, ordered members, hole and
call placeholders) are defined here, in index_markers.py and json_holes.py; schema/ and ebnf/
import those. Importing this package does not import torch.
"""
