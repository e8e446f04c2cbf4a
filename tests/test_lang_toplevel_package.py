"""`import treadle as sgl`, as `import sglang as sgl`: the top-level package (treadle/__init__.py)
gives SGLang's frontend names, loaded on first use, so the runtime's processes, which import
`treadle.runtime...`, never load the DSL. Checked in this checkout, through the editable install
(from a folder outside the repository) and from a wheel built from pyproject.toml."""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import sys
import zipfile

import pytest

import treadle
import treadle.lang

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYCACHE = shutil.ignore_patterns("__pycache__")

# sglang/__init__.py's frontend names (its __all__ but ServerArgs, checked apart: it is no treadle.lang name)
SGLANG_NAMES = ["Engine", "Runtime", "RuntimeEndpoint", "assistant", "assistant_begin", "assistant_end",
                "flush_cache", "function", "gen", "gen_int", "gen_string", "get_server_info", "image", "select",
                "separate_reasoning", "set_default_backend", "system", "system_begin", "system_end", "user",
                "user_begin", "user_end", "video", "greedy_token_selection", "token_length_normalized",
                "unconditional_likelihood_normalized", "global_config", "__version__"]
API_BACKENDS = ["OpenAI", "Anthropic", "LiteLLM", "VertexAI"]

# what a program ported from SGLang reads at the top level, run in a fresh interpreter
PROBE = """
import sys
import treadle.runtime.scheduler
loaded = sorted(m for m in sys.modules if m.startswith("treadle.lang"))
assert not loaded, loaded
import treadle as sgl
assert "treadle.lang" not in sys.modules
from treadle.runtime import Engine
assert sgl.Engine is Engine and sgl.function is sgl.lang.function and callable(sgl.gen)
print(sgl.__file__)
"""


def test_the_top_level_names_are_treadle_langs():
    import treadle.runtime

    for name in SGLANG_NAMES[:-1]:
        want = treadle.runtime.Engine if name == "Engine" else getattr(treadle.lang, name)
        assert getattr(treadle, name) is want, name
    public = set(treadle.lang.__all__) - {"ir"}  # the same API, whichever of the two a program imports
    assert public <= set(treadle.__all__) and set(SGLANG_NAMES + API_BACKENDS) <= set(treadle.__all__)
    assert set(treadle.__all__) <= set(dir(treadle))
    for name in treadle.__all__:
        assert getattr(treadle, name) is not None, name
    assert isinstance(treadle.__version__, str) and treadle.__version__
    assert treadle.OpenAI is treadle.lang.OpenAI  # a real backend (tests/test_sglang_port_s43.py)
    for name in API_BACKENDS[1:]:  # as treadle.lang's: a name that refuses when called
        with pytest.raises(ValueError, match=f"sgl.{name}.*no API backends"):
            getattr(treadle, name)("some-model")


def test_sglang_names_treadle_lacks_raise_an_attribute_error_naming_them():
    # sgl.ServerArgs is SGLang's sglang.srt.server_args.ServerArgs (it was missing until session 40)
    from treadle import ServerArgs
    from treadle.srt.server_args import ServerArgs as at_its_path

    assert treadle.ServerArgs is ServerArgs is at_its_path and "ServerArgs" in treadle.__all__
    with pytest.raises(AttributeError, match="'no_such_name'"):
        treadle.no_such_name


def test_importing_the_runtime_does_not_load_the_dsl():
    """A scheduler process imports treadle.runtime.scheduler: the top-level package stays cheap
    (nothing of treadle.lang, no torch from `import treadle` alone)."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == os.path.join(REPO, "treadle", "__init__.py")
    out = subprocess.run([sys.executable, "-c", "import sys, treadle; assert 'torch' not in sys.modules, 1;"
                          "assert not [m for m in sys.modules if m.startswith('treadle.')]"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_subpackages_are_attributes_on_first_use():
    """SGLang programs reach `sgl.lang.ir`; a subpackage not yet imported was an AttributeError."""
    out = subprocess.run([sys.executable, "-c", "import treadle as sgl; print(sgl.lang.ir.REGEX_INT);"
                          "print(sgl.constrained.__name__, 'radix_cache' in dir(sgl))"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[-+]?[0-9]+[ \\n]*", "treadle.constrained True"]


def test_the_editable_install_maps_the_top_level_package(tmp_path):
    """From a folder outside the checkout `treadle` comes through the installed package's
    mapping, not the current directory (pyproject.toml's package-dir)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the install's own mapping
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == os.path.join(REPO, "treadle", "__init__.py")


@pytest.mark.slow
def test_a_wheel_holds_the_top_level_package_and_nothing_generic(tmp_path):
    # from a copy of the sources: setuptools builds in the tree's build/, where an earlier build's
    # files would stay
    src, wheels, target = tmp_path / "src", tmp_path / "wheels", tmp_path / "site"
    src.mkdir()
    for name in ["pyproject.toml", "README.md", "treadle", "lang", "runtime", "radix_cache", "constrained", "kernels"]:
        copy = shutil.copytree if os.path.isdir(os.path.join(REPO, name)) else shutil.copy
        copy(os.path.join(REPO, name), src / name, **({} if copy is shutil.copy else {"ignore": PYCACHE}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                    "-w", str(wheels)], check=True, cwd=tmp_path, timeout=300)
    (wheel,) = wheels.glob("treadle-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "treadle/__init__.py" in names
    assert {n.split("/")[0] for n in names} == {"treadle", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "treadle/lang/__init__.py" in names and "treadle/runtime/scheduler.py" in names
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, cwd=tmp_path, timeout=300)
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(target / "treadle" / "__init__.py")
    # run inside the checkout with that install and no editable mapping (-S: no .pth files; torch
    # and the rest from this interpreter's site-packages): the checkout's treadle/ comes first on
    # sys.path, and the installed subpackages must still be found
    site = sysconfig.get_paths()["purelib"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), site]))
    out = subprocess.run([sys.executable, "-S", "-c", PROBE], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
