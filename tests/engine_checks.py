"""The tiny in-process Engine the Engine hostile tests share, and the check each of them makes
after a hostile call: the engine idle and holding no KV slot."""
from __future__ import annotations

from treadle.runtime import Engine


def tiny_engine() -> Engine:
    """A dummy tiny-llama Engine (512 KV slots, context 256); use it as a context manager."""
    return Engine(model_path="dummy:tiny-llama", max_total_tokens=512, context_length=256)


def assert_idle(engine: Engine) -> None:
    """Nothing running or waiting, the pool consistent, every slot free or evictable."""
    engine.check_integrity()
    info = engine.get_server_info()
    assert info["num_running"] == 0 and info["num_waiting"] == 0
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"]
