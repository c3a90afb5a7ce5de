"""The per-chunk steps of affine (de)quantization, shared by the eager row-slab driver and the dask graph.

An affine scheme carries a second grid beside its scales: integer zero points (``x = s * (q - z)``)
or float offsets (``x = d * q + m``), see :mod:`arrayquant.kernels.affine`. As for the symmetric
steps (:mod:`arrayquant.blockwork`), a chunk is cut at whole blocks and whole packing units, and
nothing here looks outside it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from array_api_compat import device as device_of

from .invariants import Plan, can_read
from .kernels import as_blocks, from_blocks, grid_as_blocks, pad_to_blocks
from .kernels.affine import affine_decode, affine_encode, affine_params, affine_range, may_overflow
from .kernels.qparams import store_scales
from .kernels.roundup import round_down_signed
from .kernels.search import (
    element_weights,
    nearest_rank,
    order_statistics,
    percentile_bounds,
    search_blocks,
    signed_counts,
)
from .scheme import F32_MAX, Calibration, QuantMode
from .storage import pack_codes, unpack_values

__all__ = ["AffineSteps"]


@dataclass(frozen=True)
class AffineSteps:
    """How to calibrate, encode and decode chunks of data of ``shape`` (the whole array's) under an affine ``plan``.

    ``scrub`` marks input not verified finite: calibration then takes the finite values alone and
    NaN encodes to the code nearest 0.
    """

    plan: Plan
    shape: tuple[int, ...]
    rounding: str = "half_even"
    scrub: bool = False
    spec: Any = None  # the CalSpec of an MSE search or a percentile (None: MinMax)

    @property
    def dims(self) -> tuple[int, ...]:
        return self.plan.block_dims(self.shape)

    @property
    def searches(self) -> bool:
        """Whether each range is searched (MSE): candidates ``(f * lo, f * hi)`` for the search's factors ``f``."""
        return self.spec is not None and self.spec.searches

    @property
    def percentile(self) -> bool:
        """Whether each range is the percentile one: ``k``-th largest and ``k``-th smallest, ``k = ceil(q * n)``."""
        return self.spec is not None and self.spec.kind is Calibration.PERCENTILE

    def finite(self, xc: Any, *, xp: Any) -> Any:
        """The chunk in f32, non-finite values as 0 when the input is not verified finite."""
        xf = xp.astype(xc, xp.float32, copy=False)
        if not self.scrub:
            return xf
        return xp.where(xp.isfinite(xf), xf, xp.asarray(0.0, dtype=xp.float32, device=device_of(xf)))

    def roundtrip(self, xb: Any, lo: Any, hi: Any, *, xp: Any) -> Any:
        """Quantize then dequantize ``xb`` under the parameters of the range ``(lo, hi)`` (broadcastable)."""
        s, zero = self.params(lo, hi, xp=xp)
        q = affine_encode(xb, s, zero, self.plan, rounding=self.rounding, scrub_nan=False, xp=xp)
        return affine_decode(q, s, zero, self.plan, xp=xp)

    def search(self, xc: Any, lo: Any, hi: Any, importance: Any, *, xp: Any) -> tuple[Any, Any]:
        """The searched range per block of a chunk: ``(f * lo, f * hi)`` of the least weighted error.

        As llm-compressor's MSE observer shrinks an asymmetric range: both ends by the same factor.
        Errors are ``sum w * |x - deq|^norm`` per block in units of the power of two not below
        ``max(|lo|, |hi|)``; a later (smaller) factor wins only with a strictly smaller error.
        """
        xf = self.finite(xc, xp=xp)
        lo_b, hi_b = grid_as_blocks(lo, xp=xp), grid_as_blocks(hi, xp=xp)
        f = search_blocks(
            xf,
            xp.ones(tuple(lo.shape), dtype=xp.float32, device=device_of(lo)),
            self.dims,
            self.spec.factors,
            self.spec.norm,
            element_weights(tuple(xf.shape), importance, xp=xp, device=device_of(xf)),
            scale_of=lambda factor: factor,
            roundtrip=lambda xb, fb: self.roundtrip(xb, xp.multiply(lo_b, fb), xp.multiply(hi_b, fb), xp=xp),
            unit_of=xp.maximum(xp.abs(lo), xp.abs(hi)),
            xp=xp,
        )
        return xp.multiply(lo, f), xp.multiply(hi, f)

    def range(self, xc: Any, *, xp: Any) -> tuple[Any, Any]:
        """``(min, max)`` per block of the chunk (``(1,)`` each per tensor), f32; the percentile range per block.

        A per-tensor percentile needs every slab at once: :meth:`tensor_percentile`.
        """
        if self.percentile and self.dims:
            return self.percentile_range(xc, xp=xp)
        return affine_range(xc, self.dims, xp=xp, finite_only=self.scrub)

    def percentile_range(self, xc: Any, *, xp: Any) -> tuple[Any, Any]:
        """The percentile ``(lo, hi)`` per block of a chunk cut at whole blocks (see :func:`percentile_bounds`).

        Unverified input is calibrated as :meth:`finite` gives it (NaN and infinities as 0, counted
        among the ``n``); verified input that holds NaN or infinities gives a non-finite range for
        the whole chunk (sorting would never pick them), so that the finiteness check reports them.
        """
        xf = self.finite(xc, xp=xp)
        lo, hi = percentile_bounds(xf, self.dims, self.spec.q_num, self.spec.q_den, xp=xp)
        lo, hi = _uncross(lo, hi, xp=xp)
        if self.scrub:
            return lo, hi
        return _unless_finite(lo, hi, xp.max(xp.abs(xf)), xp=xp)

    def tensor_percentile(self, slabs: Sequence[Any], *, xp: Any) -> tuple[Any, Any]:
        """The per-tensor percentile ``(lo, hi)`` of an eager array given as row slabs, ``(1,)`` each.

        Counting passes over the slabs (:func:`~arrayquant.kernels.search.order_statistics`): no
        sorted copy is held.
        """

        def count(sign: Any, value: Any) -> Any:
            return functools.reduce(xp.add, (signed_counts(self.finite(s, xp=xp), sign, value, xp=xp) for s in slabs))

        top = None
        if not self.scrub:
            top = functools.reduce(xp.maximum, [xp.reshape(xp.max(xp.abs(self.finite(s, xp=xp))), (1,)) for s in slabs])
        return self.percentile_of(count, top, xp=xp, device=device_of(slabs[0]))

    def percentile_of(self, count: Callable[[Any, Any], Any], top: Any, *, xp: Any, device: Any) -> tuple[Any, Any]:
        """The per-tensor percentile range from a counting function; ``top`` is ``max|x|`` (None if scrubbed).

        NaN and infinities are never picked: a non-finite ``top`` becomes both ends instead, so
        the finiteness check still sees them.
        """
        n = math.prod(self.shape)
        lo, hi = order_statistics(count, n, nearest_rank(n, self.spec.q_num, self.spec.q_den), xp=xp, device=device)
        lo, hi = _uncross(lo, hi, xp=xp)
        return (lo, hi) if top is None else _unless_finite(lo, hi, top, xp=xp)

    def params(self, lo: Any, hi: Any, *, xp: Any) -> tuple[Any, Any]:
        """Stored scales and zero points (f32 integers) or offsets from a finite range."""
        return affine_params(lo, hi, self.plan, xp=xp)

    def stored(self, scales: Any, zero: Any, *, xp: Any) -> tuple[Any, Any]:
        """Given (static) parameters as stored: scales rounded up, offsets rounded down, zero points as they are."""
        plan = self.plan
        s = store_scales(scales, plan, xp=xp)
        if plan.mode is QuantMode.OFFSET:
            zero = round_down_signed(zero, plan.scale_dtype, xp=xp)
        return s, zero

    def as_stored_zero(self, zero: Any, *, xp: Any) -> Any:
        """The second grid as a tensor holds it: zero points in the codes' dtype, offsets f32."""
        if self.plan.mode is QuantMode.ZERO_POINT:
            return xp.astype(zero, getattr(xp, self.plan.code_dtype))
        return zero

    def codes(self, xc: Any, s: Any, zero: Any, *, xp: Any) -> Any:
        """Codes of the chunk under its part of the grids (``(1,)`` each per tensor)."""
        xc = xp.astype(xc, xp.float32, copy=False)
        zero = xp.astype(zero, xp.float32, copy=False)
        enc = lambda y, s_, z_: affine_encode(y, s_, z_, self.plan, rounding=self.rounding, scrub_nan=self.scrub, xp=xp)
        dims = self.dims
        if not dims:
            return enc(xc, s, zero)
        xb = as_blocks(pad_to_blocks(xc, dims, xp=xp, edge=False), dims, xp=xp)
        q = enc(xb, grid_as_blocks(s, xp=xp), grid_as_blocks(zero, xp=xp))
        return from_blocks(q, tuple(xc.shape), xp=xp)

    def values(self, xc: Any, s: Any, zero: Any, *, xp: Any) -> Any:
        """The chunk's codes in the scheme's storage form."""
        return pack_codes(self.codes(xc, s, zero, xp=xp), self.plan, xp=xp)

    def decode(self, values: Any, s: Any, zero: Any, n_packed: int, *, xp: Any) -> Any:
        """f32 values of a chunk of stored values; ``n_packed`` is its unpadded packed-axis length."""
        plan = self.plan
        codes = unpack_values(values, plan, len(self.shape), n_packed, xp=xp)
        dims = self.dims
        if not dims:
            y = affine_decode(codes, s, zero, plan, xp=xp)
        else:
            cb = as_blocks(pad_to_blocks(codes, dims, xp=xp, edge=False), dims, xp=xp)
            yb = affine_decode(cb, grid_as_blocks(s, xp=xp), grid_as_blocks(zero, xp=xp), plan, xp=xp)
            y = from_blocks(yb, tuple(codes.shape), xp=xp)
        if not can_read(s) or may_overflow(s, zero, plan, xp=xp):
            # why: a rounded-up scale times the widest code difference can pass the f32 maximum for
            # data spanning nearly all of f32; that data was finite, so saturate instead of inf
            y = xp.clip(y, -F32_MAX, F32_MAX)
        return y


def _uncross(lo: Any, hi: Any, *, xp: Any) -> tuple[Any, Any]:
    """A crossed percentile range (``lo > hi``: below ``q = 50`` the trimmed tails overlap) collapses to its midpoint.

    The midpoint is ``lo / 2 + hi / 2`` in f32 (never overflows; exact halving but for subnormals),
    so the range stays a valid one for both modes and ``x -> -x`` mirrors it.
    """
    half = xp.asarray(0.5, dtype=xp.float32, device=device_of(lo))
    crossed = lo > hi
    mid = xp.add(xp.multiply(lo, half), xp.multiply(hi, half))
    return xp.where(crossed, mid, lo), xp.where(crossed, mid, hi)


def _unless_finite(lo: Any, hi: Any, top: Any, *, xp: Any) -> tuple[Any, Any]:
    """``(lo, hi)``, or ``top`` for both where ``top`` (the data's ``max|x|``) is not finite."""
    keep = xp.isfinite(top)
    return xp.where(keep, lo, top), xp.where(keep, hi, top)
