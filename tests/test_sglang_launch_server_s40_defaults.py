"""`python -m treadle.launch_server` takes SGLang's flags that have no treadle equivalent at the
values that change nothing here (SGLang's defaults: `--dp-size 1`, `--grammar-backend xgrammar`
as its structured-output docs launch, ...), as Engine(...) takes the same keywords; any other
value is still a usage error naming the flag and the value (before: every one a usage error)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from treadle.launch_server import parse_args

DEFAULTS = ["--dp-size", "1", "--grammar-backend", "xgrammar", "--page-size", "1", "--load-format", "auto",
            "--tokenizer-mode", "auto", "--stream-interval", "1", "--schedule-conservativeness", "1.0",
            "--sampling-backend", "flashinfer"]


def test_sglang_flags_at_their_defaults_are_taken_and_change_nothing():
    base = ["--model-path", "dummy:tiny-llama", "--port", "30001", "--random-seed", "3"]
    assert parse_args(base + DEFAULTS) == parse_args(base)


@pytest.mark.parametrize("flags,named", [
    (["--dp-size", "2"], "dp_size=2"),
    (["--grammar-backend", "mine"], "grammar_backend='mine'"),
    (["--enable-torch-compile"], "enable_torch_compile=True"),
    (["--page-size", "16", "--no-such-flag"], "unknown flag --no-such-flag"),
])
def test_sglang_flags_at_other_values_are_a_usage_error_naming_them(flags, named):
    run = subprocess.run([sys.executable, "-m", "treadle.launch_server", *flags], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert named in run.stderr
    if "--page-size" in flags:  # every problem at once
        assert "page_size=16" in run.stderr
