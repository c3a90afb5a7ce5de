"""The percentile calibration of the affine modes against a plain-NumPy oracle.

Definition (docs/spec.md, Affine quantization): with ``n`` real elements in a block (or the
tensor) and ``k = max(ceil(q / 100 * n), 1)``, ``hi`` is the ``k``-th smallest value and ``lo``
the ``k``-th largest; where they cross (``lo > hi``, only below ``q = 50``) both become
``lo / 2 + hi / 2``. The stored parameters and codes then follow from ``(lo, hi)`` by the MinMax
rule, which :mod:`tests.oracle_affine` computes. The oracle sorts each block (or the whole
tensor) with NumPy and never calls arrayquant's kernels.
"""

from __future__ import annotations

import math
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import to_host

from . import oracle_affine as oa
from .oracle_affine import Case
from .test_calibration_search import data

F32 = np.float32
QS = [50, 99.9, 100, 1e-6]


# ------------------------------------------------------------------------------------------ oracle


def _fraction(q: float) -> Fraction:
    return Fraction(repr(float(q))) / 100


def bounds(values: np.ndarray, q: float) -> tuple[F32, F32]:
    """``(lo, hi)`` of the documented definition, by a full sort."""
    v = np.sort(np.asarray(values, F32).reshape(-1))
    n = v.size
    k = max(math.ceil(_fraction(q) * n), 1)
    hi, lo = F32(v[k - 1] + F32(0)), F32(v[n - k] + F32(0))
    if lo > hi:  # crossed: the midpoint, halves first
        lo = hi = F32(F32(lo * F32(0.5)) + F32(hi * F32(0.5)))
    return lo, hi


def oracle(x: np.ndarray, case: Case, q: float, finite_only: bool = False):
    """``(codes, scales, zero, lo, hi)``: the codes of ``x``, the stored grids and the ranges."""
    x = np.asarray(x, F32)
    cal = np.where(np.isfinite(x), x, F32(0)) if finite_only else x  # unchecked input: NaN/inf count as 0
    grid = oa.grid_of(x.shape, case.block)
    codes = np.zeros(x.shape, np.uint8 if case.value.startswith("u") else np.int8)
    scales, zero, lo_g, hi_g = (np.zeros(grid, F32) for _ in range(4))
    for idx, sl in oa.blocks(x.shape, case.block):
        gi = idx if case.block is not None else (0,)
        lo, hi = bounds(cal[sl], q)
        s, z = oa.block_params(lo, hi, case)
        scales[gi], zero[gi], lo_g[gi], hi_g[gi] = s, z, lo, hi
        with np.errstate(invalid="ignore"):
            q_blk = oa.block_codes(x[sl], s, z, case)
        if finite_only:  # NaN takes the code nearest 0
            nearest = z if case.mode == "zero_point" else np.clip(np.rint(-z / s), 0, 2**16) if s else F32(0)
            q_blk = np.where(np.isnan(x[sl]), nearest, q_blk)
        codes[sl] = q_blk.astype(codes.dtype)
    return codes, scales, zero, lo_g, hi_g


def _second(qt: aq.QuantizedTensor, case: Case) -> np.ndarray:
    """The zero points (as integers) or the offsets' bits."""
    if case.mode == "zero_point":
        return to_host(qt.zero_point).astype(np.int64)
    return _bits(to_host(qt.offset))


def _expected_second(zero: np.ndarray, case: Case) -> np.ndarray:
    return zero.astype(np.int64) if case.mode == "zero_point" else _bits(zero)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, F32)).view(np.uint32)


def check(qt: aq.QuantizedTensor, x: np.ndarray, case: Case, q: float, finite_only: bool = False) -> None:
    codes, scales, zero, _, _ = oracle(x, case, q, finite_only)
    np.testing.assert_array_equal(_bits(to_host(qt.scales)), _bits(scales))
    np.testing.assert_array_equal(_second(qt, case), _expected_second(zero, case))
    np.testing.assert_array_equal(to_host(qt.codes()), codes)


