"""How far a quantized tensor is from the original: SQNR, maximum error and RMSE.

:func:`sqnr` and :func:`error_report` take arrays of any backend (and a
:class:`~arrayquant.QuantizedTensor` as the approximation, dequantized first); the sums run in
float64 on the host, a slab at a time, so the temporaries stay a few MiB whatever the size.
:class:`ErrorMeter` adds pieces of one tensor, or several tensors, into one report: the
``arrayquant`` command line measures its checkpoints with it.

The energies are kept as ``scale**2 * sum((v / scale)**2)`` with ``scale`` the largest
magnitude seen, so neither huge float64 values (whose squares overflow) nor tiny ones (whose
squares underflow) change the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import array_api_compat as compat
import numpy as np

from .backends import shim
from .errors import DTypeError, ShapeError
from .tensor import QuantizedTensor

__all__ = ["ErrorMeter", "ErrorReport", "error_report", "sqnr"]

_SLAB = 1 << 18  # elements per step: a few MiB of float64 temporaries


@dataclass(frozen=True)
class ErrorReport:
    """Error of an approximation ``y`` against a reference ``x``.

    Attributes
    ----------
    count : int
        Number of values compared.
    max_abs_error : float
        ``max |y - x|``; 0 for no values, NaN if a NaN is involved.
    rmse : float
        Root mean square error ``sqrt(mean((y - x)**2))``; 0 for no values.
    sqnr : float
        Signal to quantization noise ratio ``10 log10(sum(x**2) / sum((y - x)**2))`` in dB,
        with the conventions of :func:`sqnr`.
    """

    count: int
    max_abs_error: float
    rmse: float
    sqnr: float


class _Energy:
    """A sum of squares kept as ``scale**2 * ssq`` (no overflow or underflow), or NaN / inf."""

    def __init__(self) -> None:
        self.scale, self.ssq, self.nan, self.inf = 0.0, 0.0, False, False

    def add(self, a: np.ndarray) -> None:
        """Add the squares of ``a``: non-negative float64 magnitudes (NaN allowed)."""
        if not a.size:
            return
        top = float(a.max())  # NaN if any is NaN
        if math.isnan(top):
            self.nan = True
        elif top == math.inf:
            self.inf = True
        elif top > 0:
            if top > self.scale:
                self.ssq *= (self.scale / top) ** 2
                self.scale = top
            t = a / self.scale
            self.ssq += float(np.dot(t, t))

    def merge(self, other: _Energy) -> None:
        self.nan |= other.nan
        self.inf |= other.inf
        if other.scale > 0:
            if other.scale > self.scale:
                self.ssq *= (self.scale / other.scale) ** 2
                self.scale = other.scale
            self.ssq += other.ssq * (other.scale / self.scale) ** 2

    @property
    def zero(self) -> bool:
        return self.scale == 0 and not (self.nan or self.inf)

    def log10(self) -> float:
        """``log10`` of the (finite, non-zero) energy."""
        return 2 * math.log10(self.scale) + math.log10(self.ssq)


def _host(a: Any, what: str) -> np.ndarray:
    if isinstance(a, QuantizedTensor):
        from .dequantize import dequantize

        a = dequantize(a, compat.array_namespace(a.values).float32)
    host = shim.to_host(a) if compat.is_array_api_obj(a) else np.asarray(a)
    if np.iscomplexobj(host) or host.dtype.kind in "OUSMm":
        msg = f"{what} must hold real numbers, got dtype {host.dtype}"
        raise DTypeError(msg)
    return host


class ErrorMeter:
    """Running error statistics of approximations against references, added piece by piece.

    ``add`` a tensor's slabs, or several tensors, then ask for the :meth:`report`; two meters
    :meth:`merge`. The result does not depend on how the values were split.

    Examples
    --------
    >>> import numpy as np
    >>> from arrayquant.metrics import ErrorMeter
    >>> meter = ErrorMeter()
    >>> meter.add(np.array([3.0, 4.0]), np.array([3.0, 4.5]))
    >>> meter.add(np.array([0.0]), np.array([-0.5]))
    >>> r = meter.report()
    >>> r.count, r.max_abs_error, round(r.sqnr, 3)
    (3, 0.5, 16.99)
    """

    def __init__(self) -> None:
        self.count = 0
        self.max_abs_error = 0.0
        self._signal = _Energy()
        self._noise = _Energy()

    def add(self, x: Any, y: Any) -> None:
        """Add the error of ``y`` against the reference ``x`` (same shape, any backend).

        Raises
        ------
        ShapeError
            If the shapes differ.
        DTypeError
            If either holds complex numbers or non-numbers.
        """
        hx, hy = _host(x, "x"), _host(y, "y")
        if hx.shape != hy.shape:
            msg = f"x has shape {hx.shape} but y has shape {hy.shape}; compare arrays of one shape"
            raise ShapeError(msg)
        fx, fy = hx.reshape(-1), hy.reshape(-1)
        for i in range(0, fx.size, _SLAB):
            a = np.asarray(fx[i : i + _SLAB], np.float64)
            err = np.array(fy[i : i + _SLAB], np.float64)  # a copy: the error is made in place
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, on purpose
                np.subtract(err, a, out=err)
            self.add_error(a, err)

    def add_error(self, x: np.ndarray, err: np.ndarray) -> None:
        """Add float64 references ``x`` and their errors ``err`` (made absolute in place)."""
        self._signal.add(np.abs(x))
        np.abs(err, out=err)
        self._noise.add(err)
        self.count += err.size
        if err.size:
            self.max_abs_error = float(np.maximum(self.max_abs_error, err.max()))

    def merge(self, other: ErrorMeter) -> None:
        """Add everything ``other`` has seen."""
        self.count += other.count
        self.max_abs_error = float(np.maximum(self.max_abs_error, other.max_abs_error))
        self._signal.merge(other._signal)
        self._noise.merge(other._noise)

    @property
    def sqnr(self) -> float:
        """The SQNR in dB of what has been added so far (see :func:`sqnr`)."""
        s, n = self._signal, self._noise
        if s.nan or n.nan:
            return math.nan
        if n.inf:
            return math.nan if s.inf else -math.inf
        if n.zero:
            return math.inf
        if s.inf:
            return math.inf
        if s.zero:
            return -math.inf
        return 10 * (s.log10() - n.log10())

    @property
    def rmse(self) -> float:
        """The root mean square error of what has been added so far."""
        n = self._noise
        if n.nan:
            return math.nan
        if n.inf:
            return math.inf
        return 0.0 if n.zero else n.scale * math.sqrt(n.ssq / self.count)

    def report(self) -> ErrorReport:
        """The :class:`ErrorReport` of everything added."""
        return ErrorReport(self.count, self.max_abs_error, self.rmse, self.sqnr)


def error_report(x: Any, y: Any) -> ErrorReport:
    """Maximum absolute error, RMSE and SQNR of ``y`` against the reference ``x``.

    Parameters
    ----------
    x : array
        The reference (original) values: an array of any supported backend, or anything
        ``numpy.asarray`` takes. Real numbers of any dtype (bfloat16 and fp8 included).
    y : array or QuantizedTensor
        The approximation, of the same shape. A quantized tensor is dequantized (to float32)
        first.

    Returns
    -------
    ErrorReport
        ``count``, ``max_abs_error``, ``rmse`` and ``sqnr`` (dB), computed in float64 on the host.

    Raises
    ------
    ShapeError
        If ``x`` and ``y`` have different shapes.
    DTypeError
        If either holds complex numbers or non-numbers.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayquant as aq
    >>> from arrayquant.metrics import error_report
    >>> x = np.array([[0.5, -1.0, 0.25, 2.0]], np.float32)
    >>> r = error_report(x, aq.quantize(x, "q8s"))
    >>> r.count, r.max_abs_error < 2 / 127, r.sqnr > 40
    (4, True, True)
    """
    meter = ErrorMeter()
    meter.add(x, y)
    return meter.report()


def sqnr(x: Any, y: Any) -> float:
    """Signal to quantization noise ratio of ``y`` against the reference ``x``, in dB.

    ``10 * log10(sum(x**2) / sum((y - x)**2))``, computed in float64 on the host without
    overflow or underflow of the squares. Higher is better: each bit of a uniform quantizer adds
    about 6 dB.

    Parameters
    ----------
    x : array
        The reference (original) values, of any supported backend (or anything
        ``numpy.asarray`` takes).
    y : array or QuantizedTensor
        The approximation, of the same shape; a quantized tensor is dequantized first.

    Returns
    -------
    float
        The ratio in dB. ``inf`` when ``y`` equals ``x`` (no noise, an all-zero or empty ``x``
        included); ``-inf`` when ``x`` is all zeros but ``y`` is not, or when the error is
        infinite; ``nan`` when a NaN is involved or both signal and error are infinite.

    Raises
    ------
    ShapeError
        If ``x`` and ``y`` have different shapes.
    DTypeError
        If either holds complex numbers or non-numbers.

    Examples
    --------
    >>> import numpy as np
    >>> from arrayquant.metrics import sqnr
    >>> x = np.array([3.0, 4.0])
    >>> sqnr(x, np.array([3.0, 4.5]))  # 10 log10(25 / 0.25)
    20.0
    >>> sqnr(x, x)
    inf
    """
    return error_report(x, y).sqnr
