"""`python -m treadle.launch_server [flags]`: SGLang's `python -m sglang.launch_server`, ported by
changing the module name.

    python -m treadle.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct \\
        --host 127.0.0.1 --port 30000 --tp 1 --mem-fraction-static 0.8 --random-seed 0

It takes every flag of `treadle serve` (the same server), and SGLang's names for treadle's flags
from the one table sgl.Runtime(...) and sgl.Engine(...) use too (runtime/engine_args.py:
SGLANG_ARGS, SGLANG_FLAG_ALIASES): `--random-seed` is `--seed`, `--disable-cuda-graph`
`--no-cuda-graph`, `--disable-overlap-schedule` `--overlap-schedule off`, `--tp` `--tp-size`,
`--model` `--model-path`; `--trust-remote-code` and `--enable-metrics` change nothing. SGLang's
flags treadle has no equivalent for (`--dp-size`, `--grammar-backend`, `--chat-template`, ...;
SGLANG_ONLY_ARGS) are taken at values that change nothing here (`--dp-size 1`, `--grammar-backend
xgrammar`: SGLANG_NOOP_VALUES), as Engine(...) takes them. A flag of neither, or one of those at
another value, is a usage error naming each (exit 2), before anything starts.
"""
from __future__ import annotations

import argparse
import sys
import typing
from dataclasses import fields

PROG = "python -m treadle.launch_server"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"usage: {self.prog} [options]  ('{self.prog} --help' lists them)\n"
                     f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from treadle.runtime.engine_args import (SGLANG_ARGS, SGLANG_ONLY_ARGS, SGLANG_ONLY_TYPES, SGLANG_THINK_PARSERS,
                                             EngineArgs, sglang_flag)

    p = _Parser(prog=PROG, allow_abbrev=False,  # `--model` must not pass for a prefix of some other flag
                description="Serve a model over HTTP: `treadle serve` with SGLang's flag names too. With no "
                            "--model-path (or HuggingFaceTB/SmolLM2-135M-Instruct), the embedded "
                            "SmolLM2-135M-Instruct is served.")
    EngineArgs.add_cli_args(p)
    sglang = p.add_argument_group("SGLang's names for treadle's flags")
    for name, arg in SGLANG_ARGS.items():
        if arg.type is bool:
            sglang.add_argument(sglang_flag(name), action="store_true", help=arg.help)
        else:
            sglang.add_argument(sglang_flag(name), type=arg.type, help=arg.help)
    only = p.add_argument_group("SGLang's flags without a treadle equivalent: taken at values that change nothing "
                                "here (SGLang's defaults), else refused")
    for name, why in SGLANG_ONLY_ARGS.items():
        kind = SGLANG_ONLY_TYPES.get(name, str)  # the value types of SGLang's flags
        if kind is bool:
            only.add_argument(sglang_flag(name), action="store_true", default=argparse.SUPPRESS, help=why)
        elif kind is list:
            only.add_argument(sglang_flag(name), nargs="+", default=argparse.SUPPRESS, help=why)
        else:
            only.add_argument(sglang_flag(name), type=kind, default=argparse.SUPPRESS, help=why)
    # only the flags given reach the namespace (EngineArgs fills in the rest): a default must not
    # clash with SGLang's name of the same argument (--random-seed with --seed's default)
    defaults = {f.name: f.default for f in fields(EngineArgs)}
    for action in p._actions:
        if action.dest == "reasoning_parser":  # SGLang's names of a <think> block: treadle's "think"
            action.choices = [*action.choices, *SGLANG_THINK_PARSERS]
        if action.dest in defaults and defaults[action.dest] is not None:
            action.help = (action.help or "") + f" (default: {defaults[action.dest]})".replace("%", "%%")
        if action.dest in defaults or action.dest in SGLANG_ARGS:
            action.default = argparse.SUPPRESS
    return p


def parse_args(argv: list[str]):
    """The EngineArgs of `argv` (SGLang's flags translated); a usage error exits 2."""
    from treadle.runtime.engine_args import (SGLANG_FLAG_ALIASES, SGLANG_ONLY_ARGS, EngineArgs,
                                             translate_sglang_args)

    argv = [_unalias(a, SGLANG_FLAG_ALIASES) for a in argv]
    parser = build_parser()
    ns, extras = parser.parse_known_args(argv)
    problems = []
    try:
        kwargs = translate_sglang_args(vars(ns), None)  # SGLang's flags at values that change nothing: taken
    except ValueError as e:
        problems.append(str(e))
    if extras:
        flags = [a.split("=", 1)[0] for a in extras if a.startswith("-")]
        sglang_only = {f: f[2:].replace("-", "_") for f in flags if f[2:].replace("-", "_") in SGLANG_ONLY_ARGS}
        unknown = [f for f in flags if f not in sglang_only]
        if sglang_only:
            problems.append("SGLang's " + "; ".join(f"{f}: {SGLANG_ONLY_ARGS[n]}" for f, n in sglang_only.items()))
        if unknown:
            problems.append(f"unknown flag{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (neither "
                            "treadle's nor one of SGLang's it translates)")
        if not flags:
            problems.append(f"unexpected arguments: {' '.join(extras)}")
    if problems:
        parser.error("; ".join(problems))
    try:
        return EngineArgs.from_kwargs(**kwargs)
    except ValueError as e:
        parser.error(str(e))


def _unalias(arg: str, aliases: dict[str, str]) -> str:
    flag, eq, value = arg.partition("=")
    return aliases[flag] + eq + value if flag in aliases else arg


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from treadle.runtime.server.launcher import main_from_args

    main_from_args(args)


if __name__ == "__main__":
    main()
