"""Throughput of arrayquant beside memory copy, the obvious NumPy forms and the peers users would pick.

``arrayquant bench`` (or ``python ci/bench.py``) prints one table: GB/s of f32 input (input bytes
over seconds, 1 GB = 1e9 bytes), median and best of ``--repeat`` timed runs after one warm-up, for
arrayquant's quantize and dequantize of int8 per tensor (``q8s``), int8 per block of 32 with F16
scales (``q8s:block32:f16``, native and packed), int4 per block of 32 (``q4s:block32:f16``), NVFP4,
MXFP4 and MXFP8. Beside them, in the same run:

- the copy of the same bytes on the same device (``numpy.copyto``, or the device's own copy): the
  memory-bandwidth limit;
- the obvious NumPy forms (int8 per tensor and per block; per-block minifloats through ml_dtypes);
- the peers that are installed (``--peers``): gguf's Q8_0/Q4_0/MXFP4 quantizers, torch eager and
  ``torch.compile`` forms of int8 per tensor, int8 block 32, fp4 (E2M1) and fp8 (E4M3) block 32,
  bitsandbytes' blockwise 8-bit and fp4/nf4, and arrayquant's own kernels under ``jax.jit`` (what XLA
  fusion gives). A peer that is missing or fails is reported as unavailable, with the reason.

Everything runs on one core: ``OMP_NUM_THREADS=1`` (and the BLAS variables), ``torch.set_num_threads(1)``
and XLA's Eigen thread pool off. Each arrayquant case is compared with copy, with the obvious NumPy
form, and with the fastest peer that does the same job (``PEER_MAP`` says which). The targets are
informational: the exit status is 0 whether they pass or not, and 1 only when an output differs
from its reference.

This is a host-side module: it imports NumPy; ml_dtypes, gguf, torch, bitsandbytes, jax and cupy are
imported inside the functions that use them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, fused
from .backends import shim
from .convert import asarray
from .dequantize import dequantize
from .quantize import quantize
from .scheme import QuantScheme
from .tensor import QuantizedTensor

__all__ = [
    "PEERS",
    "PEER_MAP",
    "Bench",
    "FloatForm",
    "Pair",
    "Result",
    "add_arguments",
    "digest",
    "extra_mib",
    "f16_round_up",
    "machine",
    "main",
    "make_sync",
    "markdown",
    "np_dequantize_block",
    "np_dequantize_float",
    "np_dequantize_tensor",
    "np_quantize_block",
    "np_quantize_float",
    "np_quantize_tensor",
    "one_thread",
    "pinned",
    "qt_bytes",
    "reason",
    "report",
    "run",
    "run_from_args",
    "targets",
    "timed",
    "torch_forms",
    "ue4m3_round_up",
    "verdict",
    "versions",
]

BLOCK = 32
MIB = 1 << 20
AQ_SCHEMES = ("q8s:native", "q8s", "q8s:block32:f16:native", "q8s:block32:f16", "q4s:block32:f16")
INT8_TENSOR_SCHEMES = ("q8s:native", "q8s")
INT8_BLOCK_SCHEMES = ("q8s:block32:f16:native", "q8s:block32:f16")
FLOAT_PRESETS = ("nvfp4", "mxfp4", "mxfp8")
FOUR_BIT = ("q4s:block32:f16", "nvfp4", "mxfp4")
ALL_CASES = AQ_SCHEMES + FLOAT_PRESETS
FLOAT_BASELINE = "numpy+ml_dtypes "  # + preset: the case name of its NumPy + ml_dtypes form
TENSOR_FORM = " per-tensor"  # the obvious int8 forms, after the name of the library that runs them
BLOCK_FORM = " block32 f16"
BACKENDS = ("numpy", "cupy", "torch", "jax")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"
PEER_PACKAGES = ("ml_dtypes", "gguf", "torch", "bitsandbytes", "jax", "jaxlib", "cupy", "cupy-cuda12x", "cupy-cuda13x")

# Targets of issue 5 (NumPy, one core, 8192 x 8192 f32), judged on the median: (cases, op, GB/s)
TARGETS = (
    (INT8_BLOCK_SCHEMES, "quantize", 1.5),
    (INT8_BLOCK_SCHEMES, "dequantize", 3.0),
    (("nvfp4",), "quantize", 0.6),
    (FOUR_BIT, "dequantize", 2.0),
)
# Search calibrations timed beside MinMax (issue 12: mse at most 30x MinMax's time, default grid)
CALIBRATION_CASES = (
    ("q8s", "mse"),
    ("q8s:block32:f16", "mse"),
    ("q4s:block32:f16", "mse"),
    ("mxfp4", "mse"),
    ("nvfp4", "mse"),
    ("mxfp8", "mse"),
    ("nvfp4", "4over6"),
    ("q8s", "percentile"),
)
CALIBRATION_TARGET = 30.0  # x MinMax's time, for mse
# Targets of issue 13 (fused kernels, one thread), judged on the median against copy and peers
COPY_TARGETS = {"quantize": 0.25, "dequantize": 0.4}
COPY_TARGET_EXCEPTIONS = {("nvfp4", "quantize"): 0.2, ("mxfp8", "quantize"): 0.2}
PEER_TARGET = 1.0  # quantize rows: x the fastest peer for the same job
TARGET_SIZE = 8192
TARGET_EXTRA_MIB = 16.0  # working set beyond input and output (issue 13; issue 5 asked 64 of block cases)

# Which arrayquant cases each peer row stands beside (same job: same bits per value, block size)
_INT8_TENSOR_PEERS = ("torch int8 per-tensor", "torch.compile int8 per-tensor")
_INT8_BLOCK_PEERS = (
    "gguf Q8_0",
    "torch int8 block32",
    "torch.compile int8 block32",
    "bitsandbytes blockwise8 b32",
)
_FP4_PEERS = ("torch fp4 block32", "torch.compile fp4 block32", "bitsandbytes fp4 b32", "bitsandbytes nf4 b32")
PEER_MAP: dict[str, tuple[str, ...]] = {
    **{s: _INT8_TENSOR_PEERS for s in INT8_TENSOR_SCHEMES},
    **{s: _INT8_BLOCK_PEERS for s in INT8_BLOCK_SCHEMES},
    "q4s:block32:f16": ("gguf Q4_0", *_FP4_PEERS),
    "nvfp4": (FLOAT_BASELINE + "nvfp4", "gguf NVFP4", *_FP4_PEERS),
    "mxfp4": (FLOAT_BASELINE + "mxfp4", "gguf MXFP4", *_FP4_PEERS),
    "mxfp8": (FLOAT_BASELINE + "mxfp8", "torch fp8 block32", "torch.compile fp8 block32"),
}


# --- the obvious NumPy forms (``m`` is numpy, or cupy on a GPU) -------------------------------


def np_quantize_tensor(x: Any, m: Any = np) -> tuple[Any, Any]:
    scale = m.abs(x).max() * m.float32(2) / m.float32(254)
    return m.clip(m.round(x / scale), -127, 127).astype(m.int8), scale


def np_dequantize_tensor(codes: Any, scale: Any, m: Any = np) -> Any:
    return codes.astype(m.float32) * scale


def f16_round_up(s: Any, m: Any = np) -> Any:
    """``s`` rounded up onto the F16 grid, as f32: cast, then step up where the cast went below."""
    h = s.astype(m.float16)
    h = m.where(h.astype(m.float32) < s, m.nextafter(h, m.float16(m.inf)), h)
    return h.astype(m.float32)


def np_quantize_block(x: Any, m: Any = np) -> tuple[Any, Any]:
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    scales = f16_round_up(m.abs(xb).max(axis=-1) * m.float32(2) / m.float32(254), m)
    codes = m.clip(m.round(xb / scales[..., None]), -127, 127).astype(m.int8)
    return codes.reshape(x.shape), scales


def np_dequantize_block(codes: Any, scales: Any, m: Any = np) -> Any:
    cb = codes.reshape(*codes.shape[:-1], codes.shape[-1] // BLOCK, BLOCK)
    return (cb.astype(m.float32) * scales[..., None]).reshape(codes.shape)


# --- the obvious NumPy + ml_dtypes forms of the float presets ---------------------------------


@dataclass(frozen=True)
class FloatForm:
    block: int
    value: str  # the ml_dtypes minifloat of the codes
    max: float  # its largest finite magnitude
    ue4m3: bool  # UE4M3 block scales under an f32 per-tensor scale (nvfp4), else UE8M0


FLOAT_FORMS = {
    "nvfp4": FloatForm(16, "float4_e2m1fn", 6.0, ue4m3=True),
    "mxfp4": FloatForm(32, "float4_e2m1fn", 6.0, ue4m3=False),
    "mxfp8": FloatForm(32, "float8_e4m3fn", 448.0, ue4m3=False),
}


def ue4m3_round_up(s: np.ndarray) -> np.ndarray:
    """``s`` (at most 448) rounded up onto the UE4M3 grid, as f32: cast, then step up where it went below."""
    import ml_dtypes

    h = np.minimum(s, np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
    bits = h.view(np.uint8)
    h = np.where(h.astype(np.float32) < s, (bits + np.uint8(1)).view(ml_dtypes.float8_e4m3fn), h)
    return h.astype(np.float32)


def np_quantize_float(x: np.ndarray, form: FloatForm) -> tuple[np.ndarray, np.ndarray]:
    """Minifloat codes (ml_dtypes, one per element) and the f32 effective scale per block."""
    import ml_dtypes

    xb = x.reshape(*x.shape[:-1], x.shape[-1] // form.block, form.block)
    s = np.abs(xb).max(axis=-1) / np.float32(form.max)
    if form.ue4m3:
        g = np.float32(s.max() / np.float32(448))
        scales = ue4m3_round_up(s / g) * g
    else:
        scales = np.exp2(np.ceil(np.log2(s)))  # UE8M0: the next power of two
    y = np.clip(xb / scales[..., None], -form.max, form.max)
    return y.astype(getattr(ml_dtypes, form.value)).reshape(x.shape), scales


def np_dequantize_float(codes: np.ndarray, scales: np.ndarray, form: FloatForm) -> np.ndarray:
    cb = codes.reshape(*codes.shape[:-1], codes.shape[-1] // form.block, form.block)
    return (cb.astype(np.float32) * scales[..., None]).reshape(codes.shape)


# --- measurement ------------------------------------------------------------------------------


@dataclass
class Result:
    case: str
    op: str
    kind: str  # "copy", "numpy" (the obvious form), "arrayquant", "peer", "jit" (arrayquant under jax.jit)
    times_s: list[float]
    gbps_median: float
    gbps_best: float
    first_s: float = 0.0  # the warm-up call: compile time for torch.compile and jax.jit
    vs_copy: float = 0.0
    vs_numpy: float | None = None
    vs_peer: float | None = None
    best_peer: str | None = None
    extra_mib: float | None = None
    check: str = ""  # "exact" / "differs" against an independent reference, "" when not checked
    vs_minmax: float | None = None  # calibration rows: time relative to the same scheme's MinMax quantize
    weight_mib: float | None = None  # matmul rows: MiB of the quantized weight


@dataclass(frozen=True)
class Pair:
    """A quantizer and its dequantizer, both timed; ``dequantize`` takes what ``quantize`` returned."""

    name: str
    quantize: Callable[[], Any]
    dequantize: Callable[[Any], Any] | None = None
    kind: str = "peer"
    check: Callable[[Any], str] | None = None  # judges the quantize output


@dataclass
class Bench:
    host: np.ndarray
    x: Any
    backend: str
    repeat: int
    sync: Callable[[Any], None]
    memory: bool
    calibrations: bool = True
    portable: bool = True
    matmul: bool = True
    results: list[Result] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)

    def time(self, name: str, op: str, kind: str, fn: Callable[[], Any], out_bytes: Any = None) -> Result:
        times, first = timed(fn, self.repeat, self.sync)
        gb = self.host.nbytes / 1e9
        r = Result(name, op, kind, times, gb / statistics.median(times), gb / min(times), first_s=first)
        if self.memory and out_bytes is not None:
            r.extra_mib = extra_mib(fn, out_bytes)
        self.results.append(r)
        return r

    def check(self, scheme: str, out: Any) -> str:
        """``exact`` when the stored fields in ``out`` equal arrayquant's on NumPy, bit for bit."""
        if scheme not in self.digests:
            self.digests[scheme] = digest(quantize(self.host, scheme))
        return "exact" if digest(out) == self.digests[scheme] else "differs"

    def pair(self, p: Pair) -> None:
        """Time ``p`` (quantize, then dequantize of its output); a failure makes the row unavailable."""
        try:
            r = self.time(p.name, "quantize", p.kind, p.quantize)
        except Exception as exc:  # a peer that cannot run here: say why, go on
            self.unavailable[p.name] = reason(exc)
            return
        if p.dequantize is None:
            return
        try:
            q = p.quantize()
            self.sync(q)
            if p.check is not None:
                r.check = p.check(q)
            self.time(p.name, "dequantize", p.kind, functools.partial(p.dequantize, q))
        except Exception as exc:
            self.unavailable[f"{p.name} dequantize"] = reason(exc)


