"""Model configuration: one frozen, hashable dataclass for every supported architecture.

`ModelConfig` is what the model code, the KV pool and the weight loaders agree on. It is
built from an HF `config.json` dict (`from_hf_dict`), from GGUF metadata
(`treadle.runtime.model_source`), or picked from `DUMMY_CONFIGS` for random-weight runs.
`to_hf_dict` goes the other way so tests can build the HF reference model with exactly the
same shapes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from treadle.runtime.quantization.config import QuantConfig, parse_quantization_config

SUPPORTED_ARCHITECTURES: frozenset[str] = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
     "Qwen3MoeForCausalLM", "MixtralForCausalLM"}
)
# mixtures of experts (runtime/models/moe.py): their MLPs are routed experts
MOE_ARCHITECTURES: frozenset[str] = frozenset({"Qwen3MoeForCausalLM", "MixtralForCausalLM"})

# HF `model_type` for each architecture (used when `architectures` is missing, and by
# `to_hf_dict` so `AutoConfig.for_model` picks the right config class).
_MODEL_TYPES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
}
_ARCH_BY_MODEL_TYPE: dict[str, str] = {v: k for k, v in _MODEL_TYPES.items()}

# Rope types the model code implements, with the keys each one needs besides rope_theta.
_ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}

RopeScaling = tuple[tuple[str, Any], ...]


def _freeze_rope_scaling(value: Mapping[str, Any] | RopeScaling | None) -> RopeScaling | None:
    """Normalise a rope-scaling mapping to a sorted tuple of items (hashable), None for default."""
    if value is None:
        return None
    items = dict(value)
    items.pop("rope_theta", None)
    if items.get("rope_type", "default") == "default":
        return None
    return tuple(sorted(items.items()))


def check_architecture(architecture: str) -> None:
    """Raise ValueError unless `architecture` is one of SUPPORTED_ARCHITECTURES."""
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; treadle supports "
            f"{sorted(SUPPORTED_ARCHITECTURES)} — use a model of one of these families"
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and hyper-parameters of a decoder-only Llama-family model.

    `rope_scaling` is None for plain RoPE, else a sorted tuple of (key, value) items that
    includes "rope_type" ("linear" or "llama3"); pass a dict and it is frozen for you.
    `rope_scaling_dict` gives it back as a dict. `eos_token_ids` lists every stop id.

    Mixtures of experts (num_experts > 0): a layer's MLP is num_experts experts of
    moe_intermediate_size, num_experts_per_tok of them per token, their weights renormalised
    to sum to 1 when norm_topk_prob; layers in mlp_only_layers, or not on the
    decoder_sparse_step grid, keep a dense MLP of intermediate_size (Qwen3-MoE's fields).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    hidden_act: str = "silu"
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # the checkpoint's own quantization (config.json's quantization_config), None for float
    # weights; --quantization can still quantize those at load (runtime/quantization)
    quantization: QuantConfig | None = None

    def __post_init__(self) -> None:
        check_architecture(self.architecture)
        # Frozen dataclass: normalise through object.__setattr__ so the result is hashable.
        object.__setattr__(self, "rope_scaling", _freeze_rope_scaling(self.rope_scaling))
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))
        if self.rope_scaling is not None:
            _check_rope(dict(self.rope_scaling))
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads="
                f"{self.num_kv_heads}; fix the model config (grouped-query attention needs it)"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}; fix the model config")
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
        if self.architecture in MOE_ARCHITECTURES:
            if not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ValueError(f"a mixture of experts needs 0 < num_experts_per_tok <= num_experts, got "
                                 f"{self.num_experts_per_tok} of {self.num_experts}; fix the model config")
            if self.moe_intermediate_size <= 0 or self.decoder_sparse_step <= 0:
                raise ValueError("moe_intermediate_size and decoder_sparse_step must be positive; fix the model config")

    def is_moe_layer(self, layer_id: int) -> bool:
        """Whether layer `layer_id`'s MLP is the routed experts (else a dense MLP)."""
        return (self.num_experts > 0 and layer_id not in self.mlp_only_layers
                and (layer_id + 1) % self.decoder_sparse_step == 0)

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        """The rope-scaling parameters as a plain dict (None for default RoPE)."""
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @property
    def model_type(self) -> str:
        """The HF `model_type` string of this architecture ("llama", "qwen3", ...)."""
        return _MODEL_TYPES[self.architecture]

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build a ModelConfig from an HF `config.json` dict (transformers 4 or 5 layout).

        Requires a Llama/Mistral/Qwen2/Qwen3 config; raises ValueError for an unknown
        architecture, an unsupported rope type, a real sliding window, or MLP biases.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a model config must be a JSON object, got {type(d).__name__}; fix or re-download it")
        archs = d.get("architectures") or []
        if not isinstance(archs, (list, tuple)) or not all(isinstance(a, str) for a in archs):
            raise ValueError(f"config `architectures` must be a list of names, got {archs!r:.80}")
        arch = archs[0] if archs else _ARCH_BY_MODEL_TYPE.get(d.get("model_type", ""), "")
        if not arch:
            raise ValueError(
                "config has neither `architectures` nor a known `model_type`; add "
                f"`architectures`: one of {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        check_architecture(arch)

        def integer(name: str, default: Any = None) -> int:
            """A size field: missing (with no default) or not a positive integer is a ValueError naming it."""
            v = d.get(name, default)
            if v is None:
                raise ValueError(f"config has no `{name}`, which a {arch} model needs; fix or re-download it")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, float) and not v.is_integer() \
                    or v < 1:
                raise ValueError(f"config `{name}` must be a positive integer, got {v!r:.80}; fix the model config")
            return int(v)

        hidden, heads = integer("hidden_size"), integer("num_attention_heads")
        max_pos = integer("max_position_embeddings", 2048)
        theta, scaling = _rope_from_hf(d)
        _check_sliding_window(d, max_pos)
        act = d.get("hidden_act", "silu")
        if act not in ("silu", "swish"):  # the MLP is SiLU-gated whatever the config says: refuse, not serve wrong
            raise ValueError(f"config sets hidden_act={act!r:.40}; treadle's {arch} MLP is SiLU-gated (hidden_act "
                             "'silu'), so this model cannot be served correctly")
        if d.get("mlp_bias"):
            raise ValueError("config sets mlp_bias=True, which treadle does not implement; use a model without MLP biases")
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else (tuple(eos) if isinstance(eos, (list, tuple)) else (eos,))
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in eos_ids):
            raise ValueError(f"config `eos_token_id` must be a token id or a list of them, got {eos!r:.80}")
        return cls(
            architecture=arch,
            vocab_size=integer("vocab_size"),
            hidden_size=hidden,
            intermediate_size=integer("intermediate_size"),
            num_layers=integer("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=integer("num_key_value_heads") if d.get("num_key_value_heads") else heads,
            head_dim=integer("head_dim") if d.get("head_dim") else hidden // heads,
            rms_norm_eps=_number(d, "rms_norm_eps", 1e-6, 0.0),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; the others say so in `attention_bias`.
            attention_bias=arch == "Qwen2ForCausalLM" or bool(d.get("attention_bias", False)),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            hidden_act="silu",
            quantization=parse_quantization_config(d.get("quantization_config")),
            **_moe_from_hf(arch, d),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF config dict describing the same model (`AutoConfig.for_model(**d)` accepts it)."""
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        rope.update(self.rope_scaling_dict or {})
        eos: int | list[int] | None = list(self.eos_token_ids) or None
        if eos is not None and len(eos) == 1:
            eos = eos[0]
        d: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "hidden_act": self.hidden_act,
        }
        if self.architecture in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            d["attention_bias"] = self.attention_bias
        if self.architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            d["use_sliding_window"] = False
        if self.architecture in ("MistralForCausalLM", "MixtralForCausalLM"):
            d["sliding_window"] = None
        if self.architecture == "Qwen3MoeForCausalLM":
            d.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                     moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=self.norm_topk_prob,
                     decoder_sparse_step=self.decoder_sparse_step, mlp_only_layers=list(self.mlp_only_layers))
        if self.architecture == "MixtralForCausalLM":
            d.update(num_local_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok)
        return d


def _moe_from_hf(arch: str, d: Mapping[str, Any]) -> dict[str, Any]:
    """The mixture-of-experts fields of an HF config (none for a dense architecture).
    Mixtral's experts are intermediate_size wide, on every layer, always renormalised."""
    if arch == "Qwen3MoeForCausalLM":
        layers = d.get("mlp_only_layers") or ()
        if not isinstance(layers, (list, tuple)) or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ValueError(f"config `mlp_only_layers` must be a list of layer numbers, got {layers!r:.80}")
        return dict(num_experts=_count(d, "num_experts" if d.get("num_experts") else "num_local_experts"),
                    num_experts_per_tok=_count(d, "num_experts_per_tok"),
                    moe_intermediate_size=_count(d, "moe_intermediate_size"),
                    norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                    decoder_sparse_step=_count(d, "decoder_sparse_step", 1),
                    mlp_only_layers=tuple(layers))
    if arch == "MixtralForCausalLM":
        return dict(num_experts=_count(d, "num_local_experts"),
                    num_experts_per_tok=_count(d, "num_experts_per_tok"),
                    moe_intermediate_size=_count(d, "intermediate_size"), norm_topk_prob=True)
    return {}


def _count(d: Mapping[str, Any], name: str, default: int = 0) -> int:
    """An integer field of a config (a missing or null one: `default`); anything else (a list,
    a string, 1.5, infinity) a ValueError naming it (was int()'s TypeError / OverflowError)."""
    v = d.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, float) and not v.is_integer():
        raise ValueError(f"config `{name}` must be an integer, got {v!r:.80}; fix the model config")
    return int(v)


def _number(d: Mapping[str, Any], name: str, default: float, low: float = -math.inf, above: bool = False) -> float:
    """A float field of a config (a missing or null one: `default`), finite and at least `low`
    (`above`: more than it); anything else a ValueError naming it (a negative rms_norm_eps or
    rope_theta, or a rope factor of 0, loaded, and every request failed on NaN logits)."""
    v = d.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"config `{name}` must be a number, got {v!r:.80}")
    if not math.isfinite(v) or v < low or above and v == low:
        raise ValueError(f"config `{name}` must be a finite number {'>' if above else '>='} {low:g}, got {v!r:.80}; "
                         "fix the model config")
    return float(v)


