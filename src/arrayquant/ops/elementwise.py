"""Arithmetic, math, reductions, comparisons and masks on quantized tensors.

Every function computes on the dequantized values in the input's own namespace and device, then
returns what Burn's user-facing ``Tensor`` API returns for a quantized input:

- **propagation** (``propagation="inhibit"``, Burn's default, returns the float array;
  ``"propagate"`` quantizes it again with the input's scheme, the first quantized operand's for two
  operands, scales found afresh by MinMax): :func:`add`, :func:`subtract`, :func:`multiply`,
  :func:`divide`, :func:`pow` (quantized with quantized, or quantized with a Python scalar; a
  quantized operand with a float *array* always gives floats, Burn's mixed rule), :func:`negative`,
  :func:`clip`, :func:`sum`, :func:`prod`, :func:`mean` and the ``cumulative_*`` scans.
- **always float** (Burn dequantizes first): :func:`remainder`, the unary math functions
  (:func:`exp` ... :func:`erf`, :func:`reciprocal`, :func:`round`, :func:`floor`, :func:`ceil`,
  :func:`sign`, :func:`square`), :func:`where`, :func:`mask_fill`, :func:`maximum` and
  :func:`minimum` (Burn's ``max_pair``/``min_pair`` go through ``mask_where``), and the indexed
  updates :func:`scatter_add`, :func:`index_add` and :func:`slice_assign` (Burn's ``scatter``,
  ``select_assign`` and ``slice_assign``).
- **bool**: the comparisons, :func:`isnan`, :func:`isinf`, :func:`any`, :func:`all`.
- **int**: :func:`argmax`, :func:`argmin`, :func:`argsort`.
- **always quantized** (Burn requantizes whatever the propagation): :func:`abs`, :func:`max`,
  :func:`min`, :func:`sort`, :func:`topk`, :func:`mask_select`. On a per-tensor scheme
  ``max``/``min``/``sort``/``topk``/``mask_select`` select the stored codes themselves (one positive
  scale orders the codes as it orders the values), so the result is exact and keeps the input's
  scale; block schemes requantize the selected floats.
- Float math is silent about NumPy's floating-point warnings (``log(0)`` is ``-inf``, as in Burn).
- Arguments are checked before anything is computed: an ``axis`` is an int (NumPy ints too) or,
  for reductions, a tuple of them; flags (``keepdims``, ``descending``, ...) are True or False
  (a :class:`~arrayquant.ParamsError` otherwise, never truthiness); array operands hold real
  numbers. A result past the element limit, or one memory cannot hold (an operand that is a huge
  zero-stride view), is a :class:`~arrayquant.ShapeError`.

A quantized result is at least 1-d: a reduction to a 0-d value gives shape ``(1,)``, as Burn's.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import array_api_compat as compat

from ..backends.shim import quiet, quietly
from ..errors import BackendUnavailableError, DTypeError, ShapeError
from ..invariants import is_real_float, plan_for
from ..storage import pack
from ..tensor import QuantizedTensor
from . import layout
from ._common import (
    allocating,
    as_int,
    check_elements,
    check_flag,
    check_propagation,
    floats,
    normalize_axes,
    operand,
    positions,
    requantize,
    same_place,
)

__all__ = [
    "abs",
    "add",
    "all",
    "any",
    "argmax",
    "argmin",
    "argsort",
    "ceil",
    "clip",
    "cos",
    "cosh",
    "cumulative_max",
    "cumulative_min",
    "cumulative_prod",
    "cumulative_sum",
    "divide",
    "equal",
    "erf",
    "exp",
    "floor",
    "greater",
    "greater_equal",
    "index_add",
    "isinf",
    "isnan",
    "less",
    "less_equal",
    "log",
    "log1p",
    "mask_fill",
    "mask_select",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "multiply",
    "negative",
    "not_equal",
    "pow",
    "prod",
    "reciprocal",
    "remainder",
    "round",
    "scatter_add",
    "sign",
    "sin",
    "sinh",
    "slice_assign",
    "sort",
    "sqrt",
    "square",
    "subtract",
    "sum",
    "tan",
    "tanh",
    "topk",
    "where",
]

_SCALARS = (bool, int, float)


# -- checks ---------------------------------------------------------------------------------------
def _require_quantized(x: Any, name: str = "x") -> QuantizedTensor:
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
    if isinstance(v, _SCALARS):
        return ()
    return tuple(v.shape)


def _broadcast(names: tuple[str, ...], *operands: Any) -> tuple[int, ...]:
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


def _operands(names: tuple[str, ...], values: tuple[Any, ...]) -> list[QuantizedTensor]:
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
        if not isinstance(v, (QuantizedTensor, *_SCALARS)) and not compat.is_array_api_obj(v):
            msg = f"{n} must be a QuantizedTensor, an Array API array or a Python scalar, got {type(v).__name__}"
            raise DTypeError(msg)
        if compat.is_array_api_obj(v) and not _real(v):
            # why: NumPy would answer strings and datetimes with a UFuncTypeError, and turn complex or
            # object operands into complex or object "floats" that no quantized tensor can hold
            msg = f"{n} has dtype {v.dtype}; operands must hold real numbers (bool, integer or real floating)"
            raise DTypeError(msg)
    same_place(**dict(zip(names, values, strict=True)))
    shape = _broadcast(names, *values)
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


def _float_args(values: tuple[Any, ...], like: QuantizedTensor) -> list[Any]:
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
        return [xp.asarray(a, dtype=ref.dtype, device=device) if isinstance(a, _SCALARS) else a for a in arrays]


def _axes(axis: Any, ndim: int) -> tuple[int, ...] | None:
    """``axis`` of a reduction as a tuple of non-negative axes (None, every axis, stays None), or a ShapeError."""
    return None if axis is None else normalize_axes(axis, ndim)


def _one_axis(axis: Any, ndim: int) -> int:
    """The one axis a sort, scan or indexed update works along; None is a ShapeError here, not all axes."""
    return normalize_axes(axis, ndim, many=False)[0]


def _finish(result: Any, like: QuantizedTensor, propagation: str) -> Any:
    """Burn's flow rule: the float result, or it requantized with ``like``'s scheme (at least 1-d)."""
    if propagation == "inhibit":
        return result
    if result.ndim == 0:
        result = compat.array_namespace(result).reshape(result, (1,))
    return requantize(result, like)


def _document(functions: tuple[Callable[..., Any], ...], doc: str) -> None:
    """Append the shared Parameters/Returns/Raises text to each function's docstring."""
    for fn in functions:
        fn.__doc__ = (fn.__doc__ or "") + doc


def _per_tensor(qt: QuantizedTensor) -> bool:
    return plan_for(qt.scheme).block is None


