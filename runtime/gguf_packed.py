"""A GGUF model on the CPU served from its quantized blocks, not dequantized to float32.

`load_packed(model, source, config)` fills a freshly built LlamaForCausalLM from a GGUF file:
every Q4_0 / Q4_1 / Q8_0 linear becomes a `PackedLinear` (the embedded SmolLM2: Q4_1 layers,
a Q8_0 embedding table tied to the LM head), so the weights take ~100 MB instead of ~540 MB
and a decode step reads a fifth of the bytes. Tensors of other types (F32 norms, F16, the
K-quants) are dequantized as before and loaded through the model's own loaders.

Products of at most `PACKED_MAX_ROWS` rows (decode steps) run the packed kernels of
`cpu_quant.c`; larger ones (prefill) dequantize the layer's weight into a reused scratch
buffer and run the dense fp32 matmul, which is faster there (benchmarks in docs/quantization.md).
`EngineArgs.gguf_dequantize` (`--gguf-dequantize`) keeps the old float32 path.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Union

import numpy as np
import torch
from torch import nn

from treadle.runtime import cpu_quant as cq
from treadle.runtime.gguf_loader import (
    _check_complete, _dequantize, _field, atomic_write_file, gguf_cache_dir, hf_name, open_gguf, unpermute_qk,
)
from treadle.runtime.model_config import ModelConfig
from treadle.runtime.models import ops

log = logging.getLogger("treadle")

# Rows up to which the packed kernel beats dequantize + fp32 GEMM (2-core EPYC, SmolLM2 shapes:
# 4 rows 25 vs 68 ms a token of matmuls, 8 rows 56 vs 82, 16 rows 142 vs 114; one thread)
PACKED_MAX_ROWS = 8
PACKED_TYPES = ("Q4_0", "Q4_1", "Q8_0")

Weight = Union[cq.PackedWeight, torch.Tensor]


def pack_gguf_tensor(tensor: Any) -> cq.PackedWeight:
    """A Q4_0 / Q4_1 / Q8_0 GGUF tensor -> PackedWeight in the HF [out, in] orientation."""
    kind = tensor.tensor_type.name
    n, k = (int(s) for s in reversed(tensor.shape))  # GGUF dims are innermost-first
    nb = k // 32
    raw = np.asarray(tensor.data, dtype=np.uint8).reshape(n, nb, -1)  # [N, K/32, block bytes]

    def half(lo: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(raw[:, :, lo:lo + 2]).view(np.float16)[..., 0].astype(np.float32))

    if kind == "Q8_0":  # block: fp16 d, 32 x int8
        qs = torch.from_numpy(np.ascontiguousarray(raw[:, :, 2:]).view(np.int8).reshape(n, k))
        return cq.PackedWeight("q8", qs, half(0), None, (n, k))
    if kind == "Q4_1":  # block: fp16 d, fp16 m, 16 bytes of nibbles
        d, m = half(0), half(2)
        qs = raw[:, :, 4:]
    elif kind == "Q4_0":  # block: fp16 d, 16 bytes of nibbles; w = (q - 8) d = q d + (-8 d), exactly
        d = half(0)
        m = -8.0 * d
        qs = raw[:, :, 2:]
    else:
        raise ValueError(f"GGUF type {kind} has no packed kernel; packed types are {PACKED_TYPES}")
    return cq.PackedWeight("q4", torch.from_numpy(np.ascontiguousarray(qs).reshape(n, k // 2)), d, m, (n, k))


def _permute_rows(w: Weight, n_heads: int) -> Weight:
    """llama.cpp's Q/K row order undone (unpermute_qk) on dense or packed rows."""
    if isinstance(w, torch.Tensor):
        return unpermute_qk(w, n_heads)
    rows = w.shape[0]
    order = unpermute_qk(torch.arange(rows).view(rows, 1), n_heads).view(-1)
    m = None if w.m is None else w.m.index_select(0, order)
    return cq.PackedWeight(w.kind, w.qs.index_select(0, order), w.d.index_select(0, order), m, w.shape)


PACKED_CACHE_FILE = "packed-v1.safetensors"


def read_gguf_weights(path: str, config: ModelConfig) -> dict[str, Weight]:
    """Every weight of a GGUF file under its HF name: PackedWeight for the packed types, float32
    tensors for the rest. Cached after the first read in the file's cache folder (parsing a
    GGUF header with a 49k-token vocabulary takes seconds). ValueError as
    `load_gguf_state_dict` for broken or foreign files."""
    cache = os.path.join(gguf_cache_dir(path), PACKED_CACHE_FILE)
    if os.path.isfile(cache):
        return _read_cache(cache)
    weights = _read_gguf(path, config)
    flat: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    for name, w in weights.items():
        if isinstance(w, torch.Tensor):
            flat[name] = w.contiguous()
            continue
        kinds[name] = f"{w.kind}:{w.shape[0]}:{w.shape[1]}"
        flat[f"{name}#qs"], flat[f"{name}#d"] = w.qs, w.d
        if w.m is not None:
            flat[f"{name}#m"] = w.m
    from safetensors.torch import save_file

    atomic_write_file(cache, lambda tmp: save_file(flat, tmp, metadata={"packed": json.dumps(kinds), "source": path}))
    return weights


