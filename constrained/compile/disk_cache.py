"""Token indexes that took long to build, kept on disk so a restarted server does not build
them again (some schemas and nested EBNF grammars take tens of seconds to minutes).

A file holds one index, named by a hash of the regex and of everything else the build
depends on: the vocabulary (token bytes, EOS ids, logits width) and the versions of
outlines-core, interegular and this file's format. A file that cannot be read
(another version, truncated, corrupt) is a miss and is removed. The folder is kept under
`max_bytes` by removing the least recently used files. Writes are atomic (a temporary file
renamed), so concurrent servers sharing the folder never read half a file.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
from importlib.metadata import PackageNotFoundError, version
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 5  # bump when what is pickled changes (2: vocabularies carry the hole placeholders; 3: indexes are
# built marked, index_markers.py; 4: no character FSM; 5: the entry and call placeholders, json_holes.py)


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def vocabulary_fingerprint(token_bytes: list[bytes | None], eos_token_ids: tuple[int, ...], vocab_size: int) -> str:
    h = hashlib.sha256()
    h.update(repr((FORMAT, _version("outlines-core"), _version("interegular"), eos_token_ids, vocab_size)).encode())
    for b in token_bytes:
        h.update(b"\x00" if b is None else b"\x01" + len(b).to_bytes(4, "little") + b)
    return h.hexdigest()


class GrammarDiskCache:
    def __init__(self, folder: str, fingerprint: str, max_bytes: int = 2 << 30, min_compile_s: float = 1.0) -> None:
        self.folder = folder
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self.min_compile_s = min_compile_s  # faster builds are not worth a file

    def path(self, regex: str) -> str:
        key = hashlib.sha256((self.fingerprint + "\x00" + regex).encode()).hexdigest()
        return os.path.join(self.folder, key[:40] + ".grammar")

    def load(self, regex: str) -> tuple[Any, float] | None:
        """(index, seconds the build took) for `regex`, or None."""
        path = self.path(regex)
        try:
            with open(path, "rb") as f:
                fmt, fingerprint, stored_regex, index, seconds = pickle.load(f)
            if (fmt, fingerprint, stored_regex) != (FORMAT, self.fingerprint, regex):
                raise ValueError("a different grammar under this name")
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001 - any unreadable file is a miss
            log.warning("grammar cache: dropping unreadable %s (%s: %s)", path, type(e).__name__, e)
            try:
                os.unlink(path)
            except OSError:
                pass
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        log.info("grammar cache: loaded a %.1f s build from %s", seconds, path)
        return index, seconds

    def size(self, regex: str) -> int:
        """Bytes of the file holding ``regex``'s index (0 when there is none): what the index
        weighs, as the compiler's memory cache counts it."""
        try:
            return os.path.getsize(self.path(regex))
        except OSError:
            return 0

    def store(self, regex: str, index: Any, seconds: float) -> bool:
        """Keep a build that took at least min_compile_s; returns whether it was written."""
        if seconds < self.min_compile_s:
            return False
        path = self.path(regex)
        try:
            os.makedirs(self.folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump((FORMAT, self.fingerprint, regex, index, seconds), f,
                                protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:  # a full or read-only disk costs the cache, not the request
            log.warning("grammar cache: cannot write %s: %s", path, e)
            return False
        self._evict()
        return True

    def _evict(self) -> None:
        files = []
        for name in os.listdir(self.folder):
            if name.endswith(".grammar"):
                p = os.path.join(self.folder, name)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                files.append((st.st_mtime, st.st_size, p))
        total = sum(s for _, s, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            try:
                os.unlink(p)
                total -= size
            except OSError:
                pass