def reason(exc: BaseException) -> str:
    """``Type: first line of the message``; where the message is empty, where it was raised."""
    text = str(exc).strip().splitlines()
    if text:
        return f"{type(exc).__name__}: {text[0][:160]}"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" (raised in {tb.tb_frame.f_code.co_name}, {Path(tb.tb_frame.f_code.co_filename).name})" if tb else ""
    return f"{type(exc).__name__}{where}"


def timed(fn: Callable[[], Any], repeat: int, sync: Callable[[Any], None]) -> tuple[list[float], float]:
    """Seconds of ``repeat`` calls after one warm-up (imports, compilation, allocator pools).

    ``sync`` waits for the output on asynchronous devices, so the time covers the work itself.
    """
    t0 = time.perf_counter()
    sync(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        sync(None)
        t0 = time.perf_counter()
        out = fn()
        sync(out)
        times.append(time.perf_counter() - t0)
        del out
    return times, first


def extra_mib(fn: Callable[[], Any], out_bytes: Callable[[Any], int]) -> float:
    """Peak memory traced during ``fn`` beyond its output (NumPy reports to tracemalloc)."""
    tracemalloc.start()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak - out_bytes(out)) / MIB


def _leaves(out: Any) -> list[Any]:
    if out is None:
        return []
    if isinstance(out, QuantizedTensor):
        return [a for a in (out.values, out.scales, out.global_scale) if a is not None]
    if isinstance(out, (tuple, list)):
        return [leaf for item in out for leaf in _leaves(item)]
    return [out]


