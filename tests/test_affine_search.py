"""The MSE search of the affine modes against a plain-NumPy oracle, block by block and candidate by candidate.

Candidate ``i`` shrinks a block's range ``(lo, hi)`` to ``(f_i * lo, f_i * hi)`` (as llm-compressor's
MSE observer does for asymmetric ranges); its stored parameters, codes and values come from
:mod:`tests.oracle_affine`, its error is ``sum w * |x - x'|^p`` in units of the power of two not
below ``max(|lo|, |hi|)``, summed by the documented tree; the first least error wins.
"""

from __future__ import annotations

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import to_host

from . import oracle_affine as oa
from .oracle_affine import Case
from .test_calibration_search import candidates, data, pow2_at_least, table_pow, tree_sum

F32 = np.float32


def _roundtrip(blk: np.ndarray, lo: F32, hi: F32, case: Case) -> tuple[np.ndarray, F32, F32 | None]:
    s, z = oa.block_params(lo, hi, case)
    return oa.block_values(oa.block_codes(blk, s, z, case), s, z, case), s, z


def _error(blk: np.ndarray, deq: np.ndarray, unit: F32, w: np.ndarray, p: float) -> F32:
    e = np.minimum(np.abs(blk - deq) / unit, F32(255.99))
    return F32(tree_sum((table_pow(e, p) * w).reshape(1, -1))[0])


def oracle(x: np.ndarray, case: Case, cal: str, importance: np.ndarray | None = None):
    """The stored scales and zero points (or offsets) the search should choose."""
    factors, p = candidates(cal)
    w_all = np.ones(x.shape[-1], F32) if importance is None else (importance / importance.max()).astype(F32)
    grid = oa.grid_of(x.shape, case.block)
    scales, zero = np.zeros(grid, F32), np.zeros(grid, F32)
    if case.block is None:  # per tensor: errors summed along each axis-0 row, then over the rows
        lo, hi = F32(x.min()), F32(x.max())
        unit = pow2_at_least(np.array([max(abs(lo), abs(hi))], F32))[0]
        x2 = x.reshape(x.shape[0], -1)
        w2 = np.broadcast_to(w_all, x.shape).reshape(x2.shape)
        best = best_err = None
        for f in factors:
            deq, s, z = _roundtrip(x2, F32(lo * F32(f)), F32(hi * F32(f)), case)
            e = np.minimum(np.abs(x2 - deq) / unit, F32(255.99))
            err = tree_sum(tree_sum(table_pow(e, p) * w2)[None, :])[0]
            if best_err is None or err < best_err:
                best, best_err = (s, z), err
        scales[0], zero[0] = best
        return scales, zero
    for idx, sl in oa.blocks(x.shape, case.block):
        blk = x[sl]
        w = np.broadcast_to(w_all[sl[-1]], blk.shape)
        lo, hi = F32(blk.min()), F32(blk.max())
        unit = pow2_at_least(np.array([max(abs(lo), abs(hi))], F32))[0]
        best = best_err = None
        for f in factors:
            deq, s, z = _roundtrip(blk, F32(lo * F32(f)), F32(hi * F32(f)), case)
            err = _error(blk.reshape(-1), deq.reshape(-1), unit, w.reshape(-1), p)
            if best_err is None or err < best_err:
                best, best_err = (s, z), err
        scales[idx], zero[idx] = best
    return scales, zero


CASES = [
    Case("u4", "zero_point", (32,), "f16"),
    Case("u4", "offset", (32,), "f16"),
    Case("u3", "zero_point", (16,), "bf16"),
    Case("q4f", "zero_point", (1, 48), "f32"),
    Case("u8", "offset", (4, 8), "f32"),
    Case("u4", "zero_point", None, "f32"),
    Case("u5", "offset", None, "f16"),
]


def _check(qt: aq.QuantizedTensor, x: np.ndarray, case: Case, cal: str, imp=None) -> None:
    scales, zero = oracle(x, case, cal, imp)
    np.testing.assert_array_equal(to_host(qt.scales), scales)
    got = to_host(qt.zero_point if case.mode == "zero_point" else qt.offset).astype(F32)
    np.testing.assert_array_equal(got, zero)
    # the codes are what the static path gives for those parameters (itself checked by the conformance suite)
    field = "zero_point" if case.mode == "zero_point" else "offset"
    params = aq.QParams(scales=scales, **{field: zero.astype(np.uint8 if case.value.startswith("u") else np.int8)
                                           if case.mode == "zero_point" else zero})  # fmt: skip
    static = aq.quantize(np.asarray(x), case.text, params)
    np.testing.assert_array_equal(to_host(qt.codes()), static.codes())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.text)
@pytest.mark.parametrize("kind", ["normal", "heavy", "zeros", "outlier"])
def test_mse_matches_oracle(case: Case, kind: str) -> None:
    x = data(kind, (6, 96))
    _check(aq.quantize(x, case.text, calibration="mse"), x, case, "mse")


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: c.text)
def test_mse_options_and_importance_match_oracle(case: Case) -> None:
    x = data("heavy", (5, 96), seed=3)
    imp = np.random.default_rng(4).uniform(0.05, 3.0, 96).astype(F32)
    cal = "mse:grid=20,max_shrink=0.5,norm=2"
    _check(aq.quantize(x, case.text, calibration=cal, importance=imp), x, case, cal, imp)


@pytest.mark.parametrize("case", [CASES[0], CASES[5]], ids=lambda c: c.text)
def test_same_bits_on_every_backend(xp, case: Case) -> None:
    x = data("outlier", (7, 64), seed=5)
    imp = np.random.default_rng(6).uniform(0.1, 2.0, 64).astype(F32)
    qt = aq.quantize(xp.asarray(x), case.text, calibration="mse", importance=xp.asarray(imp))
    _check(qt, x, case, "mse", imp)


def test_mse_is_never_worse_than_minmax() -> None:
    x = data("heavy", (16, 128), seed=7)
    for text in ("u4:block32:f16:zero_point", "u3:block64:f16:offset"):
        err = [float(np.sum((aq.dequantize(aq.quantize(x, text, calibration=c)) - x) ** 2)) for c in ("minmax", "mse")]
        assert err[1] <= err[0]
