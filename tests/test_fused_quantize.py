"""The fused (Numba) MinMax quantize and encode kernels against the portable path, bit for bit.

The reference is ``aq.quantize(x, scheme)`` (or ``params=``) with ``ARRAYQUANT_FUSED=0``: the
portable Array API kernels. The fused functions are called directly, so the comparison holds
whether or not the drivers dispatch to them. Values (dtype, shape, every bit), stored scales (f32
bits) and the two-level global must be equal.
"""

from __future__ import annotations

import array_api_compat.numpy as anp
import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba (pip install numba)")

import numba

import arrayquant as aq
from arrayquant.fused import numba_quantize as nq
from arrayquant.invariants import plan_for
from arrayquant.kernels.minifloat import encode as portable_encode
from arrayquant.kernels.roundup import round_up_scales
from arrayquant.scheme import QuantScheme, QuantValue, ScaleDtype

INTS = ("q8s", "q8f", "q4s", "q4f", "q2s", "q2f")
FLOATS = ("e4m3", "e5m2", "e2m1")
DTYPES = ("f32", "f16", "bf16", "ue4m3", "ue8m0")


def _schemes(blocks: tuple[int, ...], dtypes: tuple[str, ...]) -> list[str]:
    """Valid scheme texts: every value per tensor and in blocks, each store it allows, two-level and OCP."""
    out = []
    for v in INTS + FLOATS:
        stores = ["", ":native"] + ([":packed_native"] if v == "e2m1" else [])
        for st in stores:
            out.append(f"{v}{st}")
            for b in blocks:
                out += [f"{v}:block{b}:{d}{st}" for d in dtypes]
        out.append(f"{v}:block16:ue4m3:tensor:f32")  # two-level
        out.append(f"{v}:block7:f16:tensor:f32:native")
    out += ["e4m3:block32:ue8m0:ocp", "e2m1:block32:ue8m0:packed_native:ocp", "e5m2:block7:ue8m0:native:ocp"]
    out += ["nvfp4", "mxfp8", "mxfp4", "q8_0", "q4_0", "tq2_0"]
    return out


QUICK = [
    "q8s",
    "q8f:native",
    "q4s:block32:f16",
    "q4f:block7:bf16:native",
    "q2s:block16:ue8m0",
    "q2f:block32:ue4m3:native",
    "q8s:block16:ue4m3:tensor:f32",
    "e4m3:block7:f32",
    "e5m2",
    "e2m1:block16:f16:packed_native",
    "e4m3:block32:ue8m0:ocp",
    "nvfp4",
    "mxfp8",
    "mxfp4",
]


def _half_span(scheme: str) -> float:
    return plan_for(QuantScheme.parse(scheme)).value.span / 2


