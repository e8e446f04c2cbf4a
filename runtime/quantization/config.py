"""Which quantization a model runs: parsed from config.json's `quantization_config`, or asked
for with `--quantization` to quantize a float checkpoint at load.

Formats read (the layouts their publishers document; no package of theirs is imported):
- `compressed-tensors`, format `float-quantized` (or `naive-quantized`) with 8-bit float weights:
  `weight` float8_e4m3fn [N, K], `weight_scale` [N, 1] (strategy "channel"), one value
  (strategy "tensor"), [N / bn, K / bk] (strategy "block", block_structure [bn, bk]) or
  [N, K / G] (strategy "group", group_size G), `input_scale` for static activations (read,
  not used: treadle quantizes activations per token, dynamically).
- `fp8` (the FP8 format of transformers and vLLM, which DeepSeek-V3's and Qwen3's FP8 releases
  use): `weight` float8_e4m3fn [N, K] with, when `weight_block_size` [bn, bk] is set,
  `weight_scale_inv` [cdiv(N, bn), cdiv(K, bk)] (a block's weights are q * scale: the name is
  the inverse of the quantizing scale), else `weight_scale` one value a tensor; `input_scale`
  when `activation_scheme` is "static" (read, not used).
- `fbgemm_fp8`: `weight` float8_e4m3fn [N, K], `weight_scale` [N, 1]; activations per token,
  their amax capped at `activation_scale_ub`.
- `awq` (version "gemm", 4 bits, zero point): `qweight` int32 [K, N/8], `qzeros` int32
  [K/G, N/8] (eight columns an int, in AWQ's interleaved order), `scales` fp16 [K/G, N].
- `gptq` (4 bits): `qweight` int32 [K/8, N], `qzeros` int32 [K/G, N/8] (stored minus one in
  checkpoint_format "gptq"), `scales` fp16 [K/G, N], `g_idx` int32 [K] (act-order when
  desc_act: input k uses group g_idx[k]).
Anything else is refused at load with a ValueError that names it.
"""
from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Literal, Mapping

if TYPE_CHECKING:
    from treadle.runtime.model_config import ModelConfig

METHODS = ("fp8", "awq", "gptq")
_READ = ("compressed-tensors (float-quantized FP8), fp8 (per tensor or block-wise), fbgemm_fp8, awq (version gemm, "
         "4-bit) and gptq (4-bit)")


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """One model's quantization (frozen: it sits in the hashable ModelConfig).

    method: what runs ("fp8": FP8 weights, FP8 per-token activations on the GPU; "awq" and
        "gptq": 4-bit weights, both run by the same W4A16 kernels once repacked).
    source: the checkpoint format it was read from, or "load" when quantized at load.
    weight_strategy (fp8): "channel" (a scale per output row), "tensor" (one per tensor) or
        "block" (one per weight_block = (rows, inputs) block; a "group" of G inputs is (1, G)).
    scale_name (fp8): the checkpoint's name of the weight scales ("weight_scale", or the fp8
        format's "weight_scale_inv" for blocks).
    static_input_scale (fp8): the checkpoint carries input_scale tensors (read and unused).
    activation_scale_ub (fp8): a cap on each token's amax (fbgemm_fp8's activation_scale_ub).
    group_size (int4): input features a scale and zero cover; 0 = all of a row (GPTQ's -1).
    desc_act, sym, zero_offset (gptq): act-order, symmetric, the +1 of checkpoint_format "gptq".
    ignore: module names (or "re:" regexes) left unquantized, as the checkpoint lists them.
    """

    method: Literal["fp8", "awq", "gptq"]
    source: str
    weight_strategy: str = "channel"
    weight_block: tuple[int, int] | None = None
    scale_name: str = "weight_scale"
    static_input_scale: bool = False
    activation_scale_ub: float | None = None
    group_size: int = 128
    desc_act: bool = False
    sym: bool = False
    zero_offset: int = 0
    ignore: tuple[str, ...] = ()

    @property
    def from_checkpoint(self) -> bool:
        """True when the checkpoint's tensors are already in this format."""
        return self.source != "load"

    def describe(self) -> str:
        """A short line for logs and /get_server_info."""
        if self.method == "fp8":
            w = {"channel": "per-channel", "tensor": "per-tensor"}.get(self.weight_strategy)
            if self.weight_block is not None:
                w = f"{self.weight_block[0]}x{self.weight_block[1]}-block"
            how = "quantized at load" if self.source == "load" else self.source
            return f"fp8 ({how}; {w} weight scales, dynamic per-token activation scales)"
        how = "quantized at load, round to nearest" if self.source == "load" else f"{self.source} checkpoint"
        act = ", act-order" if self.desc_act else ""
        group = f"group {self.group_size}" if self.group_size else "per-channel"
        return f"{self.method} (4-bit weights, {group}{act}; {how})"

    def skips(self, module_name: str) -> bool:
        """Whether the HF module `module_name` (e.g. "model.layers.0.mlp.down_proj") stays unquantized."""
        for entry in self.ignore:
            if entry.startswith("re:"):
                if re.fullmatch(entry[3:], module_name) or re.fullmatch(entry[3:], module_name.removeprefix("model.")):
                    return True
            elif module_name == entry or module_name.endswith("." + entry) or ("." + entry + ".") in module_name + ".":
                return True
        return False


