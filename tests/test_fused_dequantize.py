"""The fused (Numba) dequantize kernel against the portable path, bit for bit.

The reference is ``aq.dequantize(qt)`` of f32 data with ``ARRAYQUANT_FUSED=0``; the fused result
must hold the same f32 bits (NaN payloads and -0 included). Quantized tensors come from
``aq.quantize`` (real data) and from random codes packed with ``aq.pack`` under random stored scales
(every code, NaN and infinity codes of the minifloats included).
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba (pip install numba)")

import arrayquant as aq
from arrayquant.fused import numba_dequantize as nd
from arrayquant.invariants import plan_for
from arrayquant.kernels.minifloat import decode_table
from arrayquant.scheme import QuantValue

F32_MAX = float(np.finfo(np.float32).max)

INTS = ["q8s", "q8f", "q4s", "q4f", "q2s", "q2f"]
FLOATS = ["e4m3", "e5m2", "e2m1"]
SCALE_DTYPES = ["f32", "f16", "bf16", "ue4m3", "ue8m0"]
STORES = ["", ":native", ":packed_native"]


def _valid(text: str) -> bool:
    try:
        plan_for(aq.QuantScheme.parse(text))
    except aq.SchemeError:
        return False
    return True


def _all_schemes() -> list[str]:
    """Every value x per tensor / 1-D block x scale dtype x store that is a valid scheme, plus two-level ones."""
    out = []
    for v, blk, st in itertools.product(INTS + FLOATS, ["", ":block32", ":block16", ":block7"], STORES):
        for sd in [""] if not blk else [":" + d for d in SCALE_DTYPES]:
            out.append(v + blk + sd + st)
    for v, blk, sd, st in itertools.product(INTS + FLOATS, [":block16", ":block7"], [":ue4m3", ":f16"], STORES):
        out.append(v + blk + sd + ":tensor:f32" + st)
    return [t for t in [*out, "mxfp8", "mxfp4", "nvfp4"] if _valid(t)]


ALL = _all_schemes()
# the default run: each value, store, scale dtype and level at least once, partial blocks included
QUICK = [
    "q8s",
    "q8s:native",
    "q8f:block32:f16",
    "q8s:block32:f16:native",
    "q4s:block32:f16",
    "q4f:block7:bf16",
    "q4s:block16:ue4m3:native",
    "q2s:block7:ue8m0",
    "q2f",
    "q2s:block16:f32:native",
    "q4s:block16:ue4m3:tensor:f32",
    "q8s:block7:f16:tensor:f32:native",
    "e4m3",
    "e4m3:block32:ue8m0:native",
    "e5m2:block16:bf16",
    "e5m2:block7:f16:tensor:f32:native",
    "e2m1",
    "e2m1:block7:f32:native",
    "e2m1:block16:ue4m3:packed_native",
    "mxfp8",
    "mxfp4",
    "nvfp4",
]
SHAPES = [(45,), (3, 37), (2, 3, 21), (4, 64)]


def _data(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "heavy":
        x = rng.standard_t(1.5, n) * 10.0
    elif kind == "zeros":
        x = np.zeros(n)
        x[::5] = rng.standard_normal(x[::5].shape)  # whole zero blocks and rows among data
        x[: n // 2] = 0.0
    elif kind == "huge":
        x = rng.uniform(-1.0, 1.0, n) * F32_MAX
        x[::3] = np.sign(x[::3]) * F32_MAX
    elif kind == "tiny":
        x = rng.standard_normal(n) * 2.0**-140  # subnormal data: tiny stored scales
    else:
        raise AssertionError(kind)
    return x.astype(np.float32).reshape(shape)


def _portable(qt: aq.QuantizedTensor, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        y = aq.dequantize(qt, "float32")
    assert y.dtype == np.float32
    return np.asarray(y)


def _quantized(x: np.ndarray, text: str, monkeypatch: pytest.MonkeyPatch) -> aq.QuantizedTensor:
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        return aq.quantize(x, text)


def _fused(qt: aq.QuantizedTensor) -> np.ndarray | None:
    plan = plan_for(qt.scheme)
    gs = None if qt.global_scale is None else np.asarray(qt.global_scale)
    return nd.dequantize(np.asarray(qt.values), np.asarray(qt.scales), gs, plan, tuple(qt.shape))


def _same_bits(got: np.ndarray | None, want: np.ndarray) -> None:
    assert got is not None
    assert got.dtype == np.float32
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _check(x: np.ndarray, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    qt = _quantized(x, text, monkeypatch)
    _same_bits(_fused(qt), _portable(qt, monkeypatch))


@pytest.mark.parametrize("text", QUICK)
@pytest.mark.parametrize("shape", SHAPES)
def test_quantized_data_matches_portable(text: str, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    for i, kind in enumerate(["normal", "heavy", "zeros"]):
        _check(_data(kind, shape, i), text, monkeypatch)


@pytest.mark.parametrize("text", QUICK)
@pytest.mark.parametrize("kind", ["huge", "tiny"])
def test_extreme_data_matches_portable(text: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data at the top of f32 (scales whose products the portable path clips) and subnormal data."""
    _check(_data(kind, (3, 37), 7), text, monkeypatch)


