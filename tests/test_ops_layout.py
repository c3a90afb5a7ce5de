"""Layout operations on quantized tensors (arrayquant.ops.manipulation, .indexing and .exact).

Oracles: NumPy's own operation on ``qt.codes()``, on the scale grid and on ``aq.dequantize(qt)``;
``aq.quantize`` of NumPy's operation on the floats (for the exact path where blocks stay whole,
and for every fallback).
"""

from __future__ import annotations

import numpy as np
import pytest

import arrayquant as aq
from arrayquant import ops
from arrayquant.errors import BackendUnavailableError, DTypeError, SchemeError, ShapeError
from arrayquant.ops import _common, _plans, indexing, manipulation

RNG = np.random.default_rng(14)
X = (RNG.standard_normal((4, 64)) * 3).astype(np.float32)
X3 = (RNG.standard_normal((2, 4, 32)) * 3).astype(np.float32)

ONE_LEVEL = ["q8s", "q8s:native", "q4s", "q2s", "q8s:block32:f16", "q4s:block32:f16", "q8s:block2x16", "mxfp8"]
TWO_LEVEL = ["nvfp4"]
NON_LAST = ["q4s:packed_u32:1", "q4s:block32:f16:packed_u32:1"]
SCHEMES = ONE_LEVEL + TWO_LEVEL + NON_LAST


def q(scheme: str, x: np.ndarray = X) -> aq.QuantizedTensor:
    return aq.quantize(x, scheme)


def n(a):
    return np.asarray(a)


def per_tensor(qt: aq.QuantizedTensor) -> bool:
    return qt.scheme.block_size is None


def assert_exact(qt, out, np_op, grid_op=None) -> None:
    """Codes, scales and floats of ``out`` are NumPy's op on those of ``qt``."""
    np.testing.assert_array_equal(n(out.codes()), np_op(n(qt.codes())))
    want_scales = n(qt.scales) if per_tensor(qt) else (grid_op or np_op)(n(qt.scales))
    np.testing.assert_array_equal(n(out.scales), want_scales)
    np.testing.assert_array_equal(n(aq.dequantize(out)), np_op(n(aq.dequantize(qt))))
    assert out.global_scale is qt.global_scale
    # the stored values are the packing of the codes (the layout is what aq.pack makes)
    np.testing.assert_array_equal(n(out.values), n(aq.pack(np_op(n(qt.codes())), out.scheme)))


def assert_requantized(qt, out, float_op, scheme=None) -> None:
    """``out`` is Burn's fallback: quantize(op(dequantize(qt))) with the input's scheme."""
    want = aq.quantize(float_op(n(aq.dequantize(qt))), scheme or qt.scheme)
    assert out.scheme == want.scheme
    np.testing.assert_array_equal(n(out.values), n(want.values))
    np.testing.assert_array_equal(n(out.scales), n(want.scales))


def assert_fresh(out, x_op) -> None:
    """Values and scales equal quantizing the moved floats afresh (blocks kept whole)."""
    want = aq.quantize(x_op, out.scheme)
    np.testing.assert_array_equal(n(out.values), n(want.values))
    np.testing.assert_array_equal(n(out.scales), n(want.scales))


# -- permute / transpose ------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
def test_matrix_transpose_exact(scheme: str) -> None:
    qt = q(scheme)
    out = ops.matrix_transpose(qt)
    assert ops.is_exact("matrix_transpose", qt)
    assert_exact(qt, out, np.transpose)
    assert out.shape == (64, 4)
    if qt.scheme.block_size is not None:  # Burn's permute_block_dims: [b] on rank 2 -> [b, 1]
        dims = qt.scheme.block_size.to_dims(2)
        assert out.scheme.block_size == aq.BlockSize(dims[::-1])
    if qt.scheme.store.is_packed:  # the packed axis moved with its data
        assert out.scheme.store.dim == 1 - qt.scheme.store.dim
    if scheme in ONE_LEVEL:
        assert_fresh(out, X.T)


