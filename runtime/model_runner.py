"""ModelRunner: loads the model on its device, owns the KV memory (slot allocator, request-to-
token table, per-layer K/V pool) and runs one forward of a ForwardBatch to logits."""
from __future__ import annotations

import contextlib
import logging
import os
import time

import torch

from treadle.radix_cache import ReqToTokenPool, TokenSlotAllocator, TokenToKVPool
from treadle.runtime import gguf_packed
from treadle.runtime.attention_backend import create_attention_backend
from treadle.runtime.distributed import dummy_checkpoint, min_across_ranks
from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.forward_batch import ForwardBatch
from treadle.runtime.model_source import resolve_model_source
from treadle.runtime.models.parallel import SINGLE, ParallelContext
from treadle.runtime.models.registry import build_model
from treadle.runtime.quantization import resolve_quantization
from treadle.runtime.quantization.base import finish_model, prepare_model
from treadle.runtime.weights import LoadReport, init_dummy_weights, load_weights

log = logging.getLogger("treadle")

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """torch's default float dtype set to `dtype` inside: parameters made without a dtype get it."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device {name!r} is not a device torch knows (use auto, cpu, cuda or cuda:N)") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} requested but CUDA is not available; use --device cpu")
        if dev.index is None:  # an explicit index: set_device and mem_get_info need one
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


_KV_CACHE_DTYPES = {"fp8_e5m2": torch.float8_e5m2}


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV pool's storage dtype: `auto` = the model dtype; `fp8_e5m2` = torch.float8_e5m2
    (cast on store, upcast by the attention backends; compute stays in the model dtype)."""
    if name == "auto":
        return model_dtype
    if name not in _KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {name!r}; choose auto, {', '.join(_KV_CACHE_DTYPES)}")
    return _KV_CACHE_DTYPES[name]


