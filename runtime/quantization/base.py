"""The quantized-linear interface and the two model-level steps that use it.

A `QuantMethod` owns one linear layer's weight: the parameters a checkpoint of its format
fills (`create_weights`, each tagged with how tensor parallelism splits it), the repacking
into the layout its kernel reads (`process_after_loading`), quantizing a float weight at
load (`quantize_loaded`), the matmul (`apply`) and the fp32 weight it stands for
(`dequantize`, for references and tests). The linear layers of runtime/models/parallel.py
call `apply` when they hold a method; without one they stay the plain float layers.

Loading a quantized checkpoint: `prepare_model` (before `load_weights`), then `finish_model`.
Quantizing at load: the model loads its float weights as usual, then `finish_model`.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from treadle.kernels.fp8_quant import ActQuant, Fp8Act
from treadle.runtime.models import ops
from treadle.runtime.models.parallel import ColumnParallelLinear, RowParallelLinear
from treadle.runtime.quantization.config import QuantConfig

# parameter tags read by the linear layers' loaders (runtime/models/parallel.py)
#   output_dim / input_dim: the tensor dimension along which the layer's outputs / inputs run
#       (None: not split that way); output_pack / input_pack: outputs or inputs an element
#       covers along it (8 for nibbles packed in an int32, G for a group's scale row)
#   per_shard: one value per merged part (q/k/v, gate/up): a per-tensor scale


def new_param(layer: nn.Module, name: str, shape: tuple[int, ...], dtype: torch.dtype, *,
              output_dim: int | None = None, input_dim: int | None = None, output_pack: int = 1,
              input_pack: int = 1, per_shard: bool = False) -> nn.Parameter:
    """Register a zero-filled parameter on `layer`, tagged for its loader, on the layer's device."""
    p = nn.Parameter(torch.zeros(shape, dtype=dtype, device=layer.device), requires_grad=False)
    p.output_dim, p.input_dim = output_dim, input_dim  # type: ignore[attr-defined]
    p.output_pack, p.input_pack, p.per_shard = output_pack, input_pack, per_shard  # type: ignore[attr-defined]
    p.weight_loader = layer._load  # type: ignore[attr-defined]
    if hasattr(layer, name):
        delattr(layer, name)
    layer.register_parameter(name, p)
    return p


def replace_param(layer: nn.Module, name: str, value: torch.Tensor) -> None:
    """Swap (or add) a run-time parameter, dropping the previous tensor's memory."""
    if hasattr(layer, name):
        delattr(layer, name)
    layer.register_parameter(name, nn.Parameter(value, requires_grad=False))


