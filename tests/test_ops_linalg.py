"""matmul with quantized operands: Burn's vectors, the exact integer and ternary paths, tracing, errors.

Oracles: the expected values of Burn's ``crates/burn-backend-tests/tests/tensor/float/quantization/
ops/matmul.rs`` and ``ops/extended/ternary_matmul.rs`` (tracel-ai/burn @ 2c06be35), NumPy int64 and
float64 arithmetic on the stored codes and scales, and a plain-Python transcription of
burn-ndarray's ``ternary_matmul`` loop.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import arrayquant as aq
from arrayquant import fused
from arrayquant.backends import shim
from arrayquant.errors import DeviceError, DTypeError, ParamsError, SchemeError, ShapeError
from arrayquant.ops import linalg

U = 2.0**-24  # unit roundoff of f32
INT8 = "q8s:native"  # Burn's QTensor::int8: Q8S, per tensor, f32 scale, Native store (MinMax)
F32 = np.float32


def host(a):
    return np.asarray(shim.to_host(a))


def moved(xp, qt: aq.QuantizedTensor) -> aq.QuantizedTensor:
    """``qt`` quantized on NumPy, its arrays put on ``xp`` (quantizing blocks under JAX compiles for seconds)."""
    return dataclasses.replace(
        qt,
        values=xp.asarray(qt.values),
        scales=xp.asarray(qt.scales),
        global_scale=None if qt.global_scale is None else xp.asarray(qt.global_scale),
        dtype=getattr(xp.xp, str(qt.dtype)),
    )


def burn_close(actual, expected, rel=0.0, abs_=0.0) -> bool:
    """Burn's ``assert_approx_eq``: equal, or ``|x - y| < max(abs, rel * max(|x|, |y|))``."""
    x, y = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert x.shape == y.shape
    return bool(np.all((x == y) | (np.abs(x - y) < np.maximum(abs_, rel * np.maximum(np.abs(x), np.abs(y))))))


def q(xp, data, scheme=INT8):
    """Quantized on ``xp`` itself; under JAX on NumPy, then moved (JAX compiles quantize per shape: slow)."""
    x = np.asarray(data, dtype=F32)
    if xp.backend.value == "jax":
        return moved(xp, aq.quantize(x, scheme))
    return aq.quantize(xp.asarray(x), scheme)


# -- Burn's vectors (ops/matmul.rs) --------------------------------------------------------------------

A_2D = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]]
B_2D = [[2.0, 0.0, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0], [0.0, 1.0, 2.0, 0.0], [1.0, 0.0, 0.0, 1.0]]
E_2D = [[8.0, 7.0, 7.0, 4.0], [24.0, 19.0, 19.0, 8.0], [40.0, 31.0, 31.0, 12.0]]
LHS = [[1.0, 6.35, 2.0, 3.0], [2.0, 3.0, 4.0, 5.0], [1.0, 3.0, 5.0, 7.0]]
RHS = [[4.0, 8.0, 12.7, 1.6], [2.0, 3.0, 6.0, 4.0], [1.0, 5.0, 9.0, 2.5], [3.0, 7.0, 11.0, 0.5]]
E_LR = [[27.7, 58.05, 101.8, 33.5], [33.0, 80.0, 134.4, 27.7], [36.0, 91.0, 152.7, 29.6]]

# the five #[ignore]d tests of matmul.rs: (a, b, expected), all Q8S x Q8S, Tolerance::relative(2e-2)
IGNORED = {
    "vectors": ([[1.0, 2.0, 3.0, 6.35]], [[12.7], [4.0], [5.0], [1.0]], [[42.05]]),
    "2d": (
        [[1.0, 6.35], [2.0, 3.0], [1.0, 3.0]],
        [[4.0, 8.0, 12.7], [2.0, 3.0, 6.0]],
        [[16.7, 27.05, 50.8], [14.0, 25.0, 43.4], [10.0, 17.0, 30.7]],
    ),
    "3d": ([[[1.0, 6.35], [2.0, 3.0]]], [[[12.7, 4.0], [2.0, 3.0]]], [[[25.4, 23.05], [31.4, 17.0]]]),
    "broadcast": (
        [[[1.0, 7.0], [2.0, 3.0]]],
        [[[4.0, 7.0], [2.0, 3.0]], [[2.0, 5.0], [6.0, 3.0]]],
        [[[18.0, 28.0], [14.0, 23.0]], [[44.0, 26.0], [22.0, 19.0]]],
    ),
    "broadcast_4d": (
        [[[[1.0, 7.0], [2.0, 3.0]]], [[[2.0, 5.0], [6.0, 3.0]]]],
        [[[[9.0, 8.0], [1.0, 4.0]], [[2.0, 7.0], [3.0, 5.0]]]],
        [
            [[[16.0, 36.0], [21.0, 28.0]], [[23.0, 42.0], [13.0, 29.0]]],
            [[[23.0, 36.0], [57.0, 60.0]], [[19.0, 39.0], [21.0, 57.0]]],
        ],
    ),
}


