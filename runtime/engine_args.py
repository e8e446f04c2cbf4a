"""EngineArgs: the one configuration dataclass. CLI flags are generated from its fields, so the
`Engine(**kwargs)` keywords and `treadle serve --flags` have the same names everywhere."""
from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal, get_args, get_origin


@dataclass(frozen=True)
class EngineArgs:
    # model
    model_path: str | None = field(default=None, metadata={"help": (
        "an HF model directory, a .gguf file or dummy:<name>; unset, or the Hugging Face id "
        "HuggingFaceTB/SmolLM2-135M-Instruct, serves the embedded SmolLM2-135M-Instruct GGUF "
        "(treadle downloads no model)")})
    tokenizer_path: str | None = None  # HF tokenizer dir or .gguf; None = the model's own
    dtype: str = "auto"  # auto = float32 on CPU, bfloat16 on CUDA
    gguf_dequantize: bool = field(default=False, metadata={"help": (
        "GGUF models on the CPU run from their quantized blocks (Q4_0, Q4_1, Q8_0: about a fifth of "
        "the float32 bytes, 3-4x the batch-1 decode speed; docs/quantization.md); --gguf-dequantize "
        "loads every weight dequantized to float32 instead (the reference path, as on the GPU)")})
    device: str = "auto"  # auto = cuda when available, else cpu
    seed: int = 0  # seeds dummy weights and the per-request seed generator
    context_length: int | None = None  # default: the model's max positions, capped at 8192
    # memory
    mem_fraction_static: float = 0.85  # CUDA: fraction of free memory for weights + KV pool
    kv_cache_bytes: int = 1 << 30  # CPU: KV pool byte budget
    max_total_tokens: int | None = None  # explicit KV pool size in tokens (tests use small pools)
    # KV pool storage; fp8_e5m2 is a direct cast with no scales (e5m2 has fp16's range, 2 mantissa bits)
    kv_cache_dtype: Literal["auto", "fp8_e5m2"] = field(default="auto", metadata={"help": (
        "KV cache storage dtype: auto = the model dtype; fp8_e5m2 stores K/V as float8_e5m2 "
        "(no scales), halving KV memory (about 2x the token slots vs bf16) and the bytes decode "
        "attention reads; compute stays in the model dtype, but outputs change slightly")})
    quantization: Literal["auto", "fp8", "awq", "gptq"] = field(default="auto", metadata={"help": (
        "weights: auto = as the checkpoint is (a quantized one's config.json names its format: "
        "compressed-tensors or fbgemm_fp8 FP8, awq, gptq); fp8 quantizes float weights at load to FP8 "
        "(a scale per row; the GPU also quantizes activations per token); awq / gptq round them to "
        "4 bits at load in that format's layout (groups of 128, or 64/32 where 128 does not divide)")})
    # scheduling
    max_running_requests: int = 256
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int = field(default=8192, metadata={"help": (
        "prefill long prompts in chunks of at most this many tokens; <= 0 disables chunking")})
    schedule_policy: Literal["lpm", "fcfs"] = "lpm"
    starvation_bound_s: float = 10.0  # a request waiting longer is admitted first
    disable_radix_cache: bool = False
    # running requests' next tokens ride along in prefill steps (so their streams do not stall
    # while prompts are prefilled); the chunk budget shrinks by the running count; tp_size 1
    enable_mixed_chunk: bool = False
    max_queued_requests: int = field(default=4096, metadata={"help": (
        "requests the server holds beyond the running batch's capacity: it takes at most "
        "--max-running-requests + --max-queued-requests requests at once (running, waiting, or "
        "compiling a grammar); past that a new request is a 503 with Retry-After, answered "
        "before its body is read, and a batch larger than the sum is a 400")})
    # constrained decoding
    disable_jump_forward: bool = False
    # jump only while at most this many requests run (-1 = auto: 4 on CPU, 1 on CUDA; n-gram
    # drafts follow it too, auto 4 on CPU and 64 on CUDA). A jump turns the step into an
    # extend that computes the forced tokens: nearly free while a step is bound by reading
    # the weights, a throughput cost once it is bound by per-token compute (a CPU at batch
    # 16: 0.74x of plain decoding). On the H200 (llama3-8b, bf16, extends in CUDA graphs)
    # jumps gained 0.91x sampled (random weights) and 0.99x greedy at batch 1, and lost at batch 4-64
    # (0.34-0.92x): a batch steps as often as its longest reply anyway
    # (benchmarks/bench_constrained_gpu.py)
    jump_forward_max_batch: int = -1
    grammar_compile_timeout_s: float = 60.0
    # compile processes: a slow grammar (seconds to a minute) holds one, and new grammars of
    # other requests compile on the others meanwhile
    grammar_compile_workers: int = 2
    grammar_memory_limit_bytes: int = 4 << 30
    # the compiled-grammar cache is kept under this many bytes (specs, token indexes, mask rows;
    # /get_server_info's "grammar_cache" says what it holds)
    grammar_cache_bytes: int = 1 << 30
    # a grammar whose token index would be larger than this estimate (constrained/index/grammar_size.py)
    # is a 400 naming it, before it is built
    grammar_max_size: int = 150_000
    # the token index of a grammar: "lazy" parses its regex into a byte automaton and computes
    # each state's token mask when a request first gets there (constrained/index/lazy_index.py; compiles
    # in milliseconds to a second); "outlines" builds outlines-core's whole index up front
    grammar_index: Literal["lazy", "outlines"] = "lazy"
    # token indexes that took a second or more to build are kept here for the next process
    # (constrained/compile/disk_cache.py); None = <cache root>/grammars, "" = off
    grammar_cache_dir: str | None = None
    json_whitespace_pattern: str | None = None  # None = compact JSON
    # strict = declared properties only (a model should not invent keys); spec = also the
    # extra members / trailing items JSON Schema admits, format as an annotation, 1.0 integers
    json_schema_mode: Literal["strict", "spec"] = "strict"
    # the default of each request's json_schema_lenient: drop the assertion keywords treadle cannot
    # enforce instead of refusing the schema, and list them in meta_info (docs/json-schema.md)
    json_schema_lenient: bool = False
    # how deep nesting recursion unrolls into a regex: EBNF rules (constrained/ebnf/ebnf.py), and
    # JSON schema $ref cycles under a json_whitespace_pattern (compact output calls them to any
    # depth, constrained/index/json_holes.py); deeper output is not generated, and the regex grows with it
    grammar_max_recursion_depth: int = 3
    # speculative decoding (runtime/ngram_draft.py): draft the tokens that
    # followed the latest earlier occurrence of the last speculative_ngram_size tokens
    speculative_algorithm: Literal["none", "ngram"] = field(default="none", metadata={"help": (
        "ngram: requests draft up to --speculative-num-draft-tokens tokens from their own "
        "prompt and output (prompt lookup) and verify them in one extend step; same outputs")})
    speculative_num_draft_tokens: int = 8
    speculative_ngram_size: int = 3
    # GPU features
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    cuda_graph: bool = True  # CUDA only; --no-cuda-graph keeps the plain launch path
    cuda_graph_max_bs: int = 256
    # short extends (jump-forward and n-gram verify steps, small prefills) replay CUDA graphs
    # too, captured on first use per (batch size, tokens per request <= 64), up to this many
    # tokens in all; 0 runs them eagerly (cuda_graph_runner.py)
    cuda_graph_extend_max_tokens: int = 256
    # overlap scheduling: the host processes step N's tokens (and fills step N+1's grammar
    # masks) while the GPU runs step N+1; auto = on with CUDA, off on CPU (nothing to overlap)
    overlap_schedule: Literal["auto", "on", "off"] = "auto"
    tp_size: int = 1
    # tensor-parallel process group (see runtime/distributed.py)
    nnodes: int = 1  # hosts sharing the tp_size ranks; each runs tp_size // nnodes of them
    node_rank: int = 0  # this host's index; node 0 runs the Engine, others `python -m treadle.runtime.tp_worker`
    dist_init_addr: str | None = None  # host:port rendezvous; None = a free port on 127.0.0.1 (one node)
    custom_all_reduce: bool = field(default=True, metadata={"help": (
        "tensor parallel on one host's GPUs: all-reduce decode-sized tensors (<= 4 MiB) through "
        "peer (NVLink) memory, 1.5-2.1x faster a call than NCCL on two H200s "
        "(benchmarks/results/all_reduce_cuda.json; 1.5-3x across runs); "
        "--no-custom-all-reduce keeps NCCL for every all-reduce")})
    enable_expert_parallel: bool = field(default=False, metadata={"help": (
        "mixture-of-experts models with tp_size > 1: place whole experts on ranks (tp_size must "
        "divide the number of experts) instead of splitting every expert's columns over the ranks")})
    dist_timeout_s: float = 60.0  # rendezvous and per-collective timeout: a dead or absent rank errors after it
    # server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    served_model_name: str | None = None
    reasoning_parser: Literal["none", "think"] = field(default="none", metadata={"help": (
        "think: return a reasoning model's <think>...</think> as reasoning_content, apart from "
        "the answer, on /v1/chat/completions (Qwen3, QwQ, DeepSeek-R1)")})
    incremental_streaming_output: bool = field(default=False, metadata={"help": (
        "/generate streams and Engine.generate(stream=True): each chunk's text and output_ids are "
        "only what is new; by default (SGLang's) they are everything so far (SGLang's --stream-output "
        "turns it on too). The OpenAI endpoints always send what is new")})
    # the names both logging (upper-cased) and uvicorn take (uvicorn's "trace" is no logging level)
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    shutdown_grace_s: float = 10.0
    log_requests: bool = field(default=False, metadata={"help": (
        "log a line per finished request (id, prompt / cached / generated tokens, finish reason, "
        "latency); never the prompt or output text")})
    # the server kills a scheduler that has sent nothing this long (it reports between steps
    # every 0.5 s: one step has hung, in a kernel, a collective or a stopped process) and
    # exits non-zero, for an orchestrator to restart it, as SGLang's; 0 turns it off
    watchdog_timeout: float = field(default=300.0, metadata={"help": (
        "seconds without a word from the scheduler (a hung step) after which the server kills "
        "it and exits non-zero; 0 = never")})
    allowed_origins: str | None = field(default=None, metadata={"help": (
        "CORS: the origins (comma-separated, * = any) whose browser pages may call the API; "
        "default: any when --api-key is set (pages then need the key), none without one (any "
        "page a user opens could otherwise drive and read an open server); '' = none")})
    allowed_hosts: str | None = field(default=None, metadata={"help": (
        "without --api-key: the Host names (comma-separated, * = any) the server answers to, "
        "besides IP addresses; default: localhost and --host. A request for another name is a "
        "403 (a DNS-rebinding web page reaches a local server through a name of its own)")})
    max_request_bytes: int = field(default=64 << 20, metadata={"help": (
        "the largest HTTP request body the server reads; a larger one is a 413 before it is "
        "read whole")})
    request_body_timeout_s: float = field(default=30.0, metadata={"help": (
        "seconds a client has to send a request's headers (from connecting, or from its previous "
        "response) and then its whole body (from the headers); one still coming after that (a slow "
        "or stalled sender) is a 408 and the connection closes")})
    stream_write_timeout_s: float = field(default=60.0, metadata={"help": (
        "seconds a response may wait for its client to read: a connection whose unsent output "
        "stays above the write buffer's high-water mark (64 KiB) this long (a client that stopped "
        "reading a stream) is closed, and its request aborted and its KV freed")})

    def __post_init__(self) -> None:
        # every Literal-typed field takes only its listed values (the CLI's choices too), and
        # every plain field a value of its type (an int where a float goes; never a bool for
        # a number), so a mistyped keyword fails here with its name, not deep in the runtime
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), hints[f.name])
            value = getattr(self, f.name)
            if isinstance(value, float) and value != value:
                # NaN passes every bound check below (each comparison is False) and then misleads
                # whatever compares with it: starvation_bound_s=nan left a request neither
                # starved nor not (order_waiting), never admitted; its generate hung for good
                raise ValueError(f"{f.name} must be a number, got nan")
            if get_origin(hints[f.name]) is Literal:
                choices = get_args(hints[f.name])
                if getattr(self, f.name) not in choices:
                    raise ValueError(f"{f.name} must be one of {', '.join(choices)}, got {getattr(self, f.name)!r}")
        if not -(1 << 63) <= self.seed < (1 << 64):  # torch's generators' range ("Overflow when unpacking long long")
            raise ValueError(f"seed must be in [-2**63, 2**64), got {self.seed}")
        for name in ("context_length", "max_total_tokens"):  # None: derived from the model / memory
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (or left unset), got {getattr(self, name)}")
        if self.kv_cache_bytes < 1 or self.cuda_graph_max_bs < 1 or self.max_queued_requests < 1:
            raise ValueError("kv_cache_bytes, cuda_graph_max_bs and max_queued_requests must be >= 1")
        if self.grammar_cache_bytes < 1 or self.grammar_max_size < 1:
            raise ValueError(f"grammar_cache_bytes and grammar_max_size must be >= 1, got "
                             f"{self.grammar_cache_bytes} and {self.grammar_max_size}")
        if not self.grammar_compile_timeout_s > 0:  # 0 made every grammar request fail, as if its own fault
            raise ValueError(f"grammar_compile_timeout_s must be > 0, got {self.grammar_compile_timeout_s}")
        if self.grammar_compile_workers < 1:
            raise ValueError(f"grammar_compile_workers must be >= 1, got {self.grammar_compile_workers}")
        if self.jump_forward_max_batch < -1:
            raise ValueError(f"jump_forward_max_batch must be >= 0 or -1 (auto), got {self.jump_forward_max_batch}")
        if not 0 <= self.grammar_max_recursion_depth <= 16:
            raise ValueError(f"grammar_max_recursion_depth must be in [0, 16], got {self.grammar_max_recursion_depth}")
        if self.cuda_graph_extend_max_tokens < 0:
            raise ValueError(f"cuda_graph_extend_max_tokens must be >= 0, got {self.cuda_graph_extend_max_tokens}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.max_prefill_tokens < 1:
            raise ValueError("max_prefill_tokens must be >= 1")
        if not 0 < self.mem_fraction_static < 1:
            raise ValueError("mem_fraction_static must be in (0, 1)")
        if self.tp_size < 1:
            raise ValueError("tp_size must be >= 1")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"need nnodes >= 1 and 0 <= node_rank < nnodes (got {self.nnodes}, {self.node_rank})")
        if self.tp_size % self.nnodes:
            raise ValueError(f"tp_size {self.tp_size} must be a multiple of nnodes {self.nnodes}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("nnodes > 1 needs --dist-init-addr host:port (node 0's address, reachable by every node)")
        if self.speculative_num_draft_tokens < 1 or self.speculative_ngram_size < 1:
            raise ValueError("speculative_num_draft_tokens and speculative_ngram_size must be >= 1")
        if self.watchdog_timeout < 0:
            raise ValueError(f"watchdog_timeout must be >= 0 (0 turns it off), got {self.watchdog_timeout}")
        if self.dist_timeout_s <= 0:
            raise ValueError("dist_timeout_s must be > 0")
        if not self.request_body_timeout_s > 0 or self.request_body_timeout_s == float("inf"):
            raise ValueError(f"request_body_timeout_s must be a finite number > 0, got {self.request_body_timeout_s}")
        if not self.stream_write_timeout_s > 0 or self.stream_write_timeout_s == float("inf"):
            raise ValueError(f"stream_write_timeout_s must be a finite number > 0, got {self.stream_write_timeout_s}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")

    def grammar_disk_cache_dir(self) -> str | None:
        if self.grammar_cache_dir is None:
            from treadle.runtime.gguf_loader import cache_root

            return os.path.join(cache_root(), "grammars")
        return self.grammar_cache_dir or None

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineArgs":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine argument(s): {', '.join(unknown)}")
        return cls(**kwargs)

    # ---- CLI -------------------------------------------------------------------------------

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """One `--flag-name` per field, typed from the annotation (help from `metadata["help"]`)."""
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            tp = hints[f.name]
            args = [a for a in get_args(tp) if a is not type(None)]
            doc = f.metadata.get("help")
            if tp is bool:
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=doc)
            elif get_origin(tp) is Literal:
                parser.add_argument(flag, choices=list(get_args(tp)), default=f.default, help=doc)
            else:
                base = args[0] if args else tp
                parser.add_argument(flag, type=base, default=f.default, help=doc)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})

    def replace(self, **changes: Any) -> "EngineArgs":
        return dataclasses.replace(self, **changes)


