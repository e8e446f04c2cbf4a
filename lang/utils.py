"""The helpers of SGLang's `sglang.utils` that its tutorials, examples and benchmarks use around a
program (`from treadle.utils import print_highlight, wait_for_server, ...` ports them): printing
a result, starting a server command and waiting for it to come up, stopping it, one HTTP
request to a server, merging an offline Engine's stream, fetching a benchmark's data, reading
JSONL and writing states' text; and `get_tokenizer` of `sglang.srt.hf_transformers_utils`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

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
    `timeout`, in seconds; then a TimeoutError naming the URL). For a server `launch_server_cmd`
    started here: a RuntimeError as soon as it exits, and a server answering on its port that
    is not it (another program's, which took the port first) is not taken for it."""
    base_url = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = None if timeout is None else time.monotonic() + timeout
    launched = _launched_at(base_url)
    other = None  # the pid of another process's server found answering at base_url
    while True:
        if launched is not None and launched.poll() is not None:
            taken = f", and another process's server (pid {other}) answers there" if other is not None else ""
            raise RuntimeError(f"the server launched on {base_url} exited with status {launched.returncode} "
                               f"before it was ready{taken}; its output is above")
        try:
            if requests.get(base_url + "/health", headers=headers, timeout=5).status_code == 200:
                if launched is None:
                    return
                from treadle.lang.runtime_process import server_pid_at

                pid = server_pid_at(base_url, api_key)
                if not isinstance(pid, int) or _descends_from(pid, launched.pid):
                    return
                other = pid
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
        try:
            _stop_popen(process, timeout)
        finally:
            _forget_launched(process)  # launch_server_cmd's port is free for others now
        return
    process.terminate()  # a multiprocessing.Process
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()