# -- two operands ---------------------------------------------------------------------------------
def _flow_binary(fn: Callable[[Any, Any, Any], Any], x1: Any, x2: Any, propagation: str) -> Any:
    mode = check_propagation(propagation)
    names = ("x1", "x2")
    quantized = _operands(names, (x1, x2))
    a, b = _float_args((x1, x2), quantized[0])
    out = allocating(lambda: quietly(fn, a, b), _RESULT)
    # why: Burn dequantizes a quantized operand met with a float tensor and returns floats
    mixed = builtins.any(not isinstance(v, (QuantizedTensor, *_SCALARS)) for v in (x1, x2))
    return out if mixed else _finish(out, quantized[0], mode)


def _float_binary(fn: Callable[[Any, Any, Any], Any], x1: Any, x2: Any) -> Any:
    quantized = _operands(("x1", "x2"), (x1, x2))
    a, b = _float_args((x1, x2), quantized[0])
    return allocating(lambda: quietly(fn, a, b), _RESULT)


_RESULT = "the broadcast result"  # what a result an operand's shape sizes is called in a ShapeError


_FLOW_DOC = """

    Parameters
    ----------
    x1, x2 : QuantizedTensor, array or Python scalar
        At least one quantized; the others broadcast against it.
    propagation : {"inhibit", "propagate"}
        Affects only quantized-with-quantized and quantized-with-scalar operands: ``"inhibit"``
        (Burn's default) returns the float array, ``"propagate"`` requantizes it with the first
        quantized operand's scheme. A quantized operand with a float array always gives floats.

    Returns
    -------
    array or QuantizedTensor

    Raises
    ------
    ShapeError
        Operands that do not broadcast, or a broadcast result past the element limit or beyond memory.
    DeviceError
        Operands in different namespaces or on different devices.
    DTypeError
        No quantized operand, an operand that is no array or scalar, an array of no real dtype
        (complex, string, object), or an int beyond every float's range.
    SchemeError
        An unknown ``propagation``.
    """


def add(x1: Any, x2: Any, /, *, propagation: str = "inhibit") -> Any:
    """``x1 + x2`` on the dequantized values (Burn ``add``/``add_scalar``).

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, -2.0]), "q8s:native")
    >>> np.round(aq.dequantize(qt), 4).tolist()
    [1.0079, -2.0]
    >>> np.round(add(qt, 1.0), 4).tolist()
    [2.0079, -1.0]
    >>> add(qt, 1.0, propagation="propagate").codes().tolist()
    [127, -63]
    """
    return _flow_binary(lambda xp, a, b: xp.add(a, b), x1, x2, propagation)


def subtract(x1: Any, x2: Any, /, *, propagation: str = "inhibit") -> Any:
    """``x1 - x2`` on the dequantized values (Burn ``sub``/``sub_scalar``)."""
    return _flow_binary(lambda xp, a, b: xp.subtract(a, b), x1, x2, propagation)


def multiply(x1: Any, x2: Any, /, *, propagation: str = "inhibit") -> Any:
    """``x1 * x2`` on the dequantized values (Burn ``mul``/``mul_scalar``)."""
    return _flow_binary(lambda xp, a, b: xp.multiply(a, b), x1, x2, propagation)


def divide(x1: Any, x2: Any, /, *, propagation: str = "inhibit") -> Any:
    """``x1 / x2`` on the dequantized values (Burn ``div``/``div_scalar``)."""
    return _flow_binary(lambda xp, a, b: xp.divide(a, b), x1, x2, propagation)


def pow(x1: Any, x2: Any, /, *, propagation: str = "inhibit") -> Any:
    """``x1 ** x2`` on the dequantized values (Burn ``powf``/``powf_scalar``)."""
    return _flow_binary(lambda xp, a, b: xp.pow(a, b), x1, x2, propagation)


_document((add, subtract, multiply, divide, pow), _FLOW_DOC)


def remainder(x1: Any, x2: Any, /) -> Any:
    """Float remainder with the sign of ``x2`` (Array API / Burn ``remainder``), always floats.

    Raises ShapeError, DeviceError or DTypeError as :func:`add`.
    """
    return _float_binary(lambda xp, a, b: xp.remainder(a, b), x1, x2)


# -- comparisons ----------------------------------------------------------------------------------
def equal(x1: Any, x2: Any, /) -> Any:
    """Elementwise ``x1 == x2`` on the dequantized values, a bool array.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, -2.0]), "q8s:native")
    >>> equal(qt, -2.0).tolist()
    [False, True]
    """
    return _float_binary(lambda xp, a, b: xp.equal(a, b), x1, x2)


def not_equal(x1: Any, x2: Any, /) -> Any:
    """Elementwise ``x1 != x2`` on the dequantized values, a bool array."""
    return _float_binary(lambda xp, a, b: xp.not_equal(a, b), x1, x2)


def greater(x1: Any, x2: Any, /) -> Any:
    """Elementwise ``x1 > x2`` on the dequantized values, a bool array."""
    return _float_binary(lambda xp, a, b: xp.greater(a, b), x1, x2)


def greater_equal(x1: Any, x2: Any, /) -> Any:
    """Elementwise ``x1 >= x2`` on the dequantized values, a bool array."""
    return _float_binary(lambda xp, a, b: xp.greater_equal(a, b), x1, x2)


def less(x1: Any, x2: Any, /) -> Any:
    """Elementwise ``x1 < x2`` on the dequantized values (Burn ``lower``), a bool array."""
    return _float_binary(lambda xp, a, b: xp.less(a, b), x1, x2)


def less_equal(x1: Any, x2: Any, /) -> Any:
    """Elementwise ``x1 <= x2`` on the dequantized values (Burn ``lower_equal``), a bool array."""
    return _float_binary(lambda xp, a, b: xp.less_equal(a, b), x1, x2)


def maximum(x1: Any, x2: Any, /) -> Any:
    """The larger of ``x1`` and ``x2`` elementwise on the dequantized values, as floats.

    Burn's ``max_pair`` is ``x1.mask_where(x1.lower(x2), x2)``, and ``mask_where`` dequantizes a
    quantized tensor and returns floats whatever the propagation; this follows that formula, so a
    NaN in ``x1`` is kept and a NaN in ``x2`` is not (unlike ``xp.maximum``).

    Raises ShapeError, DeviceError or DTypeError as :func:`add`.

    >>> import numpy as np, arrayquant as aq
    >>> a = aq.quantize(np.array([1.0, 4.0], np.float32), "q8s:native")
    >>> np.round(maximum(a, 2.0), 4).tolist()
    [2.0, 4.0]
    """
    return _float_binary(lambda xp, a, b: xp.where(xp.less(a, b), b, a), x1, x2)