def _check_type(name: str, value: Any, tp: Any) -> None:
    """ValueError unless `value` is of the field's plain type (int, float, bool, str, or one
    of them or None); other annotations (Literal, ...) are checked elsewhere."""
    args = get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args and get_origin(tp) is not Literal else tp
    if base not in (int, float, bool, str) or value is None and optional:
        return
    ok = (isinstance(value, bool) if base is bool else
          isinstance(value, (int, float)) and not isinstance(value, bool) if base is float else
          isinstance(value, int) and not isinstance(value, bool) if base is int else isinstance(value, str))
    if not ok:
        want = {int: "an integer", float: "a number", bool: "a boolean", str: "a string"}[base]
        raise ValueError(f"{name} must be {want}{' or None' if optional else ''}, got {value!r}")


# ---- SGLang's server-argument names ----------------------------------------------------------
# One table for every entry point that takes SGLang's names: sgl.Runtime(...) and sgl.Engine(...)
# (keywords), and `python -m treadle.launch_server` (flags, `--random-seed` for random_seed).
# SGLang's arguments whose name is treadle's too (model_path, tp_size, mem_fraction_static,
# context_length, log_level, port, ...) need no entry.


@dataclass(frozen=True)
class SGLangArg:
    """One of SGLang's server arguments that treadle has under another name or form.
    `type` is the value's: bool is a flag with no value on the command line (SGLang's
    store_true), and must be a bool as a keyword. `translate(value)` gives treadle's arguments;
    `help` says what it is in treadle."""

    type: type
    translate: Callable[[Any], dict[str, Any]]
    help: str