def _random_scales(plan_text: str, grid: tuple[int, ...], rng: np.random.Generator, top: float) -> np.ndarray:
    """Random stored scales, some zero, on the scheme's scale dtype where it has a NumPy form."""
    s = np.exp2(rng.uniform(-20.0, np.log2(top), grid)).astype(np.float32)
    s.reshape(-1)[::4] = 0.0
    sd = plan_for(aq.QuantScheme.parse(plan_text)).scale_dtype.name.lower()
    np_dtype = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "ue4m3": ml_dtypes.float8_e4m3fn}.get(sd)
    if np_dtype is not None:
        s = np.minimum(s, 448.0 if sd == "ue4m3" else s).astype(np_dtype).astype(np.float32)
    return s


def _random_tensor(text: str, shape: tuple[int, ...], seed: int, top: float = 1e3) -> aq.QuantizedTensor:
    """Random codes over the whole field (every bit pattern) under random stored scales."""
    scheme = aq.QuantScheme.parse(text)
    plan = plan_for(scheme)
    rng = np.random.default_rng(seed)
    if plan.value.is_float:
        codes = rng.integers(0, 1 << plan.bits, shape).astype(np.uint8)
    elif plan.packed_axis(len(shape)) is None:
        codes = rng.integers(-128, 128, shape).astype(np.int8)  # native int8: any byte decodes as itself
    else:
        codes = rng.integers(plan.qmin, plan.qmax + 1, shape).astype(np.int8)
    values = aq.pack(codes, scheme)
    scales = _random_scales(text, plan.grid_shape(shape), rng, top)
    glob = np.asarray([rng.uniform(0.5, 3.0) * 2.0**-9], np.float32) if plan.two_level else None
    return aq.QuantizedTensor(scheme, shape, np.float32, values, scales, glob)


