"""How the benchmark measures: rows, timed calls, working sets, device syncs, digests and the machine.

:class:`Bench` holds one run's input and rows; :func:`timed` and :func:`extra_mib` time a call and
trace its memory; :func:`make_sync` waits for device work; :func:`digest` hashes a quantized
tensor's stored fields; :func:`machine`, :func:`versions`, :func:`one_thread` and :func:`pinned`
describe and constrain the process the numbers come from.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..backends import shim
from ..quantize import quantize
from ..tensor import QuantizedTensor

__all__ = [
    "MIB",
    "PEER_PACKAGES",
    "THREAD_VARS",
    "XLA_ONE_THREAD",
    "Bench",
    "Pair",
    "Result",
    "digest",
    "extra_mib",
    "machine",
    "make_sync",
    "no_sync",
    "one_thread",
    "pinned",
    "qt_bytes",
    "reason",
    "timed",
    "versions",
]

MIB = 1 << 20
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"
PEER_PACKAGES = ("ml_dtypes", "gguf", "torch", "bitsandbytes", "jax", "jaxlib", "cupy", "cupy-cuda12x", "cupy-cuda13x")


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
    return no_sync


def no_sync(out: Any) -> None:
    """The sync of a synchronous backend (NumPy): nothing to wait for."""
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