def make_sync(backend: str, x: Any) -> Callable[[Any], None]:
    """Waits for the device work behind an output; a no-op on NumPy."""
    if backend == "cupy":
        import cupy

        dev = cupy.cuda.Device(x.device.id)
        return lambda out: dev.synchronize()
    if backend == "torch" and x.device.type == "cuda":
        import torch

        return lambda out: torch.cuda.synchronize(x.device)
    if backend == "jax":
        import jax

        def wait(out: Any) -> None:
            leaves = [a for a in _leaves(out) if hasattr(a, "block_until_ready")]
            if leaves:
                jax.block_until_ready(leaves)

        return wait
    return _no_sync


def _no_sync(out: Any) -> None:
    return None


def qt_bytes(qt: QuantizedTensor) -> int:
    return int(sum(a.nbytes for a in _leaves(qt)))


def digest(qt: Any) -> str:
    """A hash of the stored fields (values, scales, per-tensor scale) as host bytes."""
    h = hashlib.sha1()
    for a in _leaves(qt):
        h.update(np.ascontiguousarray(shim.to_host(a)).tobytes())
    return h.hexdigest()


# --- the machine --------------------------------------------------------------------------------


def machine(backend: str, x: Any) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "numpy": np.__version__,
        "arrayquant": __version__,
        "backend": backend,
        "device": str(getattr(x, "device", "cpu")),
    }
    with contextlib.suppress(Exception):
        if backend == "cupy":
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(x.device.id)
            info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        elif backend == "torch" and x.device.type == "cuda":
            import torch

            info["gpu"] = torch.cuda.get_device_name(x.device)
    return info


def versions() -> dict[str, str | None]:
    """Installed versions of the peers (read from package metadata: nothing is imported)."""
    out: dict[str, str | None] = {}
    for name in PEER_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if not name.startswith("cupy"):
                out[name] = None
    return out


def one_thread() -> None:
    """Every library keeps to one thread (set before the peers are imported)."""
    for var in THREAD_VARS:
        os.environ[var] = "1"
    if "jax" not in sys.modules and "--xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_ONE_THREAD}".strip()


def _current_cpu() -> int | None:
    with contextlib.suppress(OSError, IndexError, ValueError):
        stat = Path("/proc/self/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[36])  # field 39: the CPU this process last ran on
    return None


@contextlib.contextmanager
def pinned(n: int) -> Iterator[list[int] | None]:
    """Pin this process to ``n`` CPUs (the one it runs on first), restoring its CPU set afterwards.

    Yields the CPUs, or None where pinning is not available or fewer CPUs are allowed.
    """
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < n:
        yield None
        return
    allowed = os.sched_getaffinity(0)
    cpu = _current_cpu()
    first = cpu if cpu in allowed else min(allowed)
    cpus = [first, *sorted(c for c in allowed if c != first)][:n]
    os.sched_setaffinity(0, set(cpus))
    try:
        yield sorted(cpus)
    finally:
        os.sched_setaffinity(0, allowed)


# --- the peers ----------------------------------------------------------------------------------


def _unpair(fn: Callable[..., Any], out: Any) -> Any:
    """``fn(*out)``: a dequantizer applied to what its quantizer returned."""
    return fn(*out)


def _dequantize_gguf(dequantize: Callable[[Any, Any], Any], kind: Any, out: Any) -> Any:
    return dequantize(out, kind)


def _float_forms(b: Bench) -> list[Pair]:
    import ml_dtypes  # noqa: F401 - unavailable without it

    pairs = []
    for preset, form in FLOAT_FORMS.items():
        pairs.append(
            Pair(
                FLOAT_BASELINE + preset,
                functools.partial(np_quantize_float, b.host, form),
                functools.partial(_unpair, functools.partial(np_dequantize_float, form=form)),
                kind="numpy",
            )
        )
    return pairs


def _peer_gguf(b: Bench) -> list[Pair]:
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    x = b.host
    return [
        Pair(
            f"gguf {t}",
            functools.partial(quants.quantize, x, T[t]),
            functools.partial(_dequantize_gguf, quants.dequantize, T[t]),
        )
        for t in ("Q8_0", "Q4_0", "MXFP4", "NVFP4")
    ]


def torch_forms(torch: Any) -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """The obvious torch forms: (quantize(x) -> (codes, scales), dequantize(codes, scales, shape))."""
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]

    def q8_tensor(x: Any) -> tuple[Any, Any]:
        s = torch.amax(torch.abs(x)) * (2.0 / 254.0)
        return torch.clamp(torch.round(x / s), -127, 127).to(torch.int8), s

    def dq8_tensor(q: Any, s: Any, shape: Any) -> Any:
        return q.to(torch.float32) * s

    def q8_block(x: Any) -> tuple[Any, Any]:
        xb = x.reshape(-1, BLOCK)
        s = (torch.amax(torch.abs(xb), dim=1, keepdim=True) * (2.0 / 254.0)).to(torch.float16)
        q = torch.clamp(torch.round(xb / s.to(torch.float32)), -127, 127).to(torch.int8)
        return q, s

    def dq8_block(q: Any, s: Any, shape: Any) -> Any:
        return (q.to(torch.float32) * s.to(torch.float32)).reshape(shape)

    def q_fp4(x: Any) -> tuple[Any, Any]:
        # E2M1 codes by threshold comparisons (ties to the even code), UE8M0 scale, two codes a byte
        xb = x.reshape(-1, BLOCK)
        s = torch.exp2(torch.ceil(torch.log2(torch.amax(torch.abs(xb), dim=1, keepdim=True) / 6.0)))
        y = xb / s
        a = torch.abs(y)
        m = (a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5.0)
        code = m | ((y < 0).to(torch.uint8) << 3)
        return code[:, 0::2] | (code[:, 1::2] << 4), s

    def dq_fp4(q: Any, s: Any, shape: Any) -> Any:
        lut = torch.tensor(e2m1 + [-v for v in e2m1], dtype=torch.float32, device=q.device)
        codes = torch.stack((q & 15, q >> 4), dim=-1).reshape(-1, BLOCK)
        return (lut[codes.to(torch.int64)] * s).reshape(shape)

    def q_fp8(x: Any) -> tuple[Any, Any]:
        xb = x.reshape(-1, BLOCK)
        s = torch.exp2(torch.ceil(torch.log2(torch.amax(torch.abs(xb), dim=1, keepdim=True) / 448.0)))
        return torch.clamp(xb / s, -448.0, 448.0).to(torch.float8_e4m3fn), s

    def dq_fp8(q: Any, s: Any, shape: Any) -> Any:
        return (q.to(torch.float32) * s).reshape(shape)

    return {
        "int8 per-tensor": (q8_tensor, dq8_tensor),
        "int8 block32": (q8_block, dq8_block),
        "fp4 block32": (q_fp4, dq_fp4),
        "fp8 block32": (q_fp8, dq_fp8),
    }


