"""Session 46's porting checks of treadle.lang (SGLang programs with `import treadle.lang as sgl`),
over conftest's shared Runtime (a real server subprocess of the embedded model)."""
from __future__ import annotations

import subprocess
import sys

import pytest

import treadle.lang as sgl


def test_runtime_does_not_take_another_servers_health_for_its_own(sgl_runtime):
    """A Runtime picks a free port, then its server loads the model and binds it; another
    process may take the port meanwhile (seen here: a test's server started on the same port a
    second earlier). Its /health answered 200, the Runtime took it for its own server and ran the
    program on the other one (its own exited on 'address already in use'). Here: a child that
    never serves (it exits after a second) while the shared Runtime's server answers the URL."""
    rt = sgl.Runtime.__new__(sgl.Runtime)
    rt.server_args, rt.url = sgl_runtime.server_args, sgl_runtime.url
    rt._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    try:
        with pytest.raises(RuntimeError, match=r"served by another process \(pid \d+\)"):
            rt._wait_healthy(60)
    finally:
        rt._proc.wait()
        rt._proc = None
