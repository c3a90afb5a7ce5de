"""Quantize/dequantize throughput and working set of arrayquant on NumPy, beside plain NumPy.

Run ``python ci/bench.py`` (``--help`` for options). Throughput is GB/s of f32 input (input bytes
over seconds, 1 GB = 1e9 bytes), median and best of ``--repeat`` runs, single-threaded. The
references, measured in the same run: ``numpy.copyto`` of the same bytes (memory bandwidth) and
the obvious NumPy form of int8 symmetric quantization (per tensor, and per block of 32 with F16
scales), and for the float presets (nvfp4, mxfp4, mxfp8) the obvious NumPy + ml_dtypes form: per
block, amax, a scale rounded up onto the scale grid the simple way, divide, clip, ``astype`` to the
ml_dtypes minifloat (4-bit codes left one per byte, unpacked). Targets are informational: the script
exits 0 whether they pass or not.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # one core; OPENBLAS_CORETYPE is left as the environment sets it

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import arrayquant as aq  # noqa: E402

BLOCK = 32
MIB = 1 << 20
AQ_SCHEMES = ("q8s:native", "q8s", "q8s:block32:f16:native", "q8s:block32:f16", "q4s:block32:f16")
INT8_BLOCK_SCHEMES = ("q8s:block32:f16:native", "q8s:block32:f16")
FLOAT_PRESETS = ("nvfp4", "mxfp4", "mxfp8")
FLOAT_BASELINE = "numpy+ml_dtypes "  # + preset: the case name of its NumPy + ml_dtypes form
TARGET_QUANTIZE_GBPS = 1.0  # per-block int8, one core
TARGET_DEQUANTIZE_GBPS = 2.0
TARGET_NVFP4_QUANTIZE_GBPS = 0.5  # nvfp4, one core
TARGET_NVFP4_DEQUANTIZE_GBPS = 1.5
TARGET_EXTRA_MIB = 64.0  # working set beyond input and output, for the 8192 x 8192 input


# --- the obvious NumPy forms ------------------------------------------------------------------


def np_quantize_tensor(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    scale = np.float32(np.abs(x).max() * np.float32(2) / np.float32(254))
    return np.clip(np.round(x / scale), -127, 127).astype(np.int8), scale


def np_dequantize_tensor(codes: np.ndarray, scale: np.float32) -> np.ndarray:
    return codes.astype(np.float32) * scale


def f16_round_up(s: np.ndarray) -> np.ndarray:
    """``s`` rounded up onto the F16 grid, as f32: cast, then step up where the cast went below."""
    h = s.astype(np.float16)
    h = np.where(h.astype(np.float32) < s, np.nextafter(h, np.float16(np.inf)), h)
    return h.astype(np.float32)


def np_quantize_block(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    scales = f16_round_up(np.abs(xb).max(axis=-1) * np.float32(2) / np.float32(254))
    codes = np.clip(np.round(xb / scales[..., None]), -127, 127).astype(np.int8)
    return codes.reshape(x.shape), scales


def np_dequantize_block(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    cb = codes.reshape(*codes.shape[:-1], codes.shape[-1] // BLOCK, BLOCK)
    return (cb.astype(np.float32) * scales[..., None]).reshape(codes.shape)


# --- the obvious NumPy + ml_dtypes forms of the float presets ---------------------------------


@dataclass(frozen=True)
class FloatForm:
    block: int
    value: Any  # the ml_dtypes minifloat of the codes
    max: float  # its largest finite magnitude
    ue4m3: bool  # UE4M3 block scales under an f32 per-tensor scale (nvfp4), else UE8M0


FLOAT_FORMS = {
    "nvfp4": FloatForm(16, ml_dtypes.float4_e2m1fn, 6.0, ue4m3=True),
    "mxfp4": FloatForm(32, ml_dtypes.float4_e2m1fn, 6.0, ue4m3=False),
    "mxfp8": FloatForm(32, ml_dtypes.float8_e4m3fn, 448.0, ue4m3=False),
}


def ue4m3_round_up(s: np.ndarray) -> np.ndarray:
    """``s`` (at most 448) rounded up onto the UE4M3 grid, as f32: cast, then step up where it went below."""
    h = np.minimum(s, np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
    bits = h.view(np.uint8)
    h = np.where(h.astype(np.float32) < s, (bits + np.uint8(1)).view(ml_dtypes.float8_e4m3fn), h)
    return h.astype(np.float32)


def np_quantize_float(x: np.ndarray, form: FloatForm) -> tuple[np.ndarray, np.ndarray]:
    """Minifloat codes (ml_dtypes, one per element) and the f32 effective scale per block."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // form.block, form.block)
    s = np.abs(xb).max(axis=-1) / np.float32(form.max)
    if form.ue4m3:
        g = np.float32(s.max() / np.float32(448))
        scales = ue4m3_round_up(s / g) * g
    else:
        scales = np.exp2(np.ceil(np.log2(s)))  # UE8M0: the next power of two
    y = np.clip(xb / scales[..., None], -form.max, form.max)
    return y.astype(form.value).reshape(x.shape), scales


