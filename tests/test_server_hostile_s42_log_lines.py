"""--log-requests writes one line per request whatever its rid (session 42): the rid is the
client's (up to 512 characters of anything but half a character), and one holding a line
break wrote log lines of the client's making ("x\\nrequest admin: ..." reads as two requests)."""
from __future__ import annotations

from treadle.runtime.io_struct import ReqOutput
from treadle.runtime.server.tokenizer_manager import request_log_line


def test_a_request_log_line_is_one_line_whatever_the_client_sent():
    ok = ReqOutput("log-me", [], {"type": "length"}, 3, 2, 1)
    assert request_log_line(ok, 0.1234) == \
        "request log-me: 3 prompt tokens (1 cached), 2 generated, finish length, 0.123s"
    forged = "x: 1 prompt tokens (0 cached), 1 generated, finish stop, 0.001s\nrequest admin"
    for rid in (forged, "a\rb", "a\x1b[2Jb", "a\u2028b", "a\x85b"):
        line = request_log_line(ReqOutput(rid, [], {"type": "stop"}, 1, 1, 0), 0.0)
        assert line.isprintable() and len(line.splitlines()) == 1, line
    bad = ReqOutput("r", [], {"type": "abort"}, 1, 0, 0, error="grammar: 'a\nb' is not valid")
    line = request_log_line(bad, 0.0)
    assert line.isprintable() and "finish error (grammar: 'a\\nb' is not valid)" in line, line
