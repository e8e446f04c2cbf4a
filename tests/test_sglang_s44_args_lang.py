"""The DSL as SGLang's: a failed streamed (or run_batch) state's text() and messages() give the text
it had, with the error in state.error() (before: both raised it); RuntimeEndpoint waits for a reply
as long as it takes, as SGLang's (before: 600 s, then requests' raw ReadTimeout), and a timeout_s
given is a TimeoutError naming it. Over conftest's shared Runtime (a real server subprocess)."""
from __future__ import annotations

import pytest

import treadle as sgl
from treadle.runtime.server.testing import wait_idle


def test_failed_streamed_state_gives_its_text_and_messages(sgl_runtime):
    @sgl.function
    def prog(s):
        s += sgl.user("Say a.")
        s += sgl.assistant(sgl.gen("a", max_tokens=2, temperature=0))
        s += "Then: " + sgl.gen("bad", ebnf='root ::= "a" item', max_tokens=2)  # the server refuses it: a 400

    st = prog.run(backend=sgl_runtime.endpoint, stream=True)
    text = st.text()
    assert isinstance(st.error(), ValueError) and "'item'" in str(st.error())
    assert text.endswith(st["a"] + "<|im_end|>\nThen: ")  # everything before the refused gen
    assert [m["role"] for m in st.messages()] == ["user", "assistant"]
    assert st.messages()[1]["content"] == st["a"]
    with pytest.raises(ValueError, match="'item'"):
        st["bad"]  # a variable the failure left unset still raises it


def test_runtime_endpoint_has_no_read_timeout_unless_given(sgl_runtime):
    short = sgl.RuntimeEndpoint(sgl_runtime.url)  # connected (its /get_model_info) with no timeout
    assert short.timeout_s is None
    short.timeout_s = 0.1

    @sgl.function
    def long_gen(s):
        s += "Count to a hundred: 1, 2," + sgl.gen("rest", max_tokens=128, ignore_eos=True, temperature=0)

    with pytest.raises(TimeoutError, match="timeout_s=0.1"):  # 128 tokens take longer than 0.1 s to come back
        long_gen.run(backend=short)
    wait_idle(sgl_runtime.url)  # the shared server is left idle
