"""SGLang's gsm8k and hellaswag benchmark scripts (benchmark/*/bench_sglang.py), written as SGLang
writes them with only `sglang` changed to `treadle`, and its `python -m sglang.test.few_shot_gsm8k`,
run against a real server in processes of their own; and the helper they fetch their data with,
against a real HTTP server (session 41)."""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest
import requests

import treadle as sgl

# benchmark/gsm8k/bench_sglang.py, newer SGLang's imports (sglang.lang.api, dump_bench_raw_result)
GSM8K_SCRIPT = '''
import argparse
import ast
import json
import os
import re
import time

import numpy as np

from treadle.lang.api import set_default_backend
from treadle.test.test_utils import (
    add_common_sglang_args_and_parse,
    dump_bench_raw_result,
    select_sglang_backend,
)
from treadle.utils import download_and_cache_file, dump_state_text, read_jsonl

INVALID = -9999999


def get_one_example(lines, i, include_answer):
    ret = "Question: " + lines[i]["question"] + "\\nAnswer:"
    if include_answer:
        ret += " " + lines[i]["answer"]
    return ret


def get_few_shot_examples(lines, k):
    ret = ""
    for i in range(k):
        ret += get_one_example(lines, i, True) + "\\n\\n"
    return ret


def get_answer_value(answer_str):
    answer_str = answer_str.replace(",", "")
    numbers = re.findall(r"\\d+", answer_str)
    if len(numbers) < 1:
        return INVALID
    try:
        return ast.literal_eval(numbers[-1])
    except SyntaxError:
        return INVALID


def main(args):
    set_default_backend(select_sglang_backend(args))

    data_path = args.data_path
    url = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/test.jsonl"
    if not os.path.isfile(data_path):
        data_path = download_and_cache_file(url)
    lines = list(read_jsonl(data_path))

    num_questions = args.num_questions
    num_shots = args.num_shots
    few_shot_examples = get_few_shot_examples(lines, num_shots)

    questions = []
    labels = []
    for i in range(len(lines[:num_questions])):
        questions.append(get_one_example(lines, i, False))
        labels.append(get_answer_value(lines[i]["answer"]))
    assert all(l != INVALID for l in labels)
    arguments = [{"question": q} for q in questions]

    import treadle as sgl

    @sgl.function
    def few_shot_gsm8k(s, question):
        s += few_shot_examples + question
        s += sgl.gen("answer", max_tokens=24, stop=["Question", "Assistant:", "<|separator|>"])

    tic = time.perf_counter()
    states = few_shot_gsm8k.run_batch(arguments, temperature=0, num_threads=args.parallel, progress_bar=True)
    latency = time.perf_counter() - tic

    preds = []
    for i in range(len(states)):
        preds.append(get_answer_value(states[i]["answer"]))

    acc = np.mean(np.array(preds) == np.array(labels))
    invalid = np.mean(np.array(preds) == INVALID)
    num_output_tokens = sum(s.get_meta_info("answer")["completion_tokens"] for s in states)
    output_throughput = num_output_tokens / latency

    print(f"Accuracy: {acc:.3f}")
    print(f"Invalid: {invalid:.3f}")
    print(f"Latency: {latency:.3f} s")
    print(f"Output throughput: {output_throughput:.3f} token/s")

    dump_state_text(f"tmp_output_{args.backend}.txt", states)
    dump_bench_raw_result(path=args.raw_result_file, states=states, preds=preds, labels=labels)

    with open(args.result_file, "a") as fout:
        value = {
            "task": "gsm8k",
            "backend": args.backend,
            "num_gpus": 1,
            "latency": round(latency, 3),
            "accuracy": round(acc, 3),
            "num_requests": args.num_questions,
            "other": {"num_questions": args.num_questions, "parallel": args.parallel},
        }
        fout.write(json.dumps(value) + "\\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-shots", type=int, default=5)
    parser.add_argument("--data-path", type=str, default="test.jsonl")
    parser.add_argument("--num-questions", type=int, default=200)
    args = add_common_sglang_args_and_parse(parser)
    main(args)
'''