@pytest.mark.parametrize("scheme", ["q4s", "q8s:block2x16", "nvfp4", "q4s:block32:f16:packed_u32:1"])
@pytest.mark.parametrize("axes", [(2, 0, 1), (1, 2, 0), (0, 2, 1), (-1, -3, -2)])
def test_permute_dims_exact(scheme: str, axes: tuple[int, ...]) -> None:
    qt = q(scheme, X3)
    out = ops.permute_dims(qt, axes)
    assert_exact(qt, out, lambda a: np.transpose(a, axes))
    norm = [a % 3 for a in axes]
    if qt.scheme.store.is_packed:  # cubecl: dim = rank - 1 - new position of the old packed axis
        assert out.scheme.store.dim == 2 - norm.index(2 - qt.scheme.store.dim)
    if scheme != "nvfp4":
        assert_fresh(out, np.transpose(X3, axes))


def test_swapaxes_matches_numpy() -> None:
    qt = q("q8s:block32:f16", X3)
    out = ops.swapaxes(qt, 0, -1)
    assert_exact(qt, out, lambda a: np.swapaxes(a, 0, -1))
    assert out.scheme.block_size == aq.BlockSize((32, 1, 1))


# -- reshape ------------------------------------------------------------------------------------
RESHAPES = [
    ("q8s", (8, 32), True),
    ("q4s", (-1,), True),
    ("q4s:packed_u32:1", (256,), True),  # the store's dim 1 does not exist at rank 1: packs the last axis
    ("q8s:block32:f16", (8, 32), True),  # both last dims multiples of 32
    ("q8s:block32:f16", (2, 2, 64), True),  # last dim unchanged
    ("q8s:block32:f16", (16, 16), False),  # would merge halves of blocks
    ("mxfp8", (2, 128), True),
    ("nvfp4", (16, 16), True),
    ("nvfp4", (32, 8), False),
    ("q8s:block2x16", (1, 4, 64), True),  # trailing block dims unchanged
    ("q8s:block2x16", (2, 2, 64), False),  # same blocks, but the rule asks the covered dims unchanged
    ("q8s:block2x16", (2, 128), False),
]


@pytest.mark.parametrize(("scheme", "shape", "exact"), RESHAPES)
def test_reshape(scheme: str, shape: tuple[int, ...], exact: bool) -> None:
    qt = q(scheme)
    assert ops.is_exact("reshape", qt, shape) is exact
    out = ops.reshape(qt, shape)
    op = lambda a: np.reshape(a, shape)
    if exact:
        assert_exact(qt, out, op, lambda g: np.reshape(g, out.scheme.block_size.num_blocks(out.shape)))
        if scheme != "nvfp4":
            assert_fresh(out, op(X))
    else:
        assert_requantized(qt, out, op)


def test_reshape_errors() -> None:
    qt = q("q8s")
    with pytest.raises(ShapeError, match=r"cannot reshape shape \(4, 64\) \(256 elements\) into \(3, 3\)"):
        ops.reshape(qt, (3, 3))
    with pytest.raises(ShapeError, match="at most one -1"):
        ops.reshape(qt, (-1, -1))
    with pytest.raises(ShapeError, match="not a multiple of 3"):
        ops.reshape(qt, (3, -1))
    with pytest.raises(ShapeError, match="has no axes"):
        ops.reshape(qt, ())
    with pytest.raises(ShapeError, match="shape entry must be an integer"):
        ops.reshape(qt, (4.0, 64))


# -- getitem / narrow / chunk / split -----------------------------------------------------------
_ = slice(None)
GETITEMS = [
    ("q8s", (1, slice(3, 40, 5)), True),
    ("q4s", (_, slice(None, None, -3)), True),
    ("q2s", (None, Ellipsis, 2), True),
    ("q4s:packed_u32:1", (slice(1, 3), _), True),
    ("q8s:block32:f16", (slice(1, 3), slice(32, 64)), True),
    ("q8s:block32:f16", (slice(None, None, -1), slice(0, 32)), True),  # rows are unblocked
    ("q8s:block32:f16", (2,), True),
    ("q8s:block32:f16", (_, slice(32, 100)), True),  # the stop clamps to the axis end
    ("q8s:block32:f16", (None, _, _), True),  # a new axis left of the block
    ("q8s:block32:f16", (_, slice(16, 48)), False),
    ("q8s:block32:f16", (_, slice(0, 64, 2)), False),
    ("q8s:block32:f16", (_, 5), False),
    ("q4s:block32:f16", (_, slice(0, 32)), True),
    ("q8s:block2x16", (slice(2, 4), slice(16, 48)), True),
    ("q8s:block2x16", (slice(1, 3), _), False),
    ("nvfp4", (slice(1, 2), slice(16, 48)), True),
    ("nvfp4", (_, slice(1, 17)), False),
    ("mxfp8", (Ellipsis, slice(32, 64)), True),
]


