"""Token -> output bytes table and the outlines-core ``Vocabulary`` built from it.

A grammar works on the text a token *adds to the output*, not on its vocabulary string:
byte-level BPE tokens are written in GPT-2's printable byte alphabet ("Ġ" is a space),
sentencepiece-style tokens use "▁" for a space and ``<0x0A>`` byte-fallback pieces for raw
bytes. Getting this wrong silently lets a grammar allow the wrong tokens, so the table is
built once, carefully, and cached per tokenizer object (it takes seconds on 100k vocabs).

Supported tokenizers: a HF ``transformers`` fast tokenizer (anything exposing
``backend_tokenizer``) or a raw ``tokenizers.Tokenizer``.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from treadle.constrained.index.index_markers import MARKERS, marker_token_ids
from treadle.constrained.index.json_holes import PLACEHOLDERS, placeholder_vocabulary

__all__ = ["token_bytes_table", "build_vocabulary", "gpt2_byte_decoder", "lazy_tokens", "per_table"]

_BYTE_FALLBACK_RE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_CACHE_SIZE = 8
_cache_lock = threading.Lock()
# key -> (tokenizer kept alive so its id() cannot be reused, value)
_table_cache: OrderedDict[int, tuple[Any, list[bytes | None]]] = OrderedDict()
_vocab_cache: OrderedDict[tuple[int, tuple[int, ...]], tuple[Any, Any]] = OrderedDict()
_derived_cache: OrderedDict[tuple[Any, int, int], tuple[Any, Any]] = OrderedDict()


def gpt2_byte_decoder() -> dict[str, int]:
    """Map each printable character of GPT-2's byte-level alphabet back to its byte."""
    # Printable latin-1 bytes stand for themselves; the other 68 bytes are shifted to
    # code points 256.. in order, which is how byte-level BPE keeps vocab strings printable.
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping: dict[str, int] = {chr(b): b for b in printable}
    shift = 0
    for b in range(256):
        if b not in printable:
            mapping[chr(256 + shift)] = b
            shift += 1
    return mapping


def _backend(tokenizer: Any) -> Any:
    """Return the ``tokenizers.Tokenizer`` behind a HF tokenizer (or the object itself)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend
    if hasattr(tokenizer, "to_str") and hasattr(tokenizer, "id_to_token"):
        return tokenizer
    raise ValueError(
        f"unsupported tokenizer {type(tokenizer).__name__}: pass a transformers fast "
        "tokenizer (with .backend_tokenizer) or a tokenizers.Tokenizer"
    )


def _decoder_steps(backend: Any) -> list[dict]:
    """Flatten the backend's decoder config (a Sequence or a single decoder) to a list."""
    config = json.loads(backend.to_str()).get("decoder") or {}
    if config.get("type") == "Sequence":
        return list(config.get("decoders", []))
    return [config] if config else []


def _num_tokens(tokenizer: Any, backend: Any) -> int:
    if backend is tokenizer:
        return int(backend.get_vocab_size(with_added_tokens=True))
    return len(tokenizer)


def _added_tokens(tokenizer: Any, backend: Any) -> dict[int, Any]:
    """id -> AddedToken for tokens added on top of the model vocabulary."""
    if backend is tokenizer:
        return dict(backend.get_added_tokens_decoder())
    return dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})


def _compute_table(tokenizer: Any) -> list[bytes | None]:
    backend = _backend(tokenizer)
    steps = _decoder_steps(backend)
    kinds = {s.get("type") for s in steps}
    byte_level = "ByteLevel" in kinds
    byte_fallback = "ByteFallback" in kinds
    # Plain string replacements ("▁" -> " ") and Metaspace both turn a marker into a space.
    replacements: list[tuple[str, str]] = []
    for s in steps:
        if s.get("type") == "Replace" and "String" in (s.get("pattern") or {}):
            replacements.append((s["pattern"]["String"], s.get("content", "")))
        elif s.get("type") == "Metaspace":
            replacements.append((s.get("replacement", "▁"), " "))
    byte_decoder = gpt2_byte_decoder() if byte_level else {}

    added = _added_tokens(tokenizer, backend)
    n = _num_tokens(tokenizer, backend)
    table: list[bytes | None] = [None] * n
    for tid in range(n):
        if tid in added:
            tok = added[tid]
            # Special/control tokens never appear in grammar-constrained text; a normal
            # added token decodes to its literal content.
            table[tid] = None if getattr(tok, "special", True) else str(tok.content).encode("utf-8")
            continue
        piece = backend.id_to_token(tid)
        if piece is None:
            continue  # hole in the id space
        if byte_level:
            # A character outside the byte alphabet would mean a non byte-level token;
            # fall back to its UTF-8 bytes rather than guessing.
            out = bytearray()
            for ch in piece:
                b = byte_decoder.get(ch)
                if b is None:
                    out += ch.encode("utf-8")
                else:
                    out.append(b)
            table[tid] = bytes(out)
            continue
        if byte_fallback:
            m = _BYTE_FALLBACK_RE.match(piece)
            if m:
                table[tid] = bytes([int(m.group(1), 16)])
                continue
        for old, new in replacements:
            piece = piece.replace(old, new)
        table[tid] = piece.encode("utf-8")
    return table