@pytest.mark.parametrize("path", ["auto", "reference", "int8"])
def test_burn_matmul_2d_aligned(xp, path):
    # matmul.rs test_matmul_2d_aligned and test_matmul_2d_aligned_fused (the same product / 2)
    out = linalg.matmul(q(xp, A_2D), q(xp, B_2D), path=path)
    assert linalg.matmul_path(q(xp, A_2D), q(xp, B_2D)) == "int8"
    assert burn_close(host(out), E_2D, rel=2e-2)
    assert burn_close(host(out / 2.0), np.asarray(E_2D) / 2, rel=2e-2)


@pytest.mark.parametrize("name", sorted(IGNORED))
@pytest.mark.parametrize("path", ["reference", "int8"])
def test_burn_matmul_ignored_vectors(xp, name, path):
    # matmul.rs test_matmul_{vectors,2d,3d,broadcast,broadcast_4d} (#[ignore] in Burn): their values hold here
    a, b, expected = IGNORED[name]
    out = linalg.matmul(q(xp, a), q(xp, b), path=path)
    assert burn_close(host(out), expected, rel=2e-2)


def test_burn_matmul_lhs_float_rhs_quantized(xp):
    # matmul.rs test_matmul_lhs_float_rhs_quantized: Tolerance::default() (rel 0.005, abs 1e-5), a float output
    out = linalg.matmul(xp.asarray(np.asarray(LHS, dtype=F32)), q(xp, RHS))
    assert not isinstance(out, aq.QuantizedTensor)
    assert host(out).dtype == np.float32
    assert burn_close(host(out), E_LR, rel=0.005, abs_=1e-5)


def test_burn_matmul_lhs_quantized_rhs_float(xp):
    # matmul.rs test_matmul_lhs_quantized_rhs_float: Tolerance::relative(2e-2), a float output
    out = linalg.matmul(q(xp, LHS), xp.asarray(np.asarray(RHS, dtype=F32)))
    assert not isinstance(out, aq.QuantizedTensor)
    assert burn_close(host(out), E_LR, rel=2e-2)


def test_burn_matmul_mixed_block_scale(xp):
    # matmul.rs test_matmul_mixed_block_scale: rhs QTensor::int8_block = Q8S per_block([16]) f32, permissive()
    rhs = [
        [6.110, 4.0, 9.360, 7.850, 0.630, 1.770, 0.430, 7.550, 9.690, 3.560, 2.920, 9.130, 3.390, 0.510, 1.620, 1.460],
        [
            6.140,
            8.260,
            5.660,
            5.610,
            7.070,
            3.050,
            9.890,
            5.520,
            1.350,
            3.810,
            5.630,
            0.250,
            0.350,
            8.860,
            3.610,
            6.240,
        ],
        [
            8.810,
            4.620,
            7.420,
            8.110,
            2.560,
            4.710,
            5.730,
            8.980,
            1.170,
            6.090,
            4.140,
            3.610,
            4.960,
            9.720,
            5.710,
            1.470,
        ],
        [
            2.260,
            9.640,
            6.320,
            6.980,
            9.860,
            1.030,
            8.340,
            1.570,
            4.140,
            4.760,
            4.590,
            6.400,
            5.350,
            1.430,
            4.960,
            1.180,
        ],
    ]
    expected = [
        [69.499, 94.611, 79.101, 80.633, 80.225, 33.647, 99.711, 65.272]
        + [33.022, 54.213, 60.721, 37.138, 31.582, 80.501, 50.843, 47.564],
        [77.180, 99.460, 96.980, 99.870, 82.010, 36.680, 95.150, 75.430]
        + [48.810, 66.710, 62.240, 65.450, 54.420, 73.630, 61.710, 33.420],
        [84.400, 119.360, 107.680, 114.090, 103.660, 41.680, 117.130, 80.0]
        + [48.570, 78.760, 72.640, 72.730, 66.690, 85.700, 75.720, 35.790],
    ]
    out = linalg.matmul(xp.asarray(np.asarray(LHS, dtype=F32)), q(xp, rhs, "q8s:block16:native"))
    assert burn_close(host(out), expected, rel=0.01, abs_=0.01)


