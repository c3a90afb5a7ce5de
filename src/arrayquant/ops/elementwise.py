"""Element-wise functions on quantized tensors: arithmetic, comparisons and math (the Array API's category).

Every function computes on the dequantized values in the input's own namespace and device, then
returns what Burn's user-facing ``Tensor`` API returns for a quantized input:

- **propagation** (``propagation="inhibit"``, Burn's default, returns the float array;
  ``"propagate"`` quantizes it again with the input's scheme, the first quantized operand's for two
  operands, scales found afresh by MinMax): :func:`add`, :func:`subtract`, :func:`multiply`,
  :func:`divide`, :func:`pow` (quantized with quantized, or quantized with a Python scalar; a
  quantized operand with a float *array* always gives floats, Burn's mixed rule), :func:`negative`
  and :func:`clip`.
- **always float** (Burn dequantizes first): :func:`remainder`, the unary math functions
  (:func:`exp` ... :func:`erf`, :func:`reciprocal`, :func:`round`, :func:`floor`, :func:`ceil`,
  :func:`sign`, :func:`square`), :func:`maximum` and :func:`minimum` (Burn's
  ``max_pair``/``min_pair`` go through ``mask_where``).
- **bool**: the comparisons, :func:`isnan`, :func:`isinf`.
- **always quantized**: :func:`abs`, requantized with the input's scheme (Burn's ``q_abs``).
- Float math is silent about NumPy's floating-point warnings (``log(0)`` is ``-inf``, as in Burn).
- Operands are checked before anything is computed: array operands hold real numbers. A result
  past the element limit, or one memory cannot hold (an operand that is a huge zero-stride view),
  is a :class:`~arrayquant.ShapeError`.

The other operations that go through floats follow the same rules, one module per Array API
category: ``statistical`` (reductions and scans), ``searching``, ``sorting``, ``utility`` and
``updates`` (Burn's indexed updates and ``mask_fill``).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any

import array_api_compat as compat

from ..backends.shim import quiet, quietly
from ..tensor import QuantizedTensor
from ._common import (
    BROADCAST_RESULT,
    SCALARS,
    allocating,
    check_operands,
    check_propagation,
    document,
    finish,
    float_args,
    floats,
    requantize,
    require_quantized,
)

__all__ = [
    "abs",
    "add",
    "ceil",
    "clip",
    "cos",
    "cosh",
    "divide",
    "equal",
    "erf",
    "exp",
    "floor",
    "greater",
    "greater_equal",
    "isinf",
    "isnan",
    "less",
    "less_equal",
    "log",
    "log1p",
    "maximum",
    "minimum",
    "multiply",
    "negative",
    "not_equal",
    "pow",
    "reciprocal",
    "remainder",
    "round",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "square",
    "subtract",
    "tan",
    "tanh",
]


# -- two operands ---------------------------------------------------------------------------------
def _flow_binary(fn: Callable[[Any, Any, Any], Any], x1: Any, x2: Any, propagation: str) -> Any:
    mode = check_propagation(propagation)
    names = ("x1", "x2")
    quantized = check_operands(names, (x1, x2))
    a, b = float_args((x1, x2), quantized[0])
    out = allocating(lambda: quietly(fn, a, b), BROADCAST_RESULT)
    # why: Burn dequantizes a quantized operand met with a float tensor and returns floats
    mixed = builtins.any(not isinstance(v, (QuantizedTensor, *SCALARS)) for v in (x1, x2))
    return out if mixed else finish(out, quantized[0], mode)


def _float_binary(fn: Callable[[Any, Any, Any], Any], x1: Any, x2: Any) -> Any:
    quantized = check_operands(("x1", "x2"), (x1, x2))
    a, b = float_args((x1, x2), quantized[0])
    return allocating(lambda: quietly(fn, a, b), BROADCAST_RESULT)


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


document((add, subtract, multiply, divide, pow), _FLOW_DOC)


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
    f = floats(require_quantized(x))
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
    return quietly(lambda xp, f: _erf_array(f), floats(require_quantized(x)))


# -- one operand, propagation ---------------------------------------------------------------------
def negative(x: QuantizedTensor, /, *, propagation: str = "inhibit") -> Any:
    """``-x`` (Burn ``neg``): floats, or requantized under ``propagation="propagate"``.

    Raises SchemeError for an unknown ``propagation``, DTypeError when ``x`` is not quantized.
    """
    mode = check_propagation(propagation)
    qt = require_quantized(x)
    f = floats(qt)
    return finish(compat.array_namespace(f).negative(f), qt, mode)


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
    qt = require_quantized(x)
    bounds = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
    check_operands(("x", *bounds), (qt, *bounds.values()))
    f, *rest = float_args((qt, *bounds.values()), qt)
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

    out = allocating(run, BROADCAST_RESULT)
    mixed = builtins.any(not isinstance(v, (QuantizedTensor, *SCALARS)) for v in bounds.values())
    return out if mixed else finish(out, qt, mode)


# -- bool results ----------------------------------------------------------------------------------
def isnan(x: QuantizedTensor, /) -> Any:
    """Where the dequantized values are NaN (minifloat NaN codes), a bool array."""
    return _float_unary(lambda xp, f: xp.isnan(f), x)


def isinf(x: QuantizedTensor, /) -> Any:
    """Where the dequantized values are infinite, a bool array."""
    return _float_unary(lambda xp, f: xp.isinf(f), x)


# -- always quantized -----------------------------------------------------------------------------
def abs(x: QuantizedTensor, /) -> QuantizedTensor:
    """``|x|``, always requantized with ``x``'s scheme (Burn's ``q_abs``), MinMax scales.

    Raises DTypeError when ``x`` is not quantized.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, -2.0]), "q8s:native")
    >>> np.round(aq.dequantize(abs(qt)), 4).tolist()
    [1.0079, 2.0]
    """
    qt = require_quantized(x)
    f = floats(qt)
    # why requantize even per tensor: the codes' |.| keeps the old scale, while Burn's result
    # has MinMax scales of |x|; they differ whenever the old scale was not |x|'s own
    return requantize(compat.array_namespace(f).abs(f), qt)
