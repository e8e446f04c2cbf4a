"""`Runtime`: a treadle server in a child process, as a DSL backend (SGLang's `sgl.Runtime`).

    runtime = Runtime(model_path="...", port=30000)   # starts `treadle serve`, waits until healthy
    set_default_backend(runtime)
    ...
    runtime.shutdown()

Keyword arguments are the server's flags (EngineArgs field names: `model_path`, `tp_size`,
`max_total_tokens`, ...), or SGLang's names for them (`random_seed`, ...: engine_args.SGLANG_ARGS,
the table sgl.Engine and `python -m treadle.launch_server` use too); an unknown one is a
ValueError before anything starts.
"""
from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from typing import Any, AsyncIterator

import requests

from treadle.lang.backend_http import RuntimeEndpoint
from treadle.lang.ports import PortReservation, free_port_from, reserve_port


class Runtime:
    """A server process started from Python, stopped by `shutdown()` (also at interpreter exit);
    it also exits by itself when this process dies, even by SIGKILL.

    `set_default_backend(runtime)` or `run(backend=runtime)` run programs on it through
    `runtime.endpoint`, a RuntimeEndpoint. `log_level` is the server's (default "error", so it
    prints only errors; its ready banner is an info line, as SGLang's); `launch_timeout` bounds the wait for it to become healthy. The server takes the
    first free port from `port` (30000 when not given), as SGLang's; `runtime.url` has it."""

    def __init__(self, log_level: str = "error", launch_timeout: float = 300.0, **kwargs: Any) -> None:
        from treadle.lang.server_args import ServerArgs
        from treadle.runtime.engine_args import translate_sglang_args
        from treadle.runtime.model_source import resolve_model_source
        from treadle.runtime.server.launcher import popen_with_starter

        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self._starter_pipe: int | None = None  # the write end of the pipe the server watches
        self._port_reservation: PortReservation | None = None  # held until the server is stopped
        kwargs = translate_sglang_args(kwargs, "Runtime")  # SGLang's names (random_seed, ...): ValueError
        # as SGLang's Runtime: the first free port from the one given (30000 when none is), so a
        # port already taken (a server launched earlier) moves the new server up, not fails it;
        # reserved (ports.py) until shutdown, so a Runtime starting beside it picks another
        port = kwargs.get("port", 30000)
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 40000:
            self._port_reservation = reserve_port(kwargs.get("host", "127.0.0.1"), port)
            kwargs["port"] = self._port_reservation.port
        # SGLang's ServerArgs (treadle's EngineArgs with its url()); ValueError: a bad argument
        self.server_args = ServerArgs(log_level=log_level, **kwargs)
        # the model path too, before a process starts: a Hub id, a missing file or directory is
        # the server's ValueError here (the server would exit with it, a RuntimeError here)
        resolve_model_source(self.server_args.model_path, tokenizer_path=self.server_args.tokenizer_path)
        host = self.server_args.host
        self.url = _local_url(host, self.server_args.port)
        self.generate_url = self.url + "/generate"
        cmd = [sys.executable, "-m", "treadle.runtime.launch_server", *_flags({"log_level": log_level, **kwargs})]
        # The server runs in its own session (a Ctrl-C here is this process's to handle), so it
        # would outlive this process killed by SIGKILL or SIGTERM, where atexit does not run. It
        # watches a pipe instead (launcher.exit_with_starter): this process holds the write end,
        # and the kernel closes it when this process dies, however it dies.
        # the server logs to stderr, its ready banner too (an info line): as SGLang's Runtime, a
        # quiet log level prints nothing
        self._proc, self._starter_pipe = popen_with_starter(
            cmd, {**os.environ, "TOKENIZERS_PARALLELISM": "false"}, start_new_session=True)
        self.pid = self._proc.pid
        atexit.register(self.shutdown)
        try:
            self._wait_healthy(launch_timeout)
            self.endpoint = RuntimeEndpoint(self.url, api_key=self.server_args.api_key)
            self.endpoint._owner = weakref.ref(self)  # endpoint.shutdown() stops this server
        except BaseException:
            self.shutdown()
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        """Wait until this Runtime's own server answers /health. The port was free when it was
        picked, but another process may take it while the model loads; a healthy server at
        the URL that is not this one's child (its /get_server_info `pids.server` differs) is
        not taken for it: this one's server then fails to bind and exits, which is raised."""
        deadline = time.monotonic() + timeout_s
        other: Any = None  # the pid of another server found answering at self.url
        while True:
            code = self._proc.poll()
            if code is not None:
                taken = (f"; port {self.server_args.port} is served by another process (pid {other}), which took "
                         "it while this server was starting: start the Runtime again (it picks the next free "
                         "port) or pass another port=" if other is not None else "")
                raise RuntimeError(f"the treadle server exited with status {code} while starting{taken}; "
                                   "its error is printed above (pass log_level='info' for more)")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    server_pid = server_pid_at(self.url, self.server_args.api_key)
                    if server_pid == self._proc.pid:
                        return
                    other = server_pid if server_pid is not None else "unknown"
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the treadle server at {self.url} did not become healthy within {timeout_s} s")
            time.sleep(0.05)  # a refused connection costs nothing; readiness is seen within 50 ms

    def shutdown(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL to its process group after 30 s). Idempotent."""
        proc, self._proc = self._proc, None
        pipe, self._starter_pipe = self._starter_pipe, None
        self.pid = None
        reservation, self._port_reservation = self._port_reservation, None
        if proc is None:
            if reservation is not None:
                reservation.release()
            return
        atexit.unregister(self.shutdown)
        try:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
        finally:
            if pipe is not None:
                os.close(pipe)
            if reservation is not None:
                reservation.release()  # the server is gone: its port is free for others

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None:
            self.shutdown()

    # ------------------------------------------------------------ SGLang's helpers

    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def flush_cache(self) -> bool:
        return self.endpoint.flush_cache()

    def get_server_info(self) -> dict:
        """The server's info (as `sgl.get_server_info()`). SGLang's is a coroutine: this dict
        may also be awaited (`await runtime.get_server_info()`), giving itself."""
        return _AwaitableDict(self.endpoint.get_server_info())

    def get_tokenizer(self) -> Any:
        """The served model's tokenizer, loaded in this process."""
        from treadle.runtime.model_source import resolve_model_source
        from treadle.runtime.tokenizer import load_tokenizer

        args = self.server_args
        return load_tokenizer(resolve_model_source(args.model_path, tokenizer_path=args.tokenizer_path))

    def generate(self, prompt: str | list[str], sampling_params: dict | None = None, return_logprob: Any = False,
                 logprob_start_len: Any = None, top_logprobs_num: Any = None, lora_path: Any = None) -> str:
        """POST /generate and return the response body as JSON text (SGLang's Runtime.generate).
        A request the server refuses is a ValueError naming its message. `lora_path` (SGLang's)
        must be None, or a list of Nones: treadle serves no LoRA adapters."""
        if lora_path is not None and not (isinstance(lora_path, list) and all(p is None for p in lora_path)):
            raise ValueError(f"Runtime.generate(lora_path={lora_path!r}): treadle serves no LoRA adapters")
        body = {"text": prompt, "sampling_params": sampling_params or {}, "return_logprob": return_logprob}
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            body["top_logprobs_num"] = top_logprobs_num
        return json.dumps(self.endpoint._generate(body).json())

    async def async_generate(self, prompt: str, sampling_params: dict | None = None) -> AsyncIterator[str]:
        """Stream one generation's text deltas (SGLang's Runtime.async_generate / add_request)."""
        it = self.endpoint.generate_stream(prompt, dict(sampling_params or {}))
        end = object()
        while True:
            item = await asyncio.to_thread(next, it, end)
            if item is end:
                return
            yield item[0]

    add_request = async_generate


