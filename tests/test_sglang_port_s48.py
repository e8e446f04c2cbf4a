"""Session 48's porting checks: SGLang programs with `import treadle as sgl` and nothing else
changed, run over conftest's shared Runtime (a real server subprocess of the embedded model)."""
from __future__ import annotations

import asyncio

import pytest

import treadle as sgl


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_fork_branchs_text_iter_starts_with_the_text_it_was_forked_from(sgl_runtime, stream):
    """SGLang's `text_iter()` of a state yields its `text()` (streamed: from its start), and a
    fork branch's text is the parent's text at the fork and what the branch added. treadle's
    branch yielded only what it added since the fork, so `"".join(forks[i].text_iter())` lost
    the prompt an SGLang program prints with it (docs/porting-from-sglang.md said `text()`'s)."""
    @sgl.function
    def prog(s, streamed):
        s += "Fruits:"
        forks = s.fork(2)
        forks += " and" + sgl.gen("y", max_tokens=2)
        if not streamed:  # (streamed, a branch's text_iter ends at its join, as SGLang's)
            s["in_body"] = ["".join(f.text_iter()) for f in forks]
        return forks

    state = prog.run(streamed=stream, backend=sgl_runtime.endpoint, temperature=0, stream=stream)
    forks = state.ret_value
    assert forks[0].text().startswith("Fruits: and")
    if not stream:
        assert state["in_body"] == [f.text() for f in forks]

    async def joined_async(branch):
        return "".join([piece async for piece in branch.text_async_iter()])

    for branch in forks:
        assert "".join(branch.text_iter()) == branch.text()
        assert asyncio.run(joined_async(branch)) == branch.text()
        assert "".join(branch.text_iter("y")) == branch["y"]  # a variable's: its value alone, as before


@pytest.mark.timeout(60)
def test_a_streamed_selects_text_async_iter_with_meta_data_yields_its_meta_info(sgl_runtime):
    """SGLang's streamed `text_async_iter(name, return_meta_data=True)` yields `(text,
    meta_info[name])`; for a select that is the choice and its scores (what
    `get_meta_info(name)` has). treadle's yielded `("red", None)`."""
    @sgl.function
    def color(s):
        s += "The color of the sky is " + sgl.select("c", ["blue", "red"]) + "."

    async def collect():
        state = color.run(backend=sgl_runtime.endpoint, stream=True)
        return state, [item async for item in state.text_async_iter("c", return_meta_data=True)]

    state, items = asyncio.run(collect())
    assert items == [(state["c"], state.get_meta_info("c"))]
    assert len(items[0][1]["normalized_prompt_logprobs"]) == 2
