"""Ports for servers started from Python (lang/ports.py): SGLang's tutorial cell
`launch_server_cmd` + `wait_for_server`, run by two programs at once (two pytest workers in CI),
picked the same free port; one server failed to bind and its program talked to the other's,
which then shut down under it (CI on aca5c27: a 503 'the server is shutting down' from
/get_model_info). No model is loaded here: the launched commands are tiny scripts."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from treadle.utils import launch_server_cmd, terminate_process, wait_for_server


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return f"python {path}"


def test_launches_at_once_get_different_ports_and_another_process_skips_a_held_one(tmp_path):
    """Nothing binds the port until the server has loaded its model; the bind check alone gave
    both launches (and another process's) the same port."""
    cmd = _script(tmp_path, "idle.py", "import time\ntime.sleep(60)\n")
    first, port1 = launch_server_cmd(cmd)
    second, port2 = launch_server_cmd(cmd)
    try:
        assert port1 != port2
        other = subprocess.run(
            [sys.executable, "-c", "from treadle.lang.utils import _free_port; print(_free_port('0.0.0.0'))"],
            capture_output=True, text=True, timeout=60, check=True)
        assert int(other.stdout) not in (port1, port2)
    finally:
        terminate_process(first)
        terminate_process(second)
    # stopped: the ports are no longer held by this process (a fresh lock on each succeeds)
    from treadle.lang.ports import _lock

    for port in (port1, port2):
        fd = _lock(port)
        assert fd is not False
        if fd is not None:
            import os

            os.close(fd)


def test_wait_for_server_raises_when_the_launched_server_exits(tmp_path):
    """It polled /health until its timeout (for ever without one) after the server had died."""
    process, port = launch_server_cmd(_script(tmp_path, "dies.py", "import sys\nsys.exit(3)\n"))
    try:
        with pytest.raises(RuntimeError, match=r"exited with status 3 before it was ready"):
            wait_for_server(f"http://localhost:{port}", timeout=20)
    finally:
        terminate_process(process)


def test_wait_for_server_does_not_take_another_processs_server_for_the_launched_one(tmp_path):
    """A server of another process answering on the launched server's port (it took the port
    first) made wait_for_server return; the program then ran on that server."""
    process, port = launch_server_cmd(_script(tmp_path, "slow.py", "import sys, time\ntime.sleep(3)\nsys.exit(1)\n"))

    class Other(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps({"pids": {"server": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", port), Other)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(RuntimeError, match=r"exited with status 1 .*another process's server \(pid 1\)"):
            wait_for_server(f"http://localhost:{port}", timeout=30)
    finally:
        other.shutdown()
        other.server_close()
        terminate_process(process)
