"""GPTQ (arrayquant.gptq): an independent NumPy oracle, the layer-output gain, backends, validation.

The oracle below is the reference algorithm (IST-DASLab ``gptq.py`` ``fasterquant``, as in
llm-compressor's ``gptq_quantize.py``) written out in plain NumPy with in-place updates, and its
scales and fake quantization come from ``tests/oracle.py`` (element by element, never arrayquant's
kernels). It runs in float32 as the references and the module do, with the same NumPy linear
algebra (Cholesky, ``solve``, matrix products), so on NumPy the codes and scales must agree bit
for bit; the linear algebra itself cannot be checked independently to the bit (the test of the
layer-output error checks it numerically).
"""

from __future__ import annotations

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends import shim
from arrayquant.gptq import GPTQResult, gptq_quantize, gptq_solve

from . import oracle

F32 = np.float32

# scheme text -> oracle case (value, group width along the input axis or None per tensor, scale dtype, two-level)
SCHEMES = {
    "q4s:block32:f16": ("q4s", 32, "f16", False),
    "mxfp4": ("e2m1", 32, "ue8m0", False),
    "nvfp4": ("e2m1", 16, "ue4m3", True),
    "e4m3:block4096:f32": ("e4m3", 4096, "f32", False),  # one scale per row
    "q8s": ("q8s", None, "f32", False),  # per tensor
}


def _alpha(v: np.ndarray, per_tensor: bool) -> np.ndarray:
    if per_tensor:
        return np.array([np.abs(v).max()], dtype=F32)
    return np.abs(v).max(axis=1, keepdims=True).astype(F32)


def _raw_scale(alpha: np.ndarray, value: str) -> np.ndarray:
    _, a, b = oracle.value_range(value)
    return (alpha.astype(np.float64) * 2.0 / float(b - a)).astype(F32)  # the contract's correctly rounded quotient


def _fake(col: np.ndarray, s: np.ndarray, glob: np.ndarray | None, case: tuple) -> np.ndarray:
    """Quantize then dequantize one column with its group's unrounded scale, element by element."""
    value, _, sdt, _ = case
    stored = oracle.round_up(s, sdt)
    eff = (stored if glob is None else oracle.effective(glob, stored)).reshape(-1)
    eff = np.broadcast_to(eff, col.shape)
    out = np.zeros_like(col)
    _, a, b = oracle.value_range(value)
    for r in range(col.shape[0]):
        e = eff[r]
        if e == 0:
            continue
        y = np.array([col[r] / e], dtype=F32)
        if value in oracle.FLOATS:
            q = oracle.float_values(oracle.float_codes(y, value), value)[0]
        else:
            q = np.clip(np.round(y), a, b)[0]
        out[r] = F32(np.float64(q) * np.float64(e))
    return out


