"""The offline Engine's streamed chunks as SGLang's Engine gives them (and as treadle's own
/generate stream does): each chunk's `text` and `output_ids` are the output so far, unless the
engine runs with incremental_streaming_output, where they are only what is new. SGLang's
offline-engine doc merges the chunks with `trim_overlap`, and prints `chunk["text"]` of the
async form the same way; both read the whole text from what the chunks hold."""
from __future__ import annotations

import asyncio

import pytest

import treadle as sgl

PROMPT = "List the first ten prime numbers:"
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


@pytest.fixture(scope="module")
def llm():
    engine = sgl.Engine(max_total_tokens=4096)
    yield engine
    engine.shutdown()


def _is_growing(chunks: list[dict]) -> bool:
    return all(b["text"].startswith(a["text"]) and b["output_ids"][:len(a["output_ids"])] == a["output_ids"]
               for a, b in zip(chunks, chunks[1:]))


def test_stream_chunks_hold_the_output_so_far(llm):
    whole = llm.generate(PROMPT, GREEDY)
    chunks = list(llm.generate(PROMPT, GREEDY, stream=True))
    assert len(chunks) > 2
    assert chunks[-1]["text"] == whole["text"] and chunks[-1]["output_ids"] == whole["output_ids"]
    assert _is_growing(chunks)
    assert len(chunks[0]["text"]) < len(whole["text"])  # the first one is a part, not the whole
    # SGLang's doc merges them so (sglang.utils.stream_and_merge): the overlap of each chunk
    # with the text so far is cut
    final_text = ""
    for output in llm.generate(PROMPT, GREEDY, stream=True):
        chunk_text = output["text"]
        k = next((i for i in range(min(len(final_text), len(chunk_text)), 0, -1)
                  if final_text.endswith(chunk_text[:i])), 0)
        final_text += chunk_text[k:]
    assert final_text == whole["text"]


def test_a_batch_and_n_samples_stream_the_output_so_far(llm):
    prompts = [PROMPT, "Name three colours:"]
    params = [GREEDY, {**GREEDY, "max_new_tokens": 8}]
    whole = llm.generate(prompts, params)
    chunks = list(llm.generate(prompts, params, stream=True))
    for i, want in enumerate(whole):
        mine = [c for c in chunks if c["index"] == i]
        assert len(mine) > 1 and _is_growing(mine)
        assert (mine[-1]["text"], mine[-1]["output_ids"]) == (want["text"], want["output_ids"])
    twice = [c for c in llm.generate(PROMPT, {**GREEDY, "n": 2}, stream=True)]
    last = {c["index"]: c["text"] for c in twice}
    assert last == {0: whole[0]["text"], 1: whole[0]["text"]}


def test_async_generate_streams_the_output_so_far(llm):
    whole = llm.generate(PROMPT, GREEDY)["text"]

    async def main():
        generator = await llm.async_generate(PROMPT, GREEDY, stream=True)
        return [chunk async for chunk in generator]

    chunks = asyncio.run(main())
    assert len(chunks) > 2 and _is_growing(chunks) and chunks[-1]["text"] == whole

    from treadle.utils import async_stream_and_merge, stream_and_merge

    async def pieces():
        return [p async for p in async_stream_and_merge(llm, PROMPT, GREEDY)]

    merged = asyncio.run(pieces())
    assert len(merged) > 2 and "".join(merged) == whole
    assert stream_and_merge(llm, PROMPT, GREEDY) == whole


def test_incremental_streaming_output_streams_what_is_new():
    """SGLang's incremental_streaming_output, taken by Engine(...) as by the server: the chunks
    then add up to the output; a DSL program streams the same text either way."""
    with sgl.Engine(max_total_tokens=4096, incremental_streaming_output=True) as llm:
        whole = llm.generate(PROMPT, GREEDY)
        chunks = list(llm.generate(PROMPT, GREEDY, stream=True))
        assert len(chunks) > 2
        assert "".join(c["text"] for c in chunks) == whole["text"]
        assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]

        @sgl.function
        def cont(s):
            s += PROMPT + sgl.gen("answer", **{"max_tokens": 16, "temperature": 0, "ignore_eos": True})

        state = cont.run(backend=llm, stream=True)
        assert "".join(state.text_iter("answer")) == whole["text"] == state["answer"]


def test_a_dsl_program_streams_deltas_over_the_default_engine(llm):
    """The DSL's text_iter yields what is new, the Engine's chunks holding the text so far."""
    whole = llm.generate(PROMPT, GREEDY)["text"]

    @sgl.function
    def cont(s):
        s += PROMPT + sgl.gen("answer", max_tokens=16, temperature=0, ignore_eos=True)

    state = cont.run(backend=llm, stream=True)
    pieces = list(state.text_iter("answer"))
    assert len(pieces) > 2 and "".join(pieces) == whole == state["answer"]
