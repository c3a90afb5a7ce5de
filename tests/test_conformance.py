"""Conformance: every backend gives the oracle's codes, stored scales and values, bit for bit."""

from __future__ import annotations

import array_api_compat
import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import flushes_subnormals, to_host

from . import oracle
from .oracle import Case

LEVELS = [
    (None, "f32", False),
    (None, "f16", False),
    ((32,), "f16", False),
    ((5,), "ue4m3", False),  # partial blocks along the last axis
    ((4, 8), "bf16", False),  # 2-D blocks, partial along axis 0
    ((8,), "ue8m0", False),
    ((16,), "ue4m3", True),  # two-level, as in NVFP4
    ((3, 7), "f16", True),  # two-level with partial 2-D blocks
]
STORES = [("native", 0), ("packed_u32", 0), ("packed_u32", 1)]
CASES = [
    Case(value, block, scale, two, store, dim)
    for value in (*oracle.VALUES, *oracle.FLOATS)
    for block, scale, two in LEVELS
    for store, dim in STORES + ([("packed_native", 0), ("packed_native", 1)] if value == "e2m1" else [])
]


def weights(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Weight-like data: normal, a few large outliers, an all-zero stretch, exact zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(0.05)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 3)] *= np.float32(40)
    flat[: min(40, flat.size // 4)] = 0  # whole zero blocks exercise the zero-scale rule
    return x


def check(qt: aq.QuantizedTensor, x: np.ndarray, case: Case, rounding: str = "half_even") -> None:
    codes, stored, glob = oracle.quantize(x, case, rounding)
    if flushes_subnormals(array_api_compat.array_namespace(qt.values)):
        # XLA/CUDA flush f32 subnormals: UE8M0's 2^-127 reads back as 0 (same stored code, 0x00)
        stored = np.where(stored < np.float32(2.0**-126), np.float32(0), stored)
    np.testing.assert_array_equal(to_host(qt.codes()), codes)
    np.testing.assert_array_equal(to_host(qt.scales), stored)
    if glob is None:
        assert qt.global_scale is None
    else:
        np.testing.assert_array_equal(to_host(qt.global_scale), glob)
    bits = oracle.value_range(case.value)[0]
    values = to_host(qt.values)
    if case.store == "native":
        np.testing.assert_array_equal(values, codes)
        assert values.dtype == (np.uint8 if case.value in oracle.FLOATS else np.int8)
    elif case.store == "packed_native":
        np.testing.assert_array_equal(values, oracle.pack_native(codes, case.dim))
        assert values.dtype == np.uint8
    else:
        np.testing.assert_array_equal(values, oracle.pack_u32(codes, bits, case.dim))
        assert values.dtype == np.uint32
    # f32 products are deterministic, so dequantized values match exactly too
    np.testing.assert_array_equal(to_host(aq.dequantize(qt)), oracle.dequantize(codes, stored, glob, case))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.text)
def test_quantize_matches_oracle(xp, case: Case) -> None:
    x = weights((13, 70))
    qt = aq.quantize(xp.asarray(x), case.text)
    assert qt.shape == x.shape
    assert qt.nbytes == aq.quantized_nbytes(case.text, x.shape)
    check(qt, x, case)


@pytest.mark.parametrize(
    "case",
    [
        Case("q4s", (2, 4, 8), "f16"),
        Case("q8f", (3, 16), "ue4m3", True, "packed_u32", 2),
        Case("q2f", None, "bf16", False, "packed_u32", 1),
    ],
    ids=lambda c: c.text,
)
def test_rank3(xp, case: Case) -> None:
    x = weights((5, 6, 40), seed=3)
    check(aq.quantize(xp.asarray(x), case.text), x, case)


@pytest.mark.parametrize("value", list(oracle.VALUES))
def test_half_away_reproduces_rust_round(xp, value: str) -> None:
    # scale 1: every x/eff is an exact tie or a plain value, so the two roundings differ visibly
    x = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 3.5, -7.5, 126.5, -127.5, 0.0]], np.float32)
    scheme = f"{value}:native"
    params = aq.QParams(scales=xp.asarray(np.ones(1, np.float32)))
    for rounding in ("half_even", "half_away"):
        qt = aq.quantize(xp.asarray(x), scheme, params, rounding=rounding)
        check_codes, _, _ = oracle_static(x, value, rounding)
        np.testing.assert_array_equal(to_host(qt.codes()), check_codes)