def _read_cache(cache: str) -> dict[str, Weight]:
    from safetensors import safe_open

    out: dict[str, Weight] = {}
    with safe_open(cache, framework="pt") as f:
        kinds = json.loads(f.metadata()["packed"])
        keys = set(f.keys())
        for name in keys:
            if "#" not in name:
                out[name] = f.get_tensor(name)
        for name, spec in kinds.items():
            kind, n, k = spec.split(":")
            m = f.get_tensor(f"{name}#m") if f"{name}#m" in keys else None
            out[name] = cq.PackedWeight(kind, f.get_tensor(f"{name}#qs"), f.get_tensor(f"{name}#d"), m, (int(n), int(k)))
    return out


def _read_gguf(path: str, config: ModelConfig) -> dict[str, Weight]:
    reader = open_gguf(path)
    permuted = _field(reader, "general.architecture") == "llama"
    out: dict[str, Weight] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        packable = tensor.tensor_type.name in PACKED_TYPES and len(tensor.shape) == 2 and int(tensor.shape[0]) % 32 == 0
        w: Weight = pack_gguf_tensor(tensor) if packable else _dequantize(tensor, path)
        if permuted and name.endswith("self_attn.q_proj.weight"):
            w = _permute_rows(w, config.num_heads)
        elif permuted and name.endswith("self_attn.k_proj.weight"):
            w = _permute_rows(w, config.num_kv_heads)
        out[name] = w
    _check_complete(out, config, path)  # type: ignore[arg-type]
    return out


# ---- modules ---------------------------------------------------------------------------------

_scratch = threading.local()


def _dense_scratch(shape: tuple[int, int]) -> torch.Tensor:
    """A float32 buffer per shape and thread, reused by every layer's prefill dequantization
    (allocating 7 MB a call costs page faults on every layer)."""
    bufs = _scratch.__dict__.setdefault("bufs", {})
    if shape not in bufs:
        bufs[shape] = torch.empty(shape, dtype=torch.float32)
    return bufs[shape]


def packed_linear(lib: Any, x: torch.Tensor, w: cq.PackedWeight) -> torch.Tensor:
    """x [M, K] @ dequantize(w)^T, by the packed kernel (M <= PACKED_MAX_ROWS) or dequantize + GEMM."""
    if x.shape[0] <= PACKED_MAX_ROWS:
        return cq.matmul(lib, x, w)
    return ops.linear(x, cq.dequantize(lib, w, _dense_scratch(w.shape)))


class PackedLinear(nn.Module):
    """A linear layer on a packed weight (tp_size 1, float32 activations on the CPU)."""

    def __init__(self, lib: Any, weight: cq.PackedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.lib = lib
        self.packed = weight
        # a buffer, not a Parameter: the model's load_weights must not expect it from a checkpoint
        self.register_buffer("bias", bias, persistent=False)
        # the decode-step call with its weight arguments bound once: a step makes 120 of these
        # calls, and cq.matmul's checks and pointer look-ups cost ~15 us apiece at batch 1
        n, k = weight.shape
        if weight.kind == "q4":
            fn, wargs = lib.q4_matmul, (weight.qs.data_ptr(), weight.d.data_ptr(), weight.m.data_ptr(), n)
        else:
            fn, wargs = lib.q8_matmul, (weight.qs.data_ptr(), weight.d.data_ptr(), n)
        self._fn, self._wargs, self._n, self._k = fn, wargs, n, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dim() == 2 and 0 < x.shape[0] <= PACKED_MAX_ROWS and x.shape[1] == self._k
                and x.dtype == torch.float32 and x.is_contiguous()):
            y = torch.empty(x.shape[0], self._n)
            self._fn(x.data_ptr(), x.shape[0], self._k, *self._wargs, y.data_ptr(), torch.get_num_threads())
        else:
            y = packed_linear(self.lib, x.contiguous(), self.packed)
        return y if self.bias is None else y + self.bias

    def silu_and_mul(self, x: torch.Tensor, quant: object = None) -> torch.Tensor:
        """As ColumnParallelLinear.silu_and_mul, for a packed gate/up pair (LlamaMLP's gate_up_proj);
        on the CPU `quant` is never set (no input here is quantized per token)."""
        return ops.silu_and_mul(self(x))

    def input_quant(self, x: torch.Tensor) -> None:
        """As ColumnParallelLinear.input_quant: these weights take their input as it is."""
        return None

    def fuses_norm(self, x: torch.Tensor) -> bool:
        """As ColumnParallelLinear.fuses_norm: the packed CPU matmul takes its input normed."""
        return False

    def extra_repr(self) -> str:
        return f"{self.packed.kind}, out={self.packed.shape[0]}, in={self.packed.shape[1]}"


