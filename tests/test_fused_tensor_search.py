"""The fused (Numba) per-tensor MSE search against the portable path: the same codes and stored scale, bit for bit.

The reference is ``aq.quantize(x, scheme, calibration=...)`` with ``ARRAYQUANT_FUSED=0`` (the
portable ``_search_tensor``: each axis-0 row summed by the pairwise tree, then the rows by it).
"""

from __future__ import annotations

import zlib

import array_api_compat
import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba (pip install numba)")

import arrayquant as aq
from arrayquant.fused import numba_search
from arrayquant.fused.numba_search import TENSOR, mse_tensor_codes_and_scales, supports
from arrayquant.invariants import plan_for
from arrayquant.invariants.importance import check_importance
from arrayquant.invariants.plan import check_calibration_spec
from arrayquant.scheme import QuantScheme


def _data(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    if kind == "normal":
        return x
    if kind == "heavy":  # Student t with 1.5 degrees of freedom: rare huge values
        return rng.standard_t(1.5, shape).astype(np.float32)
    if kind == "zeros":  # zero rows and a zero half beside ordinary values
        x[..., : shape[-1] // 2] = 0.0
        x[::3] = 0.0
        return x
    if kind == "allzero":
        return np.zeros(shape, np.float32)
    if kind == "outliers":
        flat[rng.integers(0, flat.size, max(flat.size // 50, 1))] *= 1e4
        return x
    if kind == "tiny":  # values and errors in the subnormal range of f32
        return x * np.float32(1e-41)
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
    return mse_tensor_codes_and_scales(x, plan, spec.factors, spec.norm, imp, rounding=rounding)


def _assert_same(got, want):
    assert got is not None
    codes, scales, glob = got
    w_codes, w_scales = want
    assert glob is None
    assert codes.dtype == np.int8
    assert scales.dtype == np.float32
    assert scales.shape == w_scales.shape == (1,)
    assert codes.shape == w_codes.shape
    np.testing.assert_array_equal(codes, w_codes)
    # bit patterns, so that -0.0 and +0.0 would differ
    np.testing.assert_array_equal(scales.view(np.uint32), w_scales.view(np.uint32))


KINDS = ["normal", "heavy", "zeros", "allzero", "outliers", "tiny", "ties"]
SCHEMES = [
    "q8s",
    "q4s",
    "q8f",
    "q4s:tensor:f16",
    "q8s:tensor:bf16:native",
    "q2s:tensor:f16:packed_u32",
    "q4f:tensor:ue8m0",
]
CALS = ["mse", "mse:norm=2", "mse:norm=1", "mse:grid=50,max_shrink=0.5,norm=3.7"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_bits_as_portable_default_grid(kind, scheme, monkeypatch):
    x = _data(kind, (37, 96), zlib.crc32(repr((kind, scheme)).encode()) % 1000)
    _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))


@pytest.mark.parametrize("cal", CALS)
@pytest.mark.parametrize("kind", ["normal", "heavy", "tiny", "outliers"])
def test_same_bits_norms_and_grids(cal, kind, monkeypatch):
    x = _data(kind, (16, 100), 7)
    for scheme in ("q8s", "q4s:tensor:f16"):
        _assert_same(_fused(x, scheme, cal), _portable(x, scheme, cal, monkeypatch))


@pytest.mark.parametrize(
    "shape",
    [(1, 333), (7, 33), (513, 9), (300,), (1,), (4, 6, 70), (2, 1)],
    ids=["one-row", "odd-rows", "many-rows", "1d", "1d-one", "3d", "one-column"],
)
def test_same_bits_shapes(shape, monkeypatch):
    x = _data("heavy", shape, 3)
    for scheme in ("q8s", "q4s:tensor:f16"):
        for cal in ("mse", "mse:norm=2", "mse:norm=1"):
            _assert_same(_fused(x, scheme, cal), _portable(x, scheme, cal, monkeypatch))


@pytest.mark.parametrize("cal", ["mse", "mse:norm=2", "mse:norm=1"])
@pytest.mark.parametrize("shape", [(20, 100), (3, 5, 100), (100,)], ids=["2d", "3d", "1d"])
def test_same_bits_with_importance(cal, shape, monkeypatch):
    rng = np.random.default_rng(11)
    x = _data("heavy", shape, 5)
    v = rng.uniform(0, 3, 100).astype(np.float32)
    v[::7] = 0.0  # zero weights: those columns do not count
    for scheme in ("q8s", "q4s:tensor:bf16"):
        want = _portable(x, scheme, cal, monkeypatch, importance=v)
        _assert_same(_fused(x, scheme, cal, importance=v), want)


def test_importance_moves_the_choice(monkeypatch):
    # zero weight on the outlier column: its error no longer counts, so the choice changes
    x = _data("normal", (64, 32), 2)
    x[:, 0] *= 50.0
    v = np.ones(32, np.float32)
    v[0] = 0.0
    plain = _fused(x, "q4s", "mse")
    weighted = _fused(x, "q4s", "mse", importance=v)
    assert plain is not None
    assert weighted is not None
    assert weighted[1][0] != plain[1][0]
    _assert_same(weighted, _portable(x, "q4s", "mse", monkeypatch, importance=v))


def test_same_bits_float16_input(monkeypatch):
    x = _data("heavy", (33, 64), 9).astype(np.float16)
    for scheme in ("q8s", "q4s:tensor:f16"):
        _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))


def test_same_bits_half_away_rounding(monkeypatch):
    x = _data("ties", (16, 64), 4)
    x[0, 0] = 127.0 * 0.25  # scale 0.25 under q8s:f32 for the full range: every value a code or a tie
    for scheme in ("q8s", "q8s:tensor:f16"):
        _assert_same(
            _fused(x, scheme, "mse", rounding="half_away"),
            _portable(x, scheme, "mse", monkeypatch, rounding="half_away"),
        )


def test_searched_scale_differs_from_minmax():
    # the search must move the scale on heavy-tailed data, else equality proves little
    x = _data("heavy", (32, 128), 4)
    got = _fused(x, "q4s", "mse")
    assert got is not None
    minmax = np.asarray(aq.quantize(x, "q4s").scales)
    assert got[1][0] < minmax[0]


def test_quantize_dispatches_to_the_kernel(monkeypatch):
    calls = []
    real = numba_search.mse

    def spy(*a, **k):
        calls.append(a[0].shape)
        return real(*a, **k)

    monkeypatch.setattr(numba_search, "mse", spy)
    monkeypatch.delenv("ARRAYQUANT_FUSED", raising=False)
    x = _data("outliers", (12, 72), 8)
    for scheme in ("q4s:packed_u32", "q8s:tensor:f16:native", "q2s:tensor:bf16:packed_u32"):
        qt = aq.quantize(x, scheme, calibration="mse")
        with monkeypatch.context() as m:
            m.setenv("ARRAYQUANT_FUSED", "0")
            want = aq.quantize(x, scheme, calibration="mse")
        assert qt.values.dtype == want.values.dtype
        np.testing.assert_array_equal(qt.values, want.values)
        np.testing.assert_array_equal(np.asarray(qt.scales).view(np.uint32), np.asarray(want.scales).view(np.uint32))
    assert calls == [(12, 72)] * 3


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_data_is_left_to_the_portable_path(bad):
    x = _data("normal", (4, 64), 1)
    x[2, 5] = bad
    assert _fused(x, "q8s", "mse") is None
    with pytest.raises(aq.errors.NonFiniteInputError):
        aq.quantize(x, "q8s", calibration="mse")


@pytest.mark.parametrize("scheme", ["q8s:block32", "q4s:block4x8:f16", "nvfp4", "e4m3", "q4s:lookup:nf4", "q4s:lookup"])
def test_uncovered_schemes_are_declined(scheme):
    plan = plan_for(QuantScheme.parse(scheme))
    assert supports(plan, (8, 64), TENSOR) != ""
    assert mse_tensor_codes_and_scales(_data("normal", (8, 64), 0), plan, (1.0, 0.99), 2.4) is None


def test_uncovered_dtypes_and_arrays_are_declined():
    plan = plan_for(QuantScheme.parse("q8s"))
    x = _data("normal", (8, 64), 0)
    assert mse_tensor_codes_and_scales(x.astype(np.float64), plan, (1.0,), 2.4) is None
    assert mse_tensor_codes_and_scales(x.tolist(), plan, (1.0,), 2.4) is None  # type: ignore[arg-type]
    assert supports(plan, (8, 64), TENSOR) == ""
    assert supports(plan, (5,), TENSOR) == ""
    assert supports(plan, (), TENSOR) != ""


def test_same_bits_non_contiguous_input(monkeypatch):
    x = _data("outliers", (100, 40), 6).T  # a transposed view: rows are strided
    assert not x.flags.c_contiguous
    _assert_same(_fused(x, "q8s", "mse"), _portable(x, "q8s", "mse", monkeypatch))


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["q8s", "q4s"])
def test_fused_mse_equals_portable_4096(scheme, monkeypatch):
    """The fused per-tensor search equals the portable one on 4096x4096 f32 (its speed: ``ci/bench.py``)."""
    x = _data("normal", (4096, 4096), 0)
    plan = plan_for(QuantScheme.parse(scheme))
    spec = check_calibration_spec("mse", plan)
    got = mse_tensor_codes_and_scales(x, plan, spec.factors, spec.norm)
    _assert_same(got, _portable(x, scheme, "mse", monkeypatch))
