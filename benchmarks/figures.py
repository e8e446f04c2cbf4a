"""The figures of one benchmark run: each printed as a JSON line when it is measured, then all
of them written to the results file with the command that produced them (``write_results``;
the older scripts write the bare list, ``write_figures``). Shared by the benchmark scripts,
which run from this folder."""
from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["FIGURES", "emit", "write_figures", "write_results"]

FIGURES: list[dict] = []


def emit(fig: dict) -> dict:
    FIGURES.append(fig)
    print(json.dumps(fig), flush=True)
    return fig


def write_results(path: str, benchmark: str, **fields) -> dict:
    """Write {benchmark, command, **fields, figures} to ``path`` and say so on stdout."""
    result = {"benchmark": benchmark, "command": " ".join([sys.executable] + sys.argv), **fields, "figures": FIGURES}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({"written": str(path)}), flush=True)
    return result


def write_figures(figures: list[dict], output: str | None) -> None:
    """Write a benchmark's figures to `output` as one JSON list (nothing without `output`)."""
    if output:
        with open(output, "w") as f:
            json.dump(figures, f, indent=1)
        print("wrote", output)