def _torch_input(b: Bench) -> Any:
    import torch

    torch.set_num_threads(1)
    return b.x if b.backend == "torch" else torch.from_numpy(b.host)


def _torch_pairs(b: Bench, compiled: bool) -> list[Pair]:
    import torch

    x = _torch_input(b)
    label = "torch.compile" if compiled else "torch"
    pairs = []
    for name, (q, dq) in torch_forms(torch).items():
        if compiled:
            q, dq = torch.compile(q, dynamic=False), torch.compile(dq, dynamic=False)
        pairs.append(
            Pair(
                f"{label} {name}",
                functools.partial(q, x),
                functools.partial(_unpair, functools.partial(dq, shape=tuple(x.shape))),
            )
        )
    return pairs


def _peer_torch(b: Bench) -> list[Pair]:
    return _torch_pairs(b, compiled=False)


def _peer_torch_compile(b: Bench) -> list[Pair]:
    return _torch_pairs(b, compiled=True)


def _peer_bitsandbytes(b: Bench) -> list[Pair]:
    import logging

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # CPU kernels it cannot find are not needed
    import bitsandbytes.functional as F

    x = _torch_input(b)
    four = lambda kind: functools.partial(F.quantize_4bit, x, blocksize=BLOCK, quant_type=kind)
    return [
        Pair(
            "bitsandbytes blockwise8 b32",
            functools.partial(F.quantize_blockwise, x, blocksize=BLOCK),
            lambda r: F.dequantize_blockwise(r[0], r[1]),
        ),
        Pair("bitsandbytes fp4 b32", four("fp4"), lambda r: F.dequantize_4bit(r[0], r[1])),
        Pair("bitsandbytes nf4 b32", four("nf4"), lambda r: F.dequantize_4bit(r[0], r[1])),
    ]


def _peer_jax_jit(b: Bench) -> list[Pair]:
    """arrayquant's own kernels under ``jax.jit`` on the default jax device (XLA fuses them)."""
    import jax
    import jax.numpy as jnp

    x = b.x if b.backend == "jax" else jax.device_put(b.host)
    sync = make_sync("jax", x)
    pairs = []
    for scheme in ALL_CASES:
        parsed = QuantScheme.parse(scheme)

        def fields(a: Any, scheme: str = scheme) -> tuple[Any, Any, Any]:
            qt = quantize(a, scheme)
            return qt.values, qt.scales, qt.global_scale

        def rebuild(v: Any, s: Any, g: Any, parsed: QuantScheme = parsed) -> Any:
            qt = QuantizedTensor(parsed, tuple(x.shape), jnp.float32, v, s, g)
            return dequantize(qt)

        qf, df = jax.jit(fields), jax.jit(rebuild)

        def run_q(qf: Any = qf) -> Any:
            out = qf(x)
            sync(out)  # jax dispatches asynchronously: wait, whatever the input backend
            return out

        def run_d(fields: Any, df: Any = df) -> Any:
            out = df(*fields)
            sync(out)
            return out

        pairs.append(
            Pair(
                f"jax.jit {scheme}",
                run_q,
                run_d,
                kind="jit",
                check=functools.partial(b.check, scheme),
            )
        )
    return pairs


PEERS: dict[str, Callable[[Bench], list[Pair]]] = {
    "gguf": _peer_gguf,
    "torch": _peer_torch,
    "torch.compile": _peer_torch_compile,
    "bitsandbytes": _peer_bitsandbytes,
    "jax.jit": _peer_jax_jit,
}
# the input backends each peer runs with: on the others it would time a different machine
PEER_BACKENDS = {
    "gguf": ("numpy",),
    "torch": ("numpy", "torch"),
    "torch.compile": ("numpy", "torch"),
    "bitsandbytes": ("numpy", "torch"),
    "jax.jit": ("numpy", "jax"),
}


# --- one run ----------------------------------------------------------------------------------


def _copy_case(b: Bench) -> tuple[str, Callable[[], Any]]:
    x = b.x
    if b.backend == "numpy":
        dst = np.empty_like(x)
        return "numpy.copyto", lambda: np.copyto(dst, x)
    if b.backend == "cupy":
        import cupy

        dst = cupy.empty_like(x)
        return "cupy.copyto", lambda: cupy.copyto(dst, x)
    if b.backend == "torch":
        import torch

        dst = torch.empty_like(x)
        return "torch.Tensor.copy_", lambda: dst.copy_(x)
    import jax.numpy as jnp

    return "jax.numpy.copy", lambda: jnp.copy(x)


def run(
    size: int,
    repeat: int,
    *,
    backend: str = "numpy",
    device: Any = None,
    peers: tuple[str, ...] = tuple(PEERS),
    memory: bool | None = None,
    calibrations: bool = True,
    portable: bool = True,
    log: Callable[[str], None] | None = None,
    matmul: bool = True,
) -> tuple[dict[str, Any], list[Result], dict[str, str]]:
    """Measure everything once: (machine info, rows, unavailable peers and why)."""
    rng = np.random.default_rng(0)
    host = rng.standard_normal((size, size), dtype=np.float32) * np.float32(0.05)
    x = host if backend == "numpy" else asarray(host, backend=backend, device=device)
    with contextlib.ExitStack() as stack:
        if backend == "cupy":
            import cupy

            stack.enter_context(cupy.cuda.Device(x.device.id))  # launches go to the input's device
        sync = make_sync(backend, x)
        mem = (backend == "numpy") if memory is None else memory
        b = Bench(host, x, backend, repeat, sync, mem, calibrations, portable, matmul)
        info = machine(backend, x)
        _run_cases(b, peers, log or (lambda _: None))
    _ratios(b.results)
    return info, b.results, b.unavailable


