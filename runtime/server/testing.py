"""A real server subprocess for tests and benchmarks: free port, wait for /health, kill the
whole process group on exit.

    with ServerProcess(["--max-total-tokens", "8192"]) as srv:
        requests.post(srv.url + "/generate", json={...})
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import requests


def free_port() -> int:
    """A port for a test's server on 127.0.0.1, held for the rest of this process (ports.py), so
    no other test process picks it. It lies below the kernel's ephemeral range: a port the kernel
    hands out (bind to 0) can be given to an outgoing connection in the seconds before the server
    binds it, which then fails to start."""
    from treadle.lang.ports import reserve_port

    reservation = reserve_port("127.0.0.1", 20000, min(30000, _ephemeral_low()))
    _HELD.append(reservation)
    return reservation.port


_HELD: list = []  # the reservations free_port made: released when this process exits


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class ServerProcess:
    def __init__(self, extra_args: list[str] | None = None, port: int | None = None,
                 startup_timeout_s: float = 300.0, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="treadle-server-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "treadle.runtime.launch_server", "--host", "127.0.0.1",
               "--port", str(self.port), *(extra_args or [])]
        # its own session, so cleanup can kill the server and every child it spawned; and it
        # watches a pipe whose write end this process holds (launcher.exit_with_starter), so a
        # test process killed before its cleanup (a pytest timeout, SIGKILL) takes its server
        # with it instead of leaving it running beside the next tests
        from treadle.runtime.server.launcher import popen_with_starter

        self.proc, self._starter_pipe = popen_with_starter(
            cmd, {**os.environ, **(env or {})}, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_healthy(startup_timeout_s)
        except BaseException:
            self.kill()  # idempotent; closes the pipe
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass  # not listening yet
            time.sleep(0.05)  # a refused connection costs nothing; a 0.5 s poll cost 0.25 s a start on average
        self.kill()
        raise TimeoutError(f"server not healthy after {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        with open(self.log.name) as f:
            return f.read()[-n:]

    def kill(self) -> None:
        """Stop the server: SIGTERM first (so it removes its IPC dir), then SIGKILL whatever is
        left of its process group (idempotent)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass  # the group kill below ends it
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone together with its group
        self.proc.wait(timeout=30)
        pipe, self._starter_pipe = self._starter_pipe, None
        if pipe is not None:
            os.close(pipe)

    def close(self) -> None:
        self.kill()
        self.log.close()
        os.unlink(self.log.name)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sse_events(resp: requests.Response) -> list:
    """The `data:` payloads of an SSE response: parsed JSON, or the string "[DONE]"."""
    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def wait_idle(url: str, timeout_s: float = 90) -> dict:
    """Poll a server's /get_server_info until it holds no request; return that info."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = requests.get(url + "/get_server_info", timeout=30)
        assert r.status_code == 200, r.text
        i = r.json()
        if i["num_in_flight"] == 0 and i["num_running"] == 0 and i["num_waiting"] == 0:
            return i
        assert time.monotonic() < deadline, f"server not idle after {timeout_s}s: {i}"
        time.sleep(0.2)
