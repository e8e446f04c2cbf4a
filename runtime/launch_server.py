"""`python -m treadle.runtime.launch_server [--flags]`: start the HTTP server; the same as
`treadle serve [--flags]`, with the same checks (runtime/cli.py)."""
from __future__ import annotations

from treadle.runtime.cli import main as cli_main


def main(argv: list[str] | None = None) -> None:
    import sys

    cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
