"""Launch the multi-process server: spawn the scheduler and detokenizer processes, wait for
both to report ready, then serve HTTP in this process until told to stop.

Lifecycle guarantees:
- a child that dies during start-up (e.g. the model fails to load) ends the launch with an
  error naming the child and its traceback, within the start-up timeout;
- a child that dies while serving makes the server exit non-zero within seconds (watchdog),
  and so does a scheduler that has sent nothing for `--watchdog-timeout` seconds (a step
  that hangs: a stuck kernel or collective, a stopped process): it is killed first;
- SIGTERM / SIGINT drain: new requests get 503, running ones have `shutdown_grace_s` to
  finish, the rest are aborted, and the process exits 0; a second signal forces the exit;
- children are always torn down, and they exit by themselves if this process vanishes;
- a server started by treadle.lang's Runtime exits when the process that started it dies,
  even by SIGKILL (exit_with_starter).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterator

import uvicorn

from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.server.detokenizer_process import run_detokenizer_process
from treadle.runtime.server.ipc import IpcPaths
from treadle.runtime.server.scheduler_process import run_scheduler_process

log = logging.getLogger("treadle.server")

STARTUP_TIMEOUT_S = float(os.environ.get("TREADLE_STARTUP_TIMEOUT_S", "600"))
WATCHDOG_PERIOD_S = 0.5
# after a child death, exit even if the graceful path hangs on a stuck connection
HARD_EXIT_AFTER_S = 5.0


class LaunchError(RuntimeError):
    """A child process failed to start."""


# The children's OpenMP threads (torch's CPU kernels, runtime/cpu_quant.c's packed matmuls)
# sleep between parallel regions instead of spinning (OpenMP's OMP_WAIT_POLICY; a value the
# user set is kept). A decode step on the CPU is ~120 short regions, and between two of them
# the spinning threads held the cores the detokenizer, this process and the tokenizer need for
# the same token: on the 2-core dev box one 64-token /generate of the embedded model took
# 4.3-8.0 s spinning against 2.1-2.2 s passive (and 2.2 s with OMP_NUM_THREADS=1).
CHILD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


# What the children import before their first line runs: the fork server (below) imports these
# once, and each child it forks starts with them imported. Not AutoTokenizer's module: it imports
# transformers' registry of every model, and the children load the tokenizer's saved copy
# without it (runtime/tokenizer.py); a model whose tokenizer needs it imports it in the child.
CHILD_PRELOAD = (
    "torch", "transformers",
    "treadle.runtime.server.scheduler_process", "treadle.runtime.server.detokenizer_process",
    "treadle.runtime.model_runner", "treadle.runtime.scheduler", "treadle.runtime.tokenizer",
    "treadle.runtime.gguf_packed",
)


class _Children:
    """The scheduler and detokenizer processes.

    They are forked by multiprocessing's fork server where the platform has one (else spawned).
    Forking this process after torch/zmq initialisation would be unsafe, and spawned children
    each imported torch and transformers themselves: ~1.5 s of CPU apiece, three processes at
    once on the server's cores. The fork server is a fresh single-threaded process started by
    the constructor; it imports CHILD_PRELOAD while this process imports its own modules and
    loads its tokenizer, and forks the children as soon as it is done (a thread here waits
    for it), so they load the model meanwhile too."""

    def __init__(self, args: EngineArgs, paths: IpcPaths) -> None:
        self.args, self.paths = args, paths
        self.procs: dict[str, mp.process.BaseProcess] = {}
        self.conns = {}
        self.failed: set[str] = set()  # children that reported an error or died during start-up
        self._starter: threading.Thread | None = None
        self._start_error: BaseException | None = None
        if "forkserver" in mp.get_all_start_methods():
            from multiprocessing import forkserver

            self.ctx = mp.get_context("forkserver")
            self.ctx.set_forkserver_preload(list(CHILD_PRELOAD))  # a module that fails to import is skipped
            with _child_env():  # the children inherit the fork server's environment
                forkserver.ensure_running()
            # Process.start() returns once the fork server has preloaded and forked
            self._starter = threading.Thread(target=self._start_in_thread, name="treadle-start-children",
                                             daemon=True)
            self._starter.start()
        else:
            self.ctx = mp.get_context("spawn")
            self._start()  # at once: the children's imports overlap this process's

    def start(self, timeout_s: float) -> None:
        """Return once both children are started; raise what starting them raised, or
        LaunchError if the fork server has not forked them within `timeout_s`."""
        if self._starter is not None:
            self._starter.join(timeout_s)
            if self._starter.is_alive():
                raise LaunchError(f"the fork server did not start the children in {timeout_s:.0f}s "
                                  "(set TREADLE_STARTUP_TIMEOUT_S to wait longer)")
        if self._start_error is not None:
            raise self._start_error

    def _start_in_thread(self) -> None:
        try:
            self._start()
        except BaseException as e:  # noqa: BLE001 - raised again by start(), in the launching thread
            self._start_error = e

    def _start(self) -> None:
        targets = {"scheduler": run_scheduler_process, "detokenizer": run_detokenizer_process}
        # the children's parent is the fork server, not this process: they watch this pipe,
        # whose write end only this process holds (never written; EOF once this process is gone)
        alive, self._alive_w = self.ctx.Pipe(duplex=False)
        try:
            with contextlib.ExitStack() as stack:
                if self._starter is None:  # a spawned child starts with this process's environment
                    stack.enter_context(_child_env())
                for name, target in targets.items():
                    recv, send = self.ctx.Pipe(duplex=False)
                    # not daemonic: the scheduler starts its own grammar-compile workers
                    p = self.ctx.Process(target=target, args=(self.args, self.paths, send, alive),
                                         name=f"treadle-{name}")
                    p.start()
                    send.close()
                    self.procs[name], self.conns[name] = p, recv
        finally:
            alive.close()

    def wait_ready(self, timeout_s: float) -> dict[str, dict]:
        """Every child's ready info; LaunchError if one reports an error, dies or is late."""
        infos: dict[str, dict] = {}
        deadline = time.monotonic() + timeout_s
        while len(infos) < len(self.procs):
            for name, conn in self.conns.items():
                if name in infos:
                    continue
                p = self.procs[name]
                if conn.poll(0.1):
                    try:
                        kind, payload = conn.recv()
                    except EOFError as e:
                        self.failed.add(name)
                        p.join(2)
                        raise LaunchError(f"the {name} process exited with code {p.exitcode} during start-up") from e
                    if kind == "error":
                        self.failed.add(name)
                        raise LaunchError(f"the {name} process failed during start-up:\n{payload}")
                    infos[name] = payload
                elif not p.is_alive():
                    self.failed.add(name)
                    raise LaunchError(f"the {name} process exited with code {p.exitcode} during start-up "
                                      "(killed for memory?)")
            if time.monotonic() > deadline:
                missing = sorted(set(self.procs) - set(infos))
                raise LaunchError(f"{', '.join(missing)} not ready after {timeout_s:.0f}s "
                                  "(set TREADLE_STARTUP_TIMEOUT_S to wait longer)")
        return infos

    def dead(self) -> tuple[str, mp.process.BaseProcess] | None:
        for name, p in self.procs.items():
            if not p.is_alive():
                return name, p
        return None

    def shutdown(self) -> None:
        """Stop every child and return once all have exited: SIGTERM (the scheduler unwinds
        and stops its grammar workers), SIGKILL for one still running after 10 s."""
        if self._starter is not None:  # a launch that failed early: let the start finish first
            self._starter.join(10)
        for name in self.failed:  # exiting already, with its own exit code: no signal
            self.procs[name].join(0.5)
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("%s did not stop in 10s; killing it", p.name)
                p.kill()
                p.join(5)
        if self._starter is not None:
            # The fork server has nothing left to fork. Left alone it exits once this process
            # has, tearing down its torch and transformers first (~0.6 s of CPU, while whatever
            # runs next starts); SIGTERM ends it at once (it has no handler for it).
            from multiprocessing import forkserver

            pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)


