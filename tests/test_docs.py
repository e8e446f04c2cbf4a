"""The documentation works as written: every code block marked runnable runs, every relative
link resolves, and the flag tables of docs/serving.md list every `treadle serve` flag with its
real default.

A fenced block whose info string is ```` ```python run ```` is run on its own with the project's
Python (it starts its own Engine); ```` ```python run-server ```` and ```` ```bash run-server ````
blocks run against one real server (conftest.py's shared plain server), with `http://127.0.0.1:30000` in
the block replaced by its address (docs/contributing.md describes the markers).
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import NamedTuple

import pytest

from treadle.runtime.engine_args import EngineArgs

ROOT = Path(__file__).resolve().parent.parent
DOC_URL = "http://127.0.0.1:30000"  # the address the docs show; run-server blocks get the test server's
BLOCK_TIMEOUT_S = 300
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+).*?\1")


class Block(NamedTuple):
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str  # "run", "run-server" or ""
    code: str


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md"]


def split_markdown(path: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """The fenced code blocks of a Markdown file, and its other lines (number, text)."""
    blocks, prose = [], []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, info = m.group(2), m.group(3).split()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j])
            j += 1
        assert j < len(lines), f"{path.relative_to(ROOT)}:{i + 1}: code block never closed"
        blocks.append(Block(path, i + 1, info[0] if info else "", info[1] if len(info) > 1 else "",
                            "\n".join(body) + "\n"))
        i = j + 1
    return blocks, prose


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats
    numbered."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in split_markdown(path)[1]:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = m.group(1).lower()
        slug = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN").replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def runnable(marker: str) -> list[Block]:
    found = [b for f in doc_files() if f.exists() for b in split_markdown(f)[0] if b.marker == marker]
    for b in found:
        assert b.lang in ("python", "bash"), f"{b.path}:{b.line}: runnable blocks are python or bash, not {b.lang!r}"
    return found


def _id(b: Block) -> str:
    return f"{b.path.relative_to(ROOT)}:{b.line}"


def _run(block: Block, url: str | None = None) -> subprocess.CompletedProcess:
    code = block.code if url is None else block.code.replace(DOC_URL, url)
    cmd = [sys.executable, "-c", code] if block.lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)


def _check(block: Block, res: subprocess.CompletedProcess) -> None:
    where = _id(block)
    print(f"--- {where}\n{res.stdout}")  # what the block shows a reader (pytest -s)
    assert res.returncode == 0, f"{where} exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    assert res.stdout.strip(), f"{where} printed nothing (every runnable block shows its result)"
    assert '"error"' not in res.stdout, f"{where} printed an error body:\n{res.stdout[-2000:]}"


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make serve" in text and "make test" in text, "README.md must show the two commands"
    n = len(text.splitlines())
    assert n <= 160, f"README.md has {n} lines: move details to a page in docs/ (a front page reads in five minutes)"


def test_doc_files_exist():
    missing = [str(f.relative_to(ROOT)) for f in doc_files() if not f.exists()]
    assert not missing, f"missing: {missing}"
    assert runnable("run") and runnable("run-server"), "no runnable blocks found: is the marker spelled right?"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    bad = []
    for n, line in split_markdown(path)[1]:
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... not checked here
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                bad.append(f"{n}: {target} (no such file)")
            elif anchor and (dest.is_dir() or dest.suffix != ".md" or anchor not in anchors(dest)):
                bad.append(f"{n}: {target} (no heading #{anchor})")
    assert not bad, f"{path.relative_to(ROOT)}: broken links:\n" + "\n".join(bad)


def _flag_rows() -> dict[str, str]:
    rows = {}
    for _, line in split_markdown(ROOT / "docs" / "serving.md")[1]:
        m = re.match(r"^\|\s*`(--[a-z0-9-]+)`\s*\|\s*([^|]*?)\s*\|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def _shown_default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def test_serving_flag_table_lists_every_flag_with_its_default():
    rows = _flag_rows()
    want = {"--" + f.name.replace("_", "-"): _shown_default(f.default) for f in dataclasses.fields(EngineArgs)}
    missing = sorted(set(want) - set(rows))
    assert not missing, f"docs/serving.md has no row for: {missing}"
    unknown = sorted(set(rows) - set(want))
    assert not unknown, f"docs/serving.md lists flags treadle serve does not take: {unknown}"
    wrong = {k: (rows[k], want[k]) for k in want if rows[k] != want[k]}
    assert not wrong, f"defaults in docs/serving.md differ from EngineArgs (shown, real): {wrong}"


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable("run"), ids=_id)
def test_engine_block_runs(block: Block):
    _check(block, _run(block))


@pytest.fixture(scope="module")
def server(plain_server):  # conftest's shared server: the blocks leave it idle
    return plain_server


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable("run-server"), ids=_id)
def test_server_block_runs(block: Block, server):
    _check(block, _run(block, server.url))
