"""One benchmark run: the cases it times, in order, and the ratios between their rows.

:func:`run` makes the input and calls :func:`run_cases`: the copy, the obvious forms, every
arrayquant case (checked against an independent reference, and beside its portable kernels with
:func:`portable_rows`), the search calibrations (:func:`calibration_cases`), the matmul paths
(:func:`matmul_cases`) and the peers; :func:`ratios` then sets each row's ratios to copy, NumPy,
the fastest peer and MinMax.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import fused
from ..backends import shim
from ..convert import asarray
from ..dequantize import dequantize
from ..quantize import quantize
from ..scheme import QuantScheme
from ..tensor import QuantizedTensor
from .harness import MIB, Bench, Result, digest, machine, make_sync, qt_bytes, reason, timed
from .jobs import ALL_CASES, BLOCK, BLOCK_FORM, FLOAT_BASELINE, FLOAT_PRESETS, TENSOR_FORM
from .peers import (
    PEER_BACKENDS,
    PEER_MAP,
    PEERS,
    float_forms,
    np_dequantize_block,
    np_dequantize_tensor,
    np_quantize_block,
    np_quantize_tensor,
)

__all__ = [
    "CALIBRATION_CASES",
    "MATMUL_COLUMNS",
    "MATMUL_SIZE",
    "MATMUL_WEIGHTS",
    "calibration_cases",
    "matmul_cases",
    "matmul_side",
    "portable_rows",
    "ratios",
    "run",
    "run_cases",
    "verify",
]

# Search calibrations timed beside MinMax (their target: mse at most 30x MinMax's time, default grid)
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
        run_cases(b, peers, log or (lambda _: None))
    ratios(b.results)
    return info, b.results, b.unavailable


def run_cases(b: Bench, peers: tuple[str, ...], log: Callable[[str], None]) -> None:
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
        minifloat_forms = float_forms(b) if b.backend == "numpy" else []
    except ImportError as exc:
        b.unavailable["numpy+ml_dtypes"] = reason(exc)
        minifloat_forms = []
    for p in minifloat_forms:
        b.pair(p)
    log("references done")

    fused_on = fused.available() if b.backend == "numpy" else fused.gpu_available()
    for scheme in ALL_CASES:
        qt = quantize(x, scheme)
        b.sync(qt)
        r = b.time(scheme, "quantize", "arrayquant", functools.partial(quantize, x, scheme), qt_bytes)
        r.check = verify(scheme, qt, host, (codes_t, np.asarray([scale_t])), (codes_b, scales_b))
        if b.backend == "numpy":
            b.digests[scheme] = digest(qt)
        y = dequantize(qt)
        b.time(scheme, "dequantize", "arrayquant", functools.partial(dequantize, qt), lambda y: y.nbytes)
        if fused_on and b.portable:
            portable_rows(b, scheme, qt, y)
        del qt, y
        log(f"{scheme} done")
    del codes_t, codes_b

    if b.calibrations:
        calibration_cases(b, log)
    if b.matmul:
        matmul_cases(b, log)
        from .gemv import gemv_cases

        gemv_cases(b, log)

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


def portable_rows(b: Bench, scheme: str, qt: QuantizedTensor, y: Any) -> None:
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


# matmul rows: a MATMUL_SIZE^2 weight quantized per tensor (and q8s per row) times a
# MATMUL_SIZE x MATMUL_COLUMNS f32 input; int8 rows quantize the input too (q8s, one scale per column).
# A smaller --size shrinks the weight to size x size (the tests' small runs).
MATMUL_SIZE = 4096
MATMUL_COLUMNS = 64
MATMUL_WEIGHTS = ("q8s", "q8s:block4096", "q4s", "q2s")


def matmul_side(size: int) -> int:
    """The matmul weight's side for a run of ``--size size``."""
    return min(MATMUL_SIZE, size)


def matmul_cases(b: Bench, log: Callable[[str], None]) -> None:
    """Each matmul path that applies, beside NumPy's matmul of the dequantized weight, on NumPy.

    Rows are kind ``matmul``: GB/s counts the f32 weight's bytes (what the quantized weight stands
    for); ``vs_numpy`` is NumPy's time over ours; ``check`` compares with NumPy's float64 product of
    the same dequantized operands (``close``: within 1e-5 of the largest output, ``differs`` past it).
    """
    if b.backend != "numpy":
        b.unavailable["matmul"] = f"matmul rows run with --backend numpy only, not {b.backend}"
        return
    from ..ops import linalg

    side = matmul_side(b.host.shape[0])
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
    from ..ops import linalg

    return linalg.matmul(wq, quantize(x, scheme), path="int8")


def calibration_cases(b: Bench, log: Callable[[str], None]) -> None:
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


def verify(scheme: str, qt: QuantizedTensor, host: np.ndarray, tensor: tuple[Any, Any], block: tuple[Any, Any]) -> str:
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


def ratios(results: list[Result]) -> None:
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
