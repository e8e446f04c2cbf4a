"""Keyword-overlap retrieval over examples/data/corpus.txt (for the RAG and agent examples)."""
from __future__ import annotations

import os
import re

_STOP = set("a an the of in on at to is was by and or for from who what where which when how its it".split())
CORPUS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus.txt")


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def load_corpus(path: str = CORPUS_PATH) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def retrieve(query: str, corpus: list[str], k: int = 1, exclude: tuple[str, ...] = ()) -> list[str]:
    """The k passages sharing the most words with `query` (ties: corpus order)."""
    q = _words(query)
    ranked = sorted((p for p in corpus if p not in exclude), key=lambda p: -len(q & _words(p)))
    return ranked[:k]
