"""`forks.join()` returns None, as SGLang's ProgramStateGroup.join (a method with no return
value), and `s += None` is SGLang's ValueError ("Tried to append None to state."), so
`s += forks.join()`, an error under SGLang, is one here too instead of appending nothing."""
from __future__ import annotations

import pytest

import treadle as sgl


@pytest.fixture(scope="module")
def backend():
    engine = sgl.Engine(max_total_tokens=4096)
    yield engine
    engine.shutdown()


def test_join_returns_none_and_gathers(backend):
    @sgl.function
    def tips(s):
        s += "Two tips for staying healthy: 1. Sleep. 2. Exercise.\n"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Now, expand tip {i + 1} into a paragraph:\n"
            f += sgl.gen("detail", max_tokens=6, temperature=0)
        return forks.join()

    state = tips.run(backend=backend)
    assert state.ret_value is None
    assert isinstance(state["detail"], list) and len(state["detail"]) == 2


def test_concat_join_returns_none(backend):
    @sgl.function
    def docs(s):
        s += "Documents begin.\n"
        forks = s.fork(2)
        forks += lambda i: f"Document {i}: about topic {i}.\n"
        joined = forks.join("concate_and_append")
        s += "Documents end."
        return joined

    state = docs.run(backend=backend)
    assert state.ret_value is None
    assert state.text() == "Documents begin.\nDocument 0: about topic 0.\nDocument 1: about topic 1.\nDocuments end."


def test_adding_none_is_sglangs_value_error(backend):
    @sgl.function
    def added(s):
        s += "Hello"
        forks = s.fork(2)
        s += forks.join()

    with pytest.raises(ValueError, match="Tried to append None to state"):
        added.run(backend=backend)

    @sgl.function
    def plain(s):
        s += None

    with pytest.raises(ValueError, match="Tried to append None to state"):
        plain.run(backend=backend)


def test_gather_join_takes_only_names_new_in_the_branches(backend):
    """SGLang's gather join: the names a branch has that the parent has not become lists of
    the values of the branches that have them; a name the parent already has keeps the
    parent's value. treadle listed every name a branch set (the parent's `answer` became a
    list, so `s += s["answer"]` then failed) and put None for a branch without the name."""
    @sgl.function
    def agent(s):
        s += "Name an animal:" + sgl.gen("answer", max_tokens=3, temperature=0)
        mine = s["answer"]
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"\nName a city ({i}):" + sgl.gen("answer", max_tokens=3, temperature=0)
            if i != 1:
                f += "\nName a river:" + sgl.gen("river", max_tokens=3, temperature=0)
        rivers = [forks[0]["river"], forks[2]["river"]]
        forks.join()
        s += "\nSo: " + s["answer"]
        return mine, rivers

    state = agent.run(backend=backend)
    mine, rivers = state.ret_value
    assert state["answer"] == mine and state.text().endswith("\nSo: " + mine)
    assert state["river"] == rivers
