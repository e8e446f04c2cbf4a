"""The grammar compile worker: a plain `python -m` subprocess talking length-prefixed pickles
over its stdin/stdout. A subprocess (not multiprocessing) because spawn/forkserver re-import
the caller's `__main__`, which breaks user scripts that lack an `if __name__ == "__main__"`
guard; fork is unsafe in a process that already runs threads."""
from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import time
from typing import Any, BinaryIO

_HEADER = struct.Struct("<Q")


def _write(f: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEADER.pack(len(data)))
    f.write(data)
    f.flush()


def _read_exact(f: BinaryIO, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError("compile worker pipe closed")
        buf += chunk
    return bytes(buf)


def _read(f: BinaryIO) -> Any:
    (n,) = _HEADER.unpack(_read_exact(f, _HEADER.size))
    return pickle.loads(_read_exact(f, n))


class WorkerProcess:
    """Parent side: a Process/Connection-like pair over the subprocess's pipes."""

    def __init__(self, vocab: Any, memory_limit_bytes: int | None) -> None:
        env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, "-m", "treadle.constrained.compile.compile_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        _write(self.proc.stdin, (vocab, memory_limit_bytes))
        self.last_bytes = 0

    # Connection-like
    def send(self, obj: Any) -> None:
        _write(self.proc.stdin, obj)

    def recv(self) -> Any:
        (n,) = _HEADER.unpack(_read_exact(self.proc.stdout, _HEADER.size))
        self.last_bytes = n  # a built index's pickle size: the compiler's cache counts it
        return pickle.loads(_read_exact(self.proc.stdout, n))

    def poll(self, timeout: float) -> bool:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return bool(r)

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    # Process-like
    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()


def _regex_job(spec: Any, whitespace_pattern: str | None, mode: str, holes: bool, depth: int,
               max_size: int | None = None, lazy: bool = True) -> tuple:
    """A spec's regex, as ``GrammarCompiler`` asks for it: ("regex", text) for outlines-core's
    index, ("lazy", text, its LazyNFA) for the lazy one (lazy_index.py), ("invalid", the
    ValueError naming the grammar's problem, a GrammarTooLarge past ``max_size``), ("oom", why)
    or ("error", what went wrong)."""
    from treadle.constrained.compile.compiler import spec_automaton

    try:
        regex, nfa = spec_automaton(spec, whitespace_pattern, mode, holes, depth, max_size, lazy)
    except MemoryError:
        return ("oom", "ran out of memory")
    except ValueError as e:
        try:  # the parent raises this very error when it survives the trip
            pickle.loads(pickle.dumps(e))
        except Exception:  # noqa: BLE001 - an exception class that does not pickle
            e = ValueError(str(e))
        return ("invalid", e)
    except Exception as e:  # noqa: BLE001 - forwarded to the caller, not swallowed
        return ("error", f"{type(e).__name__}: {e}")
    return ("regex", regex) if nfa is None else ("lazy", regex, nfa)


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    vocab, memory_limit_bytes = _read(stdin)
    if memory_limit_bytes is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    from outlines_core import Index

    from treadle.constrained.index.index_markers import marked

    # what the regex step imports (the schema and EBNF translators, jsonschema, interegular) is
    # loaded now, so that no grammar's time limit pays for it
    import treadle.constrained.ebnf.ebnf  # noqa: F401
    import treadle.constrained.schema.json_schema  # noqa: F401
    from treadle.constrained.compile.compiler import spec_automaton  # noqa: F401

    _write(stdout, ("ready",))
    while True:
        try:
            regex = _read(stdin)
        except EOFError:
            return  # parent went away
        if regex is None:
            return
        if isinstance(regex, tuple):  # ("regex", spec, ...): the spec -> regex step
            _write(stdout, _regex_job(*regex[1:]))
            continue
        t0 = time.perf_counter()
        try:
            index = Index(marked(regex), vocab)  # index_markers.py: why the markers
        except MemoryError:
            _write(stdout, ("oom", "ran out of memory"))
            continue
        except Exception as e:  # noqa: BLE001 - forwarded to the caller, not swallowed
            _write(stdout, ("error", f"{type(e).__name__}: {e}"))
            continue
        _write(stdout, ("ok", index, time.perf_counter() - t0))


if __name__ == "__main__":
    main()
