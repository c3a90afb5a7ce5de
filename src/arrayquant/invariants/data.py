"""Data checks: dtype, rank, finiteness, and one namespace on one device."""

from __future__ import annotations

import math
import operator
from typing import Any

import array_api_compat as compat

from ..errors import DeviceError, DTypeError, NonFiniteInputError, ShapeError
from .plan import Plan

__all__ = [
    "CHECK_CHUNK_ELEMENTS",
    "MAX_ELEMENTS",
    "MAX_RANK",
    "can_read",
    "check_finite",
    "check_input",
    "check_same_place",
    "check_shape",
    "is_real_float",
    "namespace_of",
]

CHECK_CHUNK_ELEMENTS = 1 << 20  # finiteness is checked in slices so its mask stays small
# why 32: block kernels view each axis as (grid, block), doubling the rank, and NumPy allows 64 axes
MAX_RANK = 32
MAX_ELEMENTS = 2**62  # element counts (and the byte sizes of up to f64 arrays) stay within int64


def _check_extent(shape: tuple[int, ...], name: str) -> None:
    if len(shape) > MAX_RANK:
        msg = (
            f"{name} has {len(shape)} axes; quantized tensors have at most {MAX_RANK}, so merge axes "
            f"first (e.g. reshape to 2-d)"
        )
        raise ShapeError(msg)
    if math.prod(shape) > MAX_ELEMENTS:
        msg = f"{name} {list(shape)} has {math.prod(shape)} elements, more than the {MAX_ELEMENTS} any array can hold"
        raise ShapeError(msg)


def namespace_of(x: Any, name: str = "x") -> Any:
    """The Array API namespace of ``x``, or a :class:`DTypeError` if it is not an array."""
    if not compat.is_array_api_obj(x):
        msg = (
            f"{name} must be an Array API array (numpy, cupy, torch, jax, dask, array-api-strict), "
            f"got {type(x).__name__}; convert it with aq.asarray({name})"
        )
        raise DTypeError(msg)
    return compat.array_namespace(x)


def is_real_float(xp: Any, dtype: Any) -> bool:
    """Whether ``dtype`` is a real floating dtype of ``xp`` (bfloat16 included), never raising."""
    try:
        return bool(xp.isdtype(dtype, "real floating"))
    except (TypeError, ValueError, AttributeError):
        return str(getattr(dtype, "name", dtype)).endswith("bfloat16")  # NumPy arrays of ml_dtypes.bfloat16


def check_input(x: Any, plan: Plan, name: str = "x") -> tuple[Any, Any]:
    """Check the data against the plan; return its namespace and device."""
    xp = namespace_of(x, name)
    if not is_real_float(xp, x.dtype):
        msg = (
            f"{name} has dtype {x.dtype}, but quantization needs a real floating array; "
            f"cast it first, e.g. xp.astype({name}, xp.float32)"
        )
        raise DTypeError(msg)
    shape = tuple(x.shape)
    if any(n is None or n != n for n in shape):  # dask marks unknown lengths as NaN
        msg = f"{name} has an unknown shape {shape}; compute its chunk sizes first (dask: x.compute_chunk_sizes())"
        raise ShapeError(msg)
    if len(shape) == 0:
        msg = f"{name} is 0-d; quantize at least a 1-d array, e.g. xp.reshape({name}, (1,))"
        raise ShapeError(msg)
    if math.prod(shape) == 0:
        msg = f"{name} has shape {shape} with no elements; there is nothing to calibrate or quantize"
        raise ShapeError(msg)
    _check_extent(shape, name)
    plan.block_dims(len(shape))
    plan.packed_axis(len(shape))
    return xp, compat.device(x)


