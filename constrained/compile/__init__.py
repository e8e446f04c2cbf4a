"""Stage 4 of treadle.constrained: a request's spec -> a compiled grammar, cached.

Takes a ``GrammarSpec`` (grammar.py: regex, JSON schema, choices, EBNF or structural tag,
the cache key) and gives a ``CompiledGrammar`` (grammar.py) or a ``JsonAnyGrammar``
(index/json_any.py) that matchers share. compiler.py runs the translation (regex/, schema/,
ebnf/) and the index build (index/) in a worker process with a memory and time cap
(compile_worker.py, started as ``python -m treadle.constrained.compile.compile_worker``),
caches grammars in memory by bytes, and slow index builds on disk (disk_cache.py).

grammar.py makes a grammar's matcher (decode/) inside a function; compiler.py reads
decode/json_keys.py's schema check. Importing this package does not import torch.
"""
