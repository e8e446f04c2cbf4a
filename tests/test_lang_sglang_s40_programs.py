"""SGLang programs written as SGLang's docs and examples write them, run on the embedded model,
where they needed an edit beyond the import (session 40)."""
from __future__ import annotations

import re
import warnings

import pytest

import treadle as sgl


@pytest.fixture(scope="module")
def backend():
    engine = sgl.Engine(max_total_tokens=8192)
    sgl.set_default_backend(engine)
    yield engine
    sgl.set_default_backend(None)
    engine.shutdown()


def test_a_typed_gen_cut_short_is_stored_as_generated(backend):
    """SGLang's backends turn dtype into a regex and store whatever comes back: a gen_string
    cut by max_tokens is the program's value and the program goes on. treadle raised a
    ValueError that ended the program."""
    @sgl.function
    def typed(s):
        s += "Q: Name a fruit.\nA: " + sgl.gen_string("name", max_tokens=3)
        s += "\nQ: 2+2=" + sgl.gen_int("n")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = typed.run(temperature=0)
    assert state["name"].startswith('"') and not state["name"].endswith('"')  # cut short
    assert state.text().endswith(state["name"] + "\nQ: 2+2=" + state["n"])
    assert re.fullmatch(r"[-+]?[0-9]+", state["n"])
    assert any("max_tokens" in str(w.message) for w in caught)


def test_dtype_with_a_regex_uses_the_dtype_as_sglang_warns(backend):
    """SGLang's RuntimeEndpoint warns "Both dtype and regex are set. Only dtype will be used."
    and generates the dtype; treadle refused the gen with a ValueError."""
    @sgl.function
    def both(s):
        s += "A day has " + sgl.gen("hours", dtype=int, regex=r"[a-z]+", max_tokens=8) + " hours."

    with pytest.warns(UserWarning, match="Only dtype will be used"):
        state = both.run(temperature=0)
    assert re.fullmatch(r"[-+]?[0-9]+", state["hours"]), state["hours"]


# A benchmark script as SGLang's benchmark/*/bench_sglang.py write them, but for the import lines
BENCH_SCRIPT = '''
import argparse
import json
import time

import treadle as sgl
from treadle.test.test_utils import add_common_sglang_args_and_parse, select_sglang_backend
from treadle.utils import dump_state_text, read_jsonl


@sgl.function
def answer(s, question):
    s += "Question: " + question + "\\nAnswer:" + sgl.gen("answer", max_tokens=8, stop="\\n")


def main(args):
    lines = list(read_jsonl(args.data_path))[: args.num_questions]
    arguments = [{"question": line["question"]} for line in lines]
    backend = select_sglang_backend(args)
    sgl.set_default_backend(backend)
    tic = time.perf_counter()
    states = answer.run_batch(arguments, temperature=0, num_threads=args.parallel, progress_bar=True)
    latency = time.perf_counter() - tic
    dump_state_text(f"tmp_output_{args.backend}.txt", states)
    with open(args.result_file, "a") as fout:
        value = {"task": "qa", "backend": args.backend, "latency": round(latency, 3),
                 "num_requests": args.num_questions, "answers": [s["answer"] for s in states],
                 "other": {"parallel": args.parallel}}
        fout.write(json.dumps(value) + "\\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-path", type=str, default="questions.jsonl")
    parser.add_argument("--num-questions", type=int, default=20)
    args = add_common_sglang_args_and_parse(parser)
    main(args)
'''


def test_a_benchmark_script_runs_against_a_server(tmp_path, sgl_runtime):  # conftest's shared Runtime
    """SGLang's benchmark scripts take their flags and backend from sglang.test.test_utils'
    add_common_sglang_args_and_parse and select_sglang_backend, which were missing
    (ImportError): here one runs against a real server, in a process of its own."""
    import json
    import subprocess
    import sys

    (tmp_path / "bench_sglang.py").write_text(BENCH_SCRIPT)
    (tmp_path / "questions.jsonl").write_text(
        "# a comment line\n" + "".join(json.dumps({"question": q}) + "\n" for q in ("What is 1 + 1?", "Name a color.")))
    host, port = sgl_runtime.url.rsplit(":", 1)
    run = subprocess.run([sys.executable, "bench_sglang.py", "--host", host, "--port", port, "--parallel", "2",
                          "--num-questions", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "result.jsonl").read_text())
    assert result["backend"] == "srt" and result["num_requests"] == 2 and len(result["answers"]) == 2
    assert (tmp_path / "tmp_output_srt.txt").read_text().count("Question: ") == 2
    bad = subprocess.run([sys.executable, "bench_sglang.py", "--backend", "vllm", "--port", port], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "Invalid backend: vllm" in bad.stderr


def test_text_async_iter_with_meta_of_a_run_not_streamed_yields_the_value(backend):
    """SGLang's text_async_iter(var, return_meta_data=True) of a run without stream=True yields
    the variable's value alone (its meta only comes with streamed chunks); treadle yielded a
    (value, meta) pair, so `print(out, end="")` printed a tuple."""
    import asyncio

    @sgl.function
    def qa(s, question):
        s += sgl.user(question) + sgl.assistant(sgl.gen("answer", max_tokens=8, temperature=0))

    state = qa.run(question="Name a color.")

    async def main():
        return [out async for out in state.text_async_iter(var_name="answer", return_meta_data=True)]

    assert asyncio.run(main()) == [state["answer"]]