def _lookup(cache: OrderedDict, key: Any, owner: Any) -> Any:
    """The value cached under ``key`` for ``owner`` (the object whose id is in the key), or None."""
    with _cache_lock:
        hit = cache.get(key)
        if hit is not None and hit[0] is owner:
            cache.move_to_end(key)
            return hit[1]
    return None


def _store(cache: OrderedDict, key: Any, owner: Any, value: Any) -> Any:
    """Cache ``value`` under ``key`` (``owner`` kept alive with it), least recently used out first."""
    with _cache_lock:
        cache[key] = (owner, value)
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
    return value


def per_table(factory: Any, table: list[bytes | None], num_tokens: int) -> Any:
    """``factory(table, num_tokens)``, built once per bytes table (a decode-time index over the
    vocabulary: constrained/decode/json_keys.py's and unique_items.py's), least recently used
    out first as the tables are."""
    key = (factory, id(table), num_tokens)
    hit = _lookup(_derived_cache, key, table)
    return hit if hit is not None else _store(_derived_cache, key, table, factory(table, num_tokens))


def _indexed_tokens(table: list[bytes | None], eos: tuple[int, ...]) -> Any:
    """(bytes, id) of every token a token index knows: the real ones with bytes but the EOS ids,
    then the placeholder pseudo-tokens (json_holes.py), then the markers' (index_markers.py)."""
    eos_set = set(eos)
    for tid, b in enumerate(table):
        if b and tid not in eos_set:
            yield b, tid
    for b, ids in placeholder_vocabulary(len(table)).items():
        for i in ids:
            yield b, i
    for c, i in zip(MARKERS, marker_token_ids(len(table), len(PLACEHOLDERS))):
        yield c.encode(), i


def token_bytes_table(tokenizer: Any) -> list[bytes | None]:
    """Return, for every id < len(tokenizer), the exact bytes the token adds to decoded text.

    ``None`` marks special / control tokens, which a grammar never allows. The result is
    cached per tokenizer object (the object is kept alive by the cache) and must not be
    mutated by callers.
    """
    hit = _lookup(_table_cache, id(tokenizer), tokenizer)
    return hit if hit is not None else _store(_table_cache, id(tokenizer), tokenizer, _compute_table(tokenizer))


def build_vocabulary(tokenizer: Any, eos_token_ids: list[int]) -> tuple[Any, list[bytes | None]]:
    """Build an ``outlines_core.Vocabulary`` for ``tokenizer`` plus its token bytes table.

    Requires at least one EOS id. EOS ids are left out of the token map (outlines-core
    requires it; the matcher handles every EOS id itself) and the first one is the
    vocabulary's EOS. Tokens with identical bytes share one key. The placeholder
    pseudo-tokens of json_holes.py are added (ids from ``len(table)`` on), then the index
    markers' (index_markers.py). Cached per
    (tokenizer object, eos ids).
    """
    from outlines_core import Vocabulary

    eos = tuple(int(e) for e in eos_token_ids)
    if not eos:
        raise ValueError("build_vocabulary needs at least one EOS token id (eos_token_ids=[])")
    key = (id(tokenizer), eos)
    hit = _lookup(_vocab_cache, key, tokenizer)
    if hit is not None:
        return hit
    table = token_bytes_table(tokenizer)
    groups: dict[bytes, list[int]] = {}
    for b, tid in _indexed_tokens(table, eos):
        groups.setdefault(b, []).append(tid)
    vocab = Vocabulary(eos[0], groups)
    _store(_vocab_cache, key, tokenizer, (vocab, table))
    return vocab, table


_lazy_cache: OrderedDict[tuple[int, tuple[int, ...]], tuple[Any, Any]] = OrderedDict()


def lazy_tokens(table: list[bytes | None], eos_token_ids: list[int] | tuple[int, ...]) -> Any:
    """The vocabulary of a lazy token index (lazy_index.TokenArrays): the same tokens as
    ``build_vocabulary`` gives outlines-core (every real token with bytes but the EOS ids, the
    placeholder pseudo-tokens, the index markers' pseudo-tokens). Cached per (table, eos ids)."""
    from treadle.constrained.index.lazy_index import TokenArrays

    eos = tuple(int(e) for e in eos_token_ids)
    key = (id(table), eos)
    hit = _lookup(_lazy_cache, key, table)
    if hit is not None:
        return hit
    return _store(_lazy_cache, key, table, TokenArrays({i: b for b, i in _indexed_tokens(table, eos)}))
