"""Block-scaled FP8 weights (a scale per 128 x 128 block, as DeepSeek-V3 and Qwen3's FP8
checkpoints publish them; compressed-tensors' "block" and "group" strategies): the GEMV and
fp8_mm against their dequantize-then-matmul references (TRITON_INTERPRET=1 on the CPU, the
kernels on CUDA), the scale columns' block size read back from the shapes, and bad scales
refused with a ValueError."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.fp8_linear import FP8_DTYPE, Fp8Config, fp8_linear, fp8_linear_ref, per_token_quant_ref
from treadle.kernels.gemv import dequantize_blocks, scale_block_k

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def block_quantize(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> fp8 [N, K] and the block scales [cdiv(N, bn), cdiv(K, bk)] (amax / 448 a
    block), as a block-FP8 checkpoint holds them; written here from the format's description."""
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.zeros(nb * bn, kb * bk)
    padded[:n, :k] = w
    amax = padded.reshape(nb, bn, kb, bk).abs().amax(dim=(1, 3)).clamp(min=1e-8)
    scale = amax / 448.0
    q = (padded.reshape(nb, bn, kb, bk) / scale[:, None, :, None]).reshape(nb * bn, kb * bk)[:n, :k]
    return q.to(FP8_DTYPE), scale


def rows_of(scale: torch.Tensor, bn: int, n: int) -> torch.Tensor:
    """Block scales [NB, KB] -> the run-time [N, KB]: each block row's scales repeated down its rows."""
    return scale.repeat_interleave(bn, dim=0)[:n].contiguous()


def test_block_size_is_read_back_from_the_shapes() -> None:
    assert scale_block_k(4096, 32) == 128
    assert scale_block_k(200, 2) == 128  # a partial last block
    assert scale_block_k(14336, 112) == 128
    assert scale_block_k(4096, 64) == 64
    assert scale_block_k(64, 1) == 64  # one block covers all of K
    with pytest.raises(ValueError, match="do not cover"):
        scale_block_k(4096, 33)
    with pytest.raises(ValueError, match="at least one"):
        scale_block_k(4096, 0)


def test_dequantize_blocks_is_the_blockwise_product() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 300, generator=g)
    q, s = block_quantize(w, 128, 128)
    deq = dequantize_blocks(q, rows_of(s, 128, 200))
    for (r0, r1, bi), (c0, c1, bj) in [((0, 128, 0), (0, 128, 0)), ((128, 200, 1), (256, 300, 2))]:
        assert torch.equal(deq[r0:r1, c0:c1], q[r0:r1, c0:c1].float() * s[bi, bj])
    assert ((deq - w).abs() <= w.abs() / 16 + 1e-3).all()  # e4m3: 3 mantissa bits, half a step of rounding


