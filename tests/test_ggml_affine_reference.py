"""Q4_1, Q5_0 and Q5_1 of ``arrayquant.fused.ggml_reference`` against ggml's own C, and gguf-py.

The oracle is ggml-base compiled from the pinned llama-cpp-python sdist (``tests/ggml_oracle.py``):
``ggml_quantize_chunk`` (``quantize_row_q4_1_ref`` etc. in ggml-quants.c) writes the bytes, the
parser below reads them (layouts from ggml-common.h: ``block_q4_1``, ``block_q5_0``,
``block_q5_1``), and ``dequantize_row_*`` checks what the returned codes mean. Codes and the
stored ``d`` and ``m`` (as f16 bits, the sign of zero included) are compared exactly.

gguf-py's ``gguf.quants.quantize`` writes the same bytes but for the sign of a zero, in two places
pinned below: Q5_0's all-zero block whose first element is ``-0.0`` (gguf-py's ``max`` is that
element, ggml's stays ``0.0f``), and Q4_1/Q5_1 blocks whose minimum is a zero held as both ``+0.0``
and ``-0.0`` (ggml keeps the first, gguf-py whichever NumPy's ``min`` reduction returns).
"""

from __future__ import annotations

import platform
import zlib

import numpy as np
import pytest

from arrayquant.errors import NonFiniteInputError
from arrayquant.fused import ggml_reference as ref

from . import ggml_oracle

gguf = pytest.importorskip("gguf")

TYPES = ["Q4_1", "Q5_0", "Q5_1"]
_F32 = np.float32
# ggml-common.h: bytes per block of 32, and whether it has m (f16) and qh (uint32)
_LAYOUT = {"Q4_1": (20, True, False), "Q5_0": (22, False, True), "Q5_1": (24, True, True)}
# C's float-to-int cast of inf/NaN is undefined; x86's cvttss2si makes it 0, as ggml_reference does
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_UNDEFINED = ("subnormal", "large")  # data sets with such blocks: 1 / d = inf, or (x - min) * 0 = inf * 0