SGLANG_ARGS: dict[str, SGLangArg] = {
    # SGLang's default None: a seed of its own choosing; treadle's default seed is 0
    "random_seed": SGLangArg(int, lambda v: {} if v is None else {"seed": v}, "treadle's --seed"),
    "disable_cuda_graph": SGLangArg(bool, lambda v: {"cuda_graph": False} if v else {}, "treadle's --no-cuda-graph"),
    "disable_overlap_schedule": SGLangArg(bool, lambda v: {"overlap_schedule": "off"} if v else {},
                                          "treadle's --overlap-schedule off"),
    # treadle loads every model it serves with its own model classes and tokenizer loader: no
    # code from the model's repository runs, with or without it
    "trust_remote_code": SGLangArg(bool, lambda v: {}, "no effect: treadle runs no code from a model's repository"),
    "enable_metrics": SGLangArg(bool, lambda v: {}, "no effect: the server always serves /metrics"),
    # SGLang's "output as a sequence of disjoint segments"
    "stream_output": SGLangArg(bool, lambda v: {"incremental_streaming_output": True} if v else {},
                               "treadle's --incremental-streaming-output"),
    "disable_custom_all_reduce": SGLangArg(bool, lambda v: {"custom_all_reduce": False} if v else {},
                                           "treadle's --no-custom-all-reduce"),
    # SGLang's older name of jump-forward decoding's switch
    "disable_regex_jump_forward": SGLangArg(bool, lambda v: {"disable_jump_forward": True} if v else {},
                                            "treadle's --disable-jump-forward"),
    "disable_outlines_disk_cache": SGLangArg(bool, lambda v: {"grammar_cache_dir": ""} if v else {},
                                             "treadle's --grammar-cache-dir '' (no disk cache of grammars)"),
    "constrained_json_whitespace_pattern": SGLangArg(
        str, lambda v: {} if v is None else {"json_whitespace_pattern": v}, "treadle's --json-whitespace-pattern"),
    # SGLang's default None: torch.distributed's own; treadle's default is 60 s
    "dist_timeout": SGLangArg(int, lambda v: {} if v is None else {"dist_timeout_s": float(v)},
                              "treadle's --dist-timeout-s"),
    # SGLang's older switch of the overlap scheduler (off by default there then)
    "enable_overlap_schedule": SGLangArg(bool, lambda v: {"overlap_schedule": "on"} if v else {},
                                         "treadle's --overlap-schedule on"),
    # SGLang's older switch of expert parallelism over the tensor-parallel ranks
    "enable_ep_moe": SGLangArg(bool, lambda v: {"enable_expert_parallel": True} if v else {},
                               "treadle's --enable-expert-parallel"),
}

