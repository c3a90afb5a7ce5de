"""The ``arrayquant`` command: ``demo`` (the main job), ``backends``, ``bench``, and checkpoint tools.

``quantize``, ``dequantize``, ``inspect`` and ``compare`` work on safetensors files, Hugging Face
model folders, GGUF and Burnpack files (an OUT named ``.safetensors``, ``.gguf`` or ``.bpk`` is
written in that format, or refused); their work is in :mod:`arrayquant.cli_commands`, which
imports tqdm and matplotlib only when a subcommand needs them, so ``demo`` and ``backends`` run on
NumPy and array-api-compat alone.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

import array_api_compat as compat
import numpy as np

from . import __version__, bench
from . import cli_commands as commands
from .backends import available, default, shim
from .convert import asarray
from .dequantize import dequantize
from .errors import BackendUnavailableError, DeviceError, QuantizationError, ShapeError
from .io.formats import detect
from .metrics import error_report
from .quantize import quantize
from .scheme import QuantScheme
from .tensor import QuantizedTensor

__all__ = ["DEMO_SCHEMES", "cli_message", "demo_data", "main"]

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


def _demo(args: argparse.Namespace) -> int:
    if args.write_checkpoint:
        return commands.write_demo_checkpoint(args.write_checkpoint, demo_data)
    for text in args.schemes:  # refuse a bad scheme before any work or output
        commands.check_scheme(text)
    valid = _calibrations_valid(args.schemes, args.calibrations)
    if args.rows * args.cols > DEMO_LIMIT:
        msg = (
            f"--rows {args.rows} --cols {args.cols} is {args.rows * args.cols * 4 / 2**30:.1f} GiB of float32 data; "
            f"the demo makes at most {DEMO_LIMIT:,} values (1 GiB): use smaller --rows/--cols"
        )
        raise commands.CommandError(msg)
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


def _backends(_: argparse.Namespace) -> int:
    print(f"{'backend':<18} {'installed':<10} {'usable':<7} devices / reason")
    for info in available():
        detail = ", ".join(info.devices) if info.usable else info.reason
        print(f"{info.name:<18} {info.installed!s:<10} {info.usable!s:<7} {detail}")
    from .fused.registry import describe

    print(f"\n{'fused kernels':<18} state")
    for kernels, state in describe():
        print(f"{kernels:<18} {state}")
    return 0


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Show each option's default, except empty ones (None, False, no repeats) and ones the help gives."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if _quiet_default(action):
            return action.help
        return super()._get_help_string(action)


def _quiet_default(action: argparse.Action) -> bool:
    """Whether the help need not show ``action``'s default."""
    empty = action.default is None or action.default is False or action.default == []
    return empty or action.default is argparse.SUPPRESS or "default" in (action.help or "")


def _subparser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, **kwargs: object
) -> argparse.ArgumentParser:
    """A subcommand that shows defaults and takes ``--debug`` after its name too."""
    parser: argparse.ArgumentParser = sub.add_parser(name, formatter_class=_Help, **kwargs)  # type: ignore[arg-type]
    # SUPPRESS: given here it sets args.debug, absent it leaves the top level's value alone
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
    return parser


