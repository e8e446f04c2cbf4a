"""Prompt encoding: a tokenizer that adds BOS must not double the BOS a rendered chat
template already wrote (Llama 2/3 templates start with it)."""
from __future__ import annotations

import os

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


def test_the_saved_copy_of_a_gguf_tokenizer_loads_without_the_model_registry():
    """A GGUF tokenizer's on-disk copy loads through the class it names, not AutoTokenizer,
    whose import of transformers' model registry cost each server process ~3 s of CPU; the
    tokenizer is the same one AutoTokenizer reads from the copy."""
    import os
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from treadle.runtime.gguf_loader import gguf_cache_dir
    from treadle.runtime.model_source import embedded_model_path, resolve_model_source
    from treadle.runtime.tokenizer import TOKENIZER_CACHE_DIR, load_tokenizer

    tok = load_tokenizer(resolve_model_source(None))  # made the copy, if no earlier load did
    auto = AutoTokenizer.from_pretrained(os.path.join(gguf_cache_dir(embedded_model_path()), TOKENIZER_CACHE_DIR),
                                         local_files_only=True)
    assert type(tok) is type(auto)
    assert tok.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    assert tok.chat_template == auto.chat_template and tok.special_tokens_map == auto.special_tokens_map
    # init_kwargs but where each was read from (a test's cache dir may not be the default one)
    same = {k: v for k, v in tok.init_kwargs.items() if k != "name_or_path"}
    assert tok.all_special_ids == auto.all_special_ids
    assert same == {k: v for k, v in auto.init_kwargs.items() if k != "name_or_path"}
    for text in ["Hello world", "<|im_start|>user\nhi<|im_end|>", " \u00e9\U0001F600 [[{"]:
        assert tok(text) == auto(text) and tok.decode(tok.encode(text)) == auto.decode(auto.encode(text))
    code = ("import sys\nfrom treadle.runtime.model_source import resolve_model_source\n"
            "from treadle.runtime.tokenizer import load_tokenizer\n"
            "assert load_tokenizer(resolve_model_source(None)).encode('Hi')\n"
            "print(sorted(m for m in sys.modules if m.startswith('transformers.models.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout  # AutoTokenizer imports transformers.models.auto and more


def test_the_process_that_makes_the_copy_holds_the_same_tokenizer_as_later_ones(tmp_path, monkeypatch):
    """A GGUF tokenizer loaded where no on-disk copy exists yet (a fresh cache dir) is the one a
    later process reads from the copy: the first load reads back the copy it saved. It was the
    tokenizer built from the GGUF, whose init_kwargs differ (seen when a test with its own cache
    dir loaded the embedded model's tokenizer first in a worker)."""
    from treadle.runtime.gguf_loader import gguf_cache_dir
    from treadle.runtime.model_source import embedded_model_path, resolve_model_source
    from treadle.runtime.tokenizer import TOKENIZER_CACHE_DIR, clear_tokenizer_cache, load_tokenizer

    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path))
    clear_tokenizer_cache()
    try:
        copy = os.path.join(gguf_cache_dir(embedded_model_path()), TOKENIZER_CACHE_DIR)
        assert copy.startswith(str(tmp_path)) and not os.path.exists(copy)
        first = load_tokenizer(resolve_model_source(None))  # makes the copy
        assert os.path.isfile(os.path.join(copy, "tokenizer_config.json"))
        clear_tokenizer_cache()
        later = load_tokenizer(resolve_model_source(None))  # reads it
        assert first is not later and type(first) is type(later)
        drop = {"name_or_path"}
        assert ({k: v for k, v in first.init_kwargs.items() if k not in drop}
                == {k: v for k, v in later.init_kwargs.items() if k not in drop})
        assert first.backend_tokenizer.to_str() == later.backend_tokenizer.to_str()
    finally:
        clear_tokenizer_cache()  # the next load reads the default cache dir's copy again
