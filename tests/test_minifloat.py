"""Minifloat codes (E4M3, E5M2, E2M1) against ml_dtypes, on every backend, and the presets."""

from __future__ import annotations

import array_api_compat
import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import flushes_subnormals, to_host
from arrayquant.kernels.minifloat import decode_table, encode

from . import oracle
from .oracle import Case

VALUES = {"e4m3": aq.QuantValue.E4M3, "e5m2": aq.QuantValue.E5M2, "e2m1": aq.QuantValue.E2M1}


def sweep(value: str) -> np.ndarray:
    """Dense f32 sweep: every exponent and sign, ties between codes, subnormals, specials."""
    patterns = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    grid = np.array([v for v in decode_table(VALUES[value]) if np.isfinite(v) and v >= 0], np.float32)
    grid = np.unique(grid)
    ties = (grid[:-1] + grid[1:]) / np.float32(2)  # exact midpoints: round half to even
    near = np.concatenate([np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(np.inf))])
    top = np.float32(oracle.FLOATS[value][2])
    specials = np.array(
        [0.0, np.inf, np.nan, top, top * 1.01, 1e38, 2.0**-149, 2.0**-127, 2.0**-10, 2.0**-9 * 1.5], np.float32
    )
    mags = np.concatenate([patterns, grid, ties, near, specials])
    return np.concatenate([mags, -mags])


@pytest.mark.parametrize("value", list(VALUES))
def test_codes_equal_ml_dtypes(xp, value: str) -> None:
    y = sweep(value)
    ns = array_api_compat.array_namespace(xp.asarray(np.zeros(1, np.float32)))
    if flushes_subnormals(ns):  # docs/spec.md, backends: subnormal inputs may differ there
        y = y[~((np.abs(y) < np.float32(2.0**-126)) & (y != 0))]
    got = to_host(encode(xp.asarray(y), VALUES[value], xp=ns))
    np.testing.assert_array_equal(got, oracle.float_codes(y, value))


@pytest.mark.parametrize("value", list(VALUES))
def test_decode_table_equals_ml_dtypes(value: str) -> None:
    bits, kind, _ = oracle.FLOATS[value]
    codes = np.arange(1 << bits, dtype=np.uint8)
    np.testing.assert_array_equal(
        np.array(decode_table(VALUES[value]), np.float32), codes.view(kind).astype(np.float32)
    )


@pytest.mark.slow
@pytest.mark.parametrize("value", list(VALUES))
def test_every_f32_bit_pattern(value: str) -> None:
    """All 2^32 f32 bit patterns (opt-in: pytest -m slow), on NumPy."""
    import array_api_compat.numpy as xnp

    step = 1 << 24
    for start in range(0, 1 << 32, step):
        y = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        np.testing.assert_array_equal(np.asarray(encode(y, VALUES[value], xp=xnp)), oracle.float_codes(y, value))


PRESETS = {
    "nvfp4": Case("e2m1", (16,), "ue4m3", True, "packed_native", 0),
    "mxfp4": Case("e2m1", (32,), "ue8m0", False, "packed_native", 0),
    "mxfp8": Case("e4m3", (32,), "ue8m0", False, "native", 0),
}


def _expected_bytes(case: Case, x: np.ndarray) -> bytes:
    codes, stored, glob = oracle.quantize(x, case)
    values = oracle.pack_native(codes, 0) if case.store == "packed_native" else codes
    scale_bytes = {
        "ue4m3": lambda s: s.astype(oracle.FLOATS["e4m3"][1]).view(np.uint8).tobytes(),
        "ue8m0": lambda s: (np.frexp(s)[1] - 1 + 127).astype(np.uint8).tobytes(),
    }[case.scale](stored)
    tail = b"" if glob is None else glob.astype("<f4").tobytes()
    return values.tobytes() + scale_bytes + tail


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_give_the_same_bytes_everywhere(xp, preset: str) -> None:
    x = np.random.default_rng(21).normal(0, 0.02, (4, 64)).astype(np.float32)
    x[1, 16:32] = 0  # an all-zero block: UE4M3 0, UE8M0 2^-127 (code 0x00)
    qt = aq.quantize(xp.asarray(x), preset)
    assert qt.scheme == aq.QuantScheme.parse(preset)
    assert aq.to_bytes(qt) == _expected_bytes(PRESETS[preset], x)
    back = aq.from_bytes(aq.to_bytes(qt), preset, x.shape, backend="numpy")
    np.testing.assert_array_equal(aq.dequantize(back), to_host(aq.dequantize(qt)))


