"""`treadle serve` / `treadle router` reject bad flags at once: a non-zero exit with the
subcommand's usage and a one-line `error:` from argparse, before any model is loaded or child
process started (no traceback, no 15 s model load first)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from treadle.runtime.cli import build_parser
from treadle.runtime.engine_args import EngineArgs

FAST_S = 20.0  # a flag error exits in about a second; loading the model first takes 15 s or more


def treadle(*argv: str, timeout: float = 60.0) -> tuple[int, str, str, float]:
    """Run `treadle ARGV...` as `python -m treadle.runtime.cli`; (rc, stdout, stderr, seconds).
    On timeout the whole process group (server children included) is killed."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "treadle.runtime.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"treadle {' '.join(argv)} still ran after {timeout} s; stderr tail: {err[-2000:]}")
    finally:
        try:  # anything it left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out, err, time.monotonic() - t0


def assert_usage_error(argv: list[str], command: str, *expected: str) -> None:
    rc, _, err, elapsed = treadle(command, *argv)
    assert rc != 0, err
    assert elapsed < FAST_S, f"took {elapsed:.1f} s: {err[-2000:]}"
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
def test_serve_bad_flag_is_a_usage_error(argv, expected):
    assert_usage_error(argv, "serve", *expected)


def test_serve_help_shows_defaults():
    rc, out, err, elapsed = treadle("serve", "--help")
    assert rc == 0, err
    assert elapsed < FAST_S
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
def test_router_bad_flag_is_a_usage_error(argv, expected):
    assert_usage_error(argv, "router", *expected)


@pytest.mark.parametrize("argv, expected", [
    ([], "at least one replica"),
    (["--worker", _WORKER, "--health-interval-s", "-1"], "--health-interval-s must be > 0"),
], ids=["no-replica", "health-interval"])
def test_router_module_entry_point_checks_flags_too(argv, expected):
    """`python -m treadle.runtime.router` (the README's other spelling) ended in a traceback
    on a missing --worker and took a health interval of 0 (checks back to back)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "treadle.runtime.router", *argv], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "usage:" in proc.stderr and "error: " in proc.stderr and expected in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < FAST_S


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
