"""kernels/int4_mma.py: the mma layout (CPU), a torch model of what the CUDA kernel computes from it
(CPU: the fragment layouts as the PTX ISA gives them for mma.m16n8k16), and the kernels against
their reference on the GPU."""
from __future__ import annotations

import pytest
import torch

from treadle.kernels import cuda_jit
from treadle.kernels.int4_linear import dequantize_ref, pack_cols, pack_rows, unpack_rows
from treadle.kernels.int4_mma import (
    MmaConfig, available, candidate_mma_configs, deinterleave_gate_up, int4_mma_dequantize, int4_mma_linear,
    int4_mma_linear_ref, interleave_gate_up, _DEFAULT_CONFIGS, MMA_MAX_M, _tiles, mma_to_rows, pack_mma,
    pick_mma_config, supports, unpack_mma,
)
from treadle.kernels.activation import silu_and_mul, silu_and_mul_ref

gpu = pytest.mark.gpu  # skipped without CUDA (conftest)


def _weights(k: int, n: int, group: int, seed: int = 0, scale_dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
    z = torch.randint(0, 16, (k // group, n), generator=g, dtype=torch.int32)
    s = (torch.rand(k // group, n, generator=g) * 0.02 + 0.001).to(scale_dtype)
    return q, pack_cols(z), s


@pytest.mark.parametrize("k,n", [(64, 16), (128, 48), (256, 32), (640, 80)])
def test_pack_mma_round_trips(k: int, n: int) -> None:
    q = torch.randint(0, 16, (k, n), dtype=torch.int32, generator=torch.Generator().manual_seed(k + n))
    packed = pack_mma(q)
    assert packed.shape == (n // 16, k // 64, 32, 4) and packed.dtype == torch.int32
    assert torch.equal(unpack_mma(packed), q)
    assert torch.equal(unpack_rows(mma_to_rows(packed)), q)


def test_pack_mma_refuses_shapes_it_cannot_tile() -> None:
    with pytest.raises(ValueError, match="N % 16"):
        pack_mma(torch.zeros(64, 24, dtype=torch.int32))
    with pytest.raises(ValueError, match="K % 64"):
        pack_mma(torch.zeros(96, 16, dtype=torch.int32))


def _bf16_pair(word: int) -> tuple[float, float]:
    """The two bf16 halves of a 32-bit register (low, high) as floats."""
    lo = torch.tensor([word & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float().item()
    hi = torch.tensor([(word >> 16) & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float().item()
    return lo, hi


def _emulate_gemv(x: torch.Tensor, packed: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                  group: int) -> torch.Tensor:
    """What int4_mma_gemv computes (one 8-row tile of x), step by step: each lane's registers
    made as the kernel makes them, placed where mma.m16n8k16 reads them (PTX ISA: A row
    g / g + 8, columns 2t + (0, 1) / + 8; B rows 2t + (0, 1) / + 8, column g), the two mmas a
    step, and the scale once a group."""
    m, k = x.shape
    nt_count, kc = packed.shape[0], packed.shape[1]
    z = torch.stack([(zeros >> (4 * j)) & 0xF for j in range(8)], dim=-1).reshape(zeros.shape[0], -1)  # [groups, N]
    y = torch.zeros(nt_count * 16, 8)
    xb = torch.zeros(8, k)
    xb[:m] = x.float()
    for nt in range(nt_count):
        acc = torch.zeros(16, 8)
        d = torch.zeros(16, 8)
        for c in range(kc):
            grp = c * 64 // group
            for s in range(4):
                a = torch.zeros(16, 16)
                b = torch.zeros(16, 8)
                az = torch.zeros(16, 16)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    word = int(packed[nt, c, lane, s]) & 0xFFFFFFFF
                    regs = [((word >> (4 * i)) & 0x000F000F) | 0x43004300 for i in range(4)]
                    rows_cols = [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]
                    for reg, (r, col) in zip(regs, rows_cols):
                        a[r, col], a[r, col + 1] = _bf16_pair(reg)
                    for r in (g, g + 8):
                        zc = -(128.0 + float(z[grp, nt * 16 + r]))
                        for col in (2 * t, 2 * t + 8):
                            az[r, col] = az[r, col + 1] = zc
                    # B: lane's x words 2s, 2s + 1 = inputs 16t + 4s + (0, 1), (2, 3) of the chunk
                    base = c * 64 + 16 * t + 4 * s
                    b[2 * t, g], b[2 * t + 1, g] = xb[g, base], xb[g, base + 1]
                    b[2 * t + 8, g], b[2 * t + 9, g] = xb[g, base + 2], xb[g, base + 3]
                d += a @ b + az @ b
            if (c + 1) * 64 % group == 0 or c + 1 == kc:
                acc += scales[grp, nt * 16:nt * 16 + 16].float()[:, None] * d
                d.zero_()
        y[nt * 16:nt * 16 + 16] = acc
    return y[:, :m].T


@pytest.mark.parametrize("group", [64, 128])
def test_kernel_model_matches_the_dequantized_reference(group: int) -> None:
    k, n, m = 256, 32, 3
    q, zeros, scales = _weights(k, n, group, seed=group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    packed = pack_mma(q)
    emulated = _emulate_gemv(x, packed, zeros, scales, group)
    ref = x.float() @ dequantize_ref(mma_to_rows(packed), scales, zeros, group)
    torch.testing.assert_close(emulated, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(int4_mma_linear_ref(x, packed, scales, zeros, group).float(), ref,
                               atol=2e-2, rtol=1e-2)


def test_interleave_gate_up_puts_each_gate_beside_its_up_in_a_tile() -> None:
    n = 48  # a pair of 24 outputs: three 16-output tiles
    cols = torch.arange(n)[None, :].repeat(2, 1)
    inter = interleave_gate_up(cols)
    for tile in range(n // 16):
        for r in range(8):  # tile rows r and r + 8: gate output 8 tile + r and its up
            assert inter[0, 16 * tile + r] == 8 * tile + r
            assert inter[0, 16 * tile + 8 + r] == n // 2 + 8 * tile + r
    assert torch.equal(deinterleave_gate_up(inter), cols)
    assert torch.equal(deinterleave_gate_up(interleave_gate_up(cols.T, dim=0), dim=0), cols.T)
    with pytest.raises(ValueError, match="16 | N"):
        interleave_gate_up(torch.zeros(2, 40))


def _emulate_gated_epilogue(y_tiles: torch.Tensor, m: int) -> torch.Tensor:
    """int4_mma_gemv's GATED epilogue as written, from the plain sums y_tiles [N, 8] (tile row,
    x row): red[(mt * 4 + i) * 32 + l] holds the mma D register c_i of lane l (PTX ISA: c0, c1
    row l / 4, columns 2 (l % 4) + 0, 1; c2, c3 row l / 4 + 8, the same columns); the loop over
    idx < MT * 64 takes i = 0, 1 and its partner at src + 64."""
    n = y_tiles.shape[0]
    out = torch.zeros(m, n // 2)
    rnd = lambda v: torch.tensor(v).to(torch.bfloat16).float()  # noqa: E731 (to_act then act_to_float)
    for nt in range(n // 16):
        red = torch.zeros(4 * 32)
        for lane in range(32):
            for i in range(4):
                red[i * 32 + lane] = y_tiles[16 * nt + lane // 4 + (8 if i >= 2 else 0), 2 * (lane % 4) + (i & 1)]
        for idx in range(64):
            i, lane = (idx >> 5) & 1, idx & 31
            gate, up = rnd(red[i * 32 + lane].item()), rnd(red[i * 32 + lane + 64].item())
            b = 2 * (lane & 3) + i
            if b < m:
                out[b, nt * 8 + (lane >> 2)] = (gate / (1 + torch.exp(-gate)) * up).to(torch.bfloat16).float()
    return out


def test_gated_kernel_model_is_silu_and_mul_of_the_plain_product() -> None:
    k, n, m, group = 128, 32, 5, 64
    q, zeros, scales = _weights(k, n, group, seed=5)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    zi = pack_cols(interleave_gate_up(torch.stack([(zeros >> (4 * j)) & 0xF for j in range(8)], -1).reshape(-1, n)))
    packed, si = pack_mma(interleave_gate_up(q)), interleave_gate_up(scales)
    y_tiles = _emulate_gemv(x, packed, zi, si, group).T  # [N, m] interleaved
    y_tiles = torch.cat([y_tiles, torch.zeros(n, 8 - m)], dim=1)
    plain = (x.float() @ dequantize_ref(pack_rows(q), scales, zeros, group)).to(torch.bfloat16)  # [m, N] in order
    want = silu_and_mul_ref(plain).float()
    torch.testing.assert_close(_emulate_gated_epilogue(y_tiles, m), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(int4_mma_linear_ref(x, packed, si, zi, group, gated=True).float(), want,
                               atol=2e-2, rtol=2e-2)


def test_supports_and_cpu_refusal() -> None:
    assert supports(4096, 4096, 128, torch.bfloat16, torch.float16)
    assert not supports(4096, 4096, 32, torch.bfloat16, torch.float16)  # groups under 64 inputs
    assert not supports(4096, 4096, 128, torch.float32, torch.float16)  # fp32 activations
    assert not supports(4104, 4096, 128, torch.bfloat16, torch.float16)  # N not a multiple of 16
    assert candidate_mma_configs(1, 4096, 4096)[0] == pick_mma_config(1, 4096, 4096)
    # prepare() compiles what pick_mma_config can return, so nothing compiles inside a graph capture
    picked = {(_tiles(m), pick_mma_config(m, n, 4096)) for m in range(1, MMA_MAX_M + 1)
              for n in (16, 4096, 6144, 28672)}
    assert picked <= set(_DEFAULT_CONFIGS)
    assert pick_mma_config(MMA_MAX_M + 1, 4096, 4096).dequant
    q, zeros, scales = _weights(128, 32, 64)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA device"):
        int4_mma_linear(x, pack_mma(q), scales, zeros, 64)
    with pytest.raises(ValueError, match="K = 128 inputs but x has 64"):
        int4_mma_linear(x[:, :64], pack_mma(q), scales, zeros, 64)
    if not torch.cuda.is_available():
        assert not available() and cuda_jit.unavailable_reason() == "no CUDA device"


# ------------------------------------------------------------------------- GPU

def _gpu_case(k: int, n: int, group: int, m: int, dtype: torch.dtype, scale_dtype=torch.float16, seed: int = 0):
    q, zeros, scales = _weights(k, n, group, seed, scale_dtype)
    dev = torch.device("cuda")
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 7))).to(dtype).to(dev)
    return x, pack_mma(q).to(dev), scales.to(dev), zeros.to(dev)


@gpu
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 16, 17, 32, 33, 64, 65])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n,group", [(4096, 6144, 128), (1024, 272, 64), (512, 64, 512), (14336, 256, 128)])
def test_gpu_int4_mma_linear_matches_ref(m: int, dtype: torch.dtype, k: int, n: int, group: int) -> None:
    x, packed, scales, zeros = _gpu_case(k, n, group, m, dtype, seed=m + n)
    y = int4_mma_linear(x, packed, scales, zeros, group)
    ref = int4_mma_linear_ref(x.float(), packed, scales, zeros, group).float()
    assert y.dtype == dtype and y.shape == (m, n)
    scale = ref.abs().mean().item()
    torch.testing.assert_close(y.float(), ref, atol=2e-2 * scale, rtol=2e-2)


@gpu
@pytest.mark.parametrize("cfg,group", [(MmaConfig(4, 2), 128), (MmaConfig(8, 4), 128), (MmaConfig(16, 8), 64),
                                       (MmaConfig(8, 2, 1), 128), (MmaConfig(4, 4, 1), 128),
                                       (MmaConfig(16, 2, 1), 64), (MmaConfig(8, 2, 1), 2048),
                                       (MmaConfig(0, 0, dequant=True), 128)])
def test_gpu_int4_mma_configs_bias_strides_and_bf16_scales(cfg: MmaConfig, group: int) -> None:
    k, n = 2048, 512
    x, packed, scales, zeros = _gpu_case(k, n, group, 5, torch.bfloat16, torch.bfloat16, seed=3)
    wide = torch.zeros(5, k + 64, dtype=torch.bfloat16, device=x.device)
    wide[:, 64:] = x
    bias = torch.randn(n, device=x.device).to(torch.bfloat16)
    y = int4_mma_linear(wide[:, 64:], packed, scales, zeros, group, bias, config=cfg)
    ref = int4_mma_linear_ref(x.float(), packed, scales, zeros, group, bias.float()).float()
    scale = ref.abs().mean().item()
    torch.testing.assert_close(y.float(), ref, atol=2e-2 * scale, rtol=2e-2)


@gpu
@pytest.mark.parametrize("m", [40, 64])
def test_gpu_int4_mma_gemv_takes_up_to_64_rows_when_asked(m: int) -> None:
    k, n, group = 1024, 256, 128
    x, packed, scales, zeros = _gpu_case(k, n, group, m, torch.bfloat16, seed=m)
    y = int4_mma_linear(x, packed, scales, zeros, group, config=MmaConfig(8, 2))
    ref = int4_mma_linear_ref(x.float(), packed, scales, zeros, group).float()
    torch.testing.assert_close(y.float(), ref, atol=2e-2 * ref.abs().mean().item(), rtol=2e-2)
    with pytest.raises(ValueError, match="at most 64 rows"):
        int4_mma_linear(torch.cat([x, x]), packed, scales, zeros, group, config=MmaConfig(8, 2))
    with pytest.raises(ValueError, match="48 KB of shared memory"):
        int4_mma_linear(torch.cat([x, x])[:64], packed, scales, zeros, group, config=MmaConfig(16, 2))


@gpu
@pytest.mark.parametrize("k,n,group", [(1024, 96, 128), (1152, 32, 64), (4096, 48, 4096)])
def test_gpu_int4_mma_dequantize_is_the_reference_weight(k: int, n: int, group: int) -> None:
    _, packed, scales, zeros = _gpu_case(k, n, group, 1, torch.bfloat16)
    w = int4_mma_dequantize(packed, scales, zeros, group, torch.bfloat16)
    ref = dequantize_ref(mma_to_rows(packed), scales, zeros, group).T.to(torch.bfloat16)
    assert torch.equal(w, ref)


@gpu
def test_gpu_int4_mma_replays_in_a_cuda_graph() -> None:
    k, n, group = 4096, 1024, 128
    x, packed, scales, zeros = _gpu_case(k, n, group, 1, torch.bfloat16, seed=5)
    y = int4_mma_linear(x, packed, scales, zeros, group)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int4_mma_linear(x, packed, scales, zeros, group)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, int4_mma_linear(x, packed, scales, zeros, group))
    assert not torch.equal(out, y)


def test_a_kernel_build_failure_keeps_the_triton_layout(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A model still loads where the mma kernels do not build (say an NVRTC newer than the
    driver): the failure is logged and the layer keeps kernels/int4_linear.py's layout."""
    from treadle.runtime.quantization import int4 as runtime_int4

    def refuse(device, scale_dtype):
        raise cuda_jit.CudaJitError("compiling int4_mma failed: NVRTC_ERROR_INVALID_OPTION")

    monkeypatch.setattr(runtime_int4.int4_mma, "prepare", refuse)
    runtime_int4._mma_ready.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            assert runtime_int4._mma_ready(torch.device("cpu")) is False
        assert "Triton ones serve instead" in caplog.text and "NVRTC_ERROR_INVALID_OPTION" in caplog.text
    finally:
        runtime_int4._mma_ready.cache_clear()


def test_nvrtc_of_torchs_cuda_major_is_tried_first(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a machine has the NVRTC of two CUDA versions, the one PyTorch was built with comes
    first (its driver runs that NVRTC's output); TREADLE_NVRTC goes before both."""
    for sub, name in (("cu12", "libnvrtc.so.12"), ("cu13", "libnvrtc.so.13"), ("cu13", "libnvrtc-builtins.so.13.0")):
        (tmp_path / "nvidia" / sub / "lib").mkdir(parents=True, exist_ok=True)
        (tmp_path / "nvidia" / sub / "lib" / name).write_bytes(b"")
    monkeypatch.setattr("sys.path", [str(tmp_path)])
    monkeypatch.delenv("TREADLE_NVRTC", raising=False)
    for version, first in (("13.0", "cu13/lib/libnvrtc.so.13"), ("12.8", "cu12/lib/libnvrtc.so.12")):
        monkeypatch.setattr(torch.version, "cuda", version)
        found = cuda_jit._nvrtc_candidates()
        assert found[0].endswith(first) and not any("builtins" in p for p in found)
        assert found[-1] == "libnvrtc.so" and len(found) == len(set(found))
    monkeypatch.setenv("TREADLE_NVRTC", "/opt/nvrtc/libnvrtc.so.13")
    assert cuda_jit._nvrtc_candidates()[0] == "/opt/nvrtc/libnvrtc.so.13"


@gpu
@pytest.mark.parametrize("act_order", [False, True])
def test_gpu_quantized_layer_keeps_the_mma_layout_and_matches_its_weight(act_order: bool) -> None:
    """A merged int4 linear on CUDA stores the mma layout and its bf16 and fp32 branches (the
    GEMV, dequantize-then-cuBLAS past 64 rows, the exact fp32 weight for fp32 x) agree with
    x @ dequantize().T, act-order's permutation included."""
    from quantized_layers import quantized_linear  # tests/quantized_layers.py

    g = torch.Generator().manual_seed(11)
    layer = quantized_linear("gptq-act" if act_order else "awq", 256, [64, 64], 64, g, "cuda")
    assert layer.int4_layout == "mma" and layer.qweight.dim() == 4
    w = layer.quant.dequantize(layer)
    for m, dtype in ((1, torch.bfloat16), (40, torch.bfloat16), (100, torch.bfloat16), (3, torch.float32)):
        x = torch.randn(m, 256, generator=g).to("cuda")
        want = x @ w.T + layer.bias.float()
        got = layer(x.to(dtype)).float()
        tol = 1e-4 if dtype == torch.float32 else 3e-2 * want.abs().max().item()
        torch.testing.assert_close(got, want, atol=tol, rtol=0 if dtype == torch.float32 else 2e-2)


@gpu
@pytest.mark.parametrize("m", [1, 5, 9, 24, 40, 64, 100])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gated_gemv_is_silu_and_mul_of_the_plain_product(m: int, dtype: torch.dtype) -> None:
    """The fused SwiGLU epilogue (and, past 64 rows, dequantize-then-cuBLAS) against the plain GEMV
    of the same interleaved weight put back in order and kernels/activation.py's silu_and_mul."""
    k, n, group = 512, 96, 128
    q, zeros, scales = _weights(k, n, group, seed=m)
    zi = pack_cols(interleave_gate_up(torch.stack([(zeros >> (4 * j)) & 0xF for j in range(8)], -1).reshape(-1, n)))
    packed, si, zi = pack_mma(interleave_gate_up(q)).cuda(), interleave_gate_up(scales).cuda(), zi.cuda()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype).cuda()
    plain = deinterleave_gate_up(int4_mma_linear(x, packed, si, zi, group))
    want = silu_and_mul(plain)
    got = int4_mma_linear(x, packed, si, zi, group, gated=True)
    assert got.shape == (m, n // 2) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)
    if m <= MMA_MAX_M:  # the same rounding of gate and up, the same fp32 SiLU: nearly always the same bits
        assert (got != want).float().mean().item() < 0.02
    ref = int4_mma_linear_ref(x.cpu(), packed.cpu(), si.cpu(), zi.cpu(), group, gated=True)
    torch.testing.assert_close(got.float().cpu(), ref.float(), atol=3e-2, rtol=3e-2)
    with pytest.raises(ValueError, match="no bias"):
        int4_mma_linear(x, packed, si, zi, group, torch.zeros(n, dtype=dtype, device="cuda"), gated=True)


@gpu
@pytest.mark.parametrize("method", ["awq", "gptq-act"])
def test_gpu_quantized_gate_up_pair_is_interleaved_and_fuses_the_swiglu(method: str) -> None:
    """A SwiGLU gate/up pair (LlamaMLP's gate_up_proj) is stored interleaved; its silu_and_mul is
    one kernel and equals the SwiGLU of x @ dequantize().T, and its plain forward comes back in
    order; a pair without act_and_mul keeps the plain layout."""
    from quantized_layers import quantized_linear  # tests/quantized_layers.py

    from treadle.kernels import activation

    g = torch.Generator().manual_seed(12)
    layer = quantized_linear(method, 256, [128, 128], 64, g, "cuda", bias=False, act_and_mul="silu")
    assert layer.int4_layout == "mma" and layer.gate_up_interleaved
    plain_layer = quantized_linear("awq", 256, [128, 128], 64, g, "cuda", bias=False)
    assert not plain_layer.gate_up_interleaved
    w = layer.quant.dequantize(layer)  # [N, K], outputs in order
    for m in (1, 7, 33, 80):
        x = torch.randn(m, 256, generator=g).to("cuda")
        want_plain = x @ w.T
        torch.testing.assert_close(layer(x.bfloat16()).float(), want_plain, atol=3e-2 * want_plain.abs().max().item(),
                                   rtol=2e-2)
        want = activation.silu_and_mul_ref(want_plain)
        got = layer.silu_and_mul(x.bfloat16()).float()
        torch.testing.assert_close(got, want, atol=3e-2 * want.abs().max().item(), rtol=3e-2)
