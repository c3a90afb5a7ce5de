"""``arrayquant compare``: per-tensor SQNR and maximum error of a quantized checkpoint against its
original, in any format arrayquant reads; ``--plot`` draws the errors (matplotlib, imported here
only when asked), ``--calibration`` shows what each calibration would have given."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import QuantizationError, ShapeError
from ..io.arrayquant.layout import Checkpoint
from ..io.arrayquant.requantize import FLOAT_DTYPES
from ..io.formats import detect, iter_tensors
from ..io.safetensors.reader import PLAIN
from ..quantize import quantize
from ..tensor import QuantizedTensor
from .common import CommandError, missing, natural_order, output_folder, shown, table
from .stats import HIST_EDGES, ErrorStats, fmt_db, plain_error, quantization_error, sqnr_summary

__all__ = ["check_plot_path", "run"]


def _figure() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise missing("matplotlib") from None
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
    output_folder(path)


def _plot(path: str, stats: ErrorStats, tensors: int) -> None:
    fig, _ = _figure()
    assert stats.hist is not None
    ax = fig.add_subplot()
    ax.stairs(stats.hist, 10.0**HIST_EDGES, fill=True, alpha=0.7)
    ax.set_xscale("log")
    seen = np.flatnonzero(stats.hist)
    if seen.size:  # the occupied decades, with one to spare on each side
        ax.set_xlim(10.0 ** (HIST_EDGES[seen[0]] - 1), 10.0 ** (HIST_EDGES[seen[-1] + 1] + 1))
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
        example = lambda names: f", e.g. {natural_order(names)[0]!r}" if names else ""
        msg = (
            f"ORIGINAL {shown(original)} ({len(theirs)} tensors{example(theirs)}) and QUANTIZED {shown(quantized)} "
            f"({len(ours)} tensors{example(ours)}) have no tensor name in common; are they checkpoints of one model?"
        )
        raise CommandError(msg)


def run(original: str, quantized: str, plot: str | None = None, calibrations: Sequence[str] = ()) -> int:
    """``arrayquant compare``: SQNR and maximum error of every tensor of ``quantized`` against ``original``.

    Tensors are listed in natural name order, as ``inspect`` lists them. Exits 1 when the files
    do not fit (ORIGINAL quantized, no name in common, nothing comparable) or an error is not finite.
    Either file may be in any format arrayquant reads (safetensors, a model folder, GGUF, Burnpack).
    With ``calibrations`` (``--calibration``), each quantized tensor is quantized again from
    ORIGINAL with its scheme and each calibration, and a second table shows the SQNR each would
    give and its gain over QUANTIZED's.
    """
    if plot:
        check_plot_path(plot)
    new_stats: Callable[[], ErrorStats] = lambda: ErrorStats(
        hist=np.zeros(len(HIST_EDGES) - 1, np.int64) if plot else None
    )
    if detect(original) == "arrayquant" and detect(quantized) == "arrayquant":
        rows, measured, identical, described = _compare_checkpoint_files(original, quantized, new_stats)
    else:
        rows, measured, identical, described = _compare_any(original, quantized, new_stats)
    total = new_stats()
    for _, stats in measured:
        total.merge(stats)
    print("\n".join(table(["name", "scheme / dtype", "SQNR dB", "max |err|", "note"], rows, {2, 3})))
    print()
    print(sqnr_summary(measured) + (f", max |err| {total.max_err:.3e}" if measured else ""))
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
        _calibrationtable(original, quantized, dict(measured), calibrations)
    bad = [n for n, s in measured if not math.isfinite(s.max_err)]
    if bad:
        msg = (
            f"the error of {len(bad)} tensor(s) is not finite (NaN or infinity in either file), "
            f"first {bad[0]!r}; see the table"
        )
        raise CommandError(msg)
    return 0


_Compared = tuple[list[list[str]], list[tuple[str, ErrorStats]], int, bool]


def _calibrationtable(original: str, quantized: str, given: dict[str, ErrorStats], calibrations: Sequence[str]) -> None:
    """What each calibration would give: every quantized tensor of ``quantized`` quantized again from
    ``original`` with the same scheme, a row per tensor, a mean gain per calibration."""
    schemes = {n: t.scheme for n, t, _ in iter_tensors(quantized) if isinstance(t, QuantizedTensor) and n in given}
    gains: dict[str, list[float]] = {c: [] for c in calibrations}
    refused: dict[str, str] = {}
    rows: dict[str, list[str]] = {}
    for name, ref, _ in iter_tensors(original):
        if name not in schemes or isinstance(ref, QuantizedTensor):
            continue
        x, before = np.asarray(ref, np.float32), given[name].sqnr
        rows[name] = [shown(name), str(schemes[name]), fmt_db(before)]
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
            rows[name].append(f"{fmt_db(after)} ({gain:+.2f})" if math.isfinite(gain) else fmt_db(after))
    print("\nSQNR dB if quantized again from ORIGINAL with each calibration (gain over QUANTIZED's):")
    header = ["name", "scheme", "QUANTIZED", *calibrations]
    print("\n".join(table(header, [rows[n] for n in natural_order(rows)], set(range(2, len(header))))))
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
        for name in natural_order(by_name.keys() | {e.name for e in orig.tensors}):
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
                rows.append([shown(name), PLAIN[e.dtype][1], "inf", "0", "identical"])
                identical += 1
                continue
            elif e.dtype in FLOAT_DTYPES and ref.dtype in FLOAT_DTYPES and e.shape == ref.shape:
                stats, kind = plain_error(orig.array(name), ck.array(name), new_stats()), PLAIN[e.dtype][1]
            else:
                rows.append([shown(name), PLAIN[e.dtype][1], "-", "-", "differs"])
                continue
            measured.append((name, stats))
            rows.append([shown(name), kind, fmt_db(stats.sqnr), f"{stats.max_err:.3e}", ""])
    return rows, measured, identical, described


def _compare_any(original: str, quantized: str, new_stats: Callable[[], ErrorStats]) -> _Compared:
    """The rows of ``compare`` for files of any format, each read once in its own order.

    ORIGINAL is read along with QUANTIZED: a tensor of ORIGINAL passed over on the way to the next
    one asked for is kept until asked for, so files in the same order (a re-quantized GGUF or
    Burnpack, a model folder and its quantized copy) hold one tensor of each at a time.
    """
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
            stats, kind = plain_error(ref, item, new_stats()), str(item.dtype)
        else:
            rows[name] = [shown(name), str(item.dtype), "-", "-", "differs"]
            continue
        measured.append((name, stats))
        rows[name] = [shown(name), kind, fmt_db(stats.sqnr), f"{stats.max_err:.3e}", ""]
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
    return [rows[n] for n in natural_order(rows)], measured, identical, described


def _floating(a: Any) -> bool:
    return np.issubdtype(a.dtype, np.floating) or a.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")
