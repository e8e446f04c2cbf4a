"""GGUF weights kept quantized on the CPU (runtime/cpu_quant.py, runtime/gguf_packed.py): each
packed matmul against its dequantize-then-matmul reference, the blocks against the gguf
package's own dequantization, the embedded model's packed path against its float32 path
(top-1 agreement and KL over 20 held-out prompts), and the fallback with no C compiler."""
from __future__ import annotations

import types

import gguf
import numpy as np
import pytest
import torch

from treadle.runtime import cpu_quant as cq
from treadle.runtime import gguf_packed
from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.forward_batch import ForwardBatch, ForwardMode
from treadle.runtime.model_runner import ModelRunner
from treadle.runtime.tokenizer import apply_chat_template, encode_prompt, load_tokenizer

T = gguf.GGMLQuantizationType


def _gguf_tensor(kind: str, n: int, k: int, seed: int):
    """A GGUF-quantized random [n, k] matrix as the reader gives it (dims innermost-first),
    and the float32 weights the gguf package dequantizes it to."""
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal((n, k)) * rng.uniform(0.01, 0.2, (n, 1))).astype(np.float32)
    qtype = getattr(T, kind)
    blocks = gguf.quants.quantize(dense, qtype)
    ref = gguf.quants.dequantize(blocks, qtype).reshape(n, k)
    return types.SimpleNamespace(tensor_type=qtype, shape=np.array([k, n]), data=blocks), torch.from_numpy(ref)


@pytest.fixture(scope="module")
def lib():
    lib = cq.library()
    assert lib is not None, "the CPU kernels did not compile (gcc is needed on CI)"
    return lib


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("n,k", [(1, 32), (7, 64), (33, 96), (96, 576)])
def test_packed_matmul_matches_dequantize_reference(lib, kind, n, k):
    tensor, dense = _gguf_tensor(kind, n, k, seed=n * 1000 + k)
    w = gguf_packed.pack_gguf_tensor(tensor)
    # the packed blocks hold exactly the weights gguf dequantizes them to, in the kernel and the ref
    assert torch.equal(cq.dequantize_ref(w), dense)
    assert torch.equal(cq.dequantize(lib, w), dense)
    g = torch.Generator().manual_seed(k)
    for m in (1, 2, 5, 8, 9, 13):  # 9 and 13 rows: the dequantize + GEMM path, and odd M tiles
        x = torch.randn(m, k, generator=g)
        want = cq.matmul_ref(x, w)
        torch.testing.assert_close(gguf_packed.packed_linear(lib, x, w), want, atol=2e-5, rtol=1e-5)
        if m <= 8:  # each row's sum is the same whatever rows ride along (batch-invariant)
            assert torch.equal(cq.matmul(lib, x, w)[:1], cq.matmul(lib, x[:1].contiguous(), w))
    with pytest.raises(ValueError, match="features"):
        cq.matmul(lib, torch.zeros(1, k + 32), w)
    with pytest.raises(ValueError, match="float32"):
        cq.matmul(lib, torch.zeros(1, k, dtype=torch.float64), w)


def test_packed_embedding_rows_and_head(lib):
    tensor, dense = _gguf_tensor("Q8_0", 50, 64, seed=3)
    emb = gguf_packed.PackedEmbedding(lib, gguf_packed.pack_gguf_tensor(tensor), vocab_size=48)
    ids = torch.tensor([0, 49, 7, 7])
    assert torch.equal(emb(ids), dense[ids])
    h = torch.randn(11, 64, generator=torch.Generator().manual_seed(0))  # 11 rows: two 8-row chunks
    torch.testing.assert_close(emb.compute_logits(h), (h @ dense.T)[:, :48], atol=2e-5, rtol=1e-5)


def _logits(runner: ModelRunner, ids: list[int], chunk: int) -> torch.Tensor:
    """float32 logits [len(ids), vocab] of every position, computed `chunk` tokens a forward on top
    of the KV of the earlier ones (chunk <= 8: the packed kernels, as in decode steps)."""
    row = runner.req_to_token_pool.alloc()
    slots = runner.allocator.alloc(len(ids))
    runner.req_to_token_pool.req_to_token[row, : len(ids)] = slots.to(torch.int32)
    out = []
    try:
        for s in range(0, len(ids), chunk):
            e = min(len(ids), s + chunk)
            fb = ForwardBatch.build(ForwardMode.EXTEND, ids[s:e], list(range(s, e)), slots[s:e], [row], [s],
                                    [e - s], list(range(e - s)), runner.device)
            out.append(runner.forward(fb))
    finally:
        runner.allocator.free(slots)
        runner.req_to_token_pool.free(row)
    return torch.cat(out)


PROMPTS = [  # held out: none of them is used by another test or a benchmark
    "Name three rivers in Africa.", "What does a carpenter do?", "Write one sentence about autumn.",
    "How do vaccines work?", "Give me a synonym for happy.", "What is 12 times 7?",
    "Describe the colour of the ocean at night.", "Why do cats purr?", "Suggest a title for a mystery novel.",
    "What is the boiling point of water?", "Explain what a noun is.", "List two uses of copper.",
    "Who wrote Hamlet?", "How far is the Moon from Earth?", "What is a haiku?", "Tell me a fun fact about owls.",
    "How should I store fresh bread?", "What is the opposite of ancient?", "Why do leaves change colour?",
    "Recommend a board game for four players.",
]


