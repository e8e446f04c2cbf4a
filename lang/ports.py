"""Ports for servers started from Python (`launch_server_cmd`, `Runtime`): the first free one
from a start, held for this process until its server is stopped.

A port free when it is picked is bound by the server only once its model is loaded, seconds
later; two programs (two pytest workers, two notebooks) launching at once used to pick the same
port, and one talked to the other's server. A reservation is an exclusive `flock` on a file
named after the port in the temporary directory: a launcher skips a port another process holds,
and holds the one it picks until it stops that server. Where the lock directory cannot be used
(a read-only temporary directory, no `fcntl`), ports are picked by the bind check alone.
"""
from __future__ import annotations

import os
import socket
import tempfile

try:
    import fcntl
except ImportError:  # not on Windows: no reservations, the bind check alone
    fcntl = None  # type: ignore[assignment]

LOCK_DIR = os.path.join(tempfile.gettempdir(), "treadle-port-locks")


class PortReservation:
    """The lock on one port's file; `release()` (idempotent) lets other launchers take it."""

    def __init__(self, port: int, fd: int | None) -> None:
        self.port = port
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, _close=os.close) -> None:  # bound here: at interpreter exit `os` may be gone
        fd, self._fd = self._fd, None
        if fd is not None:
            _close(fd)  # closing the file drops its flock

    def __del__(self) -> None:
        self.release()


def reserve_port(host: str, start: int = 30000, end: int = 40000) -> PortReservation:
    """The first port from `start` that no other launcher holds and a server can bind on `host`,
    held until `release()` (RuntimeError when none is in start..end-1)."""
    for port in range(start, end):
        fd = _lock(port)
        if fd is False:
            continue  # another process's server has it (or is starting on it)
        if _bindable(host, port):
            return PortReservation(port, fd)
        if fd is not None:
            os.close(fd)
    raise RuntimeError(f"no free port in {start}..{end - 1} on {host}")


def free_port_from(start: int, host: str, end: int = 40000) -> int:
    """The first port from `start` a server can bind on `host` and no launcher holds (not held
    afterwards: `reserve_port` holds it)."""
    reservation = reserve_port(host, start, end)
    reservation.release()
    return reservation.port


def _lock(port: int) -> int | None | bool:
    """An fd holding the exclusive lock of `port`'s file; False when another process holds it;
    None when locks cannot be used here."""
    if fcntl is None:
        return None
    try:
        os.makedirs(LOCK_DIR, mode=0o777, exist_ok=True)
        fd = os.open(os.path.join(LOCK_DIR, f"{port}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None  # another user's directory, a read-only one: the bind check alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    except OSError:
        os.close(fd)
        return None
    return fd


def _bindable(host: str, port: int) -> bool:
    """Whether a server can bind `port` on `host` now (an IPv6 address, "::1", is tried as IPv6:
    an IPv4 socket cannot bind it, which made every port look taken)."""
    all_interfaces = host in ("", "::")
    family = socket.AF_INET6 if ":" in host and not all_interfaces else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0" if all_interfaces else host, port))
        except OSError:
            return False
    return True
