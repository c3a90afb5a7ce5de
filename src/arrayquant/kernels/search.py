"""Calibration by search (MSE, 4over6) and by percentile, the same bits on every backend.

A search tries candidate ranges ``alpha = f * max|x|`` one at a time and keeps, per block, the one
whose stored scale gives the smallest error ``sum w * |x - deq(q(x))|^p``. Determinism across
backends comes from three choices:

* the error of each element is exact f32 arithmetic (subtract, abs, divide by a power of two);
* ``e^p`` is not ``pow`` (whose last bit differs between libraries) but a fixed table lookup:
  ``e = m * 2^k`` with ``m`` in [1, 2) (``k`` guessed by ``log2``, then settled by exact
  comparisons), and ``e^p = M[j] * P[k]`` where ``M`` holds ``(1 + (j + 1/2) / 2^14)^p`` for the
  top 14 fraction bits ``j`` of ``m`` and ``P[k] = 2^(kp)``, both rounded to f32 once on the host
  (relative accuracy ``p * 2^-15``); ``e`` below ``2^-126`` counts as 0 and ``e`` is capped at
  255.99. ``p = 1`` and ``p = 2`` are computed as ``e`` and ``e * e``;
* sums run over a fixed pairwise tree in row-major order within each block (as AbsMean's).

The element error is taken relative to the block's power of two ``2^K >= max|x|`` (UE8M0 round-up),
which changes no comparison and keeps ``e^p`` far from overflow.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from array_api_compat import device as device_of

from ..scheme import ScaleDtype
from .blocks import as_blocks, grid_as_blocks, pad_to_blocks
from .calibrate import pairwise_sum
from .roundup import round_up_scales

__all__ = [
    "block_errors",
    "count_below",
    "element_weights",
    "error_unit",
    "kth_smallest",
    "nearest_rank",
    "norm_tables",
    "order_statistics",
    "percentile_alpha",
    "percentile_bounds",
    "pow_norm",
    "row_errors",
    "search_blocks",
    "select",
    "signed_counts",
]

_FRAC_BITS = 14
_KMIN, _KMAX = -126, 7  # binades of a relative error: normal f32 up to < 256; below 2^-126 counts as 0
_TINY = 2.0**_KMIN


def _f32(v: float) -> float:
    out: float = struct.unpack("f", struct.pack("f", v))[0]
    return out


@functools.cache
def norm_tables(p: float) -> tuple[list[float], list[float], list[float]]:
    """Per binade ``k`` (index ``k - KMIN``): ``2^-k`` and ``2^(kp)``; per fraction ``j``: ``M[j]``."""
    ks = range(_KMIN, _KMAX + 1)
    down = [2.0**-k for k in ks]
    scale = [_f32(2.0 ** (k * p)) for k in ks]
    n = 1 << _FRAC_BITS
    mant = [_f32((1 + (j + 0.5) / n) ** p) for j in range(n)]
    return down, scale, mant


def _index_dtype(xp: Any) -> Any:
    """The namespace's default index dtype (int64, or int32 on JAX without x64): ``take`` is fastest with it."""
    try:
        return xp.__array_namespace_info__().default_dtypes()["indexing"]
    except (AttributeError, TypeError, KeyError):
        return xp.int32


def pow_norm(e: Any, p: float, *, xp: Any) -> Any:
    """``e^p`` for f32 ``e >= 0`` (finite, below 256), the same bits on every backend (see module doc).

    The binade comes from ``log2`` (whose last bit varies by library) and is then corrected by
    exact comparisons, so only exact operations decide the result.
    """
    if p == 1:
        return e
    if p == 2:
        return xp.multiply(e, e)
    dev = device_of(e)
    f32 = xp.float32
    down_t, scale_t, mant_t = norm_tables(float(p))
    one = xp.asarray(1.0, dtype=f32, device=dev)
    two = xp.asarray(2.0, dtype=f32, device=dev)
    shape = tuple(e.shape)
    e = xp.reshape(e, (-1,))  # take wants 1-d indices
    ec = xp.clip(e, _TINY, _f32(255.99))
    index = _index_dtype(xp)
    # the binade as an exact float: a guess from log2 (within an ulp for normal floats), settled below
    k = xp.clip(xp.floor(xp.log2(ec)), float(_KMIN), float(_KMAX))
    m = xp.multiply(ec, xp.take(xp.asarray(down_t, dtype=f32, device=dev), xp.astype(k - _KMIN, index)))
    hi = m >= two
    lo = m < one
    k = xp.where(hi, xp.add(k, 1.0), xp.where(lo, xp.subtract(k, 1.0), k))
    m = xp.where(hi, xp.multiply(m, 0.5), xp.where(lo, xp.multiply(m, 2.0), m))
    j = xp.astype(xp.floor(xp.multiply(xp.subtract(m, one), float(1 << _FRAC_BITS))), index)  # m in [1, 2)
    out = xp.multiply(
        xp.take(xp.asarray(mant_t, dtype=f32, device=dev), j),
        xp.take(xp.asarray(scale_t, dtype=f32, device=dev), xp.astype(k - _KMIN, index)),
    )
    if scale_t[0] != 0.0:  # else (2^-126)^p underflows to 0 already: the clip changed nothing that counts
        out = xp.where(e < _TINY, xp.asarray(0.0, dtype=f32, device=dev), out)
    return xp.reshape(out, shape)


