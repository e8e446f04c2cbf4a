"""SGLang's test harness, `sglang.test.test_utils` (`from treadle.test.test_utils import ...`):
the flags and backend of its benchmark scripts, the raw-result dump, the CI switch of its doc
notebooks, and what its tests start a model with (`sgl.Runtime(model_path=
DEFAULT_MODEL_NAME_FOR_TEST)` in test/lang, `popen_launch_server` and `kill_process_tree` (from
`sglang.srt.utils`) around every server test), so such a test runs with its imports changed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import unittest
from typing import Any

import requests

# The model a test starts: treadle's embedded SmolLM2-135M-Instruct, by its Hugging Face id (SGLang's
# tests name larger models, which treadle does not download).
DEFAULT_MODEL_NAME_FOR_TEST = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_SMALL_MODEL_NAME_FOR_TEST = DEFAULT_MODEL_NAME_FOR_TEST
DEFAULT_URL_FOR_TEST = "http://127.0.0.1:21157"
DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH = 600


class CustomTestCase(unittest.TestCase):
    """The base class of SGLang's unittest tests (there it retries failed tests in its CI); a
    plain TestCase here."""


def is_in_ci() -> bool:
    """SGLang's `sglang.test.test_utils.is_in_ci`, which its doc notebooks call in their first cell:
    whether the SGLANG_IS_IN_CI environment variable is true ("1", "true", "yes", any case)."""
    return os.environ.get("SGLANG_IS_IN_CI", "false").strip().lower() in ("1", "true", "yes")


# ---------------------------------------------------------------- servers for tests

def popen_launch_server(model: str, base_url: str, timeout: float, api_key: str | None = None,
                        other_args: Any = (), env: dict | None = None, return_stdout_stderr: tuple | None = None,
                        device: str = "auto") -> subprocess.Popen:
    """Start `python -m treadle.launch_server --model-path model --host H --port P` (H and P from
    `base_url`, then `other_args`: SGLang's flags, which launch_server translates, and `--api-key`)
    and return the process once `/health_generate` answers 200, as SGLang's helper.
    `return_stdout_stderr` is a (stdout, stderr) pair of files for its output (else it goes to
    this process's). A server that exits while starting is a RuntimeError naming its exit
    status; one not ready within `timeout` seconds is killed and a TimeoutError. Another
    server already answering at `base_url` (one left running on that port) is not taken for
    this one: this one then fails to bind its port, which is the RuntimeError."""
    scheme, sep, rest = base_url.partition("://")
    host, _, port = rest.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"popen_launch_server: base_url must be http://HOST:PORT, got {base_url!r}")
    command = [sys.executable, "-m", "treadle.launch_server", "--model-path", model, *map(str, other_args),
               "--host", host, "--port", port]
    if device != "auto":
        command += ["--device", device]
    if api_key:
        command += ["--api-key", api_key]
    print(f"command={' '.join(command)}")
    out, err = return_stdout_stderr or (None, None)
    process = subprocess.Popen(command, stdout=out, stderr=err, env=env, text=return_stdout_stderr is not None,
                               start_new_session=True)
    from treadle.lang.runtime_process import server_pid_at

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    other = None  # the pid of another server found answering at base_url
    with requests.Session() as session:
        while time.monotonic() < deadline:
            code = process.poll()
            if code is not None:
                taken = (f" (port {port} is served by another process, pid {other}: stop it or pick another port)"
                         if other is not None else "")
                raise RuntimeError(f"the server process exited with status {code} while starting{taken}; "
                                   "its log says why")
            try:
                if session.get(f"{base_url.rstrip('/')}/health_generate", headers=headers, timeout=10).status_code == 200:
                    pid = server_pid_at(base_url, api_key)
                    if pid == process.pid:
                        return process
                    other = pid if pid is not None else "unknown"
            except requests.RequestException:
                pass
            time.sleep(0.05)  # a refused connection costs nothing; readiness is seen within 50 ms
    kill_process_tree(process.pid)
    raise TimeoutError(f"the server at {base_url} did not become ready within {timeout} s")


def kill_process_tree(parent_pid: int | None, include_parent: bool = True, skip_pid: int | None = None,
                      grace_s: float = 10.0) -> None:
    """Stop a process and every process under it (SGLang's `sglang.srt.utils.kill_process_tree`;
    `parent_pid` None is this process, which is then spared: only its children stop). SIGTERM
    first (the parent, else the children), so a treadle server stops its workers and removes
    its IPC directory itself; whatever is left after `grace_s` seconds is sent SIGKILL. A
    process already gone is left alone; `skip_pid` is never signalled."""
    if parent_pid is None:
        parent_pid, include_parent = os.getpid(), False
    if parent_pid == os.getpid():
        include_parent = False
    tree = [p for p in _descendants(parent_pid) if p != skip_pid]
    first = [parent_pid] if include_parent else tree
    everyone = tree + ([parent_pid] if include_parent else [])
    for pid in first:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in everyone):
        time.sleep(0.1)
    for pid in everyone:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (children first), from /proc's parent ids; [] where there is no /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except FileNotFoundError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # the fields after "(comm)": state, ppid, ...
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet waited for, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------- the benchmarks' harness

def add_common_sglang_args_and_parse(parser: Any) -> Any:
    """SGLang's benchmark scripts' (benchmark/*/bench_sglang.py) common flags, added to their own
    parser, which is then parsed: --parallel (run_batch threads, 64), --host
    ("http://127.0.0.1"), --port (30000), --backend ("srt"), --device ("gpu"), --result-file
    ("result.jsonl") and --raw-result-file, as SGLang's."""
    parser.add_argument("--parallel", type=int, default=64)
    parser.add_argument("--host", type=str, default="http://127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--backend", type=str, default="srt")
    parser.add_argument("--device", type=str, default="gpu")
    parser.add_argument("--result-file", type=str, default="result.jsonl")
    parser.add_argument("--raw-result-file", type=str)
    return parser.parse_args()


def select_sglang_backend(args: Any) -> Any:
    """The backend of a benchmark's --backend: "srt" (and "srt-..."), a RuntimeEndpoint at
    --host:--port ("srt-no-parallel" also sets global_config.enable_parallel_encoding = False);
    "gpt-..." is SGLang's OpenAI backend of that model (`sgl.OpenAI`: OpenAI's API, or the server
    at OPENAI_BASE_URL). Anything else is SGLang's ValueError."""
    if args.backend.startswith("srt"):
        from treadle.lang.backend_http import RuntimeEndpoint
        from treadle.lang.global_config import global_config

        if args.backend == "srt-no-parallel":
            global_config.enable_parallel_encoding = False
        return RuntimeEndpoint(f"{args.host}:{args.port}")
    if args.backend.startswith("gpt-"):
        import treadle.lang

        return treadle.lang.OpenAI(args.backend)
    raise ValueError(f"Invalid backend: {args.backend}")


def dump_bench_raw_result(path: str | None, states: list, preds: list, labels: list) -> None:
    """Write one JSON line per program state to `path` (SGLang's helper, which its benchmarks call
    with `--raw-result-file`; nothing without a path): `prompt_id`, `prompt` (the state's text
    before its `answer`), `output` (`state["answer"]`) and `correct` (whether `preds[i] ==
    labels[i]`)."""
    if not path:
        return
    if not len(states) == len(preds) == len(labels):
        raise ValueError(f"dump_bench_raw_result: {len(states)} states, {len(preds)} preds and {len(labels)} "
                         "labels; give one of each per question")
    rows = []
    for i, state in enumerate(states):
        output = state["answer"]
        prompt = state.text()
        if output and prompt.endswith(output):
            prompt = prompt[: -len(output)]
        rows.append({"prompt_id": i, "prompt": prompt, "output": output, "correct": bool(preds[i] == labels[i])})
    print(f"BenchRawResultDumper save results to {path}")
    with open(path, "w") as fout:
        fout.write("\n".join(json.dumps(row) for row in rows))