def _check_rope(params: Mapping[str, Any]) -> None:
    rope_type = params.get("rope_type", "default")
    if rope_type not in _ROPE_KEYS:
        raise ValueError(
            f"unsupported rope type {rope_type!r}; treadle implements {sorted(_ROPE_KEYS)} — "
            "use a model whose config has one of these"
        )
    missing = [k for k in _ROPE_KEYS[rope_type] if k not in params]
    if missing:
        raise ValueError(f"rope type {rope_type!r} needs {missing} in the rope parameters; add them to the config")


def _rope_from_hf(d: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Return (rope_theta, scaling dict or None) from `rope_parameters` (v5) or `rope_scaling` (v4)."""
    given = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(given, Mapping):
        raise ValueError(f"config `rope_scaling` / `rope_parameters` must be an object, got {given!r:.80}")
    params = dict(given)
    if "type" in params and "rope_type" not in params:  # older configs spell it "type"
        params["rope_type"] = params.pop("type")
    params.pop("type", None)
    theta = _number({"rope_theta": params.pop("rope_theta", d.get("rope_theta", 10000.0))}, "rope_theta", 10000.0,
                    0.0, above=True)
    params.setdefault("rope_type", "default")
    _check_rope(params)
    for k in _ROPE_KEYS[params["rope_type"]]:
        _number(params, k, 1.0, 0.0, above=True)
    keep = {"rope_type": params["rope_type"], **{k: params[k] for k in _ROPE_KEYS[params["rope_type"]]}}
    return theta, (None if params["rope_type"] == "default" else keep)


def _check_sliding_window(d: Mapping[str, Any], max_pos: int) -> None:
    """Sliding-window attention is not implemented: accept it only when it never bites."""
    if d.get("use_sliding_window") is False:
        return  # Qwen2/Qwen3 configs carry a window size that is switched off.
    window = d.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float)) or window != window):
        # (int() of a list was a TypeError, of infinity an OverflowError)
        raise ValueError(f"config `sliding_window` must be a number of tokens (or null), got {window!r:.80}")
    if window is not None and window < max_pos:
        raise ValueError(
            f"config uses sliding-window attention (window {window} < max_position_embeddings "
            f"{max_pos}), which treadle does not implement; use a model without a sliding window"
        )


def _cfg(arch: str, **kw: Any) -> ModelConfig:
    base: dict[str, Any] = dict(
        rope_scaling=None, attention_bias=False, qk_norm=False, rms_norm_eps=1e-5
    )
    base.update(kw)
    return ModelConfig(architecture=arch, **base)


_LLAMA31_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
_TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
             num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=2048,
             bos_token_id=1, eos_token_ids=(2,))

# Real shapes for benchmarks (random weights), plus tiny ones for tests. The tiny vocab is
# SmolLM2's so the embedded tokenizer's ids fit.
DUMMY_CONFIGS: dict[str, ModelConfig] = {
    "llama3-8b": _cfg(
        "LlamaForCausalLM", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
        rope_scaling={**_LLAMA31_ROPE, "factor": 8.0}, max_position_embeddings=131072,
        tie_word_embeddings=False, bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    "llama3.2-1b": _cfg(
        "LlamaForCausalLM", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
        num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0,
        rope_scaling={**_LLAMA31_ROPE, "factor": 32.0}, max_position_embeddings=131072,
        tie_word_embeddings=True, bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    "qwen3-0.6b": _cfg(
        "Qwen3ForCausalLM", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
        num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, rope_theta=1000000.0,
        qk_norm=True, rms_norm_eps=1e-6, max_position_embeddings=40960,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_ids=(151645, 151643)),
    "qwen2.5-0.5b": _cfg(
        "Qwen2ForCausalLM", vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1000000.0,
        attention_bias=True, rms_norm_eps=1e-6, max_position_embeddings=32768,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_ids=(151645, 151643)),
    "smollm2-135m": _cfg(
        "LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
        max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,)),
    "tiny-llama": _cfg("LlamaForCausalLM", tie_word_embeddings=False, **_TINY),
    # 4 heads x head_dim 32 = 128 != hidden 64: catches code that assumes they match.
    "tiny-qwen3": _cfg("Qwen3ForCausalLM", **{**_TINY, "head_dim": 32}, qk_norm=True,
                       rms_norm_eps=1e-6, tie_word_embeddings=True),
    "tiny-qwen2": _cfg("Qwen2ForCausalLM", **_TINY, attention_bias=True, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    # mixtures of experts: Qwen3-30B-A3B (128 experts, 8 a token, 3.3B of 30.5B parameters
    # active) and Mixtral-8x7B (8 experts, 2 a token)
    "qwen3-30b-a3b": _cfg(
        "Qwen3MoeForCausalLM", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, rope_theta=1000000.0,
        qk_norm=True, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False,
        bos_token_id=151643, eos_token_ids=(151645, 151643), num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True),
    # vocab 32000 padded to SmolLM2's 49152, so the embedded tokenizer's ids fit (as every dummy's)
    "mixtral-8x7b": _cfg(
        "MixtralForCausalLM", vocab_size=49152, hidden_size=4096, intermediate_size=14336,
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1000000.0,
        max_position_embeddings=32768, tie_word_embeddings=False, bos_token_id=1, eos_token_ids=(2,),
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336, norm_topk_prob=True),
    # tiny: layer 1 of tiny-qwen3-moe keeps a dense MLP, and its top-k weights are not
    # renormalised (norm_topk_prob False), so both paths of the family are exercised
    "tiny-qwen3-moe": _cfg("Qwen3MoeForCausalLM", **{**_TINY, "head_dim": 32}, qk_norm=True,
                           rms_norm_eps=1e-6, tie_word_embeddings=False, num_experts=8,
                           num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False,
                           mlp_only_layers=(1,)),
    "tiny-mixtral": _cfg("MixtralForCausalLM", **{**_TINY, "intermediate_size": 64},
                         tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=64, norm_topk_prob=True),
}
