"""Dequantization: ``x' = eff * decode(code)`` in f32, then the requested float dtype."""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from .backends import shim
from .chunks import Sink, row_chunks
from .errors import DTypeError, ParamsError
from .invariants import check_same_place, namespace_of, plan_for, require_kernel
from .kernels import as_blocks, dequantize_int, effective_scale, from_blocks, grid_as_blocks, pad_to_blocks
from .storage import _check_values, unpack_values
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
    require_kernel(plan)
    xp = namespace_of(qt.values, "qt.values")
    device = compat.device(qt.values)
    check_same_place(xp, device, scales=qt.scales, global_scale=qt.global_scale)
    out_dtype = qt.dtype if dtype is None else dtype
    if not xp.isdtype(out_dtype, "real floating"):
        msg = f"dtype {out_dtype} is not a real floating dtype; dequantize to e.g. xp.float32"
        raise DTypeError(msg)
    shape = tuple(qt.shape)
    _check_values(qt.values, plan, shape, xp)
    rank = len(shape)
    dims = plan.block_dims(rank)
    axis = plan.packed_axis(rank)
    per_word = (32 if plan.store_kind == "packed_u32" else 8) // plan.bits
    n_axis = shape[axis] if axis is not None else 0
    chunks = row_chunks(shape, dims[0] if dims else 1, axis, per_word, shim.slab_friendly(qt.values))
    with shim.quiet(xp):
        eff = effective_scale(xp.astype(qt.scales, xp.float32, copy=False), qt.global_scale, plan, xp=xp)
        out = Sink(len(chunks), shape, out_dtype, xp, device)
        for c in chunks:
            rows = c.rows.stop - c.rows.start
            codes = unpack_values(qt.values[c.stored, ...], plan, rank, rows if axis == 0 else n_axis, xp=xp)
            if dims:
                cb = as_blocks(pad_to_blocks(codes, dims, xp=xp, edge=False), dims, xp=xp)
                y = from_blocks(
                    dequantize_int(cb, grid_as_blocks(eff[c.grid, ...], xp=xp), xp=xp), tuple(codes.shape), xp=xp
                )
            else:
                y = dequantize_int(codes, eff, xp=xp)
            out.put(c.rows, xp.astype(y, out_dtype, copy=False))
        return out.result