def minimum(x1: Any, x2: Any, /) -> Any:
    """The smaller of ``x1`` and ``x2`` elementwise on the dequantized values, as floats.

    Burn's ``min_pair``, ``x1.mask_where(x2.lower(x1), x2)``: floats whatever the propagation, a NaN
    in ``x1`` kept and one in ``x2`` not. Raises ShapeError, DeviceError or DTypeError as :func:`add`.
    """
    return _float_binary(lambda xp, a, b: xp.where(xp.less(b, a), b, a), x1, x2)


# -- one operand, float result --------------------------------------------------------------------
def _float_unary(fn: Callable[[Any, Any], Any], x: Any) -> Any:
    f = floats(_require_quantized(x))
    return allocating(lambda: quietly(fn, f), f"the result for a tensor of shape {list(f.shape)}")


def exp(x: QuantizedTensor, /) -> Any:
    """``e**x`` of the dequantized values, a float array (Burn dequantizes first)."""
    return _float_unary(lambda xp, f: xp.exp(f), x)


def log(x: QuantizedTensor, /) -> Any:
    """Natural logarithm of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.log(f), x)


def log1p(x: QuantizedTensor, /) -> Any:
    """``log(1 + x)`` of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.log1p(f), x)


def sqrt(x: QuantizedTensor, /) -> Any:
    """Square root of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.sqrt(f), x)


def sin(x: QuantizedTensor, /) -> Any:
    """Sine of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.sin(f), x)


def cos(x: QuantizedTensor, /) -> Any:
    """Cosine of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.cos(f), x)


def tan(x: QuantizedTensor, /) -> Any:
    """Tangent of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.tan(f), x)


def sinh(x: QuantizedTensor, /) -> Any:
    """Hyperbolic sine of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.sinh(f), x)


def cosh(x: QuantizedTensor, /) -> Any:
    """Hyperbolic cosine of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.cosh(f), x)


def tanh(x: QuantizedTensor, /) -> Any:
    """Hyperbolic tangent of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.tanh(f), x)


def reciprocal(x: QuantizedTensor, /) -> Any:
    """``1 / x`` of the dequantized values (Burn ``recip``), a float array."""
    return _float_unary(lambda xp, f: xp.divide(xp.asarray(1, dtype=f.dtype, device=compat.device(f)), f), x)


def round(x: QuantizedTensor, /) -> Any:
    """The dequantized values rounded half to even (Array API), a float array."""
    return _float_unary(lambda xp, f: xp.round(f), x)


def floor(x: QuantizedTensor, /) -> Any:
    """Floor of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.floor(f), x)


def ceil(x: QuantizedTensor, /) -> Any:
    """Ceiling of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.ceil(f), x)


def sign(x: QuantizedTensor, /) -> Any:
    """Sign (-1, 0, 1) of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.sign(f), x)


def square(x: QuantizedTensor, /) -> Any:
    """``x * x`` of the dequantized values, a float array."""
    return _float_unary(lambda xp, f: xp.square(f), x)


# Abramowitz & Stegun, Handbook of Mathematical Functions (1964), formula 7.1.26: for x >= 0,
# erf(x) = 1 - (a1 t + a2 t^2 + a3 t^3 + a4 t^4 + a5 t^5) exp(-x^2), t = 1 / (1 + p x),
# with |error| <= 1.5e-7.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# why a series below 1: 7.1.26 is "1 - (nearly 1)" there, so its absolute error of ~1e-7 becomes a
# large relative error for small x, and f32 rounding of the product adds more; the Maclaurin
# series erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)) (A&S 7.1.5), cut after x^23, is
# accurate to f32 rounding (relative 1.8e-7) on |x| < 1. Measured against math.erf on 400k f32
# points in [-6, 6]: max absolute error 1.76e-7.
_SERIES = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(12))
_SERIES_CUT = 1.0


def _erf_array(f: Any) -> Any:
    xp = compat.array_namespace(f)
    device = compat.device(f)
    c = lambda v: xp.asarray(v, dtype=f.dtype, device=device)
    a = xp.abs(f)
    t = xp.divide(c(1.0), xp.add(c(1.0), xp.multiply(c(_AS_P), a)))
    poly = c(_AS_A[-1])
    for coef in reversed(_AS_A[:-1]):
        poly = xp.add(xp.multiply(poly, t), c(coef))
    poly = xp.multiply(poly, t)
    far = xp.subtract(c(1.0), xp.multiply(poly, xp.exp(xp.negative(xp.multiply(a, a)))))
    a2 = xp.multiply(a, a)
    series = c(_SERIES[-1])
    for coef in reversed(_SERIES[:-1]):
        series = xp.add(xp.multiply(series, a2), c(coef))
    near = xp.multiply(xp.multiply(series, a), c(2.0 / math.sqrt(math.pi)))
    mag = xp.where(xp.less(a, c(_SERIES_CUT)), near, far)
    # erf is odd; a NaN passes through both branches and keeps its NaN
    return xp.where(xp.less(f, c(0.0)), xp.negative(mag), mag)


def erf(x: QuantizedTensor, /) -> Any:
    """The error function of the dequantized values, a float array (Burn ``erf``).

    Not in the Array API: a portable approximation (Abramowitz & Stegun 7.1.5 below 1, 7.1.26
    above) within 2e-7 of the exact value in f32, and within 2e-7 relative below 1.

    >>> import math, numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([0.0, 1.0], dtype=np.float32), "q8s:native")
    >>> bool(np.max(np.abs(erf(qt) - np.array([0.0, math.erf(1.0)]))) < 2e-7)
    True
    """
    return quietly(lambda xp, f: _erf_array(f), floats(_require_quantized(x)))


# -- one operand, propagation ---------------------------------------------------------------------
def negative(x: QuantizedTensor, /, *, propagation: str = "inhibit") -> Any:
    """``-x`` (Burn ``neg``): floats, or requantized under ``propagation="propagate"``.

    Raises SchemeError for an unknown ``propagation``, DTypeError when ``x`` is not quantized.
    """
    mode = check_propagation(propagation)
    qt = _require_quantized(x)
    f = floats(qt)
    return _finish(compat.array_namespace(f).negative(f), qt, mode)