def np_dequantize_float(codes: np.ndarray, scales: np.ndarray, form: FloatForm) -> np.ndarray:
    cb = codes.reshape(*codes.shape[:-1], codes.shape[-1] // form.block, form.block)
    return (cb.astype(np.float32) * scales[..., None]).reshape(codes.shape)


# --- measurement ------------------------------------------------------------------------------


@dataclass
class Result:
    case: str
    op: str
    times_s: list[float]
    gbps_median: float
    gbps_best: float
    vs_copy: float = 0.0
    vs_numpy: float | None = None
    extra_mib: float | None = None


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm-up: imports, caches, first-touch of the allocator's pools
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        del out
    return times


def extra_mib(fn: Callable[[], Any], out_bytes: Callable[[Any], int]) -> float:
    """Peak memory traced during ``fn`` beyond its output (NumPy reports to tracemalloc)."""
    tracemalloc.start()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak - out_bytes(out)) / MIB


def qt_bytes(qt: aq.QuantizedTensor) -> int:
    return int(qt.values.nbytes + qt.scales.nbytes)


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "numpy": np.__version__,
        "arrayquant": aq.__version__,
    }


def run(size: int, repeat: int) -> list[Result]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, size), dtype=np.float32) * np.float32(0.05)
    nbytes = x.nbytes
    results: list[Result] = []

    def add(case: str, op: str, fn: Callable[[], Any], out_bytes: Callable[[Any], int] | None = None) -> None:
        times = timed(fn, repeat)
        mem = extra_mib(fn, out_bytes) if out_bytes is not None else None
        gb = nbytes / 1e9
        results.append(Result(case, op, times, gb / statistics.median(times), gb / min(times), extra_mib=mem))

    dst = np.empty_like(x)
    add("numpy.copyto", "copy", lambda: np.copyto(dst, x))

    codes_t, scale_t = np_quantize_tensor(x)
    codes_b, scales_b = np_quantize_block(x)
    pair_bytes = lambda r: int(r[0].nbytes + np.asarray(r[1]).nbytes)
    add("numpy per-tensor", "quantize", lambda: np_quantize_tensor(x), pair_bytes)
    add("numpy per-tensor", "dequantize", lambda: np_dequantize_tensor(codes_t, scale_t), lambda y: y.nbytes)
    add("numpy block32 f16", "quantize", lambda: np_quantize_block(x), pair_bytes)
    add("numpy block32 f16", "dequantize", lambda: np_dequantize_block(codes_b, scales_b), lambda y: y.nbytes)

    for scheme in AQ_SCHEMES:
        qt = aq.quantize(x, scheme)
        _verify(scheme, qt, (codes_t, np.asarray([scale_t])) if ":block" not in scheme else (codes_b, scales_b))
        add(scheme, "quantize", functools.partial(aq.quantize, x, scheme), qt_bytes)
        add(scheme, "dequantize", functools.partial(aq.dequantize, qt), lambda y: y.nbytes)
        del qt

    for preset in FLOAT_PRESETS:
        form = FLOAT_FORMS[preset]
        codes_f, scales_f = np_quantize_float(x, form)
        baseline = FLOAT_BASELINE + preset
        add(baseline, "quantize", functools.partial(np_quantize_float, x, form), pair_bytes)
        add(baseline, "dequantize", functools.partial(np_dequantize_float, codes_f, scales_f, form), lambda y: y.nbytes)
        del codes_f, scales_f
        qt = aq.quantize(x, preset)
        _verify_float(preset, qt, x)
        add(preset, "quantize", functools.partial(aq.quantize, x, preset), qt_bytes)
        add(preset, "dequantize", functools.partial(aq.dequantize, qt), lambda y: y.nbytes)
        del qt

    copy = results[0].gbps_median
    for r in results:
        r.vs_copy = r.gbps_median / copy
        ref = _numpy_reference(r.case)
        if ref is not None:
            base = next(b for b in results if b.case == ref and b.op == r.op)
            r.vs_numpy = r.gbps_median / base.gbps_median
    return results


def _numpy_reference(case: str) -> str | None:
    if case.startswith("numpy"):
        return None
    if case in FLOAT_PRESETS:
        return FLOAT_BASELINE + case
    return "numpy block32 f16" if ":block" in case else "numpy per-tensor"