def test_burn_matmul_two_level_rhs(xp):
    # matmul.rs should_matmul_two_level_rhs: Q8S per_block([2, 16], F16) + per_tensor(F32), relative(1e-2)
    # against lhs.matmul(rhs.dequantize()), here NumPy's float64 product of the dequantized weight
    m = (np.arange(256, dtype=F32) / F32(256)).reshape(16, 16)
    scheme = aq.QuantScheme().with_value("q8s").per_block([2, 16], "f16").per_tensor("f32").with_store("native")
    wq = q(xp, m, scheme)
    assert linalg.matmul_path(xp.asarray(m), wq) == "reference"
    expected = m.astype(np.float64) @ host(aq.dequantize(wq)).astype(np.float64)
    assert burn_close(host(linalg.matmul(xp.asarray(m), wq)), expected, rel=1e-2)


def test_burn_matmul_inner_dims_differ(np_xp):
    # matmul.rs should_panic_when_inner_dimensions_are_not_equal: [4, 2] @ [3, 4]
    a = q(np_xp, [[3.0, 3.0], [4.0, 4.0], [5.0, 5.0], [6.0, 6.0]])
    b = q(np_xp, [[1.0, 2.0, 3.0, 4.0]] * 3)
    with pytest.raises(ShapeError, match=r"inner dimensions differ: a has shape \(4, 2\).*b has shape \(3, 4\)"):
        linalg.matmul(a, b)


def test_burn_ternary_matches_dequantized(xp):
    # ternary_matmul.rs q2s_ternary_matmul_matches_dequantized: relative(2e-2) against a.matmul(wq.dequantize())
    a = np.asarray([[0.5, -1.2, 0.3, 2.0], [1.0, 0.0, -0.7, 0.4], [-2.0, 1.5, 0.1, -0.3]], dtype=F32)
    w = np.asarray([[0.9, -0.2, 0.5], [-0.8, 0.1, 0.7], [0.0, 0.6, -0.4], [0.3, -0.9, 0.2]], dtype=F32)
    wq = q(xp, w, "q2s:native")
    assert linalg.matmul_path(xp.asarray(a), wq) == "ternary"
    out = host(linalg.matmul(xp.asarray(a), wq))
    expected = a.astype(np.float64) @ host(aq.dequantize(wq)).astype(np.float64)
    assert out.dtype == np.float32
    assert burn_close(out, expected, rel=2e-2)


def test_burn_ternary_all_zero_weight_is_zero(xp):
    # ternary_matmul.rs q2s_ternary_matmul_all_zero_weight_is_zero: exactly 0, no NaN
    a = xp.asarray(np.asarray([[1.0, -2.0, 3.0]], dtype=F32))
    wq = q(xp, np.zeros((3, 1)), "q2s:native")
    out = host(linalg.matmul(a, wq, path="ternary"))
    assert out.tolist() == [[0.0]]


# -- the int8 path: exact sums, one f32 scaling ----------------------------------------------------


def _row_scheme(value: str, k: int) -> aq.QuantScheme:
    return aq.QuantScheme().with_value(value).per_block(k).with_store("native")


def _col_scheme(value: str, k: int) -> aq.QuantScheme:
    return aq.QuantScheme().with_value(value).per_block([k, 1])


INT_CASES = [  # (a scheme, b scheme, a shape, b shape): K past 1024 needs several exact f32 slices for q8
    ("row:q8s", "col:q8f", (5, 2100), (2100, 3)),
    ("q8f", "q8f", (3, 64), (64, 4)),
    ("row:q4s", "q4f", (2, 3, 40), (40, 6)),
    ("q2f", "col:q2s", (7, 33), (33, 5)),
    ("q8s", "col:q4s", (2, 1, 4, 50), (3, 50, 2)),
    ("row:q8s", "q8s", (40,), (40, 3)),
    ("q4s", "q8s", (2, 6, 40), (40,)),
]


def _int_operand(xp, spec: str, shape: tuple[int, ...], seed: int) -> aq.QuantizedTensor:
    x = np.random.default_rng(seed).standard_normal(shape).astype(F32)
    kind, _, value = spec.rpartition(":")
    if kind == "row":
        scheme = _row_scheme(value, shape[-1])
    elif kind == "col":
        scheme = aq.QuantScheme().with_value(value).per_block([shape[-2], 1])
    else:
        scheme = aq.QuantScheme().with_value(value).with_store("native")
    return moved(xp, aq.quantize(x, scheme))


