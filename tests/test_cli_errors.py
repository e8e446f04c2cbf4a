"""`treadle serve` / `treadle router` reject bad flags at once: a non-zero exit with the
subcommand's usage and a one-line `error:` from argparse, before any model is loaded or child
process started (no traceback, no 15 s model load first)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from treadle.runtime.cli import build_parser
from treadle.runtime.engine_args import EngineArgs

# What a command loads only once its flags were accepted: the server's launcher (which loads the
# model, 15 s or more, and starts the scheduler), the model code, and uvicorn (a server or the
# router serving). A flag error must exit before any of it is imported.
LATE_MODULES = ("treadle.runtime.server.launcher", "treadle.runtime.model_runner", "treadle.runtime.scheduler",
                "uvicorn")

# runs a module as `python -m` would, and writes the names of the modules imported when the
# process exits (argparse's SystemExit included) to the file named by argv[1]
_RUN_AND_LIST_MODULES = """
import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
sys.argv[0] = sys.argv[1]
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def run_module(module: str, *argv: str, tmp_path, timeout: float = 60.0) -> tuple[int, str, str, set[str]]:
    """Run `python -m MODULE ARGV...`; (rc, stdout, stderr, the modules it had imported at its
    exit). On timeout the whole process group (server children included) is killed."""
    listing = tmp_path / f"modules-{os.getpid()}-{len(list(tmp_path.iterdir()))}.txt"
    proc = subprocess.Popen([sys.executable, "-c", _RUN_AND_LIST_MODULES, str(listing), module, *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{module} {' '.join(argv)} still ran after {timeout} s; stderr tail: {err[-2000:]}")
    finally:
        try:  # anything it left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert listing.exists(), f"the process did not exit through Python's exit handlers: {err[-2000:]}"
    return proc.returncode, out, err, set(listing.read_text().split())


def treadle(*argv: str, tmp_path, timeout: float = 60.0) -> tuple[int, str, str, set[str]]:
    """`treadle ARGV...` as `python -m treadle.runtime.cli`: (rc, stdout, stderr, modules)."""
    return run_module("treadle.runtime.cli", *argv, tmp_path=tmp_path, timeout=timeout)


def assert_nothing_started(modules: set[str], err: str) -> None:
    """Not a clock: the flags were judged before the command's work began (the model load)."""
    late = [m for m in LATE_MODULES if m in modules]
    assert not late, f"imported {late} before exiting: {err[-2000:]}"
    assert any(m.startswith("treadle.runtime.") for m in modules), "no treadle module in the listing"


def assert_usage_error(argv: list[str], command: str, *expected: str, tmp_path) -> None:
    rc, _, err, modules = treadle(command, *argv, tmp_path=tmp_path)
    assert rc != 0, err
    assert_nothing_started(modules, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) < 5, err
    assert f"usage: treadle {command}" in err, err
    assert f"treadle {command}: error:" in lines[-1], err
    for word in expected:
        assert word in lines[-1], err


@pytest.mark.parametrize("argv, expected", [
    (["--port", "-1"], ["port", "-1"]),
    (["--port", "65536"], ["port", "65536"]),
    (["--mem-fraction-static", "5"], ["mem_fraction_static"]),
    (["--max-total-tokens", "0"], ["max_total_tokens"]),
    (["--context-length", "0"], ["context_length"]),
    (["--max-running-requests", "0"], ["max_running_requests"]),
    (["--log-level", "bogus"], ["--log-level", "bogus", "invalid choice"]),
    (["--bogus-flag"], ["unrecognized arguments", "--bogus-flag"]),
], ids=["port-negative", "port-too-big", "mem-fraction", "max-total-tokens", "context-length",
        "max-running-requests", "log-level", "unknown-flag"])
def test_serve_bad_flag_is_a_usage_error(argv, expected, tmp_path):
    assert_usage_error(argv, "serve", *expected, tmp_path=tmp_path)


def test_serve_help_shows_defaults(tmp_path):
    rc, out, err, modules = treadle("serve", "--help", tmp_path=tmp_path)
    assert rc == 0, err
    assert_nothing_started(modules, err)
    text = " ".join(out.split())  # argparse wraps lines
    assert "usage: treadle serve" in text
    assert "--port PORT (default: 30000)" in text
    assert "(default: info)" in text and "{debug,info,warning,error,critical}" in text
    assert "(default: 8192)" in text and "<= 0 disables chunking" in text


_WORKER = "http://127.0.0.1:32999"  # nothing listens: the router must fail before it looks


@pytest.mark.parametrize("argv, expected", [
    ([], ["at least one replica"]),
    (["--worker", _WORKER, "--port", "70000"], ["port", "70000"]),
    (["--worker", _WORKER, "--log-level", "bogus"], ["--log-level", "bogus", "invalid choice"]),
    (["--worker", _WORKER, "--bogus-flag"], ["unrecognized arguments", "--bogus-flag"]),
    (["--worker", _WORKER, "--health-interval-s", "0"], ["--health-interval-s must be > 0"]),
    (["--worker", _WORKER, "--max-tree-chars", "0"], ["--max-tree-chars must be >= 1"]),
], ids=["no-replica", "port", "log-level", "unknown-flag", "health-interval", "tree-chars"])
def test_router_bad_flag_is_a_usage_error(argv, expected, tmp_path):
    assert_usage_error(argv, "router", *expected, tmp_path=tmp_path)


@pytest.mark.parametrize("argv, expected", [
    ([], "at least one replica"),
    (["--worker", _WORKER, "--health-interval-s", "-1"], "--health-interval-s must be > 0"),
], ids=["no-replica", "health-interval"])
def test_router_module_entry_point_checks_flags_too(argv, expected, tmp_path):
    """`python -m treadle.runtime.router` (the README's other spelling) ended in a traceback
    on a missing --worker and took a health interval of 0 (checks back to back)."""
    rc, _, err, modules = run_module("treadle.runtime.router", *argv, tmp_path=tmp_path)
    assert rc == 2 and "Traceback" not in err, err
    assert "usage:" in err and "error: " in err and expected in err, err
    assert_nothing_started(modules, err)


# ---- in process: the same checks through build_parser()

def test_parse_args_builds_and_checks_engine_args(capsys):
    parser = build_parser()
    ns = parser.parse_args(["serve", "--port", "0", "--log-level", "warning"])
    assert ns.engine_args == EngineArgs.from_cli_args(ns) == EngineArgs(port=0, log_level="warning")
    assert parser.parse_args(["serve", "--port", "65535"]).engine_args.port == 65535
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["serve", "--port", "65536"])
    assert exc.value.code == 2
    assert "treadle serve: error: port must be in [0, 65535], got 65536" in capsys.readouterr().err


def test_engine_args_checks_port_and_log_level():
    for bad in (-1, 65536, 1 << 20):
        with pytest.raises(ValueError, match="port"):
            EngineArgs(port=bad)
    assert EngineArgs(port=0).port == 0 and EngineArgs(port=65535).port == 65535
    with pytest.raises(ValueError, match="log_level must be one of debug, info, warning, error, critical"):
        EngineArgs(log_level="bogus")
    assert EngineArgs().log_level == "info"