def _positive(text: str) -> int:
    n = _count(text)
    if n == 0:
        msg = "expected a whole number >= 1, got 0"
        raise argparse.ArgumentTypeError(msg)
    return n


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arrayquant", description="Burn's tensor quantization on any Array API backend", formatter_class=_Help
    )
    parser.add_argument("--version", action="version", version=f"arrayquant {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = _subparser(sub, "demo", help="quantize built-in weight-like data with several schemes and report quality")
    demo.add_argument("--backend", help="array backend (default: aq.backends.default())")
    demo.add_argument("--device", help="device such as cpu, cuda, cuda:1 (default: the backend's)")
    demo.add_argument("--rows", type=_positive, default=1024, help="rows of the f32 demo data")
    demo.add_argument("--cols", type=_positive, default=1024, help="columns of the f32 demo data")
    demo.add_argument("--repeat", type=_positive, default=3, help="timing runs per scheme (best is reported)")
    demo.add_argument(
        "--scheme",
        dest="schemes",
        action="append",
        metavar="SCHEME",
        help=f"scheme text; repeat for several (default: {', '.join(DEMO_SCHEMES)})",
    )
    demo.add_argument(
        "--calibration",
        dest="calibrations",
        action="append",
        default=[],
        metavar="TEXT",
        help="also quantize with this calibration (mse, percentile:99.5, 4over6, ...) and show its SQNR, gain "
        "and time beside minmax's, per scheme (repeat)",
    )
    demo.add_argument(
        "--write-checkpoint", metavar="PATH", help="write a small synthetic f32 model checkpoint to PATH and exit"
    )
    demo.set_defaults(func=_demo)
    back = _subparser(sub, "backends", help="list array backends, whether they are usable, and their devices")
    back.set_defaults(func=_backends)
    _checkpoint_parsers(sub)
    perf = _subparser(
        sub,
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


_SCHEME_HELP = (
    "scheme text: a value, then options separated by ':', e.g. q8s, q4s:block32:f16, q4s:block16:ue4m3:tensor:f32, "
    "or a preset: nvfp4, mxfp8, mxfp4, nf4"
)


_SUFFIX_FORMAT = {".safetensors": "arrayquant", ".gguf": "gguf", ".bpk": "burnpack"}
_FORMAT_NAME = {"arrayquant": "safetensors", "gguf": "GGUF", "burnpack": "Burnpack", "compressed-tensors": "folder"}
_SUFFIX = {"arrayquant": ".safetensors", "gguf": ".gguf", "burnpack": ".bpk"}
_GGUF_SOURCE = (
    "GGUF files come from llama.cpp's converters (convert_hf_to_gguf.py), which add the model's "
    "architecture and tokenizer; arrayquant re-quantizes a GGUF file given as IN"
)


def _named_format(output: str) -> str | None:
    """The format OUT's suffix names (``.safetensors``, ``.gguf``, ``.bpk``), or None."""
    return _SUFFIX_FORMAT.get(Path(output).suffix.lower())


def _out_format(kind: str, output: str) -> str:
    """``--format`` by default: the input's own format, or for safetensors the output's suffix."""
    if kind in ("gguf", "burnpack"):
        return kind
    return "burnpack" if Path(output).suffix.lower() == ".bpk" else "arrayquant"


def _folder_out(a: argparse.Namespace, fmt: str, named: str | None) -> None:
    """Refuse a model folder IN whose OUT or ``--format`` asks for one file, with the command that writes it."""
    src, out = commands.shown(a.input), commands.shown(a.output)
    if "gguf" in (fmt, named):
        f16 = commands.shown(shlex.quote(commands._with_suffix(a.output, "-f16.gguf")))
        msg = (
            f"IN {src} is a model folder and OUT {out} a GGUF file, which arrayquant does not write from a folder: "
            f"{_GGUF_SOURCE}. Convert the folder with llama.cpp (python convert_hf_to_gguf.py {src} --outtype f16 "
            f"--outfile {f16}), then quantize that file: arrayquant quantize {f16} "
            f"{commands.shown(shlex.quote(a.output))} --scheme {commands.shown(shlex.quote(a.scheme))}"
        )
        raise commands.CommandError(msg)
    if fmt == "compressed-tensors":  # OUT named .safetensors or .bpk
        assert named is not None
        msg = (
            f"IN {src} is a model folder, which quantize writes as a compressed-tensors folder, and OUT {out} "
            f"names a {_FORMAT_NAME[named]} file: name a new folder, or for one {_FORMAT_NAME[named]} file, "
            "quantize the weights: " + commands.weights_file_command(a.input, a.output, a.scheme)
        )
        raise commands.CommandError(msg)
    target = a.output if named == fmt else commands._with_suffix(a.output, _SUFFIX[fmt])
    msg = (
        f"IN {src} is a model folder, which quantize writes as a compressed-tensors folder (drop --format "
        f"{fmt}); for one {_FORMAT_NAME[fmt]} file, quantize the weights: "
        + commands.weights_file_command(a.input, target, a.scheme)
    )
    raise commands.CommandError(msg)


def _check_out_name(a: argparse.Namespace, kind: str, fmt: str) -> None:
    """Refuse an OUT whose suffix names another format than the one quantize would write there."""
    named = _named_format(a.output)
    if kind == "folder" and (fmt != "compressed-tensors" or named is not None):
        _folder_out(a, fmt, named)
    if named is None or named == fmt:
        return
    out = commands.shown(a.output)
    if fmt == "compressed-tensors":
        msg = (
            f"--format compressed-tensors writes a model folder, and OUT {out} names a {_FORMAT_NAME[named]} "
            f"file: name a new folder (without {Path(a.output).suffix})"
        )
    elif kind in ("gguf", "burnpack") and fmt == kind:
        msg = (
            f"IN {commands.shown(a.input)} is a {kind} file: quantize writes {kind} from it, and OUT {out} names a "
            f"{_FORMAT_NAME[named]} file; name OUT with {_SUFFIX[kind]}, or turn IN into safetensors with "
            f"arrayquant dequantize first"
        )
    elif named == "gguf":
        msg = _GGUF_SOURCE
    else:
        given = f"--format {fmt}" if a.format else f"IN {commands.shown(a.input)}"
        msg = (
            f"OUT {out} names a {_FORMAT_NAME[named]} file but {given} makes quantize write "
            f"{_FORMAT_NAME[fmt]}: name OUT with {_SUFFIX.get(fmt, '')}, or drop --format"
        )
    raise commands.CommandError(msg)


def _quantize(a: argparse.Namespace) -> int:
    source = Path(a.input)
    kind = detect(source) if source.exists() else "arrayquant"  # a missing IN is reported further on
    if source.is_dir():
        kind = "folder"
    fmt = a.format or ("compressed-tensors" if kind == "folder" else _out_format(kind, a.output))
    if kind in ("gguf", "burnpack") and fmt != kind:
        msg = (
            f"IN {commands.shown(a.input)} is a {kind} file: quantize writes {kind} from it; turn it into "
            "safetensors with arrayquant dequantize first"
        )
        raise commands.CommandError(msg)
    if fmt == "gguf" and kind not in ("gguf", "folder"):
        raise commands.CommandError(_GGUF_SOURCE)
    _check_out_name(a, kind, fmt)
    arrayquant_only = a.min_size or a.backend or a.device or a.nonfinite != "error"
    if a.requantize and kind not in ("gguf", "burnpack"):
        msg = (
            "--requantize applies to GGUF and Burnpack IN; turn a quantized safetensors file or model folder "
            "into floats with arrayquant dequantize, then quantize that"
        )
        raise commands.CommandError(msg)
    if fmt == "compressed-tensors":
        if arrayquant_only:
            msg = "--min-size, --backend, --device and --nonfinite apply to --format arrayquant only"
            raise commands.CommandError(msg)
        return commands.quantize_model_folder(
            a.input,
            a.output,
            a.scheme,
            include=a.include,
            exclude=a.exclude,
            quiet=a.quiet,
            max_shard_size=a.max_shard_size,
            calibration=a.calibration,
            importance=a.importance,
            fused_shards=not a.no_fused_shards,
        )
    for given, flag in ((a.max_shard_size is not None, "--max-shard-size"), (a.no_fused_shards, "--no-fused-shards")):
        if given:
            msg = f"{flag} applies to --format compressed-tensors only (model folders)"
            raise commands.CommandError(msg)
    if kind in ("gguf", "burnpack"):
        if arrayquant_only:
            msg = f"--min-size, --backend, --device and --nonfinite do not apply to {kind} files"
            raise commands.CommandError(msg)
        return commands.quantize_format_file(
            kind,
            a.input,
            a.output,
            a.scheme,
            include=a.include,
            exclude=a.exclude,
            quiet=a.quiet,
            calibration=a.calibration,
            importance=a.importance,
            requantize=a.requantize,
        )
    return commands.quantize_checkpoint(
        a.input,
        a.output,
        a.scheme,
        out_format=fmt,
        include=a.include,
        exclude=a.exclude,
        min_size=a.min_size,
        backend=a.backend,
        device=a.device,
        quiet=a.quiet,
        nonfinite=a.nonfinite,
        calibration=a.calibration,
        importance=a.importance,
    )


def _dequantize(a: argparse.Namespace) -> int:
    source = Path(a.input)
    kind = detect(source) if source.exists() else "arrayquant"  # a missing IN is reported further on
    named = _named_format(a.output)
    src, out = commands.shown(a.input), commands.shown(a.output)
    if kind == "compressed-tensors":
        if source.is_dir() and named is not None:
            msg = f"IN {src} is a model folder: dequantize writes a float model folder, and OUT {out} names a file"
            raise commands.CommandError(msg + "; name a new folder")
        if named not in (None, "arrayquant"):
            msg = (
                f"IN {src} is a compressed-tensors file: dequantize writes a float safetensors file from it, and "
                f"OUT {out} names a {_FORMAT_NAME[named]} file; name OUT with .safetensors"
            )
            raise commands.CommandError(msg)
        return commands.dequantize_model_folder(a.input, a.output, a.dtype)
    if kind in ("gguf", "burnpack"):
        if named == kind:
            return commands.dequantize_same_format(kind, a.input, a.output, a.dtype)
        if named not in (None, "arrayquant"):
            msg = (
                f"IN {src} is a {kind} file: dequantize writes {kind} (OUT named {_SUFFIX[kind]}) or safetensors "
                f"from it, and OUT {out} names a {_FORMAT_NAME[named]} file; name OUT with {_SUFFIX[kind]} or "
                ".safetensors"
            )
            raise commands.CommandError(msg)
        return commands.dequantize_file(a.input, a.output, a.dtype)
    if named == "gguf":
        raise commands.CommandError(_GGUF_SOURCE)
    return commands.dequantize_checkpoint(a.input, a.output, a.dtype, out_format=named or "arrayquant")


def _checkpoint_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = _subparser(
        sub,
        "quantize",
        help="quantize the weights of a safetensors file, model folder, GGUF or Burnpack file, one tensor at a time",
        description="Quantize the floating tensors that match (by default the 2-D weights, not norms or biases) "
        "and copy the rest unchanged. IN is a .safetensors file, a Hugging Face model folder, a .gguf or a .bpk "
        "file; OUT is written in the format --format says, and a suffix of OUT (.safetensors, .gguf, .bpk) must "
        "name that format. The summary gives the sizes, the mean and worst SQNR, and warns about tensors below "
        f"{commands.QUALITY_FLOOR_DB:g} dB.",
    )
    q.add_argument(
        "input",
        metavar="IN",
        help="a .safetensors file, a Hugging Face model folder (config.json and model.safetensors or its shards), "
        "a .gguf or a .bpk file (never changed)",
    )
    q.add_argument(
        "output",
        metavar="OUT",
        help="written atomically, never IN: a .safetensors or .bpk file from a .safetensors IN, a new folder "
        "from a model folder (compressed-tensors), a .gguf from a .gguf, a .bpk from a .bpk",
    )
    q.add_argument(
        "--format",
        choices=commands.FORMATS,
        help="arrayquant: one .safetensors file in arrayquant's layout; compressed-tensors: a model folder that "
        "transformers and vLLM load; gguf: a re-quantized GGUF (IN a .gguf); burnpack: a Burn .bpk file "
        "(default: compressed-tensors for a folder, the input's own format for .gguf and .bpk, burnpack for "
        "an OUT ending in .bpk, else arrayquant)",
    )
    q.add_argument("--scheme", required=True, help=_SCHEME_HELP)
    q.add_argument("--include", action="append", default=[], metavar="GLOB", help="quantize tensors named so (repeat)")
    q.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="never quantize these (repeat)")
    q.add_argument("--min-size", type=_count, default=0, metavar="N", help="only tensors of N elements or more")
    q.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        help="compressed-tensors: cut the weights into shards of at most SIZE, with a unit: 5GB, 500MB, 2GiB "
        "(B for bytes; a bare number is refused), named and indexed as save_pretrained does (default: the "
        "input's shards)",
    )
    q.add_argument(
        "--no-fused-shards",
        action="store_true",
        help="compressed-tensors: give each weight its own per-tensor scale, not the one shared by the weights "
        "vLLM and SGLang fuse into one layer (q/k/v, gate/up), which their nvfp4 and per-tensor fp8 layers need",
    )
    q.add_argument(
        "--requantize",
        action="store_true",
        help="GGUF and Burnpack: quantize weights that IN holds quantized already in another type, through "
        "float32 (as llama-quantize --allow-requantize; without it they are refused)",
    )
    q.add_argument("--backend", help="array backend (default: aq.backends.default())")
    q.add_argument("--device", help="device such as cpu, cuda, cuda:1 (default: the backend's)")
    q.add_argument(
        "--nonfinite",
        choices=commands._NONFINITE,
        default="error",
        help="NaN or infinity in a tensor to quantize: error (refuse, naming the tensor), zero (set them to 0 "
        "first), saturate (infinities saturate to the range ends; NaN gives code 0, or the NaN code of e4m3/e5m2)",
    )
    q.add_argument(
        "--calibration",
        metavar="TEXT",
        help="how each block's scale is chosen: minmax (Burn's, the default), ggml (llama.cpp's own quantizer, "
        "the default for a .gguf OUT: llama-quantize's bytes), absmean, mse (a clip search for the "
        "smallest error; options as mse:grid=50,max_shrink=0.3,norm=2), percentile (percentile:99.5), 4over6 "
        "(nvfp4: map each block's max to 6 or to 4, whichever errs less)",
    )
    q.add_argument(
        "--importance",
        metavar="FILE",
        help="weight each input column's error by FILE's vector (with --calibration mse or 4over6): a safetensors "
        "file of 1-D vectors keyed by weight name (e.g. mean squared activations), or llama.cpp's imatrix.gguf",
    )
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(func=_quantize)
    d = _subparser(
        sub,
        "dequantize",
        help="turn the quantized tensors of a safetensors file, model folder, GGUF or Burnpack file back into floats",
    )
    d.add_argument(
        "input",
        metavar="IN",
        help="quantized .safetensors file, compressed-tensors model folder, .gguf or .bpk file (never changed)",
    )
    d.add_argument(
        "output",
        metavar="OUT",
        help="written atomically, never IN, in the format its name says: a .safetensors file of floats from any "
        "file; a .gguf from a .gguf and a .bpk from a .bpk or .safetensors (every key/value, id and other "
        "tensor kept); a new folder from a folder. GGUF types without an arrayquant scheme are written as the "
        "float values gguf reads them as",
    )
    d.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        help="float dtype of the quantized tensors (default: each tensor's original; float32 for GGUF and Burnpack)",
    )
    d.set_defaults(func=_dequantize)
    i = _subparser(sub, "inspect", help="list the tensors of a checkpoint: shape, scheme or dtype, bytes, scales")
    i.add_argument("file", metavar="FILE", help=".safetensors file, model folder, .gguf or .bpk file")
    i.set_defaults(func=lambda a: commands.inspect_checkpoint(a.file))
    c = _subparser(sub, "compare", help="per-tensor SQNR and maximum error of a quantized checkpoint")
    c.add_argument(
        "original", metavar="ORIGINAL", help="the float model: a .safetensors file, model folder, .gguf or .bpk file"
    )
    c.add_argument("quantized", metavar="QUANTIZED", help="the quantized (or dequantized) checkpoint made from it")
    c.add_argument(
        "--plot", metavar="FILE.png", help="also draw a histogram of the errors (matplotlib: .png, .pdf, .svg, ...)"
    )
    c.add_argument(
        "--calibration",
        dest="calibrations",
        action="append",
        default=[],
        metavar="TEXT",
        help="also quantize each quantized tensor again from ORIGINAL with its scheme and this calibration "
        "(minmax, mse, percentile:99.5, 4over6, ...) and show the SQNR it gives beside QUANTIZED's (repeat)",
    )
    c.set_defaults(func=lambda a: commands.compare_checkpoints(a.original, a.quantized, a.plot, a.calibrations))