@pytest.mark.parametrize(("scheme", "key", "exact"), GETITEMS)
def test_getitem(scheme: str, key: tuple, exact: bool) -> None:
    qt = q(scheme)
    assert ops.is_exact("getitem", qt, key) is exact
    out = ops.getitem(qt, key)
    op = lambda a: a[key]
    if not exact:
        assert_requantized(qt, out, op)
        return
    bd = None if qt.scheme.block_size is None else qt.scheme.block_size.to_dims(2)

    def grid(g: np.ndarray) -> np.ndarray:  # the oracle: block index ranges by hand
        k = []
        full = [kk for kk in key if kk is not Ellipsis]
        if Ellipsis in key:
            full = [_] * (2 - sum(kk is not None for kk in full)) + full
        axis = 0
        for kk in full:
            if kk is None:
                k.append(None)
                continue
            b, size = bd[axis], X.shape[axis]  # type: ignore[index]
            if b > 1 and isinstance(kk, slice):
                s, e, _st = kk.indices(size)
                kk = slice(s // b, -(-e // b))
            k.append(kk)
            axis += 1
        return g[tuple(k)]

    assert_exact(qt, out, op, grid)
    if scheme in ONE_LEVEL and all(not isinstance(k, int) for k in key if k is not None):
        assert_fresh(out, op(X))


def test_getitem_errors() -> None:
    # an int on a blocked axis requantizes; the 2-d block has no rank-1 form, so the result keeps
    # the block's extent along the remaining axis (the scheme fitted to the rank)
    qt2 = q("q8s:block2x16")
    row = ops.getitem(qt2, 0)
    assert not ops.is_exact("getitem", qt2, 0)
    assert str(row.scheme) == "q8s:block16:f32"
    want = aq.quantize(np.asarray(aq.dequantize(qt2))[0], "q8s:block16:f32")
    np.testing.assert_array_equal(row.values, want.values)
    np.testing.assert_array_equal(row.scales, want.scales)
    qt = q("q8s")
    with pytest.raises(ShapeError, match="index 4 is out of range for axis 0 of length 4"):
        ops.getitem(qt, 4)
    with pytest.raises(ShapeError, match="index -5 is out of range"):
        ops.getitem(qt, (-5,))
    with pytest.raises(ShapeError, match="selects nothing on axis 1"):
        ops.getitem(qt, (_, slice(10, 5)))
    with pytest.raises(ShapeError, match="would have no axes"):
        ops.getitem(qt, (0, 0))
    with pytest.raises(ShapeError, match="too many indices"):
        ops.getitem(qt, (0, 0, 0))
    with pytest.raises(ShapeError, match="at most one Ellipsis"):
        ops.getitem(qt, (Ellipsis, Ellipsis))
    with pytest.raises(ShapeError, match="use take or take_along_axis"):
        ops.getitem(qt, np.array([0, 1]))
    with pytest.raises(ShapeError, match="bad slice"):
        ops.getitem(qt, slice(0, 2, 0))
    with pytest.raises(ShapeError, match="not bool"):
        ops.getitem(qt, True)


@pytest.mark.parametrize(
    ("scheme", "start", "length", "exact"),
    [("q4s", 5, 7, True), ("q8s:block32:f16", 32, 32, True), ("q8s:block32:f16", 1, 40, False)],
)
def test_narrow(scheme: str, start: int, length: int, exact: bool) -> None:
    qt = q(scheme)
    assert ops.is_exact("narrow", qt, 1, start, length) is exact
    out = ops.narrow(qt, 1, start, length)
    op = lambda a: a[:, start : start + length]
    if exact:
        np.testing.assert_array_equal(n(out.codes()), op(n(qt.codes())))
        np.testing.assert_array_equal(n(aq.dequantize(out)), op(n(aq.dequantize(qt))))
    else:
        assert_requantized(qt, out, op)


def test_narrow_errors() -> None:  # Burn's narrow.rs panics: invalid dim, start, zero and too long lengths
    qt = q("q8s", X[:3, :3])
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        ops.narrow(qt, 2, 0, 2)
    with pytest.raises(ShapeError, match="start 3 is out of range"):
        ops.narrow(qt, 0, 3, 2)
    with pytest.raises(ShapeError, match="length 0 from start 1"):
        ops.narrow(qt, 0, 1, 0)
    with pytest.raises(ShapeError, match="length 4 from start 0"):
        ops.narrow(qt, 0, 0, 4)


def test_chunk_and_split_follow_burn() -> None:
    x = np.arange(7, dtype=np.float32)
    qt = q("q8s", x)
    want = [[0, 1], [2, 3], [4, 5], [6]]  # Burn's test_chunk_not_evenly_divisible / test_split_not_evenly_divisible
    for parts in (ops.chunk(qt, 4), ops.split(qt, 2)):
        assert len(parts) == len(want)
        for p, w in zip(parts, want, strict=True):
            np.testing.assert_array_equal(n(p.codes()), n(qt.codes())[w])
            np.testing.assert_allclose(n(aq.dequantize(p)), x[w], atol=0.03)
    assert [p.shape for p in ops.chunk(q("q8s", x[:6]), 7)] == [(1,)] * 6  # test_chunk_not_divisible
    sizes = [p.shape for p in ops.split(q("q8s:block32:f16"), [32, 16, 16], axis=1)]
    assert sizes == [(4, 32), (4, 16), (4, 16)]
    assert ops.is_exact("split", q("q8s:block32:f16"), [32, 32], 1)
    assert not ops.is_exact("split", q("q8s:block32:f16"), [32, 16, 16], 1)
    assert ops.is_exact("chunk", q("q8s:block32:f16"), 2, 1)


def test_chunk_split_errors() -> None:
    qt = q("q8s", np.arange(6, dtype=np.float32))
    with pytest.raises(ShapeError, match="split size must be >= 1, got 0"):
        ops.split(qt, 0)
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        ops.split(qt, 1, 2)
    with pytest.raises(ShapeError, match=r"must be >= 1 each and add up to the length 6"):
        ops.split(qt, [2, 2])
    with pytest.raises(ShapeError, match="axis 1 is out of range"):
        ops.chunk(qt, 6, 1)
    with pytest.raises(ShapeError, match="chunks must be >= 1"):
        ops.chunk(qt, 0)


# -- flip ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scheme", "axis", "exact"),
    [
        ("q4s", None, True),
        ("q4s:packed_u32:1", 0, True),
        ("q8s:block32:f16", (0, 1), True),
        ("nvfp4", 1, True),
        ("q8s:block2x16", -1, True),
        ("q8s:block32:f16:native", 1, True),
    ],
)
def test_flip_exact(scheme: str, axis, exact: bool) -> None:
    qt = q(scheme)
    assert ops.is_exact("flip", qt, axis) is exact
    out = ops.flip(qt, axis)
    assert_exact(qt, out, lambda a: np.flip(a, axis))
    if scheme in ONE_LEVEL or scheme.endswith("native") or "packed_u32:1" in scheme:
        assert_fresh(out, np.flip(X, axis))


