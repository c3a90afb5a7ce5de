"""Matrix products with quantized operands: the float reference, exact integer sums, ternary adds.

``matmul(a, b)`` takes a :class:`~arrayquant.QuantizedTensor` or a float array on either side, with
the Array API's ``matmul`` semantics (a 1-d operand is a row or a column vector, leading axes
broadcast). Three ways to compute it:

* ``"reference"`` — what Burn's default ``q_matmul`` does: dequantize the quantized side(s) (into the
  float side's dtype, if there is one) and multiply the floats with the namespace's ``matmul``.
  Traceable under ``jax.jit`` and ``torch.compile``; lazy on Dask.
* ``"int8"`` — both sides quantized with integer codes (Q8S/Q8F/Q4S/Q4F/Q2S/Q2F, symmetric, one
  level) whose scale does not change along the contracted axis: ``a`` per tensor or one scale per
  row (blocks spanning all of K), ``b`` per tensor or one scale per column. The code products are
  summed exactly in integers, then scaled once: ``out = (f32(sum) * row_scale) * col_scale``. An
  arrayquant extension (Burn has no integer matmul); it differs from the reference only by f32
  rounding, and is closer to the exact product than the reference is.
* ``"ternary"`` — burn-ndarray's multiplication-free path: ``a`` a float32 array, ``b`` a Q2S per-tensor
  ``(K, N)`` weight whose codes are -1, 0 or 1; each output adds or subtracts the activations in
  ``k`` order from +0.0, then is multiplied once by the scale ``gamma``. Like Burn's, it returns floats even
  under ``propagation="propagate"``.

* ``"fused"`` — a float32 NumPy array times a 2-d weight ``w`` ``(N, K)`` in its stored layout,
  written ``x @ w.T`` (``w.T`` is free: a view of ``w``) or ``w @ x``: Numba kernels read ``w``'s codes
  and scales once, never building the float weight (:mod:`arrayquant.fused.numba_matmul`). Products
  and sums in f32; the result differs from the reference by f32 rounding only (the sums' order).
  Integer codes of 1 to 8 bits (symmetric, zero point or offset), E2M1 (NVFP4, MXFP4), E4M3 and E5M2
  (MXFP8), per tensor, per row or per block of a multiple of 16 along K.
* ``"fused_int8"`` — the same kernels with the activations quantized on the fly: int8 per run of K
  sharing one weight scale (at most 256), absmax scale, integer sums (as llama.cpp and onnxruntime's
  accuracy level 4). Faster where integer multiplies are; its error is the activations' rounding.

``path="auto"`` takes ternary where it applies, else int8, else fused for up to 32 rows of
activations, else the reference; :func:`matmul_path` says which. Under ``propagation="propagate"``
the float result (every path but ternary) is quantized again with the scheme of ``b`` when ``b``
is quantized, else ``a``'s, with fresh MinMax scales (Burn's rule: the last quantized operand's
scheme).
"""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from ..backends import shim
from ..backends.shim import quiet
from ..dequantize import dequantize
from ..errors import DTypeError, ParamsError, SchemeError, ShapeError
from ..invariants import is_real_float, plan_for
from ..scheme import QuantMode, QuantValue
from ..tensor import QuantizedTensor, stored_transpose
from ._common import allocating, check_elements, check_propagation, requantize, same_place

__all__ = ["PATHS", "matmul", "matmul_path"]

PATHS = ("auto", "reference", "int8", "ternary", "fused", "fused_int8")
# auto takes the fused kernels up to this many rows of activations; past it BLAS on the float weight wins
FUSED_ROWS = 32

# an f32 holds every integer up to 2^24 exactly, an int32 every integer below 2^31
_F32_EXACT = 1 << 24
_ROW_PATHS = ("auto", "fused", "fused_int8")  # the paths a product may take straight to the row kernels
_RUNNING: list[Any] = []  # the fused CPU module once a product ran there (no import on the quick path)
_INT32_LIMIT = (1 << 31) - 1