def _limit(e: Any, *, xp: Any) -> Any:
    return xp.minimum(e, xp.asarray(_f32(255.99), dtype=xp.float32, device=device_of(e)))


def _tree_blocks(v: Any, *, xp: Any) -> Any:
    """Sum a ``(g0, b0, g1, b1, ...)`` view per block: row-major within the block, fixed tree."""
    rank = v.ndim // 2
    grid = tuple(v.shape[2 * i] for i in range(rank))
    block = math.prod(v.shape[2 * i + 1] for i in range(rank))
    v = xp.permute_dims(v, tuple(range(0, 2 * rank, 2)) + tuple(range(1, 2 * rank, 2)))
    return pairwise_sum(xp.reshape(v, (*grid, block)), xp=xp)


def error_unit(amax: Any, *, xp: Any) -> Any:
    """``2^K >= amax``: the power of two the element errors are measured in."""
    return round_up_scales(amax, ScaleDtype.UE8M0, xp=xp)


def element_weights(shape: tuple[int, ...], importance: Any, *, xp: Any, device: Any) -> Any:
    """Per-element weights of data of ``shape``: the importance of each element's last-axis column, or 1."""
    if importance is None:
        return xp.ones(shape, dtype=xp.float32, device=device)
    row = xp.reshape(importance, (1,) * (len(shape) - 1) + (shape[-1],))
    return xp.broadcast_to(row, shape)


def block_errors(xb: Any, deq: Any, unit_b: Any, wb: Any, p: float, *, xp: Any) -> Any:
    """``sum w * |x - deq|^p`` per block of a block view, errors measured in ``unit_b``."""
    e = _limit(xp.divide(xp.abs(xp.subtract(xb, deq)), unit_b), xp=xp)
    return _tree_blocks(xp.multiply(pow_norm(e, p, xp=xp), wb), xp=xp)


def _least_error(candidates: Iterable[tuple[Any, Any]], *, xp: Any) -> Any:
    """The ``alpha`` of the least error among ``(error, alpha)`` pairs, elementwise; None for no pairs.

    Tried in order: a later candidate wins only with a strictly smaller error. A chain of ``where``,
    so no value is read.
    """
    best_err = best_alpha = None
    for err, alpha in candidates:
        if best_err is None:
            best_err, best_alpha = err, alpha
        else:
            better = err < best_err
            best_err = xp.where(better, err, best_err)
            best_alpha = xp.where(better, alpha, best_alpha)
    return best_alpha


def search_blocks(
    x: Any,
    amax: Any,
    dims: tuple[int, ...],
    factors: tuple[float, ...],
    p: float,
    weights: Any,
    *,
    scale_of: Callable[[Any], Any],
    roundtrip: Callable[[Any, Any], Any],
    xp: Any,
    unit_of: Any = None,
) -> Any:
    """The chosen ``alpha`` per block (grid-shaped, f32) among ``factors * amax``.

    ``x``: f32 finite data of a chunk cut at whole blocks; ``amax``: its ``max|x|`` grid;
    ``weights``: per-element weights of ``x``'s shape. ``scale_of(alpha)`` gives the effective
    (stored, times any global) scale grid of a candidate, ``roundtrip(xb, eff_b)`` the dequantized
    block view. Candidates are tried in order; a later one wins only with a strictly smaller error.
    Errors are measured in the power of two not below ``unit_of`` (default ``amax``) per block.
    """
    xb = as_blocks(pad_to_blocks(x, dims, xp=xp, edge=False), dims, xp=xp)
    wb = as_blocks(pad_to_blocks(weights, dims, xp=xp, edge=False), dims, xp=xp)  # padding weighs 0
    unit_b = grid_as_blocks(error_unit(amax if unit_of is None else unit_of, xp=xp), xp=xp)

    def candidates() -> Iterator[tuple[Any, Any]]:
        for f in factors:
            alpha = amax if f == 1.0 else xp.multiply(amax, xp.asarray(f, dtype=xp.float32, device=device_of(amax)))
            deq = roundtrip(xb, grid_as_blocks(scale_of(alpha), xp=xp))
            yield block_errors(xb, deq, unit_b, wb, p, xp=xp), alpha

    return _least_error(candidates(), xp=xp)