# SGLang's server arguments with no treadle equivalent: why, for the error that names them
SGLANG_ONLY_ARGS: dict[str, str] = {
    "chat_template": "roles render with the served model's own chat template",
    "enable_torch_compile": "treadle has no torch.compile path (CUDA graphs are on by default on a GPU)",
    "grammar_backend": "treadle compiles every grammar with its own engine",
    "dp_size": "a server is one replica; run several behind treadle's router (docs/scaling.md)",
    "stream_interval": "treadle streams every token",
    "is_embedding": "treadle serves generative models only",
    "skip_tokenizer_init": "the server always loads the tokenizer (sgl.Engine takes skip_tokenizer_init=True)",
    "load_format": "treadle reads the checkpoint's own format (safetensors or GGUF; dummy:<name> for random weights)",
    "tokenizer_mode": "treadle loads the model's tokenizer its own way",
    "page_size": "the KV pool hands out single-token pages",
    "sampling_backend": "treadle samples with its own fused kernel",
    "schedule_conservativeness": "admission reserves each running request's decode budget (no knob)",
    "tool_call_parser": "the server reads tool calls in qwen25's format (also 'qwen': <tool_call> blocks) and "
                        "llama3's (a reply that is one JSON call) only",
}


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: any(v is x or (type(v) is type(x) and v == x) for x in values)


# SGLang's server arguments that SGLANG_ONLY_ARGS refuses, at the values that change nothing in
# treadle (SGLang's defaults, or a setting treadle has its own way): a keyword (Engine, Runtime,
# ServerArgs) at one of them is taken and dropped, with a debug line (an info line where treadle
# does it another way); at any other value it is refused with why
SGLANG_NOOP_VALUES: dict[str, Callable[[Any], bool]] = {
    "chat_template": _is(None),
    "enable_torch_compile": _is(False),
    "grammar_backend": _is(None, "xgrammar", "outlines", "llguidance"),
    "dp_size": _is(1),
    "stream_interval": _is(1),
    "is_embedding": _is(False),
    "skip_tokenizer_init": _is(False),
    "load_format": _is("auto"),
    "tokenizer_mode": _is("auto"),
    "page_size": _is(None, 1),
    "sampling_backend": _is(None, "flashinfer", "pytorch"),
    "schedule_conservativeness": _is(1.0, 1),
    "tool_call_parser": _is(None, "qwen25", "qwen", "llama3"),
}
# those of them whose accepted values other than the default ask for what treadle does its own way
SGLANG_OWN_WAY: dict[str, str] = {
    "grammar_backend": "treadle compiles grammars with its own engine (constrained/)",
    "sampling_backend": "treadle samples with its own fused kernel",
    # SGLang's server parses tool calls only with a parser named; treadle's always reads both formats
    "tool_call_parser": "the server reads tool calls in qwen25's (<tool_call> blocks) and llama3's (a reply that "
                        "is one JSON call) formats, whichever is named",
    "sampling_defaults": "treadle reads no sampling defaults from the model's generation_config.json: the sampling "
                         "parameters a request leaves out default to OpenAI's (temperature 1, top_p 1)",
}
# the flag types of SGLANG_ONLY_ARGS on the command line (launch_server, ServerArgs.add_cli_args):
# bool is SGLang's store_true flag, list a flag of one or more values; the others take one value
SGLANG_ONLY_TYPES: dict[str, type] = {
    "enable_torch_compile": bool, "is_embedding": bool, "skip_tokenizer_init": bool, "dp_size": int,
    "stream_interval": int, "page_size": int, "schedule_conservativeness": float}
