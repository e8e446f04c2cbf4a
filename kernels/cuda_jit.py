"""CUDA C++ kernels compiled at run time: NVRTC makes the machine code, the driver API loads and
launches it on PyTorch's current stream (inside CUDA-graph capture too), both through ctypes.

Triton cannot place a value in a given thread's register, and a tensor-core kernel fed straight
from memory needs exactly that (the int4 GEMV, kernels/int4_mma.py). Building such kernels at
install time would need nvcc and a C++ toolchain on every user's machine; NVRTC is a library that
PyTorch's CUDA wheels already bring (``nvidia-cuda-nvrtc``), so the source ships with treadle and
is compiled on first use for the GPU at hand (about a second a variant; the machine code is kept
in ``$TREADLE_CACHE_DIR``, default ``~/.cache/treadle/cuda``, keyed by source, options and NVRTC
version).

``available()`` says whether both libraries load (else the callers keep their Triton paths);
``Module(source, name, defines)`` compiles; ``module.function(name, signature)`` returns a
``Function`` whose ``launch(grid, block, *args)`` takes tensors, ints and None (a null pointer)
in the order of ``signature``: one letter an argument, ``p`` a pointer, ``i`` an int32.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import sys
import threading

import torch

__all__ = ["available", "unavailable_reason", "Module", "Function", "CudaJitError"]


class CudaJitError(RuntimeError):
    """NVRTC or the driver refused: the message says which call and why."""


# ------------------------------------------------------------------------- the libraries

def _nvrtc_candidates() -> list[str]:
    """Paths to try, the one of PyTorch's own CUDA major version first (its driver runs that
    NVRTC's output)."""
    found = []
    for base in sys.path:  # the pip packages (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib), torch/lib
        for pattern in ("nvidia/*/lib/libnvrtc.so*", "nvidia/cuda_nvrtc/lib/libnvrtc.so*", "torch/lib/libnvrtc*.so*"):
            found += sorted(p for p in glob.glob(os.path.join(base, pattern)) if "builtins" not in p)
    major = (torch.version.cuda or "").split(".")[0]
    found.sort(key=lambda p: not (major and (f".so.{major}" in p or f"/cu{major}/" in p)))  # stable
    first = [os.environ["TREADLE_NVRTC"]] if os.environ.get("TREADLE_NVRTC") else []
    return list(dict.fromkeys(first + found + ([f"libnvrtc.so.{major}"] if major else []) + ["libnvrtc.so"]))


@functools.lru_cache(maxsize=None)
def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise CudaJitError(f"the CUDA driver library (libcuda.so.1) does not load: {e}") from e
    nvrtc, errors = None, []
    for path in _nvrtc_candidates():
        try:
            nvrtc = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(str(e))
    if nvrtc is None:
        raise CudaJitError("NVRTC (libnvrtc.so) was not found; it comes with PyTorch's CUDA wheels as the "
                           "nvidia-cuda-nvrtc package, or set TREADLE_NVRTC to its path")
    _prototypes(cuda, nvrtc)
    _check_cu(cuda, cuda.cuInit(0), "cuInit")
    return cuda, nvrtc


