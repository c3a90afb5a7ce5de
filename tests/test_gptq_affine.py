"""GPTQ with the affine modes (zero point ``x = s * (q - z)``, offset ``x = d * q + m``).

The oracle is the reference sweep (IST-DASLab ``gptq.py`` ``fasterquant``, AutoGPTQ
``auto_gptq/quantization/gptq.py``) in plain NumPy f32 with in-place updates, the same loop as
``tests/test_gptq.py``'s oracle, with the reference's asymmetric group quantizer
(``Quantizer.find_params`` with ``sym=False``) under arrayquant's affine contract: the group
parameters come from ``tests/oracle_affine.py`` (``block_params``: the range extended to hold 0,
the scale rounded up onto the scale dtype, then ``z = clip(rint(qmin - lo0 / s))``; or ``m``
rounded down and ``d`` rounded up), codes and values element by element (``block_codes``,
``block_values``), never arrayquant's kernels. The linear algebra is NumPy's, as the module's on
NumPy, so codes, scales, zero points and offsets must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends import shim
from arrayquant.gptq import gptq_quantize, gptq_solve

from . import oracle_affine as oa
from .test_gptq import _acts, _weight

F32 = np.float32

# scheme text -> (value, mode, group width along the input axis or None per tensor, scale dtype)
SCHEMES = {
    "u4:block128:bf16:zero_point": ("u4", "zero_point", 128, "bf16"),
    "q4f:block32:f16:zero_point": ("q4f", "zero_point", 32, "f16"),
    "u4:block32:f16:offset": ("u4", "offset", 32, "f16"),
    "u3:block64:f16:zero_point": ("u3", "zero_point", 64, "f16"),
    "u8:zero_point": ("u8", "zero_point", None, "f32"),  # per tensor
    "u5:tensor:f16:offset": ("u5", "offset", None, "f16"),  # per tensor
    "u4:block1x160:f32:zero_point": ("u4", "zero_point", 160, "f32"),  # one group per row, 2-d block form
}

N_IN = 160  # block128 -> 128 + 32, block64 -> 64 + 64 + 32, block32 -> 5 groups


def _case(spec: tuple) -> oa.Case:
    value, mode, width, sdt = spec
    return oa.Case(value, mode, None if width is None else (width,), sdt)


def _group_params(v: np.ndarray, case: oa.Case, per_tensor: bool) -> tuple[np.ndarray, np.ndarray]:
    """The reference's asymmetric find_params under arrayquant's rule: ``(s, z)`` per row, or ``(1,)`` per tensor."""
    if per_tensor:
        s, z = oa.block_params(F32(v.min()), F32(v.max()), case)
        return np.array([s], F32), np.array([z], F32)
    out = [oa.block_params(F32(row.min()), F32(row.max()), case) for row in v]
    return np.array([[p[0]] for p in out], F32), np.array([[p[1]] for p in out], F32)


def _fake(col: np.ndarray, s: np.ndarray, z: np.ndarray, case: oa.Case) -> np.ndarray:
    """Quantize then dequantize one column with its group's parameters, element by element."""
    s, z = np.broadcast_to(s.reshape(-1), col.shape), np.broadcast_to(z.reshape(-1), col.shape)
    out = np.zeros_like(col)
    for r in range(col.shape[0]):
        q = oa.block_codes(np.array([col[r]], F32), s[r], z[r], case)
        out[r] = oa.block_values(q, s[r], z[r], case)[0]
    return out