def test_flip_through_a_block_requantizes() -> None:
    qt = q("q8s:block32:f16", X[:, :48])  # 48 is not a multiple of 32
    assert not ops.is_exact("flip", qt, 1)
    assert_requantized(qt, ops.flip(qt, 1), lambda a: np.flip(a, 1))
    short = q("q8s:block32:f16", X[:, :16])  # one partial block per row: flipping keeps it whole
    assert_exact(short, ops.flip(short, 1), lambda a: np.flip(a, 1))


def test_flip_errors() -> None:  # Burn's flip_duplicated_axes / flip_out_of_bound_axis
    qt = q("q8s", X3)
    with pytest.raises(ShapeError, match="names an axis twice"):
        ops.flip(qt, (0, 0, 1))
    with pytest.raises(ShapeError, match="axis 3 is out of range for a tensor of rank 3"):
        ops.flip(qt, (3, 0, 1))


# -- take / take_along_axis / repeat ------------------------------------------------------------
@pytest.mark.parametrize(
    ("scheme", "axis", "exact"),
    [
        ("q4s", 1, True),
        ("q8s:block32:f16", 0, True),
        ("q8s:block32:f16", 1, False),
        ("nvfp4", 0, True),
        ("q8s:block2x16", 0, False),
    ],
)
def test_take(scheme: str, axis: int, exact: bool) -> None:
    qt = q(scheme)
    idx = np.array([3, 0, -1, 2, 2])
    assert ops.is_exact("take", qt, idx, axis) is exact
    out = ops.take(qt, idx, axis)
    op = lambda a: np.take(a, idx, axis=axis)
    if exact:
        assert_exact(qt, out, op)
    else:
        assert_requantized(qt, out, op)