def matmul(a: Any, b: Any, *, propagation: str = "inhibit", path: str = "auto") -> Any:
    """``a @ b`` where either side (or both) is a quantized tensor.

    Parameters
    ----------
    a, b : QuantizedTensor or array
        Operands of one namespace and device; an array operand must have a real floating dtype.
        Shapes follow the Array API's ``matmul``: ``(..., M, K) @ (..., K, N)``, a 1-d operand is
        a vector (its axis is dropped from the result), leading axes broadcast.
    propagation : {"inhibit", "propagate"}
        ``"inhibit"`` (Burn's default) returns the float result; ``"propagate"`` quantizes it with
        ``b``'s scheme when ``b`` is quantized, else ``a``'s (MinMax scales). The ternary path always
        returns floats, as Burn's does.
    path : {"auto", "reference", "int8", "ternary", "fused", "fused_int8"}
        How to compute it (see the module docstring); ``"auto"`` picks :func:`~arrayquant.ops.matmul_path`'s answer.

    Returns
    -------
    array or QuantizedTensor
        The product in the namespace and on the device of the operands; its dtype is the float
        operand's (both quantized: the promoted dtype of the two).

    Raises
    ------
    ParamsError
        An operand is neither a QuantizedTensor nor an array.
    DTypeError
        An array operand without a real floating dtype.
    DeviceError
        The operands live in different namespaces or on different devices.
    ShapeError
        A 0-d operand, inner dimensions that differ, leading dimensions that do not broadcast, or a
        product (or dequantized operand) past the element limit or beyond memory (huge batch axes).
    SchemeError
        Unknown ``path`` or ``propagation``, or a forced ``path`` that does not apply (the message
        says why and which path does).

    Examples
    --------
    >>> import numpy as np
    >>> import arrayquant as aq
    >>> from arrayquant.ops import linalg
    >>> w = aq.quantize(np.array([[1.0, -2.0], [0.5, 4.0]], dtype=np.float32), "q8s:native")
    >>> x = np.array([[2.0, 1.0]], dtype=np.float32)
    >>> [round(float(v), 3) for v in linalg.matmul(x, w)[0]]
    [2.52, -0.031]
    >>> linalg.matmul_path(x, w)
    'reference'
    >>> t = aq.quantize(np.array([[1.0, -1.0], [0.0, 1.0]], dtype=np.float32), "q2s:native")
    >>> linalg.matmul_path(x, t), linalg.matmul(x, t).tolist()
    ('ternary', [[2.0, -1.0]])
    """
    # x @ w.T, or w @ x with w as stored (then the product comes back transposed)
    w, flip = stored_transpose(b), False
    if w is None and isinstance(a, QuantizedTensor) and stored_transpose(a) is None:
        w, flip = a, True
    if w is not None and propagation == "inhibit" and path in _ROW_PATHS and _RUNNING:
        # a product like one before (same weight and path, float32 NumPy x): the checks' answer is kept
        quick = (
            _RUNNING[0].shortcut(a, w, path, FUSED_ROWS) if not flip else _RUNNING[0].shortcut_t(b, w, path, FUSED_ROWS)
        )
        if quick is not None:
            return quick
    prop = check_propagation(propagation)
    if not isinstance(path, str) or path not in PATHS:
        msg = f"path must be one of {', '.join(map(repr, PATHS))}, got {path!r}"
        raise SchemeError(msg)
    shape = _check_operands(a, b)
    chosen = _choose(a, b, path)
    xp = compat.array_namespace(*(_stored(v).values if isinstance(v, QuantizedTensor) else v for v in (a, b)))

    def run() -> Any:
        # why quiet: inf or huge activations make inf/nan sums, as Burn's do, without NumPy's warnings
        with quiet(xp):
            if chosen == "ternary":
                return _ternary(a, b)
            if chosen in ("fused", "fused_int8"):
                return _fused(a, b, "int8" if chosen == "fused_int8" else "f32")
            return _int8(a, b) if chosen == "int8" else _reference(a, b)

    out = allocating(run, f"the result of matmul {list(shape)}")
    if out is None:  # the fused kernel declined (scales whose products could pass the f32 maximum)
        out = allocating(lambda: _reference(a, b), f"the result of matmul {list(shape)}")
    elif w is not None and chosen in ("fused", "fused_int8") and path in _ROW_PATHS:
        from ..fused import numba_matmul

        numba_matmul.remember(w, path, "int8" if chosen == "fused_int8" else "f32")
        _RUNNING[:] = [numba_matmul]
    if prop == "propagate" and chosen != "ternary":
        return requantize(out, b if isinstance(b, QuantizedTensor) else a)
    return out


