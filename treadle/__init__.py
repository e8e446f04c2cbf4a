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

import importlib.abc
import importlib.util
import pkgutil
import sys
import types
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

# SGLang's module paths that its programs import from, under treadle: the module -> per name, the
# module of treadle's object ("treadle.lang.backend.runtime_endpoint" exists because
# treadle.lang.backend has a __path__ for it). Each is a module of its own whose names are
# treadle's objects, loaded on first use.
_SGLANG_MODULES: dict[str, dict[str, str]] = {
    "treadle.global_config": {"global_config": "treadle.lang.global_config",
                              "GlobalConfig": "treadle.lang.global_config"},
    # older SGLang's sglang/api.py, where its benchmarks import set_default_backend from
    "treadle.api": {name: "treadle.lang.api" for name in (
        "Engine", "Runtime", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen",
        "gen_int", "gen_string", "get_server_info", "image", "select", "separate_reasoning", "set_default_backend",
        "system", "system_begin", "system_end", "user", "user_begin", "user_end", "video")},
    "treadle.lang.backend.runtime_endpoint": {"RuntimeEndpoint": "treadle.lang.backend_http",
                                              "Runtime": "treadle.lang.runtime_process"},
    "treadle.lang.backend.base_backend": {"BaseBackend": "treadle.lang.backend"},
    **{f"treadle.lang.backend.{mod}": {cls: "treadle.lang"}
       for mod, cls in (("openai", "OpenAI"), ("anthropic", "Anthropic"), ("vertexai", "VertexAI"),
                        ("litellm", "LiteLLM"))},
    # the helpers SGLang's tutorials, examples and benchmarks use around their programs
    "treadle.utils": {name: "treadle.lang.utils" for name in (
        "print_highlight", "wait_for_server", "terminate_process", "http_request", "launch_server_cmd",
        "execute_shell_command", "trim_overlap", "stream_and_merge", "async_stream_and_merge", "read_jsonl",
        "dump_state_text", "download_and_cache_file", "encode_image_base64")},
    # SGLang's json_decode example builds its regex with the server package's helper
    "treadle.srt": {},
    "treadle.srt.constrained": {"build_regex_from_object": "treadle.lang.primitives"},
    "treadle.srt.constrained.outlines_backend": {"build_regex_from_object": "treadle.lang.primitives"},
    # a served model's tokenizer (SGLang's test programs count tokens with it); the second path is
    # where newer SGLang keeps the module
    "treadle.srt.hf_transformers_utils": {"get_tokenizer": "treadle.lang.utils"},
    # its tutorial's image cell loads the image with load_image (a ValueError naming text-only models)
    "treadle.srt.utils": {"kill_process_tree": "treadle.lang.testing", "load_image": "treadle.lang.utils"},
    "treadle.srt.utils.hf_transformers_utils": {"get_tokenizer": "treadle.lang.utils"},
    # SGLang's reasoning doc splits an offline Engine's output with it (the second path is newer SGLang's)
    "treadle.srt.reasoning_parser": {"ReasoningParser": "treadle.lang.reasoning"},
    "treadle.srt.parser": {},
    "treadle.srt.parser.reasoning_parser": {"ReasoningParser": "treadle.lang.reasoning"},
    # the first cell of SGLang's doc notebooks: `from sglang.test.test_utils import is_in_ci`, and
    # `from sglang.test.doc_patch import launch_server_cmd` (its CI wrapper of the helper)
    "treadle.test": {},
    # and its tests' harness: the model, URL and base class of a test, starting and stopping servers
    "treadle.test.test_utils": {name: "treadle.lang.testing" for name in (
        "is_in_ci", "add_common_sglang_args_and_parse", "select_sglang_backend", "dump_bench_raw_result",
        "DEFAULT_MODEL_NAME_FOR_TEST", "DEFAULT_SMALL_MODEL_NAME_FOR_TEST", "DEFAULT_URL_FOR_TEST",
        "DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH", "CustomTestCase", "popen_launch_server")},
    "treadle.test.doc_patch": {"launch_server_cmd": "treadle.lang.utils"},
    # its library of frontend test programs, which its test/lang/test_srt_backend.py runs
    "treadle.test.test_programs": {name: "treadle.lang.sglang_test_programs" for name in (
        "test_few_shot_qa", "test_mt_bench", "test_select", "test_decode_int", "test_decode_json_regex",
        "test_decode_json", "test_expert_answer", "test_tool_use", "test_react", "test_parallel_decoding",
        "test_parallel_encoding", "test_stream", "test_regex", "test_dtype_gen", "test_hellaswag_select",
        "test_gen_min_new_tokens", "test_image_qa", "test_completion_speculative", "test_chat_completion_speculative")},
    # SGLang's server arguments: `Engine(**dataclasses.asdict(ServerArgs.from_cli_args(args)))`
    "treadle.srt.server_args": {"ServerArgs": "treadle.lang.server_args"},
    "treadle.srt.entrypoints": {},
    "treadle.srt.entrypoints.engine": {"Engine": "treadle.runtime"},
    # the function-calling doc parses an offline Engine's reply with SGLang's parser; the tool
    # types are at three paths over SGLang's versions
    "treadle.srt.function_call": {},
    "treadle.srt.function_call.function_call_parser": {"FunctionCallParser": "treadle.lang.function_call"},
    "treadle.srt.function_call.core_types": {name: "treadle.lang.function_call"
                                             for name in ("ToolCallItem", "StreamingParseResult")},
    # older SGLang's one module for all of them
    "treadle.srt.function_call_parser": {name: "treadle.lang.function_call" for name in (
        "FunctionCallParser", "ToolCallItem", "StreamingParseResult")},
    "treadle.srt.managers": {},
    "treadle.srt.managers.io_struct": {"Tool": "treadle.lang.function_call", "Function": "treadle.lang.function_call"},
    "treadle.srt.entrypoints.openai": {},
    "treadle.srt.entrypoints.openai.protocol": {"Tool": "treadle.lang.function_call",
                                                "Function": "treadle.lang.function_call"},
    "treadle.srt.openai_api": {},
    "treadle.srt.openai_api.protocol": {"Tool": "treadle.lang.function_call", "Function": "treadle.lang.function_call"},
}


