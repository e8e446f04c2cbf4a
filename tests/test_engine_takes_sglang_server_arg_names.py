"""sgl.Engine(...) takes SGLang's server-argument names (random_seed, disable_cuda_graph, ...) as
sgl.Runtime(...) does, from the one table in runtime/engine_args.py, and refuses the ones
treadle has no equivalent of with why."""
from __future__ import annotations

import pytest

import treadle as sgl

HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_engine_takes_sglangs_server_argument_names():
    with pytest.raises(ValueError, match="Engine\\(\\): SGLang's chat_template: roles render with the served "
                                         "model's own chat template"):
        sgl.Engine(chat_template="chatml")
    with pytest.raises(ValueError, match="both name treadle's 'seed'"):
        sgl.Engine(random_seed=1, seed=2)
    engine = sgl.Engine(model_path=HF_ID, random_seed=7, disable_cuda_graph=True, disable_overlap_schedule=True,
                        trust_remote_code=True, max_total_tokens=4096)
    try:
        assert (engine.args.seed, engine.args.cuda_graph, engine.args.overlap_schedule) == (7, False, "off")
        out = engine.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0})
        assert "Paris" in out["text"]
    finally:
        engine.shutdown()