def test_take_errors() -> None:
    qt = q("q8s")
    with pytest.raises(ShapeError, match=r"indices must lie in \[-4, 4\)"):
        ops.take(qt, np.array([4]), 0)
    with pytest.raises(DTypeError, match="must be an integer array"):
        ops.take(qt, np.array([0.0]), 0)
    with pytest.raises(ShapeError, match="non-empty 1-d"):
        ops.take(qt, np.zeros((1, 1), np.int64), 0)
    with pytest.raises(ShapeError, match="needs an axis"):
        ops.take(qt, np.array([0]))
    with pytest.raises(ShapeError, match="axis 10 is out of range"):  # Burn's should_select_panic_invalid_dimension
        ops.take(qt, np.array([0]), 10)


def test_take_along_axis() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    qt = q("q8s", x)
    idx = np.array([[2, 1, 0, 0], [2, 0, 1, 2]])  # Burn's should_gather_2d_dim1
    out = ops.take_along_axis(qt, idx, axis=1)
    assert ops.is_exact("take_along_axis", qt, idx, 1)
    assert_exact(qt, out, lambda a: np.take_along_axis(a, idx, axis=1))
    np.testing.assert_allclose(n(aq.dequantize(out)), [[2, 1, 0, 0], [5, 3, 4, 5]], atol=0.03)
    qb = q("q8s:block32:f16")
    idx2 = np.zeros((4, 3), np.int64)
    assert not ops.is_exact("take_along_axis", qb, idx2, 1)
    assert_requantized(qb, ops.take_along_axis(qb, idx2, 1), lambda a: np.take_along_axis(a, idx2, 1))
    with pytest.raises(ShapeError, match="must have the tensor's rank 2"):
        ops.take_along_axis(qt, np.array([0]), 1)


@pytest.mark.parametrize(
    ("scheme", "axis", "exact"),
    [("q8s", 1, True), ("q8s:block32:f16", 0, True), ("q8s:block32:f16", 1, False), ("q8s:block32:f16", None, False)],
)
def test_repeat(scheme: str, axis, exact: bool) -> None:
    qt = q(scheme)
    assert ops.is_exact("repeat", qt, 2, axis) is exact
    out = ops.repeat(qt, 2, axis)
    op = lambda a: np.repeat(a, 2, axis=axis)
    if exact:
        assert_exact(qt, out, op)
    else:
        assert_requantized(qt, out, op)
    with pytest.raises(ShapeError, match="repeats must be >= 1"):
        ops.repeat(qt, 0, 0)


@pytest.mark.parametrize(
    ("scheme", "shape", "exact"),
    [("q4s", (4, 64), True), ("q8s:block32:f16", (4, 64), True), ("q8s:block32:f16", (4, 48), False)],
)
def test_repeat_dim_tiles_like_burn(scheme: str, shape, exact: bool) -> None:
    qt = q(scheme, X[: shape[0], : shape[1]])
    assert ops.is_exact("repeat_dim", qt, 1, 3) is exact
    out = ops.repeat_dim(qt, 1, 3)
    op = lambda a: np.tile(a, (1, 3))
    if exact:
        assert_exact(qt, out, op)
    else:
        assert_requantized(qt, out, op)
    with pytest.raises(ShapeError, match="times must be >= 1"):
        ops.repeat_dim(qt, 0, 0)


# -- broadcast_to / expand_dims / squeeze -------------------------------------------------------
@pytest.mark.parametrize("scheme", ["q8s", "q4s:packed_u32:1", "q8s:block32:f16", "nvfp4", "q8s:block2x16"])
def test_broadcast_to_exact(scheme: str) -> None:
    qt = q(scheme, X[:1])
    out = ops.broadcast_to(qt, (3, 5, -1))
    assert ops.is_exact("broadcast_to", qt, (3, 5, 64))
    grid = qt.scheme.block_size.num_blocks((3, 5, 64)) if qt.scheme.block_size else None
    assert_exact(qt, out, lambda a: np.broadcast_to(a, (3, 5, 64)), lambda g: np.broadcast_to(g, grid))
    if scheme in ONE_LEVEL:
        assert_fresh(out, np.broadcast_to(X[:1], (3, 5, 64)))