# SGLang's default of each argument in SGLANG_ONLY_ARGS, where it is not None (an info line is
# logged for a value taken that is not SGLang's default)
SGLANG_DEFAULTS: dict[str, Any] = {
    "enable_torch_compile": False, "dp_size": 1, "stream_interval": 1, "is_embedding": False,
    "skip_tokenizer_init": False, "load_format": "auto", "tokenizer_mode": "auto", "schedule_conservativeness": 1.0}

_NO_LORA = "treadle serves no LoRA adapters"
_NO_MM = "treadle serves text-only models"
_NO_SPEC = "treadle's speculative decoding is n-gram drafts (--speculative-algorithm ngram), with no draft model"
_NO_EP = "treadle's expert parallelism is --enable-expert-parallel over the tensor-parallel ranks"
_NO_HICACHE = "the KV cache lives in the pool on the device only (no host or storage tier)"
_NO_PD = "treadle has no prefill/decode disaggregation"
_NO_DEBUG = "treadle has no such debugging hook"
_NO_METRICS = "/metrics serves treadle's own counters and histograms (docs/serving.md)"
_OWN_KERNELS = "treadle runs its own kernels (--attention-backend auto, torch or triton)"

# SGLang's server arguments (sglang/srt/server_args.py, ServerArgs) treadle has no equivalent of:
# name -> (the flag's type, the values taken, why another is refused). The values taken are
# SGLang's default (and what means the same here); every one of them changes nothing in treadle
_SGLANG_DEFAULT_ONLY: dict[str, tuple[type, tuple, str]] = {
    # model and tokenizer
    "tokenizer_worker_num": (int, (1,), "the server tokenizes in one process"),
    "model_loader_extra_config": (str, ("{}", "", None), "treadle's loader takes no extra configuration"),
    "enable_multimodal": (bool, (None, False), _NO_MM),
    "revision": (str, (None,), "treadle downloads no model: pass the local directory of the revision"),
    "download_dir": (str, (None,), "treadle downloads no model (model_path is a local directory or a .gguf file)"),
    "model_impl": (str, ("auto", "sglang"), "treadle runs its own model classes"),
    "hybrid_kvcache_ratio": (float, (None,), "the KV pool has one kind of slot"),
    "completion_template": (str, (None,), "/v1/completions sends the prompt as it is"),
    "file_storage_path": (str, ("sglang_storage",), "treadle stores no files"),
    "tool_server": (str, (None,), "treadle calls no tool servers"),
    "json_model_override_args": (str, ("{}", ""), "the model's config.json is read as it is"),
    "preferred_sampling_params": (str, (None,), "a request's sampling parameters default to the server's own"),
    # treadle reads no sampling defaults from generation_config.json: "model" is taken with an info line
    "sampling_defaults": (str, ("model", "openai"), "the sampling parameters a request leaves out default to "
                                                   "OpenAI's (temperature 1, top_p 1)"),
    "weight_version": (str, ("default",), "treadle does not version weights"),
    # HTTP server
    "nccl_port": (int, (None,), "the tensor-parallel rendezvous is --dist-init-addr"),
    # quantization and data type
    "quantization_param_path": (str, (None,), "FP8 KV scales are not read (--kv-cache-dtype fp8_e5m2 needs none)"),
    "enable_fp32_lm_head": (bool, (False,), "the LM head runs in the model dtype"),
    # memory and scheduling
    "cpu_offload_gb": (int, (0,), "weights stay on the device (no CPU offload)"),
    "offload_group_size": (int, (-1,), "weights stay on the device (no CPU offload)"),
    "offload_num_in_group": (int, (1,), "weights stay on the device (no CPU offload)"),
    "offload_prefetch_step": (int, (1,), "weights stay on the device (no CPU offload)"),
    "offload_mode": (str, ("cpu",), "weights stay on the device (no CPU offload)"),
    "enable_priority_scheduling": (bool, (False,), "requests are scheduled by --schedule-policy, with no priorities"),
    "schedule_low_priority_values_first": (bool, (False,), "requests have no priorities"),
    "priority_scheduling_preemption_threshold": (int, (10,), "requests have no priorities"),
    "swa_full_tokens_ratio": (float, (0.8,), "the KV pool has one kind of slot (no sliding-window pool)"),
    "disable_hybrid_swa_memory": (bool, (False,), "the KV pool has one kind of slot (no sliding-window pool)"),
    "radix_eviction_policy": (str, ("lru",), "the radix cache evicts least recently used prefixes"),
    "max_micro_batch_size": (int, (None,), "the scheduler runs one batch a step"),
    "max_mamba_cache_size": (int, (None,), "treadle serves no state-space models"),
    "mamba_ssm_dtype": (str, ("float32",), "treadle serves no state-space models"),
    "allow_auto_truncate": (bool, (False,), "a prompt longer than the context is refused (a 400), not truncated"),
    "num_reserved_decode_tokens": (int, (512,), _NO_PD),
    # runtime
    "pp_size": (int, (1,), "treadle has no pipeline parallelism (tensor parallelism: --tp-size)"),
    "base_gpu_id": (int, (0,), "the ranks use the visible GPUs from the first (set CUDA_VISIBLE_DEVICES)"),
    "gpu_id_step": (int, (1,), "the ranks use the visible GPUs in order (set CUDA_VISIBLE_DEVICES)"),
    "sleep_on_idle": (bool, (False,), "the scheduler waits on its queue when idle"),
    "constrained_json_disable_any_whitespace": (bool, (False,), "use --json-whitespace-pattern ''"),
    "numa_node": (list, (None,), "treadle does not bind processes to NUMA nodes"),
    # logging and metrics (those that only change what is logged take any value: _SGLANG_ANY_VALUE)
    "crash_dump_folder": (str, (None,), "treadle writes no crash dumps"),
    "enable_metrics_for_all_schedulers": (bool, (False,), _NO_METRICS),
    "tokenizer_metrics_custom_labels_header": (str, ("x-custom-labels",), _NO_METRICS),
    "tokenizer_metrics_allowed_custom_labels": (list, (None,), _NO_METRICS),
    "bucket_time_to_first_token": (list, (None,), _NO_METRICS),
    "bucket_inter_token_latency": (list, (None,), _NO_METRICS),
    "bucket_e2e_request_latency": (list, (None,), _NO_METRICS),
    "collect_tokens_histogram": (bool, (False,), _NO_METRICS),
    "prompt_tokens_buckets": (list, (None,), _NO_METRICS),
    "generation_tokens_buckets": (list, (None,), _NO_METRICS),
    "kv_events_config": (str, (None,), "treadle publishes no KV cache events"),
    "enable_trace": (bool, (False,), "treadle exports no OpenTelemetry traces"),
    "oltp_traces_endpoint": (str, ("localhost:4317",), "treadle exports no OpenTelemetry traces"),
    # data parallelism
    "load_balance_method": (str, ("round_robin",), "a server is one replica (treadle's router balances replicas)"),
    "prefill_round_robin_balance": (bool, (False,), "a server is one replica"),
    # LoRA
    "enable_lora": (bool, (None, False), _NO_LORA),
    "max_lora_rank": (int, (None,), _NO_LORA),
    "lora_target_modules": (list, (None,), _NO_LORA),
    "lora_paths": (list, (None,), _NO_LORA),
    "max_loaded_loras": (int, (None,), _NO_LORA),
    "max_loras_per_batch": (int, (8,), _NO_LORA),
    "lora_backend": (str, ("triton",), _NO_LORA),
    # kernel backends
    "decode_attention_backend": (str, (None,), _OWN_KERNELS),
    "prefill_attention_backend": (str, (None,), _OWN_KERNELS),
    "mm_attention_backend": (str, (None,), _NO_MM),
    "moe_runner_backend": (str, ("auto",), _OWN_KERNELS),
    "moe_a2a_backend": (str, ("none",), _NO_EP),
    "deepep_mode": (str, ("auto",), _NO_EP),
    "enable_flashinfer_allreduce_fusion": (bool, (False,), _OWN_KERNELS),
    # speculative decoding
    "speculative_draft_model_path": (str, (None,), _NO_SPEC),
    "speculative_draft_model_revision": (str, (None,), _NO_SPEC),
    "speculative_num_steps": (int, (None,), _NO_SPEC),
    "speculative_eagle_topk": (int, (None,), _NO_SPEC),
    "speculative_accept_threshold_single": (float, (1.0,), _NO_SPEC),
    "speculative_accept_threshold_acc": (float, (1.0,), _NO_SPEC),
    "speculative_token_map": (str, (None,), _NO_SPEC),
    # expert parallelism
    "ep_size": (int, (1,), _NO_EP),
    "ep_num_redundant_experts": (int, (0,), _NO_EP),
    "ep_dispatch_algorithm": (str, (None,), _NO_EP),
    "init_expert_location": (str, ("trivial",), _NO_EP),
    "enable_eplb": (bool, (False,), _NO_EP),
    "eplb_algorithm": (str, ("auto",), _NO_EP),
    "eplb_rebalance_num_iterations": (int, (1000,), _NO_EP),
    "eplb_rebalance_layers_per_chunk": (int, (None,), _NO_EP),
    "expert_distribution_recorder_mode": (str, (None,), _NO_EP),
    "expert_distribution_recorder_buffer_size": (int, (None,), _NO_EP),
    "enable_expert_distribution_metrics": (bool, (False,), _NO_EP),
    "deepep_config": (str, (None,), _NO_EP),
    "moe_dense_tp_size": (int, (None,), _NO_EP),
    "enable_deepep_moe": (bool, (False,), _NO_EP),
    # hierarchical cache
    "enable_hierarchical_cache": (bool, (False,), _NO_HICACHE),
    "hicache_ratio": (float, (2.0,), _NO_HICACHE),
    "hicache_size": (int, (0,), _NO_HICACHE),
    "hicache_write_policy": (str, ("write_through", "write_through_selective"), _NO_HICACHE),
    "hicache_io_backend": (str, ("kernel",), _NO_HICACHE),
    "hicache_mem_layout": (str, ("layer_first",), _NO_HICACHE),
    "hicache_storage_backend": (str, (None,), _NO_HICACHE),
    "hicache_storage_prefetch_policy": (str, ("best_effort",), _NO_HICACHE),
    "enable_lmcache": (bool, (False,), _NO_HICACHE),
    # double sparsity
    "enable_double_sparsity": (bool, (False,), "attention reads every cached token"),
    "ds_channel_config_path": (str, (None,), "attention reads every cached token"),
    "ds_heavy_channel_num": (int, (32,), "attention reads every cached token"),
    "ds_heavy_token_num": (int, (256,), "attention reads every cached token"),
    "ds_heavy_channel_type": (str, ("qk",), "attention reads every cached token"),
    "ds_sparse_decode_threshold": (int, (4096,), "attention reads every cached token"),
    # optimization and debugging
    "cuda_graph_bs": (list, (None,), "CUDA graphs are captured for batch sizes up to --cuda-graph-max-bs"),
    "disable_cuda_graph_padding": (bool, (False,), "a batch between captured sizes replays the next larger graph"),
    "enable_profile_cuda_graph": (bool, (False,), _NO_DEBUG),
    "enable_cudagraph_gc": (bool, (False,), "garbage collection stays frozen while graphs are captured"),
    "enable_nccl_nvls": (bool, (False,), "treadle leaves NCCL's NVLink multicast off"),
    "enable_symm_mem": (bool, (False,), "the custom all-reduce (--custom-all-reduce) uses peer memory its own way"),
    "enable_mscclpp": (bool, (False,), "all-reduces are NCCL's or treadle's custom one"),
    "enable_tokenizer_batch_encode": (bool, (False,), "a batch's prompts are tokenized one by one"),
    "enable_dp_attention": (bool, (False,), "a server is one replica (no data-parallel attention)"),
    "enable_dp_lm_head": (bool, (False,), "a server is one replica (no data-parallel attention)"),
    "enable_two_batch_overlap": (bool, (False,), "treadle overlaps the host with the device (--overlap-schedule)"),
    "tbo_token_distribution_threshold": (float, (0.48,), "treadle has no two-batch overlap"),
    "torch_compile_max_bs": (int, (32,), "treadle has no torch.compile path"),
    "torchao_config": (str, ("",), "weights are quantized by --quantization"),
    "enable_nan_detection": (bool, (False,), _NO_DEBUG),
    "enable_p2p_check": (bool, (False,), "peer access is checked when the custom all-reduce starts"),
    "triton_attention_reduce_in_fp32": (bool, (False,), _OWN_KERNELS),
    "triton_attention_num_kv_splits": (int, (8,), _OWN_KERNELS),
    "triton_attention_split_tile_size": (int, (None,), _OWN_KERNELS),
    "num_continuous_decode_steps": (int, (1,), "the scheduler admits requests between every decode step"),
    "delete_ckpt_after_loading": (bool, (False,), "treadle never deletes a checkpoint"),
    "enable_memory_saver": (bool, (False,), "treadle does not release its memory while idle"),
    "enable_custom_logit_processor": (bool, (False,), "treadle takes no custom logit processors"),
    "enable_return_hidden_states": (bool, (False,), "treadle does not return hidden states"),
    "flashinfer_mla_disable_ragged": (bool, (False,), _OWN_KERNELS),
    "disable_shared_experts_fusion": (bool, (False,), _OWN_KERNELS),
    "disable_chunked_prefix_cache": (bool, (False,), _OWN_KERNELS),
    "disable_fast_image_processor": (bool, (False,), _NO_MM),
    "scheduler_recv_interval": (int, (1,), "the scheduler reads new requests between every step"),
    "enable_deterministic_inference": (bool, (False,), "batched outputs may differ in the last bits from "
                                                       "unbatched ones (greedy outputs match in practice)"),
    "debug_tensor_dump_output_folder": (str, (None,), _NO_DEBUG),
    "debug_tensor_dump_input_file": (str, (None,), _NO_DEBUG),
    "debug_tensor_dump_inject": (bool, (False,), _NO_DEBUG),
    "debug_tensor_dump_prefill_only": (bool, (False,), _NO_DEBUG),
    # prefill/decode disaggregation
    "disaggregation_mode": (str, ("null",), _NO_PD),
    "disaggregation_transfer_backend": (str, ("mooncake",), _NO_PD),
    "disaggregation_bootstrap_port": (int, (8998,), _NO_PD),
    "disaggregation_decode_tp": (int, (None,), _NO_PD),
    "disaggregation_decode_dp": (int, (None,), _NO_PD),
    "disaggregation_prefill_pp": (int, (1,), _NO_PD),
    "disaggregation_ib_device": (str, (None,), _NO_PD),
    "disaggregation_decode_polling_interval": (int, (1,), _NO_PD),
    # weights
    "custom_weight_loader": (list, (None,), "weights load with treadle's own loader"),
    "weight_loader_disable_mmap": (bool, (False,), "weights load with treadle's own loader"),
    # newer and older versions' names
    "admin_api_key": (str, (None,), "treadle has one key, --api-key"),
    "enable_dynamic_batch_tokenizer": (bool, (False,), "a batch's prompts are tokenized one by one"),
    "dynamic_batch_tokenizer_batch_size": (int, (32,), "a batch's prompts are tokenized one by one"),
    "dynamic_batch_tokenizer_batch_timeout": (float, (0.002,), "a batch's prompts are tokenized one by one"),
    "modelopt_quant": (str, (None,), "weights are quantized by --quantization"),
    "enable_single_batch_overlap": (bool, (False,), "treadle overlaps the host with the device (--overlap-schedule)"),
    "enable_torch_symm_mem": (bool, (False,), "all-reduces are NCCL's or treadle's custom one"),
    "disable_disk_cache": (bool, (False,), "use --grammar-cache-dir '' (no disk cache of grammars)"),
    "disable_penalizer": (bool, (False,), "penalties are applied whenever a request asks for them"),
    "disable_nan_detection": (bool, (False,), _NO_DEBUG),
    "disable_mla": (bool, (False,), _OWN_KERNELS),
    "enable_flashinfer_mla": (bool, (False,), _OWN_KERNELS),
    "enable_flashmla": (bool, (False,), _OWN_KERNELS),
    "max_torch_compile_bs": (int, (32,), "treadle has no torch.compile path"),
    "enable_pdmux": (bool, (False,), "treadle has no prefill/decode multiplexing"),
    "sm_group_num": (int, (3,), "treadle has no prefill/decode multiplexing"),
}
# SGLang's arguments that only change what is logged, or the warm-up: taken at any value of their
# type, as treadle's behaviour is a reading of every value (docs/porting-from-sglang.md says which)
_SGLANG_ANY_VALUE: dict[str, tuple[type, Any, str]] = {
    "show_time_cost": (bool, False, "treadle logs no per-stage timings"),
    "decode_log_interval": (int, 40, "treadle logs no per-step decode lines (/get_server_info and /metrics "
                                     "have the counters)"),
    "log_requests_level": (int, 2, "--log-requests logs one line per finished request, never its text"),
    "log_level_http": (str, None, "the HTTP access log follows --log-level"),
    "gc_warning_threshold_secs": (float, 0.0, "treadle logs no garbage-collection warnings"),
    "enable_request_time_stats_logging": (bool, False, "--log-requests' line has each request's latency"),
    "skip_server_warmup": (bool, False, "the server runs no warm-up request: it is ready once the model is loaded"),
    "warmups": (str, None, "the server runs no warm-up request"),
    "enable_cache_report": (bool, False, "the OpenAI endpoints always report "
                                         "usage.prompt_tokens_details.cached_tokens"),
}


