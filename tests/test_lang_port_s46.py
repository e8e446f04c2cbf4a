"""Session 46's porting checks of treadle.lang (SGLang programs with `import treadle.lang as sgl`),
over conftest's shared Runtime (a real server subprocess of the embedded model)."""
from __future__ import annotations

import subprocess
import sys

import pytest

import treadle.lang as sgl


def test_runtime_does_not_take_another_servers_health_for_its_own(sgl_runtime):
    """A Runtime picks a free port, then its server loads the model and binds it; another
    process may take the port meanwhile (seen here: a test's server started on the same port a
    second earlier). Its /health answered 200, the Runtime took it for its own server and ran the
    program on the other one (its own exited on 'address already in use'). Here: a child that
    never serves (it exits after a second) while the shared Runtime's server answers the URL."""
    rt = sgl.Runtime.__new__(sgl.Runtime)
    rt.server_args, rt.url = sgl_runtime.server_args, sgl_runtime.url
    rt._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    try:
        with pytest.raises(RuntimeError, match=r"served by another process \(pid \d+\)"):
            rt._wait_healthy(60)
    finally:
        rt._proc.wait()
        rt._proc = None


def test_runtime_on_an_ipv6_host_finds_a_free_port_and_brackets_its_url():
    """`sgl.Runtime(host="::1")` (and `treadle.utils.launch_server_cmd(cmd, host="::1")`) raised
    'no free port in 30000..39999 on ::1': the port scan bound an IPv4 socket to an IPv6 address,
    which fails on every port; and the Runtime's URL was http://::1:port. (Checked by hand: such a
    Runtime then serves a program at http://[::1]:port.) A port taken on ::1 is still skipped."""
    import socket

    from treadle.lang.runtime_process import _free_port_from
    from treadle.lang.utils import _free_port

    port = _free_port_from(31000, "::1")  # was the RuntimeError
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as held:
        held.bind(("::1", port))  # free indeed
        held.listen(1)
        assert _free_port_from(port, "::1") > port  # taken: skipped
    assert 30000 <= _free_port("::1") < 40000

    from treadle.lang.runtime_process import _local_url

    assert _local_url("::1", port) == f"http://[::1]:{port}"
    assert _local_url("::", 8000) == _local_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert _local_url("localhost", 8000) == "http://localhost:8000"


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_reasoning_parser_reads_a_closing_tag_streamed_in_pieces(stream_reasoning):
    """SGLang's ReasoningParser.parse_stream_chunk, fed a model's deltas token by token. A model
    whose tokenizer spells the tags in several tokens (the embedded SmolLM2's: '</', 'think', '>')
    streams '</think>' in three deltas; the parser held back a delta only while the whole text
    since the last emit might begin a tag, so it never saw the closing tag: the answer ('Paris')
    came out as reasoning, or, with stream_reasoning=False, never came out at all."""
    from treadle.srt.parser.reasoning_parser import ReasoningParser

    deltas = ["<", "think", ">", "\n", "The", " plan", ".", "\n", "</", "think", ">", "\n", "\n", "Paris"]
    parser = ReasoningParser(model_type="qwen3", stream_reasoning=stream_reasoning)
    parts = [parser.parse_stream_chunk(d) for d in deltas]
    reasoning, answer = "".join(r for r, _ in parts), "".join(a for _, a in parts)
    assert reasoning.strip() == "The plan." and answer.strip() == "Paris", parts
    forced = ReasoningParser(model_type="deepseek-r1", stream_reasoning=stream_reasoning)  # starts inside
    parts = [forced.parse_stream_chunk(d) for d in ["a<", "b</th", "ink", ">c"]]
    assert ("".join(r for r, _ in parts), "".join(a for _, a in parts)) == ("a<b", "c"), parts
