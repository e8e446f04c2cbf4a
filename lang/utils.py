"""The helpers of SGLang's `sglang.utils` that its frontend tutorial and examples use around a
program (`from treadle.utils import print_highlight, wait_for_server, terminate_process,
http_request` ports them): printing a result, waiting for a server to come up, stopping a
server process, one HTTP request to a server."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import requests


def print_highlight(content: Any) -> None:
    """Print `content` so it stands out: as bold blue HTML in a Jupyter notebook, in bold blue on
    a terminal, plainly otherwise (a pipe, a file)."""
    text = str(content)
    shell = _ipython_kernel()
    if shell is not None:
        from IPython.display import HTML, display

        display(HTML(f"<strong style='color: #00008B;'>{_html(text)}</strong>"))
    elif sys.stdout.isatty():
        print(f"\033[1;34m{text}\033[0m")
    else:
        print(text)


def wait_for_server(base_url: str, timeout: float | None = None, api_key: str | None = None) -> None:
    """Wait until the server at `base_url` answers `/health` with 200 (for ever without a
    `timeout`, in seconds; then a TimeoutError naming the URL)."""
    base_url = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            if requests.get(base_url + "/health", headers=headers, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"the server at {base_url} did not become ready within {timeout} s")
        time.sleep(0.5)


def terminate_process(process: Any, timeout: float = 30.0) -> None:
    """Stop a server started as a child process: a `subprocess.Popen` (SIGTERM, then SIGKILL to
    its process group after `timeout` seconds), a `multiprocessing.Process` (terminate, then
    kill), or a pid (SIGTERM). A process already gone is left alone."""
    if isinstance(process, int):
        try:
            os.kill(process, signal.SIGTERM)
        except ProcessLookupError:
            pass
        return
    if isinstance(process, subprocess.Popen):
        if process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                process.kill()
            process.wait()
        return
    process.terminate()  # a multiprocessing.Process
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()


def http_request(url: str, json: Any = None, stream: bool = False, api_key: str | None = None, verify: Any = None,
                 method: str | None = None) -> requests.Response:
    """One request to a server, as SGLang's helper: a POST of `json` (a GET without it, unless
    `method` says otherwise), with `api_key` as a bearer token and `verify` as requests' TLS
    verification. Returns the response (`.json()`, `.status_code`), whatever its status; with
    `stream=True` its body is read as it comes (`.iter_lines()`)."""
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    method = method or ("GET" if json is None else "POST")
    return requests.request(method, url, json=json, headers=headers, stream=stream,
                            verify=True if verify is None else verify)


def _ipython_kernel() -> Any:
    """The IPython shell when running in a notebook kernel (not a terminal IPython), else None."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    shell = ipython.get_ipython()
    return shell if shell is not None and type(shell).__name__ == "ZMQInteractiveShell" else None


def _html(text: str) -> str:
    import html

    return html.escape(text).replace("\n", "<br>")
