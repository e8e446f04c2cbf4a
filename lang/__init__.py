"""treadle.lang: the structured-generation DSL, under SGLang's frontend names.

    import treadle.lang as sgl          # an SGLang program ports by changing its import

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=32))

    sgl.set_default_backend(sgl.Runtime())   # or an Engine, "http://127.0.0.1:30000", or sgl.OpenAI(...)
    print(qa(question="Why is the sky blue?", temperature=0)["answer"])

docs/porting-from-sglang.md lists what differs from SGLang.
"""
from __future__ import annotations

import sys
from typing import Any

from treadle.lang import ir
from treadle.lang.backend import (Backend, flush_cache, get_default_backend, get_server_info,
                                  set_default_backend)
from treadle.lang.backend_engine import EngineBackend
from treadle.lang.backend_http import RuntimeEndpoint
from treadle.lang.backend_openai import OpenAI
from treadle.lang.chat_template import ChatTemplate
from treadle.lang.global_config import GlobalConfig, global_config
from treadle.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR
from treadle.lang.primitives import (assistant, assistant_begin, assistant_end, gen, gen_int, gen_string,
                                     greedy_token_selection, image, select, system, system_begin, system_end,
                                     token_length_normalized, unconditional_likelihood_normalized, user,
                                     user_begin, user_end, video)
from treadle.lang.program import Program, function
from treadle.lang.reasoning import separate_reasoning
from treadle.lang.runtime_process import Runtime
from treadle.lang.state import ForkGroup, ProgramState

__all__ = ["Backend", "ChatTemplate", "Engine", "EngineBackend", "ForkGroup", "GlobalConfig", "OpenAI", "Program",
           "ProgramState", "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "Runtime", "RuntimeEndpoint",
           "ServerArgs", "__version__",
           "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen", "gen_int",
           "gen_string", "get_default_backend", "get_server_info", "global_config", "greedy_token_selection",
           "image", "ir", "select", "separate_reasoning", "set_default_backend", "system", "system_begin",
           "system_end",
           "token_length_normalized", "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
           "video"]


_API_BACKENDS = ("Anthropic", "VertexAI", "LiteLLM", "Crusoe")


def _api_backend(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"sgl.{name}(...): treadle has no API backends but sgl.OpenAI; serve a model with sgl.Runtime(model_path=...), "
                         "connect to a treadle server with sgl.RuntimeEndpoint(url), or to any OpenAI-compatible "
                         "server with sgl.OpenAI(model, base_url=...)")

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


def __getattr__(name: str) -> Any:
    """`sgl.Engine`: treadle's in-process Engine (loaded on first use); here it is also a
    backend: `sgl.set_default_backend(sgl.Engine())`. SGLang's API backends other than `sgl.OpenAI`
    (`sgl.Anthropic`, ...) exist only to say, when called, that treadle has none.
    The rest of `import sglang as sgl`'s names, as `import treadle as sgl` has them: `sgl.ServerArgs`
    (sglang.srt.server_args'), `sgl.__version__` (treadle's), and `sgl.lang`, the frontend
    package SGLang programs reach its modules through (`sgl.lang.ir.REGEX_INT`): this one."""
    if name == "Engine":
        from treadle.runtime import Engine

        return Engine
    if name in _API_BACKENDS:
        return _api_backend(name)
    if name == "ServerArgs":
        from treadle.lang.server_args import ServerArgs

        return ServerArgs
    if name == "__version__":
        import treadle

        return treadle.__version__
    if name == "lang":
        return sys.modules[__name__]
    raise AttributeError(f"module 'treadle.lang' has no attribute {name!r}", name=name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {"lang"} | set(_API_BACKENDS))
