"""Dequantization: ``x' = eff * decode(code)`` in f32, then the requested float dtype."""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from .backends import shim
from .chunks import Sink, row_chunks
from .errors import DTypeError, ParamsError
from .invariants import check_params, check_shape, is_real_float, namespace_of, plan_for
from .kernels import (
    as_blocks,
    dequantize_float,
    dequantize_int,
    dequantize_lookup,
    effective_scale,
    from_blocks,
    grid_as_blocks,
    pad_to_blocks,
)
from .scheme import QParams
from .storage import check_values, fields_per_word, unpack_values
from .tensor import QuantizedTensor

__all__ = ["dequantize"]


def dequantize(qt: QuantizedTensor, dtype: Any = None) -> Any:
    """The float array a quantized tensor stands for, in ``dtype`` (default: the original).

    >>> import array_api_strict as xp
    >>> from arrayquant import quantize
    >>> x = xp.asarray([[0.5, -1.0, 0.25, 2.0]])
    >>> [float(v) for v in dequantize(quantize(x, "q8s:native"))[0, ...]]
    [0.5039370059967041, -1.0078740119934082, 0.25196850299835205, 2.0]
    """
    if not isinstance(qt, QuantizedTensor):
        msg = f"qt must be an aq.QuantizedTensor from aq.quantize, got {type(qt).__name__}"
        raise ParamsError(msg)
    plan = plan_for(qt.scheme)
    xp = namespace_of(qt.values, "qt.values")
    device = compat.device(qt.values)
    shape = check_shape(qt.shape, "qt.shape")
    stored = QParams(qt.scales, qt.global_scale, qt.table)
    scales, glob, tab = check_params(stored, plan, shape, xp, device, what="qt")
    out_dtype = qt.dtype if dtype is None else dtype
    if not is_real_float(xp, out_dtype):
        msg = f"dtype {out_dtype} is not a real floating dtype of {xp.__name__}; dequantize to e.g. xp.float32"
        raise DTypeError(msg)
    check_values(qt.values, plan, shape, xp)
    rank = len(shape)
    dims = plan.block_dims(rank)
    axis = plan.packed_axis(rank)
    per_word = fields_per_word(plan)
    n_axis = shape[axis] if axis is not None else 0
    chunks = row_chunks(shape, dims[0] if dims else 1, axis, per_word, shim.slab_friendly(qt.values))

    def decode(codes: Any, eff: Any) -> Any:
        if tab is not None:
            return dequantize_lookup(codes, eff, tab, plan, xp=xp)
        if plan.value.is_float:
            return dequantize_float(codes, eff, plan, xp=xp)
        return dequantize_int(codes, eff, xp=xp)

    with shim.quiet(xp):
        eff = effective_scale(scales, glob, plan, xp=xp)
        out = Sink(len(chunks), shape, out_dtype, xp, device)
        for c in chunks:
            rows = c.rows.stop - c.rows.start
            codes = unpack_values(qt.values[c.stored, ...], plan, rank, rows if axis == 0 else n_axis, xp=xp)
            if dims:
                cb = as_blocks(pad_to_blocks(codes, dims, xp=xp, edge=False), dims, xp=xp)
                y = from_blocks(decode(cb, grid_as_blocks(eff[c.grid, ...], xp=xp)), tuple(codes.shape), xp=xp)
            else:
                y = decode(codes, eff)
            out.put(c.rows, xp.astype(y, out_dtype, copy=False))
        return out.result
