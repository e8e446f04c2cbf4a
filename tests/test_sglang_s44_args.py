"""SGLang's server arguments (sglang/srt/server_args.py's ServerArgs) at SGLang's own defaults are
taken by Engine(...) / Runtime(...) / ServerArgs(...) keywords and by `python -m
treadle.launch_server` flags (before: show_time_cost=False, revision=None, cpu_offload_gb=0, ...
were each refused as unknown); those that only change logging or the warm-up take any value; those
treadle has under another name are translated (disable_custom_all_reduce, dist_timeout, ...); any
other value is a ValueError (a usage error for the flags) naming the argument. No model loads here."""
from __future__ import annotations

import argparse

import pytest

import treadle as sgl
from treadle.launch_server import parse_args
from treadle.runtime.engine_args import EngineArgs, translate_sglang_args

# keywords as SGLang's ServerArgs has them by default (its Optional fields' None included)
SGLANG_DEFAULTS = dict(
    show_time_cost=False, revision=None, download_dir=None, skip_server_warmup=False, enable_cache_report=False,
    cpu_offload_gb=0, allow_auto_truncate=False, decode_log_interval=40, random_seed=None, mem_fraction_static=None,
    max_running_requests=None, chunked_prefill_size=None, cuda_graph_max_bs=None, attention_backend=None,
    device=None, speculative_num_draft_tokens=None, dist_timeout=None, constrained_json_whitespace_pattern=None,
    disable_custom_all_reduce=False, tokenizer_worker_num=1, pp_size=1, ep_size=1, enable_lora=None, lora_paths=None,
    max_loras_per_batch=8, lora_backend="triton", enable_hierarchical_cache=False, hicache_ratio=2.0,
    speculative_accept_threshold_single=1.0, log_requests_level=2, log_level_http=None, model_impl="auto",
    disaggregation_mode="null", enable_p2p_check=False, triton_attention_num_kv_splits=8, sampling_defaults="model",
    file_storage_path="sglang_storage", json_model_override_args="{}", warmups=None, enable_memory_saver=False,
    num_continuous_decode_steps=1, torchao_config="", enable_dp_attention=False, base_gpu_id=0, gpu_id_step=1,
    disable_outlines_disk_cache=False, enable_ep_moe=False, crash_dump_folder=None, enable_trace=False,
    admin_api_key=None, enable_overlap_schedule=False, disable_disk_cache=False)


def engine_args(kwargs: dict, caller: str = "Engine") -> EngineArgs:
    """What Engine(...) / Runtime(...) make of their keywords (the same call they make)."""
    return EngineArgs.from_kwargs(**translate_sglang_args(kwargs, caller))


def test_sglang_defaults_as_keywords_change_nothing():
    assert engine_args(SGLANG_DEFAULTS) == engine_args({}) == EngineArgs()
    assert engine_args(SGLANG_DEFAULTS, "Runtime") == EngineArgs()
    assert sgl.ServerArgs(**SGLANG_DEFAULTS) == sgl.ServerArgs()


def test_logging_and_warmup_arguments_take_any_value_of_their_type():
    noisy = dict(show_time_cost=True, decode_log_interval=1, skip_server_warmup=True, enable_cache_report=True,
                 log_requests_level=3, log_level_http="warning", gc_warning_threshold_secs=0.5)
    assert engine_args(noisy) == EngineArgs()
    with pytest.raises(ValueError, match="decode_log_interval: takes int values.*decode_log_interval='often'"):
        engine_args({"decode_log_interval": "often"})


def test_sglang_names_of_treadles_arguments_are_honoured():
    got = engine_args(dict(random_seed=5, disable_custom_all_reduce=True, dist_timeout=30,
                           constrained_json_whitespace_pattern=r"[ ]?", disable_regex_jump_forward=True,
                           disable_outlines_disk_cache=True, enable_ep_moe=True, enable_overlap_schedule=True))
    assert (got.seed, got.custom_all_reduce, got.dist_timeout_s, got.json_whitespace_pattern) == (5, False, 30.0,
                                                                                                   "[ ]?")
    assert got.disable_jump_forward and got.grammar_cache_dir == "" and got.enable_expert_parallel
    assert got.overlap_schedule == "on"
    with pytest.raises(ValueError, match="both name treadle's 'dist_timeout_s'"):
        engine_args(dict(dist_timeout=30, dist_timeout_s=20.0))


@pytest.mark.parametrize("name, value", [
    ("cpu_offload_gb", 4), ("allow_auto_truncate", True), ("revision", "v1.0"), ("download_dir", "/tmp/m"),
    ("lora_paths", ["a=/x"]), ("pp_size", 2), ("enable_hierarchical_cache", True), ("ep_size", 2),
    ("speculative_draft_model_path", "/d"), ("crash_dump_folder", "/tmp/c"), ("sampling_defaults", "mine"),
])
def test_values_treadle_cannot_honour_are_refused_naming_the_argument(name, value):
    with pytest.raises(ValueError, match=f"Engine\\(\\): SGLang's {name}: .*not supported: {name}="):
        engine_args({name: value})
    with pytest.raises(ValueError, match=f"Runtime\\(\\): SGLang's {name}: "):
        sgl.Runtime(**{name: value})  # refused before any process starts


def test_launch_server_flags_at_sglangs_defaults_and_honoured_ones(capsys):
    base = ["--model-path", "dummy:tiny-llama", "--port", "30001"]
    flags = ["--show-time-cost", "--decode-log-interval", "40", "--skip-server-warmup", "--enable-cache-report",
             "--cpu-offload-gb", "0", "--tokenizer-worker-num", "1", "--pp-size", "1", "--log-requests-level", "0",
             "--lora-backend", "triton", "--sampling-defaults", "model", "--hicache-ratio", "2"]
    assert parse_args(base + flags) == parse_args(base)
    got = parse_args(base + ["--disable-custom-all-reduce", "--dist-timeout", "30", "--tensor-parallel-size", "1",
                             "--data-parallel-size", "1", "--pipeline-parallel-size", "1", "--ep", "1"])
    assert (got.custom_all_reduce, got.dist_timeout_s) == (False, 30.0)
    with pytest.raises(SystemExit) as e:
        parse_args(base + ["--cpu-offload-gb", "8", "--allow-auto-truncate", "--lora-paths", "a", "b"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert all(s in err for s in ("cpu_offload_gb=8", "allow_auto_truncate=True", "lora_paths=['a', 'b']"))


def test_server_args_cli_takes_sglangs_flags():
    parser = argparse.ArgumentParser()
    sgl.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--show-time-cost", "--dp", "1", "--decode-log-interval", "7"])
    assert sgl.ServerArgs.from_cli_args(ns) == sgl.ServerArgs()
    with pytest.raises(ValueError, match="SGLang's revision: treadle downloads no model"):
        sgl.ServerArgs.from_cli_args(parser.parse_args(["--revision", "v2"]))
