"""The checkpoint subcommands of ``arrayquant``: quantize, dequantize, inspect, compare, demo checkpoint.

Tensors are read one at a time straight from the file, at the offsets its header gives, into a
fresh buffer (no memory map: every page of a map that has been read counts against the process
until the map is closed, which for a whole checkpoint is the whole file), and written with
:func:`arrayquant.io.checkpoint.save_stream`, so memory stays near the largest tensor. Errors are
measured in row slabs of the dequantized tensor, never a full-size float64 copy. tqdm and
matplotlib are imported by the subcommands that use them, so ``arrayquant demo`` needs neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fnmatch
import itertools
import math
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import array_api_compat as compat
import numpy as np

from .backends import default, shim
from .chunks import Chunk, row_chunks
from .convert import asarray
from .dequantize import dequantize
from .errors import (
    BackendUnavailableError,
    NonFiniteInputError,
    PathError,
    QuantizationError,
    SchemeError,
    ShapeError,
)
from .invariants import plan_for
from .io import _dtypes
from .io.checkpoint import is_compressed_tensors, save_stream
from .io.reader import _PLAIN, _SIBLINGS, Checkpoint, Entry, _ml_dtype
from .metrics import ErrorMeter
from .quantize import quantize
from .scheme import QuantScheme, QuantStore
from .storage import fields_per_word
from .tensor import QuantizedTensor

__all__ = [
    "FORMATS",
    "Checkpoint",
    "CommandError",
    "Entry",
    "ErrorStats",
    "check_calibration",
    "check_plot_path",
    "check_scheme",
    "compare_checkpoints",
    "dequantize_checkpoint",
    "dequantize_file",
    "dequantize_model_folder",
    "dequantize_same_format",
    "inspect_checkpoint",
    "quantization_error",
    "quantize_checkpoint",
    "quantize_format_file",
    "quantize_model_folder",
    "selected",
    "shown",
    "weights_file_command",
    "write_demo_checkpoint",
]

FLOAT_HEADERS = _dtypes.SAFETENSORS_FLOATS
_SLAB = 1 << 18  # elements per error slab: a few MiB of float64 temporaries
_MiB = float(2**20)


def _missing(what: str) -> BackendUnavailableError:
    return BackendUnavailableError(f"this command needs {what}; pip install 'arrayquant[cli]'")


class CommandError(Exception):
    """A command line that cannot be carried out as given (the CLI prints it and exits 1)."""


def shown(text: str) -> str:
    """``text`` safe to print: characters that are not printable (a lone surrogate, a control
    character, a terminal escape) written as Python escapes, the rest as it is."""
    if text.isprintable():
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    return "".join(
        c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def _output_folder(path: str) -> None:
    """Refuse an output path whose folder is missing, or that is a folder, before any work (not
    later, naming a temporary file)."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(folder))
    if Path(path).is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)


def _not_the_input(src: str, dst: str) -> None:
    """Refuse to write OUT over IN: the same path, or the same file through a link."""
    try:
        same = os.path.samefile(src, dst)
    except OSError:  # OUT does not exist yet (or IN is missing: reading it reports that)
        same = False
    if same:
        msg = (
            f"OUT {shown(dst)} is the same file as IN {shown(src)}; writing it would replace the input, "
            "so name a new OUT"
        )
        raise CommandError(msg)


def check_scheme(text: str) -> QuantScheme:
    """Parse ``--scheme`` and check it, codebook included, before any work or output."""
    scheme = QuantScheme.parse(text)
    plan_for(scheme)
    # a lookup scheme's table is resolved by quantize: try it on one value; a ShapeError (a
    # packed axis that rank-2 data lacks) is decided per tensor, by its rank
    with contextlib.suppress(ShapeError):
        quantize(np.zeros((1, 1), np.float32), scheme)
    return scheme


def check_calibration(scheme: QuantScheme, text: str | None, weighted: bool = False) -> dict[str, Any]:
    """Check ``--calibration`` (and that ``--importance`` fits it) on one value before any work.

    Returns the keyword arguments for :func:`~arrayquant.quantize`: empty for the default
    (MinMax), so the call is the plain one. The library's own checks decide, so the CLI accepts
    exactly what ``quantize(..., calibration=text)`` accepts.
    """
    if text is None:
        if weighted:
            msg = "--importance weights a search: give it with --calibration mse or --calibration 4over6"
            raise CommandError(msg)
        return {}
    options: dict[str, Any] = {"calibration": text}
    probe: dict[str, Any] = {"importance": np.ones(1, np.float32)} if weighted else {}
    # a ShapeError (a packed axis rank-2 data lacks) is decided per tensor, as in check_scheme
    with contextlib.suppress(ShapeError):
        quantize(np.zeros((1, 1), np.float32), scheme, **options, **probe)
    return options


_NONFINITE = ("error", "zero", "saturate")


def _nonfinite_message(name: str, src: str, exc: NonFiniteInputError) -> str:
    """The library's message about ``x`` told about tensor ``name``, with the CLI's remedies."""
    head = str(exc).split("; ")[0]
    head = head[2:] if head.startswith("x ") else head
    return (
        f"tensor {name!r} of {shown(src)} {head}; rerun with --nonfinite zero (NaN and infinities become 0) "
        "or --nonfinite saturate (infinities saturate to the ends of the range; NaN gives code 0, "
        "or the NaN code of e4m3/e5m2 values)"
    )


def _zero_nonfinite(host: np.ndarray) -> tuple[np.ndarray, int]:
    """``host`` with every value that is not finite in float32 (NaN, inf, float64 beyond the f32
    range) set to 0, and how many there were."""
    if host.dtype == np.float64:
        with np.errstate(invalid="ignore"):
            ok = np.abs(host) <= float(np.finfo(np.float32).max)  # NaN compares False
    else:  # f32, f16, bf16: finite means finite in f32
        ok = np.isfinite(host)
    bad = int(ok.size - np.count_nonzero(ok))
    if not bad:
        return host, 0
    out = host.copy()
    out[~ok] = 0
    return out, bad


