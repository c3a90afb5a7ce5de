"""The errors the commands report: measured in row slabs, summed up in one SQNR line and a quality warning.

A quantized tensor's error is measured a slab of whole blocks at a time against its original,
never as a full-size float64 copy. :class:`ErrorStats` is an
:class:`~arrayquant.metrics.ErrorMeter` with, for ``compare --plot``, a histogram of the errors.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import array_api_compat as compat
import numpy as np

from ..backends import shim
from ..chunks import Chunk, row_chunks
from ..dequantize import dequantize
from ..invariants import plan_for
from ..metrics import ErrorMeter
from ..storage import pack_unit
from ..tensor import QuantizedTensor
from .common import shown

__all__ = [
    "HIST_EDGES",
    "QUALITY_FLOOR_DB",
    "ErrorStats",
    "fmt_db",
    "plain_error",
    "quality_warning",
    "quantization_error",
    "sqnr_summary",
]

_SLAB = 1 << 18  # elements per error slab: a few MiB of float64 temporaries
HIST_EDGES = np.linspace(-12.0, 2.0, 141)  # log10 |error| bins, 0.1 decade each
QUALITY_FLOOR_DB = 3.0  # an SQNR below it: the error holds more than half the energy of the weights


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
            small = err < 10.0 ** HIST_EDGES[0]
            self.tiny += int(np.count_nonzero(small))
            logs = np.log10(err[~small & ~np.isnan(err)])
            self.hist += np.histogram(np.minimum(logs, HIST_EDGES[-1]), HIST_EDGES)[0]

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
    chunks = row_chunks(qt.shape, dims[0] if dims else 1, plan.packed_axis(rank), pack_unit(plan), True)
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


def _part_of_grid(rows: slice | None) -> Any:
    """The rows of a grid (scales, zero points, offsets) a slab needs: all of them per tensor."""
    return lambda g: g if rows is None or g is None else g[rows, ...]


def quantization_error(x: Any, qt: QuantizedTensor, stats: ErrorStats) -> ErrorStats:
    """Add the error of ``qt`` against the original ``x`` (any backend, or anything whose
    ``x[rows, ...]`` reads those rows) to ``stats``, slab by slab."""
    xp = compat.array_namespace(qt.values)
    per_tensor = not plan_for(qt.scheme).block_dims(len(qt.shape))
    for s in _slabs(qt):
        rows = s.rows.stop - s.rows.start
        grid = _part_of_grid(None if per_tensor else s.grid)
        part = QuantizedTensor(
            qt.scheme,
            (rows, *qt.shape[1:]),
            qt.dtype,
            qt.values[s.stored, ...],
            grid(qt.scales),
            qt.global_scale,
            qt.table,
            grid(qt.zero_point),
            grid(qt.offset),
        )
        stats.add(shim.to_host(x[s.rows, ...]), shim.to_host(dequantize(part, xp.float32)))
    return stats


def plain_error(x: np.ndarray, y: np.ndarray, stats: ErrorStats) -> ErrorStats:
    """Add the error of the float array ``y`` against ``x`` to ``stats``, in row slabs."""
    x2, y2 = x.reshape(x.shape[0] if x.ndim else 1, -1), y.reshape(y.shape[0] if y.ndim else 1, -1)
    step = max(1, _SLAB // max(x2.shape[1], 1))
    for r in range(0, x2.shape[0], step):
        stats.add(x2[r : r + step], y2[r : r + step])
    return stats


def fmt_db(v: float) -> str:
    """An SQNR in dB as the tables show it."""
    return "inf" if v == math.inf else "-inf" if v == -math.inf else f"{v:.2f}"


def _worst_first(s: float) -> tuple[bool, float]:
    """The sort key of an SQNR, worst first: NaN is worse than any number."""
    return (not math.isnan(s), s)


def sqnr_summary(rows: Sequence[tuple[str, ErrorStats]]) -> str:
    """The line with the mean and worst SQNR of the tensors of ``rows``."""
    if not rows:
        return "SQNR: n/a (no quantized tensor)"
    finite = [s.sqnr for _, s in rows if math.isfinite(s.sqnr)]
    mean = sum(finite) / len(finite) if finite else math.inf
    worst_name, worst = min(rows, key=lambda r: _worst_first(r[1].sqnr))
    return f"SQNR: mean {fmt_db(mean)} dB, worst {fmt_db(worst.sqnr)} dB ({shown(worst_name)})"


def quality_warning(rows: Sequence[tuple[str, ErrorStats]]) -> None:
    """Warn on stderr about quantized tensors whose SQNR is below :data:`QUALITY_FLOOR_DB`, or NaN."""
    low = [(n, s) for n, s in rows if not s.sqnr >= QUALITY_FLOOR_DB]
    if not low:
        return
    name, worst = min(low, key=lambda r: _worst_first(r[1].sqnr))
    print(
        f"warning: {len(low)} of {len(rows)} quantized tensors are below {QUALITY_FLOOR_DB:g} dB SQNR, where the "
        f"error holds more than half the energy of the weights (worst {fmt_db(worst.sqnr)} dB, {shown(name)}); "
        "a scheme with more bits or smaller blocks, or --calibration mse, keeps more of them",
        file=sys.stderr,
    )