def test_broadcast_to_errors() -> None:  # Burn's should_fail_expand_incompatible_shapes / negative one on a new dim
    qt = q("q8s", np.array([1.0, 2.0, 3.0], np.float32))
    with pytest.raises(ShapeError, match=r"cannot broadcast shape \(3,\) to \(2, 2\): axis 1 must be 3"):
        ops.broadcast_to(qt, (2, 2))
    with pytest.raises(ShapeError, match="new axis 0 needs an extent >= 1"):
        ops.broadcast_to(qt, (-1, 3))
    with pytest.raises(ShapeError, match="fewer axes"):
        ops.broadcast_to(q("q8s"), (64,))


@pytest.mark.parametrize(
    ("scheme", "axis", "exact"),
    [
        ("q4s", 2, True),
        ("q8s:block32:f16", 0, True),
        ("q8s:block32:f16", 1, True),
        ("q8s:block2x16", 1, False),
        ("q4s:packed_u32:1", -1, True),
    ],
)
def test_expand_dims_and_squeeze(scheme: str, axis: int, exact: bool) -> None:
    qt = q(scheme)
    assert ops.is_exact("expand_dims", qt, axis) is exact
    out = ops.expand_dims(qt, axis)
    op = lambda a: np.expand_dims(a, axis)
    if not exact:
        assert_requantized(qt, out, op)
        return
    assert_exact(qt, out, op)
    back = ops.squeeze(out, axis)
    assert ops.is_exact("squeeze", out, axis)
    assert_exact(out, back, lambda a: np.squeeze(a, axis))
    assert back.scheme == qt.scheme


def test_squeeze_errors() -> None:
    qt = q("q8s")
    with pytest.raises(ShapeError, match="cannot squeeze axis 0 of length 4"):
        ops.squeeze(qt, 0)
    with pytest.raises(ShapeError, match="would have no axes"):
        ops.squeeze(q("q8s", X[:1, :1]), (0, 1))


# -- concat / stack -----------------------------------------------------------------------------
def test_concat_block_exact_and_fallbacks() -> None:
    s = "q8s:block32:f16"
    a, b, c = q(s, X[:, :32]), q(s, X[:, 32:]), q(s, X[:, 5:21])
    assert ops.is_exact("concat", [a, b, c], 1)
    out = ops.concat([a, b, c], axis=1)
    np.testing.assert_array_equal(n(out.codes()), np.concatenate([n(t.codes()) for t in (a, b, c)], axis=1))
    np.testing.assert_array_equal(n(out.scales), np.concatenate([n(t.scales) for t in (a, b, c)], axis=1))
    np.testing.assert_array_equal(n(aq.dequantize(out)), np.concatenate([n(aq.dequantize(t)) for t in (a, b, c)], 1))
    # a 16-long input before another cuts a block: Burn's fallback, quantized with the first's scheme
    assert not ops.is_exact("concat", [c, a], 1)
    cat = lambda *t: np.concatenate([n(aq.dequantize(u)) for u in t], axis=1)
    want = aq.quantize(cat(c, a), s)
    got = ops.concat([c, a], 1)
    np.testing.assert_array_equal(n(got.values), n(want.values))
    other = q("q8s:block16:f16", X[:, 32:])  # another scheme: fallback with the first's
    got = ops.concat([a, other], 1)
    np.testing.assert_array_equal(n(got.values), n(aq.quantize(cat(a, other), s).values))


def test_concat_per_tensor_needs_the_same_scale() -> None:
    a = q("q8s", X[:2])
    same = aq.QuantizedTensor(a.scheme, (2, 64), a.dtype, a.values, a.scales)
    assert ops.is_exact("concat", [a, same], 0)
    assert_exact(a, ops.concat([a, same], 0), lambda c: np.concatenate([c, c], 0))
    b = q("q8s", X[2:] * 2)
    assert not ops.is_exact("concat", [a, b], 0)
    want = aq.quantize(np.concatenate([n(aq.dequantize(a)), n(aq.dequantize(b))]), "q8s")
    np.testing.assert_array_equal(n(ops.concat([a, b], 0).values), n(want.values))


