"""Hypothesis properties of quantization (NumPy and array-api-strict)."""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import arrayquant as aq
from arrayquant.backends.shim import to_host

SYMMETRIC = ["q8s", "q4s", "q2s"]
FULL = ["q8f", "q4f", "q2f"]
LEVELS = ["", ":block4:f16", ":block2x3:bf16", ":block8:ue4m3:tensor:f32", ":block5:ue8m0", ":tensor:f16"]
NAMESPACES = [np, array_api_strict]

finite = st.floats(-1e4, 1e4, width=32, allow_subnormal=False)
arrays = hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=12), elements=finite)


def _eff(qt: aq.QuantizedTensor, shape: tuple[int, ...]) -> np.ndarray:
    """The effective scale of every element, expanded from the grid with plain NumPy."""
    scales = to_host(qt.scales).astype(np.float32)
    if qt.global_scale is not None:
        scales = (to_host(qt.global_scale)[0] * scales).astype(np.float32)
    if qt.scheme.block_size is None:
        return np.full(shape, scales[0], np.float32)
    dims = qt.scheme.block_size.to_dims(len(shape))
    out = scales
    for axis, b in enumerate(dims):
        out = np.repeat(out, b, axis=axis)
    return out[tuple(slice(0, n) for n in shape)]


def _scheme(value: str, level: str, rank: int) -> str | None:
    scheme = value + level + ":packed_u32"
    block = aq.QuantScheme.parse(scheme).block_size
    return None if block is not None and len(block.dims) > rank else scheme


@settings(max_examples=60, deadline=None)
@given(x=arrays, value=st.sampled_from(SYMMETRIC + FULL), level=st.sampled_from(LEVELS), ns=st.sampled_from(NAMESPACES))
def test_requantize_with_stored_params_is_idempotent(x, value, level, ns) -> None:
    scheme = _scheme(value, level, x.ndim)
    if scheme is None:
        return
    qt = aq.quantize(ns.asarray(x), scheme)
    params = aq.QParams(scales=qt.scales, global_scale=qt.global_scale)
    again = aq.quantize(aq.dequantize(qt), scheme, params)
    np.testing.assert_array_equal(to_host(again.values), to_host(qt.values))
    np.testing.assert_array_equal(to_host(again.scales), to_host(qt.scales))


@settings(max_examples=60, deadline=None)
@given(x=arrays, value=st.sampled_from(SYMMETRIC + FULL), level=st.sampled_from(LEVELS), ns=st.sampled_from(NAMESPACES))
def test_error_within_half_a_step(x, value, level, ns) -> None:
    scheme = _scheme(value, level, x.ndim)
    if scheme is None:
        return
    qt = aq.quantize(ns.asarray(x), scheme)
    err = np.abs(to_host(aq.dequantize(qt)).astype(np.float64) - x.astype(np.float64))
    eff = _eff(qt, x.shape).astype(np.float64)
    # symmetric ranges never clip a calibrated value: half a step, plus f32 rounding of x/eff and eff*q;
    # full ranges put the block maximum at 127.5 steps on one side, which may clip by one step
    steps = 0.5 if value in SYMMETRIC else 1.0
    bound = eff * (steps + 2.0**-20) + np.abs(x) * 2.0**-22
    assert (err <= bound).all(), (err - bound).max()


@settings(max_examples=60, deadline=None)
@given(x=arrays, value=st.sampled_from(SYMMETRIC), level=st.sampled_from(LEVELS), ns=st.sampled_from(NAMESPACES))
def test_sign_symmetry(x, value, level, ns) -> None:
    scheme = _scheme(value, level, x.ndim)
    if scheme is None:
        return
    pos = aq.quantize(ns.asarray(x), scheme)
    neg = aq.quantize(ns.asarray(-x), scheme)
    np.testing.assert_array_equal(to_host(neg.codes()), -to_host(pos.codes()))
    np.testing.assert_array_equal(to_host(neg.scales), to_host(pos.scales))


@pytest.mark.parametrize("dtype", ["f16", "bf16", "ue4m3", "ue8m0"])
@settings(max_examples=200, deadline=None)
@given(s=st.floats(min_value=0, width=32, allow_nan=False))
def test_scalar_and_array_round_up_agree(dtype, s) -> None:
    sd = aq.ScaleDtype.coerce(dtype)
    got = float(to_host(aq.round_up_scales(np.asarray([s], np.float32), sd))[0])
    assert got == sd.round_up(s)
    assert got >= s or got == sd.max
