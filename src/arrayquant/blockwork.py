"""The per-chunk steps of (de)quantization, shared by the eager row-slab driver and the dask graph.

A chunk here is any part of the data cut at whole blocks (and whole packed words along the packed
axis): calibrating it, encoding it with its scales and decoding it never look outside it, so the
same steps serve a slab of a NumPy array and one task of a dask graph.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from array_api_compat import device as device_of

from .invariants import Plan, can_read
from .kernels import (
    absmax,
    as_blocks,
    compute_range,
    dequantize_float,
    dequantize_int,
    dequantize_lookup,
    from_blocks,
    grid_as_blocks,
    pad_to_blocks,
    quantize_float,
    quantize_int,
    quantize_lookup,
)
from .kernels.calibrate import finite_abs
from .kernels.minifloat import FORMATS
from .kernels.qparams import block_scales, effective_scale, normalise_scales, scales_from_absmax, store_scales
from .kernels.search import count_below, element_weights, kth_smallest, nearest_rank, percentile_alpha, search_blocks
from .scheme import F32_MAX, Calibration
from .storage import pack_codes, unpack_values

__all__ = ["Steps", "cast_saturating", "max_of"]

# finite maxima of float dtypes narrower than f32 whose finfo a namespace may not give (ml_dtypes' bfloat16)
_NARROW_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}


@dataclass(frozen=True)
class Steps:
    """How to calibrate, encode and decode chunks of data of ``shape`` (the whole array's) under ``plan``.

    ``scrub`` marks input not verified finite: calibration then skips NaN/inf and encoding maps
    NaN to code 0 (the NaN code for E4M3/E5M2). ``table`` is the lookup table of a lookup scheme (else None).
    """

    plan: Plan
    shape: tuple[int, ...]
    calibration: Calibration = Calibration.MINMAX
    rounding: str = "half_even"
    scrub: bool = False
    spec: Any = None  # the CalSpec of a search or percentile calibration (options resolved)

    @property
    def dims(self) -> tuple[int, ...]:
        return self.plan.block_dims(self.shape)

    @property
    def searches(self) -> bool:
        """Whether the scales come from a per-block (or per-tensor) error search (MSE, 4over6)."""
        return self.spec is not None and self.spec.searches

    def alpha(self, xc: Any, *, xp: Any) -> Any:
        """``max|x|`` (or the AbsMean or percentile range) per block of the chunk: its part of the scale grid.

        For a search calibration this is the search's starting point ``max|x|`` (see :meth:`search`).
        """
        if self.calibration is Calibration.ABSMEAN:
            return compute_range(xc, self.dims, self.calibration, xp=xp, finite_only=self.scrub)[1]
        if self.calibration is Calibration.PERCENTILE:
            if not self.dims:
                return self.tensor_percentile([xc], xp=xp)
            a = self.magnitudes(xc, xp=xp)
            alpha = percentile_alpha(a, self.dims, self.spec.q_num, self.spec.q_den, xp=xp)
            if self.scrub:
                return alpha
            # NaN/inf sort last and may not be picked: keep them visible to the finiteness check
            top = xp.max(a)
            return xp.where(xp.isfinite(top), alpha, top)
        return absmax(xc, self.dims, xp=xp, finite_only=self.scrub)

    def magnitudes(self, xc: Any, *, xp: Any) -> Any:
        """``|x|`` of the chunk in f32 (non-finite values as 0 when the input is not verified finite)."""
        xf = xp.astype(xc, xp.float32, copy=False)
        return finite_abs(xf, xp=xp) if self.scrub else xp.abs(xf)

    def tensor_percentile(self, slabs: Sequence[Any], *, xp: Any) -> Any:
        """The per-tensor percentile range of an eager array given as row slabs, ``(1,)`` f32.

        The element a sort of the whole ``|x|`` would pick, found by counting passes over the
        slabs (:func:`~arrayquant.kernels.search.kth_smallest`), so no sorted copy is held.
        """

        def count(value: Any) -> Any:
            return functools.reduce(xp.add, (count_below(self.magnitudes(s, xp=xp), value, xp=xp) for s in slabs))

        top = (
            None if self.scrub else max_of([xp.reshape(xp.max(self.magnitudes(s, xp=xp)), (1,)) for s in slabs], xp=xp)
        )
        return self.percentile_of(count, top, xp=xp, device=device_of(slabs[0]))

    def percentile_of(self, count: Callable[[Any], Any], top: Any, *, xp: Any, device: Any) -> Any:
        """The per-tensor percentile from a counting function; ``top`` is ``max|x|`` (None if scrubbed).

        NaN and infinities are never picked: a non-finite ``top`` is returned instead, so the
        finiteness check still sees them.
        """
        k = nearest_rank(math.prod(self.shape), self.spec.q_num, self.spec.q_den)
        alpha = kth_smallest(count, k, xp=xp, device=device)
        return alpha if top is None else xp.where(xp.isfinite(top), alpha, top)

    def scale_of(self, alpha: Any, glob: Any, table: Any, *, xp: Any) -> Any:
        """The effective scales a range ``alpha`` gives: stored (rounded up or OCP), times any global."""
        plan = self.plan
        if glob is None:
            return store_scales(scales_from_absmax(alpha, plan, xp=xp, table=table)[0], plan, xp=xp)
        stored = store_scales(normalise_scales(block_scales(alpha, plan, xp=xp, table=table), glob, xp=xp), plan, xp=xp)
        return effective_scale(stored, glob, plan, xp=xp)

    def roundtrip(self, xb: Any, eff_b: Any, table: Any, *, xp: Any) -> Any:
        """Quantize then dequantize ``xb`` (a block view, or whole data with ``eff_b`` broadcastable)."""
        return self._decode(self._encode(xb, eff_b, table, xp=xp), eff_b, table, xp=xp)

    def finite(self, xc: Any, *, xp: Any) -> Any:
        """The chunk in f32, non-finite values as 0 when the input is not verified finite."""
        xf = xp.astype(xc, xp.float32, copy=False)
        if not self.scrub:
            return xf
        return xp.where(xp.isfinite(xf), xf, xp.asarray(0.0, dtype=xp.float32, device=device_of(xf)))

    def weights(self, shape: tuple[int, ...], importance: Any, *, xp: Any, device: Any) -> Any:
        """Per-element error weights of a chunk (its slice of the importance vector, or 1)."""
        return element_weights(shape, importance, xp=xp, device=device)

    def search(self, xc: Any, amax: Any, table: Any, glob: Any, importance: Any, *, xp: Any) -> Any:
        """The searched range per block of a chunk (grid-shaped), from its ``max|x|`` grid ``amax``.

        ``glob``: the fixed two-level global (None for one level); ``importance``: the chunk's
        last-axis weights (None for none).
        """
        spec = self.spec
        xf = self.finite(xc, xp=xp)
        return search_blocks(
            xf,
            amax,
            self.dims,
            spec.factors,
            spec.norm,
            self.weights(tuple(xf.shape), importance, xp=xp, device=device_of(xf)),
            scale_of=lambda a: self.scale_of(a, glob, table, xp=xp),
            roundtrip=lambda xb, eb: self.roundtrip(xb, eb, table, xp=xp),
            xp=xp,
        )

    def codes(self, xc: Any, eff: Any, table: Any, *, xp: Any) -> Any:
        """Codes of the chunk under effective scales ``eff`` (its part of the grid, or ``(1,)``)."""
        xc = xp.astype(xc, xp.float32, copy=False)
        dims = self.dims
        if not dims:
            return self._encode(xc, eff, table, xp=xp)
        xb = as_blocks(pad_to_blocks(xc, dims, xp=xp, edge=False), dims, xp=xp)
        q = self._encode(xb, grid_as_blocks(eff, xp=xp), table, xp=xp)
        return from_blocks(q, tuple(xc.shape), xp=xp)

    def values(self, xc: Any, eff: Any, table: Any, *, xp: Any) -> Any:
        """The chunk's codes in the scheme's storage form."""
        return pack_codes(self.codes(xc, eff, table, xp=xp), self.plan, xp=xp)

    def decode(self, values: Any, eff: Any, table: Any, n_packed: int, *, xp: Any) -> Any:
        """f32 values of a chunk of stored values; ``n_packed`` is its unpadded packed-axis length."""
        codes = unpack_values(values, self.plan, len(self.shape), n_packed, xp=xp)
        dims = self.dims
        if not dims:
            y = self._decode(codes, eff, table, xp=xp)
        else:
            cb = as_blocks(pad_to_blocks(codes, dims, xp=xp, edge=False), dims, xp=xp)
            y = from_blocks(self._decode(cb, grid_as_blocks(eff, xp=xp), table, xp=xp), tuple(codes.shape), xp=xp)
        if self._may_overflow(eff, table, xp=xp):
            # why: a rounded-up scale times the largest code can pass the f32 maximum (MXFP8 of
            # f32-max data: 448 * 2^120), which stands for data that was finite: saturate, never inf
            y = xp.clip(y, -F32_MAX, F32_MAX)
        return y

    def _may_overflow(self, eff: Any, table: Any, *, xp: Any) -> bool:
        """Whether some code times ``eff`` can exceed the f32 maximum (always, if ``eff`` cannot be read now)."""
        if not can_read(eff):
            return True
        plan = self.plan
        if table is not None:
            top = float(xp.max(xp.abs(table)))
        elif plan.value.is_float:
            top = FORMATS[plan.value].max
        else:
            top = float(max(-plan.qmin, plan.qmax))
        # margin: an f32 product rounds to inf from half an ulp below the maximum onwards
        return float(xp.max(eff)) * top > F32_MAX * (1 - 2.0**-20)

    def _encode(self, y: Any, eff: Any, table: Any, *, xp: Any) -> Any:
        plan = self.plan
        if table is not None:
            return quantize_lookup(y, eff, table, plan, scrub_nan=self.scrub, xp=xp)
        if plan.value.is_float:
            return quantize_float(y, eff, plan, scrub_nan=self.scrub, xp=xp)
        return quantize_int(y, eff, plan, rounding=self.rounding, scrub_nan=self.scrub, xp=xp)

    def _decode(self, codes: Any, eff: Any, table: Any, *, xp: Any) -> Any:
        if table is not None:
            return dequantize_lookup(codes, eff, table, self.plan, xp=xp)
        if self.plan.value.is_float:
            return dequantize_float(codes, eff, self.plan, xp=xp)
        return dequantize_int(codes, eff, xp=xp)


def max_of(parts: list[Any], *, xp: Any) -> Any:
    """Elementwise maximum of same-shaped partial results (exact in any order)."""
    out = parts[0]
    for p in parts[1:]:
        out = xp.maximum(out, p)
    return out


def cast_saturating(y: Any, dtype: Any, *, xp: Any) -> Any:
    """f32 ``y`` as ``dtype``, saturating at a narrower dtype's finite maximum instead of becoming inf.

    Dequantized float16 data near its maximum can come back a rounding step beyond it (q8f of
    -65504: -128 codes times 65504/127.5); the data was finite, so the result is too.
    """
    name = str(dtype).rsplit(".", 1)[-1].strip("'<>")
    top = _NARROW_MAX.get(name)
    if top is not None:
        y = xp.clip(y, -top, top)
    return y if y.dtype == dtype else xp.astype(y, dtype)