@contextlib.contextmanager
def _child_env() -> Iterator[None]:
    """CHILD_ENV set in this process's environment (where a value is not set already) while
    children are started from it."""
    added = {k: v for k, v in CHILD_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


class _Server(uvicorn.Server):
    """uvicorn with a draining shutdown and an exit code."""

    def __init__(self, config: uvicorn.Config, state, children: _Children) -> None:
        super().__init__(config)
        self.state = state
        self.children = children
        self.exit_code = 0
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # deliberately not uvicorn's handler: it re-raises the signal after serving, which
        # would turn a clean drain into death-by-SIGTERM
        if self.draining or self.loop is None:
            log.warning("second signal: exiting now")
            if self.loop is not None:  # what still runs ends as aborted, not cancelled mid-response
                self.loop.call_soon_threadsafe(self.state.tm.end_all, "aborted: the server is exiting now")
            self.should_exit = self.force_exit = True
            return
        self.draining = True
        self.state.tm.draining = True
        log.info("signal %d: draining (grace %.1fs)", sig, self.state.args.shutdown_grace_s)
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._drain()))

    async def _drain(self) -> None:
        tm = self.state.tm
        had_requests = tm.num_in_flight > 0
        deadline = time.monotonic() + self.state.args.shutdown_grace_s
        while tm.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if tm.num_in_flight:
            log.warning("grace period over: aborting %d request(s)", tm.num_in_flight)
            tm.abort_all()
            end = time.monotonic() + 5
            while tm.num_in_flight and time.monotonic() < end:
                await asyncio.sleep(0.05)
        if tm.num_in_flight:  # the scheduler is in a long step: end them here, as aborted
            log.warning("the scheduler did not end %d aborted request(s) in 5s; ending them now",
                        tm.end_all("aborted: the server is shutting down"))
        if had_requests:
            await asyncio.sleep(0.2)  # let the handlers write their final responses
        self.should_exit = True

    async def watchdog(self) -> None:
        timeout = self.state.args.watchdog_timeout
        while not self.should_exit:
            silent = time.monotonic() - self.state.tm.sched_heard
            if timeout > 0 and silent > timeout and self.children.procs["scheduler"].is_alive():
                # it sends a snapshot between steps every STATS_PERIOD_S: one step has hung
                p = self.children.procs["scheduler"]
                log.error("the scheduler (pid %d) has sent nothing for %.0fs (--watchdog-timeout %gs): a step "
                          "hangs; killing it", p.pid, silent, timeout)
                p.kill()
                p.join(5)
            dead = self.children.dead()
            failure = self.state.tm.recv_failure()
            if dead is not None or failure is not None:
                if dead is not None:
                    name, p = dead
                    msg = f"the {name} process (pid {p.pid}) died with exit code {p.exitcode}"
                else:  # its outputs can reach no request any more: every request would wait forever
                    msg = f"the server's output loop failed ({failure})"
                log.error("%s; shutting the server down", msg)
                self.state.tm.fail_all(msg)
                self.exit_code = 1
                self.should_exit = True
                t = threading.Timer(HARD_EXIT_AFTER_S, os._exit, (1,))
                t.daemon = True
                t.start()
                return
            await asyncio.sleep(WATCHDOG_PERIOD_S)


