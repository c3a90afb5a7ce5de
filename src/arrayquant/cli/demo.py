"""``arrayquant demo``: built-in weight-like data quantized with several schemes, quality and speed
in one table; ``--calibration`` adds a table per calibration, ``--write-checkpoint`` writes a small
synthetic checkpoint. It runs on NumPy and array-api-compat alone."""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import array_api_compat as compat
import numpy as np

from .._version import __version__
from ..backends import default, shim
from ..convert import asarray
from ..dequantize import dequantize
from ..errors import QuantizationError, ShapeError
from ..io.arrayquant.checkpoint import save_stream
from ..metrics import error_report
from ..quantize import quantize
from ..tensor import QuantizedTensor
from .common import CommandError, MiB, check_scheme, cli_message, output_folder, shown

__all__ = ["DEMO_LIMIT", "DEMO_SCHEMES", "demo_data", "run", "write_demo_checkpoint"]

DEMO_SCHEMES = (
    "q8s",
    "q8s:block32:f16",
    "q8f:block32:f16",
    "q4s:block32:f16",
    "q4s:block16:ue4m3:tensor:f32",
    "q4f:block4x8:bf16",
    "q2s:block64:f16",
    "mxfp8",
    "nvfp4",
    "mxfp4",
)


def demo_data(rows: int = 1024, cols: int = 1024, seed: int = 0) -> np.ndarray:
    """Weight-like f32 data: N(0, 0.02) with one outlier (25x) in about 2000 values, deterministic."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.02, size=(rows, cols)).astype(np.float32)
    outliers = rng.random(x.shape) < 5e-4
    x[outliers] *= np.float32(25.0)
    return x


DEMO_LIMIT = 1 << 28  # values the demo makes at most: 1 GiB of f32 data, a few GiB at its peak

_DEMO_NOTE = (
    "The data has outliers, as trained weights do: N(0, 0.02) with one value in about 2000 scaled 25x.\n"
    "A per-tensor scale (q8s) must stretch to the largest of them, so the many small values get few\n"
    "levels: 8 bits score no better than 4-bit block schemes, whose scales confine each outlier to its block."
)


def _best_seconds(fn: Callable[[], object], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _quantize_values(x: object, text: str) -> object:
    return shim.to_host(quantize(x, text).values)  # to_host waits for asynchronous devices


def _calibrated_values(x: object, text: str, calibration: str) -> object:
    return shim.to_host(quantize(x, text, calibration=calibration).values)


def _dequantize_host(qt: QuantizedTensor) -> object:
    return shim.to_host(dequantize(qt))


def run(args: argparse.Namespace) -> int:
    """``arrayquant demo``."""
    if args.write_checkpoint:
        return write_demo_checkpoint(args.write_checkpoint, demo_data)
    for text in args.schemes:  # refuse a bad scheme before any work or output
        check_scheme(text)
    valid = _calibrations_valid(args.schemes, args.calibrations)
    if args.rows * args.cols > DEMO_LIMIT:
        msg = (
            f"--rows {args.rows} --cols {args.cols} is {args.rows * args.cols * 4 / 2**30:.1f} GiB of float32 data; "
            f"the demo makes at most {DEMO_LIMIT:,} values (1 GiB): use smaller --rows/--cols"
        )
        raise CommandError(msg)
    backend = args.backend or default().name
    host = demo_data(args.rows, args.cols)
    x = asarray(host, backend=backend, device=args.device)
    gb = host.nbytes / 1e9
    print(f"arrayquant {__version__} demo: {host.shape[0]}x{host.shape[1]} float32 ({host.nbytes / 2**20:.1f} MiB)")
    print(_DEMO_NOTE)
    print(f"backend {backend}, device {shim.device_name(compat.device(x))}\n")  # the one the data is on
    header = (
        f"{'scheme':<30} {'bits/value':>10} {'SQNR dB':>8} {'max |err|':>10} {'quant GB/s':>10} {'dequant GB/s':>12}"
    )
    print(header)
    print("-" * len(header))
    for text in args.schemes:
        qt = quantize(x, text)
        report = error_report(host, shim.to_host(dequantize(qt)))
        tq = _best_seconds(functools.partial(_quantize_values, x, text), args.repeat)
        td = _best_seconds(functools.partial(_dequantize_host, qt), args.repeat)
        bits = 8 * qt.nbytes / host.size
        print(
            f"{text:<30} {bits:>10.3f} {report.sqnr:>8.2f} {report.max_abs_error:>10.2e} "
            f"{gb / tq:>10.3g} {gb / td:>12.3g}"  # significant digits: tiny demo sizes run far below 0.01
        )
    print("\nbits/value counts stored values, scales and the per-tensor scale (Burn byte layout).")
    if args.calibrations:
        _demo_calibrations(x, host, args, valid)
    else:
        print("arrayquant demo --calibration mse --calibration 4over6 shows what a search calibration gains.")
    return 0


def _calibrations_valid(schemes: Sequence[str], calibrations: Sequence[str]) -> dict[tuple[str, str], str]:
    """Why each (scheme, calibration) pair is refused ("" where it is valid), tried on one value;
    a calibration that no scheme takes is refused before any work, with the library's message."""
    why: dict[tuple[str, str], str] = {}
    for c in calibrations:
        first: QuantizationError | None = None
        for text in schemes:
            try:
                quantize(np.zeros((1, 1), np.float32), text, calibration=c)
                why[text, c] = ""
            except ShapeError:  # a packed axis one value lacks: decided on the data
                why[text, c] = ""
            except QuantizationError as exc:
                why[text, c] = f"{type(exc).__name__}: {exc}"
                first = first or exc
        if first is not None and all(why[t, c] for t in schemes):
            raise first
    return why