class _AwaitableDict(dict):
    """A dict that `await` gives back unchanged: a call SGLang makes a coroutine works both ways."""

    def __await__(self):
        return self
        yield  # a generator function: `await` runs it, and it returns at once


def _flags(kwargs: dict[str, Any]) -> list[str]:
    """EngineArgs keywords as `treadle serve` flags (booleans as --x / --no-x; None left out)."""
    out: list[str] = []
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def server_pid_at(url: str, api_key: str | None = None) -> Any:
    """The pid of the treadle HTTP server answering at `url` (its /get_server_info
    `pids.server`; None when it does not say). A server started here is checked to be the one
    that answers: another process may have taken its port while it loaded the model."""
    resp = requests.get(url.rstrip("/") + "/get_server_info", timeout=10,
                        headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
    pids = resp.json().get("pids") if resp.status_code == 200 else None
    return pids.get("server") if isinstance(pids, dict) else None


def _local_url(host: str, port: int) -> str:
    """The URL this machine reaches a server bound to `host` at: the loopback address for
    all interfaces, an IPv6 address in brackets ("::1" -> "http://[::1]:port")."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def _free_port_from(start: int, host: str, end: int = 40000) -> int:
    """The first port from `start` that a server can bind on `host` and no launcher holds."""
    return free_port_from(start, host, end)
