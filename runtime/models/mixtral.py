"""Mixtral: Mistral attention with 8 experts a layer, 2 a token, routed by a softmax over the
top-2 logits (the top-2 of the full softmax, renormalised: the same weights). It is
Qwen3MoeForCausalLM without q/k norm (a config flag) and with Mixtral's checkpoint names."""
from __future__ import annotations

from treadle.runtime.models.qwen3_moe import Qwen3MoeForCausalLM


class MixtralForCausalLM(Qwen3MoeForCausalLM):
    # layers.{L}.block_sparse_moe.experts.{e}.w1/w3/w2 = that expert's gate / up / down
    _RENAME = ((".block_sparse_moe.", ".mlp."), (".w1.weight", ".gate_proj.weight"),
               (".w3.weight", ".up_proj.weight"), (".w2.weight", ".down_proj.weight"))