def _row_col_scales(a: aq.QuantizedTensor, b: aq.QuantizedTensor) -> tuple[np.ndarray, np.ndarray]:
    """float64 scale grids broadcasting over the (at least 2-d) product."""
    sa = host(a.scales).astype(np.float64)
    sb = host(b.scales).astype(np.float64)
    return (sa if len(a.shape) > 1 else sa.reshape(1, 1)), (sb if len(b.shape) > 1 else sb.reshape(1, 1))


def _as_2d(c: np.ndarray, is_a: bool) -> np.ndarray:
    return c if c.ndim > 1 else (c.reshape(1, -1) if is_a else c.reshape(-1, 1))


@pytest.mark.parametrize("case", INT_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_int8_sums_equal_int64_oracle(xp, case):
    spec_a, spec_b, shape_a, shape_b = case
    a, b = _int_operand(xp, spec_a, shape_a, 1), _int_operand(xp, spec_b, shape_b, 2)
    assert linalg.matmul_path(a, b) == "int8"
    ca = _as_2d(host(a.codes()).astype(np.int64), True)
    cb = _as_2d(host(b.codes()).astype(np.int64), False)
    sums = host(linalg._int8_sums(a, b))
    assert sums.dtype == np.int32
    np.testing.assert_array_equal(sums, ca @ cb)


def test_int8_sums_past_int32_use_int64(np_xp):
    # K * 128 * 128 > 2^31: the slices are added as int64
    k = 140_000
    rng = np.random.default_rng(3)
    a = aq.quantize(rng.standard_normal((2, k)).astype(F32), "q8f:native")
    b = aq.quantize(rng.standard_normal((k, 2)).astype(F32), "q8f:native")
    sums = linalg._int8_sums(a, b)
    assert sums.dtype == np.int64
    np.testing.assert_array_equal(sums, a.codes().astype(np.int64) @ b.codes().astype(np.int64))


@pytest.mark.parametrize("case", INT_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_int8_within_f32_rounding_of_the_scaling(xp, case):
    """Derived bounds, with ``S`` the exact integer sums and ``u = 2^-24``.

    int8 path: ``fl(fl(fl(S) * sa) * sb)`` — three roundings of the exact ``S * sa * sb``, so
    ``|out - exact| <= ((1 + u)^3 - 1) |exact| < 3.0001 u |exact|``.
    reference: each dequantized value rounded once, each product once, K - 1 additions in some order:
    ``|ref - exact| <= (K + 2) u * sum_k |a_k b_k|`` (first order; 1.01 covers the rest). Hence
    ``|out - ref|`` is at most the sum of the two.
    """
    spec_a, spec_b, shape_a, shape_b = case
    a, b = _int_operand(xp, spec_a, shape_a, 1), _int_operand(xp, spec_b, shape_b, 2)
    out = host(linalg.matmul(a, b, path="int8"))
    ref = host(linalg.matmul(a, b, path="reference"))
    assert out.dtype == ref.dtype == np.float32
    assert out.shape == ref.shape == np.matmul(np.zeros(shape_a), np.zeros(shape_b)).shape
    ca = _as_2d(host(a.codes()).astype(np.float64), True)
    cb = _as_2d(host(b.codes()).astype(np.float64), False)
    sa, sb = _row_col_scales(a, b)
    exact = ((ca @ cb) * sa) * sb  # integers below 2^53 and f32 scales: f64 is exact to 2^-53 here
    magnitude = ((np.abs(ca) @ np.abs(cb)) * sa) * sb
    k = ca.shape[-1]
    out2, ref2 = out.reshape(exact.shape), ref.reshape(exact.shape)
    assert np.all(np.abs(out2 - exact) <= 3.0001 * U * np.abs(exact))
    assert np.all(np.abs(ref2 - exact) <= 1.01 * (k + 2) * U * magnitude)
    assert np.all(np.abs(out2 - ref2) <= 3.0001 * U * np.abs(exact) + 1.01 * (k + 2) * U * magnitude)


def test_int8_closer_to_exact_than_reference(np_xp):
    a, b = _int_operand(np_xp, "row:q8s", (16, 2048), 5), _int_operand(np_xp, "col:q8s", (2048, 16), 6)
    exact = ((a.codes().astype(np.float64) @ b.codes().astype(np.float64)) * a.scales) * b.scales
    err_int8 = np.abs(linalg.matmul(a, b, path="int8") - exact).sum()
    err_ref = np.abs(linalg.matmul(a, b, path="reference") - exact).sum()
    assert err_int8 < err_ref


def test_int8_output_dtype_follows_operands(np_xp):
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float16)
    a, b = aq.quantize(x, INT8), aq.quantize(x.T.copy(), INT8)
    assert linalg.matmul(a, b, path="int8").dtype == np.float16
    assert linalg.matmul(a, b, path="reference").dtype == np.float16


# -- the ternary path ---------------------------------------------------------------------------------


def burn_ternary(a: np.ndarray, t: np.ndarray, gamma: np.float32) -> np.ndarray:
    """burn-ndarray's ternary_matmul, transcribed: per row, k ascending, += / -= / skip, then *= gamma."""
    a2 = a.reshape(-1, a.shape[-1])
    out = np.zeros((a2.shape[0], t.shape[1]), dtype=F32)
    for i in range(a2.shape[0]):
        for kk in range(a2.shape[1]):
            x = a2[i, kk]
            for n in range(t.shape[1]):
                if t[kk, n] == 1:
                    out[i, n] = out[i, n] + x
                elif t[kk, n] == -1:
                    out[i, n] = out[i, n] - x
        out[i] = out[i] * gamma
    return out.reshape((*a.shape[:-1], t.shape[1]))


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=F32).view(np.uint32)


