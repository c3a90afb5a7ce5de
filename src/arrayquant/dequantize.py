"""Dequantization: ``x' = eff * decode(code)`` in f32, then the requested float dtype."""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from .backends import dask_graph, shim
from .blockwork import Steps
from .chunks import Sink, row_chunks
from .errors import DTypeError, ParamsError
from .invariants import check_params, check_shape, is_real_float, namespace_of, plan_for
from .kernels import effective_scale
from .lazy import dequantize_lazy
from .scheme import QParams
from .storage import check_values, fields_per_word
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
    if dask_graph.handles(qt.values):
        with shim.quiet(xp):
            return dequantize_lazy(qt, plan, scales, glob, tab, out_dtype)
    rank = len(shape)
    dims = plan.block_dims(rank)
    axis = plan.packed_axis(rank)
    n_axis = shape[axis] if axis is not None else 0
    chunks = row_chunks(shape, dims[0] if dims else 1, axis, fields_per_word(plan), shim.slab_friendly(qt.values))
    steps = Steps(plan, rank)
    with shim.quiet(xp):
        eff = effective_scale(scales, glob, plan, xp=xp)
        out = Sink(len(chunks), shape, out_dtype, xp, device)
        for c in chunks:
            n_packed = c.rows.stop - c.rows.start if axis == 0 else n_axis
            y = steps.decode(qt.values[c.stored, ...], eff[c.grid, ...] if dims else eff, tab, n_packed, xp=xp)
            out.put(c.rows, xp.astype(y, out_dtype, copy=False))
        return out.result
