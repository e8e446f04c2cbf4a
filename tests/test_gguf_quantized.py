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
from treadle.runtime.tokenizer import encode_prompt, load_tokenizer

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


def _logits(runner: ModelRunner, seqs: list[list[int]], prefill: bool = False) -> list[torch.Tensor]:
    """float32 logits [len(ids), vocab] of every position of each sequence: one prefill of all
    of them, or decode steps of all of them together (at most 8 rows a step: the packed
    kernels' path; each row's sums do not depend on the rows beside it)."""
    assert len(seqs) <= 8
    if prefill:
        return _prefill_logits(runner, seqs)
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    slots = [runner.allocator.alloc(len(ids)) for ids in seqs]
    for r, sl in zip(rows, slots):
        runner.req_to_token_pool.req_to_token[r, : len(sl)] = sl.to(torch.int32)
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    try:
        for j in range(max(map(len, seqs))):
            live = [i for i, ids in enumerate(seqs) if j < len(ids)]
            fb = ForwardBatch.build(ForwardMode.DECODE, [seqs[i][j] for i in live], [j] * len(live),
                                    torch.stack([slots[i][j] for i in live]), [rows[i] for i in live],
                                    [j] * len(live), [1] * len(live), list(range(len(live))), runner.device)
            for i, lg in zip(live, runner.forward(fb)):
                out[i].append(lg)
    finally:
        for r, sl in zip(rows, slots):
            runner.allocator.free(sl)
            runner.req_to_token_pool.free(r)
    return [torch.stack(o) for o in out]


def _prefill_logits(runner: ModelRunner, seqs: list[list[int]]) -> list[torch.Tensor]:
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    slots = runner.allocator.alloc(sum(map(len, seqs)))
    try:
        at = 0
        for r, ids in zip(rows, seqs):
            runner.req_to_token_pool.req_to_token[r, : len(ids)] = slots[at:at + len(ids)].to(torch.int32)
            at += len(ids)
        flat = [t for ids in seqs for t in ids]
        fb = ForwardBatch.build(ForwardMode.EXTEND, flat, [j for ids in seqs for j in range(len(ids))], slots, rows,
                                [0] * len(seqs), [len(ids) for ids in seqs], list(range(len(flat))), runner.device)
        return list(runner.forward(fb).split([len(ids) for ids in seqs]))
    finally:
        runner.allocator.free(slots)
        for r in rows:
            runner.req_to_token_pool.free(r)


PROMPTS = [  # held out: none of them is used by another test or a benchmark
    "Name three rivers in Africa and say which of them is the longest, with its length.",
    "What does a carpenter do on a normal working day, and which tools does she use most?",
    "Write one sentence about autumn leaves falling on a quiet street after the rain.",
    "How do vaccines teach the immune system to recognise a virus it has never met?",
    "Give me a synonym for happy that I could use in a formal letter to my bank.",
    "What is 12 times 7, and how would you explain the answer to a child of eight?",
    "Describe the colour of the ocean at night when the moon is full and the sky is clear.",
    "Why do cats purr when they are content, and do they also purr when they are hurt?",
    "Suggest a title for a mystery novel set in a lighthouse on a remote Scottish island.",
    "What is the boiling point of water at the top of a high mountain, and why is it lower?",
    "Explain what a noun is, and give three examples from a sentence about a farm.",
    "List two uses of copper in houses and one use of copper in the electronics industry.",
    "Who wrote Hamlet, and in which years was the play most likely written and first staged?",
    "How far is the Moon from Earth on average, and how long does its light take to reach us?",
    "What is a haiku, and how many syllables does each of its three lines usually have?",
    "Tell me a fun fact about owls that most people who watch birds do not know yet.",
    "How should I store fresh bread at home so that it stays soft for three or four days?",
    "What is the opposite of ancient, and can you use both words in one short sentence?",
    "Why do the leaves of maple trees turn red in autumn while birch leaves turn yellow?",
    "Recommend a board game for four players who have one hour and like trading resources.",
]


def test_embedded_packed_agrees_with_fp32_path():
    base = dict(model_path=None, device="cpu", dtype="float32", max_total_tokens=1024, max_running_requests=8)
    packed = ModelRunner(EngineArgs(**base))
    assert isinstance(packed.model.layers[0].mlp.down_proj, gguf_packed.PackedLinear)
    assert isinstance(packed.model.lm_head, gguf_packed.PackedEmbedding)
    dense = ModelRunner(EngineArgs(**base, gguf_dequantize=True))
    assert not isinstance(dense.model.layers[0].mlp.down_proj, gguf_packed.PackedLinear)
    tok = load_tokenizer(packed.source)
    # the prompts as plain text: a chat template's shared system turn would repeat ~30 positions
    seqs = [encode_prompt(tok, q) for q in PROMPTS]
    same = total = 0
    kl = []
    for g in range(0, len(seqs), 8):
        group = seqs[g:g + 8]
        for ref, got in zip(_logits(dense, group, prefill=True), _logits(packed, group)):
            ref, got = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
            same += int((ref.argmax(-1) == got.argmax(-1)).sum())
            total += ref.shape[0]
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
    from treadle.runtime import cpu_ops

    monkeypatch.setattr(cq, "library", lambda *a, **k: None)
    monkeypatch.setattr(cpu_ops, "_lib", None)  # and the per-layer ops take their torch references
    monkeypatch.setattr(cpu_ops, "_tried", True)
    assert not cpu_ops.usable(torch.zeros(1))
    runner = ModelRunner(EngineArgs(model_path=None, device="cpu", dtype="float32", max_total_tokens=256,
                                    max_running_requests=2))
    layer = runner.model.layers[0]
    assert not isinstance(layer.mlp.down_proj, gguf_packed.PackedLinear)  # dense fp32 modules
    tok = load_tokenizer(runner.source)
    logits = _logits(runner, [encode_prompt(tok, "The capital of France is")], prefill=True)[0]
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