def _ternary_runs(a, wq):
    """(fused where Numba is installed, portable) results of the ternary path."""
    with fused.fused_kernels(False):
        portable = host(linalg.matmul(a, wq, path="ternary"))
    fused_out = host(linalg.matmul(a, wq, path="ternary")) if fused.available() else portable
    return fused_out, portable


def test_ternary_bitwise_burn_loop_with_signed_zeros_and_specials(np_xp):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 9)).astype(F32)
    a[0, :3] = -0.0
    a[1, 4] = np.inf
    a[2, 5] = np.nan
    w = rng.standard_normal((9, 5)).astype(F32)
    wq = aq.quantize(w, "q2s:native")
    t, gamma = wq.codes(), wq.scales[0]
    assert set(np.unique(t)) <= {-1, 0, 1}
    expected = burn_ternary(a, t, gamma)
    for got in _ternary_runs(a, wq):
        np.testing.assert_array_equal(_bits(got), _bits(expected))


@pytest.mark.parametrize("shape", [(6, 40), (2, 3, 40), (40,)])
def test_ternary_integer_activations_exact(xp, shape):
    # integer activations: the sums are small integers (exact in f32), then one multiplication by gamma
    rng = np.random.default_rng(11)
    a = rng.integers(-8, 9, size=shape).astype(F32)
    wq = q(xp, rng.standard_normal((40, 7)), "q2s:native")
    t, gamma = host(wq.codes()).astype(np.int64), host(wq.scales)[0]
    sums = a.astype(np.int64) @ t
    expected = sums.astype(F32) * gamma
    out = host(linalg.matmul(xp.asarray(a), wq))
    assert linalg.matmul_path(xp.asarray(a), wq) == "ternary"
    np.testing.assert_array_equal(_bits(out), _bits(expected))


def test_ternary_fused_equals_portable_and_reference_bound(np_xp):
    """Kernel == portable bit for bit; both within f32 rounding of the exact product.

    ternary: K - 1 additions and one multiplication: ``|out - exact| <= (K + 1) u * gamma * sum_k |a_k t_k|``;
    reference: K products and K - 1 additions (``t * gamma`` is exact): ``<= K u * gamma * sum_k |a_k t_k|``.
    """
    rng = np.random.default_rng(13)
    a = rng.standard_normal((4, 3, 300)).astype(F32)
    wq = aq.quantize(rng.standard_normal((300, 17)).astype(F32), "q2s:native")
    fused_out, portable = _ternary_runs(a, wq)
    np.testing.assert_array_equal(_bits(fused_out), _bits(portable))
    t, gamma = wq.codes().astype(np.float64), np.float64(wq.scales[0])
    exact = (a.astype(np.float64) @ t) * gamma
    magnitude = (np.abs(a).astype(np.float64) @ np.abs(t)) * gamma
    ref = linalg.matmul(a, wq, path="reference")
    assert np.all(np.abs(portable - exact) <= 1.01 * 301 * U * magnitude)
    assert np.all(np.abs(ref - exact) <= 1.01 * 300 * U * magnitude)


@pytest.mark.skipif(not fused.available(), reason=fused.why_not() or "fused kernels on")
def test_ternary_kernel_used_for_numpy_float32(np_xp, monkeypatch):
    from arrayquant.fused import numba_ternary

    calls = []
    real = numba_ternary.ternary_matmul
    monkeypatch.setattr(numba_ternary, "ternary_matmul", lambda *args: calls.append(1) or real(*args))
    wq = aq.quantize(np.ones((4, 2), dtype=F32), "q2s:native")
    linalg.matmul(np.ones((3, 4), dtype=F32), wq)
    assert calls == [1]
    with fused.fused_kernels(False):
        linalg.matmul(np.ones((3, 4), dtype=F32), wq)
    assert calls == [1]