# benchmark/hellaswag/bench_sglang.py, older SGLang's imports (sglang.api)
HELLASWAG_SCRIPT = '''
import argparse
import json
import os
import time

import numpy as np

from treadle.api import set_default_backend
from treadle.test.test_utils import add_common_sglang_args_and_parse, select_sglang_backend
from treadle.utils import download_and_cache_file, read_jsonl


def get_one_example(lines, i, include_answer):
    ret = lines[i]["activity_label"] + ": " + lines[i]["ctx"] + " "
    if include_answer:
        ret += lines[i]["endings"][lines[i]["label"]]
    return ret


def get_few_shot_examples(lines, k):
    ret = ""
    for i in range(k):
        ret += get_one_example(lines, i, True) + "\\n\\n"
    return ret


def main(args):
    set_default_backend(select_sglang_backend(args))

    data_path = args.data_path
    url = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
    if not os.path.isfile(data_path):
        data_path = download_and_cache_file(url)
    lines = list(read_jsonl(data_path))

    num_questions = args.num_questions
    num_shots = args.num_shots
    few_shot_examples = get_few_shot_examples(lines, num_shots)

    questions = []
    choices = []
    labels = []
    for i in range(len(lines[:num_questions])):
        questions.append(get_one_example(lines, i, False))
        choices.append(lines[i]["endings"])
        labels.append(lines[i]["label"])
    arguments = [{"question": q, "choices": c} for q, c in zip(questions, choices)]

    import treadle as sgl

    @sgl.function
    def few_shot_hellaswag(s, question, choices):
        s += few_shot_examples + question
        s += sgl.select("answer", choices=choices)

    tic = time.perf_counter()
    rets = few_shot_hellaswag.run_batch(arguments, temperature=0, num_threads=args.parallel, progress_bar=True)
    preds = [choices[i].index(rets[i]["answer"]) for i in range(len(rets))]
    latency = time.perf_counter() - tic

    acc = np.mean(np.array(preds) == np.array(labels))
    print(f"Latency: {latency:.3f}")
    print(f"Accuracy: {acc:.3f}")

    with open(args.result_file, "a") as fout:
        value = {"task": "hellaswag", "backend": args.backend, "latency": round(latency, 3),
                 "accuracy": round(acc, 3), "num_requests": args.num_questions,
                 "other": {"num_questions": args.num_questions, "parallel": args.parallel}}
        fout.write(json.dumps(value) + "\\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-shots", type=int, default=2)
    parser.add_argument("--data-path", type=str, default="hellaswag_val.jsonl")
    parser.add_argument("--num-questions", type=int, default=200)
    args = add_common_sglang_args_and_parse(parser)
    main(args)
'''

GSM8K_LINES = [
    {"question": "Tom has 3 apples and buys 2 more. How many apples does he have?",
     "answer": "He has 3 + 2 = <<3+2=5>>5 apples.\n#### 5"},
    {"question": "A box holds 4 pens. How many pens are in 2 boxes?",
     "answer": "2 boxes hold 2 * 4 = <<2*4=8>>8 pens.\n#### 8"},
    {"question": "Sara had 10 cookies and ate 3. How many are left?",
     "answer": "10 - 3 = <<10-3=7>>7 are left.\n#### 7"},
    {"question": "A week has 7 days. How many days are in 2 weeks?",
     "answer": "2 * 7 = <<2*7=14>>14 days.\n#### 14"},
]

HELLASWAG_LINES = [
    {"activity_label": "Cooking", "ctx": "A man cracks two eggs into a bowl. He",
     "endings": ["whisks them with a fork.", "paints the ceiling blue.", "drives a bus to the moon."], "label": 0},
    {"activity_label": "Sports", "ctx": "A woman kicks the ball toward the goal. The ball",
     "endings": ["sings a song.", "flies into the net.", "turns into a cat."], "label": 1},
    {"activity_label": "Gardening", "ctx": "She digs a small hole in the soil. She",
     "endings": ["reads the newspaper to it.", "eats the shovel.", "places a seed in the hole."], "label": 2},
    {"activity_label": "Cleaning", "ctx": "He fills a bucket with soapy water. He",
     "endings": ["mops the kitchen floor.", "mails the bucket to Paris.", "plants the mop."], "label": 0},
]


@pytest.fixture(scope="module")
def server(sgl_runtime):  # conftest's shared Runtime: the scripts leave it idle
    host, port = sgl_runtime.url.rsplit(":", 1)
    return host, port


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _run(tmp_path, script: str, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "bench_sglang.py").write_text(script)
    return subprocess.run([sys.executable, "bench_sglang.py", *flags], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def test_gsm8k_benchmark_script_with_its_raw_result_file(server, tmp_path):
    """The gsm8k script imports download_and_cache_file from sglang.utils and dump_bench_raw_result
    from sglang.test.test_utils: both were missing (ImportError before the script ran). With
    --raw-result-file it writes one JSON line per question."""
    host, port = server
    _write_jsonl(tmp_path / "test.jsonl", GSM8K_LINES)
    run = _run(tmp_path, GSM8K_SCRIPT, "--host", host, "--port", port, "--parallel", "2", "--num-shots", "2",
               "--num-questions", "3", "--raw-result-file", "raw.jsonl")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Accuracy: " in run.stdout and "Output throughput: " in run.stdout
    result = json.loads((tmp_path / "result.jsonl").read_text())
    assert result["task"] == "gsm8k" and result["num_requests"] == 3
    rows = [json.loads(line) for line in (tmp_path / "raw.jsonl").read_text().splitlines()]
    assert [row["prompt_id"] for row in rows] == [0, 1, 2]
    for row, line in zip(rows, GSM8K_LINES):
        assert row["prompt"].endswith("Question: " + line["question"] + "\nAnswer:"), row
        assert isinstance(row["output"], str) and isinstance(row["correct"], bool)
    # the text file holds each state's whole text: the prompt, then the output
    dumped = (tmp_path / "tmp_output_srt.txt").read_text()
    assert all(row["prompt"] + row["output"] in dumped for row in rows)


def test_hellaswag_benchmark_script_with_older_sglangs_api_module(server, tmp_path):
    """Older SGLang's benchmarks import set_default_backend from sglang.api (ModuleNotFoundError
    before); the hellaswag script selects among each question's endings."""
    host, port = server
    _write_jsonl(tmp_path / "hellaswag_val.jsonl", HELLASWAG_LINES)
    run = _run(tmp_path, HELLASWAG_SCRIPT, "--host", host, "--port", port, "--parallel", "2", "--num-shots", "1",
               "--num-questions", "4")
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "result.jsonl").read_text())
    assert result["task"] == "hellaswag" and result["num_requests"] == 4 and 0 <= result["accuracy"] <= 1
    from treadle import api

    assert api.set_default_backend is sgl.set_default_backend and api.gen is sgl.gen