# ------------------------------------------------------------------------------------------- tests

BLOCK_CASES = [
    Case("u4", "zero_point", (32,), "f16"),
    Case("u4", "offset", (32,), "f16"),
    Case("u3", "zero_point", (16,), "bf16"),
    Case("q4f", "zero_point", (1, 48), "f32"),
    Case("u8", "offset", (4, 8), "f32"),
    Case("u5", "offset", (3, 16), "bf16"),
]
TENSOR_CASES = [
    Case("u4", "zero_point", None, "f32"),
    Case("u5", "offset", None, "f16"),
    Case("q3f", "zero_point", None, "bf16"),
]
KINDS = ["heavy", "zeros", "outlier", "positive", "negative"]


def sample(kind: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """``data``'s kinds, and all-positive / all-negative data (one lane of the counting search each way)."""
    if kind == "positive":
        return (np.abs(data("heavy", shape, seed)) + F32(0.25)).astype(F32)
    if kind == "negative":
        return (-np.abs(data("heavy", shape, seed)) - F32(0.5)).astype(F32)
    return data(kind, shape, seed)


@pytest.mark.parametrize("case", BLOCK_CASES, ids=lambda c: c.text)
@pytest.mark.parametrize("q", QS)
@pytest.mark.parametrize("kind", KINDS)
def test_per_block_matches_oracle(case: Case, q: float, kind: str) -> None:
    x = sample(kind, (6, 70))  # partial blocks along both axes of the 2-D blocks, and along the last
    check(aq.quantize(x, case.text, calibration=aq.Percentile(q=q)), x, case, q)


@pytest.mark.parametrize("case", TENSOR_CASES, ids=lambda c: c.text)
@pytest.mark.parametrize("q", QS)
@pytest.mark.parametrize("kind", KINDS)
def test_per_tensor_matches_oracle(case: Case, q: float, kind: str) -> None:
    x = sample(kind, (6, 70), seed=1)
    check(aq.quantize(x, case.text, calibration=aq.Percentile(q=q)), x, case, q)


@pytest.mark.parametrize("shape", [(100,), (3, 5, 40)], ids=str)
def test_other_ranks_match_oracle(shape: tuple[int, ...]) -> None:
    x = sample("heavy", shape, seed=2)
    for case in (Case("u4", "offset", (32,), "f16"), Case("u4", "zero_point", (2, 16), "f32"), TENSOR_CASES[1]):
        if case.block is not None and len(case.block) > len(shape):
            continue
        check(aq.quantize(x, case.text, calibration="percentile:90"), x, case, 90)


@pytest.mark.parametrize("q", QS)
def test_per_tensor_over_many_slabs_and_chunks(q: float) -> None:
    # 4 MiB of f32: several row slabs eagerly and 8 dask chunks; the oracle sorts it all
    x = sample("heavy", (1024, 1030), seed=21)
    x[5, 7] = F32(1e-42)  # a subnormal, and ties from repeats
    x[6, :200] = F32(0.25)
    x[7, :100] = F32(-0.125)
    case = Case("u4", "zero_point", None, "f32")
    eager = aq.quantize(x, case.text, calibration=aq.Percentile(q=q))
    check(eager, x, case, q)
    off = Case("u8", "offset", None, "f16")
    check(aq.quantize(x + F32(2), off.text, calibration=aq.Percentile(q=q)), x + F32(2), off, q)
    da = pytest.importorskip("dask.array")
    lazy = aq.quantize(da.from_array(x, chunks=(256, 515)), case.text, calibration=aq.Percentile(q=q))
    check(lazy, x, case, q)


def test_per_block_over_many_slabs_and_chunks() -> None:
    x = sample("outlier", (1030, 300), seed=23)  # > 1 MiB: several slabs; partial blocks at the edges
    for case in (Case("u4", "offset", (32,), "f16"), Case("q4f", "zero_point", (8, 16), "bf16")):
        check(aq.quantize(x, case.text, calibration="percentile:99"), x, case, 99)
        da = pytest.importorskip("dask.array")
        lazy = aq.quantize(da.from_array(x, chunks=(300, 128)), case.text, calibration="percentile:99")
        check(lazy, x, case, 99)


@pytest.mark.parametrize(
    "case", [BLOCK_CASES[0], BLOCK_CASES[1], BLOCK_CASES[4], TENSOR_CASES[0], TENSOR_CASES[1]], ids=lambda c: c.text
)
@pytest.mark.parametrize("q", [50, 99.9, 1e-6])
def test_same_bits_on_every_backend(xp, case: Case, q: float) -> None:
    x = sample("outlier", (8, 64), seed=5)
    x[2, 3:9] = F32(0)  # zeros: no backend's sort chooses between -0.0 and 0.0 for the stored bits
    check(aq.quantize(xp.asarray(x), case.text, calibration=aq.Percentile(q=q)), x, case, q)


def test_percentile_100_is_minmax() -> None:
    x = sample("heavy", (6, 70), seed=8)
    for case in BLOCK_CASES + TENSOR_CASES:
        a = aq.quantize(x, case.text, calibration="percentile:100")
        with aq.fused_kernels(False):  # the portable MinMax (the fused one is checked against it elsewhere)
            b = aq.quantize(x, case.text)
        np.testing.assert_array_equal(_bits(a.scales), _bits(b.scales))
        np.testing.assert_array_equal(_second(a, case), _second(b, case))
        np.testing.assert_array_equal(a.codes(), b.codes())


@pytest.mark.parametrize("case", [BLOCK_CASES[1], BLOCK_CASES[4], TENSOR_CASES[0]], ids=lambda c: c.text)
def test_tiny_slabs(xp, case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many row slabs with a partial last one: blocks and the counting passes across slab edges."""
    import arrayquant.chunks

    monkeypatch.setattr(arrayquant.chunks, "CHUNK_ELEMENTS", 150)
    x = sample("heavy", (37, 70), seed=13)
    check(aq.quantize(xp.asarray(x), case.text, calibration="percentile:95"), x, case, 95)


def test_jax_jit() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    x = sample("outlier", (16, 64), seed=14)
    for case in (BLOCK_CASES[0], TENSOR_CASES[1]):

        @jax.jit
        def run(a, text=case.text):
            qt = aq.quantize(a, text, calibration="percentile:99")  # traced: the unchecked rule applies
            return qt.values, qt.scales, qt.zero_point if qt.zero_point is not None else qt.offset

        values, scales, second = run(jnp.asarray(x))
        _, want_s, want_z, _, _ = oracle(x, case, 99)
        np.testing.assert_array_equal(_bits(np.asarray(scales)), _bits(want_s))
        got = np.asarray(second).astype(np.int64) if case.mode == "zero_point" else _bits(np.asarray(second))
        np.testing.assert_array_equal(got, _expected_second(want_z, case))
        eager = aq.quantize(x, case.text, calibration="percentile:99")
        np.testing.assert_array_equal(np.asarray(values), eager.values)


def test_spellings_agree() -> None:
    x = sample("heavy", (4, 64), seed=9)
    text = "u4:block32:f16:zero_point"
    want = aq.quantize(x, text, calibration=aq.Percentile(99.5))
    for cal in ("percentile:99.5", "percentile:q=99.5"):
        np.testing.assert_array_equal(aq.quantize(x, text, calibration=cal).values, want.values)
    default = aq.quantize(x, text, calibration="percentile")  # q = 99.9
    check(default, x, Case("u4", "zero_point", (32,), "f16"), 99.9)


def test_per_tensor_holds_no_sorted_copy() -> None:
    x = data("normal", (2048, 1024), seed=22)  # 8 MiB of f32

    def peak(calibration: str) -> int:
        tracemalloc.start()
        try:
            with aq.fused_kernels(False):  # the portable MinMax: the same slab walk
                aq.quantize(x, "u8:tensor:f32:zero_point", calibration=calibration)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak("minmax"), peak("percentile:99")  # first calls fill caches outside the measure
    # the same working set as MinMax's (output plus slab temporaries); a sort of x adds 8 MiB
    assert peak("percentile:99") < peak("minmax") + 2**20


@pytest.mark.parametrize("text", ["u4:block32:f16:zero_point", "u4:tensor:f16:offset"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_reported(text: str, bad: float) -> None:
    x = sample("heavy", (4, 64), seed=10)
    x[2, 33] = bad  # beyond the 99th percentile's reach: a sort alone would never pick it
    with pytest.raises(aq.NonFiniteInputError, match=r"\(2, 33\)"):
        aq.quantize(x, text, calibration="percentile:50")
    da = pytest.importorskip("dask.array")
    lazy = aq.quantize(da.from_array(x, chunks=(2, 32)), text, calibration="percentile:50")
    with pytest.raises(aq.NonFiniteInputError):
        lazy.values.compute()


@pytest.mark.parametrize(
    "case", [BLOCK_CASES[0], BLOCK_CASES[1], TENSOR_CASES[0], TENSOR_CASES[1]], ids=lambda c: c.text
)
def test_unchecked_input_counts_non_finite_as_zero(xp, case: Case) -> None:
    x = sample("positive", (4, 64), seed=11)
    x[1, 3], x[2, 40], x[3, 0] = np.nan, np.inf, -np.inf
    qt = aq.quantize(xp.asarray(x), case.text, calibration="percentile:90", check_finite=False)
    codes, scales, zero, _, _ = oracle(x, case, 90, finite_only=True)
    np.testing.assert_array_equal(_bits(to_host(qt.scales)), _bits(scales))
    np.testing.assert_array_equal(_second(qt, case), _expected_second(zero, case))
    got = to_host(qt.codes())
    fin = np.isfinite(x)
    np.testing.assert_array_equal(got[fin], codes[fin])
    _, qmin, qmax = oa.value_range(case.value)
    assert got[2, 40] == qmax
    assert got[3, 0] == qmin


@pytest.mark.parametrize("case", BLOCK_CASES[:3] + TENSOR_CASES[:2], ids=lambda c: c.text)
@pytest.mark.parametrize("q", [99.9, 50])
def test_compute_range_gives_the_dynamic_result(case: Case, q: float) -> None:
    x = sample("heavy", (6, 70), seed=12)
    _, _, _, lo_want, hi_want = oracle(x, case, q)
    lo, hi = aq.compute_range(x, case.text, aq.Percentile(q=q))
    np.testing.assert_array_equal(_bits(lo), _bits(lo_want))
    np.testing.assert_array_equal(_bits(hi), _bits(hi_want))
    dynamic = aq.quantize(x, case.text, calibration=aq.Percentile(q=q))
    static = aq.quantize(x, case.text, aq.compute_q_params(case.text, lo, hi))
    np.testing.assert_array_equal(static.values, dynamic.values)
    np.testing.assert_array_equal(_bits(static.scales), _bits(dynamic.scales))
    np.testing.assert_array_equal(_second(static, case), _second(dynamic, case))
    da = pytest.importorskip("dask.array")
    lo_l, hi_l = aq.compute_range(da.from_array(x, chunks=(3, 35)), case.text, aq.Percentile(q=q))
    np.testing.assert_array_equal(_bits(lo_l.compute()), _bits(lo_want))
    np.testing.assert_array_equal(_bits(hi_l.compute()), _bits(hi_want))


def test_refusals() -> None:
    x = sample("heavy", (2, 32))
    with pytest.raises(aq.ParamsError, match=r"calibration 'percentile' does not use them"):
        aq.quantize(x, "u4:block32:zero_point", calibration="percentile", importance=np.ones(32, F32))
    with pytest.raises(aq.ParamsError, match=r"calibration 'percentile' does not use them"):
        aq.compute_range(x, "u4:block32:offset", "percentile", importance=np.ones(32, F32))
    with pytest.raises(aq.ParamsError, match=r"Percentile q must be"):
        aq.quantize(x, "u4:block32:offset", calibration="percentile:101")
