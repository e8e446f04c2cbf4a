"""Prompt encoding: a tokenizer that adds BOS must not double the BOS a rendered chat
template already wrote (Llama 2/3 templates start with it)."""
from __future__ import annotations

import pytest

from treadle.runtime.tokenizer import encode_prompt


@pytest.fixture(scope="module")
def bos_adding_tokenizer():
    """A tiny fast tokenizer whose post-processor prepends <s>, as Llama 3's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "hello": 2, "world": 3, "[UNK]": 4}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="[UNK]")


def test_a_text_starting_with_bos_gets_one_bos(bos_adding_tokenizer):
    tok = bos_adding_tokenizer
    assert tok.encode("<s>hello world") == [0, 0, 2, 3]  # what the tokenizer alone does
    assert encode_prompt(tok, "<s>hello world") == [0, 2, 3]
    assert encode_prompt(tok, "hello world") == [0, 2, 3]
    # BOS written twice on purpose stays twice; a BOS later in the text is the text's
    assert encode_prompt(tok, "<s><s>hello") == [0, 0, 2]
    assert encode_prompt(tok, "hello <s>") == [0, 2, 0]


def test_a_tokenizer_without_bos_is_left_alone():
    from treadle.runtime.model_source import resolve_model_source
    from treadle.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model_source(None))  # the embedded SmolLM2: adds nothing
    text = "<|im_start|>user\nHi<|im_end|>"
    assert encode_prompt(tok, text) == tok.encode(text)