def matmul_path(a: Any, b: Any) -> str:
    """The path :func:`~arrayquant.matmul` ``(a, b)`` takes under ``path="auto"``: ternary, int8, fused or reference.

    Parameters
    ----------
    a, b : QuantizedTensor or array
        The operands, as for :func:`~arrayquant.matmul` (checked the same way).

    Returns
    -------
    str
        ``"ternary"``, ``"int8"``, ``"fused"`` or ``"reference"``.

    Raises
    ------
    ParamsError, DTypeError, DeviceError, ShapeError
        As :func:`~arrayquant.matmul` does for the same operands.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayquant as aq
    >>> from arrayquant.ops import linalg
    >>> x = np.ones((2, 3), dtype=np.float32)
    >>> linalg.matmul_path(aq.quantize(x, "q8s:native"), aq.quantize(x.T, "q4s:native"))
    'int8'
    """
    _check_operands(a, b)
    return _choose(a, b, "auto")


# -- checks -------------------------------------------------------------------------------------


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(v.shape)


def _stored(v: Any) -> Any:
    """``w`` for the free transpose ``w.T`` (where its place is read without building the transpose), else ``v``."""
    return stored_transpose(v) or v


def _check_operands(a: Any, b: Any) -> tuple[int, ...]:
    """Types, dtypes, namespace and device, then shapes: everything before any arithmetic; the result's shape."""
    for name, v in (("a", a), ("b", b)):
        if isinstance(v, QuantizedTensor):
            continue
        if not compat.is_array_api_obj(v):
            msg = (
                f"{name} must be an aq.QuantizedTensor or an Array API array, got {type(v).__name__}; "
                f"convert it with aq.asarray({name})"
            )
            raise ParamsError(msg)
        xp = compat.array_namespace(v)
        if not is_real_float(xp, v.dtype):
            msg = f"{name} has dtype {v.dtype}; matmul with a quantized tensor needs a real floating array"
            raise DTypeError(msg)
    same_place(a=_stored(a), b=_stored(b))
    sa, sb = _shape(a), _shape(b)
    if not sa or not sb:
        msg = f"matmul needs operands of at least one dimension, got shapes {sa} and {sb}"
        raise ShapeError(msg)
    k_b = sb[0] if len(sb) == 1 else sb[-2]
    if sa[-1] != k_b:
        msg = (
            f"matmul inner dimensions differ: a has shape {sa} (last axis {sa[-1]}), b has shape {sb} "
            f"({'only' if len(sb) == 1 else 'second-to-last'} axis {k_b}); they must be equal"
        )
        raise ShapeError(msg)
    lead_a, lead_b = sa[:-2], sb[:-2]
    for x, y in zip(reversed(lead_a), reversed(lead_b), strict=False):
        if x != y and x != 1 and y != 1:
            msg = f"matmul leading dimensions {lead_a} of a {sa} and {lead_b} of b {sb} do not broadcast"
            raise ShapeError(msg)
    width = max(len(lead_a), len(lead_b))
    pad_a, pad_b = (1,) * (width - len(lead_a)) + lead_a, (1,) * (width - len(lead_b)) + lead_b
    lead = tuple(max(x, y) for x, y in zip(pad_a, pad_b, strict=True))
    rows, cols = sa[-2:-1], (sb[-1:] if len(sb) > 1 else ())  # a 1-d operand's axis is dropped
    out = (*lead, *rows, *cols)
    # why before any arithmetic: broadcast batch axes (zero-stride views) can ask for more than any array holds
    check_elements(out, "the result of matmul", "multiply fewer or smaller batches")
    return out


