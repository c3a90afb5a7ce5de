"""The fused (Numba) affine kernels against the portable path, bit for bit.

The reference is ``aq.quantize`` / ``aq.dequantize`` with ``ARRAYQUANT_FUSED=0``: the portable Array
API kernels (``affinework.AffineSteps``, ``kernels/affine.py``, ``kernels/packing.py``). The fused
functions are called directly, and must not decline, so the comparison holds whether or not the
drivers dispatch to them. Values (dtype, shape, every bit), stored scales (f32 bits), zero points
(the codes' dtype) or offsets (f32 bits) and dequantized floats (f32 bits) must be equal.
"""

from __future__ import annotations

import array_api_compat.numpy as anp
import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba (pip install numba)")

import numba

import arrayquant as aq
from arrayquant.affinework import AffineSteps
from arrayquant.fused import numba_affine as na
from arrayquant.fused import registry
from arrayquant.invariants import plan_for
from arrayquant.scheme import QuantMode, QuantScheme

F32 = np.float32
F32_MAX = float(np.finfo(F32).max)

# the common cases first, then every width, signed zero points and the narrow scale dtypes
COMMON = [
    "u4:block128:bf16:zero_point",
    "u4:block32:f16:offset",
    "u4:block32:f16:zero_point",
    "u8:block32:f16:offset",
    "u8:zero_point",
    "u4:offset",
    "u4:block32:f32:packed_native:zero_point",
    "u4:block7:bf16:packed_native:offset",
    "u8:block16:bf16:native:zero_point",
    "u4:block32:f16:native:offset",
]
OTHERS = [
    "q4f:block32:f16:zero_point",
    "q8f:block16:bf16:zero_point",
    "q4f:native:zero_point",
    "q3s:block7:f32:zero_point",
    "q2f:block32:f16:packed_native:zero_point",
    "q6f:block32:f16:zero_point",
    "u1:block32:f16:zero_point",
    "u2:block16:bf16:offset",
    "u3:block32:f16:offset",
    "u3:block7:f32:packed_native:zero_point",
    "u5:block32:f16:offset",
    "u5:zero_point",
    "u6:block32:bf16:packed_native:offset",
    "u7:block5:f16:zero_point",
    "u7:native:offset",
    "u4:block32:ue8m0:zero_point",
    "u4:block16:ue4m3:zero_point",
    "q4f:block7:ue4m3:native:zero_point",
    "u8:block32:ue8m0:zero_point",
    "q4_1",
    "q5_1",
]
SCHEMES = COMMON + OTHERS
SHAPES = [(1,), (67,), (3, 45), (5, 128), (2, 3, 33), (7, 129), (2, 2, 3, 17)]


def _plan(scheme: str):  # type: ignore[no-untyped-def]
    return plan_for(QuantScheme.parse(scheme))


def _span(scheme: str) -> int:
    plan = _plan(scheme)
    return plan.qmax if plan.mode is QuantMode.OFFSET else plan.qmax - plan.qmin


def _block(scheme: str, shape: tuple[int, ...]) -> int:
    dims = _plan(scheme).block_dims(shape)
    return dims[-1] if dims else shape[-1]