def oracle_gptq(w, x, spec, *, damp=0.01, block_size=128, act_order=False):
    """Reference GPTQ in NumPy f32 with the asymmetric quantizer: (codes, scales, zero, updated)."""
    case = _case(spec)
    _, _, width, _ = spec
    w = w.astype(F32).copy()
    rows, cols = w.shape
    h = x.T @ x
    per_tensor = width is None
    width = cols if per_tensor else min(width, cols)
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    ngroups = -(-cols // width)
    params: list = [None] * ngroups
    perm = np.arange(cols)
    if act_order:  # static groups from the (dead-zeroed) original weights
        params = [_group_params(w[:, g * width : (g + 1) * width], case, per_tensor) for g in range(ngroups)]
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
            if params[g] is None:  # the group's current, error-updated weights
                end = min(j + width, cols)
                ahead = w[:, i2:end] - err1[:, :i] @ hinv[i1:j, i2:end] if end > i2 and i else w[:, i2:end]
                params[g] = _group_params(np.concatenate([w1[:, i : min(end, i2) - i1], ahead], 1), case, per_tensor)
            col = w1[:, i].copy()
            q = _fake(col, *params[g], case)
            updated[:, j] = col
            e = (col - q) / hinv[j, j]
            w1[:, i:] -= e[:, None] * hinv[j : j + 1, i1 + i : i2]
            err1[:, i] = e
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    updated = updated[:, np.argsort(perm, kind="stable")]
    if per_tensor:
        s_grid, z_grid = params[0]
    else:
        s_grid = np.concatenate([p[0] for p in params], axis=1)
        z_grid = np.concatenate([p[1] for p in params], axis=1)
    codes = np.zeros((rows, cols), np.uint8 if case.value.startswith("u") else np.int8)
    for g in range(ngroups):
        sl = slice(g * width, (g + 1) * width)
        for r in range(rows):
            gi = (0,) if per_tensor else (r, g)
            codes[r, sl] = oa.block_codes(updated[r, sl], s_grid[gi], z_grid[gi], case).astype(codes.dtype)
    return codes, s_grid, z_grid, updated


def _zero(qt_or_params, mode: str):
    return qt_or_params.zero_point if mode == "zero_point" else qt_or_params.offset


# -- against the oracle -------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize(("block_size", "act_order"), [(128, False), (40, False), (40, True), (128, True)])
def test_matches_numpy_oracle(scheme, block_size, act_order):
    x = _acts(1, n_in=N_IN)
    x[:, 5] = 0  # a dead input: H[5, 5] == 0
    w = _weight(2, cols=N_IN) + F32(0.02)  # off-centre, so the zero points are not mid-range
    w[3, :] = 0  # a row of zeros: every group of it has s = 0, z = 0 (and stays zero)
    spec = SCHEMES[scheme]
    mode = spec[1]
    codes, s_grid, z_grid, updated = oracle_gptq(w, x, spec, block_size=block_size, act_order=act_order)
    r = gptq_solve(w, scheme, activations=x, block_size=block_size, act_order=act_order)
    np.testing.assert_array_equal(np.asarray(r.updated), updated)
    np.testing.assert_array_equal(np.asarray(r.tensor.codes()), codes)
    np.testing.assert_array_equal(np.asarray(r.tensor.scales), s_grid)
    np.testing.assert_array_equal(np.asarray(_zero(r.tensor, mode)).astype(F32), z_grid)
    assert r.tensor.global_scale is None
    assert r.tensor.table is None
    assert np.all(np.asarray(r.updated)[:, 5] == 0)  # the dead column is zeroed
    if spec[2] is not None:
        assert np.all(np.asarray(r.tensor.scales)[3] == 0)
        assert np.all(np.asarray(_zero(r.tensor, mode))[3] == 0)
    deq = np.asarray(aq.dequantize(r.tensor))
    if spec[2] is not None or mode == "zero_point":  # 0 is exact: no error reaches the zero row
        assert np.all(deq[3] == 0)
    np.testing.assert_array_equal(deq, oa.dequantize(codes, s_grid, z_grid, _case(spec)))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_identity_hessian_is_minmax(scheme):
    # H = I: U is diagonal, no error moves, so GPTQ is the MinMax affine quantization of w
    w = _weight(3, 16, 64) - F32(0.01)
    spec = SCHEMES[scheme]
    case = _case(spec) if spec[2] is None else oa.Case(spec[0], spec[1], (min(spec[2], 64),), spec[3])
    codes, s_grid, z_grid = oa.quantize(w, case)
    qt = gptq_quantize(w, scheme, hessian=np.eye(64, dtype=F32))
    np.testing.assert_array_equal(np.asarray(qt.codes()), codes)
    np.testing.assert_array_equal(np.asarray(qt.scales).reshape(s_grid.shape), s_grid)
    np.testing.assert_array_equal(np.asarray(_zero(qt, spec[1])).astype(F32).reshape(z_grid.shape), z_grid)


# -- the quantize(updated, scheme, params) contract -----------------------------------------------


@pytest.mark.parametrize("scheme", [*SCHEMES, "q4_1", "q5_1"])
@pytest.mark.parametrize("act_order", [False, True])
def test_result_is_quantize_of_updated_weights(scheme, act_order):
    x, w = _acts(4), _weight(5)
    r = gptq_solve(w, scheme, activations=x, block_size=40, act_order=act_order)
    plan_mode = aq.QuantScheme.parse(scheme).mode.value
    p = r.params
    if plan_mode == "zero_point":
        assert p.offset is None
        assert p.zero_point.dtype == np.asarray(r.tensor.zero_point).dtype
        assert p.zero_point.dtype == (np.uint8 if scheme.startswith("u") else np.int8)
    else:
        assert p.zero_point is None
        assert p.offset.dtype == np.float32
    assert p.global_scale is None
    again = aq.quantize(r.updated, scheme, params=p)
    np.testing.assert_array_equal(np.asarray(again.values), np.asarray(r.tensor.values))
    np.testing.assert_array_equal(np.asarray(again.scales), np.asarray(r.tensor.scales))
    np.testing.assert_array_equal(np.asarray(_zero(again, plan_mode)), np.asarray(_zero(r.tensor, plan_mode)))
    np.testing.assert_array_equal(np.asarray(_zero(p, plan_mode)), np.asarray(_zero(r.tensor, plan_mode)))


# -- the layer-output error ---------------------------------------------------------------------

LAYER_SCHEMES = [
    "u4:block32:f16:zero_point",
    "q4f:block32:f16:zero_point",
    "u4:block32:f16:offset",
    "u3:block64:f16:zero_point",
]


@pytest.mark.parametrize("scheme", LAYER_SCHEMES)
def test_layer_output_error_beats_minmax(scheme):
    n_in = 256
    for seed in (0, 1):
        x = _acts(10 + seed, n=1024, n_in=n_in, rank=32)
        w = _weight(20 + seed, 128, n_in) + F32(0.01)
        base = np.linalg.norm(x @ (w - np.asarray(aq.dequantize(aq.quantize(w, scheme)))).T)
        plain = np.linalg.norm(x @ (w - np.asarray(aq.dequantize(gptq_quantize(w, scheme, activations=x)))).T)
        ordered = gptq_quantize(w, scheme, activations=x, act_order=True)
        act = np.linalg.norm(x @ (w - np.asarray(aq.dequantize(ordered))).T)
        print(f"{scheme} seed {seed}: ||XW-XWq|| / MinMax's = {plain / base:.3f}, with act-order {act / base:.3f}")
        assert plain / base <= 0.7  # >= 30 % lower than MinMax, as for the symmetric schemes
        assert act / base <= 0.7


# -- backends -------------------------------------------------------------------------------------


def _backend(name: str):
    if name == "torch":
        torch = pytest.importorskip("torch")
        return torch.asarray
    if name == "array_api_strict":
        xs = pytest.importorskip("array_api_strict")
        return xs.asarray
    da = pytest.importorskip("dask.array")
    return lambda a: da.from_array(a, chunks=(8, -1) if a.ndim == 2 else -1)


@pytest.mark.parametrize("name", ["torch", "array_api_strict", "dask"])
@pytest.mark.parametrize("scheme", ["u4:block32:f16:zero_point", "u4:block32:f16:offset"])
def test_backends(name, scheme):
    conv = _backend(name)
    mode = aq.QuantScheme.parse(scheme).mode.value
    x, w = _acts(40, n=256, n_in=64), _weight(41, 16, 64)
    ref = gptq_solve(w, scheme, activations=x, block_size=40, act_order=True)
    one = gptq_solve(conv(w), scheme, activations=conv(x), block_size=40, act_order=True)
    host = shim.to_host
    assert shim.backend_name(one.tensor.values) == name
    assert shim.backend_name(_zero(one.params, mode)) == name
    # the quantization step is bit-identical given the same updated weights and parameters
    p = ref.params
    given = aq.QParams(conv(host(p.scales)), **{mode: conv(host(_zero(p, mode)))})
    same = aq.quantize(conv(host(ref.updated)), scheme, params=given)
    np.testing.assert_array_equal(host(same.values), np.asarray(ref.tensor.values))
    np.testing.assert_array_equal(host(_zero(same, mode)), np.asarray(_zero(ref.tensor, mode)))
    # the backend's own result is its quantize(updated, params)
    again = aq.quantize(one.updated, scheme, params=one.params)
    np.testing.assert_array_equal(host(again.values), host(one.tensor.values))
    np.testing.assert_array_equal(host(_zero(again, mode)), host(_zero(one.tensor, mode)))
    # the linear algebra is each library's own (array-api-strict and Dask run NumPy's)
    changed = int(np.sum(host(one.tensor.codes()) != np.asarray(ref.tensor.codes())))
    assert np.abs(host(one.updated) - np.asarray(ref.updated)).max() < 1e-4
    assert changed <= w.size // 100
    if name != "torch":
        assert changed == 0


# -- what stays refused ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["u4:block4x4:f16:zero_point", "u4:block2x2x2:f16:offset"])
def test_blocks_must_run_along_input_axis(scheme):
    with pytest.raises(aq.SchemeError, match=r"GPTQ needs blocks along the input axis only.*got block \["):
        gptq_quantize(np.ones((8, 8), F32), scheme, hessian=np.eye(8, dtype=F32))
