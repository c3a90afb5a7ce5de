"""The fused (Numba) MSE search for 2-D blocks against the portable path: the same codes and scales, bit for bit.

The reference is ``aq.quantize(x, scheme, calibration=...)`` with ``ARRAYQUANT_FUSED=0`` (the portable
Array API kernels), so the comparison stays one with an independent implementation of the search.
"""

from __future__ import annotations

import zlib

import array_api_compat
import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba (pip install numba)")

import arrayquant as aq
from arrayquant.fused import numba_search
from arrayquant.fused.numba_search import BLOCKS, mse_block2d_codes_and_scales, supports
from arrayquant.invariants import plan_for
from arrayquant.invariants.importance import check_importance
from arrayquant.invariants.plan import check_calibration_spec
from arrayquant.scheme import QuantScheme


def _data(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "heavy":  # Student t with 1.5 degrees of freedom: rare huge values
        return rng.standard_t(1.5, shape).astype(np.float32)
    if kind == "zeros":  # whole zero blocks and rows beside ordinary ones
        x = rng.standard_normal(shape).astype(np.float32)
        x[:, : shape[-1] // 2] = 0.0
        x[::3] = 0.0
        return x
    if kind == "outliers":
        x = rng.standard_normal(shape).astype(np.float32)
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, max(flat.size // 50, 1))] *= 1e4
        return x
    if kind == "tiny":  # values and errors in the subnormal range of f32, some blocks near 2^-126
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(1e-41)
        x[1::2] *= np.float32(1e5)
        return x
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
    return mse_block2d_codes_and_scales(x, plan, spec.factors, spec.norm, imp, rounding=rounding)


def _assert_same(got, want):
    assert got is not None
    codes, scales, glob = got
    assert glob is None
    w_codes, w_scales = want
    assert codes.dtype == np.int8
    assert scales.dtype == np.float32
    assert codes.shape == w_codes.shape
    assert scales.shape == w_scales.shape
    np.testing.assert_array_equal(codes, w_codes)
    # bit patterns, so that -0.0 and +0.0 would differ
    np.testing.assert_array_equal(scales.view(np.uint32), w_scales.view(np.uint32))


KINDS = ["normal", "heavy", "zeros", "outliers", "tiny", "ties"]
SCHEMES = ["q8s:block8x32:f16", "q4s:block16x16:bf16", "q4f:block4x8:f32", "q2s:block2x16:ue8m0", "q8f:block3x5:f16"]
CALS = ["mse", "mse:norm=2", "mse:norm=1"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_bits_as_portable(kind, scheme, monkeypatch):
    x = _data(
        kind, (40, 100), zlib.crc32(repr((kind, scheme)).encode()) % 1000
    )  # partial blocks at the bottom and the right
    _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))


@pytest.mark.parametrize("cal", CALS)
@pytest.mark.parametrize("kind", ["normal", "heavy", "outliers", "tiny"])
def test_same_bits_norms(cal, kind, monkeypatch):
    x = _data(kind, (32, 96), 7)
    for scheme in ("q8s:block8x32:f16", "q4s:block16x16:bf16"):
        _assert_same(_fused(x, scheme, cal), _portable(x, scheme, cal, monkeypatch))


@pytest.mark.parametrize(
    "shape",
    [(37, 70), (5, 64), (3, 7), (1, 33), (64, 1), (16, 32), (17, 33)],
    ids=["partial-both", "one-block-row", "smaller-than-block", "one-row", "one-column", "whole", "one-over"],
)
def test_same_bits_partial_shapes(shape, monkeypatch):
    x = _data("heavy", shape, 3)
    for scheme in ("q8s:block8x32:f16", "q4s:block16x16:bf16"):
        for cal in ("mse", "mse:norm=1"):
            plan = plan_for(QuantScheme.parse(scheme))
            got = _fused(x, scheme, cal)
            if supports(plan, shape, BLOCKS) != "":  # one-row blocks (clamped to the data) are the 1-D case
                assert plan.block_dims(shape)[0] == 1
                assert got is None
                continue
            _assert_same(got, _portable(x, scheme, cal, monkeypatch))


@pytest.mark.parametrize("cal", CALS)
def test_same_bits_with_importance(cal, monkeypatch):
    rng = np.random.default_rng(11)
    x = _data("heavy", (40, 100), 5)
    v = rng.uniform(0, 3, 100).astype(np.float32)
    v[::7] = 0.0  # zero weights: those columns do not count
    for scheme in ("q8s:block8x32:f16", "q4s:block16x16:bf16"):
        want = _portable(x, scheme, cal, monkeypatch, importance=v)
        _assert_same(_fused(x, scheme, cal, importance=v), want)
    # the weights must matter on this data, else the test could not tell them from none
    assert not np.array_equal(want[1], _portable(x, "q4s:block16x16:bf16", cal, monkeypatch)[1])


def test_same_bits_float16_input(monkeypatch):
    x = _data("heavy", (48, 80), 9).astype(np.float16)
    for scheme in ("q8s:block8x32:f16", "q4s:block16x16:bf16"):
        _assert_same(_fused(x, scheme, "mse"), _portable(x, scheme, "mse", monkeypatch))


def test_same_bits_half_away_rounding(monkeypatch):
    # half of each block is +-127, the rest k + 1/2: the full range (scale 1 under q8s:f32) wins, and
    # then every other element is an exact tie
    rng = np.random.default_rng(2)
    x = (rng.integers(-100, 100, (16, 64)) + 0.5).astype(np.float32)
    x[:, ::2] = rng.choice(np.array([-127.0, 127.0], np.float32), (16, 32))
    for scheme in ("q8s:block8x32:f32", "q8s:block4x16:f16"):
        want = _portable(x, scheme, "mse", monkeypatch, rounding="half_away")
        _assert_same(_fused(x, scheme, "mse", rounding="half_away"), want)
        even = _portable(x, scheme, "mse", monkeypatch)
        _assert_same(_fused(x, scheme, "mse"), even)
        assert not np.array_equal(want[0], even[0])  # the ties were really met


def test_searched_scales_differ_from_minmax():
    # the search must actually move scales on heavy-tailed data, else equality proves little
    x = _data("heavy", (64, 128), 4)
    got = _fused(x, "q4s:block16x16:bf16", "mse")
    assert got is not None
    minmax = np.asarray(aq.quantize(x, "q4s:block16x16:bf16").scales)
    assert (got[1] < minmax).any()
    assert (got[1] <= minmax).all()


def test_same_bits_non_contiguous_input(monkeypatch):
    x = _data("outliers", (100, 40), 6).T  # a transposed view: rows are strided
    assert not x.flags.c_contiguous
    _assert_same(_fused(x, "q8s:block8x32:f16", "mse"), _portable(x, "q8s:block8x32:f16", "mse", monkeypatch))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_data_is_left_to_the_portable_path(bad):
    x = _data("normal", (16, 64), 1)
    x[9, 5] = bad
    assert _fused(x, "q8s:block8x32:f16", "mse") is None


@pytest.mark.parametrize(
    ("scheme", "shape"),
    [
        ("q8s:block32:f16", (8, 64)),  # one-row blocks: the 1-D case
        ("q8s:block8x32:f16", (4, 8, 64)),  # 3-d data
        ("q8s:block8x32:f16", (64,)),
        ("q8s:tensor", (8, 64)),
        ("e2m1:block8x32:f16", (16, 64)),  # float values
        ("q4f:block8x32:f32:lookup:nf4", (16, 64)),
    ],
)
def test_uncovered_are_declined(scheme, shape):
    plan = plan_for(QuantScheme.parse(scheme))
    assert supports(plan, shape, BLOCKS) != ""
    x = _data("normal", shape, 0)
    assert mse_block2d_codes_and_scales(x, plan, (1.0, 0.99), 2.4) is None


def test_uncovered_dtypes_and_arrays_are_declined():
    plan = plan_for(QuantScheme.parse("q8s:block8x32:f16"))
    x = _data("normal", (16, 64), 0)
    assert supports(plan, (16, 64), BLOCKS) == ""
    assert mse_block2d_codes_and_scales(x.astype(np.float64), plan, (1.0,), 2.4) is None
    assert mse_block2d_codes_and_scales(x.tolist(), plan, (1.0,), 2.4) is None  # type: ignore[arg-type]


def test_quantize_routes_to_the_kernel(monkeypatch):
    # a spy on the module's entry point: aq.quantize(calibration="mse") on 2-D blocks takes it, and
    # what it returns is what the QuantizedTensor holds
    calls = []
    real = numba_search.mse

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out)
        return out

    monkeypatch.delenv("ARRAYQUANT_FUSED", raising=False)
    monkeypatch.setattr(numba_search, "mse", spy)
    x = _data("heavy", (24, 70), 12)
    qt = aq.quantize(x, "q8s:block8x32:f16", calibration="mse")
    assert len(calls) == 1
    assert calls[0] is not None
    np.testing.assert_array_equal(np.asarray(qt.codes()), calls[0][0])
    np.testing.assert_array_equal(np.asarray(qt.scales).view(np.uint32), calls[0][1].view(np.uint32))
    _assert_same(calls[0], _portable(x, "q8s:block8x32:f16", "mse", monkeypatch))
    # with the fused kernels off the spy is not reached
    monkeypatch.setenv("ARRAYQUANT_FUSED", "0")
    aq.quantize(x, "q8s:block8x32:f16", calibration="mse")
    assert len(calls) == 1


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["q8s:block8x32:f16"])
def test_fused_mse_equals_portable_4096(scheme, monkeypatch):
    """The fused 2-d block search equals the portable one on 4096x4096 f32 (its speed: ``ci/bench.py``)."""
    x = _data("normal", (4096, 4096), 0)
    plan = plan_for(QuantScheme.parse(scheme))
    spec = check_calibration_spec("mse", plan)
    got = mse_block2d_codes_and_scales(x, plan, spec.factors, spec.norm)
    _assert_same(got, _portable(x, scheme, "mse", monkeypatch))