# SGLang's modules that are also scripts (`python -m sglang.test.few_shot_gsm8k`): the module's own
# file is loaded under SGLang's path, so `-m` runs it and `from treadle.test.few_shot_gsm8k import
# run_eval` imports it
_SGLANG_SCRIPTS: dict[str, str] = {
    "treadle.test.few_shot_gsm8k": "treadle.lang.few_shot_gsm8k",
}


class _SGLangModule(types.ModuleType):
    """One of _SGLANG_MODULES: its names resolve to treadle's objects on first use."""

    def __getattr__(self, name: str) -> Any:
        names = _SGLANG_MODULES[self.__name__]
        if name not in names:
            has = f"SGLang's {', '.join(sorted(names))}" if names else "only the submodules SGLang's programs import"
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} (treadle has {has} here)",
                                 name=name)
        import importlib

        source = importlib.import_module(names[name])
        value = getattr(source, "Backend" if name == "BaseBackend" else name)
        setattr(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_SGLANG_MODULES[self.__name__]))


class _SGLangModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of _SGLANG_MODULES (`from treadle.global_config import global_config`,
    `from treadle.lang.backend.runtime_endpoint import RuntimeEndpoint`), as SGLang's programs
    import them from sglang.*."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in _SGLANG_SCRIPTS:
            source = importlib.util.find_spec(_SGLANG_SCRIPTS[fullname])
            return importlib.util.spec_from_file_location(fullname, source.origin)
        if fullname not in _SGLANG_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin="treadle (SGLang's module path)")

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _SGLangModule(spec.name, f"SGLang's {spec.name.replace('treadle', 'sglang', 1)}, under treadle: "
                                          f"{', '.join(sorted(_SGLANG_MODULES[spec.name]))}")
        module.__all__ = sorted(_SGLANG_MODULES[spec.name])
        if any(name.startswith(spec.name + ".") for name in _SGLANG_MODULES):
            module.__path__ = []  # a package: its submodules above come from this finder too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Package(types.ModuleType):
    """This package's class: importing treadle.global_config (SGLang's module path) binds the module
    as the package's `global_config`, which would hide the object that `sgl.global_config` is
    (SGLang's sglang/__init__.py rebinds it to its object too); that binding is skipped, and
    `treadle.global_config` stays the object."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "global_config" and isinstance(value, _SGLangModule):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
if not any(isinstance(f, _SGLangModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SGLangModuleFinder())

# SGLang's top-level names treadle does not have, with what to use instead
_MISSING: dict[str, str] = {}

__all__ = sorted(_FROM_LANG | {"__version__", "ServerArgs"})

# the subpackages, imported on first use as attributes (`import treadle; treadle.lang.ir`), as
# SGLang programs reach `sgl.lang.ir`
_SUBPACKAGES = frozenset({"lang", "runtime", "radix_cache", "constrained", "kernels"})


def __getattr__(name: str) -> Any:
    if name in _FROM_LANG:
        import treadle.lang

        value = getattr(treadle.lang, name)
        globals()[name] = value  # loaded once
        return value
    if name == "ServerArgs":  # SGLang's sgl.ServerArgs (sglang.srt.server_args.ServerArgs)
        from treadle.lang.server_args import ServerArgs

        globals()[name] = ServerArgs
        return ServerArgs
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