class ModelRunner:
    def __init__(self, args: EngineArgs, ctx: ParallelContext = SINGLE) -> None:
        self.args = args
        self.ctx = ctx
        self.device = resolve_device(args.device)
        if self.device.type == "cuda" and ctx.size > 1:
            self.device = torch.device("cuda", ctx.rank % torch.cuda.device_count())
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if ctx.size > 1 and args.custom_all_reduce:
            from treadle.runtime.p2p_all_reduce import create_p2p_all_reduce

            self.ctx = ctx = ctx._replace(p2p=create_p2p_all_reduce(ctx, self.device, args.nnodes))
        if args.enable_expert_parallel:
            self.ctx = ctx = ctx._replace(expert_parallel=True)
        self.dtype = resolve_dtype(args.dtype, self.device)
        self.kv_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, self.dtype)
        self.source = resolve_model_source(args.model_path, tokenizer_path=args.tokenizer_path)
        self.config = cfg = self.source.config
        self.context_len = args.context_length or min(cfg.max_position_embeddings, 8192)
        if self.context_len > cfg.max_position_embeddings and os.environ.get("TREADLE_ALLOW_LONGER_CONTEXT") != "1":
            raise ValueError(f"context_length {self.context_len} is more than the model's max_position_embeddings "
                             f"{cfg.max_position_embeddings}: positions past it were never trained and their output "
                             "is unreliable. Lower it, or set TREADLE_ALLOW_LONGER_CONTEXT=1 to run it anyway")

        # the checkpoint's quantization, or --quantization's (quantized at load); None = float
        self.quantization = resolve_quantization(cfg, args.quantization, ctx.size)
        t0 = time.perf_counter()
        self.load_report = LoadReport()
        # a Q4/Q8 GGUF on the CPU runs from its packed blocks unless --gguf-dequantize (gguf_packed.py)
        packed_gguf = gguf_packed.wanted(args, self.source, self.device, self.dtype, ctx)
        weights = iter(()) if packed_gguf else load_weights(
            self.source, torch.float32 if self.dtype == torch.float32 else self.dtype, self.load_report)
        with torch.device(self.device), _default_dtype(self.dtype):
            torch.manual_seed(args.seed)
            # built in the serving dtype: Qwen3-30B-A3B built in fp32 first takes 122 GB, more than an 80 GB GPU
            model = build_model(cfg, ctx).to(self.dtype)
        if self.quantization is not None:  # after .to(): it would cast FP8 weights and fp32 scales
            prepare_model(model, self.quantization)
        if self.source.kind == "dummy" and ctx.size > 1:  # draw tp_size=1's weights, keep this rank's slice
            model.load_weights(dummy_checkpoint(cfg, self.dtype, self.device, args.seed))
        elif self.source.kind == "dummy":
            init_dummy_weights(model, seed=args.seed)
        elif packed_gguf:
            gguf_packed.load_packed(model, self.source.path, cfg)
        else:
            model.load_weights(weights)
        if self.quantization is not None:
            finish_model(model, self.quantization)
        model.init_rope(self.context_len)
        self.model = model.eval()
        self.load_s = time.perf_counter() - t0
        log.info("loaded %s (%s) in %.1fs (convert %.1fs, from cache: %s)%s", self.source.path,
                 self.source.kind, self.load_s, self.load_report.convert_s, self.load_report.from_cache,
                 f", weights {self.quantization.describe()}" if self.quantization else "")

        self.num_slots = min_across_ranks(self._pool_size(), ctx, self.device)  # ranks schedule alike
        self.kv_pool = TokenToKVPool(self.num_slots, cfg.num_layers, model.layers[0].self_attn.num_kv_heads,
                                     cfg.head_dim, self.kv_dtype, self.device)
        self.allocator = TokenSlotAllocator(self.num_slots)
        self.max_running = min(args.max_running_requests, self.num_slots)
        self.req_to_token_pool = ReqToTokenPool(self.max_running + 1, self.context_len + 8, self.device)
        self.attn_backend = create_attention_backend(args.attention_backend, self.device, self.kv_pool,
                                                     self.req_to_token_pool.req_to_token)
        self.graph_runner = None
        if args.cuda_graph and self.device.type == "cuda" and args.attention_backend != "torch":
            from treadle.runtime.cuda_graph_runner import CudaGraphRunner

            # extend graphs at tp 1 only: every rank would have to capture in step
            ext = args.cuda_graph_extend_max_tokens if args.tp_size == 1 else 0
            self.graph_runner = CudaGraphRunner(self, min(args.cuda_graph_max_bs, self.max_running), ext)

    def _pool_size(self) -> int:
        cfg = self.config
        kv_heads = self.model.layers[0].self_attn.num_kv_heads
        if self.args.max_total_tokens:
            return int(self.args.max_total_tokens)
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = int(total * self.args.mem_fraction_static) - used
            if budget <= 0:
                raise ValueError(
                    f"no GPU memory left for the KV pool: mem_fraction_static={self.args.mem_fraction_static} "
                    f"of {total >> 30} GiB is below the {used >> 30} GiB already used; raise it")
        else:
            budget = self.args.kv_cache_bytes
        return TokenToKVPool.slots_for_budget(budget, cfg.num_layers, kv_heads, cfg.head_dim, self.kv_dtype)

    def release_graphs(self) -> None:
        """Free the captured CUDA graphs: at shutdown, and before leaving a tensor-parallel
        group (NCCL must not tear down a communicator that live CUDA graphs still launch
        kernels on)."""
        if self.graph_runner is None:
            return
        self.graph_runner.close()
        self.graph_runner = None
        if self.device.type == "cuda":
            import gc

            gc.collect()
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Run the model over fb's tokens (writing their KV) and return float32 logits
        [len(fb.logits_indices), vocab] for the requested rows."""
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        fb.attn_backend = self.attn_backend
        self.attn_backend.plan(fb)
        hidden = self.model(fb.input_ids, fb.positions, fb)
        return self.model.compute_logits(hidden[fb.logits_indices])
