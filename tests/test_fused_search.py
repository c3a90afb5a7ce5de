"""The fused (Numba) MSE search against the portable path: the same codes and stored scales, bit for bit.

The reference is ``aq.quantize(x, scheme, calibration=...)`` with ``ARRAYQUANT_FUSED=0``, so the
comparison stays a comparison with the portable kernels once the drivers dispatch to the fused one.
"""

from __future__ import annotations

import zlib

import array_api_compat
import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba (pip install numba)")

import arrayquant as aq
from arrayquant import fused
from arrayquant.fused.numba_search import ROWS, mse_codes_and_scales, supports
from arrayquant.invariants import plan_for
from arrayquant.invariants.importance import check_importance
from arrayquant.invariants.plan import check_calibration_spec
from arrayquant.scheme import Calibration, QuantScheme


def _data(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "heavy":  # Student t with 1.5 degrees of freedom: rare huge values
        return rng.standard_t(1.5, shape).astype(np.float32)
    if kind == "zeros":  # whole zero blocks and rows beside ordinary ones
        x = rng.standard_normal(shape).astype(np.float32)
        x[..., : shape[-1] // 2] = 0.0
        x.reshape(-1, shape[-1])[::3] = 0.0
        return x
    if kind == "outliers":
        x = rng.standard_normal(shape).astype(np.float32)
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, max(flat.size // 50, 1))] *= 1e4
        return x
    if kind == "subnormal":  # values and errors in the subnormal range of f32, some blocks near 2^-126
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(1e-41)
        x.reshape(-1, shape[-1])[1::2] *= np.float32(1e5)
        return x
    if kind == "huge":  # near the top of f32
        return (rng.uniform(-1, 1, shape) * 3e38).astype(np.float32)
    if kind == "ties":  # exact multiples of small steps: many exact rounding ties
        return (rng.integers(-40, 41, shape) * 0.25).astype(np.float32)
    raise AssertionError(kind)


def _portable(x, scheme, cal, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        qt = aq.quantize(x, scheme, calibration=cal, **kw)
    return np.asarray(qt.codes()), np.asarray(qt.scales)


def _fused(x, scheme, cal, importance=None, rounding="half_even"):
    plan = plan_for(QuantScheme.parse(scheme))
    spec = check_calibration_spec(cal, plan)
    imp = None
    if importance is not None:
        imp = check_importance(importance, spec.kind, tuple(x.shape), array_api_compat.array_namespace(x), "cpu")
    return mse_codes_and_scales(x, plan, spec.factors, spec.norm, imp, rounding=rounding)


def _assert_same(got, want):
    assert got is not None
    codes, scales = got
    w_codes, w_scales = want
    assert codes.dtype == np.int8
    assert scales.dtype == np.float32
    assert codes.shape == w_codes.shape
    assert scales.shape == w_scales.shape
    np.testing.assert_array_equal(codes, w_codes)
    # bit patterns, so that -0.0 and +0.0 (or NaN payloads) would differ
    np.testing.assert_array_equal(scales.view(np.uint32), w_scales.view(np.uint32))


KINDS = ["normal", "heavy", "zeros", "outliers", "subnormal", "huge", "ties"]
SCHEMES = [
    "q4s:block32:f16",
    "q8s:block32:f16",
    "q8f:block16:bf16:native",
    "q4f:block32:f32",
    "q2s:block8:f16",
    "q2f:block32:bf16",
    "q8s:block32:ue8m0",
    "q4s:block16:ue4m3:native",
]
CALS = ["mse", "mse:norm=2", "mse:norm=1", "mse:grid=50,max_shrink=0.5,norm=3.7", "mse:grid=7,max_shrink=0.9,norm=0.5"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_bits_as_portable_default_grid(kind, scheme, monkeypatch):
    x = _data(kind, (24, 96), zlib.crc32(repr((kind, scheme)).encode()) % 1000)
    _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))


@pytest.mark.parametrize("cal", CALS)
@pytest.mark.parametrize("kind", ["normal", "heavy", "subnormal", "outliers"])
def test_same_bits_norms_and_grids(cal, kind, monkeypatch):
    x = _data(kind, (16, 128), 7)
    for scheme in ("q4s:block32:f16", "q8f:block32:bf16"):
        _assert_same(_fused(x, scheme, cal), _portable(x, scheme, cal, monkeypatch))


@pytest.mark.parametrize(
    "shape",
    [(40, 100), (3, 7), (1, 33), (300,), (4, 6, 70), (2, 1)],
    ids=["partial-block", "block-longer-than-row", "one-row", "1d", "3d", "one-column"],
)
def test_same_bits_partial_and_other_shapes(shape, monkeypatch):
    x = _data("normal", shape, 3)
    for scheme in ("q4s:block32:f16", "q2f:block16:f32"):
        for cal in ("mse", "mse:norm=1"):
            _assert_same(_fused(x, scheme, cal), _portable(x, scheme, cal, monkeypatch))


@pytest.mark.parametrize("cal", ["mse", "mse:norm=2", "mse:norm=1"])
def test_same_bits_with_importance(cal, monkeypatch):
    rng = np.random.default_rng(11)
    x = _data("heavy", (20, 100), 5)
    v = rng.uniform(0, 3, 100).astype(np.float32)
    v[::7] = 0.0  # zero weights: those columns do not count
    for scheme in ("q4s:block32:f16", "q8s:block16:bf16"):
        want = _portable(x, scheme, cal, monkeypatch, importance=v)
        _assert_same(_fused(x, scheme, cal, importance=v), want)
    # the weights must matter on this data, else the test could not tell them from none
    assert not np.array_equal(want[1], _portable(x, "q8s:block16:bf16", cal, monkeypatch)[1])


def test_same_bits_float16_input(monkeypatch):
    x = _data("heavy", (32, 64), 9).astype(np.float16)
    for scheme in ("q4s:block32:f16", "q8f:block32:bf16"):
        _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))


def test_same_bits_half_away_rounding(monkeypatch):
    # half of each 32-block is +-127, the rest k + 1/2: the full range (scale 1 under q8s:f32) wins
    # the search by far, and then every other element is an exact tie
    rng = np.random.default_rng(2)
    x = (rng.integers(-100, 100, (16, 64)) + 0.5).astype(np.float32)
    x[:, ::2] = rng.choice(np.array([-127.0, 127.0], np.float32), (16, 32))
    for scheme in ("q8s:block32:f32", "q8s:block32:f16"):
        want = _portable(x, scheme, "mse", monkeypatch, rounding="half_away")
        _assert_same(_fused(x, scheme, "mse", rounding="half_away"), want)
        even = _portable(x, scheme, "mse", monkeypatch)
        _assert_same(_fused(x, scheme, "mse"), even)
        assert not np.array_equal(want[0], even[0])  # the ties were really met


def test_searched_scales_differ_from_minmax(monkeypatch):
    # the search must actually move scales on heavy-tailed data, else equality proves little
    x = _data("heavy", (32, 128), 4)
    _codes, scales = _fused(x, "q4s:block32:f16", "mse")
    minmax = np.asarray(aq.quantize(x, "q4s:block32:f16").scales)
    assert (scales < minmax).any()
    assert (scales <= minmax).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_data_is_left_to_the_portable_path(bad):
    x = _data("normal", (4, 64), 1)
    x[2, 5] = bad
    assert _fused(x, "q4s:block32:f16", "mse") is None


@pytest.mark.parametrize(
    "scheme",
    [
        "q8s:tensor",
        "q8s:block4x8:f16",
        "nvfp4",
        "mxfp8",
        "e2m1:block32:ue8m0:packed_native:ocp",
        "q4f:block32:f32:lookup:nf4",
        "q4f:block32:f16:lookup",
    ],
)
def test_uncovered_schemes_are_declined(scheme):
    plan = plan_for(QuantScheme.parse(scheme))
    assert supports(plan, (8, 64), ROWS) != ""
    x = _data("normal", (8, 64), 0)
    assert mse_codes_and_scales(x, plan, (1.0, 0.99), 2.4) is None


def test_uncovered_dtypes_and_arrays_are_declined():
    plan = plan_for(QuantScheme.parse("q4s:block32:f16"))
    x = _data("normal", (8, 64), 0)
    assert mse_codes_and_scales(x.astype(np.float64), plan, (1.0,), 2.4) is None
    assert mse_codes_and_scales(x.tolist(), plan, (1.0,), 2.4) is None  # type: ignore[arg-type]
    assert supports(plan, (8, 64), ROWS) == ""
    assert supports(plan, (), ROWS) != ""


def test_registry_switch(monkeypatch):
    monkeypatch.delenv("ARRAYQUANT_FUSED", raising=False)
    assert fused.available()
    assert fused.why_not() == ""
    monkeypatch.setenv("ARRAYQUANT_FUSED", "0")
    assert not fused.available()
    assert fused.why_not() == "turned off by ARRAYQUANT_FUSED=0"


def test_registry_without_numba(monkeypatch):
    import sys

    monkeypatch.delenv("ARRAYQUANT_FUSED", raising=False)
    monkeypatch.setitem(sys.modules, "numba", None)  # makes ``import numba`` raise ImportError
    fused._numba_problem.cache_clear()
    try:
        assert not fused.available()
        assert fused.why_not() == "numba is not installed (pip install 'arrayquant[fast]')"
    finally:
        fused._numba_problem.cache_clear()


def test_importance_check_keeps_calibration_kind():
    # guard: the helper above relies on the invariant layer's scaling (maximum 1)
    v = np.array([0.0, 2.0, 4.0], dtype=np.float32)
    xp = array_api_compat.array_namespace(v)
    np.testing.assert_array_equal(check_importance(v, Calibration.MSE, (2, 3), xp, "cpu"), [0.0, 0.5, 1.0])


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["q4s:block32:f16", "q8s:block32:f16"])
def test_fused_mse_equals_portable_4096(scheme, monkeypatch):
    """The fused MSE search on 4096x4096 f32 gives the portable path's bits (its speed: the benchmark)."""
    x = _data("normal", (4096, 4096), 0)
    plan = plan_for(QuantScheme.parse(scheme))
    spec = check_calibration_spec("mse", plan)
    _assert_same(mse_codes_and_scales(x, plan, spec.factors, spec.norm), _portable(x, scheme, "mse", monkeypatch))


