"""Session 48: the offline Engine's Python API used as a careless caller would, on a tiny
dummy model in-process; each test a bug found (it failed on the code before its fix), and the
engine still serves afterwards, holding no KV slot."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_checks import assert_idle, tiny_engine

from treadle.runtime import Engine


@pytest.fixture(scope="module")
def engine():
    with tiny_engine() as e:
        yield e


OK = {"max_new_tokens": 2}


@pytest.mark.parametrize("input_ids", [
    [np.array([1, 2, 3]), np.array([4, 5])],  # a batch as a list of arrays
    [torch.tensor([1, 2, 3])],
    [1, 2, np.array([3, 4])],
], ids=["numpy-rows", "tensor-row", "array-among-ids"])
def test_a_list_of_arrays_as_input_ids_is_a_value_error_naming_tolist(engine, input_ids):
    # was StopIteration (an array of several ids has __index__, which raised TypeError, and the
    # search for the element without __index__ found none)
    with pytest.raises(ValueError, match=r"input_ids must be integers.*\.tolist\(\)"):
        engine.generate(input_ids=input_ids, sampling_params=OK)
    assert len(engine.generate(input_ids=[1, 2, 3], sampling_params=OK)["output_ids"]) == 2
    assert_idle(engine)


def test_a_prompts_warm_up_is_not_counted_in_flight():
    """A request of several samples of one prompt is held whole (`reserve`), then its prompt is
    warmed by a request of the server's own: that warm-up was counted in flight, so a 12-part
    request at a limit of 12 read "(13, limit 12)" in 503s, /get_server_info and /metrics, and an
    11-part one refused a client's request that fitted ("(12, limit 12)"). A real
    TokenizerManager with no scheduler behind it: the warm-up stays in flight."""
    import asyncio
    import shutil
    import uuid

    from treadle.runtime.engine_args import EngineArgs
    from treadle.runtime.io_struct import TokenizedGenerateReq
    from treadle.runtime.sampling_params import SamplingParams
    from treadle.runtime.server.ipc import IpcPaths
    from treadle.runtime.server.metrics import ServerMetrics
    from treadle.runtime.server.tokenizer_manager import TokenizerManager

    paths = IpcPaths.create()
    tm = TokenizerManager(EngineArgs(max_queued_requests=8), None, {"vocab_size": 100, "context_len": 64,
                                                                   "num_slots": 256, "max_running": 4},
                          paths, ServerMetrics())

    async def main() -> None:
        reqs = [TokenizedGenerateReq(uuid.uuid4().hex, [1, 2, 3], SamplingParams(max_new_tokens=4)) for _ in range(11)]
        with tm.reserve(reqs, {}):
            warm = asyncio.get_running_loop().create_task(tm.warm_prefixes(reqs))
            for _ in range(3):
                await asyncio.sleep(0)
            assert len(tm.states) == 12  # the 11 parts and the warm-up
            assert tm.num_in_flight == 11
            tm.check_capacity(1)  # one more fits (was a 503 "(12, limit 12)")
            warm.cancel()
            with pytest.raises(asyncio.CancelledError):
                await warm

    try:
        asyncio.run(main())
    finally:
        tm.close()
        shutil.rmtree(paths.root, ignore_errors=True)


_LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
          "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 256}


@pytest.mark.parametrize("config, files, needle", [
    ([1, 2], {}, "config.json must hold a JSON object"),  # was AttributeError
    ({k: v for k, v in _LLAMA.items() if k != "hidden_size"}, {}, "config has no `hidden_size`"),  # was KeyError
    ({**_LLAMA, "num_attention_heads": 0}, {}, "`num_attention_heads` must be a positive integer"),  # ZeroDivisionError
    ({**_LLAMA, "num_key_value_heads": None, "vocab_size": None}, {}, "config has no `vocab_size`"),  # TypeError
    ({**_LLAMA, "architectures": "LlamaForCausalLM"}, {}, "`architectures` must be a list"),  # 'L' unsupported
    (_LLAMA, {"generation_config.json": "{oops"}, "generation_config.json is not valid JSON"),
], ids=["list", "no-hidden-size", "zero-heads", "null-vocab", "architectures-string", "bad-generation-config"])
def test_a_broken_config_json_is_a_value_error_naming_the_field(tmp_path, config, files, needle):
    import json

    (tmp_path / "config.json").write_text(json.dumps(config))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        Engine(model_path=str(tmp_path))


@pytest.mark.parametrize("size", [1000, 200_000])
def test_a_gguf_file_cut_short_in_its_header_is_a_value_error(tmp_path, size):
    # was IndexError out of gguf's reader (a file cut inside its tensor data already said so)
    import importlib.util

    from treadle.runtime.model_source import embedded_model_path

    with open(embedded_model_path(importlib.util.find_spec), "rb") as f:
        head = f.read(size)
    path = tmp_path / "cut.gguf"
    path.write_bytes(head)
    with pytest.raises(ValueError, match="cannot read .* as GGUF .*complete GGUF"):
        Engine(model_path=str(path))


def _tiny_llama_checkpoint(path, **changed) -> None:
    """A one-layer Llama of random weights in `path` (config.json + model.safetensors);
    `changed`: tensors replaced (name -> tensor)."""
    import json

    from safetensors.torch import save_file

    cfg = {**_LLAMA, "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(cfg))
    shapes = {"self_attn.q_proj.weight": (64, 64), "self_attn.k_proj.weight": (64, 64),
              "self_attn.v_proj.weight": (64, 64), "self_attn.o_proj.weight": (64, 64),
              "mlp.gate_proj.weight": (128, 64), "mlp.up_proj.weight": (128, 64), "mlp.down_proj.weight": (64, 128),
              "input_layernorm.weight": (64,), "post_attention_layernorm.weight": (64,)}
    tensors = {"model.embed_tokens.weight": torch.randn(256, 64), "model.norm.weight": torch.ones(64),
               **{f"model.layers.0.{n}": torch.randn(*s) * 0.05 for n, s in shapes.items()}}
    save_file({**tensors, **changed}, str(path / "model.safetensors"))


def test_broken_weights_are_a_value_error_naming_the_tensor_or_file(tmp_path):
    for name, changed, raw, needle in [
        ("shape", {"model.layers.0.mlp.down_proj.weight": torch.randn(64, 100)}, None,
         r"checkpoint tensor for 'layers.0.mlp.down_proj.weight' of shape \(64, 100\) does not fit"),  # RuntimeError
        ("garbage", {}, b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage}", "cannot read .* as safetensors"),  # SafetensorError
    ]:
        d = tmp_path / name
        d.mkdir()
        _tiny_llama_checkpoint(d, **changed)
        if raw is not None:
            (d / "model.safetensors").write_bytes(raw)
        with pytest.raises(ValueError, match=needle):
            Engine(model_path=str(d))


@pytest.mark.parametrize("changed, needle", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),  # was served with SiLU, silently wrong
    ({"rope_scaling": [1]}, "`rope_scaling` / `rope_parameters` must be an object"),  # was TypeError
    ({"eos_token_id": "x"}, "`eos_token_id` must be a token id"),  # was "invalid literal for int()"
    ({"rms_norm_eps": "x"}, "`rms_norm_eps` must be a number"),  # was "could not convert string to float"
], ids=["gelu", "rope-scaling-list", "eos-string", "eps-string"])
def test_a_config_field_treadle_cannot_honour_or_read_is_named(tmp_path, changed, needle):
    import json

    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA, **changed}))
    with pytest.raises(ValueError, match=needle):
        Engine(model_path=str(tmp_path))


@pytest.mark.parametrize("name, text, needle", [
    ("tokenizer_config.json", "[1]", "cannot load a tokenizer from .*AttributeError"),  # was AttributeError
    ("model.safetensors.index.json", "[1]", "has no `weight_map`"),  # was AttributeError
    ("model.safetensors.index.json", '{"weight_map": 5}', "has no `weight_map`"),  # was AttributeError
], ids=["tokenizer-config-list", "index-list", "index-map-int"])
def test_a_broken_side_file_of_a_checkpoint_is_a_value_error(tmp_path, name, text, needle):
    _tiny_llama_checkpoint(tmp_path)
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=needle):
        Engine(model_path=str(tmp_path))


def test_tuples_of_stops_choices_and_stop_ids_are_taken_as_lists(engine):
    # SGLang iterates them; treadle refused a tuple ("must be a list") while taking a numpy array
    ids = [1, 2, 3]
    ref = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 4, "temperature": 0, "stop": ["a", "b"],
                                                          "stop_token_ids": [5, 6]})
    got = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 4, "temperature": 0, "stop": ("a", "b"),
                                                          "stop_token_ids": (5, 6)})
    assert got["output_ids"] == ref["output_ids"]
    assert engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 4, "stop_token_ids": {6, 5}})
    assert engine.generate(input_ids=[ids, ids], sampling_params={"choices": ("yes", "no")})[1]["text"] in ("yes", "no")
    with pytest.raises(ValueError, match="stop must be a string or a list"):
        engine.generate(input_ids=ids, sampling_params={"stop": ("a", 1)})
    assert_idle(engine)


def test_a_rid_reused_after_its_stream_was_closed_or_its_task_cancelled_gets_its_own_result(engine):
    """The closed stream's abort finished the old request after the new one had taken the rid:
    the new caller got the old one's "abort" as its result (the new request ran on unheard). A
    cancelled async_generate's rid was "already in use" until its abort came back."""
    import asyncio

    sp = {"max_new_tokens": 12, "ignore_eos": True}
    for i in range(3):
        stream = engine.generate(input_ids=[1, 2, 3, i], sampling_params=sp, stream=True, rid="again")
        next(stream)
        stream.close()
        out = engine.generate(input_ids=[1, 2, 3, i], sampling_params=sp, rid="again")
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 12}, out["meta_info"]

    async def cancel_then_reuse() -> dict:
        task = asyncio.get_running_loop().create_task(
            engine.async_generate(input_ids=[1, 2, 3], sampling_params={**sp, "max_new_tokens": 200}, rid="again"))
        while not engine._outboxes:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await engine.async_generate(input_ids=[1, 2, 3], sampling_params=sp, rid="again")

    assert asyncio.run(cancel_then_reuse())["meta_info"]["finish_reason"]["type"] == "length"
    assert_idle(engine)
    assert not engine._outboxes and not engine._draining