def check_shape(shape: Any, name: str = "shape") -> tuple[int, ...]:
    """A data shape as a tuple of Python ints, each at least 1, rank at least 1 (an int is 1-d, as in NumPy)."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(operator.index(n) for n in shape)
    except TypeError:
        msg = f"{name} must be a sequence of integers such as (4, 64), got {shape!r}"
        raise ShapeError(msg) from None
    if not dims or min(dims) < 1 or isinstance(shape, (str, bytes)):
        msg = f"{name} {shape!r} must have at least one axis and every extent >= 1, e.g. (4, 64)"
        raise ShapeError(msg)
    _check_extent(dims, name)
    return dims


def _traced(a: Any) -> bool:
    return any(c.__name__.endswith("Tracer") for c in type(a).__mro__)


def can_read(x: Any) -> bool:
    """Whether value checks may read ``x`` now (not a dask graph, not a traced jax value).

    A concrete jax array used inside ``jax.jit`` (a tensor the traced function closes over) is
    readable itself, but every result computed from it there is traced: it counts as unreadable.
    """
    if not compat.is_lazy_array(x):
        return True
    if not compat.is_jax_array(x) or _traced(x):
        return False
    # inside a trace even a new constant is traced (one scalar, whatever the size of x)
    return not _traced(compat.array_namespace(x).zeros(()))


def check_same_place(xp: Any, device: Any, **arrays: Any) -> None:
    """Every named array must live in ``xp`` on ``device`` (None entries are skipped)."""
    for name, arr in arrays.items():
        if arr is None or not compat.is_array_api_obj(arr):
            continue
        try:
            other = compat.array_namespace(arr)
        except TypeError:
            other = None
        if other is not xp:
            msg = (
                f"{name} is a {type(arr).__module__}.{type(arr).__name__} but the data lives in "
                f"{getattr(xp, '__name__', xp)}; move it there first, e.g. aq.asarray({name}, backend=...)"
            )
            raise DeviceError(msg)
        here = compat.device(arr)
        # a value traced by jax.jit has no device (None): only concrete devices can disagree
        if here != device and here is not None and device is not None:
            msg = (
                f"{name} is on device {here!r} but the data is on {device!r}; "
                f"move it with aq.asarray({name}, device=...) so both are on one device"
            )
            raise DeviceError(msg)


def check_finite(x: Any, xp: Any, name: str = "x", origin: tuple[int, ...] | None = None) -> None:
    """Raise :class:`NonFiniteInputError` naming the count and first index of NaN/inf in ``x``.

    With ``origin``, ``x`` is the chunk of a larger (dask) array that starts there: the message
    counts that chunk and gives the first index in the whole array.

    The check runs on the values as computed, in f32: a finite float64 beyond the f32 range
    overflows there and counts as infinite. Rows are checked a slab at a time, so the masks stay
    small and a strided input is never copied whole.
    """
    shape = tuple(x.shape)
    row = math.prod(shape[1:])
    step = max(1, CHECK_CHUNK_ELEMENTS // max(row, 1))
    count, first, value, overflow = 0, -1, 0.0, False
    for r0 in range(0, shape[0], step):
        slab = xp.reshape(x[r0 : min(r0 + step, shape[0]), ...], (-1,))
        bad = xp.logical_not(xp.isfinite(xp.astype(slab, xp.float32)))
        if bool(xp.any(bad)):
            if first < 0:
                i = int(xp.argmax(xp.astype(bad, xp.uint8)))
                first, value = r0 * row + i, float(slab[i])
                overflow = math.isfinite(value)
            count += int(xp.sum(xp.astype(bad, xp.int32), dtype=xp.int32))
    if count:
        what = "beyond the float32 range" if overflow else "non-finite"
        at = _unravel(first, shape)
        where = ""
        if origin is not None:
            at = tuple(o + i for o, i in zip(origin, at, strict=True))
            where = f" in its chunk starting at {tuple(origin)}, found when the dask graph ran"
        msg = (
            f"{name} has {count} {what} element(s){where} (first at index {at}: {value}); "
            "quantization computes in float32, so clean or rescale the data (e.g. "
            "xp.where(xp.isfinite(x), x, 0)) or pass check_finite=False: infinities then saturate to the range ends "
            "and NaN becomes code 0 (integer values, E2M1) or the NaN code (E4M3/E5M2, dequantizing to NaN)"
        )
        raise NonFiniteInputError(msg)


def _unravel(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        flat_index, r = divmod(flat_index, n)
        out.append(r)
    return tuple(reversed(out))