def _prototypes(cuda: ctypes.CDLL, nvrtc: ctypes.CDLL) -> None:
    P, I, U, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
    PP = ctypes.POINTER(ctypes.c_void_p)
    for name, args in (
        ("nvrtcCreateProgram", [PP, ctypes.c_char_p, ctypes.c_char_p, I, P, P]),
        ("nvrtcCompileProgram", [P, I, ctypes.POINTER(ctypes.c_char_p)]),
        ("nvrtcGetProgramLogSize", [P, ctypes.POINTER(S)]),
        ("nvrtcGetProgramLog", [P, ctypes.c_char_p]),
        ("nvrtcGetCUBINSize", [P, ctypes.POINTER(S)]),
        ("nvrtcGetCUBIN", [P, ctypes.c_char_p]),
        ("nvrtcDestroyProgram", [PP]),
        ("nvrtcVersion", [ctypes.POINTER(I), ctypes.POINTER(I)]),
    ):
        fn = getattr(nvrtc, name)
        fn.argtypes, fn.restype = args, I
    nvrtc.nvrtcGetErrorString.argtypes, nvrtc.nvrtcGetErrorString.restype = [I], ctypes.c_char_p
    for name, args in (
        ("cuInit", [U]),
        ("cuCtxGetCurrent", [PP]),
        ("cuCtxSetCurrent", [P]),
        ("cuDeviceGet", [ctypes.POINTER(I), I]),
        ("cuDevicePrimaryCtxRetain", [PP, I]),
        ("cuModuleLoadData", [PP, P]),
        ("cuModuleGetFunction", [PP, P, ctypes.c_char_p]),
        ("cuLaunchKernel", [P, U, U, U, U, U, U, U, P, PP, PP]),
        ("cuLaunchKernelEx", [ctypes.POINTER(_LaunchConfig), P, PP, PP]),
        ("cuGetErrorString", [I, ctypes.POINTER(ctypes.c_char_p)]),
    ):
        fn = getattr(cuda, name)
        fn.argtypes, fn.restype = args, I


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def _check_cu(cuda: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        msg = ctypes.c_char_p()
        cuda.cuGetErrorString(code, ctypes.byref(msg))
        raise CudaJitError(f"{what} failed: CUDA error {code} ({(msg.value or b'?').decode()})")


def _check_nvrtc(nvrtc: ctypes.CDLL, code: int, what: str, log: str = "") -> None:
    if code != 0:
        raise CudaJitError(f"{what} failed: {nvrtc.nvrtcGetErrorString(code).decode()}" + (f"\n{log}" if log else ""))


def unavailable_reason() -> str | None:
    """None when kernels can be compiled and launched here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if os.environ.get("TREADLE_CUDA_JIT", "1") == "0":
        return "TREADLE_CUDA_JIT=0"
    try:
        _libs()
    except CudaJitError as e:
        return str(e)
    return None


def available() -> bool:
    return unavailable_reason() is None


# ------------------------------------------------------------------------- compiling

def _cache_dir() -> str:
    return os.environ.get("TREADLE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "treadle", "cuda")


def _compile(source: str, name: str, options: list[str]) -> bytes:
    _, nvrtc = _libs()
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    key = hashlib.sha256("\0".join([source, *options, f"{major.value}.{minor.value}"]).encode()).hexdigest()[:32]
    path = os.path.join(_cache_dir(), f"{name}-{key}.cubin")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        pass
    prog = ctypes.c_void_p()
    _check_nvrtc(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0,
                                                 None, None), "nvrtcCreateProgram")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        code = nvrtc.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        _check_nvrtc(nvrtc, code, f"compiling {name}", log.value.decode(errors="replace"))
        nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    data = cubin.raw
    try:  # a cache that cannot be written only costs the next process a compile
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass
    return data


def _device_context(index: int) -> ctypes.c_void_p:
    """Make `index`'s primary context (the one PyTorch uses) current on this thread; return it."""
    cuda, _ = _libs()
    torch.cuda.init()
    ctx = ctypes.c_void_p()
    dev = ctypes.c_int()
    _check_cu(cuda, cuda.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
    _check_cu(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
    cur = ctypes.c_void_p()
    _check_cu(cuda, cuda.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
    if cur.value != ctx.value:
        _check_cu(cuda, cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


class Module:
    """One translation unit compiled for each device it is used on (lazily, once per device)."""

    def __init__(self, source: str, name: str, defines: dict[str, int] | None = None):
        self.source = source
        self.name = name
        self.defines = dict(defines or {})
        self._loaded: dict[int, ctypes.c_void_p] = {}
        self._lock = threading.Lock()

    def _options(self, index: int) -> list[str]:
        major, minor = torch.cuda.get_device_capability(index)
        return ([f"--gpu-architecture=sm_{major}{minor}", "--std=c++17", "-default-device"]
                + [f"-D{k}={v}" for k, v in sorted(self.defines.items())])

    def handle(self, index: int) -> ctypes.c_void_p:
        with self._lock:
            mod = self._loaded.get(index)
            if mod is None:
                cubin = _compile(self.source, self.name, self._options(index))
                cuda, _ = _libs()
                _device_context(index)
                mod = ctypes.c_void_p()
                _check_cu(cuda, cuda.cuModuleLoadData(ctypes.byref(mod), cubin), f"loading {self.name}")
                self._loaded[index] = mod
            return mod

    def function(self, name: str, signature: str) -> "Function":
        return Function(self, name, signature)


class Function:
    def __init__(self, module: Module, name: str, signature: str):
        if set(signature) - {"p", "i"}:
            raise ValueError(f"signature letters are p (pointer) and i (int32), got {signature!r}")
        self.module = module
        self.name = name
        self.signature = signature
        self._handles: dict[int, tuple[ctypes.c_void_p, ctypes.c_void_p]] = {}

    def prepare(self, index: int) -> None:
        """Compile (or read from the cache) and load for device `index` now."""
        self._handle(index)

    def _handle(self, index: int) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        got = self._handles.get(index)
        if got is None:
            cuda, _ = _libs()
            mod = self.module.handle(index)
            fn = ctypes.c_void_p()
            _check_cu(cuda, cuda.cuModuleGetFunction(ctypes.byref(fn), mod, self.name.encode()),
                      f"finding {self.name} in {self.module.name}")
            got = self._handles[index] = (fn, _device_context(index))
        return got

    def launch(self, grid: tuple[int, ...], block: tuple[int, ...], *args, device: torch.device,
               shared_bytes: int = 0, pdl: bool = False) -> None:
        """Launch on `device`'s current PyTorch stream (captured when that stream is capturing);
        with `pdl`, as a programmatic dependent launch (the kernel must wait, kernels/pdl.py)."""
        if len(args) != len(self.signature):
            raise ValueError(f"{self.name} takes {len(self.signature)} arguments, got {len(args)}")
        cuda, _ = _libs()
        index = device.index if device.index is not None else torch.cuda.current_device()
        fn, ctx = self._handle(index)
        cur = ctypes.c_void_p()
        cuda.cuCtxGetCurrent(ctypes.byref(cur))
        if cur.value != ctx.value:
            _check_cu(cuda, cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        values = []
        for kind, a in zip(self.signature, args):
            if kind == "p":
                values.append(ctypes.c_void_p(0 if a is None else a.data_ptr()))
            else:
                values.append(ctypes.c_int(int(a)))
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        block3 = tuple(block) + (1,) * (3 - len(block))
        stream = torch.cuda.current_stream(index).cuda_stream
        if not pdl:
            _check_cu(cuda, cuda.cuLaunchKernel(fn, *grid3, *block3, shared_bytes, ctypes.c_void_p(stream), params,
                                                None), f"launching {self.name}")
            return
        attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1
        config = _LaunchConfig(*grid3, *block3, shared_bytes, ctypes.c_void_p(stream), ctypes.pointer(attr), 1)
        _check_cu(cuda, cuda.cuLaunchKernelEx(ctypes.byref(config), fn, params, None), f"launching {self.name}")