class QuantMethod:
    """One linear layer's quantized weight. The layer gives `in_local` (its input width on
    this rank), `out_local` (its output width), `shard_sizes` (the merged parts' local widths)
    and `device`."""

    name = ""

    def __init__(self, qc: QuantConfig) -> None:
        self.qc = qc
        # the Triton kernels run on CUDA tensors; tests set True to run them under
        # TRITON_INTERPRET=1 on the CPU (else the CPU dequantizes and runs the float matmul)
        self.use_kernels: bool | None = None

    def kernels(self, x: torch.Tensor) -> bool:
        return x.is_cuda if self.use_kernels is None else self.use_kernels

    def create_weights(self, layer: nn.Module) -> None:
        """Replace the layer's float `weight` with the checkpoint format's parameters (zeros)."""
        raise NotImplementedError

    def process_after_loading(self, layer: nn.Module) -> None:
        """Turn the loaded checkpoint parameters into the run-time layout `apply` reads."""
        raise NotImplementedError

    def quantize_loaded(self, layer: nn.Module) -> None:
        """Quantize the layer's loaded float `weight` into the run-time layout (frees it)."""
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in_local] -> [T, out_local] in x's dtype."""
        raise NotImplementedError

    def fuses_norm(self, layer: nn.Module, x: torch.Tensor) -> bool:
        """Whether `apply` (and `apply_silu_and_mul`) take the norm before them as a NormedInput
        (runtime/models/parallel.py's ColumnParallelLinear.fuses_norm): none unless a method says so."""
        return False

    def input_quant(self, layer: nn.Module, x: torch.Tensor) -> ActQuant | None:
        """The per-token quantization `apply` would give an input like x (None: it takes x as it
        is), which the kernel producing x may do instead (runtime/models/parallel.py)."""
        return None

    def apply_silu_and_mul(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                           quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
        """A gate/up pair's (layer.act_and_mul == "silu") SwiGLU: silu(gate) * up, [T, out_local / 2],
        possibly quantized per token as `quant` (the next layer's input_quant) asks.
        A method whose kernel can fuse it overrides this."""
        return ops.silu_and_mul(self.apply(layer, x, bias), quant)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        """The fp32 weight [out_local, in_local] this layer multiplies by (its reference)."""
        raise NotImplementedError


def make_method(qc: QuantConfig) -> QuantMethod:
    if qc.method == "fp8":
        from treadle.runtime.quantization.fp8 import Fp8Method

        return Fp8Method(qc)
    from treadle.runtime.quantization.int4 import Int4Method

    return Int4Method(qc)


# HF projection names a merged layer stands for
_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def quantized_linears(model: nn.Module, qc: QuantConfig) -> Iterator[tuple[str, nn.Module]]:
    """(name, layer) of every linear layer the config quantizes: the decoder layers' column-
    and row-parallel linears, less the ones the checkpoint leaves unquantized."""
    for name, m in model.named_modules():
        if not isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            continue
        head, _, leaf = name.rpartition(".")
        hf = [f"model.{head}.{p}" for p in _PARTS.get(leaf, (leaf,))]
        skipped = [qc.skips(n) for n in hf]
        if all(skipped):
            continue
        if any(skipped):
            raise ValueError(f"the checkpoint quantizes only some of {hf}, which treadle runs as one merged matmul")
        yield name, m


def _experts(model: nn.Module, qc: QuantConfig) -> Iterator[tuple[str, nn.Module]]:
    """(name, FusedExperts) of every mixture-of-experts layer the config quantizes (FP8 only)."""
    from treadle.runtime.models.moe import FusedExperts

    for name, m in model.named_modules():
        if isinstance(m, FusedExperts) and not qc.skips(f"model.{name}"):
            if qc.method != "fp8":
                raise ValueError(f"{qc.method} mixture-of-experts layers are not supported (FP8 ones are)")
            yield name, m


def prepare_model(model: nn.Module, qc: QuantConfig) -> None:
    """Before loading a checkpoint of `qc`'s format: give each quantized linear its method and
    the format's parameters, for `load_weights` to fill. A no-op when quantizing at load."""
    if not qc.from_checkpoint:
        return
    for _, layer in quantized_linears(model, qc):
        layer.quant = make_method(qc)
        layer.quant.create_weights(layer)
    for _, experts in _experts(model, qc):
        experts.to_fp8(qc.weight_block)


def finish_model(model: nn.Module, qc: QuantConfig) -> None:
    """After loading: repack the checkpoint's tensors, or quantize the loaded float weights."""
    for _, layer in quantized_linears(model, qc):
        if qc.from_checkpoint:
            layer.quant.process_after_loading(layer)
        else:
            layer.quant = make_method(qc)
            layer.quant.quantize_loaded(layer)
    if not qc.from_checkpoint:
        for _, experts in _experts(model, qc):
            experts.quantize_fp8()
    if next(model.parameters()).is_cuda:
        torch.cuda.empty_cache()  # the float weights just freed go to the KV pool


def dequantized_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """{parameter name: fp32 weight} for every quantized linear: what a float model must hold
    to compute what the quantized one computes (the reference of the tests)."""
    out = {f"{name}.weight": m.quant.dequantize(m) for name, m in model.named_modules()
           if getattr(m, "quant", None) is not None}
    for name, m in model.named_modules():
        if getattr(m, "is_fp8", False):  # FP8 experts (runtime/models/moe.py)
            out.update({f"{name}.{k}": w for k, w in m.dequantized().items()})
    return out
