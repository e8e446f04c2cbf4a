"""`sgl.Engine(...).get_server_info()` as SGLang's: the server arguments at the top level,
with `model_path`, `version` and its scheduler's `max_total_num_tokens` / `max_req_input_len`
(treadle's had them only under "engine_args", and no pool size: a KeyError for a ported
`llm.get_server_info()["max_total_num_tokens"]`). A tiny random-weight Engine: what is tested
is the surface."""
from __future__ import annotations

import pytest

import treadle as sgl


@pytest.fixture(scope="module")
def llm():
    engine = sgl.Engine(model_path="dummy:tiny-llama", max_total_tokens=1024)
    yield engine
    engine.shutdown()


def test_get_server_info_has_sglangs_top_level_keys(llm):
    info = llm.get_server_info()
    assert info["max_total_num_tokens"] == info["total_slots"] == 1024
    assert 0 < info["max_req_input_len"] < min(info["context_length"], 1024)
    assert info["model_path"] == "dummy:tiny-llama" and info["tp_size"] == 1 and isinstance(info["version"], str)
    assert info["engine_args"]["max_total_tokens"] == info["max_total_tokens"] == 1024
    assert "api_key" not in info and "free_slots" in info  # the scheduler's counters, as before
    # the DSL's view over it (EngineBackend) is the same
    assert sgl.EngineBackend(llm).get_server_info()["max_total_num_tokens"] == 1024


def test_input_ids_may_be_a_tokenizers_batch_encoding(llm):
    """SGLang's function-calling doc (offline Engine section) passes
    tokenizer.apply_chat_template(..., tokenize=True) on as input_ids; under transformers 5 that
    is a BatchEncoding (a mapping holding "input_ids"), which was a ValueError."""
    tok = llm.tokenizer_manager.tokenizer
    messages = [{"role": "user", "content": "What's the weather like in Boston today?"}]
    enc = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = enc["input_ids"] if not isinstance(enc, list) else enc
    params = {"max_new_tokens": 3, "temperature": 0, "skip_special_tokens": False}
    out = llm.generate(input_ids=enc, sampling_params=params)
    assert out["output_ids"] == llm.generate(input_ids=ids, sampling_params=params)["output_ids"]
    assert out["meta_info"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("value", ["qwen25", "qwen", "llama3"])
def test_launch_server_takes_the_tool_call_parsers_whose_format_the_server_reads(value):
    """SGLang's function-calling doc launches with `--tool-call-parser qwen25` (its server parses
    tool calls only then); treadle's server always reads <tool_call> blocks and a reply that is
    one JSON call, and refused the flag ('the server does not parse tool calls')."""
    from treadle.launch_server import parse_args
    from treadle.srt.server_args import ServerArgs

    args = parse_args(["--tool-call-parser", value, "--max-total-tokens", "1024"])
    assert args.max_total_tokens == 1024
    assert ServerArgs(tool_call_parser=value).max_total_tokens is None


def test_a_tool_call_parser_of_another_format_is_refused_by_name():
    from treadle.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match="tool_call_parser: the server reads tool calls in qwen25's format.*"
                                         "not supported: tool_call_parser='mistral'"):
        ServerArgs(tool_call_parser="mistral")


def test_launch_server_takes_sglangs_think_reasoning_parsers():
    """SGLang's reasoning doc launches with `--reasoning-parser qwen3`: the keywords took it
    (treadle's "think"), the flag was argparse's 'invalid choice' (choose from none, think)."""
    from treadle.launch_server import parse_args

    assert parse_args(["--reasoning-parser", "qwen3"]).reasoning_parser == "think"
    assert parse_args(["--reasoning-parser", "think"]).reasoning_parser == "think"
