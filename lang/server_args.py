"""SGLang's `ServerArgs` (`sglang.srt.server_args`, also `sgl.ServerArgs`), as SGLang's examples use it:

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args())
    llm = sgl.Engine(**dataclasses.asdict(server_args))

It is treadle's `EngineArgs` (its fields, checks and defaults: `dataclasses.asdict` gives what
`Engine(...)` and `Runtime(...)` take) made from SGLang's names too: `ServerArgs(random_seed=1,
tp_size=1)`, and on the command line `--random-seed`, `--tp`, `--model`, `--disable-cuda-graph`
(runtime/engine_args.py: SGLANG_ARGS, SGLANG_FLAG_ALIASES). One of SGLang's arguments treadle has
no equivalent for (`chat_template`, `dp_size`, ...) is a ValueError naming it and why.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Literal, get_args, get_origin

from treadle.runtime.engine_args import (SGLANG_ARGS, SGLANG_FLAG_ALIASES, SGLANG_ONLY_ARGS, SGLANG_ONLY_TYPES,
                                         EngineArgs, sglang_flag, translate_sglang_args)


@dataclasses.dataclass(frozen=True, init=False)
class ServerArgs(EngineArgs):
    """EngineArgs under SGLang's name, taking SGLang's argument names as well as treadle's."""

    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        kwargs = translate_sglang_args({"model_path": model_path, **kwargs}, "ServerArgs")
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"ServerArgs(): unknown argument(s) {', '.join(unknown)} (treadle's arguments: "
                             "`treadle serve --help`; SGLang's names it takes: "
                             f"{', '.join(sorted(SGLANG_ARGS))})")
        EngineArgs.__init__(self, **kwargs)

    def url(self) -> str:
        """The server's base URL, as SGLang's ServerArgs.url()."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add one `--flag` per argument (treadle's names, SGLang's short `--tp` / `--model`
        too) and SGLang's names for treadle's flags (`--random-seed`, ...). Only the flags given
        reach the namespace; `from_cli_args` fills in the rest with the defaults."""
        hints = typing.get_type_hints(EngineArgs)
        aliases: dict[str, list[str]] = {}
        for short, long in SGLANG_FLAG_ALIASES.items():
            aliases.setdefault(long, []).append(short)
        for f in dataclasses.fields(EngineArgs):
            flag = sglang_flag(f.name)
            names = [flag, *aliases.get(flag, [])]
            tp = hints[f.name]
            doc = f.metadata.get("help")
            kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": doc}
            if tp is bool:
                parser.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
            elif get_origin(tp) is Literal:
                parser.add_argument(*names, choices=list(get_args(tp)), **kw)
            else:
                args = [a for a in get_args(tp) if a is not type(None)]
                parser.add_argument(*names, type=args[0] if args else tp, **kw)
        for name, arg in SGLANG_ARGS.items():
            kw = {"dest": name, "default": argparse.SUPPRESS, "help": arg.help}
            if arg.type is bool:
                parser.add_argument(sglang_flag(name), action="store_true", **kw)
            else:
                parser.add_argument(sglang_flag(name), type=arg.type, **kw)
        # SGLang's flags treadle has no equivalent of: taken at SGLang's defaults (and, for those
        # that only change logging or warm-up, any value), else a ValueError from from_cli_args
        for name, why in SGLANG_ONLY_ARGS.items():
            flag = sglang_flag(name)
            kw = {"dest": name, "default": argparse.SUPPRESS, "help": why}
            kind = SGLANG_ONLY_TYPES.get(name, str)
            if kind is bool:
                parser.add_argument(flag, *aliases.get(flag, []), action="store_true", **kw)
            elif kind is list:
                parser.add_argument(flag, *aliases.get(flag, []), nargs="+", **kw)
            else:
                parser.add_argument(flag, *aliases.get(flag, []), type=kind, **kw)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        """The ServerArgs of a namespace parsed with `add_cli_args`'s flags (other attributes,
        a script's own flags, are left out)."""
        names = {f.name for f in dataclasses.fields(EngineArgs)} | set(SGLANG_ARGS) | set(SGLANG_ONLY_ARGS)
        return cls(**{k: v for k, v in vars(args).items() if k in names})