def clip(x: QuantizedTensor, /, min: Any = None, max: Any = None, *, propagation: str = "inhibit") -> Any:
    """The dequantized values clamped to ``[min, max]`` (Burn ``clamp``/``clamp_min``/``clamp_max``).

    Parameters
    ----------
    x : QuantizedTensor
    min, max : Python scalar, QuantizedTensor, array or None
        The bounds; None leaves that side open.
    propagation : {"inhibit", "propagate"}
        With scalar (or quantized) bounds: floats, or requantized with ``x``'s scheme. A float
        array bound gives floats (Burn's mixed rule).

    Returns
    -------
    array or QuantizedTensor

    Raises
    ------
    ShapeError, DeviceError, DTypeError, SchemeError
        As :func:`add`.
    """
    mode = check_propagation(propagation)
    qt = _require_quantized(x)
    bounds = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
    _operands(("x", *bounds), (qt, *bounds.values()))
    f, *rest = _float_args((qt, *bounds.values()), qt)
    xp = compat.array_namespace(f)
    lo = rest[0] if "min" in bounds else None
    hi = rest[-1] if "max" in bounds else None

    def run() -> Any:
        # maximum/minimum rather than xp.clip: clip's array bounds may not broadcast the result wider
        out = f
        with quiet(xp):
            if lo is not None:
                out = xp.maximum(out, lo)
            if hi is not None:
                out = xp.minimum(out, hi)
        return out

    out = allocating(run, _RESULT)
    mixed = builtins.any(not isinstance(v, (QuantizedTensor, *_SCALARS)) for v in bounds.values())
    return out if mixed else _finish(out, qt, mode)


