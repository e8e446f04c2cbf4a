"""GGUF files: read the model config from the metadata and dequantize the weights.

llama.cpp's GGUF stores tensors under its own names (`blk.3.attn_q.weight`), with the dims
listed innermost-first, often quantized, and — for `llama`-architecture files — with the
rows of Q and K permuted so its rotary kernel sees (re, im) pairs side by side. This module
undoes all of that and yields float32 tensors under the HF Llama/Qwen parameter names.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from treadle.runtime.model_config import SUPPORTED_ARCHITECTURES, ModelConfig

if TYPE_CHECKING:  # torch is imported where a tensor is made: resolving a model source (the
    import torch   # server's first step, before it starts its processes) reads no tensor

# GGUF `general.architecture` -> HF architecture.
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# GGUF per-layer tensor part -> HF per-layer module path.
_LAYER_PARTS: dict[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors llama.cpp keeps that have no HF parameter (their content lives in the config).
_IGNORED = {"rope_freqs.weight"}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def cache_root() -> str:
    """The treadle cache root: `$TREADLE_CACHE_DIR`, else `~/.cache/treadle`."""
    return os.environ.get("TREADLE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "treadle")


def gguf_cache_dir(path: str) -> str:
    """The cache folder for one GGUF file: `<cache_root>/gguf/<key>`.

    The key hashes the absolute path, size and mtime, so editing or replacing the file
    invalidates its cache. The folder is not created here.
    """
    st = os.stat(path)
    ident = f"treadle-gguf-v1|{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    return os.path.join(cache_root(), "gguf", hashlib.sha256(ident.encode()).hexdigest()[:24])


def open_gguf(path: str) -> Any:
    """Open a GGUF file with `gguf.GGUFReader`; ValueError if it is missing or not GGUF."""
    import gguf  # deferred: importing gguf costs time and most runs never read one

    if not os.path.isfile(path):
        raise ValueError(f"GGUF file {path!r} does not exist; pass the path of an existing .gguf file")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - a malformed file fails the parser anywhere (a header cut short: IndexError)
        raise ValueError(f"cannot read {path!r} as GGUF ({type(e).__name__}: {e}); check that the file is a complete "
                         "GGUF v2/v3 file") from e


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_gguf_config(path: str, reader: Any | None = None) -> ModelConfig:
    """Build a ModelConfig from a GGUF file's metadata.

    Requires `general.architecture` to be llama, qwen2 or qwen3; raises ValueError otherwise
    or when a key the model needs is missing.
    """
    reader = reader if reader is not None else open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF file {path!r} has general.architecture={arch!r}; treadle reads GGUF models of "
            f"architectures {sorted(GGUF_ARCHITECTURES)} (HF: {sorted(SUPPORTED_ARCHITECTURES)}) — use one of those"
        )

    def need(key: str) -> Any:
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"GGUF file {path!r} lacks metadata key {arch}.{key}; re-convert it with a recent llama.cpp")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", heads))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", 0) or hidden // heads)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else int(need("vocab_size"))
    tensor_names = {t.name for t in reader.tensors}
    theta = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    max_pos = int(need("context_length"))
    eos = [_field(reader, k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=theta,
        rope_scaling=_gguf_rope_scaling(path, reader, arch, head_dim, theta),
        max_position_embeddings=max_pos,
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos if e is not None)),
    )


def _llama3_factors(head_dim: int, theta: float, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    """Per-frequency divisors of Llama-3 RoPE scaling, [head_dim // 2] (1 = unscaled)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
    # smooth=1 (short wavelengths) keeps the frequency, smooth=0 divides it by `factor`.
    return 1.0 / ((1.0 - smooth) / factor + smooth)


def _gguf_rope_scaling(path: str, reader: Any, arch: str, head_dim: int, theta: float) -> dict | None:
    """Rope scaling from `<arch>.rope.scaling.*`, or Llama-3 scaling recovered from `rope_freqs`."""
    kind = _field(reader, f"{arch}.rope.scaling.type")
    if kind not in (None, "none"):
        # Linear is the only GGUF-tagged type the model implements; others fail in ModelConfig.
        return {"rope_type": kind, "factor": float(_field(reader, f"{arch}.rope.scaling.factor", 1.0))}
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is None:
        return None
    # llama.cpp bakes Llama-3 scaling into this tensor; every Llama 3.x uses low 1, high 4,
    # original context 8192, so recover `factor` and check the whole curve matches.
    got = np.asarray(freqs.data, dtype=np.float64).reshape(-1)
    params = {"rope_type": "llama3", "factor": float(got.max()), "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    want = _llama3_factors(head_dim, theta, params["factor"], 1.0, 4.0, 8192)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-3):
        raise ValueError(
            f"GGUF file {path!r} has a rope_freqs tensor that is not standard Llama-3 scaling; "
            "treadle cannot reproduce it — load the HF safetensors checkpoint instead"
        )
    return params


def hf_name(gguf_name: str) -> str | None:
    """Map a GGUF tensor name to its HF name; None for tensors with no HF parameter."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name in _IGNORED:
        return None
    m = _LAYER_RE.match(gguf_name)
    if m is None or m.group(2) not in _LAYER_PARTS:
        raise ValueError(
            f"GGUF tensor {gguf_name!r} has no HF Llama/Qwen counterpart; this file holds a "
            "model variant treadle does not implement — use a plain Llama/Qwen2/Qwen3 GGUF"
        )
    layer, part, kind = m.groups()
    return f"model.layers.{layer}.{_LAYER_PARTS[part]}.{kind}"


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation for one projection weight [n_heads*head_dim, in].

    HF rotary pairs row j with row j + head_dim/2 inside each head; llama.cpp's converter
    reorders the rows of a head from [half 0 | half 1] to interleaved pairs (h0[0], h1[0],
    h0[1], h1[1], ...), i.e. view (n_heads, 2, hd/2, in) -> swap dims 1,2. Undo that swap.
    """
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _dequantize(tensor: Any, path: str) -> torch.Tensor:
    """One GGUF tensor -> float32 torch tensor in the HF (outermost-first) shape."""
    import gguf

    qtype = tensor.tensor_type
    if qtype.name in ("I8", "I16", "I32", "I64"):
        raise ValueError(
            f"GGUF tensor {tensor.name!r} in {path!r} has integer type {qtype.name}, not a weight "
            "format; use a GGUF with float or quantized weights"
        )
    try:
        arr = gguf.quants.dequantize(tensor.data, qtype)
    except NotImplementedError as e:
        raise ValueError(
            f"GGUF tensor {tensor.name!r} in {path!r} uses quantization {qtype.name}, which the "
            f"installed gguf package cannot dequantize ({e}); re-quantize the model to Q8_0, "
            "Q4_K, Q6_K or F16, or upgrade `gguf`"
        ) from e
    # GGUF lists dims innermost-first: [in, out] on disk is HF's [out, in].
    shape = tuple(int(n) for n in reversed(tensor.shape))
    arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(shape)
    import torch

    # Copy memmap-backed arrays so the tensor outlives the reader and is writable.
    return torch.from_numpy(arr if arr.flags.owndata else arr.copy())


def load_gguf_state_dict(path: str, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Dequantize every weight of a GGUF file into float32 tensors under HF names.

    Requires `config` read from the same file (`read_gguf_config`). Raises ValueError for an
    unsupported quantization or a tensor with no HF counterpart; nothing partial is returned.
    """
    reader = open_gguf(path)
    permuted = _field(reader, "general.architecture") == "llama"
    out: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        w = _dequantize(tensor, path)
        if permuted and name.endswith("self_attn.q_proj.weight"):
            w = unpermute_qk(w, config.num_heads)
        elif permuted and name.endswith("self_attn.k_proj.weight"):
            w = unpermute_qk(w, config.num_kv_heads)
        out[name] = w
    _check_complete(out, config, path)
    return out


def expected_names(config: ModelConfig) -> set[str]:
    """Every HF parameter name a model with `config` has (what a checkpoint must provide)."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config.tie_word_embeddings:
        names.add("lm_head.weight")
    parts = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
    if config.qk_norm:
        parts += ["self_attn.q_norm", "self_attn.k_norm"]
    for i in range(config.num_layers):
        names.update(f"model.layers.{i}.{p}.weight" for p in parts)
        if config.attention_bias:
            # Qwen2 biases q/k/v only; HF Llama/Qwen3 with attention_bias also bias o_proj.
            biased = "qkv" if config.architecture == "Qwen2ForCausalLM" else "qkvo"
            names.update(f"model.layers.{i}.self_attn.{p}_proj.bias" for p in biased)
    return names


def _check_complete(state: dict[str, torch.Tensor], config: ModelConfig, path: str) -> None:
    missing = sorted(expected_names(config) - state.keys())
    if missing:
        raise ValueError(
            f"GGUF file {path!r} lacks {len(missing)} tensors the model needs (first: {missing[:3]}); "
            "the file is truncated or was converted from a different architecture"
        )


def atomic_write_file(final_path: str, write: Callable[[str], None]) -> None:
    """Write a file so readers never see it half-written: `write(tmp)` then rename.

    Creates the parent folder. The temporary file sits in the same folder (same
    filesystem, so the rename is atomic) and is removed if `write` raises.
    """
    folder = os.path.dirname(final_path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(final_path))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, final_path)
    except BaseException:
        os.unlink(tmp)
        raise


def atomic_write_dir(final_path: str, write: Callable[[str], None]) -> None:
    """Fill a folder atomically: `write(tmp_dir)` then rename it to `final_path`.

    If another process created `final_path` meanwhile, its copy is kept and ours dropped.
    """
    parent = os.path.dirname(final_path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-")
    try:
        write(tmp)
        try:
            os.rename(tmp, final_path)
        except OSError:
            if not os.path.isdir(final_path):
                raise
            shutil.rmtree(tmp)  # another process finished first; its copy is equivalent
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