def _order(names: Iterable[str]) -> list[str]:
    """Names in natural order (``layers.2`` before ``layers.10``): one order for every command."""
    key = lambda n: [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", n)]
    return sorted(names, key=key)


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        raise _missing("tqdm") from None
    return tqdm


@contextlib.contextmanager
def _progress(quiet: bool) -> Iterator[Callable[[str], None]]:
    """A callback counting tensors on a progress bar that appears with the first tensor.

    A refusal raised before any tensor is read (a path in use, a folder that is no model)
    leaves stderr with its one error line, no empty bar before it.
    """
    tqdm = None if quiet else _tqdm()
    bars: list[Any] = []

    def step(name: str) -> None:
        if tqdm is None:
            return
        if not bars:
            bars.append(tqdm(desc="quantize", unit=" tensors", file=sys.stderr, dynamic_ncols=True))
        bars[0].set_postfix_str(shown(name), refresh=False)
        bars[0].update(1)

    try:
        yield step
    finally:
        for bar in bars:
            bar.close()


# ---------------------------------------------------------------------------------------------
# reading a safetensors file tensor by tensor
# ---------------------------------------------------------------------------------------------


# ``Entry`` and ``Checkpoint`` are the library's one safetensors reader (:mod:`arrayquant.io.reader`),
# with every check ``aq.load`` makes; they are named here for the commands below.


# ---------------------------------------------------------------------------------------------
# errors of a quantized tensor, measured in row slabs
# ---------------------------------------------------------------------------------------------

_HIST_EDGES = np.linspace(-12.0, 2.0, 141)  # log10 |error| bins, 0.1 decade each


@dataclass
class ErrorStats:
    """Running error of the slabs of one or more tensors (an :class:`~arrayquant.metrics.ErrorMeter`)
    and, when asked, a histogram of log10 |error|."""

    meter: ErrorMeter = dataclasses.field(default_factory=ErrorMeter)
    hist: np.ndarray | None = None
    tiny: int = 0  # errors below the first bin, exact ones included

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        ref = np.asarray(x, np.float64).reshape(-1)
        err = np.array(y, np.float64).reshape(-1)  # a copy, whatever y is: the error is made in place
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN: reported, not warned
            np.subtract(err, ref, out=err)
        self.meter.add_error(ref, err)  # leaves |err| in err
        if self.hist is not None and err.size:
            small = err < 10.0 ** _HIST_EDGES[0]
            self.tiny += int(np.count_nonzero(small))
            logs = np.log10(err[~small & ~np.isnan(err)])
            self.hist += np.histogram(np.minimum(logs, _HIST_EDGES[-1]), _HIST_EDGES)[0]

    def merge(self, other: ErrorStats) -> None:
        self.meter.merge(other.meter)
        if self.hist is not None and other.hist is not None:
            self.hist += other.hist
            self.tiny += other.tiny

    @property
    def count(self) -> int:
        return self.meter.count

    @property
    def max_err(self) -> float:
        return self.meter.max_abs_error

    @property
    def sqnr(self) -> float:
        """``10 log10(signal / noise)`` in dB: inf for an exact copy, -inf for an infinite error, NaN with a NaN."""
        return self.meter.sqnr


def _slabs(qt: QuantizedTensor) -> Iterator[Chunk]:
    """Row slabs of about ``_SLAB`` elements aligned to whole blocks and words, as dequantize uses."""
    plan = plan_for(qt.scheme)
    rank = len(qt.shape)
    dims = plan.block_dims(rank)
    chunks = row_chunks(qt.shape, dims[0] if dims else 1, plan.packed_axis(rank), fields_per_word(plan), True)
    row = math.prod(qt.shape[1:])
    group: list[Chunk] = []
    for c in chunks:
        group.append(c)
        if (c.rows.stop - group[0].rows.start) * row >= _SLAB or c is chunks[-1]:
            first = group[0]
            yield Chunk(
                slice(first.rows.start, c.rows.stop),
                slice(first.grid.start, c.grid.stop),
                slice(first.stored.start, c.stored.stop),
            )
            group = []


def quantization_error(x: Any, qt: QuantizedTensor, stats: ErrorStats) -> ErrorStats:
    """Add the error of ``qt`` against the original ``x`` (any backend) to ``stats``, slab by slab."""
    xp = compat.array_namespace(qt.values)
    per_tensor = not plan_for(qt.scheme).block_dims(len(qt.shape))
    for s in _slabs(qt):
        rows = s.rows.stop - s.rows.start
        part = QuantizedTensor(
            qt.scheme,
            (rows, *qt.shape[1:]),
            qt.dtype,
            qt.values[s.stored, ...],
            qt.scales if per_tensor else qt.scales[s.grid, ...],
            qt.global_scale,
            qt.table,
        )
        stats.add(shim.to_host(x[s.rows, ...]), shim.to_host(dequantize(part, xp.float32)))
    return stats


def _plain_error(x: np.ndarray, y: np.ndarray, stats: ErrorStats) -> ErrorStats:
    x2, y2 = x.reshape(x.shape[0] if x.ndim else 1, -1), y.reshape(y.shape[0] if y.ndim else 1, -1)
    step = max(1, _SLAB // max(x2.shape[1], 1))
    for r in range(0, x2.shape[0], step):
        stats.add(x2[r : r + step], y2[r : r + step])
    return stats


def _fmt_db(v: float) -> str:
    return "inf" if v == math.inf else "-inf" if v == -math.inf else f"{v:.2f}"


def _worst_first(s: float) -> tuple[bool, float]:
    return (not math.isnan(s), s)  # NaN is worse than any number


def _sqnr_summary(rows: Sequence[tuple[str, ErrorStats]]) -> str:
    if not rows:
        return "SQNR: n/a (no quantized tensor)"
    finite = [s.sqnr for _, s in rows if math.isfinite(s.sqnr)]
    mean = sum(finite) / len(finite) if finite else math.inf
    worst_name, worst = min(rows, key=lambda r: _worst_first(r[1].sqnr))
    return f"SQNR: mean {_fmt_db(mean)} dB, worst {_fmt_db(worst.sqnr)} dB ({shown(worst_name)})"


QUALITY_FLOOR_DB = 3.0  # an SQNR below it: the error holds more than half the energy of the weights


def _quality_warning(rows: Sequence[tuple[str, ErrorStats]]) -> None:
    """Warn on stderr about quantized tensors whose SQNR is below :data:`QUALITY_FLOOR_DB`, or NaN."""
    low = [(n, s) for n, s in rows if not s.sqnr >= QUALITY_FLOOR_DB]
    if not low:
        return
    name, worst = min(low, key=lambda r: _worst_first(r[1].sqnr))
    print(
        f"warning: {len(low)} of {len(rows)} quantized tensors are below {QUALITY_FLOOR_DB:g} dB SQNR, where the "
        f"error holds more than half the energy of the weights (worst {_fmt_db(worst.sqnr)} dB, {shown(name)}); "
        "a scheme with more bits or smaller blocks, or --calibration mse, keeps more of them",
        file=sys.stderr,
    )


# ---------------------------------------------------------------------------------------------
# the subcommands
# ---------------------------------------------------------------------------------------------


def _is_bias(name: str) -> bool:
    return name.rsplit(".", 1)[-1].lower().endswith("bias")


def selected(e: Entry, include: Sequence[str], exclude: Sequence[str], min_size: int) -> bool:
    """Whether ``quantize`` quantizes ``e``: a floating tensor of rank >= 1 that ``include`` names
    (by default: a 2-D weight, not a norm or a bias), that no ``exclude`` glob names, with at least
    ``min_size`` elements."""
    if e.dtype not in FLOAT_HEADERS or not e.shape:
        return False
    if include:
        wanted = any(fnmatch.fnmatchcase(e.name, g) for g in include)
    else:
        wanted = len(e.shape) == 2 and "norm" not in e.name.lower() and not _is_bias(e.name)
    return wanted and not any(fnmatch.fnmatchcase(e.name, g) for g in exclude) and e.size >= min_size


def quantize_checkpoint(
    src: str,
    dst: str,
    scheme_text: str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    min_size: int = 0,
    backend: str | None = None,
    device: Any = None,
    quiet: bool = False,
    nonfinite: str = "error",
    out_format: str = "arrayquant",
    calibration: str | None = None,
    importance: str | None = None,
) -> int:
    """``arrayquant quantize``: quantize the selected tensors of ``src`` into ``dst``, one at a time.

    ``nonfinite`` says what NaN and infinities in a selected tensor do: ``"error"`` refuses them
    (naming the tensor), ``"zero"`` sets them to 0 first, ``"saturate"`` quantizes unchecked
    (infinities saturate, NaN gives code 0 or the NaN code of fp8 values). ``calibration`` is
    the text form ``quantize`` takes (``"mse"``, ``"percentile:99.5"``, ...; default MinMax);
    ``importance`` a file :func:`arrayquant.io.importance.load_importance` reads, whose vectors
    weight the search's error for the weights they name (the others are searched unweighted).
    """
    if nonfinite not in _NONFINITE:
        msg = f"--nonfinite {nonfinite!r} is not one of {', '.join(_NONFINITE)}"
        raise CommandError(msg)
    scheme = check_scheme(scheme_text)  # refuse an impossible scheme before any work or output
    vectors: dict[str, np.ndarray] = {}
    if importance is not None and calibration is not None:  # the file's own errors first
        from .io.importance import load_importance

        vectors = load_importance(importance)
    options = check_calibration(scheme, calibration, importance is not None)
    tqdm = _tqdm()
    _output_folder(dst)
    _not_the_input(src, dst)
    if Path(src).is_file() and is_compressed_tensors(Path(src)):  # codes under float-looking names
        msg = (
            f"IN {shown(src)} is in compressed-tensors' layout: its weights are quantized already; quantize "
            "the float model, or turn this one back into floats first with arrayquant dequantize"
        )
        raise CommandError(msg)
    name = backend or default().name
    results: list[tuple[str, ErrorStats]] = []
    zeroed: dict[str, int] = {}
    with Checkpoint(src) as ck:
        if ck.described:
            msg = (
                f"{shown(src)} already holds {len(ck.described)} quantized tensors "
                f"(e.g. {next(iter(ck.described))!r}); "
                "quantize the original checkpoint, or `arrayquant dequantize` this one first"
            )
            raise PathError(msg)
        chosen = {e.name for e in ck.tensors if selected(e, include, exclude, min_size)}
        if importance is not None:
            from .io.importance import check_importance

            check_importance(vectors, {e.name: e.shape for e in ck.tensors}, shown(importance))
            unused = [n for n in vectors if n not in chosen]
            if unused:
                print(f"note: {len(unused)} importance vectors name tensors left unquantized (e.g. {unused[0]!r})")
        with tqdm(
            total=sum(e.nbytes for e in ck.tensors),
            desc="quantize",
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            disable=quiet,
            dynamic_ncols=True,
        ) as bar:

            def items() -> Iterator[tuple[str, Any]]:
                for e in ck.tensors:
                    bar.set_postfix_str(shown(e.name), refresh=False)
                    if e.name in chosen:
                        host = ck.array(e.name)
                        if e.dtype == "BF16" and name not in ("numpy", "jax"):  # no bfloat16 there: exact in f32
                            host = host.astype(np.float32)
                        if nonfinite == "zero":
                            host, bad = _zero_nonfinite(host)
                            if bad:
                                zeroed[e.name] = bad
                        x = asarray(host, backend=name, device=device)
                        del host
                        try:
                            weights = {}
                            if e.name in vectors:
                                weights["importance"] = asarray(vectors[e.name], backend=name, device=device)
                            qt = quantize(x, scheme, check_finite=nonfinite != "saturate", **options, **weights)
                        except NonFiniteInputError as exc:
                            raise NonFiniteInputError(_nonfinite_message(e.name, src, exc)) from None
                        if e.dtype == "BF16":  # the original dtype, whichever backend quantized it
                            qt = dataclasses.replace(qt, dtype=ck.array_dtype(e.name))
                        results.append((e.name, quantization_error(x, qt, ErrorStats())))
                        del x  # only the quantized tensor is alive while it is written
                        yield e.name, qt
                        del qt
                    else:
                        yield e.name, ck.array(e.name)
                    bar.update(e.nbytes)

            if out_format == "burnpack":  # a Burn-loadable file: the bridge from PyTorch/HF checkpoints
                from .io.formats import format_module

                format_module("burnpack").save_stream(dst, items(), metadata=ck.user_metadata)
            else:
                save_stream(dst, items(), metadata=ck.user_metadata)
    before, after = Path(src).stat().st_size, Path(dst).stat().st_size
    how = f" ({calibration} calibration)" if calibration else ""
    print(
        f"quantized {len(results)} of {len(ck.tensors)} tensors with {scheme}{how} "
        f"({len(ck.tensors) - len(results)} copied)"
    )
    if vectors:
        weighted = sum(1 for n, _ in results if n in vectors)
        print(f"importance: {weighted} of {len(results)} quantized tensors weighted by {shown(importance or '')}")
    print(f"size: {before / _MiB:.1f} MiB -> {after / _MiB:.1f} MiB ({before / max(after, 1):.2f}x smaller)")
    print(_sqnr_summary(results))
    _quality_warning(results)
    if zeroed:
        first = next(iter(zeroed))
        print(
            f"note: --nonfinite zero set {sum(zeroed.values())} NaN or infinite values to 0 in {len(zeroed)} "
            f"tensors (e.g. {first!r})",
            file=sys.stderr,
        )
    if not results:
        print("warning: no tensor matched; the output is a copy of the input", file=sys.stderr)
    print(f"wrote {shown(dst)}")
    return 0


_OUT_DTYPES = ("float32", "float16", "bfloat16")


def _np_dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        return np.dtype(_ml_dtype("bfloat16"))
    return np.dtype(name if name in ("float64", "float32", "float16") else "float32")


FORMATS = ("arrayquant", "compressed-tensors", "gguf", "burnpack")


def quantize_model_folder(
    src: str,
    dst: str,
    scheme_text: str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    quiet: bool = False,
    max_shard_size: str | None = None,
    calibration: str | None = None,
    importance: str | None = None,
    fused_shards: bool = True,
) -> int:
    """``arrayquant quantize IN OUT --format compressed-tensors``: a model folder transformers and vLLM load.

    A scheme whose values compressed-tensors holds in another store (``e4m3``, whose default store
    packs four values in a u32, is stored one value per byte) is written in that store, with a
    note. It ends with the sizes of the weight files before and after, the mean and worst SQNR of
    the quantized weights (measured after writing, one weight at a time, against IN's floats) and
    a warning for any below :data:`QUALITY_FLOOR_DB`.
    """
    from .io.ct_model import parse_size, quantize_model

    scheme = check_scheme(scheme_text)
    scheme, note = _folder_scheme(scheme, scheme_text, src, dst)  # no format: refused before any work
    limit = None if max_shard_size is None else parse_size(_shard_size(max_shard_size))
    vectors = _importance_for(src, importance)
    _not_the_input(src, dst)
    with _progress(quiet) as step:
        summary = quantize_model(
            src,
            dst,
            scheme,
            include=include,
            exclude=exclude,
            progress=step,
            max_shard_size=limit,
            calibration=calibration or "minmax",
            importance=vectors,
            fused_shards=fused_shards,
        )
    if note:
        print(note)
    print(f"quantized {len(summary.quantized)} Linear weights with {scheme} as {summary.format}")
    for module, why in sorted(summary.left_out.items()):
        print(f"  left in float: {shown(module)} ({why})")
    if summary.copied_files:
        print(f"copied {len(summary.copied_files)} other files: {', '.join(map(shown, summary.copied_files))}")
    if summary.skipped_files:
        names = ", ".join(map(shown, summary.skipped_files))
        print(f"not copied: {names} (float weights in another format, which an engine could load instead)")
    for name, why in sorted(summary.refused_files.items()):
        print(f"not copied: {shown(name)} ({why})")
    before = sum(p.stat().st_size for p in _weight_paths(src))
    after = sum((Path(dst) / shard).stat().st_size for shard in summary.shards)
    print(
        f"size: {before / _MiB:.1f} MiB -> {after / _MiB:.1f} MiB of weight files "
        f"({before / max(after, 1):.2f}x smaller)"
    )
    results = _folder_errors(src, dst)
    print(_sqnr_summary(results))
    _quality_warning(results)
    print(f"wrote {shown(dst)} ({len(summary.shards)} weight file(s), config.json with its quantization_config)")
    for warning in summary.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _shard_size(text: str) -> str:
    """``--max-shard-size`` with its unit; a bare number is refused (it would be bytes: 5 is 5 bytes)."""
    if re.fullmatch(r"\s*\d+\s*", text):
        n = text.strip()
        msg = (
            f"--max-shard-size {n} has no unit; write one, e.g. {n}GB, {n}MB or {n}GiB "
            f"({n}B if you mean {n} bytes, which puts nearly every tensor in a shard of its own)"
        )
        raise CommandError(msg)
    return text


_FOLDER_SCHEMES = (
    "nvfp4, mxfp8, mxfp4, e4m3 (an f32, f16 or bf16 scale per tensor, row, group or 2-d block) and q8s, q4s, q2s, "
    "q8f, q4f, q2f (an f32, f16 or bf16 scale per tensor, row or group)"
)


def _folder_scheme(scheme: QuantScheme, text: str, src: str, dst: str) -> tuple[QuantScheme, str]:
    """The scheme a compressed-tensors folder is written with, and a note ("" or how it differs).

    A scheme that maps only in another store (``e4m3`` packed in u32 words, its default: the
    format stores one FP8 value per byte) is written in that store, values unchanged. Any other
    scheme without a compressed-tensors format is a :class:`SchemeError` that names the file
    command which keeps it.
    """
    from .io.ct_formats import weight_format

    try:
        weight_format(scheme)
        return scheme, ""
    except SchemeError:
        pass
    native = dataclasses.replace(scheme, store=QuantStore.native())
    if native != scheme:
        try:
            weight_format(native)
        except SchemeError:
            pass
        else:
            return native, (
                f"note: compressed-tensors stores {scheme.value.name.lower()} values one per byte: {text} is "
                f"written as {native} (the same values, stored unpacked)"
            )
    msg = (
        f"scheme {text} has no compressed-tensors format, the layout a model folder is written in (it holds "
        f"{_FOLDER_SCHEMES}); to keep {text}, quantize the weights into arrayquant's own layout: "
        + weights_file_command(src, _with_suffix(dst, ".safetensors"), text)
    )
    raise SchemeError(msg)


def _with_suffix(path: str, suffix: str) -> str:
    """``path`` named with ``suffix`` instead of a format's suffix (or with it added)."""
    p = Path(path.rstrip("/\\") or path)
    if p.suffix.lower() in (".safetensors", ".gguf", ".bpk"):
        p = p.with_suffix("")
    return str(p) + suffix


def _weight_paths(src: str) -> list[Path]:
    """The weight files of a model folder (or the one file given)."""
    from .io.ct_model import weight_files

    source = Path(src)
    return [source] if source.is_file() else [source / name for name in weight_files(source)[0]]


def weights_file_command(src: str, out: str, scheme_text: str) -> str:
    """The ``arrayquant quantize`` command line that writes the weights of ``src`` (a model folder
    or a file) to the file ``out``, quoted for a POSIX shell; for a sharded folder, its first
    shard's, with a word on the others."""
    files = _weight_paths(src)
    line = f"arrayquant quantize {shlex.quote(str(files[0]))} {shlex.quote(out)} --scheme {shlex.quote(scheme_text)}"
    if len(files) > 1:
        line += f" (for its first of {len(files)} shards; the others alike, each to a file of its own)"
    return shown(line)


def _folder_errors(src: str, dst: str) -> list[tuple[str, ErrorStats]]:
    """The error of every quantized weight of the folder ``dst`` against its float in ``src``.

    Read after writing, one weight at a time: the compressed-tensors entries decoded from
    ``dst`` and the float tensor read from ``src``'s file a slab of rows at a time.
    """
    from .io.ct_model import iter_model
    from .io.reader import SafetensorsFile

    results: list[tuple[str, ErrorStats]] = []
    with contextlib.ExitStack() as stack:
        where: dict[str, SafetensorsFile] = {}
        for path in _weight_paths(src):
            st = stack.enter_context(SafetensorsFile(path))
            where.update(dict.fromkeys(st.entries, st))
        for _, name, tensor in iter_model(dst, passthrough=True):
            if isinstance(tensor, QuantizedTensor) and name in where:
                results.append((name, quantization_error(_Rows(where[name], name), tensor, ErrorStats())))
            del tensor
    return results


class _Rows:
    """A tensor of an open safetensors file whose row slabs are read as :func:`quantization_error` asks
    for them (``x[rows, ...]``): the float weight is never whole in memory, as when it was quantized."""

    def __init__(self, st: Any, name: str) -> None:
        self.st, self.name = st, name

    def __getitem__(self, key: tuple[slice, Any]) -> np.ndarray:
        rows = key[0]
        return np.asarray(self.st.rows(self.name, rows.start, rows.stop))


def _importance_for(src: str, importance: str | None) -> dict[str, np.ndarray] | None:
    """The importance vectors of ``importance`` (a file), checked against the tensors of ``src``; None without one."""
    if importance is None:
        return None
    from .io.formats import tensor_shapes
    from .io.importance import check_importance, load_importance

    vectors = load_importance(importance)
    check_importance(vectors, tensor_shapes(src), shown(importance))
    return vectors


def quantize_format_file(
    kind: str,
    src: str,
    dst: str,
    scheme_text: str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    quiet: bool = False,
    calibration: str | None = None,
    importance: str | None = None,
    requantize: bool = False,
) -> int:
    """``arrayquant quantize IN OUT`` for a GGUF or Burnpack IN: the same format out, everything else kept.

    A weight that the run would quantize but that IN holds quantized already, in another type or
    scheme, is refused with a :class:`PathError` (llama-quantize refuses them too, without
    ``--allow-requantize``): quantizing quantized values adds a second error to the first. With
    ``requantize`` each such weight is dequantized to float32 (into a hidden temporary file beside
    OUT, removed at the end) and quantized from there.
    """
    from .io.formats import format_module

    module = format_module(kind)
    _output_folder(dst)
    _not_the_input(src, dst)
    vectors = _importance_for(src, importance)
    again = _quantized_already(kind, src, scheme_text, include, exclude)
    if again and not requantize:
        first = next(iter(again))
        msg = (
            f"IN {shown(src)} holds {len(again)} weight(s) quantized already that --scheme {shown(scheme_text)} "
            f"would quantize again (e.g. {first!r}, {again[first]}); quantizing quantized values adds a second "
            "error to the first, so they are not re-quantized by default: quantize the float model, or rerun "
            "with --requantize to dequantize each to float32 and quantize it from there"
        )
        raise PathError(msg)
    with _progress(quiet) as step, _float_copy(kind, src, dst, again) as source:
        summary = module.quantize_file(
            source,
            dst,
            scheme_text,
            include=include,
            exclude=exclude,
            progress=step,
            # GGUF's default is ggml's own quantizer (llama-quantize's bytes); Burnpack's is minmax
            **({} if calibration is None else {"calibration": calibration}),
            importance=vectors,
        )
    what = getattr(summary, "type_name", None) or scheme_text
    print(f"quantized {len(summary.quantized)} tensors as {what}")
    if again:
        done = [n for n in again if n in summary.quantized]
        print(f"re-quantized {len(done)} of them through float32 (--requantize): {_kinds(again, done)}")
    for name, other in getattr(summary, "fallback", {}).items():
        print(f"  {shown(name)}: rows of {what} blocks do not fit, written as {other} (llama-quantize's fallback)")
    for name, why in sorted(summary.left_out.items()):
        if name in again:
            why = f"{why}; it was {again[name]} in IN, dequantized to float32 by --requantize"
        print(f"  left as it was: {shown(name)} ({why})")
    lost = [n for n in again if n not in summary.quantized]
    if lost:
        print(
            f"warning: {len(lost)} weight(s) quantized in IN could not be quantized as {what} and are float32 now "
            f"(e.g. {lost[0]!r}); see the lines above",
            file=sys.stderr,
        )
    print(f"wrote {shown(dst)} ({Path(dst).stat().st_size / _MiB:.1f} MiB, {kind})")
    return 0


def _kinds(was: dict[str, str], names: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for n in names:
        counts[was[n]] = counts.get(was[n], 0) + 1
    return ", ".join(f"{k} x{c}" for k, c in counts.items()) or "none"


_GGUF_PLAIN = frozenset({"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"})  # arrays, not quantized


def _quantized_already(
    kind: str, src: str, scheme_text: str, include: Sequence[str], exclude: Sequence[str]
) -> dict[str, str]:
    """The weights of ``src`` that ``quantize_file`` would quantize were they float, which are quantized
    in another type or scheme than the one asked for, with what they are (read from the header alone).

    The choice is the format module's own, asked about each weight as if it were F32.
    """
    if kind == "gguf":
        from .io import gguf

        _, type_name = gguf._target(scheme_text)
        with gguf._opened(src) as f:
            return {
                t.name: t.type_name
                for t in f.tensors
                if t.type_name not in _GGUF_PLAIN
                and t.type_name != type_name
                and gguf._why_kept(t._replace(type_name="F32"), type_name, include, exclude) is None
            }
    from .io import burnpack

    target = QuantScheme.parse(scheme_text)
    with burnpack.BurnpackFile(src) as bp:
        return {
            e.name: str(e.scheme)
            for e in bp.entries
            if e.scheme is not None
            and e.scheme != target
            and burnpack._why_not(e._replace(dtype="F32", scheme=None), include, exclude) is None
        }


@contextlib.contextmanager
def _float_copy(kind: str, src: str, dst: str, names: Collection[str]) -> Iterator[str]:
    """``src`` itself, or with ``names`` a hidden copy beside ``dst`` with those tensors dequantized
    to float32 (everything else as stored), removed on the way out."""
    if not names:
        yield src
        return
    folder = Path(dst).parent
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(dst).name}.", suffix=f".float{Path(src).suffix}", dir=folder)
    os.close(fd)
    try:
        _float_file(kind, src, tmp, np.dtype(np.float32), names)
        yield tmp
    finally:
        Path(tmp).unlink(missing_ok=True)


def _float_file(kind: str, src: str, dst: str, dtype: np.dtype[Any], names: Collection[str] | None) -> tuple[int, int]:
    """Write the GGUF or Burnpack file ``src`` to ``dst`` in its own format with its quantized tensors
    (those in ``names``; all with None) dequantized to ``dtype``, one tensor at a time; every other
    tensor, key/value, param id and scalar as stored. Returns (tensors dequantized, tensors written)."""
    return (_float_gguf if kind == "gguf" else _float_burnpack)(src, dst, dtype, names)


def _float_gguf(src: str, dst: str, dtype: np.dtype[Any], names: Collection[str] | None) -> tuple[int, int]:
    from .io import gguf

    g = gguf._gguf()
    type_name = gguf._ARRAY_TYPES[dtype.name]
    with gguf._opened(src) as f:
        fields = f.fields()
        pairs = gguf._pairs(f)
        weight_of = {scale: weight for weight, (scale, _) in pairs.scales.items()}
        floats = {t.name for t in f.tensors if t.type_name not in _GGUF_PLAIN and (names is None or t.name in names)}
        plan = []
        for t in f.tensors:
            if t.name in floats:
                plan.append((t, gguf._Out(t.name, type_name, t.shape, math.prod(t.shape) * dtype.itemsize)))
            elif weight_of.get(t.name) not in floats:  # an NVFP4 scale goes into its dequantized weight
                plan.append((t, gguf._Out(t.name, t.type_name, t.shape, t.nbytes)))
        if floats and gguf._FTYPE_KEY in fields:
            fields[gguf._FTYPE_KEY] = g.GGUFValue(gguf._file_type(type_name), g.GGUFValueType.UINT32)
        arch = fields.get(gguf._ARCH_KEY)
        with gguf._writing(Path(dst), arch.value if arch is not None else "", fields, [o for _, o in plan]) as w:
            for t, o in plan:
                if t.name in floats:
                    value, _ = gguf._read(f, t, pairs, "numpy", None)
                    if isinstance(value, QuantizedTensor):
                        value = dequantize(value, dtype)
                    data = np.ascontiguousarray(np.asarray(value).astype(dtype, copy=False))  # little-endian, as GGUF
                    del value
                else:
                    data = f.raw(t)
                gguf._write(w, o, data.reshape(-1).view(np.uint8))
                del data
    return len(floats), len(plan)


def _float_burnpack(src: str, dst: str, dtype: np.dtype[Any], names: Collection[str] | None) -> tuple[int, int]:
    from .io import burnpack

    counts = [0, 0]
    with burnpack.BurnpackFile(src) as bp:

        def items() -> Iterator[tuple[str, Any]]:
            for e in bp.entries:
                counts[1] += 1
                if e.scheme is not None and (names is None or e.name in names):
                    qt, _ = bp.tensor(e.name)
                    counts[0] += 1
                    yield e.name, dequantize(qt, dtype)
                    del qt
                else:
                    yield e.name, burnpack._Stored(bp, e)  # copied as stored

        burnpack.save_stream(dst, items(), param_ids=bp.param_ids, metadata=bp.metadata, scalars=bp.scalars)
    return counts[0], counts[1]


def dequantize_same_format(kind: str, src: str, dst: str, dtype: str | None = None) -> int:
    """``arrayquant dequantize IN.gguf OUT.gguf`` (and ``.bpk`` alike): the file back to floats in its format.

    Quantized tensors become ``dtype`` (default float32); every other tensor, and the file's
    key/values (GGUF: ``general.file_type`` set to the float type), param ids and scalars
    (Burnpack), are kept as stored.
    """
    _output_folder(dst)
    _not_the_input(src, dst)
    out_dtype = _np_dtype(dtype or "float32")
    done, total = _float_file(kind, src, dst, out_dtype, None)
    size = Path(dst).stat().st_size / _MiB
    print(f"dequantized {done} of {total} tensors to {out_dtype.name}; wrote {shown(dst)} ({size:.1f} MiB, {kind})")
    if not done:
        print(f"warning: {shown(src)} holds no quantized tensor; the output is a copy of the input", file=sys.stderr)
    return 0


def dequantize_model_folder(src: str, dst: str, dtype: str | None = None) -> int:
    """``arrayquant dequantize IN OUT``: a compressed-tensors folder (or file) back to plain floats."""
    from .io.ct_model import dequantize_model

    if Path(src).is_file():
        _output_folder(dst)
    _not_the_input(src, dst)
    done = dequantize_model(src, dst, dtype)
    if not done.modules:
        print(f"warning: {shown(src)} holds no quantized weight; the folder was copied as it is", file=sys.stderr)
    if done.dropped:
        kinds = sorted({name.rpartition(".")[2] for name in done.dropped})
        print(
            f"dropped {len(done.dropped)} activation/KV-cache scales ({', '.join(kinds)}): only an engine "
            "that quantizes activations at run time uses them"
        )
    what = "a model folder without quantization_config" if Path(src).is_dir() else "a float safetensors file"
    print(f"dequantized {len(done.modules)} weights; wrote {shown(dst)}, {what}")
    return 0


def dequantize_checkpoint(src: str, dst: str, dtype: str | None = None, out_format: str = "arrayquant") -> int:
    """``arrayquant dequantize``: every quantized tensor back to floats (``dtype``, default its original),
    into a safetensors file or, with ``out_format="burnpack"``, a Burnpack file."""
    counts = {"quantized": 0}
    _output_folder(dst)
    _not_the_input(src, dst)
    with Checkpoint(src) as ck:

        def items() -> Iterator[tuple[str, Any]]:
            for e in ck.tensors:
                if e.name in ck.described:
                    qt = ck.quantized(e.name)
                    counts["quantized"] += 1
                    yield e.name, dequantize(qt, _np_dtype(dtype or ck.stored_dtype(e.name)))
                else:
                    yield e.name, ck.passthrough(e.name)  # copied as stored, a chunk at a time

        if out_format == "burnpack":
            from .io.formats import format_module

            format_module("burnpack").save_stream(dst, items(), metadata=ck.user_metadata)
        else:
            save_stream(dst, items(), metadata=ck.user_metadata)
    what = dtype or "their original dtypes"
    size = Path(dst).stat().st_size / _MiB
    kind = ", burnpack" if out_format == "burnpack" else ""
    print(
        f"dequantized {counts['quantized']} of {len(ck.tensors)} tensors to {what}; wrote {shown(dst)} "
        f"({size:.1f} MiB{kind})"
    )
    if not counts["quantized"]:
        print(f"warning: {shown(src)} holds no quantized tensor; the output is a copy of the input", file=sys.stderr)
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    fmt = lambda r: "  ".join(
        c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
    )
    return [fmt(r).rstrip() for r in (header, ["-" * w for w in widths], *rows)]


def inspect_checkpoint(path: str) -> int:
    """``arrayquant inspect``: a row per tensor (in natural name order) with its shape, scheme or
    dtype, bytes and scale range."""
    from .io.formats import detect, iter_tensors

    kind = detect(path)
    if kind == "compressed-tensors":  # a folder, or a file in compressed-tensors' layout
        return _inspect_folder(path)
    if kind != "arrayquant":  # GGUF, Burnpack
        return _inspect_rows(iter_tensors(path))
    rows = []
    total = quantized = 0
    with Checkpoint(path) as ck:
        by_name = {e.name: e for e in ck.tensors}
        for name in _order(by_name):
            e = by_name[name]
            if name in ck.described:
                qt = ck.quantized(name)
                nbytes = sum(ck.entries[k].nbytes for k in (name, *(name + s for s in _SIBLINGS)) if k in ck.entries)
                scales = np.asarray(qt.scales)
                span = f"{float(scales.min()):.3e}..{float(scales.max()):.3e}"
                if qt.global_scale is not None:
                    span += f" x {float(np.asarray(qt.global_scale)[0]):.3e}"
                rows.append([shown(name), "x".join(map(str, qt.shape)), str(qt.scheme), f"{nbytes:,}", span])
                quantized += 1
            else:
                nbytes = e.nbytes
                rows.append([shown(name), "x".join(map(str, e.shape)) or "()", _PLAIN[e.dtype][1], f"{nbytes:,}", "-"])
            total += nbytes
    print("\n".join(_table(["name", "shape", "scheme / dtype", "bytes", "scales min..max"], rows, {3})))
    print(f"\n{len(rows)} tensors, {quantized} quantized, {total / _MiB:.2f} MiB of tensor data")
    return 0


def _scale_span(qt: QuantizedTensor) -> str:
    scales = np.asarray(shim.to_host(qt.scales))
    span = f"{float(scales.min()):.3e}..{float(scales.max()):.3e}"
    if qt.global_scale is not None:
        span += f" x {float(np.asarray(shim.to_host(qt.global_scale))[0]):.3e}"
    return span


def _inspect_rows(items: Iterator[tuple[str, Any, str]]) -> int:
    """Print the inspect table of ``(name, tensor, note)``: tensor a QuantizedTensor, array or Passthrough."""
    rows: dict[str, list[str]] = {}
    total = quantized = 0
    noted = False
    for name, tensor, note in items:
        if isinstance(tensor, QuantizedTensor):
            nbytes = tensor.nbytes
            rows[name] = [shown(name), "x".join(map(str, tensor.shape)), str(tensor.scheme), f"{nbytes:,}"]
            rows[name].append(_scale_span(tensor))
            quantized += 1
        else:
            nbytes = tensor.nbytes
            shape, dtype = (
                (tensor.entry.shape, _PLAIN[tensor.entry.dtype][1])
                if hasattr(tensor, "entry")
                else (
                    tensor.shape,
                    str(tensor.dtype),
                )
            )
            rows[name] = [shown(name), "x".join(map(str, shape)) or "()", dtype, f"{nbytes:,}", "-"]
        rows[name].append(note)
        noted = noted or bool(note)
        total += nbytes
    header = ["name", "shape", "scheme / dtype", "bytes", "scales min..max", "note"]
    table = [rows[n] if noted else rows[n][:-1] for n in _order(rows)]
    print("\n".join(_table(header if noted else header[:-1], table, {3})))
    print(f"\n{len(table)} tensors, {quantized} quantized, {total / _MiB:.2f} MiB of tensor data")
    return 0


def _inspect_folder(path: str) -> int:
    """``arrayquant inspect FOLDER``: the tensors of a model folder (or compressed-tensors file), weights by scheme."""
    from .io.ct_config import activation_notes
    from .io.ct_model import iter_model, model_quantization_config

    # plain tensors described, not read
    _inspect_rows((name, tensor, "") for _, name, tensor in iter_model(path, passthrough=True))
    qc = model_quantization_config(path)
    notes = activation_notes(qc) if qc is not None else []
    if notes:
        print("the config also quantizes, at run time in the engine (not read by arrayquant, which reads weights):")
        print("\n".join(f"  {shown(note)}" for note in notes))
    return 0


def dequantize_file(src: str, dst: str, dtype: str | None = None) -> int:
    """``arrayquant dequantize IN OUT`` for GGUF and Burnpack IN: a safetensors file of floats.

    Quantized tensors become ``dtype`` (default float32); tensors read as float values (GGUF
    types without an arrayquant scheme) and plain arrays are written as they are.
    """
    from .io.formats import iter_tensors

    _output_folder(dst)
    _not_the_input(src, dst)
    counts = {"quantized": 0, "all": 0}
    out_dtype = _np_dtype(dtype or "float32")

    def items() -> Iterator[tuple[str, Any]]:
        for name, tensor, _ in iter_tensors(src):
            counts["all"] += 1
            if isinstance(tensor, QuantizedTensor):
                counts["quantized"] += 1
                tensor = dequantize(tensor, out_dtype)
            yield name, tensor
            del tensor

    save_stream(dst, items(), metadata={"format": "pt"})
    size = Path(dst).stat().st_size / _MiB
    print(f"dequantized {counts['quantized']} of {counts['all']} tensors; wrote {shown(dst)} ({size:.1f} MiB)")
    return 0


def _figure() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise _missing("matplotlib") from None
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    return fig, FigureCanvasAgg(fig)  # the Agg canvas: no display, no global pyplot state


def check_plot_path(path: str) -> None:
    """Refuse a ``--plot`` file matplotlib cannot write (by its extension) before any work."""
    formats = _figure()[1].get_supported_filetypes()
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in formats:
        what = f"'.{ext}'" if ext else "no extension"
        msg = (
            f"--plot {shown(path)} has {what}; matplotlib writes {', '.join('.' + k for k in sorted(formats))} "
            "(e.g. errors.png)"
        )
        raise CommandError(msg)
    _output_folder(path)


def _plot(path: str, stats: ErrorStats, tensors: int) -> None:
    fig, _ = _figure()
    assert stats.hist is not None
    ax = fig.add_subplot()
    ax.stairs(stats.hist, 10.0**_HIST_EDGES, fill=True, alpha=0.7)
    ax.set_xscale("log")
    seen = np.flatnonzero(stats.hist)
    if seen.size:  # the occupied decades, with one to spare on each side
        ax.set_xlim(10.0 ** (_HIST_EDGES[seen[0]] - 1), 10.0 ** (_HIST_EDGES[seen[-1] + 1] + 1))
    ax.set_xlabel("|dequantized - original|")
    ax.set_ylabel("values")
    below = f", {stats.tiny:,} below 1e-12 (exact included)" if stats.tiny else ""
    ax.set_title(f"Quantization error of {stats.count:,} values in {tensors} tensors{below}")
    fig.savefig(path, dpi=100)


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    step = 1 << 20
    return a.size == b.size and all(np.array_equal(a[i : i + step], b[i : i + step]) for i in range(0, a.size, step))


def _check_pair(original: str, quantized: str, orig: Checkpoint, ck: Checkpoint) -> None:
    """Refuse arguments given the wrong way round, or files of two different models."""
    if orig.described:
        swapped = (
            f" and QUANTIZED {shown(quantized)} holds none: the arguments look swapped" if not ck.described else ""
        )
        msg = (
            f"ORIGINAL {shown(original)} holds {len(orig.described)} quantized tensors "
            f"(e.g. {next(iter(orig.described))!r}){swapped}; give the float checkpoint first: "
            "arrayquant compare ORIGINAL QUANTIZED"
        )
        raise CommandError(msg)
    ours, theirs = {e.name for e in ck.tensors}, {e.name for e in orig.tensors}
    if not ours & theirs:
        example = lambda names: f", e.g. {_order(names)[0]!r}" if names else ""
        msg = (
            f"ORIGINAL {shown(original)} ({len(theirs)} tensors{example(theirs)}) and QUANTIZED {shown(quantized)} "
            f"({len(ours)} tensors{example(ours)}) have no tensor name in common; are they checkpoints of one model?"
        )
        raise CommandError(msg)


def compare_checkpoints(
    original: str, quantized: str, plot: str | None = None, calibrations: Sequence[str] = ()
) -> int:
    """``arrayquant compare``: SQNR and maximum error of every tensor of ``quantized`` against ``original``.

    Tensors are listed in natural name order, as ``inspect`` lists them. Exits 1 when the files
    do not fit (ORIGINAL quantized, no name in common, nothing comparable) or an error is not finite.
    Either file may be in any format arrayquant reads (safetensors, a model folder, GGUF, Burnpack).
    With ``calibrations`` (``--calibration``), each quantized tensor is quantized again from
    ORIGINAL with its scheme and each calibration, and a second table shows the SQNR each would
    give and its gain over QUANTIZED's.
    """
    from .io.formats import detect

    if plot:
        check_plot_path(plot)
    new_stats: Callable[[], ErrorStats] = lambda: ErrorStats(
        hist=np.zeros(len(_HIST_EDGES) - 1, np.int64) if plot else None
    )
    if detect(original) == "arrayquant" and detect(quantized) == "arrayquant":
        rows, measured, identical, described = _compare_checkpoint_files(original, quantized, new_stats)
    else:
        rows, measured, identical, described = _compare_any(original, quantized, new_stats)
    total = new_stats()
    for _, stats in measured:
        total.merge(stats)
    print("\n".join(_table(["name", "scheme / dtype", "SQNR dB", "max |err|", "note"], rows, {2, 3})))
    print()
    print(_sqnr_summary(measured) + (f", max |err| {total.max_err:.3e}" if measured else ""))
    if not described:  # a dequantized checkpoint, say: its floats are measured as they are
        print(f"note: QUANTIZED {shown(quantized)} holds no quantized tensor; its floats were compared")
    if not measured and not identical:
        msg = (
            f"no tensor of QUANTIZED {shown(quantized)} matches one of ORIGINAL {shown(original)} in shape "
            "and kind; nothing could be compared"
        )
        raise CommandError(msg)
    if plot:
        _plot(plot, total, len(measured))
        print(f"wrote {shown(plot)}")
    if calibrations:
        _calibration_table(original, quantized, dict(measured), calibrations)
    bad = [n for n, s in measured if not math.isfinite(s.max_err)]
    if bad:
        msg = (
            f"the error of {len(bad)} tensor(s) is not finite (NaN or infinity in either file), "
            f"first {bad[0]!r}; see the table"
        )
        raise CommandError(msg)
    return 0


_Compared = tuple[list[list[str]], list[tuple[str, ErrorStats]], int, bool]


def _calibration_table(
    original: str, quantized: str, given: dict[str, ErrorStats], calibrations: Sequence[str]
) -> None:
    """What each calibration would give: every quantized tensor of ``quantized`` quantized again from
    ``original`` with the same scheme, a row per tensor, a mean gain per calibration."""
    from .io.formats import iter_tensors

    schemes = {n: t.scheme for n, t, _ in iter_tensors(quantized) if isinstance(t, QuantizedTensor) and n in given}
    gains: dict[str, list[float]] = {c: [] for c in calibrations}
    refused: dict[str, str] = {}
    rows: dict[str, list[str]] = {}
    for name, ref, _ in iter_tensors(original):
        if name not in schemes or isinstance(ref, QuantizedTensor):
            continue
        x, before = np.asarray(ref, np.float32), given[name].sqnr
        rows[name] = [shown(name), str(schemes[name]), _fmt_db(before)]
        for c in calibrations:
            try:
                qt = quantize(x, schemes[name], calibration=c)
            except QuantizationError as exc:  # e.g. 4over6 with an integer scheme: shown as "-"
                refused.setdefault(c, f"{type(exc).__name__}: {exc}")
                rows[name].append("-")
                continue
            after = quantization_error(x, qt, ErrorStats()).sqnr
            gain = after - before
            if math.isfinite(gain):
                gains[c].append(gain)
            rows[name].append(f"{_fmt_db(after)} ({gain:+.2f})" if math.isfinite(gain) else _fmt_db(after))
    print("\nSQNR dB if quantized again from ORIGINAL with each calibration (gain over QUANTIZED's):")
    header = ["name", "scheme", "QUANTIZED", *calibrations]
    print("\n".join(_table(header, [rows[n] for n in _order(rows)], set(range(2, len(header))))))
    for c in calibrations:
        if gains[c]:
            print(f"{c}: mean gain {sum(gains[c]) / len(gains[c]):+.2f} dB over {len(gains[c])} tensors")
        if c in refused:
            print(f"{c}: not used where shown '-' ({refused[c]})")


def _compare_checkpoint_files(original: str, quantized: str, new_stats: Callable[[], ErrorStats]) -> _Compared:
    """The rows of ``compare`` for two safetensors files, read by name from either."""
    rows: list[list[str]] = []
    measured: list[tuple[str, ErrorStats]] = []
    identical = 0
    with Checkpoint(original) as orig, Checkpoint(quantized) as ck:
        _check_pair(original, quantized, orig, ck)
        described = bool(ck.described)
        by_name = {e.name: e for e in ck.tensors}
        for name in _order(by_name.keys() | {e.name for e in orig.tensors}):
            if name not in by_name:
                rows.append([shown(name), "-", "-", "-", "missing from QUANTIZED"])
                continue
            e = by_name[name]
            if name not in orig.entries:
                rows.append([shown(name), "-", "-", "-", "only in QUANTIZED"])
                continue
            ref = orig.entries[name]
            if name in ck.described:
                qt = ck.quantized(name)
                if tuple(qt.shape) != ref.shape:
                    msg = f"tensor {name!r} is {list(qt.shape)} in {quantized} but {list(ref.shape)} in {original}"
                    raise ShapeError(msg)
                stats, kind = quantization_error(orig.array(name), qt, new_stats()), str(qt.scheme)
            elif e.dtype == ref.dtype and e.shape == ref.shape and _same_bytes(ck.raw(name), orig.raw(name)):
                rows.append([shown(name), _PLAIN[e.dtype][1], "inf", "0", "identical"])
                identical += 1
                continue
            elif e.dtype in FLOAT_HEADERS and ref.dtype in FLOAT_HEADERS and e.shape == ref.shape:
                stats, kind = _plain_error(orig.array(name), ck.array(name), new_stats()), _PLAIN[e.dtype][1]
            else:
                rows.append([shown(name), _PLAIN[e.dtype][1], "-", "-", "differs"])
                continue
            measured.append((name, stats))
            rows.append([shown(name), kind, _fmt_db(stats.sqnr), f"{stats.max_err:.3e}", ""])
    return rows, measured, identical, described


def _compare_any(original: str, quantized: str, new_stats: Callable[[], ErrorStats]) -> _Compared:
    """The rows of ``compare`` for files of any format, each read once in its own order.

    ORIGINAL is read along with QUANTIZED: a tensor of ORIGINAL passed over on the way to the next
    one asked for is kept until asked for, so files in the same order (a re-quantized GGUF or
    Burnpack, a model folder and its quantized copy) hold one tensor of each at a time.
    """
    from .io.formats import iter_tensors

    ahead = iter_tensors(original)
    kept: dict[str, Any] = {}

    def reference(name: str) -> Any:
        while name not in kept:
            found = next(ahead, None)
            if found is None:
                return None
            if isinstance(found[1], QuantizedTensor):
                msg = (
                    f"ORIGINAL {shown(original)} holds quantized tensors (e.g. {found[0]!r}); give the float "
                    "model first: arrayquant compare ORIGINAL QUANTIZED"
                )
                raise CommandError(msg)
            kept[found[0]] = found[1]
        return kept.pop(name)

    rows: dict[str, list[str]] = {}
    measured: list[tuple[str, ErrorStats]] = []
    identical, described = 0, False
    for name, item, _ in iter_tensors(quantized):
        ref = reference(name)
        if ref is None:
            rows[name] = [shown(name), "-", "-", "-", "only in QUANTIZED"]
            continue
        if isinstance(item, QuantizedTensor):
            described = True
            if tuple(item.shape) != tuple(ref.shape):
                msg = f"tensor {name!r} is {list(item.shape)} in {quantized} but {list(ref.shape)} in {original}"
                raise ShapeError(msg)
            stats, kind = quantization_error(np.asarray(ref, np.float32), item, new_stats()), str(item.scheme)
        elif item.dtype == ref.dtype and item.shape == ref.shape and _same_bytes(item, ref):
            rows[name] = [shown(name), str(item.dtype), "inf", "0", "identical"]
            identical += 1
            continue
        elif _floating(item) and _floating(ref) and item.shape == ref.shape:
            stats, kind = _plain_error(ref, item, new_stats()), str(item.dtype)
        else:
            rows[name] = [shown(name), str(item.dtype), "-", "-", "differs"]
            continue
        measured.append((name, stats))
        rows[name] = [shown(name), kind, _fmt_db(stats.sqnr), f"{stats.max_err:.3e}", ""]
    for name, _, _ in itertools.chain(((n, None, "") for n in kept), ahead):
        rows.setdefault(name, [shown(name), "-", "-", "-", "missing from QUANTIZED"])
    if not measured and not identical:
        theirs = len(rows)
        if not any(r[-1] not in ("only in QUANTIZED", "missing from QUANTIZED") for r in rows.values()):
            msg = (
                f"ORIGINAL {shown(original)} and QUANTIZED {shown(quantized)} have no tensor name in common "
                f"({theirs} names in all); are they files of one model?"
            )
            raise CommandError(msg)
    return [rows[n] for n in _order(rows)], measured, identical, described


def _floating(a: Any) -> bool:
    return np.issubdtype(a.dtype, np.floating) or a.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def write_demo_checkpoint(path: str, data: Callable[..., np.ndarray]) -> int:
    """A small f32 model checkpoint: two layers of 2-D weights, with 1-D norms and biases."""
    _output_folder(path)
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
    size = Path(path).stat().st_size / _MiB
    print(f"wrote {shown(path)}: {len(tensors)} float32 tensors ({size:.1f} MiB)")
    return 0
