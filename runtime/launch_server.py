"""`python -m treadle.runtime.launch_server [--flags]`: start the HTTP server (same flags as
`treadle serve`)."""
from __future__ import annotations

import argparse

from treadle.runtime.engine_args import EngineArgs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m treadle.runtime.launch_server",
                                     description="Serve a model over HTTP (native and OpenAI-compatible API).")
    EngineArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)
    from treadle.runtime.server.launcher import main_from_args

    main_from_args(EngineArgs.from_cli_args(ns))


if __name__ == "__main__":
    main()
