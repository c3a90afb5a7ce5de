"""What every operation on quantized tensors shares: propagation, the float view, requantization, checks.

Burn decides per operation whether a quantized input stays quantized. Operations that go through
floats compute on the dequantized values; where Burn requantizes at all, ``propagation`` chooses:
``"inhibit"`` (Burn's default) returns the float result, ``"propagate"`` quantizes it again with the
input's scheme (the left operand's for two operands), its scales found afresh by MinMax.

Also here, for every ops module: the checks of operands, axes, flags and result sizes, and the
selection of stored codes that keeps a per-tensor scale (``max``, ``min``, ``sort``, ``topk``).
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import operator
from collections.abc import Callable
from typing import Any, TypeVar

import array_api_compat as compat

from ..backends.shim import quiet
from ..dequantize import dequantize
from ..errors import DTypeError, ParamsError, SchemeError, ShapeError
from ..invariants import is_real_float, plan_for
from ..invariants.data import MAX_ELEMENTS, can_read, check_same_place, check_shape
from ..quantize import quantize
from ..scheme import BlockSize, QuantScheme
from ..storage import pack
from ..tensor import QuantizedTensor

__all__ = [
    "BROADCAST_RESULT",
    "PROPAGATIONS",
    "SCALARS",
    "allocating",
    "as_int",
    "broadcast_shape",
    "check_elements",
    "check_flag",
    "check_mask",
    "check_operands",
    "check_propagation",
    "check_result_size",
    "document",
    "finish",
    "fit_scheme",
    "float_args",
    "floats",
    "gather_along",
    "normalize_axes",
    "one_axis",
    "operand",
    "per_tensor",
    "positions",
    "reduce_axes",
    "requantize",
    "require_quantized",
    "same_place",
    "with_codes",
]

PROPAGATIONS = ("inhibit", "propagate")

_T = TypeVar("_T")


def check_propagation(propagation: object) -> str:
    """``propagation`` as one of :data:`PROPAGATIONS`, else a :class:`SchemeError` saying which exist."""
    if isinstance(propagation, str) and propagation in PROPAGATIONS:
        return propagation
    msg = (
        f"propagation must be 'inhibit' (return floats, Burn's default) or 'propagate' (quantize the "
        f"result again with the input's scheme), got {propagation!r}"
    )
    raise SchemeError(msg)


def check_result_size(shape: tuple[int, ...], what: str, fix: str) -> None:
    """Refuse a result past the limits :func:`~arrayquant.quantize` enforces (axes, elements), before it is built.

    An operation that grows its input from an argument (a count, a target shape, many inputs) checks
    here first, so an absurd size is a :class:`ShapeError` saying ``fix``, not a MemoryError, an
    overflow or a crash inside the backend.
    """
    try:
        check_shape(shape, what)
    except ShapeError as exc:
        raise ShapeError(f"{exc}; {fix}") from None


def check_elements(shape: tuple[int, ...], what: str, fix: str) -> None:
    """Refuse a float result or an intermediate of more than ``MAX_ELEMENTS`` elements, before it is built.

    Unlike :func:`check_result_size` this leaves the rank and empty axes alone (a float array may have
    them); only a count no backend can index is refused, as a :class:`ShapeError` saying ``fix``.
    """
    n = math.prod(shape)
    if n > MAX_ELEMENTS:
        msg = f"{what} {list(shape)} has {n} elements, more than the {MAX_ELEMENTS} any array can hold; {fix}"
        raise ShapeError(msg)


def allocating(run: Callable[[], _T], what: str) -> _T:
    """``run()``, with the backend's refusal to allocate its result said as a :class:`ShapeError`.

    Within the element limit a result can still be far beyond memory (a small tensor broadcast
    against a huge zero-stride view); NumPy's and CuPy's MemoryError name the size they could not get.
    """
    try:
        return run()
    except MemoryError as exc:
        msg = f"{what} could not be allocated ({exc or 'out of memory'}); ask for a smaller result"
        raise ShapeError(msg) from exc


def as_int(v: Any) -> int | None:
    """``v`` as a Python int where it is an integer (NumPy ints, 0-d integer arrays), else None; never a bool."""
    if isinstance(v, bool):
        return None
    if compat.is_array_api_obj(v):  # why: a 0-d bool tensor has __index__ in some libraries
        try:
            integral = bool(compat.array_namespace(v).isdtype(v.dtype, "integral"))
        except (TypeError, ValueError):
            integral = False
        if not integral:
            return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def normalize_axes(axis: Any, rank: int, *, many: bool = True) -> tuple[int, ...]:
    """``axis`` (an int, or with ``many`` a tuple of ints) as distinct axes in ``[0, rank)``, else a ShapeError.

    The one check every reduction, scan and sort shares. Integers are read with ``operator.index``,
    as layout's axes are, so NumPy ints and 0-d integer arrays count and floats, strings and bools
    (``True`` would silently mean axis 1) do not. ``None`` is the caller's to interpret first.
    """
    kind = "an int or a tuple of ints" if many else "an int"
    items = axis if many and isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        i = as_int(a)
        if i is None:
            entry = "" if a is axis else f" (entry {a!r} is not an integer)"
            hint = "; pass a tuple such as (0, 1)" if many and isinstance(axis, list) else ""
            msg = f"axis must be {kind}, got {axis!r}{entry}{hint}"
            raise ShapeError(msg)
        if not -rank <= i < rank:
            msg = f"axis {i} is out of range for a {rank}-d tensor; use an axis in {-rank}..{rank - 1}"
            raise ShapeError(msg)
        out.append(i % rank)
    if len(set(out)) != len(out):
        msg = f"axis {axis!r} names an axis twice; name each axis once"
        raise ShapeError(msg)
    return tuple(out)


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a Python bool: True, False or a NumPy-style 0-d bool; anything else is a ParamsError.

    why strict: a flag taken by truthiness turns ``keepdims="no"`` or ``descending=1.5`` into a
    silently different result.
    """
    if isinstance(value, bool):
        return value
    if compat.is_array_api_obj(value) and tuple(value.shape) == () and can_read(value):
        xp = compat.array_namespace(value)
        if xp.isdtype(value.dtype, "bool"):
            return bool(value)
    msg = f"{name} must be True or False, got {value!r}"
    raise ParamsError(msg)


