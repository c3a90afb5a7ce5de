"""The fused (Numba) MSE search of minifloat schemes against the portable path, bit for bit.

The reference is ``aq.quantize(x, scheme, calibration=...)`` with ``ARRAYQUANT_FUSED=0``: codes,
stored scale bits and the two-level global must be the same, and the dispatching driver must give
the same stored values as the portable one.
"""

from __future__ import annotations

import array_api_compat
import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba (pip install numba)")

import arrayquant as aq
from arrayquant.fused.numba_search import FLOAT_ROWS, mse_float_codes_and_scales, supports
from arrayquant.invariants import plan_for
from arrayquant.invariants.importance import check_importance
from arrayquant.invariants.plan import check_calibration_spec
from arrayquant.scheme import QuantScheme

SCHEMES = [
    "mxfp4",
    "nvfp4",
    "mxfp8",
    "e4m3:block32:f16:native",
    "e4m3:block16:ue4m3:native",
    "e5m2:block32:bf16:native",
    "e2m1:block32:ue8m0:packed_native:ocp",
    "e2m1:block16:ue4m3",
]
KINDS = ["normal", "heavy", "zeros", "outliers", "tiny", "subnormal", "huge", "grid"]


def _data(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "heavy":  # Student t with 1.5 degrees of freedom: rare huge values
        return rng.standard_t(1.5, shape).astype(np.float32)
    if kind == "zeros":  # whole zero blocks and rows, and -0.0, beside ordinary ones
        x = rng.standard_normal(shape).astype(np.float32)
        x[..., : shape[-1] // 2] = 0.0
        x.reshape(-1, shape[-1])[::3] = -0.0
        return x
    if kind == "outliers":
        x = rng.standard_normal(shape).astype(np.float32)
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, max(flat.size // 50, 1))] *= 1e4
        return x
    if kind == "tiny":  # below the smallest E2M1/E4M3 step of most candidate scales
        return (rng.standard_normal(shape) * 1e-30).astype(np.float32)
    if kind == "subnormal":
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(1e-41)
        x.reshape(-1, shape[-1])[1::2] *= np.float32(1e5)
        return x
    if kind == "huge":  # near the top of f32: decoded values overflow to inf in the search
        return (rng.uniform(-1, 1, shape) * 3e38).astype(np.float32)
    if kind == "grid":  # E2M1 values: many exact ties at the MinMax scale
        vals = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6], np.float32)
        return (rng.choice(vals, shape) * rng.choice(np.array([-1, 1], np.float32), shape)).astype(np.float32)
    raise AssertionError(kind)


def _portable(x, scheme, cal, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        return aq.quantize(x, scheme, calibration=cal, **kw)


def _fused(x, scheme, cal, importance=None):
    plan = plan_for(QuantScheme.parse(scheme))
    spec = check_calibration_spec(cal, plan)
    imp = None
    if importance is not None:
        imp = check_importance(importance, spec.kind, tuple(x.shape), array_api_compat.array_namespace(x), "cpu")
    return mse_float_codes_and_scales(x, plan, spec.factors, spec.norm, imp)


def _bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def _assert_same(got, qt):
    """``got`` (kernel output) equals the portable QuantizedTensor ``qt``: codes, scale and global bits."""
    assert got is not None
    codes, scales, glob = got
    assert codes.dtype == np.uint8
    assert scales.dtype == np.float32
    np.testing.assert_array_equal(codes, np.asarray(qt.codes()))
    np.testing.assert_array_equal(_bits(scales), _bits(qt.scales))
    if qt.global_scale is None:
        assert glob is None
    else:
        assert glob is not None
        assert glob.shape == (1,)
        np.testing.assert_array_equal(_bits(glob), _bits(qt.global_scale))


def _assert_driver_same(x, scheme, cal, monkeypatch, **kw):
    """The dispatching ``aq.quantize`` stores what the portable one stores."""
    want = _portable(x, scheme, cal, monkeypatch, **kw)
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "1")
        got = aq.quantize(x, scheme, calibration=cal, **kw)
    np.testing.assert_array_equal(np.asarray(got.values), np.asarray(want.values))
    np.testing.assert_array_equal(_bits(got.scales), _bits(want.scales))
    if want.global_scale is None:
        assert got.global_scale is None
    else:
        np.testing.assert_array_equal(_bits(got.global_scale), _bits(want.global_scale))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_bits_as_portable(kind, scheme, monkeypatch):
    x = _data(kind, (24, 96), sum(map(ord, kind + scheme)) % 1000)
    _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))


@pytest.mark.parametrize("cal", ["mse:norm=2", "mse:norm=1", "mse:grid=50,max_shrink=0.5,norm=3.7"])
@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "mxfp8"])
def test_same_bits_norms_and_grids(cal, scheme, monkeypatch):
    x = _data("heavy", (16, 128), 7)
    _assert_same(_fused(x, scheme, cal), _portable(x, scheme, cal, monkeypatch))


@pytest.mark.parametrize(
    "shape",
    [(40, 100), (3, 7), (1, 33), (300,), (4, 6, 70), (2, 1)],
    ids=["partial-block", "block-longer-than-row", "one-row", "1d", "3d", "one-column"],
)
@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "e4m3:block32:f16:native"])
def test_same_bits_partial_and_other_shapes(shape, scheme, monkeypatch):
    x = _data("outliers", shape, 3)
    for cal in ("mse", "mse:norm=2"):
        _assert_same(_fused(x, scheme, cal), _portable(x, scheme, cal, monkeypatch))
        _assert_driver_same(x, scheme, cal, monkeypatch)