def _of_type(tp: type, optional: bool) -> Callable[[Any], bool]:
    def ok(v: Any) -> bool:
        if v is None:
            return optional
        if tp is bool:
            return isinstance(v, bool)
        if tp is float:
            return isinstance(v, (int, float)) and not isinstance(v, bool)
        return isinstance(v, tp) and not isinstance(v, bool)
    return ok


for _name, (_tp, _taken, _why) in _SGLANG_DEFAULT_ONLY.items():
    SGLANG_ONLY_ARGS[_name] = _why
    SGLANG_NOOP_VALUES[_name] = _is(*_taken, *(int(x) for x in _taken if type(x) is float and x == int(x)))
    SGLANG_ONLY_TYPES[_name] = _tp
    if _taken[0] is not None:
        SGLANG_DEFAULTS[_name] = _taken[0]
for _name, (_tp, _default, _why) in _SGLANG_ANY_VALUE.items():
    SGLANG_ONLY_ARGS[_name] = f"takes {_tp.__name__} values: {_why}"
    SGLANG_NOOP_VALUES[_name] = _of_type(_tp, _default is None)
    SGLANG_ONLY_TYPES[_name] = _tp
    SGLANG_OWN_WAY[_name] = _why
    if _default is not None:
        SGLANG_DEFAULTS[_name] = _default