def _run_cases(b: Bench, peers: tuple[str, ...], log: Callable[[str], None]) -> None:
    host, x = b.host, b.x
    name, copy = _copy_case(b)
    b.time(name, "copy", "copy", copy)

    m = _obvious_namespace(b.backend)
    codes_t, scale_t = np_quantize_tensor(host)
    codes_b, scales_b = np_quantize_block(host)
    if m is not None:
        pair_bytes = lambda r: int(r[0].nbytes + r[1].nbytes)
        forms = (  # named "numpy ..." on NumPy, "cupy ..." on CuPy
            (m.__name__ + TENSOR_FORM, np_quantize_tensor, np_dequantize_tensor),
            (m.__name__ + BLOCK_FORM, np_quantize_block, np_dequantize_block),
        )
        for case, q, dq in forms:
            try:
                out = q(x, m)
                b.time(case, "quantize", "numpy", functools.partial(q, x, m), pair_bytes)
                b.time(case, "dequantize", "numpy", functools.partial(dq, out[0], out[1], m), lambda y: y.nbytes)
                del out
            except Exception as exc:  # e.g. a dtype the device library lacks
                b.unavailable[case] = reason(exc)
    try:
        float_forms = _float_forms(b) if b.backend == "numpy" else []
    except ImportError as exc:
        b.unavailable["numpy+ml_dtypes"] = reason(exc)
        float_forms = []
    for p in float_forms:
        b.pair(p)
    log("references done")

    fused_on = fused.available() if b.backend == "numpy" else fused.gpu_available()
    for scheme in ALL_CASES:
        qt = quantize(x, scheme)
        b.sync(qt)
        r = b.time(scheme, "quantize", "arrayquant", functools.partial(quantize, x, scheme), qt_bytes)
        r.check = _verify(scheme, qt, host, (codes_t, np.asarray([scale_t])), (codes_b, scales_b))
        if b.backend == "numpy":
            b.digests[scheme] = digest(qt)
        y = dequantize(qt)
        b.time(scheme, "dequantize", "arrayquant", functools.partial(dequantize, qt), lambda y: y.nbytes)
        if fused_on and b.portable:
            _portable_rows(b, scheme, qt, y)
        del qt, y
        log(f"{scheme} done")
    del codes_t, codes_b

    if b.calibrations:
        _calibration_cases(b, log)
    if b.matmul:
        _matmul_cases(b, log)

    for peer in peers:
        if b.backend not in PEER_BACKENDS[peer]:
            b.unavailable[peer] = f"not with --backend {b.backend}: runs with {' or '.join(PEER_BACKENDS[peer])}"
            continue
        try:
            pairs = PEERS[peer](b)
        except Exception as exc:  # not installed, or no backend for it here
            b.unavailable[peer] = reason(exc)
            continue
        for p in pairs:
            b.pair(p)
        log(f"{peer} done")


def _portable_rows(b: Bench, scheme: str, qt: QuantizedTensor, y: Any) -> None:
    """The same jobs on the portable kernels, timed; each checked equal to the fused result."""
    x = b.x

    def q() -> Any:
        with fused.fused_kernels(False):
            return quantize(x, scheme)

    def dq() -> Any:
        with fused.fused_kernels(False):
            return dequantize(qt)

    name = f"{scheme} portable"
    r = b.time(name, "quantize", "portable", q, qt_bytes)
    r.check = "exact" if digest(q()) == digest(qt) else "differs"
    r = b.time(name, "dequantize", "portable", dq, lambda y: y.nbytes)
    same = np.array_equal(shim.to_host(dq()).view(np.uint8), shim.to_host(y).view(np.uint8))
    r.check = "exact" if same else "differs"


# matmul rows (issue 14): a MATMUL_SIZE^2 weight quantized per tensor (and q8s per row) times a
# MATMUL_SIZE x MATMUL_COLUMNS f32 input; int8 rows quantize the input too (q8s, one scale per column).
# A smaller --size shrinks the weight to size x size (the tests' small runs).
MATMUL_SIZE = 4096
MATMUL_COLUMNS = 64
MATMUL_WEIGHTS = ("q8s", "q8s:block4096", "q4s", "q2s")


def _matmul_side(size: int) -> int:
    """The matmul weight's side for a run of ``--size size``."""
    return min(MATMUL_SIZE, size)


def _matmul_cases(b: Bench, log: Callable[[str], None]) -> None:
    """Each matmul path that applies, beside NumPy's matmul of the dequantized weight, on NumPy.

    Rows are kind ``matmul``: GB/s counts the f32 weight's bytes (what the quantized weight stands
    for); ``vs_numpy`` is NumPy's time over ours; ``check`` compares with NumPy's float64 product of
    the same dequantized operands (``close``: within 1e-5 of the largest output, ``differs`` past it).
    """
    if b.backend != "numpy":
        b.unavailable["matmul"] = f"matmul rows run with --backend numpy only, not {b.backend}"
        return
    from .ops import linalg

    side = _matmul_side(b.host.shape[0])
    rng = np.random.default_rng(1)
    w = rng.standard_normal((side, side), dtype=np.float32) * np.float32(0.05)
    x = rng.standard_normal((side, MATMUL_COLUMNS), dtype=np.float32)
    xt = np.ascontiguousarray(x.T)
    per_column = QuantScheme.parse("q8s").per_block([side, 1])
    gb = w.nbytes / 1e9

    def row(case: str, kind: str, fn: Callable[[], Any], base: Result | None, oracle: Any, qt: Any = None) -> Result:
        times, first = timed(fn, b.repeat, b.sync)
        r = Result(case, "matmul", kind, times, gb / statistics.median(times), gb / min(times), first_s=first)
        if base is not None:
            r.vs_numpy = statistics.median(base.times_s) / statistics.median(times)
        if oracle is not None:
            err = float(np.max(np.abs(fn().astype(np.float64) - oracle)))
            r.check = "close" if err <= 1e-5 * float(np.max(np.abs(oracle))) else "differs"
        if qt is not None:
            r.weight_mib = qt_bytes(qt) / MIB
        b.results.append(r)
        return r

    for name in MATMUL_WEIGHTS:
        scheme = name.replace(str(MATMUL_SIZE), str(side))  # per row: one block spans the row
        try:
            wq = quantize(w, scheme)
            wd = dequantize(wq)
            np_wx = row(f"numpy deq({scheme}) @ x", "matmul-numpy", functools.partial(np.matmul, wd, x), None, None)
            oracle = wd.astype(np.float64) @ x.astype(np.float64)
            ref = functools.partial(linalg.matmul, wq, x, path="reference")
            row(f"{scheme} @ x reference", "matmul", ref, np_wx, oracle, wq)
            xq = quantize(x, per_column)
            if linalg.matmul_path(wq, xq) == "int8":
                oracle_q = wd.astype(np.float64) @ dequantize(xq).astype(np.float64)
                int8 = functools.partial(_int8_matmul, wq, x, per_column)
                row(f"{scheme} @ q8s-col(x) int8", "matmul", int8, np_wx, oracle_q, wq)
            if linalg.matmul_path(xt, wq) == "ternary":
                np_xw = row(
                    f"numpy x.T @ deq({scheme})", "matmul-numpy", functools.partial(np.matmul, xt, wd), None, None
                )
                oracle_t = xt.astype(np.float64) @ wd.astype(np.float64)
                tern = functools.partial(linalg.matmul, xt, wq, path="ternary")
                row(f"x.T @ {scheme} ternary", "matmul", tern, np_xw, oracle_t, wq)
            del wq, wd
        except Exception as exc:  # report, go on with the other weights
            b.unavailable[f"matmul {scheme}"] = reason(exc)
        log(f"matmul {scheme} done")