def _demo_calibrations(x: object, host: np.ndarray, args: argparse.Namespace, why: dict[tuple[str, str], str]) -> None:
    """The demo's second table: SQNR per scheme and calibration, its gain over MinMax and its time
    relative to MinMax's."""
    print("\nSQNR dB by calibration: (gain over minmax in dB, time relative to minmax's)")
    header = [f"{'scheme':<30}", f"{'minmax':>8}", *(f"{c:>22}" for c in args.calibrations)]
    print(" ".join(header))
    print("-" * len(" ".join(header)))
    refused: dict[str, str] = {}
    for text in args.schemes:
        base = error_report(host, shim.to_host(dequantize(quantize(x, text)))).sqnr
        t0 = _best_seconds(functools.partial(_quantize_values, x, text), args.repeat)
        cells = [f"{text:<30}", f"{base:>8.2f}"]
        for c in args.calibrations:
            if why[text, c]:
                refused.setdefault(c, why[text, c])
                cells.append(f"{'-':>22}")
                continue
            sqnr = error_report(host, shim.to_host(dequantize(quantize(x, text, calibration=c)))).sqnr
            t = _best_seconds(functools.partial(_calibrated_values, x, text, c), args.repeat)
            cells.append(f"{f'{sqnr:.2f} ({sqnr - base:+.2f}, {t / t0:.1f}x)':>22}")
        print(" ".join(cells))
    for c, reason in refused.items():
        print(f"{c}: '-' where the scheme does not take it, e.g. {cli_message(reason)}")


def write_demo_checkpoint(path: str, data: Callable[..., np.ndarray]) -> int:
    """A small f32 model checkpoint: two layers of 2-D weights, with 1-D norms and biases."""
    output_folder(path)
    hidden, mlp, seed = 256, 512, 0

    def vector(n: int, base: float) -> np.ndarray:
        nonlocal seed
        seed += 1
        return (base + data(1, n, seed)[0]).astype(np.float32)

    def matrix(rows: int, cols: int) -> np.ndarray:
        nonlocal seed
        seed += 1
        return data(rows, cols, seed)

    def layers() -> Iterator[tuple[str, np.ndarray]]:
        yield "embed_tokens.weight", matrix(512, hidden)
        for i in range(2):
            p = f"layers.{i}."
            yield p + "input_norm.weight", vector(hidden, 1.0)
            for proj in ("q", "k", "v", "o"):
                yield f"{p}attn.{proj}_proj.weight", matrix(hidden, hidden)
            yield p + "attn.o_proj.bias", vector(hidden, 0.0)
            yield p + "post_attn_norm.weight", vector(hidden, 1.0)
            yield p + "mlp.up_proj.weight", matrix(mlp, hidden)
            yield p + "mlp.up_proj.bias", vector(mlp, 0.0)
            yield p + "mlp.down_proj.weight", matrix(hidden, mlp)
        yield "norm.weight", vector(hidden, 1.0)

    tensors = dict(layers())  # a few MiB
    save_stream(path, tensors.items(), metadata={"source": "arrayquant demo --write-checkpoint"})
    size = Path(path).stat().st_size / MiB
    print(f"wrote {shown(path)}: {len(tensors)} float32 tensors ({size:.1f} MiB)")
    return 0