def _data(kind: str, shape: tuple[int, ...], seed: int, scheme: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    if kind == "normal":
        return rng.standard_normal(shape).astype(f32)
    if kind == "heavy":  # Student t: rare huge values
        return rng.standard_t(1.5, shape).astype(f32)
    if kind == "zeros":  # zero blocks and rows beside ordinary ones, -0.0 too
        x = rng.standard_normal(shape).astype(f32)
        x[..., : shape[-1] // 2] = 0.0
        x.reshape(-1, shape[-1])[::3] = -0.0
        return x
    if kind == "ties":
        # exact halves k + 0.5 in blocks (and tensors) whose max|x| is span / 2: the scale is 1 on
        # every scale dtype, so each such x / scale is an exact rounding tie
        h = _half_span(scheme)
        x = (rng.integers(-int(h), int(h), shape) + 0.5).astype(f32)
        x[np.abs(x) > h] = f32(0.5)
        flat = x.reshape(-1, shape[-1])
        for c in range(shape[-1]):
            if c % 7 == 0 or c % 16 == 0:
                flat[:, c] = f32(h) if c % 2 == 0 else f32(-h)
        return x
    if kind == "subnormal":  # scales and codes in the subnormal range of f32
        x = rng.standard_normal(shape).astype(f32) * f32(1e-41)
        x.reshape(-1, shape[-1])[1::2] *= f32(1e4)
        return x
    if kind == "huge":  # near the top of f32: scales and effective scales saturate
        x = (rng.uniform(-1, 1, shape) * 3.4e38).astype(f32)
        x.reshape(-1)[0] = np.finfo(f32).max
        return x
    if kind == "tiny":
        return (rng.standard_normal(shape) * 1e-30).astype(f32)
    if kind == "equal":  # all-equal blocks
        return np.full(shape, f32(-1.7), dtype=f32)
    if kind == "allzero":  # a zero scale everywhere, -0.0 included
        x = np.zeros(shape, dtype=f32)
        x.reshape(-1)[::2] = -0.0
        return x
    raise AssertionError(kind)


KINDS = ("normal", "heavy", "zeros", "ties", "subnormal", "huge", "tiny", "equal", "allzero")


def _portable(x, scheme, monkeypatch, rounding="half_even", params=None):
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        qt = aq.quantize(x, scheme, params, rounding=rounding)
    return qt


def _check(x, scheme, monkeypatch, rounding="half_even"):
    """Fused quantize equals the portable one: values, stored scales and global."""
    ref = _portable(x, scheme, monkeypatch, rounding)
    got = nq.quantize(x, plan_for(QuantScheme.parse(scheme)), rounding)
    assert got is not None, scheme
    values, scales, glob = got
    want = np.asarray(ref.values)
    assert values.dtype == want.dtype, (scheme, values.dtype)
    assert values.shape == want.shape, (scheme, values.shape)
    np.testing.assert_array_equal(values, want, err_msg=scheme)
    ws = np.asarray(ref.scales, dtype=np.float32)
    assert scales.dtype == np.float32
    assert scales.shape == ws.shape, (scheme, scales.shape, ws.shape)
    np.testing.assert_array_equal(scales.view(np.uint32), ws.view(np.uint32), err_msg=scheme)
    if ref.global_scale is None:
        assert glob is None
    else:
        wg = np.asarray(ref.global_scale, dtype=np.float32)
        assert glob is not None
        assert glob.dtype == np.float32
        assert glob.shape == (1,)
        np.testing.assert_array_equal(glob.view(np.uint32), wg.view(np.uint32), err_msg=scheme)
    return ref


def _roundings(scheme: str) -> tuple[str, ...]:
    return ("half_even",) if plan_for(QuantScheme.parse(scheme)).value.is_float else ("half_even", "half_away")


def _mixed(shape: tuple[int, ...], seed: int, scheme: str) -> np.ndarray:
    """Rows of every data kind in one array (blocks lie within rows, so each block sees one kind)."""
    parts = [_data(k, shape, seed + i, scheme).reshape(-1, shape[-1]) for i, k in enumerate(KINDS)]
    return np.concatenate(parts, axis=0)


@pytest.mark.parametrize("scheme", QUICK)
def test_quick_matrix(scheme, monkeypatch):
    for rounding in _roundings(scheme):
        _check(_mixed((2, 45), 1, scheme), scheme, monkeypatch, rounding)
        for kind in KINDS:  # per tensor: one kind per tensor, else the largest hides the rest
            _check(_data(kind, (3, 37), 2, scheme), scheme, monkeypatch, rounding)


@pytest.mark.parametrize("shape", [(1,), (5,), (33,), (70,), (2, 1), (3, 9), (2, 3, 33), (2, 2, 3, 17)])
@pytest.mark.parametrize(
    "scheme", ["q4s:block32:f16", "q2f", "e2m1:block16:ue4m3:tensor:f32:packed_native", "q8f:block7:bf16"]
)
def test_shapes(scheme, shape, monkeypatch):
    for rounding in _roundings(scheme):
        _check(_data("normal", shape, 3, scheme), scheme, monkeypatch, rounding)


def test_ties_round_both_ways(monkeypatch):
    # ties data gives codes that differ between the two roundings, so each is really exercised
    x = _data("ties", (4, 32), 5, "q8s:block32:f32")
    even = _check(x, "q8s:block32:f32", monkeypatch, "half_even")
    away = _check(x, "q8s:block32:f32", monkeypatch, "half_away")
    assert not np.array_equal(np.asarray(even.codes()), np.asarray(away.codes()))
    # x = 0.5, 1.5, 2.5 at scale 1: ties to even give 0, 2, 2; away from zero 1, 2, 3
    y = np.asarray([127.0, 0.5, 1.5, 2.5, -0.5, -2.5], dtype=np.float32)
    plan = plan_for(QuantScheme.parse("q8s:native"))
    got_even = nq.quantize(y, plan, "half_even")
    got_away = nq.quantize(y, plan, "half_away")
    assert got_even is not None
    assert got_away is not None
    assert got_even[0].tolist() == [127, 0, 2, 2, 0, -2]
    assert got_away[0].tolist() == [127, 1, 2, 3, -1, -3]


def test_packed_words_worked_example():
    # q4s of [7, -1, 2] at scale 1: fields 0x7, 0xF, 0x2 from the lowest bits, padded to 8 fields
    plan = plan_for(QuantScheme.parse("q4s"))
    got = nq.quantize(np.asarray([[7.0, -1.0, 2.0]], dtype=np.float32), plan, "half_even")
    assert got is not None
    assert got[0].dtype == np.uint32
    assert got[0].shape == (1, 1)
    assert hex(int(got[0][0, 0])) == "0x2f7"
    assert got[1].tolist() == [1.0]


def test_non_contiguous(monkeypatch):
    base = _data("normal", (6, 80), 7, "q4s")
    for x in (base[:, ::2], base.T, base[::2, 3:50]):
        assert not x.flags.c_contiguous
        for scheme in ("q4s:block16:f16", "q8s", "nvfp4", "e4m3:block7:ue8m0:native"):
            _check(x, scheme, monkeypatch)


@pytest.mark.parametrize("scheme", ["q8s", "q4s:block16:f16", "nvfp4", "mxfp8", "e5m2:native"])
def test_static_encode(scheme, monkeypatch):
    plan = plan_for(QuantScheme.parse(scheme))
    x = _mixed((2, 45), 9, scheme)
    # scales from other data, so that codes saturate and scales are zero where that data was
    other = _mixed((2, 45), 10, scheme)[::-1].copy()
    lo, hi = aq.compute_range(other, scheme)
    params = aq.compute_q_params(scheme, lo, hi)
    for rounding in _roundings(scheme):
        ref = _portable(x, scheme, monkeypatch, rounding, params=params)
        stored = np.asarray(ref.scales, dtype=np.float32)
        glob = None if ref.global_scale is None else np.asarray(ref.global_scale, dtype=np.float32)
        got = nq.encode(x, plan, stored, glob, rounding)
        assert got is not None
        want = np.asarray(ref.values)
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_encode_global_mismatch_declines():
    plan = plan_for(QuantScheme.parse("nvfp4"))
    x = np.ones((1, 16), dtype=np.float32)
    assert nq.encode(x, plan, np.ones((1, 1), np.float32), None, "half_even") is None


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("scheme", ["q8s", "q4s:block32:f16", "nvfp4", "mxfp8"])
def test_non_finite_declines(scheme, bad):
    plan = plan_for(QuantScheme.parse(scheme))
    x = np.ones((3, 40), dtype=np.float32)
    x[2, 39] = bad
    assert nq.quantize(x, plan, "half_even") is None
    grid = plan.grid_shape(x.shape)
    glob = np.ones(1, np.float32) if plan.two_level else None
    assert nq.encode(x, plan, np.ones(grid, np.float32), glob, "half_even") is None


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_dtypes_decline(dtype):
    plan = plan_for(QuantScheme.parse("q8s:block32:f16"))
    x = np.ones((2, 32), dtype=dtype)
    assert nq.quantize(x, plan, "half_even") is None
    assert nq.encode(x, plan, np.ones((2, 1), np.float32), None, "half_even") is None


@pytest.mark.parametrize(
    ("scheme", "shape", "reason"),
    [
        ("nf4", (4, 64), "lookup mode is not fused"),
        ("q4s:lookup", (4, 64), "lookup mode is not fused"),
        ("q4s:block4x8:f16", (8, 16), "blocks spanning more than the last axis are not fused"),
        ("q4s:packed_u32:1", (8, 16), "packing along an axis other than the last is not fused"),
        ("q4s:packed_u32:1", (16,), "the packed axis does not exist for this rank"),
        ("q4s", (), "0-d data is not fused"),
    ],
)
def test_supports_reasons(scheme, shape, reason):
    assert nq.supports(plan_for(QuantScheme.parse(scheme)), shape) == reason
    if shape:
        assert nq.quantize(np.ones(shape, np.float32), plan_for(QuantScheme.parse(scheme)), "half_even") is None


@pytest.mark.parametrize(
    ("scheme", "covered"),
    [
        ("q8s", True),
        ("q2f:native", True),
        ("nvfp4", True),
        ("e4m3:block32:ue8m0:native:ocp", True),
        ("q4s:block1x8:f16", True),  # a 2-D block of one row is a 1-D block along the last axis
        ("q4s:block2x8:f16", False),
    ],
)
def test_supports_covered(scheme, covered):
    assert (nq.supports(plan_for(QuantScheme.parse(scheme)), (2, 8, 8)) == "") is covered


def _patterns(n: int, seed: int) -> np.ndarray:
    """``n`` random f32 bit patterns (NaN, inf, subnormals, negatives included) plus edge values."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edge = np.asarray(
        [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, 3.4028235e38,
         448, 464, 480, 57344, 61440, 6, 5, 5.0000005, 0.25, 0.75, 2.5, 3.5, 1.75, 1.25, 65504, 65520, 2**-24, 2**-25,
         2**-127, 2**-126, 2**-133, 2**-134, 0.3, 1.0012],
        dtype=np.float32,
    )  # fmt: skip
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    near = np.concatenate([powers, np.nextafter(powers, np.float32(0)), np.nextafter(powers, np.float32(np.inf))])
    return np.concatenate([y, edge, -edge, near, near * np.float32(1.5), near * np.float32(1.25)])


@pytest.mark.parametrize("value", [QuantValue.E4M3, QuantValue.E5M2, QuantValue.E2M1])
def test_encode_minifloat_random_patterns(value):
    y = _patterns(2_000_000, int(value.bits) + len(value.value))
    with np.errstate(all="ignore"):
        want = np.asarray(portable_encode(y, value, xp=anp))
    got = nq.encode_minifloat(y, value)
    assert got.dtype == np.uint8
    assert got.shape == y.shape
    np.testing.assert_array_equal(got, want)


def test_encode_minifloat_worked_values():
    y = np.asarray([1.0, np.nan, -0.0, 0.1, 500.0, -np.inf], dtype=np.float32)
    # E4M3: 1.0 = 0x38, NaN = 0x7F, -0 = 0x80, 0.1 -> 0.1015625 = 0x1D, saturate at 448 = 0x7E / 0xFE
    assert nq.encode_minifloat(y, QuantValue.E4M3).tolist() == [0x38, 0x7F, 0x80, 0x1D, 0x7E, 0xFE]
    # E2M1: NaN encodes as +0, -0 keeps its sign (0x8), 500 saturates at 6 = 0x7
    assert nq.encode_minifloat(y, QuantValue.E2M1).tolist() == [0x2, 0x0, 0x8, 0x0, 0x7, 0xF]


@pytest.mark.parametrize("dtype", list(ScaleDtype))
def test_round_up_random_patterns(dtype):
    s = _patterns(2_000_000, 11 + len(dtype.value))
    with np.errstate(all="ignore"):
        want = np.asarray(round_up_scales(s, dtype, xp=anp))
    got = nq.round_up(s, dtype)
    assert got.dtype == np.float32
    assert got.shape == s.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_round_up_worked_values():
    s = np.asarray([0.3, 1e-3, 500.0, 0.0, -0.0], dtype=np.float32)
    assert nq.round_up(s, ScaleDtype.UE4M3).tolist() == [0.3125, 2.0**-9, 448.0, 0.0, 0.0]
    assert nq.round_up(s, ScaleDtype.UE8M0).tolist() == [0.5, 2.0**-9, 512.0, 2.0**-127, 2.0**-127]


def test_thread_count_does_not_change_result(monkeypatch):
    x = _mixed((4, 300), 13, "nvfp4")
    plan = plan_for(QuantScheme.parse("nvfp4"))
    from arrayquant.fused import threads

    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)  # small data on every thread too
    monkeypatch.setenv("ARRAYQUANT_THREADS", "1")
    one = nq.quantize(x, plan, "half_even")
    monkeypatch.setenv("ARRAYQUANT_THREADS", str(numba.config.NUMBA_NUM_THREADS))
    many = nq.quantize(x, plan, "half_even")
    assert one is not None
    assert many is not None
    for a, b in zip(one, many, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", _schemes((32, 16, 7), DTYPES))
def test_full_matrix(scheme, monkeypatch):
    for rounding in _roundings(scheme):
        for shape in ((3, 45), (2, 3, 16), (67,)):
            _check(_mixed(shape, 17, scheme), scheme, monkeypatch, rounding)
            for kind in KINDS:
                _check(_data(kind, shape, 19, scheme), scheme, monkeypatch, rounding)