def _int8_matmul(wq: QuantizedTensor, x: np.ndarray, scheme: QuantScheme) -> Any:
    """The int8 path from a float input: quantize it (one scale per column), then the exact integer sums."""
    from .ops import linalg

    return linalg.matmul(wq, quantize(x, scheme), path="int8")


def _calibration_cases(b: Bench, log: Callable[[str], None]) -> None:
    """Search calibrations beside MinMax; on NumPy, checked against the portable kernels' bits.

    Where a fused kernel ran, the same job with ``ARRAYQUANT_FUSED=0`` (untimed) must give the same
    digest; elsewhere the row says nothing (the conformance tests compare every backend).
    """
    for scheme, cal in CALIBRATION_CASES:
        job = functools.partial(quantize, b.x, scheme, calibration=cal)
        qt = job()
        b.sync(qt)
        r = b.time(f"{scheme} {cal}", "quantize", "calibration", job, qt_bytes)
        if b.backend == "numpy" and cal == "mse" and fused.available():
            with fused.fused_kernels(False):
                r.check = "exact" if digest(job()) == digest(qt) else "differs"
        del qt
        log(f"{scheme} {cal} done")


def _obvious_namespace(backend: str) -> Any:
    if backend == "numpy":
        return np
    if backend == "cupy":
        import cupy

        return cupy
    return None  # torch and jax: their own obvious forms are the torch peers and jax.jit