def _verify(scheme: str, qt: aq.QuantizedTensor, ref: tuple[np.ndarray, np.ndarray]) -> None:
    """int8 codes and stored scales equal the obvious NumPy form's, bit for bit."""
    if scheme.startswith("q4s"):
        return  # a 4-bit grid: no int8 reference
    codes = np.asarray(qt.codes())
    assert np.array_equal(codes, ref[0]), f"{scheme}: codes differ from the NumPy form"
    assert np.array_equal(np.asarray(qt.scales), ref[1]), f"{scheme}: scales differ from the NumPy form"


def _verify_float(preset: str, qt: aq.QuantizedTensor, x: np.ndarray) -> None:
    """mxfp8 codes equal ml_dtypes' E4M3 cast of ``clip(x / eff)`` over the stored scales, bit for bit."""
    if preset != "mxfp8":
        return  # the 4-bit presets: timed, not checked here
    form = FLOAT_FORMS[preset]
    eff = np.repeat(np.asarray(qt.scales), form.block, axis=-1)
    ref = np.clip(x / eff, -form.max, form.max).astype(form.value).view(np.uint8)
    codes = np.asarray(qt.codes())
    assert codes.dtype == np.uint8, f"{preset}: codes are {codes.dtype}, not uint8"
    assert np.array_equal(codes, ref), f"{preset}: codes differ from ml_dtypes' float8_e4m3fn cast"


# --- report -----------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def targets(results: list[Result]) -> list[str]:
    lines = []
    for r in results:
        if r.case in INT8_BLOCK_SCHEMES:
            goal = TARGET_QUANTIZE_GBPS if r.op == "quantize" else TARGET_DEQUANTIZE_GBPS
            ok = r.gbps_median >= goal
            lines.append(f"{r.case:<24} {r.op:<10} {r.gbps_median:6.2f} GB/s median >= {goal:.1f}  {verdict(ok)}")
        if r.case == "nvfp4":
            goal = TARGET_NVFP4_QUANTIZE_GBPS if r.op == "quantize" else TARGET_NVFP4_DEQUANTIZE_GBPS
            ok = r.gbps_median >= goal
            lines.append(f"{r.case:<24} {r.op:<10} {r.gbps_median:6.2f} GB/s median >= {goal:.1f}  {verdict(ok)}")
        if ":block" in r.case and r.extra_mib is not None:
            ok = r.extra_mib <= TARGET_EXTRA_MIB
            line = f"{r.case:<24} {r.op:<10} {r.extra_mib:6.1f} MiB extra  <= {TARGET_EXTRA_MIB:.0f}  {verdict(ok)}"
            lines.append(line)
    return lines


def report(size: int, repeat: int, results: list[Result]) -> str:
    mib = size * size * 4 / MIB
    head = [f"input: {size}x{size} float32 ({mib:.0f} MiB), N(0,1)*0.05; {repeat} runs, single-threaded"]
    cols = f"{'case':<24} {'op':<10} {'median':>8} {'best':>8} {'x copy':>7} {'x numpy':>8} {'extra MiB':>10}"
    rows = [cols, "-" * len(cols)]
    for r in results:
        mem = "" if r.extra_mib is None else f"{r.extra_mib:.1f}"
        vs_np = "" if r.vs_numpy is None else f"{r.vs_numpy:.2f}"
        rows.append(
            f"{r.case:<24} {r.op:<10} {r.gbps_median:8.2f} {r.gbps_best:8.2f} {r.vs_copy:7.2f} {vs_np:>8} {mem:>10}"
        )
    notes = [
        "GB/s of f32 input (1e9 bytes/s); ratios use medians; 'x numpy' compares with the obvious NumPy form",
        "(block cases, q4s included, against the int8 block32 form; float presets against their NumPy +",
        "ml_dtypes form, whose 4-bit codes stay one per byte); extra MiB = tracemalloc peak - output.",
        "targets (informational, stated for 8192x8192 on one core; judged on the median):",
    ]
    return "\n".join([*head, "", *rows, "", *notes, *targets(results)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192, help="side of the square input (multiple of 32)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case (after one warm-up)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.size <= 0 or args.size % BLOCK:
        parser.error(f"--size must be a positive multiple of {BLOCK}, got {args.size}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    info = machine()
    print("\n".join(f"{k}: {v}" for k, v in info.items()) + "\n", flush=True)
    results = run(args.size, args.repeat)
    print(report(args.size, args.repeat, results))
    if hasattr(os, "getloadavg"):
        print(f"loadavg at end: {os.getloadavg()}")
    if args.json is not None:
        doc = {"machine": info, "size": args.size, "repeat": args.repeat, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
