"""The round-up storage rule against the oracle on dense f32 sweeps, on every backend."""

from __future__ import annotations

import array_api_compat
import ml_dtypes
import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import flushes_subnormals, to_host

from . import oracle

NARROW = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "ue4m3": ml_dtypes.float8_e4m3fn}


def grid_neighbourhood(dtype: str) -> np.ndarray:
    """Every non-negative value of the scale grid and its f32 neighbours (±1, ±2 ulp)."""
    if dtype == "ue8m0":
        grid = np.ldexp(np.float32(1), np.arange(-127, 128)).astype(np.float32)
    else:
        bits = np.arange(0, 1 << (8 * np.dtype(NARROW[dtype]).itemsize), dtype=np.uint64)
        view = bits.astype(np.uint16 if dtype != "ue4m3" else np.uint8).view(NARROW[dtype])
        grid = view.astype(np.float32)
        grid = grid[np.isfinite(grid) & (grid >= 0)]
    parts = [grid]
    for k in (1, 2):
        up, down = grid.copy(), grid.copy()
        for _ in range(k):
            up = np.nextafter(up, np.float32(np.inf))
            down = np.nextafter(down, np.float32(0))
        parts += [up, down]
    return np.unique(np.concatenate(parts))


def dense_sweep(n: int = 1 << 20, seed: int = 0) -> np.ndarray:
    """Positive finite f32 values spread evenly over every exponent (bit patterns), plus specials."""
    rng = np.random.default_rng(seed)
    patterns = np.linspace(0, 0x7F7FFFFF, n, dtype=np.uint64).astype(np.uint32)
    jitter = rng.integers(0, 1 << 12, n, dtype=np.uint32)
    bits = np.minimum(patterns + jitter, np.uint32(0x7F7FFFFF))
    specials = np.array([0.0, np.inf, np.finfo(np.float32).max, 2.0**-149, 2.0**-126], np.float32)
    return np.concatenate([bits.view(np.float32), specials])


def expected_for(xp, s: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and oracle outputs; on subnormal-flushing backends only normal inputs count."""
    want = oracle.round_up(s, dtype)
    if flushes_subnormals(array_api_compat.array_namespace(xp.asarray(np.zeros(1, np.float32)))):
        keep = (s == 0) | (s >= np.float32(2.0**-126))
        s, want = s[keep], want[keep]
        want = np.where(want < np.float32(2.0**-126), np.float32(0), want)  # 2^-127 flushes to 0
    return s, want


@pytest.mark.parametrize("dtype", ["f16", "bf16", "ue4m3", "ue8m0"])
def test_grid_neighbourhood(xp, dtype: str) -> None:
    s, want = expected_for(xp, grid_neighbourhood(dtype), dtype)
    got = to_host(aq.round_up_scales(xp.asarray(s), dtype))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "ue4m3", "ue8m0"])
def test_dense_sweep(xp, dtype: str) -> None:
    n = (1 << 16) if xp.backend.library == "dask" else (1 << 20)
    s, want = expected_for(xp, dense_sweep(n), dtype)
    got = to_host(aq.round_up_scales(xp.asarray(s), dtype))
    np.testing.assert_array_equal(got, want)


def test_nan_stays_nan_and_spec_examples(xp) -> None:
    s = np.array([np.nan, 1.0012, 0.3, 1e-3, 500.0], np.float32)
    assert np.isnan(to_host(aq.round_up_scales(xp.asarray(s), "f16"))[0])
    assert to_host(aq.round_up_scales(xp.asarray(s), "f16"))[1] == 1.001953125
    np.testing.assert_array_equal(
        to_host(aq.round_up_scales(xp.asarray(s[2:]), "ue4m3")), np.array([0.3125, 2.0**-9, 448.0], np.float32)
    )
    assert to_host(aq.round_up_scales(xp.asarray(s[2:3]), "bf16"))[0] == np.float32(0.30078125)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["f16", "bf16", "ue4m3", "ue8m0"])
def test_every_positive_finite_f32(dtype: str) -> None:
    """All 2^31 - 2^23 positive finite f32 values (opt-in: pytest -m slow), on NumPy."""
    step = 1 << 24
    for start in range(0, 0x7F800000, step):
        s = np.arange(start, min(start + step, 0x7F800000), dtype=np.uint32).view(np.float32)
        got = aq.round_up_scales(s, dtype)
        np.testing.assert_array_equal(got, oracle.round_up(s, dtype))