def parse_quantization_config(d: Mapping[str, Any] | None) -> QuantConfig | None:
    """config.json's `quantization_config` -> QuantConfig (None when absent). Raises
    ValueError naming the format, or the setting, that treadle does not read."""
    if d is None:
        return None
    if not isinstance(d, Mapping):
        raise ValueError(f"quantization_config must be an object, got {type(d).__name__}")
    method = d.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(d)
    if method == "fp8":
        return _fp8(d)
    if method == "fbgemm_fp8":
        ub = d.get("activation_scale_ub", 1200.0)
        return QuantConfig("fp8", "fbgemm_fp8", activation_scale_ub=None if ub is None else float(ub),
                           ignore=tuple(d.get("modules_to_not_convert") or ()))
    if method == "awq":
        bits = d.get("bits", d.get("w_bit", 4))
        version = str(d.get("version", "gemm")).lower()
        if bits != 4 or version != "gemm" or not d.get("zero_point", True):
            raise ValueError(f"awq checkpoint with bits={bits}, version={version!r}, zero_point="
                             f"{d.get('zero_point', True)}: treadle reads 4-bit AWQ of version gemm with zero points")
        return QuantConfig("awq", "awq", group_size=_group(d.get("group_size", d.get("q_group_size", 128))),
                           ignore=tuple(d.get("modules_to_not_convert") or ()))
    if method == "gptq":
        fmt = d.get("checkpoint_format", "gptq")
        if d.get("bits") != 4 or fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"gptq checkpoint with bits={d.get('bits')}, checkpoint_format={fmt!r}: treadle "
                             "reads 4-bit GPTQ in checkpoint_format gptq or gptq_v2")
        return QuantConfig("gptq", "gptq", group_size=_group(d.get("group_size", 128)), desc_act=bool(d.get("desc_act")),
                           sym=bool(d.get("sym", True)), zero_offset=1 if fmt == "gptq" else 0,
                           ignore=tuple(d.get("modules_to_not_convert") or ()))
    raise ValueError(f"quantization format {method!r} (config.json quantization_config.quant_method) is not one "
                     f"treadle reads; it reads {_READ}")


def _block(block: Any, where: str) -> tuple[int, int]:
    """A weight block [rows, inputs]: positive ints, the inputs a power of two of at least 32
    (the kernels' K steps stay within one block)."""
    if not isinstance(block, (list, tuple)) or len(block) != 2 or not all(
            isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
        raise ValueError(f"{where} must be two positive integers [rows, inputs], got {block!r}")
    bn, bk = block
    if bk < 32 or bk & (bk - 1):
        raise ValueError(f"{where} {list(block)}: treadle reads FP8 blocks whose input width is a power of two of "
                         "at least 32")
    return bn, bk


def _fp8(d: Mapping[str, Any]) -> QuantConfig:
    fmt = d.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"fp8 checkpoint with fmt={fmt!r}: treadle reads e4m3 FP8 weights")
    scheme = d.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ValueError(f"fp8 checkpoint with activation_scheme={scheme!r}: treadle reads dynamic or static")
    ignore = tuple(d.get("ignored_layers") or d.get("modules_to_not_convert") or ())
    block = d.get("weight_block_size")
    if block is None:
        return QuantConfig("fp8", "fp8", weight_strategy="tensor", static_input_scale=scheme == "static",
                           ignore=ignore)
    return QuantConfig("fp8", "fp8", weight_strategy="block", weight_block=_block(block, "weight_block_size"),
                       scale_name="weight_scale_inv", static_input_scale=scheme == "static", ignore=ignore)


def _group(g: Any) -> int:
    g = int(g)
    if g == -1:
        return 0
    if g <= 0 or g % 8:
        raise ValueError(f"4-bit group_size must be -1 or a positive multiple of 8, got {g}")
    return g