def banner(args: EngineArgs, info: dict) -> str:
    url = f"http://{args.host}:{args.port}"
    auth = " -H 'Authorization: Bearer <your api key>'" if args.api_key else ""
    return (f"treadle is ready at {url}  (model {info['model_path']}, {info['num_slots']} KV slots)\n"
            f"  curl {url}/generate -H 'Content-Type: application/json'{auth} "
            "-d '{\"text\": \"The capital of France is\", \"sampling_params\": {\"max_new_tokens\": 16}}'")


def launch_server(args: EngineArgs, on_ready: Callable[[str], None] | None = None) -> int:
    """Run the server until it is stopped; returns the process exit code."""
    from treadle.runtime.model_source import resolve_model_source

    logging.basicConfig(level=args.log_level.upper(), format="[server] %(levelname)s %(message)s")
    try:
        source = resolve_model_source(args.model_path, tokenizer_path=args.tokenizer_path)
    except ValueError as e:  # a bad --model-path: say so without a traceback or any child
        log.error("%s", e)
        return 1
    paths = IpcPaths.create()
    children = _Children(args, paths)  # the fork server imports the children's modules meanwhile
    tm = None
    try:
        from treadle.runtime.fault_injection import install_recv_fault, install_tokenize_hold
        from treadle.runtime.server.http_protocol import header_deadline_protocol
        from treadle.runtime.server.http_server import ServerState, create_app
        from treadle.runtime.server.metrics import ServerMetrics
        from treadle.runtime.server.tokenizer_manager import TokenizerManager
        from treadle.runtime.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(source)
        install_tokenize_hold(tokenizer)  # tests only: a no-op unless TREADLE_FAULT_HOLD_TOKENIZE is set
        children.start(STARTUP_TIMEOUT_S)
        infos = children.wait_ready(STARTUP_TIMEOUT_S)
        info = {**infos["scheduler"], "tokenizer_path": source.tokenizer_path}
        tm = TokenizerManager(args, tokenizer, info, paths, ServerMetrics())
        install_recv_fault(tm)  # tests only: a no-op unless TREADLE_FAULT_RECV_CALLS is set
        state = ServerState(args, tm, tm.metrics, info,
                            child_pids={name: p.pid for name, p in children.procs.items()})
        config = uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level=args.log_level,
                                access_log=args.log_level == "debug", timeout_graceful_shutdown=5,
                                lifespan="off", http=header_deadline_protocol(
                                    args.request_body_timeout_s, args.stream_write_timeout_s))
        server = _Server(config, state, children)

        async def main() -> None:
            server.loop = asyncio.get_running_loop()
            tm.start()
            watchdog = asyncio.ensure_future(server.watchdog())

            async def announce() -> None:
                while not server.started and not server.should_exit:
                    await asyncio.sleep(0.05)
                if server.started:
                    (on_ready or _log_ready)(banner(args, info))

            announcer = asyncio.ensure_future(announce())
            try:
                await server.serve()
            finally:
                watchdog.cancel()
                announcer.cancel()

        asyncio.run(main())
        return server.exit_code
    except LaunchError as e:
        log.error("%s", e)
        return 1
    finally:
        if tm is not None:
            tm.close()
        children.shutdown()
        paths.cleanup()