def floats(qt: QuantizedTensor) -> Any:
    """The float array ``qt`` stands for, in its own dtype, namespace and device.

    A tensor whose floats exceed memory (its codes a zero-stride view, say) is a ShapeError.
    """
    return allocating(lambda: dequantize(qt), f"the float values of a tensor of shape {list(qt.shape)}")


def operand(v: Any) -> Any:
    """A float view of an operand: a quantized tensor dequantized; arrays and Python scalars as they are."""
    return floats(v) if isinstance(v, QuantizedTensor) else v


def fit_scheme(scheme: QuantScheme, rank: int) -> QuantScheme:
    """``scheme`` for data of ``rank`` axes: the block's leading extents beyond the rank dropped,
    and a store packing an axis the data lacks packing the last one instead.

    A result can have fewer axes than its input (``qt[0]``, a reduction, a matrix-vector product);
    the nearest scheme keeps the value, the scale dtypes and the block along the remaining axes.
    """
    out = scheme
    block = scheme.block_size
    if block is not None and len(block.dims) > rank and scheme.block_scale is not None:
        out = out.per_block(BlockSize(block.dims[len(block.dims) - rank :]), scheme.block_scale)
    if out.store.is_packed and out.store.dim >= rank:
        out = out.with_store(dataclasses.replace(out.store, dim=0))
    return out


def requantize(y: Any, like: QuantizedTensor) -> QuantizedTensor:
    """``y`` quantized with ``like``'s scheme (and table), its scales found by MinMax, as Burn does.

    A 0-d ``y`` becomes shape ``(1,)`` (Burn's full reductions); the scheme is fitted to ``y``'s rank
    (:func:`fit_scheme`).
    """
    if y.ndim == 0:
        y = compat.array_namespace(y).reshape(y, (1,))
    return quantize(y, fit_scheme(like.scheme, y.ndim), table=like.table)


def same_place(**operands: Any) -> None:
    """Every array or quantized operand must share one namespace and device (a typed DeviceError if not)."""
    arrays = {k: (v.values if isinstance(v, QuantizedTensor) else v) for k, v in operands.items()}
    first = next((a for a in arrays.values() if a is not None and compat.is_array_api_obj(a)), None)
    if first is None:
        return
    check_same_place(compat.array_namespace(first), compat.device(first), **arrays)


