"""The `treadle` command.

    treadle serve [--model-path PATH] [--host 127.0.0.1] [--port 30000] [...every EngineArgs flag]

Subcommands are registered in `_SUBCOMMANDS` (a `router` for data-parallel replicas can be
added there without touching `serve`).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from treadle.runtime.engine_args import EngineArgs


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP (native /generate and OpenAI /v1 API)",
                       description="Serve a model over HTTP. With no --model-path, the embedded "
                                   "SmolLM2-135M-Instruct is served.")
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=_run_serve)


def _run_serve(ns: argparse.Namespace) -> None:
    from treadle.runtime.server.launcher import main_from_args

    main_from_args(EngineArgs.from_cli_args(ns))


# name -> function adding the subparser (which sets `func`)
def _add_router(sub: argparse._SubParsersAction) -> None:
    from treadle.runtime.router import add_router_subcommand

    add_router_subcommand(sub)


_SUBCOMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {"serve": _add_serve, "router": _add_router}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treadle", description="treadle: a structured-generation LLM runtime")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        sys.exit(2)
    ns.func(ns)


if __name__ == "__main__":
    main()
