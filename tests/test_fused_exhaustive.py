"""The fused (Numba) minifloat encoders and scale round-up against the portable kernels, on f32 bit patterns.

``-m slow`` sweeps all 2^32 patterns in chunks of 2^24 (the round-up on the 2^31 non-negative ones:
scales are never negative); the default run takes every 4099th pattern and every pattern within 256
of each power of two of f32 (so every binade boundary, subnormal range and saturation point of
E4M3, E5M2, E2M1, F16, BF16, UE4M3 and UE8M0), both signs. The reference is the portable kernel on
NumPy; codes must be equal, scales equal bit for bit (NaN: any NaN).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba (pip install numba)")
numba_quantize = pytest.importorskip(
    "arrayquant.fused.numba_quantize", reason="arrayquant.fused.numba_quantize (the fused encoders) is missing"
)

from arrayquant.kernels.minifloat import encode  # noqa: E402
from arrayquant.kernels.roundup import round_up_scales  # noqa: E402
from arrayquant.scheme import QuantValue, ScaleDtype  # noqa: E402

VALUES = (QuantValue.E4M3, QuantValue.E5M2, QuantValue.E2M1)
DTYPES = (ScaleDtype.F16, ScaleDtype.BF16, ScaleDtype.UE4M3, ScaleDtype.UE8M0)
CHUNK = 1 << 24


def _code_mismatches(y: np.ndarray, value: QuantValue) -> int:
    fused = numba_quantize.encode_minifloat(y, value)
    with np.errstate(all="ignore"):
        ref = encode(y, value, xp=np)
    assert fused.dtype == np.uint8
    assert fused.shape == y.shape
    return int(np.count_nonzero(fused != ref))


def _scale_mismatches(s: np.ndarray, dtype: ScaleDtype) -> int:
    fused = numba_quantize.round_up(s, dtype)
    with np.errstate(all="ignore"):
        ref = round_up_scales(s, dtype, xp=np)
    assert fused.dtype == np.float32
    assert fused.shape == s.shape
    same = (fused.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(fused) & np.isnan(ref))
    return int(np.count_nonzero(~same))


def _sweep(patterns: np.ndarray, counts: dict[str, int]) -> None:
    y = patterns.view(np.float32)
    for v in VALUES:
        counts[v.name] += _code_mismatches(y, v)
    s = y[patterns < 0x80000000]  # the non-negative patterns: +0 .. +inf and the positive NaNs
    if s.size:
        for d in DTYPES:
            counts[d.name] += _scale_mismatches(s, d)


def _boundary_patterns() -> np.ndarray:
    """Every pattern within 256 of each f32 power of two (and of 0, inf), both signs."""
    centres = [np.float32(2.0**e).view(np.uint32) for e in range(-149, 128)] + [0, 0x7F800000]
    near = np.concatenate([np.arange(max(int(c) - 256, 0), int(c) + 257, dtype=np.int64) for c in centres])
    near = near[near < 0x80000000].astype(np.uint32)
    return np.concatenate([near, near | np.uint32(0x80000000)])


def test_worked_values_fail_loudly():
    # the comparison itself can fail: a wrong code or scale is counted
    y = np.asarray([1.0, 448.0, -0.0, 0.3], dtype=np.float32)
    assert numba_quantize.encode_minifloat(y, QuantValue.E4M3).tolist() == [0x38, 0x7E, 0x80, 0x2A]
    assert numba_quantize.round_up(np.asarray([0.3], np.float32), ScaleDtype.UE4M3).tolist() == [0.3125]
    counts = dict.fromkeys([v.name for v in VALUES] + [d.name for d in DTYPES], 0)
    _sweep(np.asarray([0x3F800000, 0x3E99999A], dtype=np.uint32), counts)
    assert set(counts.values()) == {0}


def test_strided_and_boundary_patterns_match():
    start = time.perf_counter()
    patterns = np.concatenate([np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32), _boundary_patterns()])
    counts = dict.fromkeys([v.name for v in VALUES] + [d.name for d in DTYPES], 0)
    _sweep(patterns, counts)
    print(f"{patterns.size} patterns, mismatches {counts}, {time.perf_counter() - start:.1f} s")
    assert counts == dict.fromkeys(counts, 0)


def test_round_up_keeps_nan():
    # the portable round-up keeps NaN (the quantize path never rounds a NaN scale: NaN data is
    # refused first; this is the sweep's contract)
    nans = np.asarray([0x7F800001, 0x7FC00000, 0x7FFFFFFF], dtype=np.uint32).view(np.float32)
    for d in DTYPES:
        assert np.isnan(numba_quantize.round_up(nans, d)).all(), d


@pytest.mark.slow
def test_all_f32_patterns_match():
    # AQ_SWEEP_CHUNKS=first:stop sweeps only chunks [first, stop) of the 256 (to resume a cut run)
    first, stop = (int(v) for v in os.environ.get("AQ_SWEEP_CHUNKS", "0:256").split(":"))
    start = time.perf_counter()
    counts = dict.fromkeys([v.name for v in VALUES] + [d.name for d in DTYPES], 0)
    for k in range(first, stop):
        lo = k * CHUNK
        _sweep(np.arange(lo, lo + CHUNK, dtype=np.uint64).astype(np.uint32), counts)
        if k % 8 == 7 or k == stop - 1:
            print(f"  chunks {first}..{k} done, {time.perf_counter() - start:.0f} s, mismatches {counts}", flush=True)
    print(f"chunks {first}:{stop} of 256 (2^24 each): {counts}, {time.perf_counter() - start:.0f} s")
    assert counts == dict.fromkeys(counts, 0)
