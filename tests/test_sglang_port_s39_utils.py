"""SGLang's helpers around a program, as its docs, tests and benchmarks use them (`sglang` changed
to `treadle`, nothing else): the frontend tutorial's first cell (launch_server_cmd,
wait_for_server, RuntimeEndpoint, terminate_process), a named chat template over HTTP, the
tokenizer of the served model (sglang.srt.hf_transformers_utils), the offline engine's
stream_and_merge, and the benchmarks' read_jsonl / dump_state_text."""
from __future__ import annotations

import asyncio
import json

import pytest

import treadle as sgl


@pytest.fixture(scope="module")
def server():
    """SGLang's frontend tutorial, its first cell (the model: the embedded one's HF id)."""
    from treadle.test.test_utils import is_in_ci
    from treadle.utils import print_highlight, terminate_process, wait_for_server  # noqa: F401

    if is_in_ci():
        from treadle.test.doc_patch import launch_server_cmd
    else:
        from treadle.utils import launch_server_cmd

    server_process, port = launch_server_cmd(
        "python -m treadle.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct --host 0.0.0.0 "
        "--max-total-tokens 8192"
    )
    try:
        wait_for_server(f"http://localhost:{port}", timeout=300)
        yield server_process, port
    finally:
        terminate_process(server_process)
    assert server_process.poll() is not None


def test_frontend_tutorial_against_a_server_from_launch_server_cmd(server):
    from treadle import RuntimeEndpoint, assistant, function, gen, system, user
    from treadle.lang.api import set_default_backend

    _, port = server
    set_default_backend(RuntimeEndpoint(f"http://localhost:{port}"))
    try:
        @function
        def basic_qa(s, question):
            s += system("You are a helpful assistant than can answer questions.")
            s += user(question)
            s += assistant(gen("answer", max_tokens=24))

        state = basic_qa("List 3 countries and their capitals.")
        assert state["answer"] and state.messages()[0]["role"] == "system"
    finally:
        sgl.global_config.default_backend = None


def test_runtime_endpoint_chat_template_name_renders_roles_with_that_template(server):
    """RuntimeEndpoint(url, chat_template_name=...) was ignored with a warning; as SGLang's it
    renders roles with the named template (chatml: no default system prompt, unlike the model's
    own template) and adds its stop strings."""
    _, port = server
    backend = sgl.RuntimeEndpoint(f"http://localhost:{port}", chat_template_name="chatml")

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=16))

    state = qa.run(question="Say hello.", temperature=0, backend=backend)
    assert state.text().startswith("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n")
    assert state.messages()[0] == {"role": "user", "content": "Say hello."}
    own = qa.run(question="Say hello.", temperature=0, backend=sgl.RuntimeEndpoint(f"http://localhost:{port}"))
    assert own.text().startswith("<|im_start|>system\n")  # SmolLM2's own template adds its system prompt
    with pytest.raises(KeyError, match="no chat template named 'nope'"):
        sgl.RuntimeEndpoint(f"http://localhost:{port}", chat_template_name="nope")


def test_gen_min_new_tokens_counts_with_the_served_models_tokenizer(server):
    """SGLang's test_programs.test_gen_min_new_tokens: the tokenizer of the endpoint's model, from
    sglang.srt.hf_transformers_utils (the module did not exist)."""
    from treadle.srt.hf_transformers_utils import get_tokenizer
    from treadle.srt.utils.hf_transformers_utils import get_tokenizer as newer_path

    _, port = server
    sgl.set_default_backend(sgl.RuntimeEndpoint(f"http://localhost:{port}"))
    try:
        model_path = sgl.global_config.default_backend.endpoint.get_model_name()
        MIN_TOKENS, MAX_TOKENS = 24, 32

        @sgl.function
        def convo_1(s):
            s += sgl.user("What is the capital of the United States?")
            s += sgl.assistant(sgl.gen("answer", min_tokens=MIN_TOKENS, max_tokens=MAX_TOKENS))

        tokenizer = get_tokenizer(model_path)
        state = convo_1.run()
        assert len(tokenizer.encode(state["answer"])) >= MIN_TOKENS - 1  # a re-encoding may merge a token
        assert newer_path is get_tokenizer
        assert get_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct").encode("hello") == tokenizer.encode("hello")
    finally:
        sgl.global_config.default_backend = None
    with pytest.raises(ValueError, match="use_fast"):
        get_tokenizer(model_path, use_fast=False)


def test_offline_engine_stream_and_merge():
    """SGLang's offline engine doc: `from sglang.utils import stream_and_merge,
    async_stream_and_merge` (they did not exist). The merged stream is the unstreamed text."""
    from treadle.utils import async_stream_and_merge, stream_and_merge, trim_overlap

    llm = sgl.Engine(max_total_tokens=4096)
    try:
        prompt = "The capital of France is"
        sampling_params = {"temperature": 0, "max_new_tokens": 12}
        whole = llm.generate(prompt, sampling_params)["text"]
        assert stream_and_merge(llm, prompt, sampling_params) == whole

        async def main():
            return [piece async for piece in async_stream_and_merge(llm, prompt, sampling_params)]

        pieces = asyncio.run(main())
        assert len(pieces) > 1 and "".join(pieces) == whole
    finally:
        llm.shutdown()
    assert trim_overlap("Hello wor", "world") == "ld" and trim_overlap("abc", "xyz") == "xyz"


def test_benchmark_helpers_read_jsonl_and_dump_state_text(tmp_path):
    from treadle.utils import dump_state_text, read_jsonl

    path = tmp_path / "questions.jsonl"
    path.write_text("# a comment line\n" + json.dumps({"question": "1+1?"}) + "\n" + json.dumps({"question": "2+2?"}))
    lines = list(read_jsonl(path))
    assert lines == [{"question": "1+1?"}, {"question": "2+2?"}]

    out = tmp_path / "states.txt"
    dump_state_text(str(out), ["first", 2])
    assert out.read_text() == ("=" * 40 + " 0 " + "=" * 40 + "\nfirst\n" + "=" * 80 + "\n\n"
                               + "=" * 40 + " 1 " + "=" * 40 + "\n2\n" + "=" * 80 + "\n\n")


def test_the_doc_notebooks_ci_switch(monkeypatch):
    """SGLang's doc notebooks start with `from sglang.test.test_utils import is_in_ci` and, in CI,
    `from sglang.test.doc_patch import launch_server_cmd`; neither module existed."""
    from treadle.test.doc_patch import launch_server_cmd
    from treadle.test.test_utils import is_in_ci
    from treadle.utils import launch_server_cmd as helper

    assert launch_server_cmd is helper
    monkeypatch.setenv("SGLANG_IS_IN_CI", "true")
    assert is_in_ci()
    monkeypatch.setenv("SGLANG_IS_IN_CI", "0")
    assert not is_in_ci()
