"""Quantized linear layers: FP8 (W8A8) and 4-bit weight-only (AWQ, GPTQ).

A linear layer (runtime/models/parallel.py) holds a `QuantMethod` (base.py) that owns its
parameters and its matmul. The format comes from the checkpoint's `quantization_config`
(config.py) or from `--quantization`, which quantizes a float checkpoint at load.
Only config.py is imported here: ModelConfig reads it, and it needs no torch.
"""
from treadle.runtime.quantization.config import QuantConfig, parse_quantization_config, resolve_quantization

__all__ = ["QuantConfig", "parse_quantization_config", "resolve_quantization"]
