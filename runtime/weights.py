"""Weight loading: stream (HF name, tensor) pairs from safetensors dirs or cached GGUF.

- kind "hf": every `*.safetensors` shard (through the index json when there is one), read
  lazily with `safetensors.safe_open`, one tensor at a time.
- kind "gguf": dequantized once (`gguf_loader`), cached as float32 safetensors under
  `<cache_root>/gguf/<key>/model.safetensors`; later loads read the cache (mmap, fast).
- kind "dummy": nothing to load; the caller runs `init_dummy_weights` on its model.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import time
from typing import Iterator

import torch

from treadle.runtime.gguf_loader import atomic_write_file, gguf_cache_dir, load_gguf_state_dict
from treadle.runtime.model_source import ModelSource

GGUF_CACHE_FILE = "model.safetensors"


@dataclasses.dataclass
class LoadReport:
    """Timings of one weight load, for the caller to log; final once the iterator is exhausted.

    convert_s: seconds spent dequantizing a GGUF (0 when the cache was hit or not GGUF).
    load_s: seconds spent reading tensors (excludes the caller's own work between items).
    from_cache: True when a GGUF was served from its converted safetensors cache.
    """

    kind: str = ""
    path: str = ""
    num_tensors: int = 0
    convert_s: float = 0.0
    load_s: float = 0.0
    from_cache: bool = False
    cache_path: str | None = None


def gguf_cache_path(source: ModelSource) -> str:
    """Where the converted float32 safetensors of a GGUF source live (may not exist yet)."""
    if source.kind != "gguf":
        raise ValueError(f"gguf_cache_path needs a GGUF model source, got kind {source.kind!r}; pass a .gguf source")
    return os.path.join(gguf_cache_dir(source.path), GGUF_CACHE_FILE)


def load_weights(
    source: ModelSource, dtype: torch.dtype, report: LoadReport | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF parameter name, tensor cast to `dtype`) for every weight of `source`
    (a quantized checkpoint's packed, FP8 and scale tensors keep their dtype).

    Tensors are on CPU. `lm_head.weight` is skipped when embeddings are tied and rotary
    `inv_freq` buffers are skipped. Pass a `LoadReport` to receive timings. Raises
    ValueError for a directory with no safetensors (e.g. only .bin files) or a broken GGUF.
    """
    # Setup (listing shards, converting a GGUF) runs now, so errors surface at the call.
    report = report if report is not None else LoadReport()
    report.kind, report.path = source.kind, source.path
    if source.kind == "dummy":
        return iter(())
    if source.kind == "gguf":
        pairs = _gguf_tensors(source, report)
    elif source.kind == "hf":
        pairs = _safetensors_tensors(_safetensors_files(source.path))
    else:
        raise ValueError(f"unknown model source kind {source.kind!r}; build sources with resolve_model_source")
    return _stream(pairs, dtype, source.config.tie_word_embeddings, report)


def _stream(
    pairs: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype, tied: bool, report: LoadReport
) -> Iterator[tuple[str, torch.Tensor]]:
    """Cast, filter and time the raw (name, tensor) pairs."""
    while True:
        t0 = time.perf_counter()
        item = next(pairs, None)
        if item is not None:
            item = (item[0], _cast(item[0], item[1], dtype))
        report.load_s += time.perf_counter() - t0
        if item is None:
            return
        name = item[0]
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        report.num_tensors += 1
        yield item


# quantized checkpoints' scales keep their own dtype (the layer's loader casts them, to fp32
# for FP8); packed integer and FP8 tensors are never cast
_KEEP_DTYPE_SUFFIXES = (".weight_scale", ".input_scale", ".scales")


def _cast(name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not t.is_floating_point() or t.element_size() == 1 or name.endswith(_KEEP_DTYPE_SUFFIXES):
        return t
    return t.to(dtype)


def load_state_dict(source: ModelSource, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """All of `load_weights` in one dict, with its report (convenient for tests and small models)."""
    report = LoadReport()
    return dict(load_weights(source, dtype, report)), report


def _safetensors_files(path: str) -> list[str]:
    """The safetensors shards of an HF dir, in index order when an index exists."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            try:
                weight_map = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{index} is not valid JSON ({e}); download it again") from e
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index} has no `weight_map` of tensor names to shard files; download it again")
        files = [os.path.join(path, name) for name in dict.fromkeys(weight_map.values())]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise ValueError(f"{index} names shards that are missing: {missing[:3]}; download the complete checkpoint")
        return files
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        return files
    if glob.glob(os.path.join(path, "*.bin")) or glob.glob(os.path.join(path, "*.pt*")):
        raise ValueError(
            f"{path!r} holds only PyTorch .bin/.pt weights; treadle loads safetensors only — convert them "
            "(e.g. model.save_pretrained(dir, safe_serialization=True)) or download the safetensors files"
        )
    raise ValueError(f"{path!r} has no *.safetensors weight files; download them next to config.json")


def _safetensors_tensors(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in files:
        try:
            f = safe_open(file, framework="pt")
        except Exception as e:  # noqa: BLE001 - safetensors' own error type: the file's, named
            raise ValueError(f"cannot read {file!r} as safetensors ({type(e).__name__}: {e}); check that the file "
                             "is complete (download it again)") from e
        with f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _gguf_tensors(source: ModelSource, report: LoadReport) -> Iterator[tuple[str, torch.Tensor]]:
    """Serve from the safetensors cache, converting (and writing the cache) on a miss."""
    from safetensors.torch import save_file

    cache = gguf_cache_path(source)
    report.cache_path = cache
    if os.path.isfile(cache):
        report.from_cache = True
        return _safetensors_tensors([cache])
    t0 = time.perf_counter()
    state = load_gguf_state_dict(source.path, source.config)
    atomic_write_file(cache, lambda tmp: save_file(state, tmp, metadata={"format": "pt", "source": source.path}))
    report.convert_s = time.perf_counter() - t0
    # Serve this load from memory; the cache is for the next process.
    return iter(list(state.items()))


def init_dummy_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Fill every parameter of `model` in place: normal(0, 0.02), norm weights with 1.0.

    Deterministic for a given seed, model and device (one generator per device, parameters
    visited in registration order). Norm weights are recognised by "norm" in their name.
    """
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.rsplit(".", 1)[0].rsplit(".", 1)[-1]:
                p.fill_(1.0)
                continue
            if p.device not in generators:
                generators[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            p.normal_(0.0, 0.02, generator=generators[p.device])