def positions(qt: QuantizedTensor, indices: Any, n: int, what: str) -> Any:
    """Integer ``indices`` into an axis of length ``n``, in ``[-n, n)``, as non-negative positions.

    A list is taken into ``qt``'s namespace; the range is checked where the indices can be read now.
    Nothing reads the indices before their converted copy is allocated: an index array past the
    element limit, or one whose copy memory cannot hold (a huge zero-stride view), is a ShapeError
    at once rather than a MemoryError after a pass over all of it.
    """
    xp = compat.array_namespace(qt.values)
    if isinstance(indices, QuantizedTensor):
        msg = f"{what} indices must be an integer array, got a QuantizedTensor"
        raise DTypeError(msg)
    if not compat.is_array_api_obj(indices):
        try:
            indices = xp.asarray(indices, device=qt.device)
        except (ValueError, TypeError, OverflowError) as e:  # ragged lists, objects, ints past int64
            msg = f"{what} indices must be an integer array or a nested list of ints of one shape: {e}"
            raise ShapeError(msg) from None
    same_place(qt=qt, indices=indices)
    if not xp.isdtype(indices.dtype, "integral"):
        msg = f"{what} indices must be an integer array, got dtype {indices.dtype}"
        raise DTypeError(msg)
    shape = tuple(indices.shape)  # a Dask dimension may be NaN (unknown): the check then passes it
    check_elements(shape, f"{what} indices", "pass fewer indices")
    default = xp.asarray(0, device=qt.device).dtype  # the default int: int64, or int32 on JAX without x64
    # why copy first: the copy is the one allocation the indices need, so one refused allocation
    # ends a hopeless call before any pass over the indices (the old range mask was a full copy too)
    idx = allocating(lambda: xp.astype(indices, default), f"{what} with indices of shape {list(shape)}")
    if not can_read(idx):
        return xp.where(idx < 0, idx + n, idx)
    if math.prod(shape):
        lo, hi = int(xp.min(idx)), int(xp.max(idx))  # two reductions: no mask of the indices' size
        if lo < -n or hi >= n:
            msg = f"{what} indices must lie in [{-n}, {n}) for an axis of length {n}"
            raise ShapeError(msg)
        if lo >= 0:
            return idx
        # in range, so the remainder is the position: one new array where the where took three
        return allocating(lambda: idx % n, f"{what} with indices of shape {list(shape)}")
    return idx


# -- operands of the operations that compute on floats ---------------------------------------------
SCALARS = (bool, int, float)  # the Python scalars an operand may be
BROADCAST_RESULT = "the broadcast result"  # what a result an operand's shape sizes is called in a ShapeError


def require_quantized(x: Any, name: str = "x") -> QuantizedTensor:
    """``x`` when it is a quantized tensor, else a DTypeError sending float arrays to their own library."""
    if not isinstance(x, QuantizedTensor):
        msg = (
            f"{name} must be an aq.QuantizedTensor (from aq.quantize), got {type(x).__name__}; "
            "for float arrays use the array library's own function"
        )
        raise DTypeError(msg)
    return x


def _shape(v: Any) -> tuple[int, ...]:
    if isinstance(v, QuantizedTensor):
        return tuple(v.shape)
    if isinstance(v, SCALARS):
        return ()
    return tuple(v.shape)


def broadcast_shape(names: tuple[str, ...], *operands: Any) -> tuple[int, ...]:
    """The broadcast shape of the operands, or a ShapeError naming every shape."""
    shapes = [_shape(v) for v in operands]
    rank = builtins.max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            described = ", ".join(f"{n} {list(s)}" for n, s in zip(names, shapes, strict=True))
            msg = (
                f"shapes do not broadcast: {described}; each axis (aligned from the right) must have "
                "equal extents or extent 1"
            )
            raise ShapeError(msg)
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def check_operands(names: tuple[str, ...], values: tuple[Any, ...]) -> list[QuantizedTensor]:
    """Check operand kinds, namespace/device and broadcasting; return the quantized ones in order."""
    quantized = [v for v in values if isinstance(v, QuantizedTensor)]
    if not quantized:
        described = ", ".join(f"{n} {type(v).__name__}" for n, v in zip(names, values, strict=True))
        msg = (
            f"at least one operand must be an aq.QuantizedTensor, got {described}; for float arrays "
            "use the array library's own function"
        )
        raise DTypeError(msg)
    for n, v in zip(names, values, strict=True):
        if not isinstance(v, (QuantizedTensor, *SCALARS)) and not compat.is_array_api_obj(v):
            msg = f"{n} must be a QuantizedTensor, an Array API array or a Python scalar, got {type(v).__name__}"
            raise DTypeError(msg)
        if compat.is_array_api_obj(v) and not _real(v):
            # why: NumPy would answer strings and datetimes with a UFuncTypeError, and turn complex or
            # object operands into complex or object "floats" that no quantized tensor can hold
            msg = f"{n} has dtype {v.dtype}; operands must hold real numbers (bool, integer or real floating)"
            raise DTypeError(msg)
    same_place(**dict(zip(names, values, strict=True)))
    shape = broadcast_shape(names, *values)
    check_elements(shape, "the broadcast result", "broadcast against a smaller operand")
    return quantized


