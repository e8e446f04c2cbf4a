"""SGLang programs written as SGLang's documentation writes them (`import treadle.lang as sgl`,
nothing else changed) that did not run on treadle. Each test failed on the code before its fix."""
from __future__ import annotations

import pytest

import treadle.lang as sgl


@pytest.fixture(scope="module")
def engine():
    eng = sgl.Engine(max_total_tokens=4096)
    sgl.set_default_backend(eng)
    yield eng
    sgl.global_config.default_backend = None
    eng.shutdown()


# SGLang's frontend tutorial: `s += system("...")  # Same as: s += s.system("...")`
@sgl.function
def chat_example(s):
    s += s.system("You are a helpful assistant.")
    s += s.user("Question: What is the capital of France?")
    s += s.assistant("Answer: " + sgl.gen("answer", max_tokens=4, temperature=0))


@sgl.function
def chat_example_free(s):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user("Question: What is the capital of France?")
    s += sgl.assistant("Answer: " + sgl.gen("answer", max_tokens=4, temperature=0))


def test_adding_a_state_role_message_adds_it_once(engine):
    """`s += s.system("...")` was a TypeError (cannot add a _RoleScope to a program state):
    s.system(content) had already added the message. It is the same as `s += sgl.system(...)`."""
    st = chat_example.run()
    ref = chat_example_free.run()
    assert st.messages() == ref.messages()
    assert [m["role"] for m in st.messages()] == ["system", "user", "assistant"]
    assert st.text() == ref.text()
    states = chat_example.run_batch([{}, {}])  # traced for its shared prefix, then run
    assert [x.messages() for x in states] == [ref.messages()] * 2


def test_adding_a_role_scope_without_content_says_to_use_with(engine):
    @sgl.function
    def prog(s):
        s += s.user()

    with pytest.raises(TypeError, match=r"with s\.user\(\)"):
        prog.run()


def test_adding_another_states_role_message_is_refused(engine):
    @sgl.function
    def prog(s):
        forks = s.fork(1)
        s += forks[0].user("hi")

    with pytest.raises(TypeError, match="another program state"):
        prog.run()