@needs_kernel
@pytest.mark.parametrize("m", [1, 3, 17, 300])
@pytest.mark.parametrize("n,k,bn,bk", [(96, 200, 128, 128), (160, 256, 128, 64), (64, 96, 1, 32)])
def test_fp8_linear_block_scaled_matches_its_reference(m: int, n: int, k: int, bn: int, bk: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    w = torch.randn(n, k, generator=g) * 0.05
    q, s = block_quantize(w, bn, bk)
    q, ws = q.to(DEV), rows_of(s, bn, n).to(DEV)
    x = (torch.randn(m, k, generator=g)).to(DEV, torch.bfloat16)
    bias = torch.randn(n, generator=g).to(DEV, torch.bfloat16)
    got = fp8_linear(x, q, ws, bias).float()
    want = fp8_linear_ref(x, q, ws, bias).float()
    # fp32 sums in another order, rounded once to bf16: a bf16 step of the row's largest output
    tol = 8e-3 * want.abs().amax(dim=1, keepdim=True).clamp(min=1e-3)
    assert ((got - want).abs() <= tol).all(), (got - want).abs().max()
    if m > 1:  # W8A8: x quantized per token; the reference multiplies the dequantized sides
        xq, sx = per_token_quant_ref(x)
        full = (xq.float() * sx[:, None]) @ dequantize_blocks(q, ws).T + bias.float()
        assert ((want - full).abs() <= tol).all()
    else:  # weight-only GEMV: x as it is
        full = x.float() @ dequantize_blocks(q, ws).T + bias.float()
        assert ((want - full).abs() <= tol).all()


@needs_kernel
def test_fp8_mm_split_k_with_block_scales() -> None:
    """K in several parts (the decode batch's split-K), each part's blocks scaled before the parts add."""
    g = torch.Generator().manual_seed(7)
    n, k, m = 64, 1024, 8
    q, s = block_quantize(torch.randn(n, k, generator=g) * 0.05, 128, 128)
    q, ws = q.to(DEV), rows_of(s, 128, n).to(DEV)
    x = torch.randn(m, k, generator=g).to(DEV, torch.bfloat16)
    for split in (1, 2, 4):
        cfg = Fp8Config("mm", 32, 256, 4, 16, split, 2)  # block_k 256 > the scale block: fp8_mm takes 128
        got = fp8_linear(x, q, ws, config=cfg).float()
        want = fp8_linear_ref(x, q, ws, config=cfg).float()
        tol = 8e-3 * want.abs().amax(dim=1, keepdim=True)
        assert ((got - want).abs() <= tol).all(), (split, (got - want).abs().max())


def test_bad_block_scales_are_refused() -> None:
    q = torch.zeros(64, 256, dtype=FP8_DTYPE, device=DEV)
    x = torch.randn(4, 256, device=DEV)
    with pytest.raises(ValueError, match="do not cover"):
        fp8_linear_ref(x, q, torch.ones(64, 3, device=DEV))
    with pytest.raises(ValueError, match="w_scale"):
        fp8_linear_ref(x, q, torch.ones(64, 2, 1, device=DEV))
    with pytest.raises(ValueError, match="contiguous"):
        fp8_linear_ref(x, q, torch.ones(2, 64, device=DEV).T)
    with pytest.raises(ValueError, match="_scaled_mm"):
        fp8_linear(x, q, torch.ones(64, 2, device=DEV), config=Fp8Config("scaled_mm"))


# ---------------------------------------------------------------- checkpoints

CFG = None  # tiny-llama's config, read in _checkpoint (imports the runtime only when these run)
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
PROMPTS = [[1, 520, 4011, 88], [1, 9, 33, 7000, 12, 5, 48000]]
PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj"]
MERGED = {"self_attn.qkv_proj": PROJ[:3], "self_attn.o_proj": PROJ[3:4], "mlp.gate_up_proj": PROJ[4:6],
          "mlp.down_proj": PROJ[6:]}


def _checkpoint(path, fmt: str, bn: int, bk: int):
    """A tiny-llama checkpoint in a block-FP8 layout and the float weights (HF names) it stands
    for: fmt "fp8" (quant_method fp8, weight_scale_inv, as DeepSeek-V3 / Qwen3-FP8 publish),
    "ct-block" (compressed-tensors strategy block) or "ct-group" (strategy group: bn = 1)."""
    import json

    from safetensors.torch import save_file

    from treadle.runtime.model_config import DUMMY_CONFIGS

    from test_quantization_models import _float_weights  # tiny-llama's float weights, HF names

    c = DUMMY_CONFIGS["tiny-llama"]
    floats = _float_weights(seed=11)
    out = {}
    for key, w in floats.items():
        if not any(f".{p}." in key for p in PROJ):
            out[key] = w
            continue
        q, s = block_quantize(w, bn, bk)
        name = key.removesuffix(".weight")
        out[key] = q
        out[name + (".weight_scale_inv" if fmt == "fp8" else ".weight_scale")] = s
        if fmt == "fp8":
            out[name + ".input_scale"] = torch.tensor(0.02)  # activation_scheme static: read, unused
        floats[key] = q.float() * s.repeat_interleave(bn, 0)[:w.shape[0]].repeat_interleave(bk, 1)[:, :w.shape[1]]
    if fmt == "fp8":
        qcfg = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static", "weight_block_size": [bn, bk],
                "ignored_layers": ["lm_head"]}
    else:
        w = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
        w.update({"strategy": "block", "block_structure": [bn, bk]} if fmt == "ct-block"
                 else {"strategy": "group", "group_size": bk})
        qcfg = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": {
                    "num_bits": 8, "type": "float", "strategy": "group", "group_size": bk, "dynamic": True}}}}
    d = c.to_hf_dict()
    d["quantization_config"] = qcfg
    (path / "config.json").write_text(json.dumps(d))
    save_file({k: v.contiguous() for k, v in out.items()}, str(path / "model.safetensors"))
    return str(path), floats, c


@pytest.fixture(scope="module")
def reference_engine():
    from treadle.runtime import Engine

    with Engine(model_path="dummy:tiny-llama", max_total_tokens=1024, device="cpu") as e:
        yield e