# SGLang's arguments that are treadle's too, whose SGLang default None is treadle's own default
SGLANG_NONE_IS_DEFAULT = ("quantization", "speculative_algorithm", "reasoning_parser", "mem_fraction_static",
                          "max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs", "attention_backend",
                          "device", "speculative_num_draft_tokens", "max_queued_requests")


# SGLang's reasoning parsers whose block is <think>...</think>, opened by the reply (or by the
# prompt's template): treadle's reasoning_parser "think" reads them. (SGLang's deepseek-r1 and
# qwen3-thinking read a reply as inside the block from its start, even untagged: not these.)
SGLANG_THINK_PARSERS = ("qwen3", "deepseek-v3", "glm45", "dots", "nanbeige", "interns1", "mimo")


def _take_sglang_defaults(kwargs: dict[str, Any], caller: str | None) -> dict[str, Any]:
    """`kwargs` less SGLang's arguments at values that change nothing in treadle (logged), and
    SGLang's reasoning_parser names of a <think> block as treadle's "think"."""
    import logging

    log = logging.getLogger("treadle")
    out = {}
    for name, value in kwargs.items():
        if caller is not None and name in SGLANG_NONE_IS_DEFAULT and value is None:
            continue
        if name == "reasoning_parser" and value in SGLANG_THINK_PARSERS:
            log.info("%s(reasoning_parser=%r): treadle's reasoning_parser 'think' (its <think> blocks)",
                     caller or "", value)
            out[name] = "think"
            continue
        ok = SGLANG_NOOP_VALUES.get(name)
        if ok is None or not ok(value):
            out[name] = value
            continue
        why = SGLANG_OWN_WAY.get(name)
        if why is not None and value is not None and not _is(SGLANG_DEFAULTS.get(name))(value):
            log.info("%s(%s=%r): %s; taken and ignored", caller or "", name, value, why)
        else:
            log.debug("%s(%s=%r): SGLang's default, taken", caller or "", name, value)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def sglang_flag(name: str) -> str:
    """The command-line flag of an argument name: random_seed -> --random-seed."""
    return "--" + name.replace("_", "-")