def _data(kind: str, shape: tuple[int, ...], seed: int, scheme: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cols = shape[-1]
    if kind == "normal":
        return rng.standard_normal(shape).astype(F32)
    if kind == "positive":  # lo > 0: the zero point's range still holds 0
        return (rng.uniform(0.5, 3.0, shape)).astype(F32)
    if kind == "negative":
        return (-rng.uniform(0.5, 3.0, shape)).astype(F32)
    if kind == "outliers":
        x = rng.standard_normal(shape).astype(F32)
        flat = x.reshape(-1, cols)
        flat[:, :: max(cols // 3, 1)] *= F32(1e4)
        flat[1::2, -1] = F32(-3e4)
        return x
    if kind == "zeros":  # zero blocks and rows beside ordinary ones, -0.0 too
        x = rng.standard_normal(shape).astype(F32)
        x[..., : cols // 2] = 0.0
        x.reshape(-1, cols)[::3] = -0.0
        return x
    if kind == "allzero":
        x = np.zeros(shape, dtype=F32)
        x.reshape(-1)[::2] = -0.0
        return x
    if kind == "constant":  # every block one value: d = 0 where the offset is that value exactly
        x = np.full(shape, F32(-1.7), dtype=F32)
        x.reshape(-1, cols)[1::2] = F32(3.0)
        return x
    if kind == "f16max":  # around and past the f16 maximum: f16 scales and offsets saturate
        x = (rng.uniform(-1, 1, shape) * 2e6).astype(F32)
        flat = x.reshape(-1)
        flat[::5] = F32(65504.0)
        flat[1::7] = F32(-65520.0)
        return x
    if kind == "huge":  # near the f32 maximum: the range's difference overflows, decoding may too
        x = (rng.uniform(-1, 1, shape) * 3.4e38).astype(F32)
        flat = x.reshape(-1, cols)
        flat[:, 0] = np.finfo(F32).max
        flat[::2, -1] = -np.finfo(F32).max
        return x
    if kind == "subnormal":  # ranges and scales in the subnormal range of f32
        x = (rng.standard_normal(shape) * 1e-41).astype(F32)
        x.reshape(-1, cols)[1::2] *= F32(1e4)
        return x
    if kind == "tiny":
        return (rng.standard_normal(shape) * 1e-30).astype(F32)
    if kind == "ties":
        # every block holds 0 and the code span n: the scale is 1 (offset 0) on every scale dtype,
        # so each x = k + 0.5 is an exact rounding tie
        n = _span(scheme)
        b = _block(scheme, shape)
        x = (rng.integers(0, n, shape) + 0.5).astype(F32)
        col = np.arange(cols) % b
        x[..., col == 0] = 0.0
        x[..., col == 1] = F32(n)
        return x
    if kind == "zero_ties":
        # ranges lo = -(k + 0.5), hi = n + lo: s = 1 and qmin - lo / s is a tie, rounded to even
        n = _span(scheme)
        b = _block(scheme, shape)
        k = rng.integers(0, max(n - 1, 1), shape[:-1] + (1,)) + 0.5
        x = (rng.uniform(0, n, shape) - k).astype(F32)
        col = np.arange(cols) % b
        lo = (-k).astype(F32)
        x[..., col == 0] = np.broadcast_to(lo, x[..., col == 0].shape)
        x[..., col == 1] = np.broadcast_to(lo + F32(n), x[..., col == 1].shape)
        return x
    raise AssertionError(kind)


KINDS = (
    "normal",
    "positive",
    "negative",
    "outliers",
    "zeros",
    "allzero",
    "constant",
    "f16max",
    "huge",
    "subnormal",
    "tiny",
    "ties",
    "zero_ties",
)


def _mixed(shape: tuple[int, ...], seed: int, scheme: str) -> np.ndarray:
    """Rows of every data kind in one array (blocks lie within rows, so each block sees one kind)."""
    parts = [_data(k, shape, seed + i, scheme).reshape(-1, shape[-1]) for i, k in enumerate(KINDS)]
    return np.concatenate(parts, axis=0)


def _portable(x, scheme, monkeypatch, rounding="half_even", params=None):  # type: ignore[no-untyped-def]
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        with np.errstate(all="ignore"):
            return aq.quantize(x, scheme, params, rounding=rounding)


def _portable_dequantize(qt, monkeypatch):  # type: ignore[no-untyped-def]
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        with np.errstate(all="ignore"):
            return np.asarray(aq.dequantize(qt, "float32"))


def _second(qt: aq.QuantizedTensor) -> np.ndarray:
    return np.asarray(qt.zero_point if qt.zero_point is not None else qt.offset)


def _same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    want = np.asarray(want)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=what)


def _given(params: aq.QParams | None, plan, shape):  # type: ignore[no-untyped-def]
    """The static grids as the driver hands them to the kernel (scales rounded up, offsets down)."""
    if params is None:
        return None
    zero = params.zero_point if params.zero_point is not None else params.offset
    s, z = AffineSteps(plan, shape).stored(np.asarray(params.scales, F32), np.asarray(zero, F32), xp=anp)
    return np.asarray(s), np.asarray(z)


def _check(x, scheme, monkeypatch, rounding="half_even", params=None):  # type: ignore[no-untyped-def]
    """Fused quantize and dequantize equal the portable ones; returns the portable tensor."""
    plan = _plan(scheme)
    shape = tuple(x.shape)
    ref = _portable(x, scheme, monkeypatch, rounding, params)
    got = na.quantize(x, plan, _given(params, plan, shape), rounding)
    assert got is not None, scheme
    values, scales, zero = got
    _same_bits(values, ref.values, f"{scheme} values")
    _same_bits(scales, np.asarray(ref.scales, F32), f"{scheme} scales")
    _same_bits(zero, _second(ref), f"{scheme} zero")
    want = _portable_dequantize(ref, monkeypatch)
    y = na.dequantize(np.asarray(ref.values), np.asarray(ref.scales, F32), _second(ref).astype(F32), plan, shape)
    assert y is not None, scheme
    _same_bits(y, want, f"{scheme} dequantized")
    return ref


ROUNDINGS = ("half_even", "half_away")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_data_kind(scheme, monkeypatch):
    for rounding in ROUNDINGS:
        _check(_mixed((2, 45), 1, scheme), scheme, monkeypatch, rounding)
    if _plan(scheme).block_dims((3, 37)):
        return
    for kind in KINDS:  # per tensor: one kind per tensor, else the widest range hides the rest
        for rounding in ROUNDINGS:
            _check(_data(kind, (3, 37), 2, scheme), scheme, monkeypatch, rounding)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scheme", [*COMMON[:4], "u3:block7:f32:packed_native:zero_point", "u5:zero_point"])
def test_shapes(scheme, shape, monkeypatch):
    for rounding in ROUNDINGS:
        _check(_data("normal", shape, 3, scheme), scheme, monkeypatch, rounding)
        _check(_data("ties", shape, 4, scheme), scheme, monkeypatch, rounding)


@pytest.mark.parametrize("scheme", ["u4:block32:f16:zero_point", "u4:block32:f16:offset", "u8:zero_point"])
def test_ties_round_both_ways(scheme, monkeypatch):
    # ties data gives codes that differ between the roundings, so both are really exercised
    x = _data("ties", (4, 64), 5, scheme)
    even = _check(x, scheme, monkeypatch, "half_even")
    away = _check(x, scheme, monkeypatch, "half_away")
    assert not np.array_equal(np.asarray(even.codes()), np.asarray(away.codes()))


def test_worked_examples():
    # u4 zero point of [-1, 0, 0.5, 2]: s = 3/15 (f32 0.2), z = round(1 / 0.2) = 5;
    # codes -1/s -> -5 + 5 = 0, 0 -> 5, 0.5/s = 2.5 -> 2 (even) + 5 = 7, 2/s = 10 -> 15
    x = np.asarray([[-1.0, 0.0, 0.5, 2.0]], dtype=F32)
    got = na.quantize(x, _plan("u4:block4:f32:zero_point:native"), None, "half_even")
    assert got is not None
    assert got[0].tolist() == [[0, 5, 7, 15]]
    assert got[1].tolist() == [[float(F32(3.0) / F32(15.0))]]
    assert got[2].dtype == np.uint8
    assert got[2].tolist() == [[5]]
    # packed_u32: fields 0, 5, 7, 15 from the lowest bits of one word: 0xF750
    words = na.quantize(x, _plan("u4:block4:f32:zero_point"), None, "half_even")
    assert words is not None
    assert words[0].dtype == np.uint32
    assert hex(int(words[0][0, 0])) == "0xf750"
    # u4 offset of [1, 2.5, 4, 16, 1.5]: m = 1, d = 15 / 15 = 1; codes 0, 1.5 -> 2, 3, 15, 0.5 -> 0 or 1
    y = np.asarray([1.0, 2.5, 4.0, 16.0, 1.5], dtype=F32)
    off = na.quantize(y, _plan("u4:offset:native"), None, "half_even")
    assert off is not None
    assert off[0].tolist() == [0, 2, 3, 15, 0]
    assert off[1].tolist() == [1.0]
    assert off[2].dtype == np.float32
    assert off[2].tolist() == [1.0]
    away = na.quantize(y, _plan("u4:offset:native"), None, "half_away")
    assert away is not None
    assert away[0].tolist() == [0, 2, 3, 15, 1]


def test_odd_widths_cross_words():
    # u3 codes 0..7 repeated: 32 fields of 3 bits fill 3 words exactly, fields crossing word edges
    x = np.tile(np.arange(8, dtype=F32), 4)[None, :]
    got = na.quantize(x, _plan("u3:block32:f32:zero_point"), None, "half_even")
    assert got is not None
    assert got[1].tolist() == [[1.0]]
    stream = sum(k % 8 << (3 * k) for k in range(32))
    assert got[0].tolist() == [[(stream >> (32 * w)) & 0xFFFFFFFF for w in range(3)]]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_static_params(scheme, monkeypatch):
    plan = _plan(scheme)
    x = _mixed((2, 45), 9, scheme)
    # parameters from other data, so that codes saturate; zero scales where that data was 0
    other = _mixed((2, 45), 10, scheme)[::-1].copy()
    qo = _portable(other, scheme, monkeypatch)
    zero = _second(qo)
    if plan.mode is QuantMode.ZERO_POINT:
        params = aq.QParams(scales=np.asarray(qo.scales), zero_point=zero)
    else:
        params = aq.QParams(scales=np.asarray(qo.scales) * F32(1.3), offset=zero + F32(0.01))
    for rounding in ROUNDINGS:
        _check(x, scheme, monkeypatch, rounding, params=params)


def test_static_zero_points_any_in_range(monkeypatch):
    scheme = "q4f:block16:f16:zero_point"
    rng = np.random.default_rng(21)
    x = rng.standard_normal((6, 48)).astype(F32)
    grid = _plan(scheme).grid_shape(x.shape)
    s = rng.uniform(0, 0.5, grid).astype(F32)
    s[0, 0] = 0.0  # a zero scale: every code is the zero point
    z = rng.integers(-8, 8, grid).astype(np.int8)
    for rounding in ROUNDINGS:
        _check(x, scheme, monkeypatch, rounding, params=aq.QParams(scales=s, zero_point=z))


def test_non_contiguous(monkeypatch):
    base = _data("normal", (6, 80), 7, "u4")
    for x in (base[:, ::2], base.T, base[::2, 3:50]):
        assert not x.flags.c_contiguous
        for scheme in ("u4:block16:f16:zero_point", "u8:offset", "u4:block32:f16:offset"):
            _check(x, scheme, monkeypatch)


def _random_tensor(scheme: str, shape: tuple[int, ...], seed: int) -> aq.QuantizedTensor:
    """Random stored values of the layout (padding bits included) under random parameters."""
    from arrayquant.storage import values_layout

    plan = _plan(scheme)
    rng = np.random.default_rng(seed)
    vshape, vdtype = values_layout(plan, shape)
    if plan.packed_axis(len(shape)) is None:  # native codes within the value's range
        values = rng.integers(plan.qmin, plan.qmax + 1, vshape).astype(vdtype)
    else:
        top = int(np.iinfo(np.dtype(vdtype)).max)
        values = rng.integers(0, top + 1, vshape, dtype=np.uint64).astype(vdtype)
    grid = plan.grid_shape(shape)
    s = (rng.standard_normal(grid) ** 2).astype(F32)
    s.reshape(-1)[::5] = 0.0
    if plan.mode is QuantMode.ZERO_POINT:
        z = rng.integers(plan.qmin, plan.qmax + 1, grid).astype(plan.code_dtype)
        return aq.QuantizedTensor(plan.scheme, shape, np.float32, values, s, zero_point=z)
    m = rng.standard_normal(grid).astype(F32)
    return aq.QuantizedTensor(plan.scheme, shape, np.float32, values, s, offset=m)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_random_stored_values_dequantize(scheme, monkeypatch):
    plan = _plan(scheme)
    for shape in ((3, 45), (70,), (2, 2, 33)):
        qt = _random_tensor(scheme, shape, len(scheme))
        want = _portable_dequantize(qt, monkeypatch)
        got = na.dequantize(np.asarray(qt.values), np.asarray(qt.scales, F32), _second(qt).astype(F32), plan, shape)
        assert got is not None
        _same_bits(got, want, scheme)


@pytest.mark.parametrize("scheme", ["u8:zero_point", "u4:block32:f32:offset", "q8f:block16:f32:zero_point"])
def test_overflowing_products_saturate(scheme, monkeypatch):
    plan = _plan(scheme)
    shape = (2, 64)
    qt = _random_tensor(scheme, shape, 3)
    big = np.full(plan.grid_shape(shape), F32(3e37), dtype=F32)
    if qt.zero_point is not None:
        qt = aq.QuantizedTensor(plan.scheme, shape, np.float32, qt.values, big, zero_point=qt.zero_point)
    else:
        m = np.asarray(qt.offset) * F32(1e37)
        qt = aq.QuantizedTensor(plan.scheme, shape, np.float32, qt.values, big, offset=m)
    want = _portable_dequantize(qt, monkeypatch)
    assert np.abs(want).max() == F32_MAX  # the portable path clipped something
    got = na.dequantize(np.asarray(qt.values), big, _second(qt).astype(F32), plan, shape)
    assert got is not None
    _same_bits(got, want, scheme)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize(
    "scheme", ["u4:block128:bf16:zero_point", "u4:block32:f16:offset", "u8:zero_point", "u4:offset"]
)
def test_non_finite_declines(scheme, bad):
    plan = _plan(scheme)
    x = np.ones((3, 40), dtype=F32)
    x[2, 39] = bad
    assert na.quantize(x, plan, None, "half_even") is None
    grid = plan.grid_shape(x.shape)
    given = (np.ones(grid, F32), np.zeros(grid, F32))
    assert na.quantize(x, plan, given, "half_even") is None


def test_static_offset_over_zero_scale_declines():
    # x - m past the f32 maximum over d = 0 is inf / inf: left to the portable path
    plan = _plan("u4:block4:f32:offset")
    x = np.asarray([[3e38, 0.0, 1.0, 2.0]], dtype=F32)
    given = (np.zeros((1, 1), F32), np.full((1, 1), F32(-3e38)))
    assert na.quantize(x, plan, given, "half_even") is None
    given_ok = (np.zeros((1, 1), F32), np.zeros((1, 1), F32))
    hit = na.quantize(x, plan, given_ok, "half_even")
    assert hit is not None
    assert hit[0].tolist() == [[0]]


def test_dequantize_declines_what_it_does_not_fit():
    plan = _plan("u4:block32:f16:zero_point")
    shape = (2, 64)
    qt = _random_tensor("u4:block32:f16:zero_point", shape, 5)
    values, s, z = np.asarray(qt.values), np.asarray(qt.scales, F32), _second(qt).astype(F32)
    assert na.dequantize(values, s, z, plan, shape) is not None
    assert na.dequantize(values.astype(np.int64), s, z, plan, shape) is None  # not the stored dtype
    assert na.dequantize(values[:, :1], s, z, plan, shape) is None  # not the stored shape
    assert na.dequantize(values, s[:, :1], z, plan, shape) is None  # not the grid
    for bad in (np.nan, np.inf, -1.0):
        s_bad = s.copy()
        s_bad[0, 0] = bad
        assert na.dequantize(values, s_bad, z, plan, shape) is None
    z_bad = z.copy()
    z_bad[1, 1] = np.nan
    assert na.dequantize(values, s, z_bad, plan, shape) is None
    assert na.dequantize(values.tolist(), s, z, plan, shape) is None  # type: ignore[arg-type]
    assert na.dequantize(values, s.tolist(), z, plan, shape) is None


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_dtypes_decline(dtype):
    plan = _plan("u4:block32:f16:zero_point")
    assert na.quantize(np.ones((2, 32), dtype=dtype), plan, None, "half_even") is None


def test_unknown_rounding_and_mismatched_grids_decline():
    plan = _plan("u4:block32:f16:offset")
    x = np.ones((2, 64), dtype=F32)
    assert na.quantize(x, plan, None, "half_up") is None
    assert na.quantize(x, plan, (np.ones((2, 1), F32), np.zeros((2, 1), F32)), "half_even") is None


@pytest.mark.parametrize(
    ("scheme", "shape", "reason"),
    [
        ("q4s:block32:f16", (4, 64), "symmetric mode is not an affine mode"),
        ("nf4", (4, 64), "lookup mode is not an affine mode"),
        ("u4:block4x8:f16:zero_point", (8, 16), "blocks spanning more than the last axis are not fused"),
        ("u4:packed_u32:1:offset", (8, 16), "packing along an axis other than the last is not fused"),
        ("u4:packed_u32:1:zero_point", (16,), "the packed axis does not exist for this rank"),
        ("u4:zero_point", (), "0-d data is not fused"),
        ("u4:zero_point", (3, 0), "empty data is not fused"),
    ],
)
def test_supports_reasons(scheme, shape, reason):
    plan = _plan(scheme)
    assert na.supports(plan, shape) == reason
    if shape and 0 not in shape:
        x = np.ones(shape, F32)
        assert na.quantize(x, plan, None, "half_even") is None
        assert registry.affine_quantize_kernel(x, plan, shape) is None


@pytest.mark.parametrize("scheme", [*SCHEMES, "u4:block1x32:f16:zero_point", "u4:block32:f16:packed_u32:0:offset"])
def test_supports_covered(scheme):
    assert na.supports(_plan(scheme), (2, 8, 64)) == ""


def test_quantize_and_dequantize_use_the_kernels(monkeypatch):
    seen: list[str] = []
    for name in ("quantize", "dequantize"):
        real = getattr(na, name)

        def spy(*args, _real=real, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            out = _real(*args, **kwargs)
            seen.append(_name if out is not None else f"{_name} declined")
            return out

        monkeypatch.setattr(na, name, spy)
    monkeypatch.delenv("ARRAYQUANT_FUSED", raising=False)
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(F32)
    for scheme in ("u4:block128:bf16:zero_point", "u4:block32:f16:offset", "u8:zero_point", "q4_1"):
        qt = aq.quantize(x, scheme)
        aq.dequantize(qt)
        zero = _second(qt)
        if _plan(scheme).mode is QuantMode.ZERO_POINT:
            params = aq.QParams(scales=qt.scales, zero_point=zero)
        else:
            params = aq.QParams(scales=qt.scales, offset=zero)
        static = aq.quantize(x, scheme, params)
        np.testing.assert_array_equal(np.asarray(static.values), np.asarray(qt.values))
    assert seen == ["quantize", "dequantize", "quantize"] * 4
    seen.clear()
    with aq.fused_kernels(False):
        aq.dequantize(aq.quantize(x, "u4:block32:f16:offset"))
    assert seen == []
    x[3, 7] = np.nan  # NaN: the kernel declines and the portable path reports it
    with pytest.raises(aq.NonFiniteInputError):
        aq.quantize(x, "u4:block32:f16:offset")
    assert seen == ["quantize declined"]


@pytest.mark.parametrize("scheme", ["u4:block128:bf16:zero_point", "u4:block32:f16:offset", "u5:offset"])
def test_driver_gives_the_portable_tensor(scheme, monkeypatch):
    x = _mixed((3, 300), 31, scheme)
    ref = _portable(x, scheme, monkeypatch)
    monkeypatch.delenv("ARRAYQUANT_FUSED", raising=False)
    qt = aq.quantize(x, scheme)
    _same_bits(np.asarray(qt.values), ref.values, "values")
    _same_bits(np.asarray(qt.scales), np.asarray(ref.scales), "scales")
    _same_bits(_second(qt), _second(ref), "zero")
    _same_bits(np.asarray(aq.dequantize(qt, "float32")), _portable_dequantize(ref, monkeypatch), "dequantized")
    assert aq.to_bytes(qt) == aq.to_bytes(ref)


def test_thread_count_does_not_change_result(monkeypatch):
    scheme = "u4:block32:f16:offset"
    x = _mixed((4, 300), 13, scheme)
    plan = _plan(scheme)
    from arrayquant.fused import threads

    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)  # small data on every thread too
    monkeypatch.setenv("ARRAYQUANT_THREADS", "1")
    one = na.quantize(x, plan, None, "half_even")
    assert one is not None
    d_one = na.dequantize(one[0], one[1], one[2], plan, x.shape)
    monkeypatch.setenv("ARRAYQUANT_THREADS", str(numba.config.NUMBA_NUM_THREADS))
    many = na.quantize(x, plan, None, "half_even")
    assert many is not None
    for a, b in zip(one, many, strict=True):
        np.testing.assert_array_equal(a, b)
    d_many = na.dequantize(many[0], many[1], many[2], plan, x.shape)
    assert d_one is not None
    assert d_many is not None
    _same_bits(d_one, d_many, "dequantized")
