"""SGLang's `sglang.lang.api` module path: the frontend's public functions, for programs that
import them from there (SGLang's frontend tutorial writes `from sglang.lang.api import
set_default_backend`; it ports as `from treadle.lang.api import set_default_backend`). They are
treadle.lang's own objects; docs/porting-from-sglang.md says where they differ from SGLang's."""
from __future__ import annotations

from typing import Any

from treadle.lang.backend import flush_cache, get_server_info, set_default_backend
from treadle.lang.primitives import (assistant, assistant_begin, assistant_end, gen, gen_int, gen_string, image,
                                     select, system, system_begin, system_end, user, user_begin, user_end, video)
from treadle.lang.program import function
from treadle.lang.reasoning import separate_reasoning
from treadle.lang.runtime_process import Runtime

__all__ = ["Engine", "Runtime", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen",
           "gen_int", "gen_string", "get_server_info", "image", "select", "separate_reasoning",
           "set_default_backend", "system", "system_begin", "system_end", "user", "user_begin", "user_end",
           "video"]


def __getattr__(name: str) -> Any:
    """`Engine` (treadle.runtime.Engine, a DSL backend here), loaded on first use as SGLang's."""
    if name == "Engine":
        from treadle.runtime import Engine

        return Engine
    raise AttributeError(f"module 'treadle.lang.api' has no attribute {name!r}", name=name)