def test_ternary_kernel_supports_reasons():
    from arrayquant.fused import numba_ternary

    if numba_ternary.numba is None:
        assert numba_ternary.supports(np.ones(2, F32), np.ones((2, 2), np.int8)).startswith("numba is not installed")
        return
    assert numba_ternary.supports(np.ones((2, 2), F32), np.ones((2, 2), np.int8)) == ""
    assert "float32 activations" in numba_ternary.supports(np.ones((2, 2)), np.ones((2, 2), np.int8))
    assert "2-d NumPy int8 codes" in numba_ternary.supports(np.ones((2, 2), F32), np.ones((2, 2), np.int16))


# -- propagation ----------------------------------------------------------------------------------------


def test_propagate_requantizes_with_rhs_scheme_else_lhs(xp):
    rng = np.random.default_rng(17)
    x = xp.asarray(rng.standard_normal((4, 8)).astype(F32))
    qa = q(xp, host(x), "q4s:native")
    qb = q(xp, rng.standard_normal((8, 3)), "q8f:native")
    for a, b, scheme, path in (
        (qa, qb, qb.scheme, "int8"),
        (qa, x.T, qa.scheme, "reference"),
        (x, qb, qb.scheme, "reference"),
    ):
        out = linalg.matmul(a, b, propagation="propagate")
        assert isinstance(out, aq.QuantizedTensor)
        assert out.scheme == scheme
        expected = aq.quantize(linalg.matmul(a, b, path=path), scheme)
        np.testing.assert_array_equal(host(out.values), host(expected.values))
        np.testing.assert_array_equal(host(out.scales), host(expected.scales))


def test_ternary_ignores_propagation_as_burn(np_xp):
    wq = aq.quantize(np.asarray([[1.0, -1.0], [0.0, 1.0]], dtype=F32), "q2s:native")
    out = linalg.matmul(np.ones((1, 2), dtype=F32), wq, propagation="propagate")
    assert not isinstance(out, aq.QuantizedTensor)
    assert out.tolist() == [[1.0, 0.0]]
    forced = linalg.matmul(np.ones((1, 2), dtype=F32), wq, propagation="propagate", path="reference")
    assert isinstance(forced, aq.QuantizedTensor)