@pytest.mark.parametrize("fmt,bn,bk", [("fp8", 128, 128), ("fp8", 16, 32), ("ct-block", 24, 32), ("ct-group", 1, 32)])
def test_block_fp8_checkpoint_loads_its_blocks_and_decodes_as_its_float_model(tmp_path, reference_engine, fmt, bn, bk):
    """Each merged layer holds the blocks' scales row by row (parts not starting on a block
    included: k_proj's 32 rows after q_proj's 64 at bn 24), its dequantized weight is exactly
    the checkpoint's blocks times their scales, and greedy decoding (CPU) is the float model's."""
    from treadle.runtime import Engine
    from treadle.runtime.quantization.base import dequantized_weights

    path, want, c = _checkpoint(tmp_path, fmt, bn, bk)
    with Engine(model_path=path, max_total_tokens=1024, device="cpu") as e:
        model = e.runner.model
        assert f"{bn}x{bk}-block" in e.get_server_info()["quantization"]
        qkv = model.layers[0].self_attn.qkv_proj
        assert qkv.weight.dtype == FP8_DTYPE and qkv.weight_scale.shape == (qkv.out_local, -(-c.hidden_size // bk))
        assert not hasattr(qkv, "weight_scale_inv") and not hasattr(qkv, "input_scale")
        got = dequantized_weights(model)
        for i in range(c.num_layers):
            for merged, parts in MERGED.items():
                expect = torch.cat([want[f"model.layers.{i}.{p}.weight"] for p in parts])
                assert torch.equal(got[f"layers.{i}.{merged}.weight"], expect), (i, merged)
        out = e.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    reference_engine.runner.model.load_weights(want.items())
    assert reference_engine.flush_cache()
    ref = reference_engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]


@pytest.mark.slow
def test_block_fp8_tensor_parallel_ranks_cut_their_scale_rows_and_blocks(tmp_path, reference_engine):
    """tp_size 2 (gloo): column-parallel ranks take their rows' scales (q's 32 rows a rank cut
    its 48-row blocks), row-parallel ranks their input blocks; the tokens are tp 1's."""
    from treadle.runtime import Engine

    path, want, _ = _checkpoint(tmp_path, "fp8", 48, 32)
    with Engine(model_path=path, max_total_tokens=1024, tp_size=2, device="cpu") as e:
        out = e.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    reference_engine.runner.model.load_weights(want.items())
    assert reference_engine.flush_cache()
    ref = reference_engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]


def test_block_fp8_configs_that_cannot_run_are_refused_by_name(tmp_path):
    import json

    from treadle.runtime import Engine
    from treadle.runtime.model_config import DUMMY_CONFIGS
    from treadle.runtime.model_source import resolve_model_source

    d = DUMMY_CONFIGS["tiny-llama"].to_hf_dict()
    for bad, message in (({"quant_method": "fp8", "weight_block_size": [128, 100]}, "power of two"),
                         ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size must be"),
                         ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt='e5m2'"),
                         ({"quant_method": "fp8", "activation_scheme": "per-head"}, "activation_scheme")):
        (tmp_path / "config.json").write_text(json.dumps({**d, "quantization_config": bad}))
        with pytest.raises(ValueError, match=message):
            resolve_model_source(str(tmp_path))
    path, _, _ = _checkpoint(tmp_path, "fp8", 128, 64)
    # o's 64 inputs, 16 a rank (the ranks find it as they load: a RuntimeError naming their ValueError)
    with pytest.raises((ValueError, RuntimeError), match="blocks of 64 inputs do not divide"):
        Engine(model_path=path, tp_size=4, device="cpu")
    import torch.distributed as dist

    assert not dist.is_initialized()  # the failed start left no group behind (a later TP Engine can start)


@pytest.mark.gpu
def test_gpu_block_fp8_checkpoint_decodes_through_cuda_graphs(tmp_path):
    """On CUDA: the prefill (a 300-token prompt: fp8_mm's 128 x 128 tiles), batched decode
    through the GEMV and fp8_mm inside CUDA graphs; the products are checked in the kernel tests
    above (W8A8 quantizes activations, so the tokens are not compared with a float model)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from treadle.runtime import Engine

    path, _, _ = _checkpoint(tmp_path, "fp8", 16, 32)
    prompts = PROMPTS + [[1] + [(7 * i) % 40000 + 5 for i in range(300)]]
    with Engine(model_path=path, max_total_tokens=4096) as e:
        assert e.runner.model.layers[0].mlp.down_proj.weight_scale.is_cuda
        one = [e.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 16}) for p in prompts]
        assert e.flush_cache()
        batch = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 16})
    for a, b in zip(one, batch):
        assert len(a["output_ids"]) == 16 and len(b["output_ids"]) == 16