def oracle_static(x: np.ndarray, value: str, rounding: str):
    _, a, b = oracle.VALUES[value]
    if rounding == "half_even":
        r = np.round(x)
    else:
        r = np.sign(x.astype(np.float64)) * np.floor(np.abs(x.astype(np.float64)) + 0.5)
    return np.clip(r, a, b).astype(np.int8), None, None


def test_half_away_on_dynamic_data(xp) -> None:
    x = weights((16, 64), seed=7)
    case = Case("q4s", (32,), "f16")
    check(aq.quantize(xp.asarray(x), case.text, rounding="half_away"), x, case, "half_away")


def test_static_params_round_up_and_zero_scale(xp) -> None:
    x = weights((4, 64), seed=1)
    scales = np.array([[0.3, 0.0], [1e-3, 2.0], [0.01, 500.0], [0.07, 0.1]], np.float32)
    qt = aq.quantize(xp.asarray(x), "q8s:block32:ue4m3:native", aq.QParams(scales=xp.asarray(scales)))
    stored = oracle.round_up(scales, "ue4m3")
    np.testing.assert_array_equal(to_host(qt.scales), stored)
    codes = to_host(qt.codes())
    assert not codes[0, 32:].any()  # zero scale: every code 0, no NaN
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.clip(np.round(x / np.repeat(stored, 32, axis=1)), -127, 127)
    expected[0, 32:] = 0
    np.testing.assert_array_equal(codes, expected.astype(np.int8))
    assert not np.isnan(to_host(aq.dequantize(qt))).any()


def test_two_level_static_params(xp) -> None:
    x = weights((2, 32), seed=2)
    case = Case("q8s", (16,), "ue4m3", True)
    _, stored, glob = oracle.quantize(x, case)
    params = aq.QParams(scales=xp.asarray(stored), global_scale=xp.asarray(glob))
    check(aq.quantize(xp.asarray(x), case.text, params), x, case)


def test_unchecked_nonfinite_rule(xp) -> None:
    x = np.array([[np.inf, -np.inf, np.nan, 1.0, -np.nan, 0.25]], np.float32)
    params = aq.QParams(scales=xp.asarray(np.array([0.01], np.float32)))
    qt = aq.quantize(xp.asarray(x), "q8f:native", params, check_finite=False)
    np.testing.assert_array_equal(to_host(qt.codes()), np.array([[127, -128, 0, 100, 0, 25]], np.int8))
    zero = aq.QParams(scales=xp.asarray(np.zeros(1, np.float32)))
    qt0 = aq.quantize(xp.asarray(x), "q8f:native", zero, check_finite=False)
    np.testing.assert_array_equal(to_host(qt0.codes()), np.zeros((1, 6), np.int8))


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_float_inputs_compute_in_f32(xp, dtype: str) -> None:
    if not hasattr(xp.xp, dtype):
        pytest.skip(f"{xp} has no {dtype}")
    x = weights((8, 32), seed=4).astype(dtype)
    try:
        arr = xp.asarray(x)
    except (TypeError, ValueError) as exc:
        pytest.skip(f"{xp} cannot hold {dtype} on this device: {exc}")
    case = Case("q8s", (16,), "f16")
    qt = aq.quantize(arr, case.text)
    check_codes, stored, _ = oracle.quantize(x.astype(np.float32), case)
    np.testing.assert_array_equal(to_host(qt.codes()), check_codes)
    np.testing.assert_array_equal(to_host(qt.scales), stored)
    out = aq.dequantize(qt)
    assert out.dtype == arr.dtype


def test_outputs_stay_in_namespace_and_device(xp) -> None:
    arr = xp.asarray(weights((8, 64)))
    qt = aq.quantize(arr, "q4s:block32:f16")
    for a in (qt.values, qt.scales, aq.dequantize(qt), qt.codes()):
        assert array_api_compat.array_namespace(a) is array_api_compat.array_namespace(arr)
        assert array_api_compat.device(a) == array_api_compat.device(arr)
    assert qt.device == array_api_compat.device(arr)


