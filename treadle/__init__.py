"""treadle: a structured-generation runtime in the line of SGLang.

An SGLang program ports by changing its import line only:

    import treadle as sgl               # was: import sglang as sgl

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=32))

    sgl.set_default_backend(sgl.Runtime())   # or sgl.Engine(), or sgl.RuntimeEndpoint(url)
    print(qa(question="Why is the sky blue?", temperature=0)["answer"])

The names below are SGLang's top-level frontend API, loaded on first use (PEP 562): `import
treadle.runtime.scheduler` in a scheduler process imports neither the DSL (`treadle.lang`)
nor anything else from here. The subpackages (`treadle.lang`, `treadle.runtime`,
`treadle.constrained`, ...) are the repository's top-level folders, mapped by pyproject.toml.
docs/porting-from-sglang.md lists what differs from SGLang.
"""
from __future__ import annotations

import pkgutil
from typing import Any

# Python run inside a checkout puts the checkout first on sys.path, and its treadle/ (this
# file alone: the subpackages are the checkout's top-level folders, which only an editable
# install maps) would hide an installed (non-editable) treadle's subpackages: __path__ takes
# in every treadle/ on sys.path, so `import treadle.runtime` finds the installed one.
__path__ = pkgutil.extend_path(__path__, __name__)

# SGLang's top-level frontend names, and treadle.lang's other public names (treadle.lang.__all__
# but its `ir` module): `import treadle as sgl` and `import treadle.lang as sgl` give the same
# API. `sgl.Engine` is treadle.runtime.Engine, which is also a DSL backend here; `sgl.OpenAI`
# and SGLang's other API backends are names that refuse when called (treadle has none).
_FROM_LANG = frozenset({
    # SGLang's
    "Engine", "Runtime", "RuntimeEndpoint", "function", "gen", "gen_int", "gen_string", "select",
    "image", "video", "system", "system_begin", "system_end", "user", "user_begin", "user_end",
    "assistant", "assistant_begin", "assistant_end", "set_default_backend", "flush_cache",
    "get_server_info", "global_config", "separate_reasoning", "greedy_token_selection",
    "token_length_normalized", "unconditional_likelihood_normalized",
    "OpenAI", "Anthropic", "VertexAI", "LiteLLM", "Crusoe",
    # treadle.lang's own
    "REGEX_INT", "REGEX_FLOAT", "REGEX_BOOL", "REGEX_STR", "Backend", "ChatTemplate", "EngineBackend",
    "ForkGroup", "GlobalConfig", "Program", "ProgramState", "get_default_backend",
})

# SGLang's top-level names treadle does not have, with what to use instead
_MISSING = {
    "ServerArgs": "treadle's server arguments are treadle.runtime.EngineArgs, with treadle's names; "
                  "pass them to sgl.Runtime(...) or sgl.Engine(...) by name",
}

__all__ = sorted(_FROM_LANG | {"__version__"})

# the subpackages, imported on first use as attributes (`import treadle; treadle.lang.ir`), as
# SGLang programs reach `sgl.lang.ir`
_SUBPACKAGES = frozenset({"lang", "runtime", "radix_cache", "constrained", "kernels"})


def __getattr__(name: str) -> Any:
    if name in _FROM_LANG:
        import treadle.lang

        value = getattr(treadle.lang, name)
        globals()[name] = value  # loaded once
        return value
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")  # the import binds it here
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("treadle")
        except PackageNotFoundError:  # a checkout on sys.path, not installed
            value = "unknown"
        globals()[name] = value
        return value
    if name in _MISSING:
        raise AttributeError(f"module 'treadle' has no attribute {name!r} (SGLang's sgl.{name}): {_MISSING[name]}",
                             name=name)
    raise AttributeError(f"module 'treadle' has no attribute {name!r}", name=name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBPACKAGES)