class PackedEmbedding(nn.Module):
    """Token embeddings looked up in a packed table (only the rows asked for are dequantized)."""

    def __init__(self, lib: Any, weight: cq.PackedWeight, vocab_size: int) -> None:
        super().__init__()
        self.lib = lib
        self.packed = weight
        self.vocab_size = vocab_size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return cq.embedding_ref(ids, self.packed)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """As an LM head: hidden [M, K] -> float32 logits [M, vocab], in packed 8-row chunks
        (the vocabulary-sized weight is never dequantized whole)."""
        x = hidden.float().contiguous()
        if x.shape[0] <= PACKED_MAX_ROWS:
            y = cq.matmul(self.lib, x, self.packed)
        else:
            y = torch.cat([cq.matmul(self.lib, c.contiguous(), self.packed) for c in x.split(PACKED_MAX_ROWS)])
        return y[:, : self.vocab_size]


# ---- loading -----------------------------------------------------------------------------------

def wanted(args: Any, source: Any, device: torch.device, dtype: torch.dtype, ctx: Any) -> bool:
    """Whether ModelRunner loads this model through `load_packed`: a GGUF source on the CPU in
    float32 at tp_size 1, no --gguf-dequantize, and no weight quantization of its own asked for."""
    return (source.kind == "gguf" and not args.gguf_dequantize and device.type == "cpu"
            and dtype == torch.float32 and ctx.size == 1 and getattr(args, "quantization", "auto") in ("auto", None))


def load_packed(model: nn.Module, path: str, config: ModelConfig) -> dict[str, int]:
    """Fill `model` (a LlamaForCausalLM as built, tp_size 1, float32, CPU) from the GGUF at `path`,
    its packed-type linears swapped for PackedLinear/PackedEmbedding. Returns counts of what was
    packed and what was dequantized. With no C compiler the packed weights are dequantized and
    loaded as the float32 path loads them (a warning says so)."""
    lib = cq.library()
    weights = read_gguf_weights(path, config)
    counts = {"packed": 0, "dense": 0}
    if lib is not None:
        for i, layer in enumerate(model.layers):
            pre = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            _swap(attn, "qkv_proj", lib, weights, [pre + f"self_attn.{p}_proj" for p in "qkv"], counts)
            _swap(attn, "o_proj", lib, weights, [pre + "self_attn.o_proj"], counts)
            _swap(mlp, "gate_up_proj", lib, weights, [pre + "mlp.gate_proj", pre + "mlp.up_proj"], counts)
            _swap(mlp, "down_proj", lib, weights, [pre + "mlp.down_proj"], counts)
        emb = weights.get("model.embed_tokens.weight")
        if isinstance(emb, cq.PackedWeight):
            model.embed_tokens = PackedEmbedding(lib, emb, config.vocab_size)
            del weights["model.embed_tokens.weight"]
            counts["packed"] += 1
            if config.tie_word_embeddings:
                model.lm_head = model.embed_tokens
        head = weights.get("lm_head.weight")
        if isinstance(head, cq.PackedWeight) and not config.tie_word_embeddings:
            model.lm_head = PackedEmbedding(lib, head, config.vocab_size)
            del weights["lm_head.weight"]
            counts["packed"] += 1
    rest = []
    for name, w in weights.items():
        rest.append((name, cq.dequantize_ref(w) if isinstance(w, cq.PackedWeight) else w))
    counts["dense"] = len(rest)
    model.load_weights(rest)
    return counts


def _swap(parent: nn.Module, attr: str, lib: Any, weights: dict[str, Weight], names: list[str],
          counts: dict[str, int]) -> None:
    """Replace parent.<attr> by a PackedLinear over the named weights (rows concatenated) when
    all of them are packed of one kind; otherwise leave the dense module to load them."""
    parts = [weights.get(n + ".weight") for n in names]
    if not all(isinstance(p, cq.PackedWeight) for p in parts) or len({p.kind for p in parts}) != 1:
        return
    biases = [weights.get(n + ".bias") for n in names]
    bias = None
    if any(b is not None for b in biases):
        if not all(b is not None for b in biases):
            return  # a bias on some parts only (o_proj-less Qwen2 layouts): leave it dense
        bias = torch.cat(biases).float()
    setattr(parent, attr, PackedLinear(lib, cq.cat_rows(parts), bias))
    for n in names:
        weights.pop(n + ".weight")
        weights.pop(n + ".bias", None)
    counts["packed"] += len(names)