# Python-API advice in library messages, and what to type on the command line instead
_CLI_SPELLING: tuple[tuple[str, Callable[[re.Match[str]], str]], ...] = (
    (r"build on QuantScheme\.(\w+)\(\)", lambda m: f"spell it out instead: {_spelled(m[1])}"),
    (r"QuantScheme\.(\w+)\(\)\.with_scale_rule\('(\w+)'\)", lambda m: f"{_spelled(m[1])}:{m[2]}"),
    (r"with_store\('(\w+)'\)", lambda m: f":{m[1]} in the scheme text"),
    (r"scheme\.with_mode\('(\w+)'\)", lambda m: f":{m[1]} in the scheme text"),
    (r"per_block\(size, '(\w+)'\)", lambda m: f"block<N>:{m[1]}"),
    (r"drop per_tensor\(\)", lambda m: "drop tensor:f32"),
    (r"per_tensor\('(\w+)'\)", lambda m: f"tensor:{m[1]}"),
    (r"e\.g\. with_value\('(\w+)'\)", lambda m: f"e.g. {m[1]}:block64:f32:lookup:nf4"),
    (r"with_value\('(\w+)'\)", lambda m: f"the value {m[1]}"),
    (
        r"pass table=aq\.NF4 or your codebook",
        lambda m: "use --scheme nf4, or end the scheme text with :nf4 (e.g. q4f:block64:f32:lookup:nf4)",
    ),
    (r" \(or the \w+ enum\)", lambda m: ""),
    (r"pass check_finite=False", lambda m: "rerun with --nonfinite saturate"),
)