def _verify(scheme: str, qt: QuantizedTensor, host: np.ndarray, tensor: tuple[Any, Any], block: tuple[Any, Any]) -> str:
    """Compare with an independent form: int8 codes and stored scales equal the obvious NumPy form's;
    MXFP8 codes equal ml_dtypes' E4M3 cast of ``clip(x / scale)``; the 4-bit cases are not checked here.
    """
    if scheme.startswith("q4s") or scheme in ("nvfp4", "mxfp4"):
        return ""
    codes = shim.to_host(qt.codes())
    scales = shim.to_host(qt.scales)
    if scheme == "mxfp8":
        try:
            import ml_dtypes
        except ImportError:
            return ""
        eff = np.repeat(scales, BLOCK, axis=-1)
        ref = np.clip(host / eff, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        return "exact" if codes.dtype == np.uint8 and np.array_equal(codes, ref) else "differs"
    ref_codes, ref_scales = block if ":block" in scheme else tensor
    same = np.array_equal(codes, ref_codes) and np.array_equal(scales, ref_scales)
    return "exact" if same else "differs"


def _ratios(results: list[Result]) -> None:
    copy = next(r for r in results if r.kind == "copy").gbps_median
    index = {(r.case, r.op): r for r in results}
    for r in results:
        r.vs_copy = r.gbps_median / copy
        if r.kind == "calibration":
            minmax = index.get((r.case.split(" ")[0], r.op))
            r.vs_minmax = None if minmax is None else minmax.gbps_median / r.gbps_median
        if r.kind != "arrayquant":
            continue
        form = _numpy_reference(r.case)
        ref = [o for o in results if o.kind == "numpy" and o.op == r.op and o.case.endswith(form)]
        if ref:
            r.vs_numpy = r.gbps_median / ref[0].gbps_median
        peers = [index[(p, r.op)] for p in PEER_MAP.get(r.case, ()) if (p, r.op) in index]
        if peers:
            best = max(peers, key=lambda p: p.gbps_median)
            r.vs_peer, r.best_peer = r.gbps_median / best.gbps_median, best.case


def _numpy_reference(case: str) -> str:
    if case in FLOAT_PRESETS:
        return FLOAT_BASELINE + case
    return BLOCK_FORM if ":block" in case else TENSOR_FORM


# --- report -----------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def targets(results: list[Result]) -> list[dict[str, Any]]:
    """The issue's targets, judged on this run's medians (and the working-set bound)."""
    out: list[dict[str, Any]] = []
    for r in results:
        if r.kind == "calibration" and r.case.endswith(" mse") and r.vs_minmax is not None:
            out.append(
                {
                    "case": r.case,
                    "op": r.op,
                    "metric": "x MinMax time",
                    "value": r.vs_minmax,
                    "goal": CALIBRATION_TARGET,
                }
            )
        if r.kind != "arrayquant":
            continue
        goal = COPY_TARGET_EXCEPTIONS.get((r.case, r.op), COPY_TARGETS.get(r.op))
        if goal is not None:
            out.append({"case": r.case, "op": r.op, "metric": "x copy", "value": r.vs_copy, "goal": goal})
        if r.op == "quantize" and r.vs_peer is not None:
            out.append({"case": r.case, "op": r.op, "metric": "x peer", "value": r.vs_peer, "goal": PEER_TARGET})
        for cases, op, goal in TARGETS:
            if r.case in cases and r.op == op:
                out.append({"case": r.case, "op": op, "metric": "GB/s median", "value": r.gbps_median, "goal": goal})
        if r.extra_mib is not None:
            out.append(
                {"case": r.case, "op": r.op, "metric": "MiB extra", "value": r.extra_mib, "goal": TARGET_EXTRA_MIB}
            )
    for t in out:
        ok = t["value"] >= t["goal"] if _higher_is_better(t) else t["value"] <= t["goal"]
        t["verdict"] = verdict(ok)
    return out


def _higher_is_better(t: dict[str, Any]) -> bool:
    return t["metric"] in ("GB/s median", "x copy", "x peer")


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "" if v is None else format(v, spec)


SECTIONS = (
    ("copy", "bandwidth limit"),
    ("numpy", "the obvious NumPy forms (float presets: NumPy + ml_dtypes casts)"),
    ("arrayquant", "arrayquant (eager; fused kernels where they apply)"),
    ("portable", "arrayquant on its portable Array API kernels (check = equal to the fused result)"),
    ("peer", "peers (each beside the arrayquant cases in PEER_MAP)"),
    ("jit", "arrayquant under jax.jit (XLA fusion; check = equal to arrayquant on NumPy)"),
)


def report(info: dict[str, Any], size: int, repeat: int, results: list[Result], unavailable: dict[str, str]) -> str:
    mib = size * size * 4 / MIB
    head = [
        f"input: {size}x{size} float32 ({mib:.0f} MiB), N(0,1)*0.05; median and best of {repeat} runs after a warm-up",
        f"backend {info['backend']}, device {info['device']}; {info['threads']}",
    ]
    cols = (
        f"{'case':<30} {'op':<10} {'median':>7} {'best':>7} {'x copy':>6} {'x numpy':>7} "
        f"{'x peer':>6}  {'best peer':<30} {'MiB+':>6} {'first s':>7} {'check':<7}"
    )
    rows = []
    for kind, title in SECTIONS:
        section = [r for r in results if r.kind == kind]
        if not section:
            continue
        rows += ["", f"-- {title}", cols, "-" * len(cols)]
        for r in section:
            rows.append(
                f"{r.case:<30} {r.op:<10} {r.gbps_median:7.2f} {r.gbps_best:7.2f} {r.vs_copy:6.2f} "
                f"{_fmt(r.vs_numpy):>7} {_fmt(r.vs_peer):>6}  {r.best_peer or '':<30} {_fmt(r.extra_mib, '.1f'):>6} "
                f"{r.first_s:7.2f} {r.check:<7}"
            )
    cal = [r for r in results if r.kind == "calibration"]
    if cal:
        rows += ["", "-- search calibrations (x MinMax = time relative to the same scheme's MinMax quantize above)"]
        rows += [f"{'case':<30} {'op':<10} {'median':>7} {'best':>7} {'x MinMax':>8} {'MiB+':>6} {'check':<7}"]
        rows += [
            f"{r.case:<30} {r.op:<10} {r.gbps_median:7.2f} {r.gbps_best:7.2f} {_fmt(r.vs_minmax, '.1f'):>8} "
            f"{_fmt(r.extra_mib, '.1f'):>6} {r.check:<7}"
            for r in cal
        ]
    mm = [r for r in results if r.kind in ("matmul", "matmul-numpy")]
    if mm:
        side = _matmul_side(size)
        f32_mib = side * side * 4 / MIB
        rows += [
            "",
            f"-- matmul: {side}x{side} weight, {side}x{MATMUL_COLUMNS} f32 input "
            f"(x NumPy = NumPy's time / ours; weight MiB vs {f32_mib:.0f} MiB f32)",
            f"{'case':<34} {'median ms':>9} {'best ms':>8} {'x NumPy':>7} {'weight MiB':>10} {'check':<7}",
        ]
        rows += [
            f"{r.case:<34} {1e3 * statistics.median(r.times_s):9.1f} {1e3 * min(r.times_s):8.1f} "
            f"{_fmt(r.vs_numpy):>7} {_fmt(r.weight_mib, '.1f'):>10} {r.check:<7}"
            for r in mm
        ]
    jit = _jit_gain(results)
    if jit:
        rows += ["", "-- what XLA fusion gives: jax.jit(arrayquant) / arrayquant eager on this backend, medians"]
        rows += jit
    if unavailable:
        rows += ["", "-- unavailable"]
        rows += [f"{name:<30} {why}" for name, why in unavailable.items()]
    notes = [
        "",
        "GB/s of f32 input (1e9 bytes/s). Ratios use medians: 'x copy' against the copy above, 'x numpy' against",
        "the obvious NumPy form (block cases, q4s included, against the int8 block32 form; float presets against",
        "their NumPy + ml_dtypes form, whose 4-bit codes stay one per byte), 'x peer' against the fastest peer for",
        "the same job (named). MiB+ = tracemalloc peak beyond the output (NumPy only); first s = the warm-up call",
        "(compile time for torch.compile and jax.jit).",
    ]
    judged = targets(results)
    stated = size == TARGET_SIZE and info["backend"] == "numpy"
    tline = "targets (informational; stated for NumPy, one core, 8192x8192; judged on the median)"
    tline += ":" if stated else f" - this run is {size}x{size} on {info['backend']}, so only indicative:"
    lines = [
        f"{t['case']:<24} {t['op']:<10} {t['value']:6.2f} {t['metric']:<11} {_target_op(t)} {t['goal']:<5g} "
        f"{t['verdict']}"
        for t in judged
    ]
    return "\n".join([*head, *rows, *notes, "", tline, *lines])


def _target_op(t: dict[str, Any]) -> str:
    return ">=" if _higher_is_better(t) else "<="


def _jit_gain(results: list[Result]) -> list[str]:
    index = {(r.case, r.op): r for r in results if r.kind == "arrayquant"}
    out = []
    for r in results:
        if r.kind == "jit":
            eager = index.get((r.case.removeprefix("jax.jit "), r.op))
            if eager is not None:
                out.append(f"{r.case:<30} {r.op:<10} {r.gbps_median / eager.gbps_median:6.2f}x")
    return out


# --- command line -------------------------------------------------------------------------------


def _peer_list(text: str) -> tuple[str, ...]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return tuple(PEERS)
    if names == ["none"]:
        return ()
    bad = [n for n in names if n not in PEERS]
    if bad or not names:
        msg = f"unknown peer {', '.join(bad) or text!r}; choose from all, none, {', '.join(PEERS)}"
        raise argparse.ArgumentTypeError(msg)
    return tuple(names)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options, shared by ``arrayquant bench`` and ``ci/bench.py``."""
    parser.add_argument("--size", type=int, default=TARGET_SIZE, help="side of the square f32 input (multiple of 32)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case, after one warm-up")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results and the machine as JSON")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="also write the tables as Markdown")
    parser.add_argument("--backend", choices=BACKENDS, default="numpy", help="array backend of the input")
    parser.add_argument("--device", help="device such as cpu, cuda, cuda:1 (default: the backend's)")
    parser.add_argument(
        "--peers",
        type=_peer_list,
        default=tuple(PEERS),
        metavar="LIST",
        help=f"comma-separated peers to time when installed: all (default), none, or of {', '.join(PEERS)}",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc working-set runs")
    parser.add_argument(
        "--no-calibration", action="store_true", help="skip the search calibration rows (mse, 4over6, percentile)"
    )
    parser.add_argument(
        "--no-portable", action="store_true", help="skip the rows of the portable kernels beside the fused ones"
    )
    parser.add_argument(
        "--no-matmul", action="store_true", help="skip the matmul rows (4096x4096 quantized weight x 4096x64 input)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads (and pinned CPUs) of arrayquant's fused kernels; libraries and peers keep one thread",
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin the process to one CPU (threads are still limited to one)"
    )


def run_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.size <= 0 or args.size % BLOCK:
        parser.error(f"--size must be a positive multiple of {BLOCK}, got {args.size}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    one_thread()
    say = lambda text: print(f"  [{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)
    memory = False if args.no_memory else None
    if "jax" in sys.modules and not args.no_pin:
        say("jax was imported before the benchmark pinned its CPU: XLA's thread pool may use more cores")
    n = args.threads
    pin = pinned(n) if not args.no_pin else contextlib.nullcontext(None)
    with pin as cpus, fused.fused_kernels(threads=n):
        info, results, unavailable = run(
            args.size,
            args.repeat,
            backend=args.backend,
            device=args.device,
            peers=args.peers,
            memory=memory,
            calibrations=not args.no_calibration,
            portable=not args.no_portable,
            log=say,
            matmul=not args.no_matmul,
        )
    where = f"process pinned to CPU {', '.join(map(str, cpus))}, " if cpus else "process not pinned, "
    cores = "one core" if n == 1 else f"{n} cores"
    info["threads"] = (
        f"{cores}: {where}fused kernels {n} thread{'s' if n > 1 else ''}, "
        "OMP/BLAS threads 1, torch.set_num_threads(1), XLA Eigen pool off"
    )
    info["fused_threads"] = n
    vers = versions()
    print("\n".join(f"{k}: {v}" for k, v in info.items()))
    print("versions: " + ", ".join(f"{k} {v or '-'}" for k, v in vers.items()) + "\n")
    print(report(info, args.size, args.repeat, results, unavailable))
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    print(f"\nloadavg at end: {info['loadavg_end']}")
    if args.json is not None or args.markdown is not None:
        doc = {
            "machine": info,
            "versions": vers,
            "size": args.size,
            "repeat": args.repeat,
            "results": [asdict(r) for r in results],
            "unavailable": unavailable,
            "targets": targets(results),
            "peer_map": PEER_MAP,
        }
        if args.json is not None:
            args.json.write_text(json.dumps(doc, indent=1) + "\n")
        if args.markdown is not None:
            args.markdown.write_text(markdown(doc))
    differs = [f"{r.case} {r.op}" for r in results if r.check == "differs"]
    if differs:
        print(f"\noutputs that differ from their reference: {', '.join(differs)}", file=sys.stderr)
        return 1
    return 0


def markdown(doc: dict[str, Any]) -> str:
    """The tables of a run's JSON document as Markdown (what ``--markdown`` writes; docs use it)."""
    m, rows = doc["machine"], doc["results"]
    by = {(r["case"], r["op"]): r for r in rows}
    vers = ", ".join(f"{k} {v}" for k, v in doc["versions"].items() if v)
    load = lambda key: " ".join(f"{v:.2f}" for v in m.get(key) or [])
    out = [
        f"Input {doc['size']}x{doc['size']} float32, median and best of {doc['repeat']} runs after a warm-up; "
        f"{m.get('threads', 'one thread')}. Machine: {m['cpu']}, {m['cpu_count']} cores, {m['platform']}; "
        f"Python {m['python']}, "
        f"NumPy {m['numpy']}; backend {m['backend']} ({m['device']}{', ' + m['gpu'] if m.get('gpu') else ''}). "
        f"Load average {load('loadavg')} at the start, {load('loadavg_end')} at the end. Versions: {vers}.",
        "",
        "| case | op | median GB/s | best GB/s | x copy | x NumPy | best peer | peer GB/s | x peer | check |",
        "|---|---|--:|--:|--:|--:|---|--:|--:|---|",
    ]
    num = lambda v, spec=".2f": "" if v is None else format(v, spec)
    for r in rows:
        if r["kind"] != "arrayquant":
            continue
        peer = by.get((r["best_peer"], r["op"])) if r["best_peer"] else None
        out.append(
            f"| `{r['case']}` | {r['op']} | {r['gbps_median']:.2f} | {r['gbps_best']:.2f} | {r['vs_copy']:.3f} | "
            f"{num(r['vs_numpy'])} | {r['best_peer'] or ''} | {num(peer and peer['gbps_median'])} | "
            f"{num(r['vs_peer'])} | {r['check']} |"
        )
    out += [
        "",
        "| reference or peer | op | median GB/s | best GB/s | x copy | first call s | beside |",
        "|---|---|--:|--:|--:|--:|---|",
    ]
    beside: dict[str, list[str]] = {}
    for case, peers in doc["peer_map"].items():
        for p in peers:
            beside.setdefault(p, []).append(case)
    for r in rows:
        if r["kind"] in ("copy", "numpy", "peer"):
            near = beside.get(r["case"]) or (["all"] if r["kind"] == "copy" else [])
            out.append(
                f"| {r['case']} | {r['op']} | {r['gbps_median']:.2f} | {r['gbps_best']:.2f} | {r['vs_copy']:.3f} | "
                f"{r['first_s']:.2f} | {', '.join(f'`{c}`' for c in near)} |"
            )
    portable = [r for r in rows if r["kind"] == "portable"]
    if portable:
        out += ["", "| portable kernels | op | median GB/s | x copy | fused x faster | check (= fused) |"]
        out += ["|---|---|--:|--:|--:|---|"]
        for r in portable:
            fused_row = by.get((r["case"].removesuffix(" portable"), r["op"]))
            gain = num(fused_row and fused_row["gbps_median"] / r["gbps_median"])
            out.append(
                f"| `{r['case']}` | {r['op']} | {r['gbps_median']:.2f} | {r['vs_copy']:.3f} | {gain} | {r['check']} |"
            )
    cal = [r for r in rows if r["kind"] == "calibration"]
    if cal:
        out += [
            "",
            "| calibration | op | median GB/s | x MinMax time | MiB extra | check |",
            "|---|---|--:|--:|--:|---|",
        ]
        out += [
            f"| `{r['case']}` | {r['op']} | {r['gbps_median']:.2f} | {num(r['vs_minmax'], '.1f')} | "
            f"{num(r['extra_mib'], '.1f')} | {r['check']} |"
            for r in cal
        ]
    mm = [r for r in rows if r["kind"] in ("matmul", "matmul-numpy")]
    if mm:
        side = _matmul_side(doc["size"])
        out += ["", f"{side}x{side} weight times a {side}x{MATMUL_COLUMNS} f32 input (x NumPy = NumPy's time / ours):"]
        out += ["", "| matmul | median ms | x NumPy | weight MiB | check |", "|---|--:|--:|--:|---|"]
        out += [
            f"| `{r['case']}` | {1e3 * statistics.median(r['times_s']):.1f} | {num(r['vs_numpy'])} | "
            f"{num(r.get('weight_mib'), '.1f')} | {r['check']} |"
            for r in mm
        ]
    jit = [r for r in rows if r["kind"] == "jit"]
    if jit:
        eager_on = "NumPy" if m["backend"] == "numpy" else m["backend"]
        out += ["", f"| jax.jit of arrayquant | op | median GB/s | x eager {eager_on} | first call s | check |"]
        out += ["|---|---|--:|--:|--:|---|"]
        for r in jit:
            eager = by.get((r["case"].removeprefix("jax.jit "), r["op"]))
            ratio = num(eager and r["gbps_median"] / eager["gbps_median"])
            out.append(
                f"| `{r['case']}` | {r['op']} | {r['gbps_median']:.2f} | {ratio} | {r['first_s']:.2f} | {r['check']} |"
            )
    if doc["unavailable"]:
        out += ["", "Unavailable in this run:", ""]
        out += [f"- {name}: {why}" for name, why in doc["unavailable"].items()]
    out += ["", "| target | op | measured | goal | verdict |", "|---|---|--:|--:|---|"]
    for t in doc["targets"]:
        sign = _target_op(t)
        out.append(
            f"| `{t['case']}` | {t['op']} | {t['value']:.2f} {t['metric']} | {sign} {t['goal']:g} | {t['verdict']} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python ci/bench.py [options]``: the same as ``arrayquant bench``."""
    parser = argparse.ArgumentParser(prog="bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv), parser)
