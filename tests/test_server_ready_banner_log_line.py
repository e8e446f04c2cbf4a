"""The server's ready banner is a log line at info level on stderr, as SGLang's "ready to roll":
nothing below info, and never on stdout. `_start` / `_stop` run a server command as a
subprocess with its stdout and stderr in files (test_sglang_launch_server_module uses them too)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import requests

from treadle.runtime.model_source import embedded_model_path
from treadle.runtime.server.testing import free_port

HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _start(cmd: list[str], tmp_path, port: int) -> tuple[subprocess.Popen, str, str, str]:
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, f"the server exited with {proc.returncode}:\n{err.read_text()[-3000:]}"
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, err.read_text()[-3000:]
        time.sleep(0.3)
    # the banner is written just after the server starts listening
    for _ in range(50):
        if "is ready" in out.read_text() + err.read_text():
            break
        time.sleep(0.1)
    return proc, url, str(out), str(err)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


@pytest.mark.slow
def test_treadle_serve_prints_no_ready_banner_below_info_and_takes_the_lowercase_hf_id(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "treadle.runtime.launch_server", "--model-path", HF_ID.lower(),
           "--port", str(port), "--log-level", "warning", "--max-total-tokens", "4096"]
    proc, url, out, err = _start(cmd, tmp_path, port)
    try:
        assert requests.get(url + "/get_model_info", timeout=30).json()["model_path"] == embedded_model_path()
    finally:
        _stop(proc)
    assert open(out).read() == ""
    assert "is ready" not in open(err).read()
