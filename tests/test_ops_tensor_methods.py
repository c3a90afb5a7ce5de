"""QuantizedTensor as an array: ``qt.T``, ``qt[...]``, ``qt.reshape``, ``@`` and arithmetic operators.

Each method is the ``aq.ops`` function of the same name; the oracle is NumPy on the codes, the
scale grid and the dequantized values (the operations themselves are tested in test_ops_*.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import arrayquant as aq


def _qt(scheme: str = "q8s:block32:f16") -> tuple[np.ndarray, aq.QuantizedTensor]:
    x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    return x, aq.quantize(x, scheme)


def test_transpose_properties_move_codes_and_scales() -> None:
    _, qt = _qt()
    assert qt.ndim == 2
    for t in (qt.T, qt.mT):
        assert isinstance(t, aq.QuantizedTensor)
        assert t.shape == (64, 4)
        np.testing.assert_array_equal(t.codes(), qt.codes().T)
        np.testing.assert_array_equal(t.scales, qt.scales.T)
        np.testing.assert_array_equal(aq.dequantize(t), aq.dequantize(qt).T)
    x3 = np.random.default_rng(8).standard_normal((2, 3, 32)).astype(np.float32)
    q3 = aq.quantize(x3, "q4s")
    np.testing.assert_array_equal(q3.T.codes(), np.transpose(q3.codes()))  # all axes reversed
    np.testing.assert_array_equal(q3.mT.codes(), np.swapaxes(q3.codes(), -1, -2))


def test_indexing_and_reshape() -> None:
    _, qt = _qt()
    part = qt[1:3, 32:]
    assert isinstance(part, aq.QuantizedTensor)
    np.testing.assert_array_equal(part.codes(), qt.codes()[1:3, 32:])
    np.testing.assert_array_equal(part.scales, qt.scales[1:3, 1:])
    for r in (qt.reshape(2, 128), qt.reshape((2, 128)), qt.reshape([2, -1])):
        assert r.shape == (2, 128)
        np.testing.assert_array_equal(r.codes(), qt.codes().reshape(2, 128))
        np.testing.assert_array_equal(aq.dequantize(r), aq.dequantize(qt).reshape(2, 128))


def test_matmul_operators_on_either_side() -> None:
    x, qt = _qt("q8s")
    a = np.random.default_rng(9).standard_normal((3, 4)).astype(np.float32)
    b = np.random.default_rng(10).standard_normal((64, 5)).astype(np.float32)
    w = aq.dequantize(qt)
    np.testing.assert_allclose(a @ qt, a @ w, rtol=1e-5, atol=1e-5)  # NumPy defers to the tensor
    np.testing.assert_allclose(qt @ b, w @ b, rtol=1e-5, atol=1e-5)
    torch = pytest.importorskip("torch")
    got = torch.asarray(a) @ aq.quantize(torch.asarray(x), "q8s")
    np.testing.assert_allclose(got.numpy(), a @ w, rtol=1e-5, atol=1e-5)


def test_arithmetic_operators_return_floats_as_burn_inhibits() -> None:
    _, qt = _qt()
    w = aq.dequantize(qt)
    for got, want in (
        (qt + 1.5, w + np.float32(1.5)),
        (2 + qt, np.float32(2) + w),
        (qt - qt, w - w),
        (1 - qt, np.float32(1) - w),
        (qt * 2, w * np.float32(2)),
        (3 * qt, np.float32(3) * w),
        (qt / 4, w / np.float32(4)),
        (qt**2, w ** np.float32(2)),
        (-qt, -w),
    ):
        assert isinstance(got, np.ndarray)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    a = abs(qt)  # Burn's abs always stays quantized (requantized by MinMax)
    assert isinstance(a, aq.QuantizedTensor)
    want_q = aq.quantize(np.abs(w), qt.scheme)
    np.testing.assert_array_equal(a.values, want_q.values)
    np.testing.assert_array_equal(a.scales, want_q.scales)


def test_numpy_functions_do_not_silently_wrap_the_tensor() -> None:
    _, qt = _qt()
    with pytest.raises(TypeError, match="does not support ufuncs"):
        np.add(np.ones((4, 64), np.float32), qt)
    with pytest.raises(TypeError, match=r"aq\.dequantize\(qt\)"):
        np.asarray(qt)


@pytest.mark.parametrize("scheme", ["q8s", "q4s:block2:f16", "nvfp4"])
def test_jax_jit_closes_over_a_quantized_weight(scheme: str) -> None:
    # the usual way to jit a layer: the weight is built outside and captured, its arrays concrete
    jax = pytest.importorskip("jax")
    w = np.random.default_rng(11).standard_normal((4, 16)).astype(np.float32)
    qt = aq.quantize(w, scheme).to_backend("jax")
    x = jax.numpy.asarray(np.random.default_rng(12).standard_normal((3, 4)).astype(np.float32))
    deq = np.asarray(aq.dequantize(qt))
    got = jax.jit(lambda v: v @ qt)(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x) @ deq, rtol=1e-5, atol=1e-5)
    part = jax.jit(lambda v: aq.ops.add(qt.T[:, :2], v[:1, :2]))(x)  # exact layout ops, then floats
    np.testing.assert_allclose(np.asarray(part), deq.T[:, :2] + np.asarray(x)[:1, :2], rtol=1e-6)