def _stop_popen(process: subprocess.Popen, timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                process.kill()
            process.wait()


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


# ---------------------------------------------------------------- images (SGLang's vision programs)

def encode_image_base64(image_path: str | bytes) -> str:
    """The base64 text of an image file (a path) or of its bytes, as SGLang's helper. treadle
    serves text-only models: a program that goes on to send the image (`sgl.image`) gets a
    ValueError saying so there."""
    import base64

    if isinstance(image_path, str):
        with open(image_path, "rb") as f:
            data = f.read()
    elif isinstance(image_path, (bytes, bytearray)):
        data = bytes(image_path)
    else:
        raise ValueError("encode_image_base64 takes an image file's path or its bytes, "
                         f"got {type(image_path).__name__}")
    return base64.b64encode(data).decode("utf-8")


def load_image(image_file: Any) -> Any:
    """SGLang's `sglang.srt.utils.load_image` (an image as a PIL image and its size, for
    `sgl.image` or a request's image_data): a ValueError here, as treadle serves text-only models."""
    shown = repr(image_file) if isinstance(image_file, str) and len(image_file) <= 200 else type(image_file).__name__
    raise ValueError(f"load_image({shown}): treadle serves text-only models, so a program cannot use an image; "
                     "describe it in text, or run this program on SGLang with a vision model")


# ---------------------------------------------------------------- starting a server from a notebook

def execute_shell_command(command: str) -> subprocess.Popen:
    """Start `command` (split on whitespace, backslash line continuations joined), as SGLang's
    helper: its output goes to this process's stdout and stderr. A command starting with
    `python` or `python3` runs on this interpreter (`sys.executable`), whose environment has
    treadle installed, wherever PATH's `python` points. The process leads a session of its own,
    so `terminate_process` can stop the server's children with it."""
    parts = command.replace("\\\n", " ").replace("\\", " ").split()
    if not parts:
        raise ValueError("execute_shell_command: the command is empty")
    if parts[0] in ("python", "python3"):
        parts[0] = sys.executable
    return subprocess.Popen(parts, text=True, stderr=subprocess.STDOUT, start_new_session=True)


def launch_server_cmd(command: str, host: str = "0.0.0.0", port: int | None = None) -> tuple[subprocess.Popen, int]:
    """Start a server command with `--port` added (a free port from 30000 when `port` is None),
    as SGLang's tutorials do first: `launch_server_cmd("python -m treadle.launch_server
    --model-path HuggingFaceTB/SmolLM2-135M-Instruct --host 0.0.0.0")` returns (process, port);
    then `wait_for_server(f"http://localhost:{port}")`, and `terminate_process(process)` at the end.
    The port picked is held for this process (ports.py) until `terminate_process` stops the
    server, so programs launching at once get different ports; `wait_for_server` on it raises
    if this server exits before it is ready, and does not take another's server for it."""
    from treadle.lang.ports import reserve_port

    reservation = reserve_port(host) if port is None else None
    if reservation is not None:
        port = reservation.port
    try:
        process = execute_shell_command(f"{command} --port {port}")
    except BaseException:
        if reservation is not None:
            reservation.release()
        raise
    _LAUNCHED[port] = (process, reservation)
    return process, port


# port -> (process, its PortReservation or None): the servers launch_server_cmd started here
_LAUNCHED: dict[int, tuple[subprocess.Popen, Any]] = {}


def _launched_at(base_url: str) -> subprocess.Popen | None:
    """The process launch_server_cmd started on `base_url`'s port, if any (and not yet stopped)."""
    from urllib.parse import urlsplit

    try:
        port = urlsplit(base_url).port
    except ValueError:
        return None
    entry = _LAUNCHED.get(port) if port is not None else None
    return entry[0] if entry is not None else None


def _forget_launched(process: subprocess.Popen) -> None:
    """Drop a stopped server's entry and release its port."""
    for port, (proc, reservation) in list(_LAUNCHED.items()):
        if proc is process:
            del _LAUNCHED[port]
            if reservation is not None:
                reservation.release()


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether process `pid` is `ancestor` or one of its descendants (True where /proc cannot
    tell: only a server shown to be another's is refused)."""
    for _ in range(64):
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # field 4: the parent's pid
        except (OSError, ValueError, IndexError):
            return not os.path.isdir("/proc/self")
        if pid <= 1:
            return False
    return False


def _free_port(host: str, start: int = 30000, end: int = 40000) -> int:
    from treadle.lang.ports import free_port_from

    return free_port_from(start, host, end)


# ---------------------------------------------------------------- the offline Engine's streaming helpers

def trim_overlap(existing_text: str, new_chunk: str) -> str:
    """`new_chunk` without its longest prefix that is a suffix of `existing_text` (SGLang's helper)."""
    for i in range(min(len(existing_text), len(new_chunk)), 0, -1):
        if existing_text.endswith(new_chunk[:i]):
            return new_chunk[i:]
    return new_chunk


def stream_and_merge(llm: Any, prompt: str, sampling_params: dict | None = None) -> str:
    """The whole text of a streamed `llm.generate(prompt, sampling_params, stream=True)`, as
    SGLang's offline-engine example merges it: each chunk holds the text so far (the Engine's
    default, as SGLang's), and what it adds past the merged text is kept (`trim_overlap`)."""
    final_text = ""
    for chunk in llm.generate(prompt, sampling_params, stream=True):
        final_text += trim_overlap(final_text, chunk["text"])
    return final_text


async def async_stream_and_merge(llm: Any, prompt: str, sampling_params: dict | None = None):
    """Yield what each chunk of a streamed `await llm.async_generate(prompt, sampling_params,
    stream=True)` adds to the text so far, as SGLang's offline-engine example prints them."""
    generator = await llm.async_generate(prompt, sampling_params, stream=True)
    final_text = ""
    async for chunk in generator:
        cleaned_chunk = trim_overlap(final_text, chunk["text"])
        final_text += cleaned_chunk
        yield cleaned_chunk


# ---------------------------------------------------------------- SGLang's benchmark helpers

def read_jsonl(filename: str) -> Iterator[Any]:
    """Yield each JSON line of a file, skipping lines that start with '#' (SGLang's helper)."""
    with open(filename) as fin:
        for line in fin:
            if line.startswith("#"):
                continue
            yield json.loads(line)


def dump_state_text(filename: str, states: list, mode: str = "w") -> None:
    """Write each program state's text (a string as is, anything else by `str`) to a file between
    separator lines, as SGLang's helper. A state whose program failed (a run_batch item whose
    gen the server refused) is written with the text it had, as SGLang's `text()` gives it;
    `state.error()` has the error."""
    from treadle.lang.state import ProgramState

    with open(filename, mode) as fout:
        for i, s in enumerate(states):
            if isinstance(s, ProgramState):
                s = s.text()
            elif not isinstance(s, str):
                s = str(s)
            fout.write("=" * 40 + f" {i} " + "=" * 40 + "\n" + s + "\n" + "=" * 80 + "\n\n")


def download_and_cache_file(url: str, filename: str | None = None) -> str:
    """The path of a local copy of `url`, downloaded once (SGLang's helper; its gsm8k and
    hellaswag benchmarks fetch their data with it): `filename`, by default the URL's last path
    part in the temporary directory (/tmp). A file already there is returned as it is, without
    a request. The download goes to a temporary file beside it, renamed into place once
    complete, so a failed one leaves no partial file to be taken for the data next time; an
    HTTP error status raises requests' HTTPError."""
    import tempfile

    from tqdm import tqdm

    if filename is None:
        name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if not name:
            raise ValueError(f"download_and_cache_file: the URL {url!r} names no file; pass filename=")
        filename = os.path.join(tempfile.gettempdir(), name)
    if os.path.exists(filename):
        return filename
    print(f"Downloading from {url} to {filename}")
    with requests.get(url, stream=True, timeout=60) as response:
        response.raise_for_status()
        total = int(response.headers.get("content-length", 0))
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(filename)),
                                       prefix=os.path.basename(filename) + ".", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fout, tqdm(desc=filename, total=total, unit="B", unit_scale=True,
                                                   unit_divisor=1024) as bar:
                for chunk in response.iter_content(chunk_size=1 << 16):
                    fout.write(chunk)
                    bar.update(len(chunk))
            os.replace(partial, filename)
        except BaseException:
            os.unlink(partial)
            raise
    return filename


# ---------------------------------------------------------------- sglang.srt.hf_transformers_utils

def get_tokenizer(tokenizer_name: str, *args: Any, tokenizer_mode: str = "auto", trust_remote_code: bool = False,
                  tokenizer_revision: str | None = None, **kwargs: Any) -> Any:
    """SGLang's `get_tokenizer(model_path)`: the transformers tokenizer of a model, as treadle
    loads it for serving (`tokenizer_name` is a model path treadle serves: an HF directory, a
    .gguf file, or the embedded model's Hugging Face id, as `RuntimeEndpoint.get_model_name()`
    gives it). No download, no remote code: `trust_remote_code` changes nothing;
    `tokenizer_mode` "auto" or "slow" and `tokenizer_revision` None are taken (the local files are
    loaded as they are); other arguments are a ValueError."""
    from treadle.runtime.model_source import resolve_model_source
    from treadle.runtime.tokenizer import load_tokenizer

    if args or kwargs:
        raise ValueError(f"get_tokenizer({tokenizer_name!r}): treadle takes no other tokenizer arguments "
                         f"({', '.join([*map(repr, args), *kwargs])})")
    if tokenizer_mode not in ("auto", "slow"):
        raise ValueError(f"get_tokenizer: tokenizer_mode must be 'auto' or 'slow', got {tokenizer_mode!r}")
    if tokenizer_revision is not None:
        raise ValueError("get_tokenizer: tokenizer_revision must be None: treadle loads local files and "
                         "downloads no revision")
    tokenizer = load_tokenizer(resolve_model_source(tokenizer_name))
    if tokenizer is None:
        raise ValueError(f"the model {tokenizer_name!r} has no tokenizer")
    return tokenizer
