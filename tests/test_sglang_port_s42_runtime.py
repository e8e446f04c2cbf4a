"""`sgl.Runtime` as SGLang's examples use it: `runtime.server_args` is SGLang's ServerArgs,
with `url()` (it was treadle's EngineArgs, which has none: AttributeError), and `runtime.url`,
`generate_url` and `endpoint` as SGLang's Runtime sets them from it. (Its helpers, generate,
cache_prefix, get_server_info, ..., are tested in test_lang_sglang_module_paths_and_signatures.)
A tiny random-weight model: what is tested is the surface."""
from __future__ import annotations

import pytest
import requests

import treadle as sgl
from treadle.srt.server_args import ServerArgs


@pytest.fixture(scope="module")
def runtime():
    rt = sgl.Runtime(model_path="dummy:tiny-llama", max_total_tokens=1024)  # random weights: a quick start
    yield rt
    rt.shutdown()


def test_server_args_are_sglangs_with_url(runtime):
    args = runtime.server_args
    assert isinstance(args, ServerArgs)
    assert args.url() == runtime.url == f"http://127.0.0.1:{args.port}"  # SGLang: self.url = server_args.url()
    assert runtime.generate_url == args.url() + "/generate"
    assert requests.get(args.url() + "/health", timeout=10).status_code == 200
    assert runtime.endpoint.base_url == runtime.url and isinstance(runtime.endpoint.chat_template.name, str)


def test_the_default_backends_shutdown_stops_the_runtime(runtime):
    """SGLang's default backend after set_default_backend(runtime) is the Runtime, so
    `sgl.global_config.default_backend.shutdown()` stops its server; treadle's holds the
    Runtime's endpoint, whose shutdown() was an AttributeError. (Last: it stops the server.)"""
    sgl.set_default_backend(runtime)
    try:
        sgl.global_config.default_backend.shutdown()
    finally:
        sgl.set_default_backend(None)
    assert runtime.pid is None
    with pytest.raises(requests.ConnectionError):
        requests.get(runtime.url + "/health", timeout=10)
