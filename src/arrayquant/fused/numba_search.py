"""MSE calibration search fused in Numba: the cases it covers and the one driver of its kernels.

:func:`mse` (the registry's ``mse`` kernel) serves four cases, each also an entry point of its own,
with the kernels of :mod:`.numba_search_kernels` (the f32 steps, the same as the portable path's,
are listed there):

============== ======================================================= ==============================
case           schemes and shapes                                      entry point
============== ======================================================= ==============================
``ROWS``       integer values, 1-D blocks along the last axis          :func:`mse_codes_and_scales`
``FLOAT_ROWS`` E2M1, E4M3, E5M2, 1-D blocks along the last axis; one   :func:`mse_float_codes_and_scales`
               level (round-up or OCP scales) or two (round-up)
``BLOCKS``     integer values, 2-D blocks on 2-D data                  :func:`mse_block2d_codes_and_scales`
``TENSOR``     integer values, one scale per tensor, any rank from 1   :func:`mse_tensor_codes_and_scales`
============== ======================================================= ==============================

Integer values take one-level round-up scales of any dtype, in symmetric (not lookup) mode. A
kernel declines (None) data holding NaN or infinity: the portable path then reports where.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..invariants import Plan
from ..kernels.minifloat import FORMATS, decode_table
from ..kernels.roundup import pow2_tables
from ..kernels.search import norm_tables as grid_tables
from ..scheme import F32_TINY, QuantMode, QuantValue, ScaleDtype
from . import numba_search_kernels as kernels
from .numba_launch import launch, numba
from .numba_quantize import absmax
from .numba_search_kernels import FLOAT, INT

__all__ = [
    "BLOCKS",
    "FLOAT_ROWS",
    "ROWS",
    "TENSOR",
    "mse",
    "mse_block2d_codes_and_scales",
    "mse_codes_and_scales",
    "mse_float_codes_and_scales",
    "mse_tensor_codes_and_scales",
    "norm_tables",
    "supports",
]

ROWS, FLOAT_ROWS, BLOCKS, TENSOR = "integer rows", "minifloat rows", "integer 2-d blocks", "integer per-tensor"

# E2M1 midpoints (kernels/minifloat.py's E2M1_STEPS) and whether the comparison includes them
_E2M1_THR = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_INCL = (0, 1, 0, 1, 0, 1, 0)


def _case(plan: Plan, shape: tuple[int, ...]) -> tuple[str, str]:
    """``(case, "")`` for the case covering data of ``shape`` under ``plan``, or ``("", why not)``."""
    scheme = plan.scheme
    if numba is None:
        return "", "numba is not installed"
    if scheme.mode is not QuantMode.SYMMETRIC:  # lookup mode: codes index a table, not values
        return "", f"{scheme.mode.value} mode is not fused"
    if not plan.value.is_burn:
        return "", f"{plan.value.name} values are not fused (Burn's value kinds are)"
    if not shape:
        return "", "0-d data is not fused"
    try:
        dims = plan.block_dims(shape)
    except ShapeError:  # the driver reports it with its own message
        return "", "the block has more extents than the data has axes"
    rows = bool(dims) and all(d == 1 for d in dims[:-1])
    if plan.value.is_float:
        if scheme.scale_rule not in ("round_up", "ocp") or (plan.two_level and scheme.scale_rule != "round_up"):
            return "", "only round-up or one-level OCP scales of minifloats are searched"
        return (FLOAT_ROWS, "") if rows else ("", "minifloats are searched in 1-D blocks along the last axis only")
    if plan.two_level or scheme.scale_rule != "round_up":
        return "", "only one-level round-up scales of integers are searched"
    if not dims:
        return TENSOR, ""
    if rows:
        return ROWS, ""
    if len(shape) == 2 and len(dims) == 2:
        return BLOCKS, ""
    return "", "2-D blocks are searched on 2-D data only"


def supports(plan: Plan, shape: tuple[int, ...], case: str | None = None) -> str:
    """Why :func:`mse` does not cover data of ``shape`` under ``plan``, or ``""`` when it does.

    ``case`` (:data:`ROWS`, :data:`FLOAT_ROWS`, :data:`BLOCKS`, :data:`TENSOR`) asks about that case only.
    """
    got, why = _case(plan, shape)
    if not why and case is not None and got != case:
        return f"that is the {got} case, not the {case} one"
    return why


def norm_tables(norm: float) -> tuple[int, np.ndarray, np.ndarray]:
    """How the kernels raise an error to ``norm``: (mode, mantissa table, binade table).

    Mode 0 for ``norm == 1`` and 1 for ``norm == 2`` (exact products, no tables); mode 2 takes the
    portable search's exact power tables.
    """
    if norm == 1:
        return 0, np.zeros(1, np.float32), np.zeros(1, np.float32)
    if norm == 2:
        return 1, np.zeros(1, np.float32), np.zeros(1, np.float32)
    _, scale_t, mant_t = grid_tables(float(norm))
    # scale_t is indexed by k + 126 and the biased exponent is k + 127: one slot of offset
    return 2, np.asarray(mant_t, np.float32), np.asarray(scale_t, np.float32)


def _rows_of(rows: list[Any]) -> np.ndarray:
    """The f32 rows as one zero-padded 2-d array: the kernels take one array, not a tuple of them
    (taking an array out of a tuple in their loops costs atomic reference counting per candidate)."""
    out = np.zeros((len(rows), max(len(r) for r in rows)), dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _round_up_tables(dtype: ScaleDtype) -> np.ndarray:
    """The tables of ``round_up_scales`` for ``dtype`` as rows: the thresholds, up_a, up_b, inv_a,
    inv_b, then (max, floor, is-f32, threshold count)."""
    g = dtype.grid
    rows = [np.asarray(t, dtype=np.float32) for t in pow2_tables(dtype)]
    return _rows_of([*rows, [g.max, g.floor, 1.0 if dtype is ScaleDtype.F32 else 0.0, rows[0].shape[0]]])


def _global(x2: np.ndarray, plan: Plan) -> np.float32 | None:
    """MinMax's two-level global (``kernels/qparams.py``'s ``global_scale``), or None for non-finite data.

    The largest block scale is ``max|x| / (span / 2)``: division by a positive constant is monotone.
    """
    f32 = np.float32
    top = absmax(x2)
    if top is None:
        return None
    s_max = f32(top[0] / f32(plan.value.span / 2))
    return f32(max(f32(s_max / f32(plan.scale_dtype.max)), f32(F32_TINY)))


def _encoder(plan: Plan, rounding: str, glob: np.float32 | None) -> tuple[int, tuple[Any, ...], np.ndarray, Any]:
    """The value encoder of ``plan``: its kind, scalars ``vc``, table rows ``tab`` (a minifloat's),
    and the candidate scales' constants ``sc`` = (span / 2, global, two-level, ocp, ocp factor)."""
    f32 = np.float32
    half_span = f32(plan.value.span / 2)
    vc: tuple[Any, ...]
    if not plan.value.is_float:
        vc = (f32(plan.qmin), f32(plan.qmax), rounding == "half_even")
        return INT, vc, np.zeros((1, 1), f32), (half_span, f32(1.0), False, False, f32(1.0))
    fmt = FORMATS[plan.value]
    bthr = [2.0**e for e in range(fmt.emin + 1, fmt.emax + 1)]
    bscale = [2.0 ** (fmt.mbits - fmt.emin - k) for k in range(fmt.emax - fmt.emin + 1)]
    # magnitudes only (the positive half of the table): codes below the sign bit
    dtab = np.asarray(decode_table(plan.value)[: fmt.sign_bit], dtype=f32)
    vc = (plan.value is QuantValue.E2M1, f32(fmt.max), 1 << fmt.mbits, fmt.bits - 1, len(bthr))
    tab = _rows_of([_E2M1_THR, _E2M1_INCL, bthr, bscale, dtab])
    two = glob is not None
    sc = (half_span, f32(1.0) if glob is None else glob, two, plan.scheme.scale_rule == "ocp", f32(2.0**-fmt.emax))
    return FLOAT, vc, tab, sc


def mse(
    x: Any,
    plan: Plan,
    factors: tuple[float, ...],
    norm: float,
    importance: np.ndarray | None = None,
    rounding: str = "half_even",
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """Codes, stored f32 scales and the two-level global of an MSE search, or None.

    Parameters
    ----------
    x : numpy.ndarray
        float32 or float16 data, at least 1-d.
    plan : Plan
        The validated scheme (see :func:`supports`).
    factors : tuple of float
        The candidates as f32 multipliers of ``max|x|`` (``CalSpec.factors``), in order of preference.
    norm : float
        The error exponent ``p`` (``CalSpec.norm``).
    importance : numpy.ndarray, optional
        The f32 per-column (last-axis) weights as the invariant layer returns them.
    rounding : {"half_even", "half_away"}
        The integer rounding (minifloats round half to even).

    Returns
    -------
    (codes, scales, global) or None
        Codes of ``x``'s shape (int8 integers; minifloats as the portable encoder writes them, the
        sign in the field's top bit, uint8), scales on the scale grid (``(1,)`` per tensor), and
        the ``(1,)`` f32 global of a two-level scheme (else None). None where no case covers it
        (see :func:`supports`; other dtypes and arrays) or the data holds NaN or infinity: the
        caller then runs the portable path, which reports it.
    """
    return _search(None, x, plan, factors, norm, importance, rounding)


def mse_codes_and_scales(
    x: Any, plan: Plan, factors: tuple[float, ...], norm: float, importance: Any = None, *, rounding: str = "half_even"
) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`mse`'s (codes, scales) where the case is :data:`ROWS`, else None."""
    hit = _search(ROWS, x, plan, factors, norm, importance, rounding)
    return None if hit is None else (hit[0], hit[1])


def mse_float_codes_and_scales(
    x: Any, plan: Plan, factors: tuple[float, ...], norm: float, importance: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """:func:`mse` where the case is :data:`FLOAT_ROWS`, else None."""
    return _search(FLOAT_ROWS, x, plan, factors, norm, importance, "half_even")


def mse_block2d_codes_and_scales(
    x: Any, plan: Plan, factors: tuple[float, ...], norm: float, importance: Any = None, *, rounding: str = "half_even"
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """:func:`mse` where the case is :data:`BLOCKS`, else None."""
    return _search(BLOCKS, x, plan, factors, norm, importance, rounding)


def mse_tensor_codes_and_scales(
    x: Any, plan: Plan, factors: tuple[float, ...], norm: float, importance: Any = None, *, rounding: str = "half_even"
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """:func:`mse` where the case is :data:`TENSOR`, else None."""
    return _search(TENSOR, x, plan, factors, norm, importance, rounding)


def _search(
    case: str | None,
    x: Any,
    plan: Plan,
    factors: tuple[float, ...],
    norm: float,
    importance: Any,
    rounding: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """The one driver: :func:`mse`, limited to ``case`` unless None."""
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float16) or x.size == 0:
        return None  # (quantize refuses empty data before it asks)
    shape = tuple(int(n) for n in x.shape)
    got, why = _case(plan, shape)
    if why or (case is not None and got != case):
        return None
    if got == TENSOR:
        # axis-0 rows, the other axes flattened row-major (1-D data: one element a row)
        x2 = np.ascontiguousarray(x.reshape(shape[0], math.prod(shape[1:])), dtype=np.float32)
        hit = _tensor(x2, plan, factors, norm, importance, rounding, len(shape))
        return None if hit is None else (hit[0].reshape(shape), hit[1], None)
    dims = plan.block_dims(shape)
    blocks = (dims[0], dims[1]) if got == BLOCKS else (1, dims[-1])
    x2 = np.ascontiguousarray(x.reshape(-1, shape[-1]), dtype=np.float32)
    glob = None
    if plan.two_level:
        glob = _global(x2, plan)
        if glob is None:
            return None
    kind, vc, tab, sc = _encoder(plan, rounding, glob)
    rows, cols = x2.shape
    g0, g1 = -(-rows // blocks[0]), -(-cols // blocks[1])
    mode, mant, ptab = norm_tables(norm)
    w, has_w = _weights(importance)
    codes = np.empty((rows, cols), dtype=np.int8 if kind == INT else np.uint8)
    scales = np.empty((g0, g1), dtype=np.float32)
    bad = np.zeros(g0, dtype=np.bool_)
    sd, u8 = _round_up_tables(plan.scale_dtype), _round_up_tables(ScaleDtype.UE8M0)
    f = np.asarray(factors, dtype=np.float32)
    args = (x2, *blocks, f, sc, sd, u8, vc, tab, mode, mant, ptab, w, has_w, codes, scales, bad)
    launch(kernels.SEARCH[kind], x2.size, *args)
    if bad.any():
        return None
    g_out = None if glob is None else np.full(1, glob, dtype=np.float32)
    grid = scales if got == BLOCKS else scales.reshape((*shape[:-1], g1))
    return codes.reshape(shape), grid, g_out


def _weights(importance: Any) -> tuple[np.ndarray, bool]:
    """The f32 weights the kernels read (one dummy where there are none) and whether there are any."""
    if importance is None:
        return np.ones(1, np.float32), False
    return np.ascontiguousarray(importance, dtype=np.float32).reshape(-1), True


def _tensor(
    x2: np.ndarray,
    plan: Plan,
    factors: tuple[float, ...],
    norm: float,
    importance: Any,
    rounding: str,
    ndim: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-tensor search of the rows of ``x2``: the candidate with the smallest total error.

    Each row's error by the tree, then the rows' by it, as ``quantize._search_tensor``; 1-D data
    (``ndim`` 1, one element a row) is one tree over the elements, its levels in parallel.
    """
    top = absmax(x2)  # max|x|, exact in any order; None for NaN or infinity
    if top is None:
        return None
    amax = np.float32(top[0])
    rows, cols = x2.shape
    _, vc, _, sc = _encoder(plan, rounding, None)
    mode, mant, ptab = norm_tables(norm)
    w, has_w = _weights(importance)
    if has_w and ndim > 1:
        w = np.tile(w, cols // w.shape[0])  # per element: its last-axis column's weight
    sd, u8 = _round_up_tables(plan.scale_dtype), _round_up_tables(ScaleDtype.UE8M0)
    down = np.float32(kernels.error_unit(amax, u8))  # numba hands back a Python float: f32 again
    scales = kernels.candidate_scales(amax, np.asarray(factors, dtype=np.float32), sc, sd, u8)
    best_i, best = 0, None
    if ndim == 1:
        buf = np.empty(1 << max(rows - 1, 0).bit_length(), dtype=np.float32)
        x1 = x2.reshape(1, rows)
        totals: list[np.float32 | None] = []
        for i in range(len(scales)):
            if i > 0 and scales[i] == scales[i - 1]:
                totals.append(None)  # the same stored scale: the same error, never strictly smaller
                continue
            args = (x1, scales[i], vc, down, mode, mant, ptab, w, has_w, buf)
            totals.append(np.float32(launch(kernels.FLAT_ERROR, rows, *args)))
    else:
        errs = np.empty((rows, len(scales)), dtype=np.float32)
        launch(kernels.ROW_ERRORS, x2.size * len(scales), x2, scales, vc, down, mode, mant, ptab, w, has_w, errs)
        totals = [np.float32(kernels.tree_sum(np.ascontiguousarray(errs[:, i]))) for i in range(len(scales))]
    for i, total in enumerate(totals):
        if total is not None and (best is None or total < best):
            best_i, best = i, total
    s = scales[best_i]
    codes = np.empty((rows, cols), dtype=np.int8)
    launch(kernels.TENSOR_CODES, x2.size, x2, s, vc, codes)
    return codes, np.asarray([s], dtype=np.float32)
