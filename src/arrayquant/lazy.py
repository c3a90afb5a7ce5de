"""Quantization as a dask graph: one task per chunk, chunks cut at whole blocks and whole words.

``aq.quantize`` on a dask array lands here after the invariant layer: the input is rechunked once
so that no block and no packed word straddles a chunk, then every chunk is calibrated, scaled,
encoded and packed by the same :class:`~arrayquant.blockwork.Steps` as the eager path. A global
quantity (the per-tensor scale, the two-level global) is a tree reduction over the chunks' scales.
Nothing is computed until the caller asks; ``aq.save`` writes the result chunk by chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import array_api_compat as compat

from . import fused
from .affinework import AffineSteps
from .backends import dask_graph, shim
from .blockwork import Steps, cast_saturating, max_of
from .chunks import Chunk, Sink, row_chunks
from .fused import registry
from .invariants import Plan, check_scale_values
from .invariants import check_finite as check_data_finite
from .invariants.params import check_zero_values
from .invariants.plan import check_calibration_spec
from .kernels import (
    block_scales,
    effective_scale,
    global_scale,
    normalise_scales,
    round_up_scales,
    scales_from_absmax,
    store_scales,
)
from .kernels.search import count_below, element_weights, error_unit, row_errors, select, signed_counts
from .scheme import Calibration, QuantMode, ScaleDtype
from .storage import pack_unit, values_layout
from .tensor import QuantizedTensor

__all__ = [
    "affine_range_lazy",
    "dequantize_affine_lazy",
    "dequantize_lazy",
    "quantize_affine_lazy",
    "quantize_lazy",
    "range_lazy",
]


@dataclass(frozen=True)
class _Layout:
    """Chunk sizes of the data, its scale grid and its stored values.

    Data and values have the same number of chunks along every axis, and so has the grid of a
    per-block scheme; a per-tensor grid is the single ``(1,)`` chunk, handed whole to each task.
    """

    data: tuple[tuple[int, ...], ...]
    grid: tuple[tuple[int, ...], ...]
    values: tuple[tuple[int, ...], ...]


def _units(plan: Plan, shape: tuple[int, ...]) -> list[int]:
    rank = len(shape)
    dims = plan.block_dims(shape)
    units = list(dims) if dims else [1] * rank
    axis = plan.packed_axis(rank)
    if axis is not None:
        units[axis] = math.lcm(units[axis], pack_unit(plan)[0])
    return units


def _layout(plan: Plan, data: tuple[tuple[int, ...], ...]) -> _Layout:
    rank = len(data)
    dims = plan.block_dims(tuple(sum(sizes) for sizes in data))
    axis = plan.packed_axis(rank)
    per, words = pack_unit(plan)
    grid = tuple(tuple(-(-n // d) for n in sizes) for sizes, d in zip(data, dims, strict=True)) if dims else ((1,),)
    values = tuple(tuple(-(-n * words // per) for n in sizes) if a == axis else sizes for a, sizes in enumerate(data))
    return _Layout(data, grid, values)


def _origin(chunks: tuple[tuple[int, ...], ...], block_id: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dask_graph.offsets(sizes)[i] for sizes, i in zip(chunks, block_id, strict=True))


def _ns(a: Any) -> Any:
    return shim.kernel_namespace(compat.array_namespace(a))


class _Chunked:
    """The chunk functions of one quantization; plain data, so they travel to dask workers.

    Inside a task each chunk is walked in row slabs, as the eager path walks a whole array, so the
    temporaries of a 64 MiB chunk stay a few MiB and in cache.
    """

    def __init__(self, steps: Steps, check: bool, data: tuple[tuple[int, ...], ...]) -> None:
        self.steps, self.check, self.data = steps, check, data
        # decided when the graph is built (inside or outside fused_kernels(...)), not in the worker
        self.fused_ok = fused.available()

    def _kernel(self, op: str, a: Any, shape: tuple[int, ...]) -> Any:
        """A fused kernel for ``op`` on this chunk, or None (unverified-finite input stays portable)."""
        if not self.fused_ok or self.steps.scrub:
            return None
        kernel = getattr(registry, f"{op}_kernel")(a, self.steps.plan, shape)
        if kernel is None:
            return None

        def run(*args: Any) -> Any:
            # one thread per task: dask runs the chunks in parallel already
            with fused.fused_kernels(threads=1):
                return kernel(*args)

        return run

    def _slabs(self, xc: Any) -> list[Chunk]:
        plan, dims = self.steps.plan, self.steps.dims
        return row_chunks(tuple(xc.shape), dims[0] if dims else 1, plan.packed_axis(xc.ndim), pack_unit(plan), True)

    def _verify(self, xc: Any, alpha: Any, xp: Any, block_id: tuple[int, ...]) -> None:
        if self.check and not bool(xp.all(xp.isfinite(alpha))):
            check_data_finite(xc, xp, origin=_origin(self.data, block_id))

    def _slab_alpha(self, xc: Any, c: Chunk, xp: Any, block_id: tuple[int, ...]) -> tuple[Any, Any]:
        """Slab ``c`` of the chunk ``xc`` and its ``alpha``, verified finite."""
        xs = xc[c.rows, ...]
        alpha = self.steps.alpha(xs, xp=xp)
        self._verify(xc, alpha, xp, block_id)
        return xs, alpha

    def _grid(self, xc: Any, block_id: tuple[int, ...], scale: Any) -> Any:
        """``scale(alpha)`` over the chunk's part of the scale grid, a slab at a time."""
        xp = _ns(xc)
        slabs = self._slabs(xc)
        out = Sink(len(slabs), self.steps.plan.grid_shape(tuple(xc.shape)), xp.float32, xp, compat.device(xc))
        with shim.quiet(xp):
            for c in slabs:
                _, alpha = self._slab_alpha(xc, c, xp, block_id)
                out.put(c.grid, scale(alpha, xp))
        return out.result

    def checked(self, xc: Any, block_id: tuple[int, ...] = ()) -> Any:
        """The chunk itself, once verified finite."""
        check_data_finite(xc, _ns(xc), origin=_origin(self.data, block_id))
        return xc

    def _chunk_kernels(self, xc: Any, shape: tuple[int, ...] | None = None) -> Any:
        """The fused (absmax, quantize_under) pair for this chunk (of ``shape``), or None.

        See ``registry.chunk_kernels``; ``xc`` may be a dask array's empty meta, with the whole shape.
        """
        if not self.fused_ok or self.steps.scrub:
            return None
        return registry.chunk_kernels(xc, self.steps.plan, tuple(xc.shape) if shape is None else shape)

    def _top(self, xc: Any, portable: Callable[[Any], Any]) -> Any:
        """The chunk's ``max|x|`` shaped ``(1,) * rank``: fused, else (not covered, NaN/inf) ``portable(xp)``."""
        kernels = self._chunk_kernels(xc)
        top = None if kernels is None else kernels[0](xc)
        if top is not None:
            return top.reshape((1,) * xc.ndim)
        xp = _ns(xc)
        with shim.quiet(xp):
            return xp.reshape(portable(xp), (1,) * xc.ndim)

    def alpha(self, xc: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Per-tensor partial: ``max|x|`` of the chunk, shaped ``(1,) * rank``."""

        def portable(xp: Any) -> Any:
            alpha = max_of([self.steps.alpha(xc[c.rows, ...], xp=xp) for c in self._slabs(xc)], xp=xp)
            self._verify(xc, alpha, xp, block_id)
            return alpha

        return self._top(xc, portable)

    def _imp(self, imp: Any, xc: Any, block_id: tuple[int, ...], c: Chunk) -> Any:
        """The importance weights of slab ``c`` of the chunk ``xc`` (its columns of the whole vector)."""
        if imp is None:
            return None
        off = _origin(self.data, block_id)[-1] if block_id else 0
        if xc.ndim == 1:  # the slabs' rows are the columns
            return imp[off + c.rows.start : off + c.rows.stop]
        return imp[off : off + int(xc.shape[-1])]

    def searched(self, xc: Any, glob: Any, table: Any, imp: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Two-level search: the chunk's stored block scales, searched beneath the fixed global."""
        xp = _ns(xc)
        plan = self.steps.plan
        slabs = self._slabs(xc)
        out = Sink(len(slabs), plan.grid_shape(tuple(xc.shape)), xp.float32, xp, compat.device(xc))
        with shim.quiet(xp):
            for c in slabs:
                xs, alpha = self._slab_alpha(xc, c, xp, block_id)
                alpha = self.steps.search(xs, alpha, table, glob, self._imp(imp, xc, block_id, c), xp=xp)
                s = normalise_scales(block_scales(alpha, plan, xp=xp, table=table), glob, xp=xp)
                out.put(c.grid, store_scales(s, plan, xp=xp))
        return out.result

    def searched_range(self, xc: Any, table: Any, imp: Any, block_id: tuple[int, ...] = ()) -> Any:
        """One-level per block: the chunk's searched (or percentile) range grid, before any scale."""
        xp = _ns(xc)
        slabs = self._slabs(xc)
        out = Sink(len(slabs), self.steps.plan.grid_shape(tuple(xc.shape)), xp.float32, xp, compat.device(xc))
        with shim.quiet(xp):
            for c in slabs:
                xs = xc[c.rows, ...]
                alpha = self.steps.alpha(xs, xp=xp)
                if self.steps.searches:
                    alpha = self.steps.search(xs, alpha, table, None, self._imp(imp, xc, block_id, c), xp=xp)
                out.put(c.grid, alpha)
        return out.result

    def top(self, xc: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Per-tensor percentile: ``max|x|`` of the chunk (checked finite), shaped ``(1,) * rank``."""
        xp = _ns(xc)
        with shim.quiet(xp):
            top = max_of(
                [xp.reshape(xp.max(self.steps.magnitudes(xc[c.rows, ...], xp=xp)), (1,)) for c in self._slabs(xc)],
                xp=xp,
            )
            self._verify(xc, top, xp, block_id)
            return xp.reshape(top, (1,) * xc.ndim)

    def count_below(self, xc: Any, value: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Per-tensor percentile: how many of the chunk's ``|x|`` lie below ``value``, shaped ``(1,) * rank``."""
        xp = _ns(xc)
        with shim.quiet(xp):
            n = sum(
                int(count_below(self.steps.magnitudes(xc[c.rows, ...], xp=xp), value, xp=xp)[0])
                for c in self._slabs(xc)
            )
        return xp.full((1,) * xc.ndim, n, dtype=xp.int64, device=compat.device(xc))

    def row_errors(self, xc: Any, amax: Any, table: Any, imp: Any, f: float, block_id: tuple[int, ...] = ()) -> Any:
        """Per-tensor search: the error of each row of the chunk (whole rows) under candidate ``f``."""
        xp = _ns(xc)
        steps = self.steps
        with shim.quiet(xp):
            alpha = xp.multiply(amax, xp.asarray(f, dtype=xp.float32, device=compat.device(amax)))
            eff = steps.scale_of(alpha, None, table, xp=xp)
            unit = round_up_scales(amax, ScaleDtype.UE8M0, xp=xp)
            rows = []
            for c in self._slabs(xc):
                xf = steps.finite(xc[c.rows, ...], xp=xp)
                w = element_weights(tuple(xf.shape), self._imp(imp, xc, block_id, c), xp=xp, device=compat.device(xf))
                rows.append(row_errors(xf, steps.roundtrip(xf, eff, table, xp=xp), unit, w, steps.spec.norm, xp=xp))
            out = xp.concat(rows) if len(rows) > 1 else rows[0]
            return xp.reshape(out, (int(xc.shape[0]),) + (1,) * (xc.ndim - 1))

    def fused(self, xc: Any, table: Any, block_id: tuple[int, ...] = ()) -> tuple[Any, Any]:
        """One-level per block: the chunk's stored values and stored scales, in one walk over its slabs."""
        return self.fused_weighted(xc, table, None, block_id)

    def fused_weighted(self, xc: Any, table: Any, imp: Any, block_id: tuple[int, ...] = ()) -> tuple[Any, Any]:
        """:meth:`fused` with the chunk's importance weights (``imp``: the whole vector, or None)."""
        if self.steps.calibration is Calibration.MINMAX:  # the fused kernels calibrate by MinMax only
            kernel = self._kernel("quantize", xc, tuple(xc.shape))
            hit = None if kernel is None else kernel(xc, self.steps.plan, self.steps.rounding)
            if hit is not None:  # else NaN/inf: the portable steps below report where
                return hit[0], hit[1]
        xp = _ns(xc)
        plan = self.steps.plan
        slabs = self._slabs(xc)
        vshape, vdtype = values_layout(plan, tuple(xc.shape))
        values = Sink(len(slabs), vshape, getattr(xp, vdtype), xp, compat.device(xc))
        scales = Sink(len(slabs), plan.grid_shape(tuple(xc.shape)), xp.float32, xp, compat.device(xc))
        with shim.quiet(xp):
            for c in slabs:
                xs, alpha = self._slab_alpha(xc, c, xp, block_id)
                if self.steps.searches:
                    alpha = self.steps.search(xs, alpha, table, None, self._imp(imp, xc, block_id, c), xp=xp)
                stored = store_scales(scales_from_absmax(alpha, plan, xp=xp, table=table)[0], plan, xp=xp)
                scales.put(c.grid, stored)
                values.put(c.stored, self.steps.values(xs, stored, table, xp=xp))
        return values.result, scales.result

    def block_top(self, xc: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Two-level MinMax, first pass: the chunk's largest block ``max|x|``, shaped ``(1,) * rank``."""
        return self._top(xc, lambda xp: xp.max(self._grid(xc, block_id, lambda a, xp: a)))

    def under(self, xc: Any, glob: Any, table: Any, block_id: tuple[int, ...] = ()) -> tuple[Any, Any]:
        """Two-level MinMax, second pass: the chunk's stored values and stored scales beneath ``glob``."""
        kernels = self._chunk_kernels(xc)
        hit = None if kernels is None else kernels[1](xc, self.steps.plan, glob, self.steps.rounding)
        if hit is not None:
            return hit[0], hit[1]
        stored = self.normalised(self.raw_scales(xc, table, block_id), glob)
        return self.values(xc, stored, glob, table, block_id), stored

    def raw_scales(self, xc: Any, table: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Two-level: the chunk's block scales before normalisation by the global."""
        return self._grid(xc, block_id, lambda a, xp: block_scales(a, self.steps.plan, xp=xp, table=table))

    def normalised(self, s: Any, glob: Any) -> Any:
        """Two-level: block scales relative to the global, as stored."""
        xp = _ns(s)
        with shim.quiet(xp):
            return store_scales(normalise_scales(s, glob, xp=xp), self.steps.plan, xp=xp)

    def values(self, xc: Any, stored: Any, glob: Any, table: Any, block_id: tuple[int, ...] = ()) -> Any:
        """The chunk's stored values; checks finiteness itself when no calibration did."""
        kernel = self._kernel("encode", xc, tuple(xc.shape))
        hit = None if kernel is None else kernel(xc, self.steps.plan, stored, glob, self.steps.rounding)
        if hit is not None:  # else NaN/inf: the check below reports where
            return hit
        xp = _ns(xc)
        plan = self.steps.plan
        shape, dtype = values_layout(plan, tuple(xc.shape))
        slabs = self._slabs(xc)
        out = Sink(len(slabs), shape, getattr(xp, dtype), xp, compat.device(xc))
        with shim.quiet(xp):
            if self.check:
                check_data_finite(xc, xp, origin=_origin(self.data, block_id))
            eff = effective_scale(stored, glob, plan, xp=xp)
            for c in slabs:
                eff_c = eff[c.grid, ...] if self.steps.dims else eff
                out.put(c.stored, self.steps.values(xc[c.rows, ...], eff_c, table, xp=xp))
        return out.result

    def decode(self, v: Any, stored: Any, glob: Any, table: Any, block_id: tuple[int, ...] = ()) -> Any:
        """The f32 data of a chunk of stored values (``self.data`` are the data's chunk sizes)."""
        plan, rank = self.steps.plan, len(self.steps.shape)
        shape = tuple(self.data[a][i] for a, i in enumerate(block_id))
        if table is None:
            kernel = self._kernel("dequantize", v, shape)
            y = None if kernel is None else kernel(v, stored, glob, plan, shape)
            if y is not None:
                return y
        xp = _ns(v)
        axis = plan.packed_axis(rank)
        slabs = row_chunks(shape, self.steps.dims[0] if self.steps.dims else 1, axis, pack_unit(plan), True)
        out = Sink(len(slabs), shape, xp.float32, xp, compat.device(v))
        with shim.quiet(xp):
            eff = effective_scale(stored, glob, plan, xp=xp)
            for c in slabs:
                n_packed = c.rows.stop - c.rows.start if axis == 0 else shape[axis] if axis is not None else 0
                eff_c = eff[c.grid, ...] if self.steps.dims else eff
                out.put(c.rows, self.steps.decode(v[c.stored, ...], eff_c, table, n_packed, xp=xp))
        return out.result


def _whole_rows(x: Any) -> tuple[Any, Any, Any]:
    """``x`` rechunked to whole rows, its chunk sizes, and the chunks of a per-row error column."""
    shape = tuple(int(n) for n in x.shape)
    rows = dask_graph.rechunk(x, (tuple(x.chunks[0]), *((n,) for n in shape[1:])))
    data = tuple(tuple(int(n) for n in sizes) for sizes in rows.chunks)
    return rows, data, (data[0], *((1,) for _ in shape[1:]))


def _search_tensor_lazy(x: Any, steps: Steps, check: bool, amax: Any, tab: Any, imp: Any, xp: Any) -> Any:
    """Per-tensor search as a graph: row errors per candidate over whole-row chunks, then a lazy choice."""
    rows, data, out_chunks = _whole_rows(x)
    chunked = _Chunked(steps, check, data)
    errors, alphas = [], []
    for f in steps.spec.factors:
        e = dask_graph.map_chunks(chunked.row_errors, [rows], [amax, tab, imp, f], out_chunks, xp.float32)
        errors.append(xp.reshape(e, (-1,)))
        alphas.append(xp.multiply(amax, xp.asarray(f, dtype=xp.float32, device=compat.device(amax))))
    return select(errors, alphas, xp=xp)


def _percentile_lazy(x: Any, chunked: _Chunked, layout: _Layout, xp: Any) -> Any:
    """Per-tensor percentile as a graph: 31 counting passes, one small task per chunk each."""
    steps = chunked.steps
    ones = tuple((1,) * len(c) for c in layout.data)
    top = xp.reshape(xp.max(dask_graph.map_chunks(chunked.top, [x], [], ones, xp.float32)), (1,))

    def count(value: Any) -> Any:
        return xp.reshape(xp.sum(dask_graph.map_chunks(chunked.count_below, [x], [value], ones, xp.int64)), (1,))

    return steps.percentile_of(count, None if steps.scrub else top, xp=xp, device=compat.device(top))


def range_lazy(x: Any, plan: Plan, spec: Any, tab: Any, imp: Any) -> Any:
    """The percentile or searched range of the dask array ``x`` per block (or ``(1,)``), lazily.

    As the eager ``compute_range``: one-level schemes only, input not checked for finiteness.
    """
    xp = shim.kernel_namespace(compat.array_namespace(x))
    shape = tuple(int(n) for n in x.shape)
    steps = Steps(plan, shape, spec.kind, spec=spec)
    x = dask_graph.rechunk(x, dask_graph.aligned(x.chunks, _units(plan, shape)))
    layout = _layout(plan, tuple(x.chunks))
    chunked = _Chunked(steps, False, layout.data)
    f32 = xp.float32
    if plan.block_dims(shape):
        return dask_graph.map_chunks(chunked.searched_range, [x], [tab, imp], layout.grid, f32)
    if spec.kind is Calibration.PERCENTILE:
        return _percentile_lazy(x, chunked, layout, xp)
    parts = dask_graph.map_chunks(chunked.alpha, [x], [], tuple((1,) * len(c) for c in layout.data), f32)
    return _search_tensor_lazy(x, steps, False, xp.reshape(xp.max(parts), (1,)), tab, imp, xp)


class _Refuse:
    """A task that passes a chunk of static scales on, once none is NaN, infinite or negative."""

    def __init__(self, chunks: tuple[tuple[int, ...], ...], name: str) -> None:
        self.chunks, self.name = chunks, name

    def __call__(self, s: Any, block_id: tuple[int, ...] = ()) -> Any:
        check_scale_values(s, f"{self.name} (its chunk starting at {_origin(self.chunks, block_id)})", _ns(s))
        return s


def _two_pass(x: Any, steps: Steps, tab: Any, chunked: _Chunked) -> bool:
    """Whether a two-level MinMax graph takes the fused kernels' two passes (NumPy f32 chunks)."""
    if steps.calibration is not Calibration.MINMAX or steps.searches or tab is not None:
        return False
    return chunked._chunk_kernels(getattr(x, "_meta", None), steps.shape) is not None


def quantize_lazy(
    x: Any,
    plan: Plan,
    given: Any,
    tab: Any,
    spec: Any,
    rounding: str,
    check: bool,
    imp: Any = None,
) -> QuantizedTensor:
    """Quantize the dask array ``x`` (already validated) into a lazy :class:`QuantizedTensor`.

    ``spec`` is the validated calibration (a CalSpec, or a bare Calibration), ``imp`` the
    validated importance weights (or None).
    """
    if isinstance(spec, Calibration):
        spec = check_calibration_spec(spec, plan)
    cal = spec.kind
    xp = shim.kernel_namespace(compat.array_namespace(x))
    shape = tuple(int(n) for n in x.shape)
    dims = plan.block_dims(shape)
    x = dask_graph.rechunk(x, dask_graph.aligned(x.chunks, _units(plan, shape)))
    layout = _layout(plan, tuple(x.chunks))
    f32 = xp.float32
    vdtype = getattr(xp, values_layout(plan, shape)[1])
    steps = Steps(plan, shape, cal, rounding, scrub=not check, spec=spec)
    # with the check on, chunk tasks raise on NaN/inf before encoding: only unchecked input is scrubbed
    chunked = _Chunked(steps, check, layout.data)
    glob = None
    if given is not None:
        # static scales of a graph cannot be read now: their tasks refuse NaN, inf and negatives
        scales_in, glob, _ = given
        scales_in = dask_graph.map_chunks(
            _Refuse(scales_in.chunks, "params.scales"), [scales_in], [], scales_in.chunks, f32
        )
        if glob is not None:
            glob = dask_graph.map_chunks(_Refuse(glob.chunks, "params.global_scale"), [glob], [], glob.chunks, f32)
        stored = store_scales(scales_in, plan, xp=xp)
        if dims:
            stored = dask_graph.rechunk(stored, layout.grid)
    elif dims and not plan.two_level:
        # one task per chunk reads it once: calibrate, scale and encode slab by slab, as eagerly
        values, stored = dask_graph.map_chunks_pair(
            chunked.fused if imp is None else chunked.fused_weighted,
            [x],
            [tab] if imp is None else [tab, imp],
            (layout.values, vdtype),
            (layout.grid, f32),
        )
        return QuantizedTensor(plan.scheme, shape, x.dtype, values, stored, None, tab)
    elif dims and _two_pass(x, steps, tab, chunked):
        # fused: one pass for max|x| (the largest block scale comes of it), one to quantize
        tops = dask_graph.map_chunks(chunked.block_top, [x], [], tuple((1,) * len(c) for c in layout.data), f32)
        top = xp.reshape(xp.max(tops), (1,))
        glob = global_scale(block_scales(top, plan, xp=xp, table=tab), plan, xp=xp)
        values, stored = dask_graph.map_chunks_pair(
            chunked.under, [x], [glob, tab], (layout.values, vdtype), (layout.grid, f32)
        )
        return QuantizedTensor(plan.scheme, shape, x.dtype, values, stored, glob, tab)
    elif dims:
        raw = dask_graph.map_chunks(chunked.raw_scales, [x], [tab], layout.grid, f32)
        glob = global_scale(xp.reshape(xp.max(raw), (1,)), plan, xp=xp)
        if steps.searches:  # the global stays MinMax's; block scales are searched beneath it
            stored = dask_graph.map_chunks(chunked.searched, [x], [glob, tab, imp], layout.grid, f32)
        else:
            stored = dask_graph.map_chunks(chunked.normalised, [raw], [glob], layout.grid, f32)
    else:
        if cal is Calibration.ABSMEAN:
            if check:
                x = dask_graph.map_chunks(chunked.checked, [x], [], layout.data, x.dtype)
            alpha = steps.alpha(x, xp=xp)  # one fixed summation tree over the whole tensor
        elif cal is Calibration.PERCENTILE:
            alpha = _percentile_lazy(x, chunked, layout, xp)  # the max pass checks each chunk
        else:
            parts = dask_graph.map_chunks(chunked.alpha, [x], [], tuple((1,) * len(c) for c in layout.data), f32)
            alpha = xp.reshape(xp.max(parts), (1,))
            if steps.searches:
                alpha = _search_tensor_lazy(x, steps, check, alpha, tab, imp, xp)
        s, glob = scales_from_absmax(alpha, plan, xp=xp, table=tab)
        stored = store_scales(s, plan, xp=xp)
    # dynamic calibration already checked every chunk; static scales leave it to the values task
    values_fn = _Chunked(steps, check and given is not None, layout.data).values
    if dims:
        values = dask_graph.map_chunks(values_fn, [x, stored], [glob, tab], layout.values, vdtype)
    else:
        values = dask_graph.map_chunks(values_fn, [x], [stored, glob, tab], layout.values, vdtype)
    return QuantizedTensor(plan.scheme, shape, x.dtype, values, stored, glob, tab)


def dequantize_lazy(qt: QuantizedTensor, plan: Plan, scales: Any, glob: Any, tab: Any, out_dtype: Any) -> Any:
    """The float dask array a lazy (validated) quantized tensor stands for."""
    shape = qt.shape
    rank = len(shape)
    dims = plan.block_dims(shape)
    axis = plan.packed_axis(rank)
    per, unit_words = pack_unit(plan)
    data = [tuple(n for n in sizes if n) or (0,) for sizes in qt.values.chunks]  # no empty chunks
    if axis is not None:  # words back to fields, about: the chunks are realigned to whole units below
        words = data[axis]
        fields = [n * per // unit_words for n in words[:-1]]
        data[axis] = (*fields, shape[axis] - sum(fields))
    layout = _layout(plan, dask_graph.aligned(tuple(data), _units(plan, shape)))
    values = dask_graph.rechunk(qt.values, layout.values)
    chunked = _Chunked(Steps(plan, shape), False, layout.data)
    f32 = compat.array_namespace(values).float32
    if dims:
        y = dask_graph.map_chunks(
            chunked.decode, [values, dask_graph.rechunk(scales, layout.grid)], [glob, tab], layout.data, f32
        )
    else:
        y = dask_graph.map_chunks(chunked.decode, [values], [scales, glob, tab], layout.data, f32)
    return cast_saturating(y, out_dtype, xp=compat.array_namespace(y))


class _AffineChunked:
    """The chunk functions of one affine quantization (zero point or offset), walked in row slabs."""

    def __init__(self, steps: AffineSteps, check: bool, data: tuple[tuple[int, ...], ...]) -> None:
        self.steps, self.check, self.data = steps, check, data

    def _slabs(self, shape: tuple[int, ...]) -> list[Chunk]:
        plan, dims = self.steps.plan, self.steps.dims
        return row_chunks(shape, dims[0] if dims else 1, plan.packed_axis(len(shape)), pack_unit(plan), True)

    def _range(self, xc: Any, xp: Any, block_id: tuple[int, ...]) -> tuple[Any, Any]:
        lo, hi = self.steps.range(xc, xp=xp)
        if self.check and not bool(xp.all(xp.logical_and(xp.isfinite(lo), xp.isfinite(hi)))):
            check_data_finite(xc, xp, origin=_origin(self.data, block_id))
        return lo, hi

    def low(self, xc: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Per tensor: the chunk's minimum (checked finite), shaped ``(1,) * rank``."""
        xp = _ns(xc)
        with shim.quiet(xp):
            return xp.reshape(self._range(xc, xp, block_id)[0], (1,) * xc.ndim)

    def high(self, xc: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Per tensor: the chunk's maximum, shaped ``(1,) * rank``."""
        xp = _ns(xc)
        with shim.quiet(xp):
            return xp.reshape(self._range(xc, xp, block_id)[1], (1,) * xc.ndim)

    def top(self, xc: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Per-tensor percentile: ``max|x|`` of the chunk (checked finite), shaped ``(1,) * rank``."""
        xp = _ns(xc)
        steps = self.steps
        with shim.quiet(xp):
            top = max_of(
                [
                    xp.reshape(xp.max(xp.abs(steps.finite(xc[c.rows, ...], xp=xp))), (1,))
                    for c in self._slabs(tuple(xc.shape))
                ],
                xp=xp,
            )
            if self.check and not bool(xp.all(xp.isfinite(top))):
                check_data_finite(xc, xp, origin=_origin(self.data, block_id))
            return xp.reshape(top, (1,) * xc.ndim)

    def signed_counts(self, xc: Any, sign: Any, value: Any, block_id: tuple[int, ...] = ()) -> Any:
        """Per-tensor percentile: per lane ``j``, how many ``sign[j] * x`` of the chunk lie below ``value[j]``.

        Shaped ``(1,) * (rank - 1) + (2,)``: the lanes along the last axis.
        """
        xp = _ns(xc)
        total = [0, 0]
        with shim.quiet(xp):
            for c in self._slabs(tuple(xc.shape)):
                n = signed_counts(self.steps.finite(xc[c.rows, ...], xp=xp), sign, value, xp=xp)
                total = [total[0] + int(n[0]), total[1] + int(n[1])]
        return xp.reshape(xp.asarray(total, dtype=xp.int64, device=compat.device(xc)), (1,) * (xc.ndim - 1) + (2,))

    def params(self, xc: Any, imp: Any, block_id: tuple[int, ...] = ()) -> tuple[Any, Any]:
        """Per block: the chunk's stored scales and zero points (f32) or offsets, searched slab by slab for MSE."""
        xp = _ns(xc)
        steps = self.steps
        slabs = self._slabs(tuple(xc.shape))
        grid = steps.plan.grid_shape(tuple(xc.shape))
        scales = Sink(len(slabs), grid, xp.float32, xp, compat.device(xc))
        zeros = Sink(len(slabs), grid, xp.float32, xp, compat.device(xc))
        with shim.quiet(xp):
            for c in slabs:
                xs = xc[c.rows, ...]
                lo, hi = self._range(xs, xp, block_id)
                if steps.searches:
                    lo, hi = steps.search(xs, lo, hi, _chunk_columns(imp, self.data, xc, block_id, c), xp=xp)
                s, z = steps.params(lo, hi, xp=xp)
                scales.put(c.grid, s)
                zeros.put(c.grid, z)
        return scales.result, zeros.result

    def bounds(self, xc: Any, block_id: tuple[int, ...] = ()) -> tuple[Any, Any]:
        """Per block: the chunk's ranges (not checked), slab by slab."""
        xp = _ns(xc)
        slabs = self._slabs(tuple(xc.shape))
        grid = self.steps.plan.grid_shape(tuple(xc.shape))
        lows = Sink(len(slabs), grid, xp.float32, xp, compat.device(xc))
        highs = Sink(len(slabs), grid, xp.float32, xp, compat.device(xc))
        with shim.quiet(xp):
            for c in slabs:
                lo, hi = self.steps.range(xc[c.rows, ...], xp=xp)
                lows.put(c.grid, lo)
                highs.put(c.grid, hi)
        return lows.result, highs.result

    def row_errors(self, xc: Any, lo: Any, hi: Any, imp: Any, f: float, block_id: tuple[int, ...] = ()) -> Any:
        """Per-tensor search: the error of each row of the chunk (whole rows) under candidate ``f``."""
        xp = _ns(xc)
        steps = self.steps
        with shim.quiet(xp):
            fa = xp.asarray([f], dtype=xp.float32, device=compat.device(lo))
            lo_f, hi_f = xp.multiply(lo, fa), xp.multiply(hi, fa)
            unit = error_unit(xp.maximum(xp.abs(lo), xp.abs(hi)), xp=xp)
            rows = []
            for c in self._slabs(tuple(xc.shape)):
                xf = steps.finite(xc[c.rows, ...], xp=xp)
                w = element_weights(
                    tuple(xf.shape), _chunk_columns(imp, self.data, xc, block_id, c), xp=xp, device=compat.device(xf)
                )
                rows.append(row_errors(xf, steps.roundtrip(xf, lo_f, hi_f, xp=xp), unit, w, steps.spec.norm, xp=xp))
            out = xp.concat(rows) if len(rows) > 1 else rows[0]
            return xp.reshape(out, (int(xc.shape[0]),) + (1,) * (xc.ndim - 1))

    def values(self, xc: Any, s: Any, zero: Any, block_id: tuple[int, ...] = ()) -> Any:
        """The chunk's stored values under its part of the grids; checks finiteness when no calibration did."""
        xp = _ns(xc)
        plan = self.steps.plan
        vshape, vdtype = values_layout(plan, tuple(xc.shape))
        slabs = self._slabs(tuple(xc.shape))
        out = Sink(len(slabs), vshape, getattr(xp, vdtype), xp, compat.device(xc))
        with shim.quiet(xp):
            if self.check:
                check_data_finite(xc, xp, origin=_origin(self.data, block_id))
            for c in slabs:
                s_c, z_c = (s[c.grid, ...], zero[c.grid, ...]) if self.steps.dims else (s, zero)
                out.put(c.stored, self.steps.values(xc[c.rows, ...], s_c, z_c, xp=xp))
        return out.result

    def decode(self, v: Any, s: Any, zero: Any, block_id: tuple[int, ...] = ()) -> Any:
        """The f32 data of a chunk of stored values."""
        plan, rank = self.steps.plan, len(self.steps.shape)
        shape = tuple(self.data[a][i] for a, i in enumerate(block_id))
        xp = _ns(v)
        axis = plan.packed_axis(rank)
        slabs = self._slabs(shape)
        out = Sink(len(slabs), shape, xp.float32, xp, compat.device(v))
        with shim.quiet(xp):
            for c in slabs:
                n_packed = c.rows.stop - c.rows.start if axis == 0 else shape[axis] if axis is not None else 0
                s_c, z_c = (s[c.grid, ...], zero[c.grid, ...]) if self.steps.dims else (s, zero)
                out.put(c.rows, self.steps.decode(v[c.stored, ...], s_c, z_c, n_packed, xp=xp))
        return out.result


class _RefuseZero:
    """A task that passes a chunk of static zero points (or offsets) on, once each is valid."""

    def __init__(self, chunks: tuple[tuple[int, ...], ...], plan: Plan) -> None:
        self.chunks, self.plan = chunks, plan

    def __call__(self, z: Any, block_id: tuple[int, ...] = ()) -> Any:
        xp = _ns(z)
        field = "zero_point" if self.plan.mode is QuantMode.ZERO_POINT else "offset"
        name = f"params.{field} (its chunk starting at {_origin(self.chunks, block_id)})"
        if self.plan.mode is QuantMode.ZERO_POINT:
            check_zero_values(z, name, self.plan, xp)
        else:
            check_scale_values(z, name, xp, signed=True)
        return z


def _chunk_columns(imp: Any, data: Any, xc: Any, block_id: tuple[int, ...], c: Chunk) -> Any:
    """The importance weights of slab ``c`` of chunk ``xc`` (its columns of the whole vector), or None."""
    if imp is None:
        return None
    off = _origin(data, block_id)[-1] if block_id else 0
    if xc.ndim == 1:  # the slabs' rows are the columns
        return imp[off + c.rows.start : off + c.rows.stop]
    return imp[off : off + int(xc.shape[-1])]


def quantize_affine_lazy(
    x: Any, plan: Plan, given: Any, rounding: str, check: bool, spec: Any = None, imp: Any = None
) -> QuantizedTensor:
    """Quantize the dask array ``x`` (validated) under an affine scheme: MinMax, its MSE search (``spec``,
    weighted by ``imp``), the percentile range (``spec``) or given ``(scales, zero)``."""
    xp = shim.kernel_namespace(compat.array_namespace(x))
    shape = tuple(int(n) for n in x.shape)
    dims = plan.block_dims(shape)
    x = dask_graph.rechunk(x, dask_graph.aligned(x.chunks, _units(plan, shape)))
    layout = _layout(plan, tuple(x.chunks))
    f32 = xp.float32
    vdtype = getattr(xp, values_layout(plan, shape)[1])
    steps = AffineSteps(plan, shape, rounding, scrub=not check, spec=spec if given is None else None)
    chunked = _AffineChunked(steps, check, layout.data)
    if given is not None:
        scales_in, zero_in = given
        scales_in = dask_graph.map_chunks(
            _Refuse(scales_in.chunks, "params.scales"), [scales_in], [], scales_in.chunks, f32
        )
        zero_in = dask_graph.map_chunks(_RefuseZero(zero_in.chunks, plan), [zero_in], [], zero_in.chunks, f32)
        s, zero = steps.stored(scales_in, zero_in, xp=xp)
        values_fn = _AffineChunked(steps, check, layout.data).values
    elif dims:
        s, zero = dask_graph.map_chunks_pair(chunked.params, [x], [imp], (layout.grid, f32), (layout.grid, f32))
        values_fn = _AffineChunked(steps, False, layout.data).values  # the params tasks checked every chunk
    elif steps.percentile:
        lo, hi = _affine_percentile_lazy(x, chunked, layout, xp)  # the max pass checks each chunk
        s, zero = steps.params(lo, hi, xp=xp)
        values_fn = _AffineChunked(steps, False, layout.data).values
    else:
        ones = tuple((1,) * len(c) for c in layout.data)
        lo = xp.reshape(xp.min(dask_graph.map_chunks(chunked.low, [x], [], ones, f32)), (1,))
        hi = xp.reshape(xp.max(dask_graph.map_chunks(chunked.high, [x], [], ones, f32)), (1,))
        if steps.searches:
            lo, hi = _search_affine_lazy(x, steps, check, lo, hi, imp, xp)
        s, zero = steps.params(lo, hi, xp=xp)
        values_fn = _AffineChunked(steps, False, layout.data).values
    if dims:
        s, zero = dask_graph.rechunk(s, layout.grid), dask_graph.rechunk(zero, layout.grid)
        values = dask_graph.map_chunks(values_fn, [x, s, zero], [], layout.values, vdtype)
    else:
        values = dask_graph.map_chunks(values_fn, [x], [s, zero], layout.values, vdtype)
    stored_zero = steps.as_stored_zero(zero, xp=xp)
    if plan.mode is QuantMode.ZERO_POINT:
        return QuantizedTensor(plan.scheme, shape, x.dtype, values, s, zero_point=stored_zero)
    return QuantizedTensor(plan.scheme, shape, x.dtype, values, s, offset=stored_zero)


def _affine_percentile_lazy(x: Any, chunked: _AffineChunked, layout: _Layout, xp: Any) -> tuple[Any, Any]:
    """Per-tensor affine percentile as a graph: 32 counting passes (both ends in each), one small task per chunk."""
    steps = chunked.steps
    ones = tuple((1,) * len(c) for c in layout.data)
    top = xp.reshape(xp.max(dask_graph.map_chunks(chunked.top, [x], [], ones, xp.float32)), (1,))
    lanes = (*ones[:-1], (2,) * len(layout.data[-1]))

    def count(sign: Any, value: Any) -> Any:
        parts = dask_graph.map_chunks(chunked.signed_counts, [x], [sign, value], lanes, xp.int64)
        if parts.ndim > 1:
            parts = xp.sum(parts, axis=tuple(range(parts.ndim - 1)))
        return xp.concat([xp.reshape(xp.sum(parts[j::2]), (1,)) for j in range(2)])

    return steps.percentile_of(count, None if steps.scrub else top, xp=xp, device=compat.device(top))


def affine_range_lazy(x: Any, plan: Plan, spec: Any) -> tuple[Any, Any]:
    """The percentile ``(lo, hi)`` of the dask array ``x`` per block (or ``(1,)`` each), lazily.

    As the eager ``compute_range``: the input is not checked for finiteness (NaN or infinities
    in a chunk give a non-finite range).
    """
    xp = shim.kernel_namespace(compat.array_namespace(x))
    shape = tuple(int(n) for n in x.shape)
    x = dask_graph.rechunk(x, dask_graph.aligned(x.chunks, _units(plan, shape)))
    layout = _layout(plan, tuple(x.chunks))
    chunked = _AffineChunked(AffineSteps(plan, shape, spec=spec), False, layout.data)
    if not plan.block_dims(shape):
        return _affine_percentile_lazy(x, chunked, layout, xp)
    f32 = xp.float32
    return dask_graph.map_chunks_pair(chunked.bounds, [x], [], (layout.grid, f32), (layout.grid, f32))


def _search_affine_lazy(x: Any, steps: AffineSteps, check: bool, lo: Any, hi: Any, imp: Any, xp: Any) -> Any:
    """Per-tensor affine MSE search as a graph: row errors per candidate over whole-row chunks, a lazy choice."""
    rows, data, out_chunks = _whole_rows(x)
    chunked = _AffineChunked(steps, check, data)
    errors, factors = [], []
    for f in steps.spec.factors:
        e = dask_graph.map_chunks(chunked.row_errors, [rows], [lo, hi, imp, f], out_chunks, xp.float32)
        errors.append(xp.reshape(e, (-1,)))
        factors.append(xp.asarray([f], dtype=xp.float32))
    f_best = select(errors, factors, xp=xp)
    return xp.multiply(lo, f_best), xp.multiply(hi, f_best)


def dequantize_affine_lazy(qt: QuantizedTensor, plan: Plan, scales: Any, zero: Any, out_dtype: Any) -> Any:
    """The float dask array a lazy (validated) affine quantized tensor stands for."""
    shape = qt.shape
    axis = plan.packed_axis(len(shape))
    per, unit_words = pack_unit(plan)
    data = [tuple(n for n in sizes if n) or (0,) for sizes in qt.values.chunks]  # no empty chunks
    if axis is not None:  # words back to fields, about: the chunks are realigned to whole units below
        fields = [n * per // unit_words for n in data[axis][:-1]]
        data[axis] = (*fields, shape[axis] - sum(fields))
    layout = _layout(plan, dask_graph.aligned(tuple(data), _units(plan, shape)))
    values = dask_graph.rechunk(qt.values, layout.values)
    chunked = _AffineChunked(AffineSteps(plan, shape), False, layout.data)
    f32 = compat.array_namespace(values).float32
    if plan.block_dims(shape):
        grids = [dask_graph.rechunk(scales, layout.grid), dask_graph.rechunk(zero, layout.grid)]
        y = dask_graph.map_chunks(chunked.decode, [values, *grids], [], layout.data, f32)
    else:
        y = dask_graph.map_chunks(chunked.decode, [values], [scales, zero], layout.data, f32)
    return cast_saturating(y, out_dtype, xp=compat.array_namespace(y))