def _parse(raw: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """ggml's bytes -> (stored 4/5-bit codes ``(blocks, 32)``, d's f16 bits, m's f16 bits or None).

    Block layout (little-endian): f16 ``d``; f16 ``m`` (Q4_1, Q5_1); uint32 ``qh`` whose bit ``j``
    is bit 4 of element ``j`` (Q5_0, Q5_1); 16 bytes ``qs``, element ``j`` in the low nibble of
    ``qs[j]`` and element ``j + 16`` in its high nibble.
    """
    size, has_m, has_qh = _LAYOUT[type_name]
    blocks = raw.reshape(-1, size)
    n = blocks.shape[0]
    d = blocks[:, 0].astype(np.uint16) | (blocks[:, 1].astype(np.uint16) << 8)
    pos, m = 2, None
    if has_m:
        m = blocks[:, 2].astype(np.uint16) | (blocks[:, 3].astype(np.uint16) << 8)
        pos = 4
    qh = np.zeros(n, np.uint32)
    if has_qh:
        for b in range(4):
            qh |= blocks[:, pos + b].astype(np.uint32) << (8 * b)
        pos += 4
    qs = blocks[:, pos : pos + 16]
    codes = np.empty((n, 32), np.uint8)
    for j in range(16):
        codes[:, j] = (qs[:, j] & 0x0F) | (((qh >> j) & 1) << 4).astype(np.uint8)
        codes[:, j + 16] = (qs[:, j] >> 4) | (((qh >> (j + 16)) & 1) << 4).astype(np.uint8)
    return codes, d, m


def _f16_bits(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # values are f16's already (inf included): exact
        return v.reshape(-1).astype(np.float16).view(np.uint16)


def _reference(x: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """ggml_reference's codes (as stored: Q5_0's ``q - 16`` back to ``q``), d, m (f32)."""
    if type_name == "Q5_0":
        codes, d = ref.quantize_blocks(x, "Q5_0")
        assert codes.dtype == np.int8
        assert codes.min() >= -16
        assert codes.max() <= 15
        return (codes.astype(np.int16) + 16).astype(np.uint8), d, None
    codes, d, m = ref.quantize_offset_blocks(x, type_name)
    assert codes.dtype == np.uint8
    assert codes.max() <= (15 if type_name == "Q4_1" else 31)
    return codes, d, m


def _rows(rows: list[object]) -> np.ndarray:
    return np.stack([np.asarray(r, np.float64) for r in rows]).astype(_F32)


def _data(dist: str, type_name: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{dist}/{type_name}".encode()))
    if dist == "normal":
        return (rng.standard_normal((16, 256)) * 0.02).astype(_F32)
    if dist == "outliers":
        x = rng.standard_normal((16, 256)).astype(_F32)
        hit = rng.random(x.shape) < 0.02
        x[hit] *= rng.choice([-100.0, 100.0, 1e4], size=int(hit.sum())).astype(_F32)
        return x
    if dist == "constant":  # d = 0: codes 0 (Q5_0: 16), m the value
        values = [0.5, -3.25, 1e-3, 7.0, -1e-5, 0.1, 65504.0, -65504.0, 1e-8, 3.0e4, -0.3, 123.456]
        return np.repeat(np.asarray(values, _F32), 32).reshape(3, 128)
    if dist == "zeros":  # all +0.0, all -0.0, mixed with -0.0 first, mixed with +0.0 first
        rows = [np.zeros(32), -np.zeros(32)]
        for first in (-0.0, 0.0):
            r = np.where(rng.random(32) < 0.5, 0.0, -0.0)
            r[0] = first
            rows.append(r)
        return _rows(rows).reshape(1, -1)
    if dist == "signed_zeros":  # random signs of zero: all-zero blocks, and zero the minimum
        zeros = np.where(rng.random((64, 32)) < 0.5, 0.0, -0.0)
        pos = np.where(rng.random((64, 32)) < 0.3, zeros, np.abs(rng.standard_normal((64, 32))))
        return np.concatenate([zeros, pos]).astype(_F32).reshape(8, -1)
    if dist == "negative":
        x = -np.abs(rng.standard_normal((8, 128))).astype(_F32)
        x[0, :32] = np.where(np.arange(32) % 3, x[0, :32], -0.0)  # -0.0 the block's max
        x[1, 32:64] = np.where(np.arange(32) % 5, x[1, 32:64], 0.0)  # +0.0 the max
        return x
    if dist == "positive":
        x = np.abs(rng.standard_normal((8, 128))).astype(_F32)
        x[0, :32] = np.where(np.arange(32) % 3, x[0, :32], -0.0)  # -0.0 the min
        x[1, 32:64] = np.where(np.arange(32) % 5, x[1, 32:64], 0.0)  # +0.0 the min
        return x
    if dist == "ties":  # exact multiples of d / 2, d a power of two: exactly half way between codes
        blocks = []
        for _ in range(24):
            s = np.ldexp(1.0, int(rng.integers(-12, 12)))
            if type_name == "Q5_0":
                j = rng.integers(-32, 33, 32)
                j[rng.integers(32)] = 32 * rng.choice([-1, 1])  # |max| = 16 s: d = -+s exactly
                blocks.append(j * s / 2)
            else:
                top = 30 if type_name == "Q4_1" else 62  # max - min = 15 s (31 s): d = s exactly
                j = rng.integers(0, top + 1, 32)
                j[:2] = [0, top]
                rng.shuffle(j)
                blocks.append(rng.integers(-40, 41) * s + j * s / 2)
        return _rows(blocks).reshape(4, -1)
    if dist == "near_ties":  # min + k d / 2 for d not a power of two, rounded to f32
        blocks = []
        for _ in range(24):
            lo, width = rng.normal(), abs(rng.normal()) + 0.1
            levels = 15 if type_name == "Q4_1" else 31
            if type_name == "Q5_0":
                lo, levels = -width, 16
            k = rng.integers(0, 2 * levels + 1, 32)
            k[:2] = [0, 2 * levels]
            blocks.append(lo + k * (width / levels) / 2)
        return _rows(blocks).reshape(4, -1)
    if dist == "tiny":  # normal f32 but d below f16's least subnormal: stored as zero
        return (rng.standard_normal((4, 128)) * np.logspace(-37, -26, 4)[:, None]).astype(_F32)
    if dist == "subnormal":  # |d| < 2**-128: 1 / d is inf and the C's cast to an integer undefined
        x = (rng.standard_normal((4, 128)) * np.array([1e-38, 1e-40, 1e-43, 1e-45])[:, None]).astype(_F32)
        x[3, :32] = np.float32(1e-45) * rng.integers(-3, 4, 32)
        return x
    if dist == "large":  # near f16's largest, 65504, and beyond it (stored as inf)
        rows = [
            rng.uniform(-65504, 65504, 32),
            np.r_[-65504.0, 65504.0, rng.uniform(-6e4, 6e4, 30)],
            np.r_[-65519.0, rng.uniform(0, 6e4, 31)],  # m rounds to -65504
            np.r_[-65520.0, rng.uniform(0, 6e4, 31)],  # m rounds to -inf
            np.r_[-65504.0 * 16, rng.uniform(-1e5, 1e5, 31)],  # Q5_0: d = 65504
            np.r_[65520.0 * 16, rng.uniform(-1e5, 1e5, 31)],  # Q5_0: d rounds to -inf
            np.r_[-5e5, 4.8e5, rng.uniform(-4e5, 4e5, 30)],  # Q4_1: d near 65504
            np.r_[-1e6, 1e6, rng.uniform(-1e6, 1e6, 30)],  # d and m inf
            np.linspace(-3e38, 3.2e38, 32),  # max - min beyond f32: d = inf, 1 / d = 0, (x - min) * 0 NaN
            np.r_[3.4e38, rng.uniform(-1, 1, 31)],
        ]
        return _rows(rows).reshape(2, -1)
    if dist == "multi":  # rows of seven blocks, each its own scale and offset
        x = rng.uniform(-1, 1, (6, 7 * 32)) * np.repeat(np.logspace(-4, 3, 7), 32)
        return (x + np.repeat(rng.normal(size=7) * 10, 32)).astype(_F32)
    if dist == "3d":
        return rng.standard_normal((2, 3, 64)).astype(_F32)
    raise KeyError(dist)


DISTS = ["normal", "outliers", "constant", "zeros", "signed_zeros", "negative", "positive", "ties"]
DISTS += ["near_ties", "tiny", "subnormal", "large", "multi", "3d"]


@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("type_name", TYPES)
def test_block_layouts_are_ggml_row_size(type_name: str) -> None:
    lib = ggml_oracle._lib()
    assert lib.ggml_row_size(ggml_oracle.TYPES[type_name], 32) == _LAYOUT[type_name][0]
    kinds = ref.KINDS if type_name == "Q5_0" else ref.OFFSET_KINDS
    assert kinds[type_name] == (32, 32)


@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("type_name", TYPES)
def test_codes_and_stored_scales_are_ggml(type_name: str, dist: str) -> None:
    x = _data(dist, type_name)
    raw = ggml_oracle.quantize(x, type_name)
    want_codes, want_d, want_m = _parse(raw, type_name)
    codes, d, m = _reference(x, type_name)
    blocks = x.shape[-1] // 32
    assert codes.shape == x.shape
    assert d.shape == (*x.shape[:-1], blocks)
    assert d.dtype == np.float32
    np.testing.assert_array_equal(_f16_bits(d), want_d)
    if want_m is not None:
        assert m is not None
        assert m.shape == d.shape
        assert m.dtype == np.float32
        np.testing.assert_array_equal(_f16_bits(m), want_m)
    if dist in _UNDEFINED and not _X86:
        pytest.skip("codes of blocks cast from inf or NaN are C-undefined; ggml_reference follows x86")
    diff = np.flatnonzero((codes.reshape(-1, 32) != want_codes).any(axis=1))
    assert diff.size == 0, f"{diff.size} of {want_codes.shape[0]} blocks differ, first {diff[:3]}"


@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("type_name", TYPES)
def test_ggml_dequantize_is_code_times_d_plus_m(type_name: str, dist: str) -> None:
    x = _data(dist, type_name)
    raw = ggml_oracle.quantize(x, type_name)
    want = ggml_oracle.dequantize(raw, type_name, x.shape)
    codes, d, m = _reference(x, type_name)
    scale = np.repeat(d, 32, axis=-1)
    with np.errstate(invalid="ignore"):  # 0 * inf where d is stored as inf
        if m is None:
            got = (codes.astype(_F32) - _F32(16)) * scale
        else:
            got = codes.astype(_F32) * scale + np.repeat(m, 32, axis=-1)  # product rounded, then the sum
    assert got.dtype == np.float32
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0.0 included


def _gguf_sign_of_zero_blocks(x: np.ndarray, type_name: str) -> np.ndarray:
    """Blocks where gguf-py may store another sign of zero than ggml (see the module docstring)."""
    b = x.reshape(-1, 32)
    zero = b == 0
    neg = zero & np.signbit(b)
    if type_name == "Q5_0":
        return zero.all(axis=1) & neg[:, 0]
    both = (neg.any(axis=1)) & ((zero & ~neg).any(axis=1))
    return (b.min(axis=1) == 0) & both


@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("type_name", TYPES)
def test_gguf_py_writes_ggml_bytes_but_for_signs_of_zero(type_name: str, dist: str) -> None:
    if dist in _UNDEFINED and not _X86:
        pytest.skip("codes cast from inf or NaN are C-undefined (and NumPy-undefined in gguf-py)")
    x = _data(dist, type_name)
    size = _LAYOUT[type_name][0]
    want = ggml_oracle.quantize(x, type_name).reshape(-1, size)
    with np.errstate(all="ignore"):  # gguf-py's own 1 / d overflows on the subnormal blocks
        got = gguf.quants.quantize(x, getattr(gguf.GGMLQuantizationType, type_name)).reshape(-1, size)
    odd = _gguf_sign_of_zero_blocks(x, type_name)
    rows = np.flatnonzero((got != want).any(axis=1) & ~odd)
    assert rows.size == 0, f"gguf-py differs from ggml in {rows.size} blocks, first {rows[:3]}"
    if type_name == "Q5_0":  # gguf-py: d = -0.0 / -16 = +0.0; ggml: d = 0.0f / -16 = -0.0
        assert (want[odd, :2] == [0x00, 0x80]).all()
        assert (got[odd, :2] == 0).all()
        assert (got[odd, 2:] == want[odd, 2:]).all()
    else:  # at most the sign bits of d (byte 1) and m (byte 3): NumPy picks which zero
        flip = got[odd] ^ want[odd]
        allowed = np.zeros(size, np.uint8)
        allowed[[1, 3]] = 0x80
        assert not (flip & ~allowed).any()


@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("type_name", ["Q4_1", "Q5_1"])
def test_offset_minimum_keeps_the_first_zero_sign_as_ggml(type_name: str) -> None:
    x = np.abs(np.linspace(-1, 2, 64, dtype=_F32)).reshape(2, 32)
    x[0, [3, 20]] = [0.0, -0.0]  # +0.0 first: m = +0.0
    x[1, [3, 20]] = [-0.0, 0.0]  # -0.0 first: m = -0.0
    m = ref.quantize_offset_blocks(x, type_name)[2]
    assert np.signbit(m[:, 0]).tolist() == [False, True]
    assert _f16_bits(m).tolist() == _parse(ggml_oracle.quantize(x, type_name), type_name)[2].tolist()


def test_host_entry_points_take_any_backend_and_refuse_non_finite() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 96))
    for kind in ("Q4_1", "Q5_1"):
        want = ref.quantize_offset_blocks(x.astype(_F32), kind)
        for got, w in zip(ref.quantize_offset_host(x, kind), want, strict=True):  # float64 in
            np.testing.assert_array_equal(got, w)
    np.testing.assert_array_equal(ref.quantize_host(x, "Q5_0")[0], ref.quantize_blocks(x.astype(_F32), "Q5_0")[0])
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x.astype(_F32))
    for got, w in zip(
        ref.quantize_offset_host(t, "Q4_1"), ref.quantize_offset_blocks(x.astype(_F32), "Q4_1"), strict=True
    ):
        np.testing.assert_array_equal(got, w)
    bad = x.copy()
    bad[1, 5] = np.inf
    with pytest.raises(NonFiniteInputError):
        ref.quantize_offset_host(bad, "Q5_1")
    bad[1, 5] = 1e39  # finite in f64, infinite in f32
    with pytest.raises(NonFiniteInputError):
        ref.quantize_offset_host(bad, "Q4_1")
