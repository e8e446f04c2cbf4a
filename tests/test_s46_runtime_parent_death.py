"""A server started by treadle.lang's Runtime exits when the process that started it dies,
even by SIGKILL (session 46): it runs in its own session and atexit never runs on SIGKILL, so
it kept its port and memory. It now watches a pipe whose write end the starter holds
(launcher.exit_with_starter). So does the tests' ServerProcess (session 47: a helper's pytest
run killed by its timeout left a server running beside the later tests)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.slow

STARTERS = {
    "runtime": textwrap.dedent("""
        import json, time
        import treadle.lang as sgl
        from treadle.runtime.server.testing import free_port

        rt = sgl.Runtime(port=free_port(), max_total_tokens=1024)
        print(json.dumps({"pid": rt.pid, "url": rt.url}), flush=True)
        time.sleep(600)
    """),
    "server_process": textwrap.dedent("""
        import json, time
        from treadle.runtime.server.testing import ServerProcess

        srv = ServerProcess(["--max-total-tokens", "1024"])
        print(json.dumps({"pid": srv.proc.pid, "url": srv.url}), flush=True)
        time.sleep(600)
    """),
}


def _alive(pid: int) -> bool:
    """Running (a zombie left for a parent that does not reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("starter_kind", sorted(STARTERS))
def test_runtime_server_exits_when_its_starter_is_killed(starter_kind):
    starter = subprocess.Popen([sys.executable, "-c", STARTERS[starter_kind]], stdout=subprocess.PIPE, text=True)
    server_pid = None
    try:
        line = starter.stdout.readline()
        assert line, f"the starter exited with {starter.wait()} before its Runtime was up"
        server_pid = json.loads(line)["pid"]
        assert _alive(server_pid)
        starter.send_signal(signal.SIGKILL)  # no atexit, no shutdown(): only the kernel closes its files
        starter.wait(timeout=30)
        deadline = time.monotonic() + 30  # a liveness bound, not a timing: it exits in about a second
        while time.monotonic() < deadline and _alive(server_pid):
            time.sleep(0.2)
        assert not _alive(server_pid), "the Runtime's server outlived the process that started it"
    finally:
        starter.kill()
        starter.wait(timeout=30)
        if server_pid is not None and _alive(server_pid):
            os.killpg(server_pid, signal.SIGKILL)  # its own session: the server and its children