@pytest.mark.parametrize("cal", ["mse", "mse:norm=2"])
@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "mxfp8", "e4m3:block32:f16:native"])
def test_same_bits_with_importance(cal, scheme, monkeypatch):
    rng = np.random.default_rng(11)
    x = _data("heavy", (20, 100), 5)
    v = rng.uniform(0, 3, 100).astype(np.float32)
    v[::7] = 0.0  # zero weights: those columns do not count
    want = _portable(x, scheme, cal, monkeypatch, importance=v)
    _assert_same(_fused(x, scheme, cal, importance=v), want)
    _assert_driver_same(x, scheme, cal, monkeypatch, importance=v)


def test_importance_changes_the_choice(monkeypatch):
    # the weights must matter on this data, else the importance tests could not tell them from none
    rng = np.random.default_rng(11)
    x = _data("heavy", (20, 100), 5)
    v = rng.uniform(0, 3, 100).astype(np.float32)
    v[::7] = 0.0
    got = _fused(x, "nvfp4", "mse", importance=v)
    plain = _fused(x, "nvfp4", "mse")
    assert got is not None
    assert plain is not None
    assert not np.array_equal(got[1], plain[1])


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "mxfp8", "e4m3:block32:f16:native"])
def test_same_bits_float16_input(scheme, monkeypatch):
    x = _data("heavy", (32, 64), 9).astype(np.float16)
    _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))
    _assert_driver_same(x, scheme, "mse", monkeypatch)


def test_codes_decode_as_ml_dtypes_does():
    # independent oracle for the encoder: codes over the chosen scales are ml_dtypes' casts
    x = _data("normal", (8, 64), 2)
    got = _fused(x, "e4m3:block32:f32:native", "mse")
    assert got is not None
    codes, scales, _ = got
    eff = np.repeat(scales, 32, axis=-1)
    want = (x / eff).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(codes, want)
    fp4 = _fused(x, "e2m1:block32:f32", "mse")
    assert fp4 is not None
    y = (x / np.repeat(fp4[1], 32, axis=-1)).astype(ml_dtypes.float4_e2m1fn)
    np.testing.assert_array_equal(fp4[0], y.view(np.uint8) & 0x0F)


def test_nvfp4_global_is_minmax(monkeypatch):
    # two-level: the global is MinMax's, not searched; the block scales move beneath it
    x = _data("heavy", (32, 128), 4)
    got = _fused(x, "nvfp4", "mse")
    assert got is not None
    minmax = aq.quantize(x, "nvfp4")
    np.testing.assert_array_equal(_bits(got[2]), _bits(minmax.global_scale))
    # max|x| / 6 / 448, by hand
    want = np.float32(np.float32(np.abs(x).max()) / np.float32(6.0)) / np.float32(448.0)
    assert got[2][0] == want
    scales = np.asarray(minmax.scales)
    assert (got[1] < scales).any()
    assert (got[1] <= scales).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4"])
def test_non_finite_data_is_left_to_the_portable_path(bad, scheme):
    x = _data("normal", (4, 64), 1)
    x[2, 5] = bad
    assert _fused(x, scheme, "mse") is None
    with pytest.raises(aq.NonFiniteInputError):
        aq.quantize(x, scheme, calibration="mse")


@pytest.mark.parametrize("scheme", ["q4s:block32:f16", "q8s:tensor", "e4m3:tensor", "e4m3:block4x8:f16", "nf4"])
def test_uncovered_schemes_are_declined(scheme):
    plan = plan_for(QuantScheme.parse(scheme))
    assert supports(plan, (8, 64), FLOAT_ROWS) != ""
    x = _data("normal", (8, 64), 0)
    assert mse_float_codes_and_scales(x, plan, (1.0, 0.99), 2.4) is None


def test_uncovered_dtypes_and_arrays_are_declined():
    plan = plan_for(QuantScheme.parse("mxfp4"))
    x = _data("normal", (8, 64), 0)
    assert mse_float_codes_and_scales(x.astype(np.float64), plan, (1.0,), 2.4) is None
    assert mse_float_codes_and_scales(x.tolist(), plan, (1.0,), 2.4) is None  # type: ignore[arg-type]
    assert supports(plan, (8, 64), FLOAT_ROWS) == ""
    assert supports(plan, (), FLOAT_ROWS) != ""


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4"])
def test_fused_mse_equals_portable_4096(scheme, monkeypatch):
    """The fused float search equals the portable one on 4096x4096 f32 (its speed: ``ci/bench.py``)."""
    x = _data("normal", (4096, 4096), 0)
    _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))


@pytest.mark.parametrize("fill", [0.0, -0.0, 3e38, 1e-44], ids=["zero", "neg-zero", "f32-top", "denormal"])
@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "mxfp8", "e4m3:block32:f16:native"])
def test_same_bits_constant_data(fill, scheme, monkeypatch):
    # all-zero data gives nvfp4 its floor global (F32_TINY) and zero block scales; -0.0 keeps its sign bit
    x = np.full((3, 40), fill, dtype=np.float32)
    for cal in ("mse", "mse:norm=1"):
        _assert_same(_fused(x, scheme, cal), _portable(x, scheme, cal, monkeypatch))
        _assert_driver_same(x, scheme, cal, monkeypatch)