def translate_sglang_args(kwargs: dict[str, Any], caller: str | None) -> dict[str, Any]:
    """`kwargs` with SGLang's names of SGLANG_ARGS translated to treadle's (random_seed -> seed,
    disable_cuda_graph=True -> cuda_graph=False, disable_overlap_schedule=True ->
    overlap_schedule="off"; trust_remote_code and enable_metrics change nothing); other names are
    left as they are, for EngineArgs to check. SGLang's arguments at values that change nothing
    in treadle (SGLANG_NOOP_VALUES: dp_size=1, grammar_backend="xgrammar", ...; quantization=None
    and the like as keywords) are dropped. A ValueError for any other name of SGLANG_ONLY_ARGS (each
    with why), a value of the wrong type, or both names of one argument; its message names the
    keywords of `caller` ("Runtime", "Engine": `Runtime(random_seed=..., seed=...)`), or, with
    `caller` None, the command-line flags (`--random-seed and --seed`)."""
    kwargs = _take_sglang_defaults(kwargs, caller)
    only = sorted(k for k in kwargs if k in SGLANG_ONLY_ARGS)
    if only:
        raise ValueError(("SGLang's " if caller is None else f"{caller}(): SGLang's ")
                         + "; ".join(f"{k if caller else sglang_flag(k)}: {SGLANG_ONLY_ARGS[k]}" for k in only)
                         + " (not supported: " + ", ".join(f"{k}={_short(kwargs[k])}" for k in only)
                         + "; treadle's arguments: `treadle serve --help`)")
    out = {k: v for k, v in kwargs.items() if k not in SGLANG_ARGS}
    for name, value in kwargs.items():
        arg = SGLANG_ARGS.get(name)
        if arg is None:
            continue
        if arg.type is bool and not isinstance(value, bool):
            raise ValueError(f"{caller}({name}={value!r}): a bool, as SGLang's flag")
        for key, new in arg.translate(value).items():
            if key in kwargs:
                both = f"{caller}({name}=..., {key}=...)" if caller else f"{sglang_flag(name)} and {sglang_flag(key)}"
                raise ValueError(f"{both}: both name treadle's {key!r}; give one")
            out[key] = new
    return out

# SGLang's short spellings of its flags (one option of two strings there): the flag -> the long one
SGLANG_FLAG_ALIASES: dict[str, str] = {
    "--tp": "--tp-size", "--model": "--model-path", "--dp": "--dp-size", "--tensor-parallel-size": "--tp-size",
    "--data-parallel-size": "--dp-size", "--pipeline-parallel-size": "--pp-size", "--expert-parallel-size": "--ep-size",
    "--ep": "--ep-size"}
