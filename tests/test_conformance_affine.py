"""Conformance of the affine modes and the odd widths: every backend gives the oracle's bits.

Codes, stored scales, zero points and offsets, packed words and dequantized values are compared
exactly with :mod:`tests.oracle_affine`, on every backend the ``xp`` fixture provides.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import to_host

from . import oracle_affine as oracle
from .oracle_affine import Case
from .test_conformance import weights

VALUES = [
    ("u1", "zero_point"),
    ("u2", "offset"),
    ("u3", "zero_point"),
    ("u4", "zero_point"),
    ("u4", "offset"),
    ("u5", "offset"),
    ("u6", "zero_point"),
    ("u7", "offset"),
    ("u8", "zero_point"),
    ("u8", "offset"),
    ("q4f", "zero_point"),
    ("q8f", "zero_point"),
    ("q3s", "zero_point"),
    ("q6f", "zero_point"),
    ("q3f", "symmetric"),
    ("q5f", "symmetric"),
    ("q5s", "symmetric"),
    ("q6s", "symmetric"),
    ("q7f", "symmetric"),
    ("q7s", "symmetric"),
]
LEVELS = [(None, "f32"), ((32,), "f16"), ((5,), "bf16"), ((4, 8), "f32")]
STORES = [("packed_u32", 0), ("packed_native", 0), ("native", 0), ("packed_u32", 1), ("packed_native", 1)]


def _cases() -> list[Case]:
    out = []
    stores = itertools.cycle(STORES)
    for (value, mode), (block, scale) in itertools.product(VALUES, LEVELS):
        store, dim = next(stores)
        if store == "packed_native" and oracle.value_range(value)[0] == 8:  # bytes already: no packed_native
            store = "packed_u32"
        out.append(Case(value, mode, block, scale, store, dim))
    return out


CASES = _cases()


def check(qt: aq.QuantizedTensor, x: np.ndarray, case: Case, rounding: str = "half_even") -> None:
    codes, scales, zero = oracle.quantize(x, case, rounding)
    np.testing.assert_array_equal(to_host(qt.codes()), codes)
    assert to_host(qt.codes()).dtype == codes.dtype
    np.testing.assert_array_equal(to_host(qt.scales), scales)
    if case.mode == "zero_point":
        got = to_host(qt.zero_point)
        assert got.dtype == codes.dtype
        assert qt.offset is None
        np.testing.assert_array_equal(got, zero.astype(codes.dtype))
    elif case.mode == "offset":
        assert qt.zero_point is None
        np.testing.assert_array_equal(to_host(qt.offset), zero)
    else:
        assert qt.zero_point is None
        assert qt.offset is None
    bits = oracle.value_range(case.value)[0]
    values = to_host(qt.values)
    if case.store == "native":
        np.testing.assert_array_equal(values, codes)
    else:
        axis = x.ndim - 1 - case.dim
        word_bits = 32 if case.store == "packed_u32" else 8
        np.testing.assert_array_equal(values, oracle.pack(codes, bits, axis, word_bits))
    assert qt.nbytes == aq.quantized_nbytes(case.text, x.shape)
    np.testing.assert_array_equal(to_host(aq.dequantize(qt)), oracle.dequantize(codes, scales, zero, case))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.text)
def test_quantize_matches_oracle(xp, case: Case) -> None:
    x = weights((13, 70))
    check(aq.quantize(xp.asarray(x), case.text), x, case)


@pytest.mark.parametrize(
    "case",
    [Case("u4", "zero_point", (32,), "f16"), Case("u5", "offset", (8,), "f32"), Case("q3s", "zero_point", None, "f32")],
    ids=lambda c: c.text,
)
def test_half_away(xp, case: Case) -> None:
    x = weights((6, 64), seed=2)
    check(aq.quantize(xp.asarray(x), case.text, rounding="half_away"), x, case, "half_away")


@pytest.mark.parametrize("value", ["u4", "u8", "q4f"])
def test_one_signed_data(xp, value: str) -> None:
    # all-positive and all-negative blocks: the zero point sits at an end of the code range
    x = np.concatenate([np.full((2, 32), 0.25, np.float32), -np.linspace(0.1, 3, 64, dtype=np.float32).reshape(2, 32)])
    case = Case(value, "zero_point", (32,), "f16", "native")
    qt = aq.quantize(xp.asarray(x), case.text)
    check(qt, x, case)
    _, qmin, qmax = oracle.value_range(value)
    z = to_host(qt.zero_point)
    assert z[:2].tolist() == [[qmin], [qmin]]
    assert z[2:].tolist() == [[qmax], [qmax]]