def _log_ready(msg: str) -> None:
    # a log line at info level on the log's stream (stderr), as SGLang's "ready to roll": quiet
    # below info, and never on stdout, which stays the program's
    log.info("%s", msg)


def install_sigterm_as_exit() -> None:
    """Before the server runs, SIGTERM (e.g. during the model load) exits cleanly through
    the teardown path instead of leaving the children to notice the parent is gone."""
    def handler(sig: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + sig)

    signal.signal(signal.SIGTERM, handler)


# Set (by treadle.lang's Runtime) to the number of a pipe's read end this process inherits,
# whose write end the starting process holds: the server exits when that process is gone.
STARTER_PIPE_ENV = "TREADLE_STARTER_PIPE_FD"


def exit_with_starter(grace_s: float) -> None:
    """If STARTER_PIPE_ENV names a pipe, watch it: when the process that started this server
    is gone, by any death (SIGKILL too, where atexit never runs), the kernel closes its write
    end, the read here sees end-of-file, and the server shuts down as on SIGTERM (a drain of
    `grace_s`; exit regardless 30 s after that). A pipe, not Linux's PR_SET_PDEATHSIG, which
    fires when the parent *thread* that forked ends (a Runtime made in a worker thread would
    lose its server with that thread), nor polling the parent pid (a reparented server and
    pid reuse). The variable is taken out of the environment, so this server's own children
    do not see it; `treadle serve` run by hand never has it."""
    raw = os.environ.pop(STARTER_PIPE_ENV, None)
    if raw is None:
        return
    try:
        fd = int(raw)
        os.set_inheritable(fd, False)
    except (ValueError, OSError) as e:  # not a pipe this process holds: nothing to watch
        log.error("%s=%r is not an open file descriptor (%s): the server will not exit with its starter",
                  STARTER_PIPE_ENV, raw, e)
        return

    def watch() -> None:
        while os.read(fd, 1):  # the starter never writes: only end-of-file comes
            pass
        log.warning("the process that started this server is gone: shutting down")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s + 30.0)  # still here: the drain hangs
        log.error("the server did not stop %.0f s after its starter died: exiting now", grace_s + 30.0)
        os._exit(1)

    threading.Thread(target=watch, name="starter-watch", daemon=True).start()


def popen_with_starter(cmd: list[str], env: dict[str, str], **popen_kw: Any) -> tuple[subprocess.Popen, int]:
    """Start a server `cmd` that exits with this process (exit_with_starter): it inherits a
    pipe's read end, named in `env` as STARTER_PIPE_ENV; the write end is returned with the
    process, to be held while it runs and closed after it has stopped."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(cmd, pass_fds=(read_end,), env={**env, STARTER_PIPE_ENV: str(read_end)}, **popen_kw)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return proc, write_end


def main_from_args(args: EngineArgs) -> None:
    """The server process's entry point: serve, then exit with launch_server's code."""
    install_sigterm_as_exit()
    exit_with_starter(args.shutdown_grace_s)
    code = launch_server(args)
    # Everything the server started has stopped and its IPC dir is gone. All the interpreter
    # has left to do is tear down torch's and transformers' modules: ~0.6 s of CPU, 1-1.5 s
    # on a busy 2-core box, between the server's last log line and its exit. Flush the
    # output and exit without it (only this entry point: launch_server() itself returns).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