def _real(a: Any) -> bool:
    """Whether array ``a`` holds real numbers: bool, integer or real floating (bfloat16 included)."""
    xp = compat.array_namespace(a)
    if is_real_float(xp, a.dtype):
        return True
    try:
        return bool(xp.isdtype(a.dtype, ("bool", "integral")))
    except (TypeError, ValueError, AttributeError):  # object, string and datetime dtypes in some versions
        return False


def float_args(values: tuple[Any, ...], like: QuantizedTensor) -> list[Any]:
    """Dequantized operands; Python scalars become 0-d arrays of the float result's dtype.

    A scalar past the dtype's range becomes +-inf (NumPy's cast, without its warning); an int past
    every float's range is a DTypeError (NumPy raises OverflowError).
    """
    arrays = [operand(v) for v in values]
    ref = next(a for a, v in zip(arrays, values, strict=True) if isinstance(v, QuantizedTensor))
    xp = compat.array_namespace(ref)
    device = compat.device(ref)
    for a in arrays:
        if isinstance(a, int):
            try:
                float(a)
            except OverflowError:
                msg = (
                    f"a scalar int of {a.bit_length()} bits is beyond the range of every float dtype; "
                    "pass a float (e.g. math.inf) instead"
                )
                raise DTypeError(msg) from None
    with quiet(xp):
        return [xp.asarray(a, dtype=ref.dtype, device=device) if isinstance(a, SCALARS) else a for a in arrays]


def reduce_axes(axis: Any, ndim: int) -> tuple[int, ...] | None:
    """``axis`` of a reduction as a tuple of non-negative axes (None, every axis, stays None), or a ShapeError."""
    return None if axis is None else normalize_axes(axis, ndim)


def one_axis(axis: Any, ndim: int) -> int:
    """The one axis a sort, scan or indexed update works along; None is a ShapeError here, not all axes."""
    return normalize_axes(axis, ndim, many=False)[0]


def finish(result: Any, like: QuantizedTensor, propagation: str) -> Any:
    """Burn's flow rule: the float result, or it requantized with ``like``'s scheme (at least 1-d)."""
    if propagation == "inhibit":
        return result
    if result.ndim == 0:
        result = compat.array_namespace(result).reshape(result, (1,))
    return requantize(result, like)


def document(functions: tuple[Callable[..., Any], ...], doc: str) -> None:
    """Append the shared Parameters/Returns/Raises text to each function's docstring."""
    for fn in functions:
        fn.__doc__ = (fn.__doc__ or "") + doc


def per_tensor(qt: QuantizedTensor) -> bool:
    """Whether ``qt``'s scheme has one scale for the whole tensor (no block level)."""
    return plan_for(qt.scheme).block is None


def check_mask(mask: Any, name: str) -> None:
    """A DTypeError unless ``mask`` is a bool array (a quantized tensor is none)."""
    if isinstance(mask, QuantizedTensor) or not compat.is_array_api_obj(mask):
        msg = f"{name} must be a bool array, got {type(mask).__name__}"
        raise DTypeError(msg)
    xp = compat.array_namespace(mask)
    if not xp.isdtype(mask.dtype, "bool"):
        msg = f"{name} must be a bool array, got dtype {mask.dtype}; build it with a comparison such as x > 0"
        raise DTypeError(msg)


# -- the stored codes of a per-tensor scheme, selected --------------------------------------------
def gather_along(xp: Any, a: Any, idx: Any, axis: int) -> Any:
    """``take_along_axis``; where a namespace lacks it (dask), a one-hot maximum along ``axis``."""
    if hasattr(xp, "take_along_axis"):
        return xp.take_along_axis(a, idx, axis=axis)
    # exact: the one selected entry is at least the fill, the dtype's smallest value
    n = a.shape[axis]
    a = xp.expand_dims(xp.moveaxis(a, axis, -1), axis=-2)  # (..., 1, n)
    i = xp.expand_dims(xp.moveaxis(idx, axis, -1), axis=-1)  # (..., k, 1)
    hit = xp.equal(i, xp.arange(n, dtype=i.dtype, device=compat.device(i)))
    low = -math.inf if xp.isdtype(a.dtype, "real floating") else xp.iinfo(a.dtype).min
    fill = xp.asarray(low, dtype=a.dtype, device=compat.device(a))
    return xp.moveaxis(xp.max(xp.where(hit, a, fill), axis=-1), -1, axis)


def with_codes(qt: QuantizedTensor, codes: Any) -> QuantizedTensor:
    """``qt``'s scale (per tensor: one scale for any shape) over other codes."""
    return dataclasses.replace(qt, shape=tuple(int(n) for n in codes.shape), values=pack(codes, qt.scheme))
