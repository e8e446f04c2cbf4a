"""`python -m sglang.launch_server ...` ported as `python -m treadle.launch_server ...`: SGLang's
common server flags, translated by the table sgl.Runtime and sgl.Engine use; the ones treadle
has no equivalent of, and unknown ones, refused naming each."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests
from test_server_ready_banner_log_line import HF_ID, _start, _stop

from treadle.runtime.server.testing import free_port


@pytest.mark.slow
def test_python_m_treadle_launch_server_takes_sglangs_flags_and_serves(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "treadle.launch_server", "--model-path", HF_ID, "--host", "127.0.0.1",
           "--port", str(port), "--tp", "1", "--mem-fraction-static", "0.8", "--context-length", "2048",
           "--random-seed", "7", "--disable-cuda-graph", "--trust-remote-code", "--log-level", "info",
           "--max-total-tokens", "4096"]
    proc, url, out, err = _start(cmd, tmp_path, port)
    try:
        args = requests.get(url + "/get_server_info", timeout=30).json()["engine_args"]
        assert (args["seed"], args["cuda_graph"], args["tp_size"], args["context_length"]) == (7, False, 1, 2048)
        assert (args["mem_fraction_static"], args["model_path"]) == (0.8, HF_ID)
        r = requests.post(url + "/generate", json={"text": "The capital of France is",
                                                   "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
                          timeout=60)
        assert r.status_code == 200 and "Paris" in r.json()["text"]
        # the model is served under the id it was started with, as SGLang's server
        assert requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"] == HF_ID
    finally:
        _stop(proc)
    # at info level the banner is a log line on stderr; stdout stays empty
    assert open(out).read() == ""
    assert "INFO treadle is ready at http://127.0.0.1:" in open(err).read()


def test_launch_server_refuses_unknown_and_sglang_only_flags_naming_each():
    run = subprocess.run([sys.executable, "-m", "treadle.launch_server", "--chat-template", "chatml",
                          "--no-such-flag", "1", "--dp", "2"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert "--chat-template: roles render with the served model's own chat template" in run.stderr
    assert "--dp-size: a server is one replica" in run.stderr  # SGLang's --dp is its --dp-size
    assert "unknown flag --no-such-flag" in run.stderr
    run = subprocess.run([sys.executable, "-m", "treadle.launch_server", "--random-seed", "1", "--seed", "2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--random-seed and --seed: both name treadle's 'seed'" in run.stderr
    # no prefix of a flag passes for it (argparse's abbreviations): SGLang has no --disable-cuda
    run = subprocess.run([sys.executable, "-m", "treadle.launch_server", "--disable-cuda"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "unknown flag --disable-cuda" in run.stderr


def test_treadle_launch_server_is_found_through_the_editable_install(tmp_path):
    # from outside the checkout: the installed package's own mapping, not the current directory
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-m", "treadle.launch_server", "--help"], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "--random-seed" in run.stdout and "--model-path" in run.stdout
