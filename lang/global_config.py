"""`global_config`: the process-wide DSL settings, under SGLang's names.

Programs written for SGLang set and read these (`sgl.global_config.default_backend = ...`,
`sgl.global_config.verbosity = 2`). `default_backend` is the same setting as
`set_default_backend` / `get_default_backend`: setting one is seen by the other.
"""
from __future__ import annotations

from typing import Any


class GlobalConfig:
    """What each setting does here:

    - `default_backend`: the backend `run` / `run_batch` / a direct call use when given none
      (an Engine, EngineBackend, RuntimeEndpoint, Runtime or URL; None clears it).
    - `verbosity`: 2 or more prints a program's whole text after each run, as SGLang.
    - `skip_special_tokens_in_output`, `spaces_between_special_tokens_in_out`: sent with every
      gen as the runtime's `skip_special_tokens` / `spaces_between_special_tokens`.
    - `enable_precache_with_tracing`: run_batch traces the program and caches its constant
      prefix once before the batch (False skips that).
    - `enable_parallel_encoding`: kept for SGLang programs that set it; it changes nothing here
      (a "concat" join appends the branches' text, and the runtime's prefix cache shares it).
    """

    def __init__(self) -> None:
        self.verbosity = 0
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True

    @property
    def default_backend(self) -> Any:
        from treadle.lang import backend

        return backend._default

    @default_backend.setter
    def default_backend(self, value: Any) -> None:
        from treadle.lang import backend

        if value is None:
            backend.clear_default_backend()
        else:
            backend.set_default_backend(value)

    def output_params(self) -> dict:
        """The sampling fields these settings add to a gen (only those not at the runtime's default)."""
        params = {}
        if not self.skip_special_tokens_in_output:
            params["skip_special_tokens"] = False
        if not self.spaces_between_special_tokens_in_out:
            params["spaces_between_special_tokens"] = False
        return params

    def __repr__(self) -> str:
        return (f"GlobalConfig(default_backend={self.default_backend!r}, verbosity={self.verbosity}, "
                f"skip_special_tokens_in_output={self.skip_special_tokens_in_output}, "
                f"spaces_between_special_tokens_in_out={self.spaces_between_special_tokens_in_out}, "
                f"enable_precache_with_tracing={self.enable_precache_with_tracing}, "
                f"enable_parallel_encoding={self.enable_parallel_encoding})")


global_config = GlobalConfig()
