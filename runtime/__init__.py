"""treadle.runtime: engine arguments, scheduler, model runner, models, the offline Engine and
the HTTP server. Heavy modules load on first use, so `import treadle.runtime` stays cheap."""
from __future__ import annotations

from typing import Any

__all__ = ["Engine", "EngineArgs", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from treadle.runtime.engine import Engine

        return Engine
    if name == "EngineArgs":
        from treadle.runtime.engine_args import EngineArgs

        return EngineArgs
    if name == "SamplingParams":
        from treadle.runtime.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'treadle.runtime' has no attribute {name!r}")
