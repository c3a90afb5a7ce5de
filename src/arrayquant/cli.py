"""The ``arrayquant`` command: ``demo`` (the main job), ``backends``, ``bench``, and checkpoint tools.

``quantize``, ``dequantize``, ``inspect`` and ``compare`` work on safetensors checkpoints; their
work is in :mod:`arrayquant.cli_commands`, which imports tqdm and matplotlib only when a subcommand
needs them, so ``demo`` and ``backends`` run on NumPy and array-api-compat alone.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from . import __version__, bench
from . import cli_commands as commands
from .backends import available, default, shim
from .convert import asarray
from .dequantize import dequantize
from .errors import BackendUnavailableError, DeviceError, QuantizationError
from .invariants import plan_for
from .quantize import quantize
from .scheme import QuantScheme
from .tensor import QuantizedTensor

__all__ = ["DEMO_SCHEMES", "demo_data", "main"]

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
    """Weight-like f32 data: N(0, 0.02) with one outlier in about 2000 values, deterministic."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.02, size=(rows, cols)).astype(np.float32)
    outliers = rng.random(x.shape) < 5e-4
    x[outliers] *= np.float32(25.0)
    return x


def _best_seconds(fn: Callable[[], object], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _quantize_values(x: object, text: str) -> object:
    return shim.to_host(quantize(x, text).values)  # to_host waits for asynchronous devices


def _dequantize_host(qt: QuantizedTensor) -> object:
    return shim.to_host(dequantize(qt))


def _demo(args: argparse.Namespace) -> int:
    if args.write_checkpoint:
        return commands.write_demo_checkpoint(args.write_checkpoint, demo_data)
    for text in args.schemes:  # refuse a bad scheme before any work or output
        plan_for(QuantScheme.parse(text))
    backend = args.backend or default().name
    host = demo_data(args.rows, args.cols)
    x = asarray(host, backend=backend, device=args.device)
    gb = host.nbytes / 1e9
    print(f"arrayquant {__version__} demo: {host.shape[0]}x{host.shape[1]} float32 ({host.nbytes / 2**20:.1f} MiB) ")
    print(f"backend {backend}, device {shim.native_device(backend, args.device) or 'default'}\n")
    header = (
        f"{'scheme':<30} {'bits/value':>10} {'SQNR dB':>8} {'max |err|':>10} {'quant GB/s':>10} {'dequant GB/s':>12}"
    )
    print(header)
    print("-" * len(header))
    signal = float(np.sum(host.astype(np.float64) ** 2))
    for text in args.schemes:
        qt = quantize(x, text)
        y = shim.to_host(dequantize(qt)).astype(np.float64)
        err = y - host
        noise = float(np.sum(err**2))
        sqnr = math.inf if noise == 0 else 10 * math.log10(signal / noise)
        tq = _best_seconds(functools.partial(_quantize_values, x, text), args.repeat)
        td = _best_seconds(functools.partial(_dequantize_host, qt), args.repeat)
        bits = 8 * qt.nbytes / host.size
        print(f"{text:<30} {bits:>10.3f} {sqnr:>8.2f} {np.abs(err).max():>10.2e} {gb / tq:>10.2f} {gb / td:>12.2f}")
    print("\nbits/value counts stored values, scales and the per-tensor scale (Burn byte layout).")
    return 0


def _backends(_: argparse.Namespace) -> int:
    print(f"{'backend':<18} {'installed':<10} {'usable':<7} devices / reason")
    for info in available():
        detail = ", ".join(info.devices) if info.usable else info.reason
        print(f"{info.name:<18} {info.installed!s:<10} {info.usable!s:<7} {detail}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arrayquant", description="Burn's tensor quantization on any Array API backend"
    )
    parser.add_argument("--version", action="version", version=f"arrayquant {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="quantize built-in weight-like data with several schemes and report quality")
    demo.add_argument("--backend", help="array backend (default: aq.backends.default())")
    demo.add_argument("--device", help="device such as cpu, cuda, cuda:1")
    demo.add_argument("--rows", type=int, default=1024)
    demo.add_argument("--cols", type=int, default=1024)
    demo.add_argument("--repeat", type=int, default=3, help="timing runs per scheme (best is reported)")
    demo.add_argument("--scheme", dest="schemes", action="append", help="scheme text; repeat for several")
    demo.add_argument(
        "--write-checkpoint", metavar="PATH", help="write a small synthetic f32 model checkpoint to PATH and exit"
    )
    demo.set_defaults(func=_demo)
    back = sub.add_parser("backends", help="list array backends, whether they are usable, and their devices")
    back.set_defaults(func=_backends)
    _checkpoint_parsers(sub)
    perf = sub.add_parser(
        "bench",
        help="measure quantize/dequantize GB/s on this machine beside copy, plain NumPy and installed peers",
        description=bench.__doc__.splitlines()[0] if bench.__doc__ else None,
    )
    bench.add_arguments(perf)
    perf.set_defaults(func=lambda a: bench.run_from_args(a, perf))
    return parser


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        msg = f"expected a whole number >= 0, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return n


def _checkpoint_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = sub.add_parser(
        "quantize",
        help="quantize the weights of a safetensors checkpoint, one tensor at a time",
        description="Quantize the floating tensors that match (by default the 2-D weights, not norms or biases) "
        "and copy the rest unchanged.",
    )
    q.add_argument("input", metavar="IN", help="input .safetensors file")
    q.add_argument("output", metavar="OUT", help="output .safetensors file (written atomically)")
    q.add_argument("--scheme", required=True, help="scheme text, e.g. q4s:block32:f16 or nvfp4")
    q.add_argument("--include", action="append", default=[], metavar="GLOB", help="quantize tensors named so (repeat)")
    q.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="never quantize these (repeat)")
    q.add_argument("--min-size", type=_count, default=0, metavar="N", help="only tensors of N elements or more")
    q.add_argument("--backend", help="array backend (default: aq.backends.default())")
    q.add_argument("--device", help="device such as cpu, cuda, cuda:1")
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(
        func=lambda a: commands.quantize_checkpoint(
            a.input,
            a.output,
            a.scheme,
            include=a.include,
            exclude=a.exclude,
            min_size=a.min_size,
            backend=a.backend,
            device=a.device,
            quiet=a.quiet,
        )
    )
    d = sub.add_parser("dequantize", help="turn the quantized tensors of a checkpoint back into floats")
    d.add_argument("input", metavar="IN")
    d.add_argument("output", metavar="OUT")
    d.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="default: each tensor's original dtype")
    d.set_defaults(func=lambda a: commands.dequantize_checkpoint(a.input, a.output, a.dtype))
    i = sub.add_parser("inspect", help="list the tensors of a checkpoint: shape, scheme or dtype, bytes, scales")
    i.add_argument("file", metavar="FILE")
    i.set_defaults(func=lambda a: commands.inspect_checkpoint(a.file))
    c = sub.add_parser("compare", help="per-tensor SQNR and maximum error of a quantized checkpoint")
    c.add_argument("original", metavar="ORIGINAL")
    c.add_argument("quantized", metavar="QUANTIZED")
    c.add_argument("--plot", metavar="FILE.png", help="also draw a histogram of the errors (matplotlib)")
    c.set_defaults(func=lambda a: commands.compare_checkpoints(a.original, a.quantized, a.plot))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a library error, 2 usage)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "schemes", "unset") is None:
        args.schemes = list(DEMO_SCHEMES)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # output piped into a pager or `head` that closed early
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter's final flush quiet
        return 0
    except (QuantizationError, BackendUnavailableError, DeviceError) as exc:
        if args.debug:
            raise
        print(f"arrayquant: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a missing input, an unwritable output folder, a full disk
        if args.debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"arrayquant: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