def test_embedded_packed_agrees_with_fp32_path():
    base = dict(model_path=None, device="cpu", dtype="float32", max_total_tokens=1024, max_running_requests=4)
    packed = ModelRunner(EngineArgs(**base))
    assert isinstance(packed.model.layers[0].mlp.down_proj, gguf_packed.PackedLinear)
    assert isinstance(packed.model.lm_head, gguf_packed.PackedEmbedding)
    dense = ModelRunner(EngineArgs(**base, gguf_dequantize=True))
    assert not isinstance(dense.model.layers[0].mlp.down_proj, gguf_packed.PackedLinear)
    tok = load_tokenizer(packed.source)
    same = total = 0
    kl = []
    for q in PROMPTS:
        ids = encode_prompt(tok, apply_chat_template(tok, [{"role": "user", "content": q}]))
        ref = torch.log_softmax(_logits(dense, ids, chunk=len(ids)), -1)
        got = torch.log_softmax(_logits(packed, ids, chunk=8), -1)
        same += int((ref.argmax(-1) == got.argmax(-1)).sum())
        total += len(ids)
        kl.append((ref.exp() * (ref - got)).sum(-1))
    kl_mean = float(torch.cat(kl).mean())
    print(f"packed vs fp32: top-1 agreement {same}/{total} = {same / total:.4f}, mean KL {kl_mean:.3e} nats")
    assert same / total >= 0.95
    assert kl_mean < 1e-3


def test_no_compiler_falls_back_to_float32(tmp_path, monkeypatch):
    assert cq.library(cc=str(tmp_path / "no-such-cc"), cache_dir=str(tmp_path)) is None
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    assert cq.library(cc=str(broken), cache_dir=str(tmp_path / "cache")) is None
    monkeypatch.setattr(cq, "library", lambda *a, **k: None)
    runner = ModelRunner(EngineArgs(model_path=None, device="cpu", dtype="float32", max_total_tokens=256,
                                    max_running_requests=2))
    layer = runner.model.layers[0]
    assert not isinstance(layer.mlp.down_proj, gguf_packed.PackedLinear)  # dense fp32 modules
    tok = load_tokenizer(runner.source)
    ids = encode_prompt(tok, "The capital of France is")
    logits = _logits(runner, ids, chunk=len(ids))
    assert tok.decode([int(logits[-1].argmax())]).strip() == "Paris"


def test_cpu_ops_match_their_references():
    from treadle.kernels import activation, decode_attention, rmsnorm, rope
    from treadle.runtime import cpu_ops

    assert cpu_ops.lib() is not None
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for t in (1, 3):
            x, w = torch.randn(t, 576, generator=g), torch.randn(576, generator=g)
            torch.testing.assert_close(cpu_ops.rmsnorm(x, w, 1e-5), rmsnorm.rmsnorm_ref(x, w, 1e-5))
            res = torch.randn(t, 576, generator=g)
            xa, ra, xb, rb = x.clone(), res.clone(), x.clone(), res.clone()
            cpu_ops.fused_add_rmsnorm(xa, ra, w, 1e-5)
            rmsnorm.fused_add_rmsnorm_ref(xb, rb, w, 1e-5)
            torch.testing.assert_close((xa, ra), (xb, rb))
            h = torch.randn(t, 2 * 96, generator=g) * 4
            torch.testing.assert_close(cpu_ops.silu_and_mul(h), activation.silu_and_mul_ref(h))
            # q and k as the model has them: strided views of one qkv row
            qkv = torch.randn(t, (9 + 2 * 3) * 64, generator=g)
            cs = rope.build_cos_sin_cache(64, 100, 10000.0)
            pos = torch.tensor([5, 99, 0][:t])
            pairs = []
            for _ in range(2):
                q, k, _v = qkv.clone().split([9 * 64, 3 * 64, 3 * 64], dim=-1)
                pairs.append((q.view(t, 9, 64), k.view(t, 3, 64)))
            assert cpu_ops.rope_layout_ok(*pairs[0])
            cpu_ops.apply_rope(*pairs[0], pos, cs)
            rope.apply_rope_ref(*pairs[1], pos, cs)
            torch.testing.assert_close(pairs[0], pairs[1])
        # decode attention over a paged pool: 3 requests of 1, 17 and 40 tokens, GQA 9 / 3 heads
        kb, vb = torch.randn(80, 3, 64, generator=g), torch.randn(80, 3, 64, generator=g)
        table = torch.zeros(4, 64, dtype=torch.int32)
        lens = [1, 17, 40]
        perm = torch.randperm(79, generator=g) + 1
        at = 0
        for r, n in zip((2, 0, 3), lens):
            table[r, :n] = perm[at:at + n].to(torch.int32)
            at += n
        q = torch.randn(3, 9, 64, generator=g)
        o1, o2 = torch.empty_like(q), torch.empty_like(q)
        args = (table, torch.tensor([2, 0, 3]), torch.tensor(lens), 0.125)
        cpu_ops.decode_attention(q, kb, vb, o1, *args)
        decode_attention.decode_attention_ref(q, kb, vb, o2, *args)
        torch.testing.assert_close(o1, o2)