def _compressed_tensors(d: Mapping[str, Any]) -> QuantConfig:
    fmt = d.get("format")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise ValueError(f"compressed-tensors format {fmt!r} is not one treadle reads; it reads float-quantized "
                         "(FP8 weights) compressed-tensors checkpoints")
    if d.get("kv_cache_scheme"):
        raise ValueError("compressed-tensors kv_cache_scheme (static KV-cache scales) is not read; use a checkpoint "
                         "without it (treadle's own --kv-cache-dtype fp8_e5m2 needs no scales)")
    groups = list((d.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors with {len(groups)} config groups: treadle reads exactly one")
    g = groups[0]
    w, a = g.get("weights") or {}, g.get("input_activations")
    strategy = w.get("strategy")
    if w.get("type") != "float" or w.get("num_bits") != 8 or strategy not in ("channel", "tensor", "block", "group") \
            or w.get("dynamic") or (w.get("group_size") and strategy != "group") \
            or (w.get("block_structure") and strategy != "block"):
        raise ValueError(f"compressed-tensors weights {dict(w)} are not read: treadle reads 8-bit float weights with "
                         "strategy channel, tensor, block or group")
    block = None
    if strategy == "block":
        block = _block(w.get("block_structure"), "compressed-tensors weights block_structure")
    elif strategy == "group":
        block = _block([1, w.get("group_size")], "compressed-tensors weights [1, group_size]")
    static = False
    if a is not None:
        if a.get("type") != "float" or a.get("num_bits") != 8 or a.get("strategy") not in ("token", "tensor", "group"):
            raise ValueError(f"compressed-tensors input_activations {dict(a)} are not read: treadle reads 8-bit "
                             "float activations, per token, per tensor or per group (run per token)")
        static = not a.get("dynamic", False)
    return QuantConfig("fp8", "compressed-tensors", weight_strategy="block" if block else strategy,
                       weight_block=block, static_input_scale=static, ignore=tuple(d.get("ignore") or ()))


def resolve_quantization(cfg: ModelConfig, flag: str, tp_size: int = 1) -> QuantConfig | None:
    """The quantization a model runs: the checkpoint's (cfg.quantization) when `flag` is
    "auto" or names it; else `flag` ("fp8", "awq", "gptq") quantizes a float checkpoint at load.
    Raises ValueError for a flag that contradicts the checkpoint, a mixture of experts, or
    linear shapes the format cannot split."""
    have = cfg.quantization
    if flag == "auto":
        qc = have
    elif flag not in METHODS:
        raise ValueError(f"unknown quantization {flag!r}; choose auto, {', '.join(METHODS)}")
    elif have is not None:
        if have.method != flag:
            raise ValueError(f"the checkpoint is quantized as {have.method} ({have.source}); --quantization {flag} "
                             f"cannot re-quantize it: pass auto or {have.method}")
        qc = have
    else:
        # round to nearest at load: AWQ's asymmetric layout, or GPTQ's symmetric one
        qc = QuantConfig(flag, "load", group_size=128, sym=flag == "gptq", zero_offset=1 if flag == "gptq" else 0)
    if qc is None:
        return None
    if cfg.num_experts > 0 and qc.method != "fp8":
        raise ValueError(f"4-bit mixture-of-experts models are not supported yet ({cfg.architecture}, "
                         f"{qc.describe()}); serve it in FP8 or bf16")
    if qc.method != "fp8":
        qc = _fit_groups(cfg, qc, tp_size)
    elif qc.weight_block is not None and tp_size > 1:
        # a row-parallel rank's inputs must start on a block: its scale columns are its own
        widths = [cfg.num_heads * cfg.head_dim // tp_size, cfg.intermediate_size // tp_size]
        if any(w_ % qc.weight_block[1] for w_ in widths):
            raise ValueError(f"FP8 blocks of {qc.weight_block[1]} inputs do not divide the row-parallel input widths "
                             f"{widths} on each of {tp_size} ranks")
    return qc


def _fit_groups(cfg: ModelConfig, qc: QuantConfig, tp: int) -> QuantConfig:
    """Check (or, quantizing at load, pick) a group size that divides every linear's input
    width on its rank: 128, else 64 or 32 (SmolLM2's hidden size 576 is 4.5 groups of 128)."""
    widths = [cfg.hidden_size, cfg.num_heads * cfg.head_dim // tp, cfg.intermediate_size // tp]
    outs = [cfg.num_heads * cfg.head_dim // tp, max(1, cfg.num_kv_heads // tp) * cfg.head_dim,
            cfg.intermediate_size // tp, cfg.hidden_size]
    if any(n % 8 for n in outs):
        raise ValueError(f"4-bit weights need every linear's output width on a rank to be a multiple of 8, got {outs}")
    if qc.desc_act and tp > 1:
        raise ValueError("GPTQ act-order (desc_act) checkpoints are supported with tp_size 1 only")
    if qc.group_size == 0:
        if tp > 1:
            raise ValueError("GPTQ per-channel (group_size -1) checkpoints are supported with tp_size 1 only")
        return qc
    sizes = [qc.group_size] if qc.from_checkpoint else [128, 64, 32]
    for g in sizes:
        if all(w % g == 0 for w in widths):
            return dataclasses.replace(qc, group_size=g)
    raise ValueError(f"4-bit group size {qc.group_size} does not divide the linear input widths {widths} "
                     f"(tp_size {tp})")