def _choose(a: Any, b: Any, path: str) -> str:
    """The path to take; a forced path that does not apply is a SchemeError saying why."""
    if path == "reference":
        return path
    why = {
        "ternary": lambda: _ternary_reason(a, b),
        "int8": lambda: _int8_reason(a, b),
        "fused": lambda: _fused_reason(a, b, "f32"),
        "fused_int8": lambda: _fused_reason(a, b, "int8"),
    }
    if path != "auto":  # a forced path: its own reason only (the others are asked when it does not apply)
        reason = why[path]()
        if not reason:
            return path
    operands = _fused_operands(a, b)
    few = operands is not None and operands[3] <= FUSED_ROWS
    auto = next((p for p in ("ternary", "int8", "fused") if (p != "fused" or few) and not why[p]()), "reference")
    if path == "auto":
        return auto
    msg = f"path={path!r} does not apply: {reason}; path={auto!r} does (or path='auto')"
    raise SchemeError(msg)


def _integer_reason(qt: QuantizedTensor, name: str) -> str:
    scheme = qt.scheme
    if scheme.value.is_float:
        return f"{name} holds {scheme.value.value} minifloat codes, not integers"
    if scheme.mode.is_affine:
        return f"{name} is in {scheme.mode.value} mode: its values are not its codes times a scale"
    if scheme.mode is not QuantMode.SYMMETRIC or qt.table is not None:
        return f"{name} uses a lookup table, not integer codes"
    if scheme.is_two_level:
        return f"{name} has a two-level scheme ({scheme}); only one scale level is applied after the integer sums"
    return ""


def _int8_reason(a: Any, b: Any) -> str:
    """Why the exact-integer path does not apply, or ``""`` when it does."""
    for name, v in (("a", a), ("b", b)):
        if not isinstance(v, QuantizedTensor):
            return f"it needs both operands quantized, and {name} is a float array"
    for name, v in (("a", a), ("b", b)):
        why = _integer_reason(v, name)
        if why:
            return why
    dims_a = plan_for(a.scheme).block_dims(a.shape)
    if dims_a and (dims_a[-1] != a.shape[-1] or any(d != 1 for d in dims_a[:-1])):
        return (
            f"a's blocks {dims_a} do not span its whole last axis ({a.shape[-1]}) one row at a time: its scale "
            "changes along the contracted axis (use per-tensor or per-row scales, block size K)"
        )
    dims_b = plan_for(b.scheme).block_dims(b.shape)
    k_axis = 0 if len(b.shape) == 1 else len(b.shape) - 2
    if dims_b and any(d != (b.shape[k_axis] if i == k_axis else 1) for i, d in enumerate(dims_b)):
        return (
            f"b's blocks {dims_b} do not span its whole contracted axis ({b.shape[k_axis]}) one column at a "
            "time: its scale changes along the contracted axis (use per-tensor or per-column scales, block K x 1)"
        )
    return ""


def _ternary_reason(a: Any, b: Any) -> str:
    """Why Burn's ternary path does not apply, or ``""`` when it does."""
    if isinstance(a, QuantizedTensor):
        return "it needs a float array a (the activations), and a is quantized"
    if not isinstance(b, QuantizedTensor):
        return "it needs a quantized b (a Q2S per-tensor weight), and b is a float array"
    scheme = b.scheme
    if scheme.value is not QuantValue.Q2S or scheme.mode is not QuantMode.SYMMETRIC or b.table is not None:
        return f"it needs b quantized as Q2S (ternary codes -1, 0, 1), and b's scheme is {scheme}"
    if scheme.block is not None:
        return f"it needs one scale per tensor for b, and b's scheme is {scheme}"
    if len(b.shape) != 2:
        return f"it needs a 2-d b (K, N), and b has shape {b.shape}"
    if compat.array_namespace(a).float32 != a.dtype:
        return f"it adds float32 activations, and a has dtype {a.dtype}"
    return ""


# -- the fused paths ------------------------------------------------------------------------------


