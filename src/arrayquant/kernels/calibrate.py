"""Calibration: the range of the data per tensor or per block (MinMax, AbsMean, max |x|)."""

from __future__ import annotations

import math
from typing import Any

from array_api_compat import device as device_of

from ..scheme import Calibration
from .blocks import as_blocks, block_reduce, pad_to_blocks

__all__ = ["absmax", "compute_range", "finite_abs", "pairwise_sum"]


def finite_abs(x: Any, *, xp: Any) -> Any:
    """``|x|`` with NaN and infinities replaced by 0, for calibrating unchecked input."""
    a = xp.abs(xp.astype(x, xp.float32, copy=False))
    return xp.where(xp.isfinite(a), a, xp.asarray(0.0, dtype=xp.float32, device=device_of(a)))


def absmax(x: Any, dims: tuple[int, ...], *, xp: Any, finite_only: bool = False) -> Any:
    """``max(|x|)`` per block (grid-shaped) or per tensor (``dims == ()``, shape ``(1,)``).

    Equal bit for bit to ``max(|min|, |max|)``. NaN propagates, so a non-finite block shows up
    as a non-finite result, unless ``finite_only`` calibrates on the finite values alone.
    """
    a = finite_abs(x, xp=xp) if finite_only else xp.abs(xp.astype(x, xp.float32, copy=False))
    if not dims:
        return xp.reshape(xp.max(a), (1,))
    a = pad_to_blocks(a, dims, xp=xp, edge=False)
    return block_reduce(as_blocks(a, dims, xp=xp), xp.maximum, xp=xp, any_order=True)  # |x| has no -0.0


def _minmax(x: Any, dims: tuple[int, ...], *, xp: Any) -> tuple[Any, Any]:
    if not dims:
        return xp.reshape(xp.min(x), (1,)), xp.reshape(xp.max(x), (1,))
    v = as_blocks(pad_to_blocks(x, dims, xp=xp, edge=True), dims, xp=xp)
    return block_reduce(v, xp.minimum, xp=xp), block_reduce(v, xp.maximum, xp=xp)


def pairwise_sum(v: Any, *, xp: Any) -> Any:
    """Sum the last axis with a fixed tree: zero-pad to a power of two, add halves."""
    n = v.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        pad = xp.zeros((*tuple(v.shape[:-1]), width - n), dtype=v.dtype, device=device_of(v))
        v = xp.concat((v, pad), axis=-1)
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = xp.add(v[..., :h], v[..., h:])
    return v[..., 0]


def _mean_of_rows(v: Any, count: Any, *, xp: Any) -> Any:
    """``tree_sum(v) / count`` over the last axis, exact in scale where the sum overflows f32.

    Where the tree's sum of finite values passes the f32 maximum, the same tree runs on the values
    times ``2^-k`` (``2^k`` at least the row length, so that sum stays finite) and the mean is
    scaled back: powers of two commute with every rounding of the tree, so the result is what
    the tree gives with an unbounded exponent (tiny values that the scaling makes subnormal
    aside). Elsewhere the plain tree's bits are kept.
    """
    total = pairwise_sum(v, xp=xp)
    k = max(v.shape[-1] - 1, 1).bit_length()
    dev = device_of(v)
    down = xp.asarray(2.0**-k, dtype=xp.float32, device=dev)
    scaled = pairwise_sum(xp.multiply(v, down), xp=xp)
    wide = xp.multiply(xp.divide(scaled, count), xp.asarray(2.0**k, dtype=xp.float32, device=dev))
    return xp.where(xp.isinf(total), wide, xp.divide(total, count))


def _absmean(x: Any, dims: tuple[int, ...], *, xp: Any, finite_only: bool) -> Any:
    a = finite_abs(x, xp=xp) if finite_only else xp.abs(x)
    shape = tuple(x.shape)
    if not dims:
        count = xp.asarray(float(math.prod(shape)), dtype=xp.float32, device=device_of(x))
        return xp.reshape(_mean_of_rows(xp.reshape(a, (-1,)), count, xp=xp), (1,))
    rank = len(shape)
    v = as_blocks(pad_to_blocks(a, dims, xp=xp, edge=False), dims, xp=xp)
    grid = tuple(v.shape[2 * i] for i in range(rank))
    # block elements in row-major order within the block, then the fixed tree
    v = xp.permute_dims(v, tuple(range(0, 2 * rank, 2)) + tuple(range(1, 2 * rank, 2)))
    count = xp.ones(grid, dtype=xp.float32, device=device_of(x))
    for axis, (n, b) in enumerate(zip(shape, dims, strict=True)):
        per_block = [float(min(b, n - g * b)) for g in range(grid[axis])]
        line = xp.asarray(per_block, dtype=xp.float32, device=device_of(x))
        count = xp.multiply(count, xp.reshape(line, (1,) * axis + (grid[axis],) + (1,) * (rank - axis - 1)))
    return _mean_of_rows(xp.reshape(v, (*grid, math.prod(dims))), count, xp=xp)


def compute_range(
    x: Any, dims: tuple[int, ...], calibration: Calibration, *, xp: Any, finite_only: bool = False
) -> tuple[Any, Any]:
    """``(min, max)`` shaped as the scale grid (``(1,)`` when ``dims == ()``), in f32.

    AbsMean gives ``(-gamma, gamma)`` with ``gamma = mean(|x|)`` summed by a fixed pairwise tree,
    so every backend gets the same bits. ``finite_only`` ignores NaN/inf (AbsMean still counts
    them as zeros), for input that was not checked.
    """
    x = xp.astype(x, xp.float32, copy=False)
    if calibration is Calibration.ABSMEAN:
        gamma = _absmean(x, dims, xp=xp, finite_only=finite_only)
        return xp.negative(gamma), gamma
    return _minmax(x, dims, xp=xp)