# -- tracing and laziness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["reference", "int8", "ternary"])
def test_jax_jit_traces_every_path(path):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(19)
    x = rng.standard_normal((3, 8)).astype(F32)
    w = rng.standard_normal((8, 4)).astype(F32)
    wq = aq.quantize(jnp.asarray(w), "q2s:native" if path == "ternary" else "q8s:native")
    xq = aq.quantize(jnp.asarray(x), "q8s:native")

    @jax.jit
    def f(values, scales, xv, xs, xf):
        w_t = aq.QuantizedTensor(wq.scheme, wq.shape, wq.dtype, values, scales)
        x_t = aq.QuantizedTensor(xq.scheme, xq.shape, xq.dtype, xv, xs)
        return linalg.matmul(x_t if path == "int8" else xf, w_t, path=path)

    traced = f(wq.values, wq.scales, xq.values, xq.scales, jnp.asarray(x))
    eager = linalg.matmul(xq if path == "int8" else jnp.asarray(x), wq, path=path)
    np.testing.assert_array_equal(_bits(host(traced)), _bits(host(eager)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's own modules, imported by the compiler
@pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's note on array_api_compat's lru_cache helpers
def test_torch_compile_reference_path():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(23)
    x = torch.asarray(rng.standard_normal((3, 8)).astype(F32))
    wq = aq.quantize(torch.asarray(rng.standard_normal((8, 4)).astype(F32)), "q4s:block8:native")

    def f(values, scales, xf):
        w_t = aq.QuantizedTensor(wq.scheme, wq.shape, wq.dtype, values, scales)
        return linalg.matmul(xf, w_t, path="reference")

    # aot_eager: dynamo traces and AOT-autograd lowers the function without a C++ toolchain
    compiled = torch.compile(f, fullgraph=False, backend="aot_eager")
    out = compiled(wq.values, wq.scales, x)
    expected = x.numpy().astype(np.float64) @ host(aq.dequantize(wq)).astype(np.float64)
    assert np.allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_dask_stays_lazy():
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(29)
    x = rng.standard_normal((6, 16)).astype(F32)
    w = rng.standard_normal((16, 5)).astype(F32)
    dx, dw = da.from_array(x, chunks=(3, 8)), da.from_array(w, chunks=(8, 5))
    for a, b, a_np, b_np, path in (
        (aq.quantize(dx, INT8), aq.quantize(dw, INT8), aq.quantize(x, INT8), aq.quantize(w, INT8), "int8"),
        (dx, aq.quantize(dw, "q2s:native"), x, aq.quantize(w, "q2s:native"), "ternary"),
        (dx, aq.quantize(dw, "q4s:block8:native"), x, aq.quantize(w, "q4s:block8:native"), "reference"),
    ):
        assert linalg.matmul_path(a, b) == path
        out = linalg.matmul(a, b)
        assert isinstance(out, da.Array)
        with fused.fused_kernels(False):
            expected = linalg.matmul(a_np, b_np)
        if path == "reference":  # dask sums the K chunks' products in its own order
            np.testing.assert_allclose(out.compute(), expected, rtol=1e-6, atol=1e-6)
        else:  # exact integer sums, and the ternary sums in k order, whatever the chunks
            np.testing.assert_array_equal(_bits(out.compute()), _bits(expected))


# -- errors ---------------------------------------------------------------------------------------------


def test_error_operand_types(np_xp):
    wq = aq.quantize(np.ones((2, 2), dtype=F32), INT8)
    with pytest.raises(ParamsError, match=r"a must be an aq.QuantizedTensor or an Array API array, got list"):
        linalg.matmul([[1.0, 2.0]], wq)
    with pytest.raises(DTypeError, match=r"b has dtype int32; matmul with a quantized tensor needs a real floating"):
        linalg.matmul(wq, np.ones((2, 2), dtype=np.int32))


def test_error_mixed_namespaces():
    torch = pytest.importorskip("torch")
    wq = aq.quantize(np.ones((2, 2), dtype=F32), INT8)
    with pytest.raises(DeviceError, match=r"b is a torch.Tensor but the data lives in"):
        linalg.matmul(wq, torch.ones((2, 2)))


def test_error_shapes(np_xp):
    wq = aq.quantize(np.ones((2, 3), dtype=F32), INT8)
    with pytest.raises(ShapeError, match=r"at least one dimension, got shapes \(\) and \(2, 3\)"):
        linalg.matmul(np.float32(1.0) * np.ones((), dtype=F32), wq)
    with pytest.raises(
        ShapeError, match=r"a has shape \(4,\) \(last axis 4\), b has shape \(2, 3\) \(second-to-last axis 2\)"
    ):
        linalg.matmul(np.ones(4, dtype=F32), wq)
    with pytest.raises(ShapeError, match=r"b has shape \(3,\) \(only axis 3\)"):
        linalg.matmul(wq.codes().T.astype(F32), aq.quantize(np.ones(3, dtype=F32), INT8))
    with pytest.raises(
        ShapeError, match=r"leading dimensions \(2,\) of a \(2, 4, 2\) and \(3,\) of b \(3, 2, 3\) do not broadcast"
    ):
        linalg.matmul(np.ones((2, 4, 2), dtype=F32), aq.quantize(np.ones((3, 2, 3), dtype=F32), INT8))


def test_error_path_and_propagation_names(np_xp):
    wq = aq.quantize(np.ones((2, 2), dtype=F32), INT8)
    with pytest.raises(
        SchemeError,
        match=r"path must be one of 'auto', 'reference', 'int8', 'ternary', 'fused', 'fused_int8', got 'fast'",
    ):
        linalg.matmul(wq, wq, path="fast")
    with pytest.raises(SchemeError, match=r"propagation must be 'inhibit'.*got 'keep'"):
        linalg.matmul(wq, wq, propagation="keep")


FORCED = [  # (path, a, b, message)
    ("int8", "float", INT8, r"needs both operands quantized, and a is a float array; path='reference' does"),
    ("int8", INT8, "float", r"needs both operands quantized, and b is a float array; path='reference' does"),
    ("int8", "e4m3:native", INT8, r"a holds e4m3 minifloat codes, not integers"),
    ("int8", INT8, "q4f:block8:f32:lookup:nf4", r"b uses a lookup table, not integer codes"),
    ("int8", INT8, "q8s:block8:f16:tensor:f32", r"b has a two-level scheme"),
    ("int8", "q8s:block4:native", INT8, r"a's blocks \(1, 4\) do not span its whole last axis \(8\)"),
    ("int8", INT8, "q8s:block4:native", r"b's blocks \(1, 4\) do not span its whole contracted axis \(8\)"),
    ("ternary", INT8, "q2s:native", r"needs a float array a \(the activations\), and a is quantized; path='int8' does"),
    ("ternary", "float", "float", r"needs a quantized b"),
    ("ternary", "float", INT8, r"needs b quantized as Q2S .*, and b's scheme is q8s:native; path='reference' does"),
    ("ternary", "float", "q2s:block4:native", r"one scale per tensor for b, and b's scheme is q2s:block4"),
    ("ternary", "float64", "q2s:native", r"adds float32 activations, and a has dtype float64"),
]


@pytest.mark.parametrize("case", FORCED, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_error_forced_path_that_does_not_apply(np_xp, case):
    path, sa, sb, message = case
    rng = np.random.default_rng(31)

    def make(spec, shape):
        x = rng.standard_normal(shape).astype(F32)
        if spec == "float":
            return x
        if spec == "float64":
            return x.astype(np.float64)
        return aq.quantize(x, spec)

    a, b = make(sa, (4, 8)), make(sb, (8, 8))
    with pytest.raises(SchemeError, match=rf"path='{path}' does not apply: .*{message}"):
        linalg.matmul(a, b, path=path)


def test_error_ternary_needs_2d_weight(np_xp):
    wq = aq.quantize(np.ones((2, 4, 3), dtype=F32), "q2s:native")
    assert linalg.matmul_path(np.ones((2, 5, 4), dtype=F32), wq) == "reference"
    with pytest.raises(SchemeError, match=r"needs a 2-d b \(K, N\), and b has shape \(2, 4, 3\)"):
        linalg.matmul(np.ones((2, 5, 4), dtype=F32), wq, path="ternary")


# -- the bench rows -----------------------------------------------------------------------------------


def test_bench_matmul_rows(np_xp):
    from arrayquant import bench
    from arrayquant.bench import cases, harness

    host_ = np.zeros((64, 64), dtype=F32)
    b = bench.Bench(host_, host_, "numpy", 1, harness.no_sync, False)
    cases.matmul_cases(b, lambda _: None)
    rows = {r.case: r for r in b.results}
    assert not b.unavailable
    for w in ("q8s", "q8s:block64", "q4s", "q2s"):
        assert rows[f"numpy deq({w}) @ x"].kind == "matmul-numpy"
        for case in (f"{w} @ x reference", f"{w} @ q8s-col(x) int8"):
            assert rows[case].check == "close", case
            assert rows[case].vs_numpy > 0
    assert rows["x.T @ q2s ternary"].check == "close"
    assert "x.T @ q8s ternary" not in rows
    assert rows["q2s @ x reference"].weight_mib == pytest.approx((64 * 64 // 4 + 4) / 2**20)
    text = bench.report({"backend": "numpy", "device": "cpu", "threads": "one"}, 64, 1, b.results, {})
    assert "-- matmul: 64x64 weight, 64x64 f32 input" in text
    other = bench.Bench(host_, host_, "torch", 1, harness.no_sync, False)
    cases.matmul_cases(other, lambda _: None)
    assert other.unavailable == {"matmul": "matmul rows run with --backend numpy only, not torch"}


def test_bench_no_matmul_flag():
    import argparse

    from arrayquant import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args(["--no-matmul"]).no_matmul is True
    assert parser.parse_args([]).no_matmul is False


def test_propagate_to_a_lower_rank_result_fits_the_scheme():
    # a vector or scalar product cannot carry a 2-d block or a store packing axis 1: the nearest scheme
    r = lambda *s: np.random.default_rng(sum(s)).standard_normal(s).astype(F32)
    cases = (
        (aq.quantize(r(64), "q8s"), aq.quantize(r(64), "q8s"), "q8s", (1,)),
        (r(64), aq.quantize(r(64, 4), "q4s:packed_u32:1"), "q4s", (4,)),
        (aq.quantize(r(4, 64), "q8s:block2x16"), r(64), "q8s:block16:f32", (4,)),
    )
    for a, b, scheme, shape in cases:
        got = aq.matmul(a, b, propagation="propagate", path="reference")
        assert str(got.scheme) == scheme
        assert got.shape == shape
        fa = aq.dequantize(a) if isinstance(a, aq.QuantizedTensor) else a
        fb = aq.dequantize(b) if isinstance(b, aq.QuantizedTensor) else b
        want = aq.quantize(np.reshape(np.matmul(fa, fb), shape), scheme)
        np.testing.assert_array_equal(got.values, want.values)
        np.testing.assert_array_equal(got.scales, want.scales)