@pytest.mark.parametrize(
    "scheme", ["q4s:block32:f16", "q2f:block16:bf16", "q8s:block32:f16:native", "q2s:block8:f16:packed_u32:0"]
)
def test_packed_stores_from_fused_codes(scheme, monkeypatch):
    # the drivers' dispatch packs the fused codes with the portable storage code: same stored values
    from arrayquant.storage import pack_codes

    x = _data("outliers", (12, 72), 8)
    plan = plan_for(QuantScheme.parse(scheme))
    codes, _ = _fused(x, scheme, "mse")
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        want = aq.quantize(x, scheme, calibration="mse").values
    got = pack_codes(codes, plan, xp=array_api_compat.array_namespace(x))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_concurrent_calls_from_threads(monkeypatch):
    # numba's workqueue layer aborts on concurrent parallel launches: the kernel serialises them
    from concurrent.futures import ThreadPoolExecutor

    xs = [_data("heavy", (64, 256), seed) for seed in range(8)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: _fused(x, "q4s:block32:f16", "mse"), xs))
    for x, g in zip(xs, got, strict=True):
        _assert_same(g, _portable(x, "q4s:block32:f16", "mse", monkeypatch))


def test_same_bits_non_contiguous_input(monkeypatch):
    x = _data("outliers", (100, 40), 6).T  # a transposed view: rows are strided
    assert not x.flags.c_contiguous
    _assert_same(_fused(x, "q4s:block32:f16", "mse"), _portable(x, "q4s:block32:f16", "mse", monkeypatch))