def oracle_gptq(w, x, case, *, damp=0.01, block_size=128, act_order=False):
    """Reference GPTQ in NumPy f32: returns (codes, stored scales, global, updated weights)."""
    value, width, sdt, two = case
    w = w.astype(F32).copy()
    rows, cols = w.shape
    h = x.T @ x
    per_tensor = width is None
    width = cols if per_tensor else min(width, cols)
    glob = None
    if two:  # the global from the original weights' MinMax over all blocks
        raw = np.concatenate([_raw_scale(_alpha(w[:, c : c + width], False), value) for c in range(0, cols, width)], 1)
        glob = np.array([max(F32(raw.max()) / F32(oracle.SCALE_MAX[sdt]), oracle.F32_TINY)], dtype=F32)

    def scale_of(v):
        s = _raw_scale(_alpha(v, per_tensor), value)
        return s if glob is None else s / glob[0]

    dead = np.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    ngroups = -(-cols // width)
    scales = [None] * ngroups
    perm = np.arange(cols)
    if act_order:
        scales = [scale_of(w[:, g * width : (g + 1) * width]) for g in range(ngroups)]
        perm = np.argsort(-np.diag(h), kind="stable")
        w = w[:, perm]
        h = h[perm][:, perm]
    eye = np.eye(cols, dtype=F32)
    h = h + (damp * np.mean(np.diag(h))) * eye
    lower = np.linalg.cholesky(h)
    lower_inv = np.linalg.solve(lower, eye)
    hinv = np.linalg.cholesky(lower_inv.T @ lower_inv).T
    updated = np.zeros_like(w)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        w1 = w[:, i1:i2].copy()
        err1 = np.zeros_like(w1)
        for i in range(i2 - i1):
            j = i1 + i
            g = perm[j] // width
            if scales[g] is None:
                end = min(j + width, cols)
                ahead = w[:, i2:end] - err1[:, :i] @ hinv[i1:j, i2:end] if end > i2 and i else w[:, i2:end]
                scales[g] = scale_of(np.concatenate([w1[:, i : min(end, i2) - i1], ahead], axis=1))
            col = w1[:, i].copy()
            q = _fake(col, scales[g], glob, case)
            updated[:, j] = col
            e = (col - q) / hinv[j, j]
            w1[:, i:] -= e[:, None] * hinv[j : j + 1, i1 + i : i2]
            err1[:, i] = e
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    updated = updated[:, np.argsort(perm, kind="stable")]
    grid = scales[0] if per_tensor else np.concatenate(scales, axis=1)
    codes = np.zeros((rows, cols), dtype=np.uint8 if value in oracle.FLOATS else np.int8)
    for g in range(ngroups):
        sl = slice(g * width, (g + 1) * width)
        s = grid if per_tensor else grid[:, g : g + 1]
        stored = oracle.round_up(s, sdt)
        eff = stored if glob is None else oracle.effective(glob, stored)
        y = updated[:, sl] / eff
        if value in oracle.FLOATS:
            codes[:, sl] = oracle.float_codes(y, value)
        else:
            _, a, b = oracle.value_range(value)
            codes[:, sl] = np.clip(np.round(y), a, b).astype(np.int8)
    return codes, oracle.round_up(grid, sdt), glob, updated


def _acts(seed: int, n: int = 512, n_in: int = 96, rank: int = 16) -> np.ndarray:
    """Correlated activations: a low-rank signal plus noise, with unequal channel scales."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, rank)) @ rng.standard_normal((rank, n_in))
    x = (z + 0.3 * rng.standard_normal((n, n_in))) * np.exp(0.5 * rng.standard_normal(n_in))
    return x.astype(F32)


def _weight(seed: int, rows: int = 24, cols: int = 96) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.05).astype(F32)


# -- against the oracle -------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize(("block_size", "act_order"), [(128, False), (40, False), (40, True), (128, True)])
def test_matches_numpy_oracle(scheme, block_size, act_order):
    x = _acts(1)
    x[:, 5] = 0  # a dead input: H[5, 5] == 0
    w = _weight(2)
    codes, stored, glob, updated = oracle_gptq(w, x, SCHEMES[scheme], block_size=block_size, act_order=act_order)
    r = gptq_solve(w, scheme, activations=x, block_size=block_size, act_order=act_order)
    np.testing.assert_array_equal(np.asarray(r.tensor.codes()), codes)
    np.testing.assert_array_equal(np.asarray(r.tensor.scales), stored)
    np.testing.assert_array_equal(np.asarray(r.updated), updated)
    if glob is None:
        assert r.tensor.global_scale is None
    else:
        np.testing.assert_array_equal(np.asarray(r.tensor.global_scale), glob)
    assert np.all(np.asarray(r.updated)[:, 5] == 0)  # the dead column is zeroed
    value, width, sdt, two = SCHEMES[scheme]
    case = oracle.Case(value, None if width is None else (min(width, w.shape[1]),), sdt, two)
    np.testing.assert_array_equal(np.asarray(aq.dequantize(r.tensor)), oracle.dequantize(codes, stored, glob, case))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_identity_hessian_is_minmax(scheme):
    # H = I: U is diagonal, no error moves, so GPTQ is MinMax quantization of w (oracle.quantize)
    w = _weight(3, 16, 64)
    value, width, sdt, two = SCHEMES[scheme]
    case = oracle.Case(value, None if width is None else (min(width, 64),), sdt, two)
    codes, stored, glob = oracle.quantize(w, case)
    qt = gptq_quantize(w, scheme, hessian=np.eye(64, dtype=F32))
    np.testing.assert_array_equal(np.asarray(qt.codes()), codes)
    np.testing.assert_array_equal(np.asarray(qt.scales).reshape(stored.shape), stored)
    if two:
        np.testing.assert_array_equal(np.asarray(qt.global_scale), glob)


def test_result_is_quantize_of_updated_weights():
    x, w = _acts(4), _weight(5)
    r = gptq_solve(w, "nvfp4", activations=x, block_size=40)
    assert isinstance(r, GPTQResult)
    again = aq.quantize(r.updated, "nvfp4", params=r.params)
    np.testing.assert_array_equal(np.asarray(again.values), np.asarray(r.tensor.values))
    np.testing.assert_array_equal(np.asarray(again.scales), np.asarray(r.tensor.scales))


def test_hessian_and_activations_agree_and_dtype_kept():
    x, w = _acts(6), _weight(7)
    a = gptq_quantize(w, "q4s:block32:f16", activations=x)
    b = gptq_quantize(w, "q4s:block32:f16", hessian=x.T @ x)
    np.testing.assert_array_equal(np.asarray(a.values), np.asarray(b.values))
    c = gptq_quantize(w.astype(np.float64), "q4s:block32:f16", hessian=(x.T @ x).astype(np.float64))
    assert c.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(c.values), np.asarray(a.values))  # f32 working precision


# -- the layer-output error ---------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["q4s:block32:f16", "mxfp4", "nvfp4"])
def test_layer_output_error_beats_minmax(scheme):
    n_in = 256
    for seed in (0, 1):
        x = _acts(10 + seed, n=1024, n_in=n_in, rank=32)
        w = _weight(20 + seed, 128, n_in)
        base = np.linalg.norm(x @ (w - np.asarray(aq.dequantize(aq.quantize(w, scheme)))).T)
        plain = np.linalg.norm(x @ (w - np.asarray(aq.dequantize(gptq_quantize(w, scheme, activations=x)))).T)
        ordered = gptq_quantize(w, scheme, activations=x, act_order=True)
        act = np.linalg.norm(x @ (w - np.asarray(aq.dequantize(ordered))).T)
        print(f"{scheme} seed {seed}: ||XW-XWq|| / MinMax's = {plain / base:.3f}, with act-order {act / base:.3f}")
        assert plain / base <= 0.7  # the target: >= 30 % lower than MinMax at 4 bits
        assert act / base <= 0.7


# -- backends -------------------------------------------------------------------------------------


def test_deterministic_on_numpy():
    x, w = _acts(30), _weight(31)
    a = gptq_quantize(w, "nvfp4", activations=x, act_order=True)
    b = gptq_quantize(w, "nvfp4", activations=x, act_order=True)
    np.testing.assert_array_equal(np.asarray(a.values), np.asarray(b.values))
    np.testing.assert_array_equal(np.asarray(a.scales), np.asarray(b.scales))


def _backend(name: str):
    if name == "torch":
        torch = pytest.importorskip("torch")
        return torch.asarray
    if name == "jax":
        jnp = pytest.importorskip("jax.numpy")
        return jnp.asarray
    if name == "array_api_strict":
        xs = pytest.importorskip("array_api_strict")
        return xs.asarray
    da = pytest.importorskip("dask.array")
    return lambda a: da.from_array(a, chunks=(8, -1) if a.ndim == 2 else -1)


@pytest.mark.parametrize("name", ["torch", "jax", "array_api_strict", "dask"])
@pytest.mark.parametrize("scheme", ["q4s:block32:f16", "nvfp4"])
def test_backends(name, scheme):
    conv = _backend(name)
    x, w = _acts(40, n=256, n_in=64), _weight(41, 16, 64)
    ref = gptq_solve(w, scheme, activations=x, block_size=40, act_order=True)
    one = gptq_solve(conv(w), scheme, activations=conv(x), block_size=40, act_order=True)
    two = gptq_solve(conv(w), scheme, activations=conv(x), block_size=40, act_order=True)
    assert shim.backend_name(one.tensor.values) == name
    host = shim.to_host
    # deterministic per backend
    np.testing.assert_array_equal(host(one.tensor.values), host(two.tensor.values))
    np.testing.assert_array_equal(host(one.updated), host(two.updated))
    # the quantization step is bit-identical given the same updated weights and scales
    p = ref.params
    same = aq.quantize(
        conv(host(ref.updated)),
        scheme,
        params=aq.QParams(conv(host(p.scales)), None if p.global_scale is None else conv(host(p.global_scale))),
    )
    np.testing.assert_array_equal(host(same.values), np.asarray(ref.tensor.values))
    np.testing.assert_array_equal(host(same.scales), np.asarray(ref.tensor.scales))
    # the linear algebra is each library's own: measure how far the final weights move
    diff = np.abs(host(aq.dequantize(one.tensor)) - np.asarray(aq.dequantize(ref.tensor))).max()
    upd = np.abs(host(one.updated) - np.asarray(ref.updated)).max()
    changed = int(np.sum(host(one.tensor.codes()) != np.asarray(ref.tensor.codes())))
    print(f"{name} vs numpy, {scheme}: max|diff| updated {upd:.3g}, dequantized {diff:.3g}, codes changed {changed}")
    assert upd < 1e-4
    assert changed <= w.size // 100


# -- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, aq.ParamsError, "pass exactly one of hessian="),
        ({"hessian": np.eye(8, dtype=F32), "activations": np.ones((4, 8), F32)}, aq.ParamsError, "exactly one"),
        ({"hessian": np.eye(7, dtype=F32)}, aq.ShapeError, r"hessian has shape \(7, 7\); it must be square"),
        ({"hessian": np.ones((8, 4), F32)}, aq.ShapeError, r"hessian has shape \(8, 4\)"),
        ({"activations": np.ones((4, 7), F32)}, aq.ShapeError, r"activations have shape \(4, 7\)"),
        ({"activations": np.ones((0, 8), F32)}, aq.ShapeError, r"n_samples >= 1"),
        ({"hessian": np.full((8, 8), np.nan, F32)}, aq.NonFiniteInputError, "hessian holds NaN or infinity"),
        ({"activations": np.full((4, 8), np.inf, F32)}, aq.NonFiniteInputError, "activations holds NaN"),
        ({"hessian": np.eye(8, dtype=np.int32)}, aq.DTypeError, "hessian has dtype int32"),
        ({"hessian": np.eye(8, dtype=F32), "damp": 0.0}, aq.ParamsError, r"damp must be a finite number > 0.*0\.0"),
        ({"hessian": np.eye(8, dtype=F32), "damp": -1}, aq.ParamsError, "damp must be"),
        ({"hessian": np.eye(8, dtype=F32), "damp": float("nan")}, aq.ParamsError, "damp must be"),
        ({"hessian": np.eye(8, dtype=F32), "block_size": 0}, aq.ParamsError, r"block_size must be an integer >= 1.*0"),
        ({"hessian": np.eye(8, dtype=F32), "block_size": 2.0}, aq.ParamsError, "block_size must be"),
        ({"hessian": -np.eye(8, dtype=F32)}, aq.ParamsError, "not positive definite after dampening"),
    ],
)
def test_invalid_arguments(kwargs, error, message):
    w = np.ones((4, 8), F32)
    with pytest.raises(error, match=message):
        gptq_quantize(w, "q4s:block4:f16", **kwargs)


@pytest.mark.parametrize(
    ("w", "error", "message"),
    [
        (np.ones(8, F32), aq.ShapeError, r"w has shape \(8,\); GPTQ needs a non-empty 2-d weight"),
        (np.ones((0, 8), F32), aq.ShapeError, "non-empty 2-d"),
        (np.ones((4, 8), np.int16), aq.DTypeError, "w has dtype int16; GPTQ needs real floating data"),
        (np.full((4, 8), np.nan, F32), aq.NonFiniteInputError, "w holds NaN or infinity"),
        ([[1.0] * 8] * 4, aq.DTypeError, "w must be an array of an Array API backend, got list"),
    ],
)
def test_invalid_weight(w, error, message):
    with pytest.raises(error, match=message):
        gptq_quantize(w, "q4s:block4:f16", hessian=np.eye(8, dtype=F32))


@pytest.mark.parametrize("scheme", ["q4s:block4x4:f16", "q4s:block2x2x2:f16"])
def test_blocks_must_run_along_input_axis(scheme):
    with pytest.raises(aq.SchemeError, match=r"GPTQ needs blocks along the input axis only.*got block \["):
        gptq_quantize(np.ones((8, 8), F32), scheme, hessian=np.eye(8, dtype=F32))


def test_other_namespace_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(aq.ParamsError, match="hessian is a torch array but w is numpy; pass both from one backend"):
        gptq_quantize(np.ones((4, 8), F32), "q4s:block4:f16", hessian=torch.eye(8))


@pytest.mark.parametrize("name", ["torch", "jax", "array_api_strict"])
def test_not_positive_definite_on_each_backend(name):
    # numpy and torch raise from the factorisation, JAX returns NaN: both become ParamsError
    conv = _backend(name)
    with pytest.raises(aq.ParamsError, match="the Hessian is not positive definite after dampening"):
        gptq_quantize(conv(np.ones((4, 8), F32)), "q4s:block4:f16", hessian=conv(-np.eye(8, dtype=F32)))


def test_array_api_strict_second_device():
    xs = pytest.importorskip("array_api_strict")
    dev = xs.Device("device1")
    x, w = _acts(50, n=128, n_in=32), _weight(51, 8, 32)
    ref = gptq_quantize(w, "nvfp4", activations=x, act_order=True)
    qt = gptq_quantize(xs.asarray(w, device=dev), "nvfp4", activations=xs.asarray(x, device=dev), act_order=True)
    assert qt.device == dev
    np.testing.assert_array_equal(shim.to_host(qt.values), np.asarray(ref.values))
    np.testing.assert_array_equal(shim.to_host(qt.scales), np.asarray(ref.scales))