def _spelled(preset: str) -> str:
    try:
        return QuantScheme.parse(preset).spelled_out()
    except QuantizationError:
        return preset


def cli_message(text: str) -> str:
    """A library error message with its Python-API advice given in command-line spelling."""
    for pattern, spelling in _CLI_SPELLING:
        text = re.sub(pattern, spelling, text)
    return text


class _Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C, so temporary files are removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _: FrameType | None) -> None:
    for s in _STOP_SIGNALS:  # one is enough: let the cleanup run undisturbed
        signal.signal(s, signal.SIG_IGN)
    raise _Stopped(signum)


_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception while a command runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _stop) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _fail(text: str) -> int:
    print(f"arrayquant: error: {text}".replace("\n", " "), file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    0 ok, 1 an error (one line on stderr; ``--debug`` shows the traceback instead), 2 a usage
    error, 130 Ctrl-C, 128 + the signal number for SIGTERM and SIGHUP. Temporary files are
    removed in every case.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "schemes", "unset") is None:
        args.schemes = list(DEMO_SCHEMES)
    try:
        with _stop_on_signals():
            return int(args.func(args))
    except BrokenPipeError:  # output piped into a pager or `head` that closed early
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter's final flush quiet
        return 0
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("arrayquant: interrupted", file=sys.stderr)
        return 130
    except _Stopped as exc:
        if args.debug:
            raise
        print(f"arrayquant: stopped by {signal.Signals(exc.signum).name}", file=sys.stderr)
        return 128 + exc.signum
    except (QuantizationError, BackendUnavailableError, DeviceError) as exc:
        if args.debug:
            raise
        return _fail(f"{type(exc).__name__}: {cli_message(str(exc))}")
    except commands.CommandError as exc:
        if args.debug:
            raise
        return _fail(str(exc))
    except MemoryError as exc:
        if args.debug:
            raise
        return _fail(f"out of memory ({exc or 'MemoryError'}); use a smaller input or a machine with more memory")
    except OSError as exc:  # a missing input, an unwritable output folder, a full disk
        if args.debug:
            raise
        where = f": {commands.shown(str(exc.filename))}" if exc.filename else ""
        return _fail(f"{exc.strerror or exc}{where}")


if __name__ == "__main__":
    sys.exit(main())