def row_errors(x: Any, deq: Any, unit: Any, weights: Any, p: float, *, xp: Any) -> Any:
    """Per-tensor search: ``sum w * |x - deq|^p`` of each row (axis 0), row-major tree; shape ``(rows,)``."""
    e = _limit(xp.divide(xp.abs(xp.subtract(x, deq)), xp.reshape(unit, (1,) * x.ndim)), xp=xp)
    v = xp.multiply(pow_norm(e, p, xp=xp), weights)
    return pairwise_sum(xp.reshape(v, (int(x.shape[0]), -1)), xp=xp)


def select(errors: list[Any], alphas: list[Any], *, xp: Any) -> Any:
    """Per-tensor search: the ``alpha`` of the smallest total error (ties: the earliest candidate).

    ``errors[i]`` holds candidate ``i``'s row errors; totals sum them by a fixed tree. No value
    is read: the choice is a chain of ``where``, so it stays lazy on dask and traceable on jax.
    """
    totals = (pairwise_sum(xp.reshape(err, (-1,)), xp=xp) for err in errors)
    return _least_error(zip(totals, alphas, strict=True), xp=xp)


def percentile_alpha(a: Any, dims: tuple[int, ...], q_num: int, q_den: int, *, xp: Any) -> Any:
    """The nearest-rank percentile ``q = q_num / q_den`` of ``|x|`` per block (``dims`` not empty).

    ``a`` is ``|x|`` (f32, non-negative). With ``n`` real elements in a block the result is its
    ``ceil(q * n)``-th smallest (at least the first). Zero padding sorts first, so the index in the
    padded block moves up by the padding count.
    """
    dev = device_of(a)
    v = as_blocks(pad_to_blocks(a, dims, xp=xp, edge=False), dims, xp=xp)
    index = _rank_index(tuple(a.shape), dims, q_num, q_den, xp=xp, device=dev)
    return _pick(_sorted_rows(v, xp=xp), index, xp.asarray(0.0, dtype=xp.float32, device=dev), xp=xp)


def _sorted_rows(v: Any, *, xp: Any) -> Any:
    """A ``(g0, b0, g1, b1, ...)`` block view as ``(*grid, block)``, each block sorted ascending (row-major)."""
    rank = v.ndim // 2
    grid = tuple(v.shape[2 * i] for i in range(rank))
    block = math.prod(v.shape[2 * i + 1] for i in range(rank))
    v = xp.permute_dims(v, tuple(range(0, 2 * rank, 2)) + tuple(range(1, 2 * rank, 2)))
    return xp.sort(xp.reshape(v, (*grid, block)), axis=-1)


