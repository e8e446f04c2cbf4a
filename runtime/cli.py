"""The `treadle` command.

    treadle serve [--model-path PATH] [--host 127.0.0.1] [--port 30000] [...every EngineArgs flag]

Subcommands are registered in `_SUBCOMMANDS` (a `router` for data-parallel replicas can be
added there without touching `serve`).
"""
from __future__ import annotations

import argparse
import copy
import sys
import typing
from typing import Any, Callable, Sequence

from treadle.runtime.engine_args import EngineArgs

LOG_LEVELS: tuple[str, ...] = typing.get_args(typing.get_type_hints(EngineArgs)["log_level"])


class _DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends each flag's default to its help, also for a flag with no help text (which
    argparse would list bare, its default unsaid)."""

    def _format_action(self, action: argparse.Action) -> str:
        if (action.option_strings and action.help is not argparse.SUPPRESS and not (action.help or "").strip()
                and action.default is not argparse.SUPPRESS):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)


class _SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an error prints a one-line usage, not argparse's synopsis of every
    flag (40 lines for `serve`), then `treadle CMD: error: ...`, and exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"usage: {self.prog} [options]  ('{self.prog} --help' lists them)\n"
                     f"{self.prog}: error: {message}\n")


class _CommandParser(argparse.ArgumentParser):
    """The `treadle` parser. Once a subcommand's flags are parsed, its `build_args` default (if
    any) runs on the namespace; a ValueError from it, and any unrecognized flag, is reported by
    that subcommand's parser (its usage, then `treadle CMD: error: ...`; exit 2), before the
    command starts anything."""

    subcommands: dict[str, argparse.ArgumentParser]

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        sub = self.subcommands.get(getattr(ns, "command", None) or "")
        if sub is None:
            if extras:
                self.error(f"unrecognized arguments: {' '.join(extras)}")
            return ns
        if extras:
            sub.error(f"unrecognized arguments: {' '.join(extras)}")
        build = getattr(ns, "build_args", None)
        if build is not None:
            try:
                build(ns)
            except ValueError as e:
                sub.error(str(e))
        return ns


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP (native /generate and OpenAI /v1 API)",
                       description="Serve a model over HTTP. With no --model-path, the embedded "
                                   "SmolLM2-135M-Instruct is served.",
                       formatter_class=_DefaultsHelpFormatter)
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=_run_serve, build_args=_build_serve_args)


def _build_serve_args(ns: argparse.Namespace) -> None:
    ns.engine_args = EngineArgs.from_cli_args(ns)  # ValueError: a usage error of `treadle serve`


def _run_serve(ns: argparse.Namespace) -> None:
    from treadle.runtime.server.launcher import main_from_args

    main_from_args(ns.engine_args)


def _add_router(sub: argparse._SubParsersAction) -> None:
    from treadle.runtime.router import add_router_subcommand

    add_router_subcommand(sub)
    sub.choices["router"].set_defaults(build_args=_check_router_args)


def _check_router_args(ns: argparse.Namespace) -> None:
    from treadle.runtime.router import check_router_args

    check_router_args(ns, LOG_LEVELS)


# name -> function adding the subparser (which sets `func`, and `build_args` if its flags need
# checks argparse cannot make: see _CommandParser)
_SUBCOMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {"serve": _add_serve, "router": _add_router}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `treadle` parser; with `only`, a subcommand's name, that subcommand alone (main()
    parses `treadle serve ...` so: the router's subparser imports the router, ~0.3 s that
    delayed every server's start)."""
    parser = _CommandParser(prog="treadle", description="treadle: a structured-generation LLM runtime")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_SubcommandParser)
    for name, add in _SUBCOMMANDS.items():
        if only is None or name == only:
            add(sub)
    parser.subcommands = dict(sub.choices)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # a known subcommand first: only its flags can follow, so only its parser is built
    parser = build_parser(argv[0] if argv and argv[0] in _SUBCOMMANDS else None)
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        sys.exit(2)
    ns.func(ns)


if __name__ == "__main__":
    main()