def test_few_shot_gsm8k_module_as_sglangs_docs_run_it(server, tmp_path):
    """`python -m sglang.test.few_shot_gsm8k`, which SGLang's docs run to check a launched model,
    was missing (No module named treadle.test.few_shot_gsm8k)."""
    host, port = server
    _write_jsonl(tmp_path / "test.jsonl", GSM8K_LINES)
    run = subprocess.run([sys.executable, "-m", "treadle.test.few_shot_gsm8k", "--data-path", "test.jsonl",
                          "--num-questions", "3", "--num-shots", "2", "--max-new-tokens", "24", "--parallel", "2",
                          "--host", host, "--port", port], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Accuracy: " in run.stdout and "Invalid: " in run.stdout and "Output throughput: " in run.stdout
    assert (tmp_path / "tmp_output_gsm8k.txt").read_text().count("Question: " + GSM8K_LINES[2]["question"]) == 1


def test_few_shot_gsm8k_run_eval_as_sglangs_tests_call_it(server, tmp_path, monkeypatch):
    """SGLang's server tests: `metrics = run_eval(SimpleNamespace(...))`, then its accuracy."""
    from types import SimpleNamespace

    from treadle.test.few_shot_gsm8k import run_eval

    host, port = server
    _write_jsonl(tmp_path / "test.jsonl", GSM8K_LINES)
    monkeypatch.chdir(tmp_path)
    args = SimpleNamespace(num_shots=2, data_path=str(tmp_path / "test.jsonl"), num_questions=4, max_new_tokens=24,
                           parallel=4, host=host, port=int(port))
    try:
        metrics = run_eval(args)
    finally:
        sgl.set_default_backend(None)
    assert set(metrics) == {"accuracy", "invalid", "latency", "output_throughput"}
    assert 0 <= metrics["accuracy"] <= 1 and metrics["output_throughput"] > 0


@pytest.fixture
def file_server(tmp_path):
    """A real HTTP server on localhost serving tmp_path/"site"; the paths it was asked for."""
    site = tmp_path / "site"
    site.mkdir()
    asked: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(site), **kwargs)

        def do_GET(self):
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", site, asked
    httpd.shutdown()
    httpd.server_close()


def test_download_and_cache_file_downloads_once(file_server, tmp_path):
    from treadle.utils import download_and_cache_file

    url, site, asked = file_server
    _write_jsonl(site / "test.jsonl", GSM8K_LINES)
    target = tmp_path / "cache" / "gsm8k.jsonl"
    target.parent.mkdir()
    assert download_and_cache_file(f"{url}/test.jsonl", filename=str(target)) == str(target)
    assert target.read_text() == (site / "test.jsonl").read_text() and asked == ["/test.jsonl"]
    # a second call reads the cached copy: no request
    assert download_and_cache_file(f"{url}/test.jsonl", filename=str(target)) == str(target)
    assert asked == ["/test.jsonl"]
    # an error status raises, and leaves no file behind (no partial file taken for the data later)
    missing = tmp_path / "cache" / "missing.jsonl"
    with pytest.raises(requests.HTTPError):
        download_and_cache_file(f"{url}/missing.jsonl", filename=str(missing))
    assert sorted(os.listdir(target.parent)) == ["gsm8k.jsonl"]


def test_download_and_cache_file_names_the_file_after_the_url(file_server, tmp_path, monkeypatch):
    """Without a filename, the URL's last path part in the temporary directory, as SGLang's /tmp."""
    import tempfile

    from treadle.utils import download_and_cache_file

    url, site, asked = file_server
    _write_jsonl(site / "hellaswag_val.jsonl", HELLASWAG_LINES)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = download_and_cache_file(f"{url}/hellaswag_val.jsonl")
    assert path == str(tmp_path / "hellaswag_val.jsonl")
    assert [json.loads(line) for line in open(path)] == HELLASWAG_LINES