def _fused_operands(a: Any, b: Any) -> tuple[Any, QuantizedTensor, bool, int] | None:
    """``(x, w, flip, rows)`` when the product is ``x @ w.T`` with ``w`` ``(N, K)`` as stored, else None.

    ``a @ w.T`` (``b`` the free transpose of a 2-d ``w``): ``x`` is ``a``. ``w @ b`` (``a`` a 2-d
    tensor as stored, ``b`` a float vector or matrix): ``x`` is ``b`` transposed and ``flip`` says the
    product comes back transposed. ``rows`` counts the activations' rows.
    """
    w = stored_transpose(b) if isinstance(b, QuantizedTensor) else None
    if w is not None and not isinstance(a, QuantizedTensor):
        rows = 1
        for n in a.shape[:-1]:
            rows *= int(n)
        return a, w, False, rows
    if (
        isinstance(a, QuantizedTensor)
        and stored_transpose(a) is None
        and len(a.shape) == 2
        and not isinstance(b, QuantizedTensor)
        and b.ndim <= 2
    ):
        return b, a, True, 1 if b.ndim == 1 else int(b.shape[1])
    return None


def _fused_reason(a: Any, b: Any, sums: str) -> str:
    """Why the fused kernels do not apply (summing ``sums``), or ``""`` when they do."""
    operands = _fused_operands(a, b)
    if operands is None:
        return "it needs a float array times a 2-d weight w in its stored layout, written x @ w.T or w @ x"
    x, w, _, _ = operands
    from .. import fused

    backend = shim.backend_name(w.values)
    if backend == "cupy":
        if sums == "int8":
            return "the int8 sums run on NumPy arrays (Numba) only"
        from ..fused import cupy_matmul

        off = fused.gpu_why_not(cupy_matmul.VERIFIED)
        if off:
            return f"the fused GPU kernels are off ({off})"
    elif backend != "numpy":
        return "the fused kernels run on NumPy (Numba) and CuPy arrays"
    elif not fused.available():
        return f"the fused CPU kernels are off ({fused.why_not()})"
    if compat.array_namespace(x).float32 != x.dtype:
        return f"it multiplies float32 activations, and the float operand has dtype {x.dtype}"
    if backend == "cupy":
        return cupy_matmul.supports(plan_for(w.scheme), tuple(w.shape))
    from ..fused import numba_matmul

    return numba_matmul.supports(plan_for(w.scheme), tuple(w.shape), sums)


def _fused(a: Any, b: Any, sums: str) -> Any:
    """``x @ w.T`` by the fused kernel, shaped as ``matmul(a, b)``; None where the kernel declines."""
    from ..fused import cupy_matmul, numba_matmul

    operands = _fused_operands(a, b)
    assert operands is not None  # _choose checked
    x, w, flip, _ = operands
    xp = compat.array_namespace(x)
    k = int(w.shape[1])
    x2 = xp.reshape(x, (1, k)) if x.ndim == 1 else (xp.permute_dims(x, (1, 0)) if flip else xp.reshape(x, (-1, k)))
    if shim.backend_name(w.values) == "cupy":
        y = cupy_matmul.matmul_t(x2, w, plan_for(w.scheme))
    else:
        y = numba_matmul.matmul_t(x2, w, plan_for(w.scheme), sums)
    if y is None:
        return None
    if flip:
        return y[0] if x.ndim == 1 else xp.permute_dims(y, (1, 0))
    return xp.reshape(y, (*x.shape[:-1], int(w.shape[0])))


# -- the reference path ---------------------------------------------------------------------------


def _reference(a: Any, b: Any) -> Any:
    """Dequantize into the float side's dtype (Burn's target dtype) and multiply the floats."""
    fa = a if not isinstance(a, QuantizedTensor) else dequantize(a, None if isinstance(b, QuantizedTensor) else b.dtype)
    fb = b if not isinstance(b, QuantizedTensor) else dequantize(b, None if isinstance(a, QuantizedTensor) else a.dtype)
    xp = compat.array_namespace(fa, fb)
    if fa.dtype != fb.dtype:  # two quantized operands of different float dtypes
        dtype = xp.result_type(fa.dtype, fb.dtype)
        fa, fb = xp.astype(fa, dtype), xp.astype(fb, dtype)
    return xp.matmul(fa, fb)


# -- the integer path -------------------------------------------------------------------------------


def _code_bound(qt: QuantizedTensor) -> int:
    plan = plan_for(qt.scheme)
    return max(abs(plan.qmin), abs(plan.qmax))