@pytest.mark.parametrize("text", QUICK)
def test_random_codes_match_portable(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for seed, shape in enumerate(SHAPES):
        qt = _random_tensor(text, shape, seed)
        _same_bits(_fused(qt), _portable(qt, monkeypatch))


@pytest.mark.parametrize("text", ["e4m3", "e5m2:block16:f16:native", "e2m1:block7:bf16", "nvfp4", "mxfp8"])
def test_every_minifloat_code_matches_portable(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each code (NaN, infinity, -0 included) in every position of a word, under scales 0, 1 and others."""
    scheme = aq.QuantScheme.parse(text)
    plan = plan_for(scheme)
    n = 1 << plan.bits
    codes = np.tile(np.arange(n, dtype=np.uint8), (3, 3))[:, : 3 * n - 1]  # each code at several offsets
    shape = codes.shape
    scales = np.ones(plan.grid_shape(shape), np.float32)
    scales.reshape(-1)[1::3] = 0.0
    scales.reshape(-1)[2::3] = 0.375
    glob = np.asarray([0.5], np.float32) if plan.two_level else None
    qt = aq.QuantizedTensor(scheme, shape, np.float32, aq.pack(codes, scheme), scales, glob)
    want = _portable(qt, monkeypatch)
    assert np.isnan(want).any() or plan.value is QuantValue.E2M1  # the NaN codes are reached
    assert (want.view(np.uint32) == 0x80000000).any()  # and -0
    _same_bits(_fused(qt), want)


@pytest.mark.parametrize("text", ["q8s:native", "q8f", "q4s:block16:f32", "q2f:block7:f32:native", "e4m3:block7:f32"])
def test_overflowing_products_saturate_as_portable(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored scales near the f32 maximum: products past it clip to ±F32_MAX in both paths."""
    qt = _random_tensor(text, (3, 37), 11, top=F32_MAX / 2)
    qt = aq.QuantizedTensor(qt.scheme, qt.shape, np.float32, qt.values, np.maximum(qt.scales, F32_MAX / 4), None)
    want = _portable(qt, monkeypatch)
    assert (np.abs(want) == np.float32(F32_MAX)).any()  # the clip is reached
    _same_bits(_fused(qt), want)


def test_two_level_effective_scale_saturates(monkeypatch: pytest.MonkeyPatch) -> None:
    """``min(g * stored, F32_MAX)``: a global times a block scale past the f32 maximum."""
    scheme = aq.QuantScheme.parse("q2s:block16:f16:tensor:f32")
    codes = np.random.default_rng(3).integers(-2, 2, (2, 40)).astype(np.int8)
    scales = np.asarray([[65504.0, 1.0, 2.0], [0.0, 65504.0, 0.5]], np.float32)
    qt = aq.QuantizedTensor(
        scheme, codes.shape, np.float32, aq.pack(codes, scheme), scales, np.asarray([F32_MAX / 2], np.float32)
    )
    want = _portable(qt, monkeypatch)
    assert (np.abs(want) == np.float32(F32_MAX)).any()
    _same_bits(_fused(qt), want)


def test_e5m2_infinity_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """E5M2 infinity stays inf under small scales; huge per-tensor scales saturate it as the portable
    path does; huge block scales (where the portable clip depends on its row chunks) are declined."""
    inf_code = np.uint8(0x7C)
    codes = np.full((4, 20), 0x3C, np.uint8)
    codes[1, 3] = inf_code
    codes[2, 5] = inf_code | 0x80
    small = aq.QuantizedTensor(
        aq.QuantScheme.parse("e5m2:block16:f32:native"),
        codes.shape,
        np.float32,
        codes,
        np.full((4, 2), 2.0, np.float32),
    )
    got = _fused(small)
    assert got is not None
    assert np.isposinf(got[1, 3])
    assert np.isneginf(got[2, 5])
    _same_bits(got, _portable(small, monkeypatch))
    per_tensor = aq.QuantizedTensor(
        aq.QuantScheme.parse("e5m2:native"), codes.shape, np.float32, codes, np.asarray([1e36], np.float32)
    )
    got = _fused(per_tensor)
    assert got is not None
    assert got[1, 3] == np.float32(F32_MAX)
    _same_bits(got, _portable(per_tensor, monkeypatch))
    huge = aq.QuantizedTensor(small.scheme, codes.shape, np.float32, codes, np.full((4, 2), 1e36, np.float32))
    assert _fused(huge) is None
    finite = aq.QuantizedTensor(small.scheme, codes.shape, np.float32, np.full((4, 20), 0x7B, np.uint8), huge.scales)
    _same_bits(_fused(finite), _portable(finite, monkeypatch))  # no infinity code: covered, clipped


def test_native_values_out_of_range_as_portable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Native stores are read as the portable path reads them: an int8 as is, an E2M1 byte's low nibble."""
    q = aq.QuantizedTensor(
        aq.QuantScheme.parse("q2s:native"),
        (256,),
        np.float32,
        np.arange(-128, 128, dtype=np.int8),
        np.asarray([0.5], np.float32),
    )
    got = _fused(q)
    assert got is not None
    assert got[0] == -64.0
    assert got[-1] == 63.5
    _same_bits(got, _portable(q, monkeypatch))
    e = aq.QuantizedTensor(
        aq.QuantScheme.parse("e2m1:native"),
        (256,),
        np.float32,
        np.arange(256, dtype=np.uint8),
        np.asarray([1.0], np.float32),
    )
    got = _fused(e)
    assert got is not None
    assert got[0x16] == 4.0  # 0x16: the field 0x6 (E2M1 4.0), high nibble ignored
    _same_bits(got, _portable(e, monkeypatch))


def test_non_contiguous_and_big_endian_values(monkeypatch: pytest.MonkeyPatch) -> None:
    qt = _quantized(_data("normal", (6, 40), 5), "q4s:block16:f16", monkeypatch)
    want = _portable(qt, monkeypatch)
    plan = plan_for(qt.scheme)
    fortran = np.asfortranarray(qt.values)
    _same_bits(nd.dequantize(fortran, np.asfortranarray(qt.scales), None, plan, qt.shape), want)
    big = qt.values.astype(">u4")
    _same_bits(nd.dequantize(big, qt.scales, None, plan, qt.shape), want)
    strided = np.repeat(qt.values, 2, axis=0)[::2]
    assert not strided.flags.c_contiguous
    _same_bits(nd.dequantize(strided, qt.scales, None, plan, qt.shape), want)


def test_declines_what_it_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    qt = _quantized(_data("normal", (4, 32), 1), "q4s:block16:f16", monkeypatch)
    plan = plan_for(qt.scheme)
    assert nd.dequantize(qt.values.astype(np.int32), qt.scales, None, plan, qt.shape) is None  # wrong dtype
    assert nd.dequantize(qt.values[:2], qt.scales, None, plan, qt.shape) is None  # wrong shape
    assert nd.dequantize(qt.values, qt.scales[:2], None, plan, qt.shape) is None  # wrong scale grid
    assert nd.dequantize(qt.values, qt.scales, np.ones(1, np.float32), plan, qt.shape) is None  # stray global
    assert nd.dequantize(list(qt.values), qt.scales, None, plan, qt.shape) is None  # type: ignore[arg-type]
    two = plan_for(aq.QuantScheme.parse("nvfp4"))
    q2 = _quantized(_data("normal", (4, 32), 1), "nvfp4", monkeypatch)
    assert nd.dequantize(q2.values, q2.scales, None, two, q2.shape) is None  # missing global
    lookup = plan_for(aq.QuantScheme.parse("q4f:lookup"))
    assert nd.dequantize(qt.values, qt.scales, None, lookup, qt.shape) is None


def test_supports_reasons() -> None:
    def why(text: str, shape: tuple[int, ...]) -> str:
        return nd.supports(plan_for(aq.QuantScheme.parse(text)), shape)

    assert why("q4s:block32:f16", (4, 64)) == ""
    assert why("nvfp4", (3, 5, 16)) == ""
    assert why("q8s:native", (7,)) == ""
    assert why("q4f:lookup", (4, 64)) == "lookup mode is not fused"
    assert why("q4s:block4x32:f16", (8, 64)) == "blocks spanning more than the last axis are not fused"
    assert why("q4s:packed_u32:1", (8, 64)) == "packing along an axis other than the last is not fused"
    assert why("q4s:packed_u32:1", (8, 1, 64)) == "packing along an axis other than the last is not fused"
    assert why("q8s", ()) == "0-d data is not fused"
    # a block of several rows is a 1-d block once clamped to a single-row tensor
    assert why("q4s:block4x32:f16", (1, 64)) == ""


@pytest.mark.parametrize("value", [QuantValue.E4M3, QuantValue.E5M2, QuantValue.E2M1])
def test_decode_minifloat_every_code(value: QuantValue) -> None:
    table = np.asarray(decode_table(value), np.float32)
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    got = nd.decode_minifloat(codes, value)
    assert got.dtype == np.float32
    assert got.shape == (16, 16)
    want = table[np.arange(256) & (table.size - 1)].reshape(16, 16)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # an independent oracle where ml_dtypes has the format (its NaN bits may differ: compare as values)
    ref = {
        QuantValue.E4M3: ml_dtypes.float8_e4m3fn,
        QuantValue.E5M2: ml_dtypes.float8_e5m2,
        QuantValue.E2M1: ml_dtypes.float4_e2m1fn,
    }[value]
    bits = np.arange(1 << value.bits, dtype=np.uint8)
    oracle = (
        bits.view(ref).astype(np.float32)
        if value is not QuantValue.E2M1
        else np.asarray([float(ml_dtypes.float4_e2m1fn(v)) for v in table[:16]], np.float32)
    )
    np.testing.assert_array_equal(got.reshape(-1)[: 1 << value.bits], oracle)


def test_result_is_independent_of_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    qt = _random_tensor("q4s:block32:f16", (64, 96), 2)
    from arrayquant.fused import threads

    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)  # small data on every thread too
    monkeypatch.setenv("ARRAYQUANT_THREADS", "1")
    one = _fused(qt)
    monkeypatch.setenv("ARRAYQUANT_THREADS", "2")
    two = _fused(qt)
    assert one is not None
    assert two is not None
    np.testing.assert_array_equal(one.view(np.uint32), two.view(np.uint32))
    _same_bits(one, _portable(qt, monkeypatch))


@pytest.mark.slow
@pytest.mark.parametrize("text", ALL)
def test_sweep_all_schemes(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for i, (kind, shape) in enumerate(
        itertools.product(["normal", "heavy", "zeros", "huge", "tiny"], [*SHAPES, (1, 200)])
    ):
        _check(_data(kind, shape, i), text, monkeypatch)
    for seed, shape in enumerate([*SHAPES, (3, 130)]):
        qt = _random_tensor(text, shape, seed)
        _same_bits(_fused(qt), _portable(qt, monkeypatch))