def _rank_index(shape: tuple[int, ...], dims: tuple[int, ...], q_num: int, q_den: int, *, xp: Any, device: Any) -> Any:
    """Per block (grid-shaped int32): where its ``ceil(q * n)``-th smallest real element lies once sorted.

    The padding of a partial block (``block - n`` elements) must sort first, so the index is
    ``block - n + k - 1``.
    """
    rank = len(shape)
    grid = tuple(-(-n // b) for n, b in zip(shape, dims, strict=True))
    block = math.prod(dims)
    # a block's element count is the product of its per-axis counts (only edge blocks are partial);
    # the few distinct counts get their rank in Python, exactly: ceil(q * n) = -((-q_num * n) // q_den)
    per_axis = [[min(b, n - g * b) for g in range(gn)] for n, b, gn in zip(shape, dims, grid, strict=True)]
    count = xp.ones(grid, dtype=xp.int32, device=device)
    for axis, line in enumerate(per_axis):
        row = xp.asarray(line, dtype=xp.int32, device=device)
        count = xp.multiply(count, xp.reshape(row, (1,) * axis + (len(line),) + (1,) * (rank - axis - 1)))
    sizes = {1}
    for line in per_axis:
        sizes = {a * b for a in sizes for b in set(line)}
    index = xp.zeros(grid, dtype=xp.int32, device=device)
    for n in sorted(sizes):
        k = nearest_rank(n, q_num, q_den)
        index = xp.where(count == n, xp.asarray(block - n + k - 1, dtype=xp.int32, device=device), index)
    return index


def _pick(rows: Any, index: Any, fill: Any, *, xp: Any) -> Any:
    """``rows[..., index]`` per block of sorted ``(*grid, block)`` rows; ``fill`` sorts first (a max of ``where``)."""
    block = int(rows.shape[-1])
    rank = rows.ndim - 1
    pos = xp.reshape(xp.arange(block, dtype=xp.int32, device=device_of(rows)), (1,) * rank + (block,))
    hit = pos == xp.reshape(index, (*tuple(index.shape), 1))
    return xp.max(xp.where(hit, rows, fill), axis=-1)


def percentile_bounds(x: Any, dims: tuple[int, ...], q_num: int, q_den: int, *, xp: Any) -> tuple[Any, Any]:
    """``(lo, hi)`` per block (``dims`` not empty): the ``k``-th largest and ``k``-th smallest of ``x``.

    ``x`` is f32 of either sign; with ``n`` real elements in a block ``k = ceil(q * n)`` (at least
    1, ``q = q_num / q_den``). Each block is sorted with ``-inf`` padding, which sorts first and is
    never picked; ``lo`` comes from the sorted negated block (negation is exact, so it is one of the
    block's own values). Zeros come back as ``+0.0`` (no sort decides between ``-0.0`` and ``0.0``).
    NaN sorts last on every backend here; callers that may see it check the data themselves.
    """
    dev = device_of(x)
    f32 = xp.float32
    shape = tuple(x.shape)
    real = pad_to_blocks(xp.ones(shape, dtype=xp.bool, device=dev), dims, xp=xp, edge=False)
    padded = pad_to_blocks(x, dims, xp=xp, edge=False)
    ninf = xp.asarray(-math.inf, dtype=f32, device=dev)
    index = _rank_index(shape, dims, q_num, q_den, xp=xp, device=dev)
    plus_zero = xp.asarray(0.0, dtype=f32, device=dev)

    def kth(v: Any) -> Any:
        rows = _sorted_rows(as_blocks(xp.where(real, v, ninf), dims, xp=xp), xp=xp)
        return _pick(rows, index, ninf, xp=xp)

    hi = xp.add(kth(padded), plus_zero)
    lo = xp.add(xp.negative(kth(xp.negative(padded))), plus_zero)
    return lo, hi


def signed_counts(a: Any, sign: Any, value: Any, *, xp: Any) -> Any:
    """Per lane ``j`` of ``(2,)`` ``sign`` (+1 or -1) and ``value``: how many ``sign[j] * a`` are below ``value[j]``.

    The count function of :func:`order_statistics` over one slab: shape ``(2,)``, index dtype.
    Multiplying by -1 is exact negation, so each lane counts the data or its negation exactly.
    """
    return xp.concat([count_below(xp.multiply(a, sign[j : j + 1]), value[j : j + 1], xp=xp) for j in range(2)])


def order_statistics(count: Callable[[Any, Any], Any], n: int, k: int, *, xp: Any, device: Any) -> tuple[Any, Any]:
    """The ``k``-th largest and ``k``-th smallest of ``n`` finite f32 values of either sign, ``(1,)`` each.

    From counts alone, as :func:`kth_smallest`: ``count(sign, value)`` (both ``(2,)`` f32) counts,
    per lane ``j``, the values ``y`` with ``sign[j] * y < value[j]`` (see :func:`signed_counts`).
    Lane 0 looks for the ``k``-th smallest of ``x``, lane 1 for that of ``-x`` (minus the ``k``-th
    largest of ``x``). A first pass counts each lane's negatives: where the answer ``z_(k)`` is
    negative (at least ``k`` values below 0) the lane searches ``-z`` instead, whose
    ``(n - k + 1)``-th smallest is ``-z_(k) > 0``. Either way the answer is a non-negative value
    found bit by bit from the top of its pattern (31 counting passes, both lanes in each); values
    below 0 always count as below a candidate, so they need no restriction. 32 passes in all,
    nothing sorted or read back. ``-0.0`` counts as 0 and zeros come back as ``+0.0``.
    """
    f32, i32 = xp.float32, xp.int32
    lanes = xp.asarray([1.0, -1.0], dtype=f32, device=device)
    below_zero = count(lanes, xp.zeros((2,), dtype=f32, device=device))
    rank = xp.asarray(k, dtype=below_zero.dtype, device=device)
    negative = below_zero >= rank
    sign = xp.where(negative, xp.negative(lanes), lanes)
    rank = xp.where(negative, xp.asarray(n - k + 1, dtype=below_zero.dtype, device=device), rank)
    key = xp.zeros((2,), dtype=i32, device=device)
    for bit in range(30, -1, -1):
        cand = xp.bitwise_or(key, xp.asarray(1 << bit, dtype=i32, device=device))
        key = xp.where(count(sign, _key_value(cand, xp=xp, device=device)) < rank, cand, key)
    mag = _key_value(key, xp=xp, device=device)
    stat = xp.where(negative, xp.negative(mag), mag)  # z_(k) per lane; never -0.0 (mag > 0 where negative)
    lo = xp.subtract(xp.asarray(0.0, dtype=f32, device=device), stat[1:2])  # 0 - 0 = +0.0
    return lo, stat[0:1]


def nearest_rank(n: int, q_num: int, q_den: int) -> int:
    """The rank of the ``q = q_num / q_den`` percentile of ``n`` values: ``ceil(q * n)``, at least 1."""
    return max(-(-q_num * n // q_den), 1)


@functools.cache
def _binade_table() -> list[float]:
    """``2^(e - 127)`` for every f32 exponent field ``e`` (``e = 0`` unused, ``e = 255`` infinite)."""
    return [0.0] + [2.0 ** (e - 127) for e in range(1, 255)] + [math.inf]


def _key_value(key: Any, *, xp: Any, device: Any) -> Any:
    """The f32 whose bit pattern is ``key`` (``(1,)`` int32, sign bit clear), by exact arithmetic.

    No backend-neutral bitcast exists, so the value is rebuilt from the fields: ``(1 + m/2^23) *
    2^(e-127)`` for a normal pattern, ``m * 2^-23 * 2^-126`` for a subnormal one; every step is
    exact. Exponent 255 gives infinity (a NaN pattern too: only ``< value`` is ever asked).
    """
    i32 = xp.int32
    e = xp.bitwise_right_shift(key, xp.asarray(23, dtype=i32, device=device))
    m = xp.astype(xp.bitwise_and(key, xp.asarray((1 << 23) - 1, dtype=i32, device=device)), xp.float32)
    frac = xp.multiply(m, xp.asarray(2.0**-23, dtype=xp.float32, device=device))
    power = xp.take(xp.asarray(_binade_table(), dtype=xp.float32, device=device), xp.astype(e, _index_dtype(xp)))
    normal = xp.multiply(xp.add(frac, 1.0), power)
    sub = xp.multiply(frac, xp.asarray(2.0**-126, dtype=xp.float32, device=device))
    return xp.where(e == 0, sub, normal)


def kth_smallest(count_below: Callable[[Any], Any], k: int, *, xp: Any, device: Any) -> Any:
    """The ``k``-th smallest of non-negative f32 values, as ``(1,)`` f32, from counts alone.

    ``count_below(v)`` counts the values below ``v`` (a ``(1,)`` f32 array): over row slabs of an
    eager array, or as a chunked reduction of a lazy one, so nothing is sorted or held whole. The
    answer's bit pattern is found one bit at a time from the top: a candidate pattern is kept when
    fewer than ``k`` values lie below its value. Non-negative floats order as their patterns do,
    so 31 counting passes give exactly the element a sort would; nothing is read back, so the
    passes stay lazy on dask and traceable on jax. NaN counts as above every value.
    """
    i32 = xp.int32
    key = xp.zeros((1,), dtype=i32, device=device)
    for bit in range(30, -1, -1):
        cand = xp.bitwise_or(key, xp.asarray(1 << bit, dtype=i32, device=device))
        key = xp.where(count_below(_key_value(cand, xp=xp, device=device)) < k, cand, key)
    return _key_value(key, xp=xp, device=device)


def count_below(a: Any, value: Any, *, xp: Any) -> Any:
    """How many elements of ``a`` lie below ``value`` (``(1,)``), as a ``(1,)`` count (no widened copy)."""
    below = a < xp.reshape(value, (1,) * a.ndim)
    return xp.reshape(xp.astype(xp.count_nonzero(below), _index_dtype(xp)), (1,))