def _int8_sums(a: QuantizedTensor, b: QuantizedTensor) -> Any:
    """The exact integer sums ``codes(a) @ codes(b)`` (int32 or int64), both operands at least 2-d.

    Computed as f32 matmuls of the codes over slices of K short enough that no partial sum can pass
    2^24: every product and every partial sum is then an integer an f32 holds exactly, whatever order
    the library sums in (BLAS blocking, FMA, TF32 or bf16 input rounding on GPUs, which keep integers
    up to 2^8 exact), so each slice is exact and runs at f32 matmul speed everywhere; the slices are
    added as int32 (int64 when ``K * max|code a| * max|code b|`` could pass 2^31). NumPy's own integer
    matmul is exact too but has no BLAS behind it (tens of times slower); a float64 matmul is exact
    below 2^53 but moves twice the bytes and is missing on some devices.
    """
    xp = compat.array_namespace(a.values)
    ca, cb = a.codes(), b.codes()
    if len(a.shape) == 1:
        ca = xp.reshape(ca, (1, a.shape[0]))
    if len(b.shape) == 1:
        cb = xp.reshape(cb, (b.shape[0], 1))
    k = ca.shape[-1]
    term = _code_bound(a) * _code_bound(b)
    step = max(1, _F32_EXACT // term)
    acc = xp.int32 if k * term <= _INT32_LIMIT else xp.int64
    total = None
    for k0 in range(0, k, step):
        k1 = min(k, k0 + step)  # array-api-strict refuses out-of-bounds slice stops
        part = xp.matmul(xp.astype(ca[..., k0:k1], xp.float32), xp.astype(cb[..., k0:k1, :], xp.float32))
        part = xp.astype(part, acc)
        total = part if total is None else total + part
    return total


def _int8(a: QuantizedTensor, b: QuantizedTensor) -> Any:
    """``(f32(sums) * row scales of a) * column scales of b``, in the operands' promoted float dtype."""
    xp = compat.array_namespace(a.values)
    sums = _int8_sums(a, b)
    # scale grids: a's (..., M, 1) or (1,); b's (..., 1, N) or (1,); 1-d operands were made 2-d above
    sa = a.scales if len(a.shape) > 1 else xp.reshape(a.scales, (1, 1))
    sb = b.scales if len(b.shape) > 1 else xp.reshape(b.scales, (1, 1))
    out = (xp.astype(sums, xp.float32) * sa) * sb
    if len(b.shape) == 1:
        out = out[..., 0]
    if len(a.shape) == 1:
        out = out[..., 0, :] if len(b.shape) > 1 else out[..., 0]
    dtype = xp.result_type(a.dtype, b.dtype)
    return out if dtype == xp.float32 else xp.astype(out, dtype)


# -- the ternary path -------------------------------------------------------------------------------


def _ternary(a: Any, b: QuantizedTensor) -> Any:
    """Burn's ``ternary_matmul``: per output, ± the activations in k order from +0.0, then ``* gamma``."""
    from .. import fused

    t = b.codes()
    if fused.available():
        from ..fused import numba_ternary

        if not numba_ternary.supports(a, t):
            return numba_ternary.ternary_matmul(a, t, b.scales)
    return _ternary_portable(a, t, b.scales)


def _ternary_portable(a: Any, t: Any, gamma: Any) -> Any:
    """The k-ordered sums with Array API ops, bit for bit Burn's loop.

    Burn adds ``x`` where the code is 1, subtracts it where -1 and skips 0. Here each step adds the
    selected ``x``, ``-x`` or +0.0 instead: ``acc - x`` and ``acc + (-x)`` are the same IEEE operation,
    and adding +0.0 changes nothing because the sum starts at +0.0 and round-to-nearest never
    yields -0.0 from it (a sum is -0.0 only when both terms are). No multiplication until ``* gamma``.
    """
    xp = compat.array_namespace(a)
    vector = a.ndim == 1
    if vector:
        a = xp.reshape(a, (1, a.shape[0]))
    pos, neg = t == 1, t == -1
    acc = xp.zeros((*a.shape[:-1], t.shape[1]), dtype=xp.float32, device=compat.device(a))
    zero = xp.zeros_like(acc)
    for k in range(t.shape[0]):
        x = a[..., k : k + 1]
        acc = acc + xp.where(pos[k, :], x, xp.where(neg[k, :], -x, zero))
    out = acc * gamma
    return out[0, :] if vector else out