def test_stack() -> None:
    s = "nvfp4"
    a, b = q(s, X[:, :32]), q(s, X[:, 32:])
    same_global = aq.QuantizedTensor(b.scheme, b.shape, b.dtype, b.values, b.scales, a.global_scale)
    assert ops.is_exact("stack", [a, same_global], 0)
    out = ops.stack([a, same_global], 0)
    np.testing.assert_array_equal(n(out.codes()), np.stack([n(a.codes()), n(b.codes())]))
    np.testing.assert_array_equal(n(out.scales), np.stack([n(a.scales), n(b.scales)]))
    assert not ops.is_exact("stack", [a, b], 0)  # different globals: requantized
    want = aq.quantize(np.stack([n(aq.dequantize(a)), n(aq.dequantize(b))]), s)
    got = ops.stack([a, b], 0)
    np.testing.assert_array_equal(n(got.values), n(want.values))
    np.testing.assert_array_equal(n(got.global_scale), n(want.global_scale))


def test_concat_stack_errors() -> None:  # Burn's should_panic_when_dimensions_are_not_the_same / exceeds_dimension
    a, b = q("q8s", X[:1, :3]), q("q8s", X[:2, :2])
    with pytest.raises(ShapeError, match=r"qts\[1\] has shape \(2, 2\) but concat along axis 0 needs \(1, 3\)"):
        ops.concat([a, b], 0)
    with pytest.raises(ShapeError, match="axis 3 is out of range for a tensor of rank 2"):
        ops.concat([a, a], 3)
    with pytest.raises(ShapeError, match="stack needs every shape equal"):
        ops.stack([a, b], 0)
    with pytest.raises(ShapeError, match="axis 3 is out of range for a tensor of rank 3"):
        ops.stack([a, a], 3)
    with pytest.raises(ShapeError, match="non-empty list"):
        ops.concat([], 0)
    with pytest.raises(DTypeError, match=r"qts\[1\] must be a QuantizedTensor"):
        ops.concat([a, X], 0)


