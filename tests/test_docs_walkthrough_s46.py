"""What a newcomer following the docs ran into (session 46), each checked as the docs describe it.

- docs/porting-from-sglang.md: `sgl.Runtime(model_path=<a Hub id>)` is a ValueError saying to
  download the model, before any process starts (it started a server, which exited, and the
  Runtime raised a RuntimeError pointing at the server's log).
- docs/generation.md: the Engine takes numpy boolean scalars for the logprob options as Python's;
  `return_text_in_logprobs=np.True_` was a ValueError "must be a boolean".
"""
from __future__ import annotations

import numpy as np
import pytest


def test_runtime_refuses_a_hub_id_before_starting_a_server():
    import treadle as sgl

    with pytest.raises(ValueError, match="does not download models from the Hugging Face Hub"):
        sgl.Runtime(model_path="meta-llama/Llama-3.1-8B-Instruct")


@pytest.mark.slow
def test_engine_takes_numpy_bool_for_return_text_in_logprobs():
    from treadle.runtime import Engine

    with Engine(max_total_tokens=512) as engine:
        out = engine.generate("The capital of France is", {"max_new_tokens": 2, "temperature": 0},
                              return_logprob=np.True_, top_logprobs_num=np.int64(2), logprob_start_len=np.int64(1),
                              return_text_in_logprobs=np.True_)
    meta = out["meta_info"]
    assert len(meta["output_token_logprobs"]) == 2
    assert all(isinstance(text, str) for _, _, text in meta["output_token_logprobs"])
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


@pytest.mark.slow
def test_run_batch_state_keeps_the_text_its_body_wrote_before_raising(sgl_runtime):
    """docs/dsl.md: a run_batch program's error stays on its state, and `text()` gives what the
    state had when it failed. The text its body queued before raising was dropped whenever the
    executor thread had not reached it yet (here: the text after a gen in flight)."""
    import treadle as sgl

    @sgl.function
    def fails(s, q):
        s += q + sgl.gen("a", max_tokens=2, temperature=0)
        s += " [tail]"
        raise RuntimeError("the program's own error")

    states = fails.run_batch([{"q": "One"}, {"q": "Two"}], backend=sgl_runtime)
    for st in states:
        assert isinstance(st.error(), RuntimeError)
        assert st.text().endswith(" [tail]"), st.text()
        assert st.text().startswith(("One", "Two")) and st["a"] in st.text()