def test_compute_range_and_params_match_oracle(xp) -> None:
    x = weights((10, 40), seed=5)
    lo, hi = aq.compute_range(xp.asarray(x), "q8s:block8x16:f32")
    exp_lo = np.zeros((2, 3), np.float32)
    exp_hi = np.zeros((2, 3), np.float32)
    for i in range(2):
        for j in range(3):
            blk = x[i * 8 : (i + 1) * 8, j * 16 : (j + 1) * 16]
            exp_lo[i, j], exp_hi[i, j] = blk.min(), blk.max()
    np.testing.assert_array_equal(to_host(lo), exp_lo)
    np.testing.assert_array_equal(to_host(hi), exp_hi)
    p = aq.compute_q_params("q8s:block8x16:f32", lo, hi)
    alpha = np.maximum(np.abs(exp_lo), np.abs(exp_hi))
    np.testing.assert_array_equal(to_host(p.scales), (alpha * np.float32(2)) / np.float32(254))
    assert p.global_scale is None


def _tree_mean(v: np.ndarray) -> np.float32:
    n = v.size
    width = 1 << max(n - 1, 0).bit_length()
    w = np.concatenate([np.abs(v).astype(np.float32), np.zeros(width - n, np.float32)])
    while w.size > 1:
        w = w[: w.size // 2] + w[w.size // 2 :]
    return np.float32(w[0] / np.float32(n))


def test_absmean_fixed_tree(xp) -> None:
    x = weights((6, 20), seed=6)
    lo, hi = aq.compute_range(xp.asarray(x), "q2s:block4x8:f32", calibration="absmean")
    expected = np.zeros((2, 3), np.float32)
    for i in range(2):
        for j in range(3):
            expected[i, j] = _tree_mean(x[i * 4 : (i + 1) * 4, j * 8 : (j + 1) * 8].reshape(-1))
    np.testing.assert_array_equal(to_host(hi), expected)
    np.testing.assert_array_equal(to_host(lo), -expected)
    _, hi_t = aq.compute_range(xp.asarray(x), "q2s", calibration="absmean")
    np.testing.assert_array_equal(to_host(hi_t), np.array([_tree_mean(x.reshape(-1))]))
    qt = aq.quantize(xp.asarray(x), "q2s:block4x8:f32:native", calibration="absmean")
    stored = (expected * np.float32(2)) / np.float32(2)
    np.testing.assert_array_equal(to_host(qt.scales), stored)


def test_pack_unpack_roundtrip(xp) -> None:
    rng = np.random.default_rng(8)
    for value, dim in (("q4s", 0), ("q2f", 1), ("q8f", 0), ("q4f", 1)):
        _, a, b = oracle.VALUES[value]
        bits = oracle.VALUES[value][0]
        codes = rng.integers(a, b + 1, size=(5, 9)).astype(np.int8)
        scheme = f"{value}:packed_u32:{dim}"
        words = aq.pack(xp.asarray(codes), scheme)
        np.testing.assert_array_equal(to_host(words), oracle.pack_u32(codes, bits, dim))
        np.testing.assert_array_equal(to_host(aq.unpack(words, scheme, codes.shape)), codes)


def test_dask_stays_lazy() -> None:
    da = pytest.importorskip("dask.array")
    import dask

    x = da.from_array(weights((64, 64)), chunks=(32, 32))
    calls = []

    def counting_get(dsk, keys, **kw):
        calls.append(keys)
        return dask.get(dsk, keys, **kw)

    with dask.config.set(scheduler=counting_get):
        qt = aq.quantize(x, "q8s:block32:f16:tensor:f32")
        y = aq.dequantize(qt)
        assert calls == []  # nothing computed while building the graph
        assert isinstance(qt.values, da.Array)
        assert isinstance(y, da.Array)
    case = Case("q8s", (32,), "f16", True, "packed_u32", 0)
    check(qt, np.asarray(x.compute()), case)


def test_dask_nonfinite_raises_when_computed() -> None:
    da = pytest.importorskip("dask.array")
    x = weights((8, 32))
    x[3, 5] = np.nan
    qt = aq.quantize(da.from_array(x, chunks=(4, 32)), "q8s:native")
    with pytest.raises(aq.NonFiniteInputError, match="non-finite"):
        qt.values.compute()


def test_jax_jit() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    x = weights((16, 64), seed=9)
    case = Case("q4s", (32,), "f16", False, "packed_u32", 0)

    @jax.jit
    def roundtrip(a):
        qt = aq.quantize(a, case.text)
        return qt.values, qt.scales, aq.dequantize(qt)

    values, scales, y = roundtrip(jnp.asarray(x))
    codes, stored, glob = oracle.quantize(x, case)
    np.testing.assert_array_equal(np.asarray(values), oracle.pack_u32(codes, 4, 0))
    np.testing.assert_array_equal(np.asarray(scales), stored)
    np.testing.assert_array_equal(np.asarray(y), oracle.dequantize(codes, stored, glob, case))


@pytest.mark.parametrize("case", CASES[::5] + [Case("q2f", (3, 7), "f16", True, "packed_u32", 1)], ids=lambda c: c.text)
def test_row_slabs_match_oracle(xp, case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny slabs: many chunks, partial last slab, words and blocks aligned across slab edges."""
    import arrayquant.chunks

    monkeypatch.setattr(arrayquant.chunks, "CHUNK_ELEMENTS", 150)
    x = weights((37, 70), seed=11)
    check(aq.quantize(xp.asarray(x), case.text), x, case)
    _, stored, glob = oracle.quantize(x, case)
    params = aq.QParams(scales=xp.asarray(stored), global_scale=None if glob is None else xp.asarray(glob))
    check(aq.quantize(xp.asarray(x), case.text, params), x, case)


def test_row_slabs_report_the_first_nonfinite_index(monkeypatch: pytest.MonkeyPatch) -> None:
    import arrayquant.chunks

    monkeypatch.setattr(arrayquant.chunks, "CHUNK_ELEMENTS", 64)
    x = weights((40, 32), seed=12)
    x[29, 3] = np.inf
    x[35, 0] = np.nan
    with pytest.raises(aq.NonFiniteInputError, match=r"2 non-finite element\(s\) \(first at index \(29, 3\): inf\)"):
        aq.quantize(x, "q8s:block16:f16")


LOOKUP_CASES = [
    (Case("q4f", (16,), "f16"), "nf4"),
    (Case("q4s", None, "f32"), "nf4"),
    (Case("q2f", (8,), "bf16", False, "packed_u32", 1), "ternary"),
    (Case("q8f", (32,), "ue4m3", True, "packed_u32", 0), "dense"),
]


def lookup_table(name: str) -> np.ndarray:
    if name == "nf4":
        return np.asarray(aq.NF4, np.float32)
    if name == "ternary":
        return np.array([-1.0, 0.0, 0.0, 1.0], np.float32)  # a repeated entry: ties go to index 1
    return np.sort(np.random.default_rng(3).standard_normal(256).astype(np.float32))


@pytest.mark.parametrize(("case", "table_name"), LOOKUP_CASES, ids=lambda c: getattr(c, "text", c))
def test_lookup_matches_oracle(xp, case: Case, table_name: str) -> None:
    x = weights((13, 70), seed=13)
    table = lookup_table(table_name)
    scheme = case.text + ":lookup"
    qt = aq.quantize(xp.asarray(x), scheme, table=xp.asarray(table))
    codes, stored, glob = oracle.quantize(x, case, table=table)
    np.testing.assert_array_equal(to_host(qt.codes()), codes)
    np.testing.assert_array_equal(to_host(qt.scales), stored)
    np.testing.assert_array_equal(to_host(aq.dequantize(qt)), oracle.dequantize(codes, stored, glob, case, table))
    params = aq.compute_q_params(scheme, *aq.compute_range(xp.asarray(x), scheme), table=xp.asarray(table))
    again = aq.quantize(xp.asarray(x), scheme, params)
    np.testing.assert_array_equal(to_host(again.codes()), codes)