# -- the exact path never touches the codec -----------------------------------------------------
def test_exact_path_never_dequantizes_or_quantizes(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("the exact path called the codec")

    layout_modules = (_plans, manipulation, indexing)
    patched = [(m, name) for m in layout_modules for name in ("floats", "requantize")]
    for target, name in [*patched, (_common, "dequantize"), (_common, "quantize")]:
        monkeypatch.setattr(target, name, boom)
    for scheme in ["q4s", "q8s:block32:f16", "nvfp4"]:
        qt = q(scheme)
        ops.matrix_transpose(qt)
        ops.permute_dims(qt, (1, 0))
        ops.reshape(qt, (8, 32))
        ops.getitem(qt, (slice(1, 3), slice(32, 64)))
        ops.narrow(qt, 1, 32, 32)
        ops.chunk(qt, 2, 1)
        ops.split(qt, 32, 1)
        ops.flip(qt)
        ops.take(qt, np.array([1, 0]), 0)
        ops.repeat_dim(qt, 1, 2)
        ops.broadcast_to(ops.getitem(qt, slice(0, 1)), (3, 64))
        ops.squeeze(ops.expand_dims(qt, 0), 0)
        ops.concat([qt, qt], 0)
        ops.stack([qt, qt], 0)
    ops.take_along_axis(q("q8s"), np.zeros((4, 2), np.int64), 1)
    ops.repeat(q("q8s"), 2, 1)
    with pytest.raises(AssertionError, match="codec"):  # the fallback does call it
        ops.getitem(q("q8s:block32:f16"), (slice(None), slice(1, 5)))


# -- misc errors --------------------------------------------------------------------------------
def test_argument_errors() -> None:
    with pytest.raises(DTypeError, match="qt must be a QuantizedTensor"):
        ops.flip(X)
    with pytest.raises(SchemeError, match="unknown layout operation 'transpose'"):
        ops.is_exact("transpose", q("q8s"))
    with pytest.raises(ShapeError, match="matrix_transpose needs at least 2 axes"):
        ops.matrix_transpose(q("q8s", X[0]))
    with pytest.raises(ShapeError, match="must name each of the 3 axes exactly once"):
        ops.permute_dims(q("q8s", X3), (0, 0, 1))  # Burn's edge_repeated_axes
    with pytest.raises(ShapeError, match="axes must be a sequence"):
        ops.permute_dims(q("q8s", X3), 1)


# -- other backends -----------------------------------------------------------------------------
def _backend_ops(qt):
    return [
        ("T", lambda t: ops.matrix_transpose(t), np.transpose),
        ("reshape", lambda t: ops.reshape(t, (8, 32)), lambda a: a.reshape(8, 32)),
        ("getitem", lambda t: ops.getitem(t, (slice(None, None, -1), slice(32, 64))), lambda a: a[::-1, 32:64]),
        ("getitem_none", lambda t: ops.getitem(t, (None, 1)), lambda a: a[None, 1]),
        ("flip", lambda t: ops.flip(t, 0), lambda a: np.flip(a, 0)),
        ("take", lambda t: ops.take(t, [2, 0], 0), lambda a: a[[2, 0]]),
        (
            "broadcast",
            lambda t: ops.broadcast_to(ops.getitem(t, slice(0, 1)), (2, 64)),
            lambda a: np.broadcast_to(a[:1], (2, 64)),
        ),
        ("concat", lambda t: ops.concat([t, t], 0), lambda a: np.concatenate([a, a])),
        ("fallback", lambda t: ops.getitem(t, (slice(None), slice(3, 9))), None),
    ]


BACKEND_CASES = [
    *[(b, s) for b in ("array_api_strict", "torch") for s in ("q4s", "q8s:block32:f16", "nvfp4")],
    ("jax", "q4s:block32:f16"),  # JAX compiles every new shape: one scheme keeps the file fast
    ("dask", "q4s:block32:f16"),
]


@pytest.mark.parametrize(("backend", "scheme"), BACKEND_CASES)
def test_backends_match_numpy(backend: str, scheme: str) -> None:
    pytest.importorskip({"dask": "dask.array"}.get(backend, backend))
    qt = q(scheme)
    other = qt.to_backend(backend)
    for name, op, np_op in _backend_ops(qt):
        if backend == "jax" and name not in ("T", "getitem", "take", "concat"):
            continue  # JAX compiles every new shape: a few ops keep the file fast
        got, want = op(other), op(qt)
        np.testing.assert_array_equal(n(got.codes()), n(want.codes()), err_msg=name)
        np.testing.assert_array_equal(n(got.scales), n(want.scales), err_msg=name)
        np.testing.assert_array_equal(n(aq.dequantize(got)), n(aq.dequantize(want)), err_msg=name)
        if np_op is not None and ops.is_exact("getitem", qt, slice(None)):
            assert got.shape == np_op(n(qt.codes())).shape
    if backend == "dask":
        with pytest.raises(BackendUnavailableError, match="no lazy form on Dask"):
            ops.take_along_axis(other, np.zeros((4, 1), np.int64), 1)
    else:
        got = ops.take_along_axis(q("q8s").to_backend(backend), [[0], [1], [2], [3]], 1)
        np.testing.assert_array_equal(n(got.codes())[:, 0], n(q("q8s").codes())[[0, 1, 2, 3], [0, 1, 2, 3]])


def test_bad_index_arrays_are_typed_errors() -> None:
    qt = aq.quantize(np.ones((4, 64), np.float32), "q8s")
    with pytest.raises(ShapeError, match=r"indices of shape \(3, 2\) do not fit a tensor of shape \(4, 64\): axis 0"):
        ops.take_along_axis(qt, np.zeros((3, 2), np.int64), 1)
    with pytest.raises(ShapeError, match="take indices must be an integer array or a nested list of ints of one shape"):
        ops.take(qt, [[0], [1, 2]], 0)
    with pytest.raises(DTypeError, match="take indices must be an integer array, got a QuantizedTensor"):
        ops.take(qt, qt, 0)
    with pytest.raises(ShapeError, match=r"is_exact\('reshape', \.\.\.\) got arguments reshape does not take"):
        ops.is_exact("reshape", qt)
    # indices that broadcast over the other axes are fine, as in the Array API
    got = ops.take_along_axis(qt, np.zeros((1, 2), np.int64), 1)
    assert got.shape == (4, 2)


def test_concat_of_different_float_dtypes_requantizes() -> None:
    # one scheme, but the floats they stand for differ in dtype: the codes cannot simply be joined
    a = aq.quantize(np.array([0.1, 1.0], np.float32), "q8s")
    b = aq.quantize(np.array([0.1, 1.0], np.float16), "q8s")
    assert not ops.is_exact("concat", [a, b])
    joined = np.concatenate([aq.dequantize(a), aq.dequantize(b)])
    got = ops.concat([a, b])
    want = aq.quantize(joined, "q8s")
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.scales, want.scales)
