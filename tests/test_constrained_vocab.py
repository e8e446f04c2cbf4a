"""Token bytes tables for byte-level BPE (SmolLM2) and a byte-fallback tokenizer."""

from __future__ import annotations

import random

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from treadle.constrained.index.vocabulary import build_vocabulary, gpt2_byte_decoder, token_bytes_table

PIECES = ["▁", "a", "b", "c", "▁a", "▁hello", "▁world", "he", "llo", "é", "{", "}", '"', ":", ",", '",', "▁ab"]


def make_byte_fallback_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A tiny sentencepiece-style (Unigram + byte fallback) tokenizer built by hand."""
    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)]
    vocab += [(f"<0x{i:02X}>", 0.0) for i in range(256)]
    vocab += [(p, -1.0) for p in PIECES]
    tk = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module")
def tiny():
    return make_byte_fallback_tokenizer()


def test_gpt2_byte_decoder_is_a_bijection():
    dec = gpt2_byte_decoder()
    assert len(dec) == 256 and sorted(dec.values()) == list(range(256))
    assert dec["Ġ"] == ord(" ") and dec["Ċ"] == ord("\n") and dec["A"] == ord("A")


def test_byte_level_tokens_decode_like_tokenizer(smol):
    table = token_bytes_table(smol)
    assert len(table) == len(smol) == 49152
    rng = random.Random(1234)
    ids = rng.sample(range(17, len(smol)), 2000)
    for tid in ids:
        b = table[tid]
        assert b is not None and b, tid
        assert b.decode("utf-8", errors="replace") == smol.decode([tid], clean_up_tokenization_spaces=False), tid
    # Sequences: joined bytes are exactly the decoded text (covers multi-token characters).
    for _ in range(50):
        seq = rng.sample(range(17, len(smol)), 8)
        joined = b"".join(table[t] for t in seq)
        text = smol.decode(seq, clean_up_tokenization_spaces=False)
        assert joined.decode("utf-8", errors="replace") == text
    enc = smol.encode("Hi \"x\",\n\tcafé 😀", add_special_tokens=False)
    assert b"".join(table[t] for t in enc) == "Hi \"x\",\n\tcafé 😀".encode()


def test_byte_level_special_tokens_are_none(smol):
    table = token_bytes_table(smol)
    for tid in smol.all_special_ids + list(range(17)):
        assert table[tid] is None
    assert table[smol.convert_tokens_to_ids("Ġ")] == b" "


def test_byte_fallback_table(tiny):
    table = token_bytes_table(tiny)
    assert len(table) == len(tiny)
    assert table[0] is None and table[1] is None and table[2] is None
    assert table[tiny.convert_tokens_to_ids("<0x0A>")] == b"\n"
    assert table[tiny.convert_tokens_to_ids("<0xC3>")] == b"\xc3"
    assert table[tiny.convert_tokens_to_ids("▁hello")] == b" hello"
    assert table[tiny.convert_tokens_to_ids("é")] == "é".encode()
    text = "a hello world\n😀é ab"
    ids = tiny.encode(text, add_special_tokens=False)
    assert any(tiny.convert_ids_to_tokens(i).startswith("<0x") for i in ids)  # byte fallback used
    joined = b"".join(table[i] for i in ids).decode()
    # The sentencepiece decoder strips the one leading space the encoder prepended.
    assert joined == " " + text and tiny.decode(ids) == text


def test_raw_tokenizers_object_supported(tiny):
    raw = tiny.backend_tokenizer
    assert token_bytes_table(raw) == token_bytes_table(tiny)


def test_build_vocabulary_excludes_eos_and_caches(smol, tiny, monkeypatch):
    from treadle.constrained.index import vocabulary

    vocab, table = build_vocabulary(smol, [2])

    def no_build(*a, **k):
        raise AssertionError("built again: the cache missed")

    with monkeypatch.context() as m:  # the work is done once per tokenizer: a hit builds nothing
        m.setattr(vocabulary, "_compute_table", no_build)
        m.setattr(vocabulary, "_indexed_tokens", no_build)
        vocab2, table2 = build_vocabulary(smol, [2])
        assert table is token_bytes_table(smol)
    assert vocab2 is vocab and table2 is table
    assert vocab.get_eos_token_id() == 2
    assert vocab.get(b" ") == [smol.convert_tokens_to_ids("Ġ")]
    # Tiny tokenizer: "<0x22>" and '"' both contribute b'"' -> grouped under one key.
    tv, ttable = build_vocabulary(tiny, [2])
    quote_ids = sorted(tv.get(b'"'))
    assert quote_ids == sorted([tiny.convert_tokens_to_ids("<0x22>"), tiny.convert_tokens_to_ids('"')])
    assert tv.get(b"") is None
    with pytest.raises(ValueError, match="EOS"):
        build_vocabulary(smol, [])


def test_unsupported_tokenizer_rejected():
    with pytest.raises(ValueError, match="unsupported tokenizer"):
        token_bytes_table(object())