# -- reductions -----------------------------------------------------------------------------------
def _reduce(name: str, x: QuantizedTensor, axis: Any, keepdims: bool, propagation: str) -> Any:
    mode = check_propagation(propagation)
    qt = _require_quantized(x)
    axes = _axes(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    xp = compat.array_namespace(f)
    kwargs: dict[str, Any] = {"axis": axes, "keepdims": keepdims}
    if name != "mean":
        kwargs["dtype"] = f.dtype  # why: default accumulation dtypes differ between libraries
    with quiet(xp):
        out = getattr(xp, name)(f, **kwargs)
    return _finish(out, qt, mode)


_REDUCE_DOC = """

    Parameters
    ----------
    x : QuantizedTensor
    axis : int, tuple of ints or None
        The axes to reduce; None reduces all.
    keepdims : bool
        Keep the reduced axes with extent 1.
    propagation : {"inhibit", "propagate"}
        ``"inhibit"`` returns the float array (0-d for a full reduction), ``"propagate"`` requantizes
        it with ``x``'s scheme (shape ``(1,)`` for a full reduction).

    Returns
    -------
    array or QuantizedTensor

    Raises
    ------
    ShapeError
        An axis that is no int (or tuple of ints), out of range or named twice.
    ParamsError
        ``keepdims`` neither True nor False.
    SchemeError
        An unknown ``propagation``.
    DTypeError
        ``x`` is not quantized.
    """


def sum(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False, propagation: str = "inhibit") -> Any:
    """Sum of the dequantized values (Burn ``sum``/``sum_dim``).

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([[1.0, -2.0], [4.0, 0.5]]), "q8s:native")
    >>> np.round(sum(qt, axis=1), 4).tolist()
    [-1.0079, 4.5039]
    """
    return _reduce("sum", x, axis, keepdims, propagation)


def prod(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False, propagation: str = "inhibit") -> Any:
    """Product of the dequantized values (Burn ``prod``/``prod_dim``)."""
    return _reduce("prod", x, axis, keepdims, propagation)


def mean(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False, propagation: str = "inhibit") -> Any:
    """Mean of the dequantized values (Burn ``mean``/``mean_dim``)."""
    return _reduce("mean", x, axis, keepdims, propagation)


_document((sum, prod, mean), _REDUCE_DOC)


def _scan_axis(qt: QuantizedTensor, axis: Any) -> int:
    if axis is None:
        if len(qt.shape) != 1:
            msg = f"axis is required for a {len(qt.shape)}-d tensor; pass axis=... (as Burn's dim)"
            raise ShapeError(msg)
        return 0
    return _one_axis(axis, len(qt.shape))


def _scan(name: str, x: QuantizedTensor, axis: Any, include_initial: bool, propagation: str) -> Any:
    mode = check_propagation(propagation)
    qt = _require_quantized(x)
    ax = _scan_axis(qt, axis)
    f = floats(qt)
    xp = compat.array_namespace(f)
    kwargs: dict[str, Any] = {"axis": ax, "dtype": f.dtype}
    if check_flag(include_initial, "include_initial"):
        kwargs["include_initial"] = True
    with quiet(xp):
        out = getattr(xp, name)(f, **kwargs)
    return _finish(out, qt, mode)


def _running(x: QuantizedTensor, axis: Any, propagation: str, pick: str) -> Any:
    mode = check_propagation(propagation)
    qt = _require_quantized(x)
    ax = _scan_axis(qt, axis)
    y = floats(qt)
    xp = compat.array_namespace(y)
    device = compat.device(y)
    n = qt.shape[ax]
    fill = -math.inf if pick == "maximum" else math.inf
    op = getattr(xp, pick)
    lead = (slice(None),) * ax
    # why a doubling scan: the Array API has no cumulative max/min; log2(n) shifted maxima use only
    # concat, slicing and maximum, so it stays lazy on dask and traceable on jax
    shift = 1
    while shift < n:
        pad_shape = tuple(shift if i == ax else s for i, s in enumerate(qt.shape))
        pad = xp.full(pad_shape, fill, dtype=y.dtype, device=device)
        head = (*lead, slice(0, n - shift), ...)
        shifted = xp.concat([pad, y[head]], axis=ax)
        y = op(y, shifted)
        shift *= 2
    return _finish(y, qt, mode)


_SCAN_DOC = """

    Parameters
    ----------
    x : QuantizedTensor
    axis : int, optional
        The axis to scan (Burn's ``dim``); may be omitted for 1-d data only.
    propagation : {"inhibit", "propagate"}
        Floats, or requantized with ``x``'s scheme.

    Returns
    -------
    array or QuantizedTensor
        Of ``x``'s shape.

    Raises
    ------
    ShapeError
        ``axis`` not an int, out of range, or missing for data of more than one axis.
    ParamsError
        ``include_initial`` neither True nor False.
    SchemeError
        An unknown ``propagation``.
    DTypeError
        ``x`` is not quantized.
    """


def cumulative_sum(
    x: QuantizedTensor, /, *, axis: int | None = None, include_initial: bool = False, propagation: str = "inhibit"
) -> Any:
    """Running sum of the dequantized values (Burn ``cumsum``); ``include_initial`` as in the Array API."""
    return _scan("cumulative_sum", x, axis, include_initial, propagation)


def cumulative_prod(
    x: QuantizedTensor, /, *, axis: int | None = None, include_initial: bool = False, propagation: str = "inhibit"
) -> Any:
    """Running product of the dequantized values (Burn ``cumprod``)."""
    return _scan("cumulative_prod", x, axis, include_initial, propagation)


def cumulative_max(x: QuantizedTensor, /, *, axis: int | None = None, propagation: str = "inhibit") -> Any:
    """Running maximum of the dequantized values (Burn ``cummax``; not in the Array API)."""
    return _running(x, axis, propagation, "maximum")


def cumulative_min(x: QuantizedTensor, /, *, axis: int | None = None, propagation: str = "inhibit") -> Any:
    """Running minimum of the dequantized values (Burn ``cummin``; not in the Array API)."""
    return _running(x, axis, propagation, "minimum")


_document((cumulative_sum, cumulative_prod, cumulative_max, cumulative_min), _SCAN_DOC)


# -- bool and int results -------------------------------------------------------------------------
def isnan(x: QuantizedTensor, /) -> Any:
    """Where the dequantized values are NaN (minifloat NaN codes), a bool array."""
    return _float_unary(lambda xp, f: xp.isnan(f), x)


def isinf(x: QuantizedTensor, /) -> Any:
    """Where the dequantized values are infinite, a bool array."""
    return _float_unary(lambda xp, f: xp.isinf(f), x)


def any(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether any dequantized value is non-zero, over ``axis`` (Burn ``any``/``any_dim``), bool.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt = _require_quantized(x)
    axes = _axes(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    return compat.array_namespace(f).any(f, axis=axes, keepdims=keepdims)


def all(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether every dequantized value is non-zero, over ``axis`` (Burn ``all``/``all_dim``), bool.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt = _require_quantized(x)
    axes = _axes(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    return compat.array_namespace(f).all(f, axis=axes, keepdims=keepdims)


def argmax(x: QuantizedTensor, /, *, axis: int | None = None, keepdims: bool = False) -> Any:
    """Index of the largest dequantized value (first on ties), an integer array.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt = _require_quantized(x)
    ax = None if axis is None else _one_axis(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    return compat.array_namespace(f).argmax(f, axis=ax, keepdims=keepdims)


def argmin(x: QuantizedTensor, /, *, axis: int | None = None, keepdims: bool = False) -> Any:
    """Index of the smallest dequantized value (first on ties), an integer array.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt = _require_quantized(x)
    ax = None if axis is None else _one_axis(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    return compat.array_namespace(f).argmin(f, axis=ax, keepdims=keepdims)


def argsort(x: QuantizedTensor, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Any:
    """Indices that sort the dequantized values along ``axis``, an integer array.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt = _require_quantized(x)
    ax = _one_axis(axis, len(qt.shape))
    descending, stable = check_flag(descending, "descending"), check_flag(stable, "stable")
    f = floats(qt)
    return compat.array_namespace(f).argsort(f, axis=ax, descending=descending, stable=stable)


# -- masks ----------------------------------------------------------------------------------------
def _check_mask(mask: Any, name: str) -> None:
    if isinstance(mask, QuantizedTensor) or not compat.is_array_api_obj(mask):
        msg = f"{name} must be a bool array, got {type(mask).__name__}"
        raise DTypeError(msg)
    xp = compat.array_namespace(mask)
    if not xp.isdtype(mask.dtype, "bool"):
        msg = f"{name} must be a bool array, got dtype {mask.dtype}; build it with a comparison such as x > 0"
        raise DTypeError(msg)


def where(condition: Any, x1: Any, x2: Any, /) -> Any:
    """``x1`` where ``condition`` holds, else ``x2``, as floats (Burn ``mask_where``).

    Burn's ``t.mask_where(mask, value)`` is ``where(mask, value, t)``.

    Parameters
    ----------
    condition : bool array
    x1, x2 : QuantizedTensor, array or Python scalar
        At least one quantized; all three broadcast together.

    Returns
    -------
    array

    Raises
    ------
    DTypeError
        ``condition`` not a bool array, or no quantized operand.
    ShapeError
        Operands that do not broadcast.
    DeviceError
        Operands in different namespaces or on different devices.
    """
    _check_mask(condition, "condition")
    quantized = _operands(("condition", "x1", "x2"), (condition, x1, x2))
    a, b = _float_args((x1, x2), quantized[0])
    return allocating(lambda: compat.array_namespace(a).where(condition, a, b), _RESULT)


def mask_fill(x: QuantizedTensor, mask: Any, value: Any, /) -> Any:
    """``x``'s dequantized values with ``value`` where ``mask`` holds, as floats (Burn ``mask_fill``).

    Raises DTypeError for a mask that is not bool or a non-scalar ``value``, ShapeError for a mask
    that does not broadcast to ``x``, DeviceError for a mask elsewhere.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, -2.0]), "q8s:native")
    >>> np.round(mask_fill(qt, np.array([False, True]), 0.0), 4).tolist()
    [1.0079, 0.0]
    """
    qt = _require_quantized(x)
    _check_mask(mask, "mask")
    if not isinstance(value, _SCALARS):
        msg = f"value must be a Python scalar, got {type(value).__name__}"
        raise DTypeError(msg)
    _operands(("x", "mask"), (qt, mask))
    if _broadcast(("x", "mask"), qt, mask) != tuple(qt.shape):
        msg = f"mask {list(mask.shape)} must broadcast to x's shape {list(qt.shape)} without growing it"
        raise ShapeError(msg)
    f, v = _float_args((qt, value), qt)
    return compat.array_namespace(f).where(mask, v, f)


# -- indexed updates and selections ---------------------------------------------------------------
def _update_values(values: Any, qt: QuantizedTensor, name: str = "values") -> Any:
    """``values`` as floats of ``qt``'s dtype: a quantized tensor dequantized, a real array cast."""
    if isinstance(values, QuantizedTensor):
        same_place(x=qt, **{name: values})
        v = floats(values)
    elif compat.is_array_api_obj(values):
        same_place(x=qt, **{name: values})
        v = values
    else:
        msg = f"{name} must be a QuantizedTensor or an Array API array, got {type(values).__name__}"
        raise DTypeError(msg)
    xp = compat.array_namespace(v)
    if not xp.isdtype(v.dtype, ("real floating", "integral")):
        msg = f"{name} must hold real numbers, got dtype {v.dtype}"
        raise DTypeError(msg)
    ref = floats(qt)
    return xp.astype(v, ref.dtype) if v.dtype != ref.dtype else v


def _one_hot_sum(xp: Any, v: Any, idx: Any, n: int) -> Any:
    """``out[..., j] = sum of v[..., k] where idx[..., k] == j``, shape ``(..., n)``.

    why a comparison sum: the Array API has no scatter and no in-place writes on lazy or traced
    arrays; the one-hot mask costs ``k * n`` per line, fine for the moderate sizes this serves.
    """
    device = compat.device(v)
    hit = xp.equal(xp.expand_dims(idx, axis=-1), xp.arange(n, dtype=idx.dtype, device=device))
    zero = xp.asarray(0, dtype=v.dtype, device=device)
    return xp.sum(xp.where(hit, xp.expand_dims(v, axis=-1), zero), axis=-2, dtype=v.dtype)


def _one_hot_add(xp: Any, f: Any, v: Any, ax: int, idx: Any, what: str) -> Any:
    """``f`` plus the one-hot sums of ``v`` at ``idx`` (its axis already last) along ``ax``, the mask checked first."""
    n = int(f.shape[ax])
    mask = (*tuple(v.shape), n)  # every value compared with every position on the axis
    check_elements(mask, f"{what}'s one-hot comparison", "add fewer values at a time")

    def run() -> Any:
        with quiet(xp):
            added = _one_hot_sum(xp, xp.moveaxis(v, ax, -1), idx, n)
            return xp.add(f, xp.moveaxis(added, -1, ax))

    return allocating(run, f"{what}'s one-hot comparison {list(mask)}")


def scatter_add(x: QuantizedTensor, indices: Any, values: Any, /, *, axis: int) -> Any:
    """``x``'s dequantized values with ``values`` added at ``indices`` along ``axis``, as floats.

    Burn's ``scatter(dim, indices, values, IndexingUpdateOp::Add)`` (``torch.Tensor.scatter_add``):
    ``out[..., indices[..., k, ...], ...] += values[..., k, ...]`` with ``k`` on ``axis``; repeated
    indices accumulate. Burn dequantizes first and returns floats.

    Parameters
    ----------
    x : QuantizedTensor
    indices : integer array
        ``x``'s rank and shape except on ``axis``, values in ``[-n, n)`` (``n = x.shape[axis]``).
        On a lazy or traced array the range cannot be checked; an index out of range adds nothing.
    values : QuantizedTensor or array
        Of ``indices``' shape.
    axis : int
        The axis the indices point along (Burn's ``dim``).

    Returns
    -------
    array
        Floats of ``x``'s shape and dtype.

    Raises
    ------
    ShapeError
        An axis out of range, shapes that do not fit, or indices out of range.
    DTypeError
        ``x`` not quantized, non-integer indices, or values that are no array of real numbers.
    DeviceError
        Operands in different namespaces or on different devices.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.zeros(3, np.float32), "q8s:native")
    >>> scatter_add(qt, np.array([1, 0, 1]), np.array([5.0, 4.0, 3.0], np.float32), axis=0).tolist()
    [4.0, 8.0, 0.0]
    """
    qt = _require_quantized(x)
    shape = tuple(qt.shape)
    ax = _one_axis(axis, len(shape))
    v = _update_values(values, qt)
    idx = positions(qt, indices, shape[ax], "scatter_add")
    if tuple(idx.shape) != tuple(v.shape):
        msg = f"scatter_add indices {list(idx.shape)} and values {list(v.shape)} must have the same shape"
        raise ShapeError(msg)
    if len(idx.shape) != len(shape) or builtins.any(idx.shape[i] != shape[i] for i in range(len(shape)) if i != ax):
        msg = (
            f"scatter_add indices {list(idx.shape)} must have x's shape {list(shape)} on every axis but "
            f"axis {ax} (as Burn's scatter)"
        )
        raise ShapeError(msg)
    f = floats(qt)
    xp = compat.array_namespace(f)
    return _one_hot_add(xp, f, v, ax, xp.moveaxis(idx, ax, -1), "scatter_add")


def index_add(x: QuantizedTensor, indices: Any, values: Any, /, *, axis: int) -> Any:
    """``x``'s dequantized values with slice ``k`` of ``values`` added at ``indices[k]`` along ``axis``.

    Burn's ``select_assign(dim, indices, values, IndexingUpdateOp::Add)`` (``torch.Tensor.index_add``);
    repeated indices accumulate. Burn dequantizes first ("select assign is ambiguous for QFloat")
    and returns floats.

    Parameters
    ----------
    x : QuantizedTensor
    indices : integer array
        1-d, values in ``[-n, n)`` (``n = x.shape[axis]``); on a lazy or traced array the range
        cannot be checked and an index out of range adds nothing.
    values : QuantizedTensor or array
        ``x``'s shape with ``len(indices)`` on ``axis``.
    axis : int
        The axis the indices point along (Burn's ``dim``).

    Returns
    -------
    array
        Floats of ``x``'s shape and dtype.

    Raises
    ------
    ShapeError
        An axis out of range, indices not 1-d or out of range, values of another shape.
    DTypeError
        ``x`` not quantized, non-integer indices, or values that are no array of real numbers.
    DeviceError
        Operands in different namespaces or on different devices.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.zeros(3, np.float32), "q8s:native")
    >>> index_add(qt, np.array([1, 1, 0]), np.array([5.0, 4.0, 3.0], np.float32), axis=0).tolist()
    [3.0, 9.0, 0.0]
    """
    qt = _require_quantized(x)
    shape = tuple(qt.shape)
    ax = _one_axis(axis, len(shape))
    v = _update_values(values, qt)
    idx = positions(qt, indices, shape[ax], "index_add")
    if len(idx.shape) != 1:
        msg = f"index_add indices must be 1-d, got shape {list(idx.shape)}"
        raise ShapeError(msg)
    want = tuple(int(idx.shape[0]) if i == ax else n for i, n in enumerate(shape))
    if tuple(v.shape) != want:
        msg = (
            f"index_add values must have shape {list(want)} (x's shape with the number of indices on "
            f"axis {ax}), got {list(v.shape)}"
        )
        raise ShapeError(msg)
    f = floats(qt)
    xp = compat.array_namespace(f)
    return _one_hot_add(xp, f, v, ax, idx, "index_add")


def _basic_index(k: Any, key: Any) -> Any:
    """One entry of a basic key with Python ints throughout (NumPy ints read as layout's ``getitem`` does)."""
    if k is Ellipsis:
        return k
    if isinstance(k, slice):
        raw = (k.start, k.stop, k.step)
        parts = [None if p is None else as_int(p) for p in raw]
        if builtins.any(p is None and r is not None for p, r in zip(parts, raw, strict=True)):
            msg = f"slice_assign slice {k!r} in {key!r} needs integer (or None) start, stop and step"
            raise ShapeError(msg)
        return slice(*parts)
    i = as_int(k)
    if i is None:
        msg = f"slice_assign takes basic indices (ints, slices, Ellipsis), got {k!r} in {key!r}"
        raise ShapeError(msg)
    return i


def _assign_positions(key: Any, shape: tuple[int, ...]) -> tuple[list[list[int]], list[int]]:
    """Per axis the positions ``key`` selects (in selection order) and the axes an int drops."""
    items = tuple(_basic_index(k, key) for k in (key if isinstance(key, tuple) else (key,)))
    if builtins.sum(1 for k in items if k is Ellipsis) > 1:
        msg = f"slice_assign key {key!r} has more than one Ellipsis"
        raise ShapeError(msg)
    named = len(items) - (1 if Ellipsis in items else 0)
    if named > len(shape):
        msg = f"slice_assign key {key!r} indexes {named} axes, but x has only {len(shape)}"
        raise ShapeError(msg)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = (*items[:at], *(slice(None),) * (len(shape) - named), *items[at + 1 :])
    items = (*items, *(slice(None),) * (len(shape) - len(items)))
    positions: list[list[int]] = []
    dropped: list[int] = []
    for a, (k, n) in enumerate(zip(items, shape, strict=True)):
        if isinstance(k, slice):
            if k.step == 0:
                msg = f"slice_assign slice {k!r} on axis {a} has step 0; use a non-zero step"
                raise ShapeError(msg)
            positions.append(list(range(n))[k])
        else:
            if not -n <= k < n:
                msg = f"slice_assign index {k} is out of range for axis {a} of length {n}"
                raise ShapeError(msg)
            positions.append([k % n])
            dropped.append(a)
    return positions, dropped


def slice_assign(x: QuantizedTensor, key: Any, values: Any, /) -> Any:
    """``x``'s dequantized values with the region ``x[key]`` replaced by ``values``, as floats.

    Burn's ``slice_assign`` (Burn dequantizes first and returns floats). The region is built from
    masks and ``take`` on index grids, without in-place writes, so it stays lazy on Dask and
    traceable on JAX.

    Parameters
    ----------
    x : QuantizedTensor
    key : int, slice, Ellipsis or a tuple of them
        Basic indexing as in ``x[key]`` (any step; slices clamp to each axis as Python's do).
    values : QuantizedTensor or array
        Exactly the region's shape (``x[key]``'s shape), as Burn requires.

    Returns
    -------
    array
        Floats of ``x``'s shape and dtype; ``x``'s values when the region is empty.

    Raises
    ------
    ShapeError
        An index that is not basic, out of range, a step of 0, too many indices, or values of
        another shape than the region.
    DTypeError
        ``x`` not quantized, or values that are no array of real numbers.
    DeviceError
        ``values`` in another namespace or on another device.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.zeros((2, 3), np.float32), "q8s:native")
    >>> slice_assign(qt, (1, slice(0, 2)), np.array([10.0, 5.0], np.float32)).tolist()
    [[0.0, 0.0, 0.0], [10.0, 5.0, 0.0]]
    """
    qt = _require_quantized(x)
    shape = tuple(qt.shape)
    positions, dropped = _assign_positions(key, shape)
    region = tuple(len(p) for a, p in enumerate(positions) if a not in dropped)
    v = _update_values(values, qt)
    if tuple(v.shape) != region:
        msg = f"slice_assign values must have the region's shape {list(region)} (x[{key!r}]), got {list(v.shape)}"
        raise ShapeError(msg)
    f = floats(qt)
    xp = compat.array_namespace(f)
    device = compat.device(f)
    if builtins.any(len(p) == 0 for p in positions):
        return f  # an empty region assigns nothing (Burn returns the tensor unchanged)
    for a in dropped:  # ascending, so each int axis comes back at its own position
        v = xp.expand_dims(v, axis=a)
    mask = None
    for a, (sel, n) in enumerate(zip(positions, shape, strict=True)):
        if sel == list(range(n)):
            continue  # the whole axis, in order: nothing to move or mask
        where_in = dict(zip(sel, range(len(sel)), strict=True))  # a repeated position is impossible
        take = xp.asarray([where_in.get(i, 0) for i in range(n)], device=device)
        v = xp.take(v, take, axis=a)
        hit = xp.asarray([i in where_in for i in range(n)], device=device)
        hit = xp.reshape(hit, tuple(n if i == a else 1 for i in range(len(shape))))
        mask = hit if mask is None else xp.logical_and(mask, hit)
    if mask is None:
        return v  # the region is all of x
    return xp.where(mask, v, f)


def mask_select(x: QuantizedTensor, mask: Any, /) -> QuantizedTensor:
    """The elements of ``x`` where ``mask`` holds, row-major, as a 1-d quantized tensor.

    Burn's ``mask_select``, which keeps the data quantized (``argwhere`` + ``q_select``). One scale
    per tensor: the selected codes keep ``x``'s scale (exact, nothing dequantized). A block scheme:
    the selected values are quantized again with ``x``'s scheme as 1-d data (MinMax scales), which
    needs a block of one extent.

    Parameters
    ----------
    x : QuantizedTensor
    mask : bool array
        Of ``x``'s shape.

    Returns
    -------
    QuantizedTensor
        Shape ``(count,)``.

    Raises
    ------
    ShapeError
        A mask of another shape; a mask that selects nothing (Burn returns an empty tensor, but a
        QuantizedTensor has at least one element).
    DTypeError
        ``x`` not quantized, or a mask that is not a bool array.
    DeviceError
        ``mask`` in another namespace or on another device.
    BackendUnavailableError
        A Dask tensor: the result's length depends on the mask's values, which has no lazy form.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([[1.0, 7.0], [2.0, 3.0]], np.float32), "q8s:native")
    >>> mask_select(qt, np.array([[True, False], [False, True]])).codes().tolist()
    [18, 54]
    """
    qt = _require_quantized(x)
    _check_mask(mask, "mask")
    same_place(x=qt, mask=mask)
    if tuple(mask.shape) != tuple(qt.shape):
        msg = f"mask_select mask {list(mask.shape)} must have x's shape {list(qt.shape)}"
        raise ShapeError(msg)
    xp = compat.array_namespace(qt.values)
    if compat.is_dask_namespace(xp):
        msg = (
            "mask_select has no lazy form on Dask (the result's length depends on the mask's values); "
            "compute the tensor and mask first (qt.to_backend('numpy'))"
        )
        raise BackendUnavailableError(msg)
    n = math.prod(qt.shape)
    (idx,) = xp.nonzero(xp.reshape(mask, (n,)))
    if int(idx.shape[0]) == 0:
        msg = (
            "mask_select: the mask selects no element, and a QuantizedTensor has at least one "
            "(Burn returns an empty tensor here); check xp.any(mask) first"
        )
        raise ShapeError(msg)
    if _per_tensor(qt):
        # Burn's route, exact here: a row-major reshape and a take keep the codes and the scale
        return layout.take(layout.reshape(qt, (n,)), idx, axis=0)
    # blocks: the 1-d selection quantized again, the scheme fitted to one axis (its last extent)
    return requantize(xp.take(xp.reshape(floats(qt), (n,)), idx, axis=0), qt)


# -- always quantized -----------------------------------------------------------------------------
def abs(x: QuantizedTensor, /) -> QuantizedTensor:
    """``|x|``, always requantized with ``x``'s scheme (Burn's ``q_abs``), MinMax scales.

    Raises DTypeError when ``x`` is not quantized.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, -2.0]), "q8s:native")
    >>> np.round(aq.dequantize(abs(qt)), 4).tolist()
    [1.0079, 2.0]
    """
    qt = _require_quantized(x)
    f = floats(qt)
    # why requantize even per tensor: the codes' |.| keeps the old scale, while Burn's result
    # has MinMax scales of |x|; they differ whenever the old scale was not |x|'s own
    return requantize(compat.array_namespace(f).abs(f), qt)


def _gather(xp: Any, a: Any, idx: Any, axis: int) -> Any:
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


def _with_codes(qt: QuantizedTensor, codes: Any) -> QuantizedTensor:
    """``qt``'s scale (per tensor: one scale for any shape) over other codes."""
    return replace(qt, shape=tuple(int(n) for n in codes.shape), values=pack(codes, qt.scheme))


def _extreme(x: QuantizedTensor, axis: Any, keepdims: bool, largest: bool) -> QuantizedTensor:
    qt = _require_quantized(x)
    shape = tuple(qt.shape)
    axes = _axes(axis, len(shape))
    keepdims = check_flag(keepdims, "keepdims")
    reduced = tuple(range(len(shape))) if axes is None else tuple(sorted(axes))
    kept = tuple(i for i in range(len(shape)) if i not in reduced)
    if keepdims:
        out_shape = tuple(1 if i in reduced else n for i, n in enumerate(shape))
    else:
        out_shape = tuple(shape[i] for i in kept) or (1,)
    f = floats(qt)
    xp = compat.array_namespace(f)
    if not _per_tensor(qt):
        y = (xp.max if largest else xp.min)(f, axis=reduced, keepdims=keepdims)
        return requantize(xp.reshape(y, out_shape), qt)
    # per tensor: find the winner on the floats, then take its code (the scale stays the same)
    flat = (*(shape[i] for i in kept), math.prod(shape[i] for i in reduced))
    perm = (*kept, *reduced)
    f2 = xp.reshape(xp.permute_dims(f, perm), flat)
    c2 = xp.reshape(xp.permute_dims(qt.codes(), perm), flat)
    idx = (xp.argmax if largest else xp.argmin)(f2, axis=-1, keepdims=True)
    return _with_codes(qt, xp.reshape(_gather(xp, c2, idx, -1), out_shape))


_EXTREME_DOC = """

    Always quantized, as Burn's. Per tensor the result holds the selected codes and the input's
    scale (exact); a block scheme requantizes the selected values with the input's scheme.

    Parameters
    ----------
    x : QuantizedTensor
    axis : int, tuple of ints or None
        The axes to reduce; None reduces all (result shape ``(1,)`` unless ``keepdims``).
    keepdims : bool
        Keep the reduced axes with extent 1.

    Returns
    -------
    QuantizedTensor

    Raises
    ------
    ShapeError
        An axis that is no int (or tuple of ints), out of range or named twice, or a result a block
        scheme cannot hold.
    ParamsError
        ``keepdims`` neither True nor False.
    DTypeError
        ``x`` is not quantized.
    """


def max(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> QuantizedTensor:
    """Largest dequantized value over ``axis`` (Burn ``max``/``max_dim``).

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([[1.0, -2.0], [4.0, 0.5]], dtype=np.float32), "q8s:native")
    >>> max(qt, axis=1).codes().tolist()
    [32, 127]
    """
    return _extreme(x, axis, keepdims, largest=True)


def min(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> QuantizedTensor:
    """Smallest dequantized value over ``axis`` (Burn ``min``/``min_dim``)."""
    return _extreme(x, axis, keepdims, largest=False)


_document((max, min), _EXTREME_DOC)


def sort(x: QuantizedTensor, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> QuantizedTensor:
    """The values sorted along ``axis``, always quantized (Burn ``sort``/``sort_descending``).

    Per tensor the codes are reordered (exact, same scale); block schemes requantize the sorted
    values with ``x``'s scheme.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt = _require_quantized(x)
    ax = _one_axis(axis, len(qt.shape))
    descending, stable = check_flag(descending, "descending"), check_flag(stable, "stable")
    f = floats(qt)
    xp = compat.array_namespace(f)
    if not _per_tensor(qt):
        return requantize(xp.sort(f, axis=ax, descending=descending, stable=stable), qt)
    idx = xp.argsort(f, axis=ax, descending=descending, stable=stable)
    return _with_codes(qt, _gather(xp, qt.codes(), idx, ax))


def topk(x: QuantizedTensor, k: int, /, *, axis: int = -1, largest: bool = True) -> QuantizedTensor:
    """The ``k`` largest (or smallest) values along ``axis``, in that order, always quantized.

    Burn's ``topk`` (largest first); per tensor the selected codes keep ``x``'s scale (exact),
    block schemes requantize the selected values.

    Parameters
    ----------
    x : QuantizedTensor
    k : int
        How many values, ``1 <= k <= x.shape[axis]``.
    axis : int
        The axis to select along.
    largest : bool
        True: the largest, descending; False: the smallest, ascending.

    Returns
    -------
    QuantizedTensor
        ``x``'s shape with ``k`` on ``axis``.

    Raises
    ------
    ShapeError
        ``axis`` not an int or out of range, ``k`` not an int or outside ``1..x.shape[axis]``.
    ParamsError
        ``largest`` neither True nor False.
    DTypeError
        ``x`` is not quantized.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, -2.0, 4.0]), "q8s:native")
    >>> np.round(aq.dequantize(topk(qt, 2)), 4).tolist()
    [4.0, 1.0079]
    """
    qt = _require_quantized(x)
    ax = _one_axis(axis, len(qt.shape))
    largest = check_flag(largest, "largest")
    n = qt.shape[ax]
    count = as_int(k)  # NumPy ints count, as layout's counts do; a bool does not
    if count is None or not 1 <= count <= n:
        msg = f"k must be an int in 1..{n} (the extent of axis {ax}), got {k!r}"
        raise ShapeError(msg)
    k = count
    f = floats(qt)
    xp = compat.array_namespace(f)
    first = (*(slice(None),) * ax, slice(0, k), ...)
    idx = xp.argsort(f, axis=ax, descending=largest, stable=True)[first]
    if not _per_tensor(qt):
        return requantize(_gather(xp, f, idx, ax), qt)
    return _with_codes(qt, _gather(xp, qt.codes(), idx, ax))
