"""SGLang's few-shot GSM8K check of a running server, `python -m sglang.test.few_shot_gsm8k`
(its docs run it after launching a model; its tests call `run_eval(args)`):

    python -m treadle.test.few_shot_gsm8k --num-questions 200 --port 30000 [--data-path test.jsonl]

Each question follows `--num-shots` solved ones from the same file; the program's answer is
read as the last integer it writes, and compared with the one after the reference's "####".
Without `--data-path` the GSM8K test set is downloaded once (download_and_cache_file). Prints
accuracy, invalid share, latency and output throughput, writes each state's text to
tmp_output_gsm8k.txt and returns them as a dict."""
from __future__ import annotations

import argparse
import ast
import re
import time
from typing import Any

GSM8K_TEST_URL = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/test.jsonl"
INVALID = -9999999


def get_one_example(lines: list[dict], i: int, include_answer: bool) -> str:
    text = "Question: " + lines[i]["question"] + "\nAnswer:"
    return text + " " + lines[i]["answer"] if include_answer else text


def get_few_shot_examples(lines: list[dict], k: int) -> str:
    return "".join(get_one_example(lines, i, True) + "\n\n" for i in range(k))


def get_answer_value(answer_str: str) -> int:
    """The last integer in the text (thousands separators dropped), INVALID when there is none."""
    numbers = re.findall(r"\d+", answer_str.replace(",", ""))
    if not numbers:
        return INVALID
    try:
        return ast.literal_eval(numbers[-1])
    except SyntaxError:  # e.g. "0123", which Python does not read as an int literal
        return INVALID


def run_eval(args: Any) -> dict[str, float]:
    """Run the evaluation against the server at `args.host`:`args.port` (args as the command line's:
    num_shots, data_path, num_questions, max_new_tokens, parallel, host, port; temperature,
    return_logprob and logprob_start_len when present) and return accuracy, invalid, latency and
    output_throughput."""
    import numpy as np

    import treadle as sgl
    from treadle.lang.backend_http import RuntimeEndpoint
    from treadle.lang.utils import download_and_cache_file, dump_state_text, read_jsonl

    sgl.set_default_backend(RuntimeEndpoint(f"{args.host}:{args.port}"))
    filename = args.data_path if args.data_path is not None else download_and_cache_file(GSM8K_TEST_URL)
    lines = list(read_jsonl(filename))
    if len(lines) < args.num_shots:
        raise ValueError(f"{filename} has {len(lines)} questions; --num-shots {args.num_shots} needs more")

    few_shot_examples = get_few_shot_examples(lines, args.num_shots)
    questions = [get_one_example(lines, i, False) for i in range(len(lines[: args.num_questions]))]
    labels = [get_answer_value(line["answer"]) for line in lines[: args.num_questions]]
    if INVALID in labels:
        raise ValueError(f"{filename}: question {labels.index(INVALID)}'s answer has no number")

    @sgl.function
    def few_shot_gsm8k(s, question):
        s += few_shot_examples + question
        s += sgl.gen("answer", max_tokens=args.max_new_tokens, stop=["Question", "Assistant:", "<|separator|>"])

    tic = time.perf_counter()
    states = few_shot_gsm8k.run_batch([{"question": q} for q in questions],
                                      temperature=getattr(args, "temperature", 0.0), num_threads=args.parallel,
                                      progress_bar=True, return_logprob=getattr(args, "return_logprob", None),
                                      logprob_start_len=getattr(args, "logprob_start_len", None))
    latency = time.perf_counter() - tic

    preds = [get_answer_value(state["answer"]) for state in states]
    acc = float(np.mean(np.array(preds) == np.array(labels)))
    invalid = float(np.mean(np.array(preds) == INVALID))
    output_tokens = sum(state.get_meta_info("answer")["completion_tokens"] for state in states)
    output_throughput = output_tokens / latency

    print(f"Accuracy: {acc:.3f}")
    print(f"Invalid: {invalid:.3f}")
    print(f"Latency: {latency:.3f} s")
    print(f"Output throughput: {output_throughput:.3f} token/s")
    dump_state_text("tmp_output_gsm8k.txt", states)
    return {"accuracy": acc, "invalid": invalid, "latency": latency, "output_throughput": output_throughput}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m treadle.test.few_shot_gsm8k",
                                     description="Few-shot GSM8K accuracy of a running treadle server.")
    parser.add_argument("--num-shots", type=int, default=5)
    parser.add_argument("--data-path", type=str, help="a GSM8K-style JSONL file (default: download the test set)")
    parser.add_argument("--num-questions", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--parallel", type=int, default=128)
    parser.add_argument("--host", type=str, default="http://127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--temperature", type=float, default=0.0)
    return run_eval(parser.parse_args(argv))


if __name__ == "__main__":
    main()
