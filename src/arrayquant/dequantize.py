"""Dequantization: ``x' = eff * decode(code)`` in f32, then the requested float dtype."""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from .affinework import AffineSteps
from .backends import dask_graph, shim
from .blockwork import Steps, cast_saturating
from .chunks import Sink, row_chunks
from .errors import DTypeError, ParamsError
from .invariants import Plan, check_params, check_shape, check_zero, is_real_float, namespace_of, plan_for
from .kernels import effective_scale
from .lazy import dequantize_affine_lazy, dequantize_lazy
from .scheme import QParams
from .storage import check_values, pack_unit
from .tensor import QuantizedTensor

__all__ = ["dequantize"]


def dequantize(qt: QuantizedTensor, dtype: Any = None) -> Any:
    """The float array a quantized tensor stands for, in ``dtype`` (default: the original).

    Values are ``eff * decode(code)`` computed in f32 (``eff`` the stored scale, times the global
    of a two-level scheme), saturating at the f32 maximum, then cast to ``dtype``. Affine schemes
    give ``(q - z) * s`` (zero point) or ``d * q + m`` (offset), in f32 the same way.

    Parameters
    ----------
    qt : QuantizedTensor
        From :func:`quantize`, :func:`from_bytes` or :func:`load`.
    dtype : dtype or str, optional
        A real floating dtype of the tensor's library, or its name (``"float32"``, ``"float16"``,
        ``"bfloat16"``, ``"float64"``). Default: the dtype the tensor was quantized from.

    Returns
    -------
    array
        Of ``qt.shape``, in the namespace and on the device of ``qt.values`` (lazy for Dask).

    Raises
    ------
    ParamsError
        ``qt`` is not a QuantizedTensor, or its scales do not fit its scheme.
    ShapeError
        Values or scales of the wrong shape or dtype for the scheme and ``qt.shape``.
    DTypeError
        ``dtype`` is not a real floating dtype of the tensor's library.

    Examples
    --------
    >>> import numpy as np
    >>> from arrayquant import quantize
    >>> x = np.array([[0.5, -1.0, 0.25, 2.0]], dtype=np.float32)
    >>> dequantize(quantize(x, "q8s:native")).tolist()
    [[0.5039370059967041, -1.0078740119934082, 0.25196850299835205, 2.0]]
    >>> dequantize(quantize(x, "q8s:native"), "float16").dtype
    dtype('float16')
    """
    if not isinstance(qt, QuantizedTensor):
        msg = f"qt must be an aq.QuantizedTensor from aq.quantize, got {type(qt).__name__}"
        raise ParamsError(msg)
    plan = plan_for(qt.scheme)
    xp = namespace_of(qt.values, "qt.values")
    device = compat.device(qt.values)
    shape = check_shape(qt.shape, "qt.shape")
    stored = QParams(qt.scales, qt.global_scale, qt.table, qt.zero_point, qt.offset)
    scales, glob, tab = check_params(stored, plan, shape, xp, device, what="qt")
    zero = check_zero(stored, plan, shape, xp, device, what="qt")
    out_dtype = qt.dtype if dtype is None else dtype
    if isinstance(out_dtype, str):
        name = out_dtype.strip().lower()
        out_dtype = shim.named_dtype(qt.values, name)
        if out_dtype is None:
            msg = (
                f"dtype {name!r} is not a dtype of {xp.__name__}; use 'float32', 'float16', 'float64' "
                "or 'bfloat16' (NumPy needs ml_dtypes for bfloat16)"
            )
            raise DTypeError(msg)
    if not is_real_float(xp, out_dtype):
        msg = f"dtype {out_dtype} is not a real floating dtype of {xp.__name__}; dequantize to e.g. xp.float32"
        raise DTypeError(msg)
    check_values(qt.values, plan, shape, xp)
    if plan.affine:
        return _dequantize_affine(qt, plan, scales, zero, out_dtype, xp, device)
    if dask_graph.handles(qt.values):
        with shim.quiet(xp):
            return dequantize_lazy(qt, plan, scales, glob, tab, out_dtype)
    if tab is None:
        y = _fused(qt.values, scales, glob, plan, shape)
        if y is not None:
            with shim.quiet(xp):
                return cast_saturating(y, out_dtype, xp=xp)
    rank = len(shape)
    dims = plan.block_dims(shape)
    axis = plan.packed_axis(rank)
    n_axis = shape[axis] if axis is not None else 0
    chunks = row_chunks(shape, dims[0] if dims else 1, axis, pack_unit(plan), shim.slab_friendly(qt.values))
    steps = Steps(plan, shape)
    with shim.quiet(xp):
        eff = effective_scale(scales, glob, plan, xp=xp)
        out = Sink(len(chunks), shape, out_dtype, xp, device)
        for c in chunks:
            n_packed = c.rows.stop - c.rows.start if axis == 0 else n_axis
            y = steps.decode(qt.values[c.stored, ...], eff[c.grid, ...] if dims else eff, tab, n_packed, xp=xp)
            out.put(c.rows, cast_saturating(y, out_dtype, xp=xp))
        return out.result


def _dequantize_affine(
    qt: QuantizedTensor, plan: Plan, scales: Any, zero: Any, out_dtype: Any, xp: Any, device: Any
) -> Any:
    shape = qt.shape
    if dask_graph.handles(qt.values):
        with shim.quiet(xp):
            return dequantize_affine_lazy(qt, plan, scales, zero, out_dtype)
    from .fused import registry

    kernel = registry.affine_dequantize_kernel(qt.values, plan, shape)
    y = None if kernel is None else kernel(qt.values, scales, zero, plan, shape)
    if y is not None:  # the same f32 bits (tests/test_fused_affine.py)
        with shim.quiet(xp):
            return cast_saturating(y, out_dtype, xp=xp)
    dims = plan.block_dims(shape)
    axis = plan.packed_axis(len(shape))
    n_axis = shape[axis] if axis is not None else 0
    chunks = row_chunks(shape, dims[0] if dims else 1, axis, pack_unit(plan), shim.slab_friendly(qt.values))
    steps = AffineSteps(plan, shape)
    with shim.quiet(xp):
        kx = shim.kernel_namespace(xp)
        out = Sink(len(chunks), shape, out_dtype, xp, device)
        for c in chunks:
            n_packed = c.rows.stop - c.rows.start if axis == 0 else n_axis
            s_c, z_c = (scales[c.grid, ...], zero[c.grid, ...]) if dims else (scales, zero)
            y = steps.decode(qt.values[c.stored, ...], s_c, z_c, n_packed, xp=kx)
            out.put(c.rows, cast_saturating(y, out_dtype, xp=kx))
        return out.result


def _fused(values: Any, scales: Any, glob: Any, plan: Plan, shape: tuple[int, ...]) -> Any:
    """The f32 data from a fused kernel (tests/test_fused_dequantize.py: the same bits), or None."""
    from .fused import registry

    kernel = registry.dequantize_kernel(values, plan, shape)
    return None if kernel is None else kernel(values, scales, glob, plan, shape)
