"""Elementwise ops, reductions, comparisons and masks on quantized tensors (arrayquant.ops).

Oracle: plain NumPy on ``np.asarray(aq.dequantize(qt))`` (the codec is proven elsewhere), math.erf,
and ``aq.quantize(numpy_result, scheme)`` for requantized outputs (Burn's quantize_dynamic: the
input's scheme, MinMax scales).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import arrayquant as aq
from arrayquant import ops
from arrayquant.errors import BackendUnavailableError, DeviceError, DTypeError, SchemeError, ShapeError

PER_TENSOR = "q8s:native"
BLOCK = "q4s:block4"  # packed u32, per block of 4 along the last axis
NATIVE_BLOCK = "q8s:block4:native"  # on every backend: packing compiles slowly on JAX
SCHEMES = [PER_TENSOR, "q4s", BLOCK, NATIVE_BLOCK]


def _x(shape: tuple[int, ...] = (4, 8), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _nz(seed: int) -> np.ndarray:
    """Data whose quantized values are never 0 (|x| >= 0.5), so dividing by it stays finite."""
    x = _x(seed=seed)
    return np.where(x < 0, x - 0.5, x + 0.5).astype(np.float32)


def _fq(qt: aq.QuantizedTensor) -> np.ndarray:
    return np.asarray(aq.dequantize(qt))


def _host(a: object) -> np.ndarray:
    if isinstance(a, aq.QuantizedTensor):
        a = aq.dequantize(a)
    if hasattr(a, "compute"):
        a = a.compute()
    if type(a).__module__.startswith("array_api_strict"):
        a = a._array
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def _same_quantized(got: aq.QuantizedTensor, want: aq.QuantizedTensor) -> None:
    assert isinstance(got, aq.QuantizedTensor)
    assert got.scheme == want.scheme
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got.codes()), np.asarray(want.codes()))
    np.testing.assert_array_equal(np.asarray(got.scales), np.asarray(want.scales))


# -- arithmetic and propagation -------------------------------------------------------------------
BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "pow": np.power,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("scheme", [PER_TENSOR, BLOCK])
def test_binary_inhibit_matches_numpy_on_dequantized(name: str, scheme: str) -> None:
    x1, x2 = np.abs(_x()) + 0.5, _nz(1)  # positive base keeps pow finite, non-zero divisor
    q1, q2 = aq.quantize(x1, scheme), aq.quantize(x2, PER_TENSOR)
    f1, f2 = _fq(q1), _fq(q2)
    fn, ref = getattr(ops, name), BINARY[name]
    for a, b, want in [
        (q1, q2, ref(f1, f2)),
        (q1, 2.0, ref(f1, np.float32(2.0))),
        (3.0, q2, ref(np.float32(3.0), f2)) if name != "pow" else (q1, 3, ref(f1, np.float32(3))),
        (q1, x2, ref(f1, x2)),
        (x1, q2, ref(x1, f2)),
    ]:
        out = fn(a, b)
        assert isinstance(out, np.ndarray)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_propagate_requantizes_with_first_quantized_scheme(name: str) -> None:
    x1, x2 = np.abs(_x()) + 0.5, _nz(1)
    if name == "pow":
        x2 = np.abs(x2)  # x2 is a base below
    q1, q2 = aq.quantize(x1, BLOCK), aq.quantize(x2, PER_TENSOR)
    f1, f2 = _fq(q1), _fq(q2)
    fn, ref = getattr(ops, name), BINARY[name]
    _same_quantized(fn(q1, q2, propagation="propagate"), aq.quantize(ref(f1, f2), BLOCK))
    _same_quantized(fn(q2, q1, propagation="propagate"), aq.quantize(ref(f2, f1), PER_TENSOR))
    _same_quantized(fn(q1, 2.0, propagation="propagate"), aq.quantize(ref(f1, np.float32(2.0)), BLOCK))
    _same_quantized(fn(2.0, q2, propagation="propagate"), aq.quantize(ref(np.float32(2.0), f2), PER_TENSOR))
    # Burn's mixed rule: a quantized operand met with a float array gives floats, whatever propagation
    out = fn(q1, x2, propagation="propagate")
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, ref(f1, x2))


def test_negative_clip_propagation() -> None:
    qt = aq.quantize(_x(), BLOCK)
    f = _fq(qt)
    np.testing.assert_array_equal(ops.negative(qt), -f)
    _same_quantized(ops.negative(qt, propagation="propagate"), aq.quantize(-f, BLOCK))
    np.testing.assert_array_equal(ops.clip(qt, -0.5, 0.75), np.clip(f, np.float32(-0.5), np.float32(0.75)))
    np.testing.assert_array_equal(ops.clip(qt, min=0.0), np.maximum(f, 0.0))
    np.testing.assert_array_equal(ops.clip(qt, max=0.0), np.minimum(f, 0.0))
    _same_quantized(ops.clip(qt, -0.5, 0.75, propagation="propagate"), aq.quantize(np.clip(f, -0.5, 0.75), BLOCK))
    # an array bound is Burn's mixed case: floats
    lo = np.full((8,), -0.25, dtype=np.float32)
    out = ops.clip(qt, lo, propagation="propagate")
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.maximum(f, lo))


def test_remainder_always_float() -> None:
    q1, q2 = aq.quantize(_x() * 4, PER_TENSOR), aq.quantize(np.abs(_x(seed=1)) + 0.5, BLOCK)
    f1, f2 = _fq(q1), _fq(q2)
    np.testing.assert_array_equal(ops.remainder(q1, q2), np.remainder(f1, f2))
    np.testing.assert_array_equal(ops.remainder(q1, 1.5), np.remainder(f1, np.float32(1.5)))
    np.testing.assert_array_equal(ops.remainder(-1.5, q2), np.remainder(np.float32(-1.5), f2))


# -- unary math -----------------------------------------------------------------------------------
UNARY = {
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "reciprocal": lambda f: np.float32(1) / f,
    "floor": np.floor,
    "ceil": np.ceil,
    "sign": np.sign,
    "square": np.square,
    "round": np.round,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float_ops_match_numpy(name: str) -> None:
    qt = aq.quantize(np.abs(_x()) * 3 + 1.0, BLOCK)  # codes >= 1: log, sqrt and 1/x finite
    out = getattr(ops, name)(qt)
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, UNARY[name](_fq(qt)))


def test_round_is_half_to_even() -> None:
    # MinMax scale 63.5 / 127 = 0.5 exactly: every half-integer is a code
    x = np.array([63.5, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5], dtype=np.float32)
    qt = aq.quantize(x, PER_TENSOR)
    np.testing.assert_array_equal(_fq(qt), x)
    assert ops.round(qt).tolist() == [64.0, 0.0, 2.0, 2.0, -0.0, -2.0, -2.0]


def test_erf_against_math_erf() -> None:
    from arrayquant.ops.elementwise import _erf_array

    x = np.concatenate([np.linspace(-6, 6, 20001, dtype=np.float32), np.float32([1e-30, -1e-6, 0.999, 1.0, 1.001])])
    ref = np.array([math.erf(float(v)) for v in x])
    got = _erf_array(x)
    assert got.dtype == np.float32
    err = np.abs(got - ref)
    assert err.max() <= 2e-7
    small = (np.abs(x) < 1) & (x != 0)
    assert (err[small] / np.abs(ref[small])).max() <= 2e-7  # no cancellation near 0
    assert _erf_array(np.float32([np.inf, -np.inf, np.nan]))[:2].tolist() == [1.0, -1.0]
    assert np.isnan(_erf_array(np.float32([np.nan]))[0])
    qt = aq.quantize(_x(), BLOCK)
    want = np.array([math.erf(float(v)) for v in _fq(qt).ravel()]).reshape(qt.shape)
    np.testing.assert_allclose(ops.erf(qt), want, rtol=0, atol=2e-7)


# -- reductions and scans -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sum", "prod", "mean"])
@pytest.mark.parametrize(("axis", "keepdims"), [(None, False), (1, False), (0, True), ((0, 1), False), (-1, True)])
def test_reductions(name: str, axis: object, keepdims: bool) -> None:
    qt = aq.quantize(_x(), BLOCK)
    f = _fq(qt)
    want = getattr(np, name)(f, axis=axis, keepdims=keepdims)
    out = getattr(ops, name)(qt, axis=axis, keepdims=keepdims)
    assert out.dtype == np.float32
    assert out.shape == want.shape
    np.testing.assert_allclose(out, want, rtol=1e-6)
    back = getattr(ops, name)(qt, axis=axis, keepdims=keepdims, propagation="propagate")
    expected_shape = want.shape or (1,)  # quantized results are at least 1-d, as Burn's
    assert back.shape == expected_shape
    _same_quantized(back, aq.quantize(np.reshape(np.asarray(out), expected_shape), BLOCK))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scans(axis: int) -> None:
    qt = aq.quantize(_x((5, 9)), PER_TENSOR)
    f = _fq(qt)
    np.testing.assert_array_equal(ops.cumulative_sum(qt, axis=axis), np.cumsum(f, axis=axis))
    np.testing.assert_array_equal(ops.cumulative_prod(qt, axis=axis), np.cumprod(f, axis=axis))
    np.testing.assert_array_equal(ops.cumulative_max(qt, axis=axis), np.maximum.accumulate(f, axis=axis))
    np.testing.assert_array_equal(ops.cumulative_min(qt, axis=axis), np.minimum.accumulate(f, axis=axis))
    _same_quantized(
        ops.cumulative_max(qt, axis=axis, propagation="propagate"),
        aq.quantize(np.maximum.accumulate(f, axis=axis), PER_TENSOR),
    )
    _same_quantized(
        ops.cumulative_sum(qt, axis=axis, propagation="propagate"), aq.quantize(np.cumsum(f, axis=axis), PER_TENSOR)
    )
    inc = ops.cumulative_sum(qt, axis=axis, include_initial=True)
    assert inc.shape[axis % 2] == qt.shape[axis % 2] + 1
    one_d = aq.quantize(_x((7,)), PER_TENSOR)
    np.testing.assert_array_equal(ops.cumulative_min(one_d), np.minimum.accumulate(_fq(one_d)))


# -- always quantized ------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
def test_abs_requantizes(scheme: str) -> None:
    qt = aq.quantize(_x() - 0.5, scheme)
    _same_quantized(ops.abs(qt), aq.quantize(np.abs(_fq(qt)), scheme))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(("axis", "keepdims"), [(None, False), (None, True), (1, False), (0, True), ((0, 2), False)])
def test_max_min_per_tensor_select_codes(largest: bool, axis: object, keepdims: bool) -> None:
    for scheme in [PER_TENSOR, "q4s"]:
        qt = aq.quantize(_x((3, 4, 8)), scheme)
        f, codes = _fq(qt), np.asarray(qt.codes())
        fn = ops.max if largest else ops.min
        out = fn(qt, axis=axis, keepdims=keepdims)
        want = (np.max if largest else np.min)(f, axis=axis, keepdims=keepdims)
        want_shape = want.shape or (1,)
        assert isinstance(out, aq.QuantizedTensor)
        assert out.shape == want_shape
        assert out.scheme == qt.scheme
        np.testing.assert_array_equal(np.asarray(out.scales), np.asarray(qt.scales))  # same scale
        np.testing.assert_array_equal(_fq(out), want.reshape(want_shape))
        # independent selection of the codes: NumPy's extreme over the codes (positive scale)
        np.testing.assert_array_equal(
            np.asarray(out.codes()),
            (np.max if largest else np.min)(codes, axis=axis, keepdims=keepdims).reshape(want_shape),
        )


@pytest.mark.parametrize("largest", [True, False])
def test_max_min_block_requantize(largest: bool) -> None:
    qt = aq.quantize(_x((4, 8)), BLOCK)
    f = _fq(qt)
    fn, ref = (ops.max, np.max) if largest else (ops.min, np.min)
    _same_quantized(fn(qt, axis=0), aq.quantize(ref(f, axis=0), BLOCK))
    _same_quantized(fn(qt, axis=1, keepdims=True), aq.quantize(ref(f, axis=1, keepdims=True), BLOCK))
    _same_quantized(fn(qt), aq.quantize(ref(f).reshape(1), BLOCK))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("axis", [0, -1])
def test_sort(descending: bool, axis: int) -> None:
    x = _x((4, 8))
    qt = aq.quantize(x, PER_TENSOR)
    f = _fq(qt)
    want = np.sort(f, axis=axis)
    if descending:
        want = np.flip(want, axis=axis)
    out = ops.sort(qt, axis=axis, descending=descending)
    np.testing.assert_array_equal(_fq(out), want)
    np.testing.assert_array_equal(np.asarray(out.scales), np.asarray(qt.scales))
    sorted_codes = np.sort(np.asarray(qt.codes()), axis=axis)
    np.testing.assert_array_equal(np.asarray(out.codes()), np.flip(sorted_codes, axis) if descending else sorted_codes)
    qb = aq.quantize(x, BLOCK)
    fb = np.sort(_fq(qb), axis=axis)
    _same_quantized(
        ops.sort(qb, axis=axis, descending=descending), aq.quantize(np.flip(fb, axis) if descending else fb, BLOCK)
    )


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest: bool) -> None:
    x = _x((4, 8))
    qt = aq.quantize(x, PER_TENSOR)
    f = _fq(qt)
    order = np.sort(f, axis=1)
    want = np.flip(order, 1)[:, :3] if largest else order[:, :3]
    out = ops.topk(qt, 3, largest=largest)
    assert out.shape == (4, 3)
    np.testing.assert_array_equal(_fq(out), want)
    np.testing.assert_array_equal(np.asarray(out.scales), np.asarray(qt.scales))
    out0 = ops.topk(qt, 2, axis=0, largest=largest)
    o0 = np.sort(f, axis=0)
    np.testing.assert_array_equal(_fq(out0), np.flip(o0, 0)[:2] if largest else o0[:2])
    qb = aq.quantize(x, BLOCK)
    ob = np.sort(_fq(qb), axis=1)
    _same_quantized(
        ops.topk(qb, 4, largest=largest), aq.quantize(np.flip(ob, 1)[:, :4] if largest else ob[:, :4], BLOCK)
    )


# -- bool, int, masks ------------------------------------------------------------------------------
COMPARE = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "less": np.less,
    "less_equal": np.less_equal,
}


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_comparisons(name: str) -> None:
    q1 = aq.quantize(_x(), PER_TENSOR)
    q2 = aq.quantize(np.flip(_x(), 1).copy(), PER_TENSOR)  # the same values elsewhere: some equal pairs
    f1, f2 = _fq(q1), _fq(q2)
    fn, ref = getattr(ops, name), COMPARE[name]
    scalar = float(f1[0, 0])
    for a, b, want in [
        (q1, q2, ref(f1, f2)),
        (q1, scalar, ref(f1, np.float32(scalar))),
        (q1, f2, ref(f1, f2)),
        (scalar, q2, ref(np.float32(scalar), f2)),
    ]:
        out = fn(a, b)
        assert out.dtype == np.bool_
        np.testing.assert_array_equal(out, want)
    assert fn(q1, q1).all() == (name in ("equal", "greater_equal", "less_equal"))


def test_isnan_isinf_any_all() -> None:
    qt = aq.quantize(np.array([[1.0, np.nan, -2.0, np.inf]], dtype=np.float32), "e4m3", check_finite=False)
    f = _fq(qt)
    np.testing.assert_array_equal(ops.isnan(qt), np.isnan(f))
    assert ops.isnan(qt).tolist() == [[False, True, False, False]]
    np.testing.assert_array_equal(ops.isinf(qt), np.isinf(f))
    z = aq.quantize(np.array([[0.0, 0.0, 1.0], [0.0, 2.0, 3.0]], dtype=np.float32), PER_TENSOR)
    assert ops.any(z).dtype == np.bool_
    assert bool(ops.any(z))
    assert not bool(ops.all(z))
    assert ops.any(z, axis=0).tolist() == [False, True, True]
    assert ops.all(z, axis=1, keepdims=True).tolist() == [[False], [False]]
    assert ops.all(z, axis=0).tolist() == [False, False, True]


def test_arg_ops() -> None:
    qt = aq.quantize(_x((4, 8)), BLOCK)
    f = _fq(qt)
    np.testing.assert_array_equal(ops.argmax(qt, axis=1), np.argmax(f, axis=1))
    np.testing.assert_array_equal(ops.argmin(qt, axis=0, keepdims=True), np.argmin(f, axis=0, keepdims=True))
    assert int(ops.argmax(qt)) == int(np.argmax(f))
    np.testing.assert_array_equal(ops.argsort(qt, axis=0), np.argsort(f, axis=0, kind="stable"))
    np.testing.assert_array_equal(ops.argsort(qt, descending=True), np.argsort(-f, axis=-1, kind="stable"))
    assert np.issubdtype(ops.argmax(qt, axis=1).dtype, np.integer)


def test_where_and_mask_fill() -> None:
    qt = aq.quantize(_x(), BLOCK)
    f = _fq(qt)
    mask = f > 0
    out = ops.where(mask, qt, 0.5)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.where(mask, f, np.float32(0.5)))
    other = _x(seed=3)
    np.testing.assert_array_equal(ops.where(mask, other, qt), np.where(mask, other, f))
    np.testing.assert_array_equal(ops.mask_fill(qt, mask, -1.0), np.where(mask, np.float32(-1.0), f))
    row = np.array([True] + [False] * 7)
    np.testing.assert_array_equal(ops.mask_fill(qt, row, 9.0), np.where(row, np.float32(9.0), f))


# -- output kinds ----------------------------------------------------------------------------------
def test_output_kinds() -> None:
    qt = aq.quantize(np.abs(_x()) + 0.1, PER_TENSOR)
    mask = _fq(qt) > 1
    always_float = ["exp", "log", "log1p", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "erf"]
    always_float += ["reciprocal", "round", "floor", "ceil", "sign", "square"]
    for name in always_float:
        assert isinstance(getattr(ops, name)(qt), np.ndarray), name
    assert isinstance(ops.remainder(qt, qt), np.ndarray)
    assert isinstance(ops.where(mask, qt, qt), np.ndarray)
    assert isinstance(ops.mask_fill(qt, mask, 0.0), np.ndarray)
    for name in ["abs", "max", "min", "sort"]:
        assert isinstance(getattr(ops, name)(qt), aq.QuantizedTensor), name
    assert isinstance(ops.topk(qt, 2), aq.QuantizedTensor)
    flow = {
        "negative": lambda p: ops.negative(qt, propagation=p),
        "clip": lambda p: ops.clip(qt, 0.2, 0.9, propagation=p),
        "add": lambda p: ops.add(qt, qt, propagation=p),
        "pow": lambda p: ops.pow(qt, 2.0, propagation=p),
        "sum": lambda p: ops.sum(qt, propagation=p),
        "prod": lambda p: ops.prod(qt, axis=0, propagation=p),
        "mean": lambda p: ops.mean(qt, axis=1, propagation=p),
        "cumulative_prod": lambda p: ops.cumulative_prod(qt, axis=1, propagation=p),
        "cumulative_min": lambda p: ops.cumulative_min(qt, axis=1, propagation=p),
    }
    for name, call in flow.items():
        floats = call("inhibit")  # a full reduction gives NumPy's 0-d result, a NumPy scalar
        assert isinstance(floats, (np.ndarray, np.float32)), name
        assert floats.dtype == np.float32, name
        assert isinstance(call("propagate"), aq.QuantizedTensor), name
    assert ops.greater(qt, 1.0).dtype == np.bool_
    assert ops.isinf(qt).dtype == np.bool_
    assert np.issubdtype(ops.argmin(qt, axis=0).dtype, np.integer)


# -- errors ----------------------------------------------------------------------------------------
def test_errors() -> None:
    qt = aq.quantize(_x(), PER_TENSOR)
    with pytest.raises(SchemeError, match=r"propagation must be 'inhibit'.*got 'quantize'"):
        ops.add(qt, qt, propagation="quantize")
    with pytest.raises(SchemeError, match="propagation must be"):
        ops.sum(qt, propagation=None)
    other = aq.quantize(_x((3, 8)), PER_TENSOR)
    with pytest.raises(ShapeError, match=r"shapes do not broadcast: x1 \[4, 8\], x2 \[3, 8\]"):
        ops.multiply(qt, other)
    with pytest.raises(ShapeError, match=r"x1 \[4, 8\], x2 \[5\]"):
        ops.less(qt, np.zeros(5, dtype=np.float32))
    with pytest.raises(ShapeError, match=r"axis 2 is out of range for a 2-d tensor; use an axis in -2\.\.1"):
        ops.sum(qt, axis=2)
    with pytest.raises(ShapeError, match="axis -3 is out of range"):
        ops.max(qt, axis=-3)
    with pytest.raises(ShapeError, match="names an axis twice"):
        ops.mean(qt, axis=(1, -1))
    with pytest.raises(ShapeError, match="axis must be an int, got"):
        ops.argmax(qt, axis=(0, 1))
    with pytest.raises(ShapeError, match="axis is required for a 2-d tensor"):
        ops.cumulative_sum(qt)
    with pytest.raises(ShapeError, match=r"k must be an int in 1\.\.8 \(the extent of axis 1\), got 9"):
        ops.topk(qt, 9)
    with pytest.raises(ShapeError, match="k must be an int"):
        ops.topk(qt, 0)
    with pytest.raises(DTypeError, match=r"at least one operand must be an aq\.QuantizedTensor"):
        ops.add(np.ones(3, dtype=np.float32), 1.0)
    with pytest.raises(DTypeError, match=r"x must be an aq\.QuantizedTensor"):
        ops.exp(np.ones(3, dtype=np.float32))
    with pytest.raises(
        DTypeError, match="x2 must be a QuantizedTensor, an Array API array or a Python scalar, got list"
    ):
        ops.add(qt, [1.0])
    with pytest.raises(DTypeError, match="condition must be a bool array, got dtype float32"):
        ops.where(np.ones((4, 8), dtype=np.float32), qt, 0.0)
    with pytest.raises(DTypeError, match="value must be a Python scalar, got ndarray"):
        ops.mask_fill(qt, np.ones((4, 8), dtype=bool), np.float32([1.0]))
    with pytest.raises(ShapeError, match=r"mask \[2, 4, 8\] must broadcast to x's shape \[4, 8\]"):
        ops.mask_fill(qt, np.ones((2, 4, 8), dtype=bool), 1.0)


def test_mixed_namespaces_raise_device_error() -> None:
    strict = pytest.importorskip("array_api_strict")
    qt = aq.quantize(_x(), PER_TENSOR)
    with pytest.raises(DeviceError, match=r"x2 is a array_api_strict.*but the data lives in"):
        ops.add(qt, strict.asarray(_x()))
    on1 = aq.quantize(strict.asarray(_x(), device=strict.Device("device1")), PER_TENSOR)
    on0 = aq.quantize(strict.asarray(_x()), PER_TENSOR)
    with pytest.raises(DeviceError, match="x2 is on device"):
        ops.subtract(on0, on1)
    with pytest.raises(DeviceError, match="mask is on device"):
        ops.mask_fill(on0, strict.asarray(np.ones((4, 8), dtype=bool), device=strict.Device("device1")), 1.0)


# -- every backend ---------------------------------------------------------------------------------
def test_backends(xp: object) -> None:
    """A representative subset on each backend against the NumPy oracle of the same tensors."""
    x1, x2 = _x(), _x(seed=1)
    ref1, ref2 = aq.quantize(x1, PER_TENSOR), aq.quantize(x2, NATIVE_BLOCK)
    f1, f2 = _fq(ref1), _fq(ref2)
    q1, q2 = aq.quantize(xp.asarray(x1), PER_TENSOR), aq.quantize(xp.asarray(x2), NATIVE_BLOCK)
    np.testing.assert_array_equal(_host(ops.add(q1, q2)), f1 + f2)
    got = ops.multiply(q2, 2.0, propagation="propagate")
    want = aq.quantize(f2 * np.float32(2), NATIVE_BLOCK)
    np.testing.assert_array_equal(np.asarray(_host(got.codes())), np.asarray(want.codes()))
    np.testing.assert_array_equal(_host(got.scales), np.asarray(want.scales))
    np.testing.assert_allclose(_host(ops.exp(q1)), np.exp(f1), rtol=1e-6)
    np.testing.assert_allclose(_host(ops.erf(q2)), [[math.erf(float(v)) for v in r] for r in f2], atol=2e-7)
    np.testing.assert_allclose(_host(ops.sum(q1, axis=1)), f1.sum(axis=1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(_host(ops.cumulative_max(q2, axis=1)), np.maximum.accumulate(f2, axis=1))
    np.testing.assert_array_equal(_host(ops.max(q1, axis=1)), f1.max(axis=1))
    np.testing.assert_array_equal(_host(ops.min(q1)), [f1.min()])
    np.testing.assert_array_equal(_host(ops.sort(q1, axis=0)), np.sort(f1, axis=0))
    np.testing.assert_array_equal(_host(ops.topk(q1, 3)), np.flip(np.sort(f1, axis=1), 1)[:, :3])
    np.testing.assert_array_equal(_host(ops.greater_equal(q1, q2)), f1 >= f2)
    np.testing.assert_array_equal(_host(ops.argmax(q2, axis=0)), np.argmax(f2, axis=0))
    np.testing.assert_array_equal(_host(ops.where(ops.less(q1, 0.0), q1, 0.0)), np.where(f1 < 0, f1, np.float32(0)))
    np.testing.assert_array_equal(_host(ops.round(q2)), np.round(f2))


# -- Burn's vectors --------------------------------------------------------------------------------
# tracel-ai/burn @ 2c06be35 (2026-08-21), crates/burn-backend-tests/tests/tensor/float/quantization/
# ops/extended/<file>: inputs built with QTensor::int8 (Q8S, per tensor, f32 scale, native i8 store,
# MinMax), compared after .dequantize() with Burn's tolerance (R, A): |x - y| < max(A, R * max|x|,|y|).
_M23 = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
BURN_VECTORS = [
    # file::test, call, inputs, expected, (R, A)
    (
        "aggregation.rs::test_should_sum_last_dim",
        lambda a: ops.sum(a, axis=1, keepdims=True),
        [_M23],
        [[3.0], [12.0]],
        (0, 0.1),
    ),
    (
        "aggregation.rs::test_should_mean_first_dim",
        lambda a: ops.mean(a, axis=0, keepdims=True),
        [[[3.0, 1.0, 2.0], [4.0, 2.0, 3.0]]],
        [[3.5, 1.5, 2.5]],
        (0, 0.1),
    ),
    (
        "aggregation.rs::test_prod_dim_float",
        lambda a: ops.prod(a, axis=1, keepdims=True),
        [[[2.0, 1.0, 2.0], [3.0, 4.0, 5.0]]],
        [[4.0], [60.0]],
        (0, 0.1),
    ),
    ("clamp.rs::clamp_min_max", lambda a: ops.clip(a, 1.0, 4.0), [_M23], [[1.0, 1.0, 2.0], [3.0, 4.0, 4.0]], (0, 0.1)),
    ("erf.rs::should_support_erf_ops", ops.erf, [_M23], [[0.0, 0.8427, 0.9953], [1.0, 1.0, 1.0]], (0, 0.1)),
    (
        "erf.rs::should_support_erf_ops_with_negative_number",
        ops.erf,
        [[[-0.056, -0.043, -0.089], [3.0, 4.0, 5.0]]],
        [[-0.06312324, -0.048490416, -0.10016122], [1.0, 1.0, 1.0]],
        (0, 0.1),
    ),
    (
        "mask.rs::should_support_mask_fill_ops",
        lambda a: ops.mask_fill(a, np.array([[True, False], [False, True]]), 2.0),
        [[[1.0, 7.0], [2.0, 3.0]]],
        [[2.0, 7.0], [2.0, 2.0]],
        (0, 0.1),
    ),
    (
        "mask.rs::should_support_mask_where_ops",  # t.mask_where(mask, v) = where(mask, v, t)
        lambda a, v: ops.where(np.array([[True, False], [False, True]]), v, a),
        [[[1.0, 7.0], [2.0, 3.0]], [[1.8, 2.8], [3.8, 4.8]]],
        [[1.8, 7.0], [2.0, 4.8]],
        (0, 0.1),
    ),
    ("maxmin.rs::test_max_dim_2d", lambda a: ops.max(a, axis=1, keepdims=True), [_M23], [[2.0], [5.0]], (2e-2, 1e-2)),
    (
        "powf_scalar.rs::should_support_powf_ops",
        lambda a: ops.pow(a, 0.71),
        [_M23],
        [[0.0, 1.0, 1.6358], [2.182, 2.6759, 3.1352]],
        (4e-2, 1e-2),
    ),
    (
        "powf_scalar.rs::should_support_neg_values_with_odd_power",
        lambda a: ops.pow(a, 3.0),
        [[[0.0, -1.0, -2.0], [-3.0, -4.0, -4.0]]],
        [[0.0, -1.0, -8.0], [-27.0, -64.0, -64.0]],
        (4e-2, 1e-2),
    ),
    (
        "remainder.rs::should_support_remainder_float",
        ops.remainder,
        [[1.0, 2.0, 3.0, 4.0, 5.0], [1.4233, 2.7313, 0.2641, 1.9651, 0.5897]],
        [1.0, 2.0, 0.0949, 0.0698, 0.2824],
        (0, 0.1),
    ),
    ("round.rs::should_round_ties_even", ops.round, [[5.5]], [6.0], (0, 0.1)),
    (
        "sort_argsort.rs::test_sort_1d_float",
        lambda a: ops.sort(a, axis=0),
        [[0.5, 1.2, -0.21, 0.0, 2.1, 0.94, -0.3, 2.3, 5.2, 4.0, 0.99, 3.0, -8.1]],
        [-8.1, -0.3, -0.21, 0.0, 0.5, 0.94, 0.99, 1.2, 2.1, 2.3, 3.0, 4.0, 5.2],
        (0, 0.1),
    ),
    (
        "topk.rs::test_topk",  # #[ignore]d in Burn; the values still hold
        lambda a: ops.topk(a, 2, axis=2),
        [[[[1.0, 4.0, 7.0], [2.0, 5.0, 6.0]], [[3.0, 0.0, 9.0], [8.0, 2.0, 7.0]]]],
        [[[7.0, 4.0], [6.0, 5.0]], [[9.0, 3.0], [8.0, 7.0]]],
        (0, 0.1),
    ),
    (
        "arg.rs::test_argmax_2d_dim1",
        lambda a: ops.argmax(a, axis=1, keepdims=True),
        [[[10.0, 11.0, 2.0], [3.0, 4.0, 5.0]]],
        [[1], [2]],
        (0, 0),
    ),
]


@pytest.mark.parametrize(("name", "call", "inputs", "expected", "tol"), BURN_VECTORS, ids=[v[0] for v in BURN_VECTORS])
def test_burn_vectors(name: str, call: object, inputs: list, expected: list, tol: tuple[float, float]) -> None:
    qts = [aq.quantize(np.asarray(i, dtype=np.float32), PER_TENSOR) for i in inputs]
    got = _host(call(*qts)).astype(np.float64)  # type: ignore[operator]
    want = np.asarray(expected, dtype=np.float64)
    assert got.shape == want.shape
    r, a = tol
    ok = (got == want) | (np.abs(got - want) < np.maximum(a, r * np.maximum(np.abs(got), np.abs(want))))
    assert ok.all(), (got, want)


# -- indexed updates, mask_select, maximum/minimum (Burn scatter, select_assign, slice_assign,
# mask_select, max_pair, min_pair) -----------------------------------------------------------------
def _scatter_oracle(f: np.ndarray, idx: np.ndarray, v: np.ndarray, axis: int) -> np.ndarray:
    """torch.scatter_add by an explicit loop over every element of ``idx``."""
    out = f.astype(np.float64)
    for pos in np.ndindex(*idx.shape):
        dest = list(pos)
        dest[axis] = idx[pos]
        out[tuple(dest)] += v[pos]
    return out


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("scheme", [PER_TENSOR, NATIVE_BLOCK])
def test_scatter_add_matches_loop(axis: int, scheme: str) -> None:
    qt = aq.quantize(_x((2, 3, 4)), scheme)
    f = _fq(qt)
    shape = list(f.shape)
    shape[axis] = 5  # more updates than positions: repeated indices must accumulate
    rng = np.random.default_rng(3)
    idx = rng.integers(0, f.shape[axis], size=shape)
    vals = aq.quantize(rng.standard_normal(shape).astype(np.float32), PER_TENSOR)
    got = ops.scatter_add(qt, idx, vals, axis=axis)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _scatter_oracle(f, idx, _fq(vals), axis % 3), rtol=1e-6, atol=1e-6)
    # a float-array values operand and negative indices (counted from the end)
    raw = rng.standard_normal(shape).astype(np.float32)
    got = ops.scatter_add(qt, idx - f.shape[axis], raw, axis=axis)
    np.testing.assert_allclose(got, _scatter_oracle(f, idx, raw, axis % 3), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_index_add_matches_loop(axis: int) -> None:
    qt = aq.quantize(_x((3, 4)), PER_TENSOR)
    f = _fq(qt)
    idx = np.array([1, 1, 0, -1, 2])
    shape = list(f.shape)
    shape[axis] = len(idx)
    v = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    want = f.astype(np.float64)
    ax = axis % 2
    for k, i in enumerate(idx):
        dest = [slice(None)] * 2
        dest[ax] = i
        src = [slice(None)] * 2
        src[ax] = k
        want[tuple(dest)] += v[tuple(src)]
    got = ops.index_add(qt, idx, aq.quantize(v, "q8s:block4:native"), axis=axis)
    vq = _fq(aq.quantize(v, "q8s:block4:native"))
    want_q = f.astype(np.float64)
    for k, i in enumerate(idx):
        dest = [slice(None)] * 2
        dest[ax] = i
        src = [slice(None)] * 2
        src[ax] = k
        want_q[tuple(dest)] += vq[tuple(src)]
    np.testing.assert_allclose(got, want_q, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ops.index_add(qt, idx, v, axis=axis), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "key",
    [
        (slice(1, 3), slice(None, None, 2)),
        (1, Ellipsis),
        (Ellipsis, slice(None, None, -1)),
        (-1,),
        (slice(None), 2, slice(3, 0, -2)),
        slice(0, 10),  # clamps like Python's slicing
        (0, 1, 2),
    ],
    ids=str,
)
def test_slice_assign_matches_numpy_setitem(key: object) -> None:
    qt = aq.quantize(_x((3, 4, 5)), PER_TENSOR)
    f = _fq(qt)
    region = f[key].shape
    v = np.random.default_rng(5).standard_normal(region).astype(np.float32)
    want = f.copy()
    want[key] = v
    got = ops.slice_assign(qt, key, v)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_slice_assign_empty_region_and_quantized_values() -> None:
    qt = aq.quantize(_x((3, 4)), PER_TENSOR)
    f = _fq(qt)
    # an empty region assigns nothing (Burn returns the tensor unchanged)
    np.testing.assert_array_equal(ops.slice_assign(qt, (slice(2, 2),), np.zeros((0, 4), np.float32)), f)
    vq = aq.quantize(_x((2, 4), seed=6), "q8s:block4:native")
    want = f.copy()
    want[1:3] = _fq(vq)
    np.testing.assert_array_equal(ops.slice_assign(qt, (slice(1, 3),), vq), want)


@pytest.mark.parametrize("scheme", [PER_TENSOR, "q4s", "q2s:native"])
def test_mask_select_per_tensor_keeps_codes_and_scale(scheme: str) -> None:
    qt = aq.quantize(_x((4, 8)), scheme)
    mask = np.random.default_rng(7).random((4, 8)) < 0.4
    got = ops.mask_select(qt, mask)
    assert isinstance(got, aq.QuantizedTensor)
    assert got.scheme == qt.scheme
    assert got.shape == (int(mask.sum()),)
    np.testing.assert_array_equal(np.asarray(got.codes()), np.asarray(qt.codes())[mask])
    np.testing.assert_array_equal(np.asarray(got.scales), np.asarray(qt.scales))


def test_mask_select_block_requantizes_selected_values() -> None:
    qt = aq.quantize(_x((4, 8)), NATIVE_BLOCK)
    mask = np.random.default_rng(8).random((4, 8)) < 0.5
    _same_quantized(ops.mask_select(qt, mask), aq.quantize(_fq(qt)[mask], NATIVE_BLOCK))


def test_maximum_minimum_follow_burns_mask_where() -> None:
    q1, q2 = aq.quantize(_x(), PER_TENSOR), aq.quantize(_x(seed=1), NATIVE_BLOCK)
    f1, f2 = _fq(q1), _fq(q2)
    got = ops.maximum(q1, q2)
    assert isinstance(got, np.ndarray)  # Burn's mask_where returns floats whatever the propagation
    np.testing.assert_array_equal(got, np.maximum(f1, f2))
    np.testing.assert_array_equal(ops.minimum(q1, q2), np.minimum(f1, f2))
    np.testing.assert_array_equal(ops.maximum(q1, 0.0), np.maximum(f1, np.float32(0)))
    # x1.mask_where(x1 < x2, x2): a NaN in x2 never wins (np.maximum would give NaN)
    nan = np.full((4, 8), np.nan, np.float32)
    np.testing.assert_array_equal(ops.maximum(q1, nan), f1)
    np.testing.assert_array_equal(ops.minimum(q1, nan), f1)


def test_float_math_is_quiet_like_burn() -> None:
    qt = aq.quantize(np.array([0.0, 1.0, -1.0], np.float32), PER_TENSOR)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(ops.log(qt), [-np.inf, 0.0, np.nan])
        np.testing.assert_array_equal(ops.reciprocal(qt), [np.inf, 1.0, -1.0])
        np.testing.assert_array_equal(ops.divide(qt, 0.0), [np.nan, np.inf, -np.inf])
        np.testing.assert_array_equal(ops.sqrt(qt), [0.0, 1.0, np.nan])


def test_float_math_is_quiet_on_dask_when_computed() -> None:
    da = pytest.importorskip("dask.array")
    qt = aq.quantize(da.from_array(np.array([0.0, 1.0, 2.0, 0.0], np.float32), chunks=2), PER_TENSOR)
    lazy = ops.log(qt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = lazy.compute()  # NumPy runs here, after ops.log has returned
    f = np.asarray(aq.dequantize(qt).compute())
    assert f[0] == f[3] == 0.0
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(got, np.log(f))


def test_update_and_select_errors() -> None:
    qt = aq.quantize(_x((3, 4)), PER_TENSOR)
    idx = np.zeros((3, 4), np.int64)
    v = np.zeros((3, 4), np.float32)
    with pytest.raises(ShapeError, match=r"scatter_add indices \[3, 4\] and values \[3, 2\] must have the same shape"):
        ops.scatter_add(qt, idx, v[:, :2], axis=1)
    with pytest.raises(ShapeError, match=r"indices \[2, 4\] must have x's shape \[3, 4\] on every axis but axis 1"):
        ops.scatter_add(qt, idx[:2], v[:2], axis=1)
    with pytest.raises(ShapeError, match=r"scatter_add indices must lie in \[-4, 4\) for an axis of length 4"):
        ops.scatter_add(qt, idx + 4, v, axis=1)
    with pytest.raises(ShapeError, match="axis 2 is out of range for a 2-d tensor"):
        ops.scatter_add(qt, idx, v, axis=2)
    with pytest.raises(DTypeError, match="scatter_add indices must be an integer array, got dtype float32"):
        ops.scatter_add(qt, v, v, axis=0)
    with pytest.raises(DTypeError, match="values must be a QuantizedTensor or an Array API array, got list"):
        ops.scatter_add(qt, idx, [0.0], axis=0)
    with pytest.raises(DTypeError, match="values must hold real numbers, got dtype bool"):
        ops.index_add(qt, np.array([0]), np.zeros((1, 4), bool), axis=0)
    with pytest.raises(DTypeError, match=r"x must be an aq\.QuantizedTensor"):
        ops.index_add(v, np.array([0]), v, axis=0)
    with pytest.raises(ShapeError, match=r"index_add indices must be 1-d, got shape \[1, 1\]"):
        ops.index_add(qt, np.array([[0]]), v, axis=0)
    with pytest.raises(ShapeError, match=r"index_add values must have shape \[2, 4\] .*got \[3, 4\]"):
        ops.index_add(qt, np.array([0, 2]), v, axis=0)
    with pytest.raises(ShapeError, match=r"index_add indices must lie in \[-3, 3\)"):
        ops.index_add(qt, np.array([3]), v[:1], axis=0)
    with pytest.raises(ShapeError, match=r"slice_assign values must have the region's shape \[2, 4\]"):
        ops.slice_assign(qt, (slice(0, 2),), v)
    with pytest.raises(ShapeError, match=r"slice_assign takes basic indices .*got None"):
        ops.slice_assign(qt, (None,), v)
    with pytest.raises(ShapeError, match="has more than one Ellipsis"):
        ops.slice_assign(qt, (Ellipsis, Ellipsis), v)
    with pytest.raises(ShapeError, match="indexes 3 axes, but x has only 2"):
        ops.slice_assign(qt, (0, 0, 0), v)
    with pytest.raises(ShapeError, match="slice_assign index 3 is out of range for axis 0 of length 3"):
        ops.slice_assign(qt, (3,), v[0])
    with pytest.raises(ShapeError, match="has step 0; use a non-zero step"):
        ops.slice_assign(qt, (slice(None, None, 0),), v)
    with pytest.raises(DTypeError, match="mask must be a bool array, got dtype float32"):
        ops.mask_select(qt, v)
    with pytest.raises(ShapeError, match=r"mask_select mask \[4, 3\] must have x's shape \[3, 4\]"):
        ops.mask_select(qt, np.ones((4, 3), bool))
    with pytest.raises(ShapeError, match="the mask selects no element, and a QuantizedTensor has at least one"):
        ops.mask_select(qt, np.zeros((3, 4), bool))
    q2d = aq.quantize(_x((4, 8)), "q8s:block2x4:native")  # no error: the 1-d result keeps blocks of 4
    sel = ops.mask_select(q2d, np.ones((4, 8), bool))
    want = aq.quantize(np.asarray(aq.dequantize(q2d)).reshape(-1), "q8s:block4:f32:native")
    assert sel.scheme == want.scheme
    np.testing.assert_array_equal(sel.values, want.values)
    with pytest.raises(ShapeError, match=r"shapes do not broadcast: x1 \[3, 4\], x2 \[5\]"):
        ops.maximum(qt, np.zeros(5, np.float32))
    with pytest.raises(DTypeError, match="at least one operand must be"):
        ops.minimum(v, v)


def test_mask_select_on_dask_is_unavailable() -> None:
    da = pytest.importorskip("dask.array")
    qt = aq.quantize(da.from_array(_x((2, 4))), PER_TENSOR)
    with pytest.raises(BackendUnavailableError, match=r"mask_select has no lazy form on Dask .*to_backend"):
        ops.mask_select(qt, da.from_array(np.ones((2, 4), bool)))


def test_updates_and_selections_on_backends(xp: object) -> None:
    x = _x((3, 4))
    ref = aq.quantize(x, PER_TENSOR)
    f = _fq(ref)
    qt = aq.quantize(xp.asarray(x), PER_TENSOR)
    idx = np.array([[2, 0, 1, 2], [0, 0, 0, 1]])
    v = _x((2, 4), seed=9)
    got = ops.scatter_add(qt, xp.asarray(idx), xp.asarray(v), axis=0)
    np.testing.assert_allclose(_host(got), _scatter_oracle(f, idx, v, 0), rtol=1e-6, atol=1e-6)
    w = _x((3, 2), seed=10)
    want = f.astype(np.float64)
    want[:, 1] += w[:, 0]
    want[:, 1] += w[:, 1]
    got = ops.index_add(qt, xp.asarray(np.array([1, 1])), xp.asarray(w), axis=1)
    np.testing.assert_allclose(_host(got), want, rtol=1e-6, atol=1e-6)
    want = f.copy()
    want[1:, ::-2] = w[:2]
    got = ops.slice_assign(qt, (slice(1, None), slice(None, None, -2)), xp.asarray(w[:2]))
    np.testing.assert_array_equal(_host(got), want)
    np.testing.assert_array_equal(_host(ops.maximum(qt, 0.0)), np.maximum(f, np.float32(0)))
    np.testing.assert_array_equal(_host(ops.minimum(qt, 0.0)), np.minimum(f, np.float32(0)))
    if xp.backend.value == "dask":  # type: ignore[attr-defined]
        return  # mask_select: no lazy form (tested above)
    mask = f > 0
    got = ops.mask_select(qt, xp.asarray(mask))
    np.testing.assert_array_equal(_host(got.codes()), np.asarray(ref.codes())[mask])
    np.testing.assert_array_equal(_host(got.scales), np.asarray(ref.scales))