def _ocp_oracle(x: np.ndarray, value: str, block: int) -> tuple[np.ndarray, np.ndarray]:
    """OCP MX v1.0: X = 2^(floor(log2(amax)) - emax_elem), exponent clamped to [-127, 127]."""
    emax = {"e4m3": 8, "e5m2": 15, "e2m1": 2}[value]
    blocks = x.reshape(x.shape[0], -1, block)
    amax = np.abs(blocks).max(axis=-1)
    exp = np.where(amax > 0, np.frexp(amax.astype(np.float64))[1] - 1 - emax, -127)
    scales = np.ldexp(np.float64(1), np.clip(exp, -127, 127)).astype(np.float32)
    codes = oracle.float_codes(blocks / scales[..., None], value).reshape(x.shape)
    return codes, scales


@pytest.mark.parametrize(("preset", "value", "block"), [("mxfp8", "e4m3", 32), ("mxfp4", "e2m1", 32)])
def test_ocp_shared_exponent_rule(xp, preset: str, value: str, block: int) -> None:
    x = np.random.default_rng(5).normal(0, 0.02, (6, 64)).astype(np.float32)
    x[0, :32] *= 1000  # large blocks: the floor rule clips their maxima
    x[2, 32:] = 0
    scheme = aq.QuantScheme.parse(preset).with_scale_rule("ocp")
    qt = aq.quantize(xp.asarray(x), scheme)
    codes, scales = _ocp_oracle(x, value, block)
    ns = array_api_compat.array_namespace(xp.asarray(np.zeros(1, np.float32)))
    if flushes_subnormals(ns):
        scales = np.where(scales < np.float32(2.0**-126), np.float32(0), scales)
    np.testing.assert_array_equal(to_host(qt.codes()), codes)
    np.testing.assert_array_equal(to_host(qt.scales), scales)


def test_ocp_worked_example() -> None:
    # docs/formats.md: a block whose largest value is 500, in MXFP8
    x = np.full((1, 32), 1.0, np.float32)
    x[0, 0] = 500.0
    default = aq.quantize(x, "mxfp8")
    ocp = aq.quantize(x, aq.QuantScheme.mxfp8().with_scale_rule("ocp"))
    assert float(default.scales[0, 0]) == 2.0  # 500 / 448 = 1.12, rounded up to a power of two
    assert float(aq.dequantize(default)[0, 0]) == 512.0  # 250 rounds to the E4M3 value 256
    assert float(ocp.scales[0, 0]) == 1.0  # 2^(floor(log2 500) - 8) = 2^0
    assert float(aq.dequantize(ocp)[0, 0]) == 448.0  # 500 saturates at the E4M3 max


def test_ocp_rule_needs_one_level_ue8m0_float_scheme() -> None:
    for bad in ("q8s:block32:ue8m0:ocp", "e4m3:block32:f16:ocp", "e2m1:block16:ue4m3:tensor:f32:packed_native:ocp"):
        with pytest.raises(aq.SchemeError, match=r"the OCP shared-exponent rule needs a float value with one level"):
            aq.quantize(np.ones((2, 32), np.float32), bad)
    with pytest.raises(aq.SchemeError, match=r"unknown scale rule 'floor'"):
        aq.QuantScheme().with_scale_rule("floor")
