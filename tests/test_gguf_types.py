"""GGUF block types <-> arrayquant tensors, bit for bit, against the real gguf-py.

Oracles: ``gguf.quants.quantize`` / ``gguf.quants.dequantize`` (gguf-py, maintained in llama.cpp),
and for NVFP4 (which gguf-py only dequantizes) blocks built here from the type's definition with
values from ml_dtypes' float8_e4m3fn / float4_e2m1fn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import QuantizationError
from arrayquant.io.gguf import types as gt

gguf = pytest.importorskip("gguf")
ml_dtypes = pytest.importorskip("ml_dtypes")
T = gguf.GGMLQuantizationType

SHAPES = [(3, 512), (2, 2, 768), (1024,)]
DISTS = ["normal", "heavy", "zeros", "negmax"]


def bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a), dtype=np.float32).view(np.uint32)


def data(dist: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if dist == "heavy":
        x = rng.standard_t(1.2, size=shape).astype(np.float32)
    elif dist == "zeros":
        x[..., :256] = 0  # a whole zero block in every row, for every block size
    elif dist == "negmax":
        x[..., :256] = -np.abs(x[..., :256]) - 0.25  # blocks whose largest magnitude is negative
    return x


def gguf_raw(x: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.quantize(x, T[name])


def gguf_values(raw: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, T[name])


def neg_extremes(x: np.ndarray, block: int = 32) -> np.ndarray:
    """Every block's largest magnitude made negative: gguf-py's Q4_0 then has d > 0."""
    b = x.reshape(-1, block).copy()
    i = np.abs(b).argmax(axis=1)
    b[np.arange(len(b)), i] = -np.abs(b[np.arange(len(b)), i]) - 0.5
    return b.reshape(x.shape)


def f16(v: float) -> np.ndarray:
    return np.array([v], "<f2").view(np.uint8)


# -- (a) bytes gguf-py writes -> decode -> aq.dequantize == gguf dequantize, bit for bit -----------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("name", ["Q8_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4"])
def test_gguf_written_reads_bit_for_bit(name: str, dist: str, shape: tuple[int, ...]) -> None:
    x = data(dist, shape)
    raw = gguf_raw(x, name)
    qt, why = gt.decode(raw, name, shape, backend="numpy")
    assert why == ""
    assert qt is not None
    assert qt.scheme == gt.scheme_of(name)
    assert qt.shape == shape
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, name)))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dist", ["normal", "heavy", "negmax"])
def test_gguf_q4_0_with_negative_extremes_reads_bit_for_bit(dist: str, shape: tuple[int, ...]) -> None:
    x = neg_extremes(data(dist, shape))
    raw = gguf_raw(x, "Q4_0")
    qt, why = gt.decode(raw, "Q4_0", shape, backend="numpy")
    assert why == ""
    assert qt is not None
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, "Q4_0")))


def test_gguf_q4_0_as_llama_cpp_writes_it_reads_exactly() -> None:
    # gguf-py (as llama.cpp) picks d = max / -8: a block whose extreme is positive has d < 0, q = 0
    x = np.empty((2, 64), np.float32)
    x[0, :32] = -np.linspace(0.1, 1, 32, dtype=np.float32)  # blocks 0-2: extreme negative, d > 0
    x[0, 32:] = -1.0
    x[1, :32] = -0.5
    x[1, 32:] = np.linspace(-1, 2, 32, dtype=np.float32)  # block 3: extreme +2, d = -0.25
    raw = gguf_raw(x, "Q4_0")
    qt, why = gt.decode(raw, "Q4_0", (2, 64), backend="numpy")
    assert why == ""
    assert qt is not None
    assert qt.scales.tolist() == [[0.125, 0.125], [0.0625, -0.25]]  # the f16 d of each block, sign kept
    assert int(np.asarray(qt.codes())[1, 62]) == -8  # q = 0: (0 - 8) * -0.25 = +2
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, "Q4_0")))


def test_gguf_q4_0_zero_block_is_negative_zero() -> None:
    # gguf-py's all-zero Q4_0 block: d = 0 / -8 = -0.0 and q = 8, so every value is -0.0
    raw = gguf_raw(np.zeros((1, 32), np.float32), "Q4_0")
    assert np.signbit(gguf_values(raw, "Q4_0")).all()
    qt, why = gt.decode(raw, "Q4_0", (1, 32), backend="numpy")
    assert why == ""
    assert qt is not None
    assert np.signbit(aq.dequantize(qt)).all()


@pytest.mark.parametrize("dist", DISTS)
def test_gguf_q4_0_normal_weights_read_exactly(dist: str) -> None:
    x = data(dist, (3, 512))
    raw = gguf_raw(x, "Q4_0")
    qt, why = gt.decode(raw, "Q4_0", (3, 512), backend="numpy")
    assert why == ""
    assert qt is not None
    assert (qt.scales < 0).any()  # about half the blocks, as llama.cpp writes them
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, "Q4_0")))


# -- (b) aq.quantize -> encode -> gguf dequantize == aq.dequantize; decode(encode(qt)) exact ------
ROUND_TRIP = [
    ("q8f:block32:f16", "Q8_0"),
    ("q8f:block32:f16:native", "Q8_0"),
    ("q4f:block32:f16", "Q4_0"),
    ("u4:block32:f16:offset", "Q4_1"),
    ("u4:block32:f16:native:offset", "Q4_1"),
    ("u4:block32:f16:packed_native:offset", "Q4_1"),
    ("q5f:block32:f16", "Q5_0"),
    ("q5f:block32:f16:native", "Q5_0"),
    ("q5f:block32:f16:packed_native", "Q5_0"),
    ("u5:block32:f16:offset", "Q5_1"),
    ("u5:block32:f16:native:offset", "Q5_1"),
    ("u5:block32:f16:packed_native:offset", "Q5_1"),
    ("q2s:block256:f16", "TQ2_0"),
    ("q2s:block256:f16:native", "TQ2_0"),
    ("mxfp4", "MXFP4"),
    ("e2m1:block32:ue8m0:packed_native:ocp", "MXFP4"),
    ("e2m1:block16:ue4m3:packed_native", "NVFP4"),
    ("e2m1:block16:ue4m3", "NVFP4"),
]


def check_encoded(qt: aq.QuantizedTensor, name: str, raw: np.ndarray) -> None:
    """gguf-py's values of ``raw`` against aq.dequantize(qt); decode(raw) against qt's codes and scales."""
    want = np.asarray(aq.dequantize(qt))
    got = gguf_values(raw, name)
    codes = np.asarray(qt.codes())
    fp4 = name in ("MXFP4", "NVFP4")
    same = bits(got) == bits(want)
    if fp4:
        # GGUF's E2M1 table has no -0: arrayquant's code 8 (-0.0) reads back as +0.0, nothing else differs
        np.testing.assert_array_equal(~same, codes == 8)
        assert np.signbit(want[codes == 8]).all()
        assert not np.signbit(got[codes == 8]).any()
        assert (got[codes == 8] == 0).all()
    else:
        assert same.all()
    back, why = gt.decode(raw, name, qt.shape, backend="numpy")
    assert why == ""
    assert back is not None
    expect_codes = np.where(codes == 8, 0, codes) if fp4 else codes
    np.testing.assert_array_equal(np.asarray(back.codes()), expect_codes)
    np.testing.assert_array_equal(bits(back.scales), bits(qt.scales))
    assert (back.offset is None) == (qt.offset is None)
    if qt.offset is not None:  # Q4_1 / Q5_1: the offsets m, bit for bit
        np.testing.assert_array_equal(bits(back.offset), bits(qt.offset))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize(("scheme", "name"), ROUND_TRIP)
def test_arrayquant_written_reads_in_gguf(scheme: str, name: str, dist: str, shape: tuple[int, ...]) -> None:
    qt = aq.quantize(data(dist, shape, seed=3), scheme)
    assert gt.type_of(qt.scheme) == name
    kind, raw = gt.encode(qt)
    assert kind == name
    assert raw.dtype == np.uint8
    block, size = gguf.GGML_QUANT_SIZES[T[name]]
    assert raw.shape == (*shape[:-1], shape[-1] // block * size)
    check_encoded(qt, name, raw)


@pytest.mark.parametrize("shape", SHAPES)
def test_tq1_0_on_request(shape: tuple[int, ...]) -> None:
    qt = aq.quantize(data("heavy", shape, seed=5), "q2s:block256:f16")
    kind, raw = gt.encode(qt, "tq1_0")
    assert kind == "TQ1_0"
    check_encoded(qt, "TQ1_0", raw)
    # bytes as llama.cpp's reference quantizer lays them out: gguf-py re-quantizing the values
    np.testing.assert_array_equal(raw, gguf_raw(np.asarray(aq.dequantize(qt)), "TQ1_0"))


@pytest.mark.parametrize(("scheme", "name"), [("q8f:block32:f16", "Q8_0"), ("q2s:block256:f16", "TQ2_0")])
def test_encoded_bytes_are_gguf_layout(scheme: str, name: str) -> None:
    # every block has a code at the scale's edge, so gguf-py re-derives the same d and codes
    qt = aq.quantize(data("normal", (2, 2, 512), seed=9), scheme)
    np.testing.assert_array_equal(gt.encode(qt)[1], gguf_raw(np.asarray(aq.dequantize(qt)), name))


def test_q8_0_holds_code_minus_128() -> None:
    codes = np.arange(-128, -96, dtype=np.int8).reshape(1, 32)
    scheme = aq.QuantScheme.parse("q8f:block32:f16:native")
    qt = aq.QuantizedTensor(scheme, (1, 32), np.float32, codes, np.array([[0.5]], np.float32))
    kind, raw = gt.encode(qt)
    assert raw[0, 2] == 0x80
    np.testing.assert_array_equal(gguf_values(raw, kind), codes.astype(np.float32) * 0.5)
    check_encoded(qt, kind, raw)


def test_all_tq1_0_digit_patterns() -> None:
    # all 3^5 = 243 digit patterns of one byte, through llama.cpp's base-3 packing and back
    digits = np.array(np.unravel_index(np.arange(243), (3,) * 5)).T  # (243, 5), most significant first
    codes = np.zeros((243, 256), np.int8)
    for k in range(5):  # elements k * 32 + 0 of each block: the first qs byte's five digits
        codes[:, k * 32] = digits[:, k] - 1
    codes[:, 1] = 1  # d is max|x|: keep one code at the edge
    scheme = aq.QuantScheme.parse("q2s:block256:f16:native")
    qt = aq.QuantizedTensor(scheme, (243, 256), np.float32, codes, np.full((243, 1), 1.5, np.float32))
    kind, raw = gt.encode(qt, "TQ1_0")
    check_encoded(qt, kind, raw)


# -- NVFP4: gguf-py dequantizes only; blocks built from the definition -------------------------
E2M1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def nvfp4_block(scales: list[int], nibbles: np.ndarray) -> np.ndarray:
    """One NVFP4 super-block: 4 scale bytes, then sub-block s in bytes 8s..8s+7, j low, j + 8 high."""
    out = bytearray(scales)
    for s in range(4):
        sub = nibbles[16 * s : 16 * s + 16]
        out += bytes(int(sub[j]) | (int(sub[j + 8]) << 4) for j in range(8))
    return np.frombuffer(bytes(out), np.uint8)


def nvfp4_expected(scales: list[int], nibbles: np.ndarray) -> np.ndarray:
    sc = np.array(scales, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    vals = np.where(nibbles == 8, np.float32(0), E2M1[nibbles])  # GGUF's table: nibble 8 is +0
    return (np.repeat(sc, 16) * vals).astype(np.float32)


@pytest.mark.parametrize("rows", [1, 3])
def test_nvfp4_blocks_from_the_definition(rows: int) -> None:
    rng = np.random.default_rng(11)
    raws, wants = [], []
    for _ in range(rows * 3):  # three super-blocks a row: 192 columns
        scales = [int(v) for v in rng.integers(0, 0x7F, 4)]
        nibbles = rng.integers(0, 16, 64).astype(np.uint8)
        raws.append(nvfp4_block(scales, nibbles))
        wants.append(nvfp4_expected(scales, nibbles))
    raw = np.concatenate(raws).reshape(rows, 3 * 36)
    want = np.concatenate(wants).reshape(rows, 192)
    np.testing.assert_array_equal(bits(gguf_values(raw, "NVFP4")), bits(want))  # gguf-py reads it so
    qt, why = gt.decode(raw, "NVFP4", (rows, 192), backend="numpy")
    assert why == ""
    assert qt is not None
    assert qt.scheme == aq.QuantScheme.parse("e2m1:block16:ue4m3:packed_native")
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(want))
    kind, again = gt.encode(qt)
    assert kind == "NVFP4"
    np.testing.assert_array_equal(bits(gguf_values(again, "NVFP4")), bits(want))


def test_nvfp4_scale_bytes_ggml_reads_specially() -> None:
    # 0x7F (E4M3 NaN) reads as 0; bit 7 is ignored (0xB8 reads as 0x38 = 1.0); 0x80 reads as 0
    nibbles = np.tile(np.arange(16, dtype=np.uint8), 4)
    raw = nvfp4_block([0x7F, 0xB8, 0x80, 0x40], nibbles)
    qt, why = gt.decode(raw, "NVFP4", (64,), backend="numpy")
    assert why == ""
    assert qt is not None
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, "NVFP4")))
    np.testing.assert_array_equal(qt.scales, np.array([0.0, 1.0, 0.0, 2.0], np.float32))


def test_fp4_nibble_8_reads_as_positive_zero() -> None:
    raw = np.concatenate([[127], np.full(16, 0x88, np.uint8)]).astype(np.uint8)  # MXFP4, e = 127: scale 1
    qt, why = gt.decode(raw, "MXFP4", (32,), backend="numpy")
    assert qt is not None
    assert why == ""
    assert (np.asarray(qt.codes()) == 0).all()
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, "MXFP4")))
    assert not np.signbit(gguf_values(raw, "MXFP4")).any()


# -- NVFP4 two-level: fold where exact, else refuse; or the llama.cpp sidecar scale -------------
def two_level(g: float, seed: int = 4) -> tuple[aq.QuantizedTensor, aq.QuantizedTensor]:
    """A single-level tensor and the two-level one with the same values, block scales / g."""
    one = aq.quantize(data("normal", (2, 128), seed=seed), "e2m1:block16:ue4m3:packed_native")
    scales = (np.asarray(one.scales) / np.float32(g)).astype(np.float32)
    two = aq.QuantizedTensor(
        aq.QuantScheme.nvfp4(), one.shape, np.float32, one.values, scales, np.array([g], np.float32)
    )
    return one, two


def test_nvfp4_power_of_two_global_folds_exactly() -> None:
    one, two = two_level(0.25)
    np.testing.assert_array_equal(bits(aq.dequantize(two)), bits(aq.dequantize(one)))
    kind, raw = gt.encode(two)
    assert kind == "NVFP4"
    np.testing.assert_array_equal(raw, gt.encode(one)[1])  # the folded block scales are one's
    check_encoded(one, kind, raw)  # gguf-py's values are aq's (same as two's); decode gives one's scales


def test_nvfp4_global_that_does_not_fold_is_refused() -> None:
    two = aq.quantize(data("normal", (2, 128)), "nvfp4")
    g = float(np.asarray(two.global_scale)[0])
    s0 = float(np.asarray(two.scales).reshape(-1)[0])
    with pytest.raises(aq.SchemeError) as err:
        gt.encode(two)
    assert str(err.value) == (
        f"nvfp4 tensor's per-tensor scale {g!r} cannot be folded into GGUF NVFP4's UE4M3 block scales exactly: "
        f"block scale {s0!r} at flat index 0 times it is {s0 * g!r}, not a UE4M3 value. GGUF NVFP4 blocks have "
        "no per-tensor level; llama.cpp stores it as a separate F32 tensor '<name>.scale' (multiplied in with "
        "ggml_mul): use encode_split(qt) for that pair, or quantize to e2m1:block16:ue4m3 (single level)"
    )


def test_nvfp4_split_global_round_trips() -> None:
    two = aq.quantize(data("heavy", (3, 256)), "nvfp4")
    kind, raw, g = gt.encode_split(two)
    assert kind == "NVFP4"
    assert g is not None
    np.testing.assert_array_equal(bits(g), bits(two.global_scale))
    # aq's values are f32(g * s) * v; the blocks alone (gguf-py) are s * v, nibble 8 read as +0
    codes = np.asarray(two.codes())
    eff = (np.asarray(two.scales) * g[0]).astype(np.float32)
    np.testing.assert_array_equal(bits(aq.dequantize(two)), bits(np.repeat(eff, 16, axis=-1) * E2M1[codes]))
    plain = np.where(codes == 8, np.float32(0), E2M1[codes])
    np.testing.assert_array_equal(
        bits(gguf_values(raw, "NVFP4")), bits(np.repeat(np.asarray(two.scales), 16, axis=-1) * plain)
    )
    back, why = gt.decode(raw, "NVFP4", (3, 256), backend="numpy", global_scale=g)
    assert why == ""
    assert back is not None
    assert back.scheme == aq.QuantScheme.nvfp4()
    np.testing.assert_array_equal(np.asarray(back.codes()), np.where(codes == 8, 0, codes))
    np.testing.assert_array_equal(bits(back.scales), bits(two.scales))
    np.testing.assert_array_equal(bits(back.global_scale), bits(two.global_scale))
    assert gt.encode_split(aq.quantize(data("normal", (1, 64)), "mxfp4"))[2] is None


# -- (c) bytes that are not exact: (None, reason) ----------------------------------------------
def q8_block(d: float, q: list[int]) -> np.ndarray:
    return np.concatenate([f16(d), np.array(q, np.int8).view(np.uint8)])


def q4_block(d: float, q: list[int]) -> np.ndarray:
    n = np.array(q, np.uint8)
    return np.concatenate([f16(d), n[:16] | (n[16:] << 4)])


def tq2_block(d: float, q: np.ndarray) -> np.ndarray:
    t = q.astype(np.uint8).reshape(2, 4, 32)
    packed = t[:, 0] | (t[:, 1] << 2) | (t[:, 2] << 4) | (t[:, 3] << 6)
    return np.concatenate([packed.reshape(64), f16(d)])


def test_q8_0_negative_d_keeps_its_sign() -> None:
    q = [-128, 0] + list(range(-127, -97))  # -128 and 0 too: code * d is ggml's value, -0.0 included
    raw = q8_block(-0.75, q)
    qt, why = gt.decode(raw, "Q8_0", (32,), backend="numpy")
    assert why == ""
    assert qt is not None
    np.testing.assert_array_equal(np.asarray(qt.codes()), q)
    np.testing.assert_array_equal(qt.scales, [-0.75])
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, "Q8_0")))


@pytest.mark.parametrize(
    ("d", "why"),
    [
        (float("inf"), "has d = inf; arrayquant scales are finite"),
        (float("nan"), "has d = nan; arrayquant scales are finite"),
    ],
)
def test_q8_0_not_exact(d: float, why: str) -> None:
    good = q8_block(1.0, [1] * 32)
    raw = np.concatenate([good, good, good, q8_block(d, [1] * 32)])
    assert gt.decode(raw, "Q8_0", (2, 64)) == (None, f"Q8_0 block 3 (row (1,), block 1 of the row) {why}")


@pytest.mark.parametrize("q8", [False, True])
def test_q4_0_negative_d_exact(q8: bool) -> None:
    q = [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15] * 2 + [1, 15]
    if q8:
        q[7] = 8  # 0 * -2.0 = -0.0 in ggml, and here
    raw = q4_block(-2.0, q)
    qt, why = gt.decode(raw, "Q4_0", (32,), backend="numpy")
    assert why == ""
    assert qt is not None
    np.testing.assert_array_equal(np.asarray(qt.codes()), np.array(q) - 8)
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, "Q4_0")))


def test_tq2_0_field_3_not_exact() -> None:
    q = np.ones(256, np.uint8)
    q[200] = 3
    assert gguf_values(tq2_block(0.5, q), "TQ2_0")[200] == 1.0  # (3 - 1) * 0.5: outside q2s
    assert gt.decode(tq2_block(0.5, q), "TQ2_0", (256,)) == (
        None,
        "TQ2_0 block 0 (block 0 of the row) has d = 0.5 and q = 3 at element 200: the value is 2 * d, "
        "outside q2s's codes -1..1",
    )


def test_tq2_0_negative_d() -> None:
    q = np.where(np.arange(256) % 2 == 0, 0, 2).astype(np.uint8)
    q[3] = 1  # 0 * -0.5 = -0.0
    raw = tq2_block(-0.5, q)
    qt, why = gt.decode(raw, "TQ2_0", (256,), backend="numpy")
    assert why == ""
    assert qt is not None
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf_values(raw, "TQ2_0")))


def test_mxfp4_e255_not_exact() -> None:
    raw = np.concatenate([[127], np.zeros(16), [255], np.zeros(16)]).astype(np.uint8)
    assert gguf_values(raw, "MXFP4").dtype == np.float32  # ggml reads it (2^127), arrayquant cannot
    assert gt.decode(raw, "MXFP4", (64,)) == (
        None,
        "MXFP4 block 1 (block 1 of the row) has E8M0 scale byte 0xFF: ggml reads it as 2^127, OCP MX and "
        "arrayquant as NaN",
    )


def test_nvfp4_scale_0xff_not_exact() -> None:
    raw = nvfp4_block([0x38, 0x38, 0xFF, 0x38], np.full(64, 2, np.uint8))
    assert gguf_values(raw, "NVFP4")[32] == 480.0  # 1.0 (nibble 2) times 480
    assert gt.decode(raw, "NVFP4", (1, 64)) == (
        None,
        "NVFP4 block 0 (row (0,), block 0 of the row) has UE4M3 scale byte 0xFF in sub-block 2: ggml ignores "
        "bit 7 and reads exponent 15, mantissa 7 (480), beyond UE4M3's largest value 448",
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("Q8_K", "llama.cpp's activation type for K-quant dot products, not a file type"),
        ("iq1_s", "vector codebook (lattice grid of 4 or 8 values per index), not element-wise codes"),
        ("IQ2_XXS", "vector codebook (lattice grid of 4 or 8 values per index), not element-wise codes"),
        ("F16", "plain float16: passes through as an array"),
        (
            "NOPE",
            "no arrayquant scheme maps it (those that do: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, TQ2_0, TQ1_0, MXFP4, NVFP4, "
            "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)",
        ),
    ],
)
def test_types_that_are_not_schemes(name: str, why: str) -> None:
    assert gt.decode(np.zeros(64, np.uint8), name, (64,)) == (
        None,
        f"GGUF type {name.upper()} is not an arrayquant scheme: {why}",
    )
    assert gt.scheme_of(name) is None


def test_every_gguf_type_is_classified() -> None:
    for t in T:
        assert (t.name in gt.EXACT) != (t.name in gt.NOT_EXACT), t.name


# -- scheme_of / type_of / presets -------------------------------------------------------------
def test_scheme_of_and_type_of() -> None:
    parse = aq.QuantScheme.parse
    assert {n: gt.scheme_of(n).spelled_out() for n in gt.EXACT} == {
        "Q8_0": "q8f:block32:f16",
        "Q4_0": "q4f:block32:f16",
        "Q4_1": "u4:block32:f16:offset",
        "Q5_0": "q5f:block32:f16",
        "Q5_1": "u5:block32:f16:offset",
        "TQ2_0": "q2s:block256:f16",
        "TQ1_0": "q2s:block256:f16",
        "MXFP4": "e2m1:block32:ue8m0:packed_native",
        "NVFP4": "e2m1:block16:ue4m3:packed_native",
        "Q2_K": "u2:block16:f32:offset",
        "Q3_K": "q3f:block16:f32",
        "Q4_K": "u4:block32:f32:offset",
        "Q5_K": "u5:block32:f32:offset",
        "Q6_K": "q6f:block16:f32",
        "IQ4_NL": "q4f:block32:f16:lookup:iq4nl",
        "IQ4_XS": "q4f:block32:f32:lookup:iq4nl",
    }
    for name in gt.EXACT:
        block, _ = gguf.GGML_QUANT_SIZES[T[name]]
        assert gt.scheme_of(name).block[0].size in (block, 16, 32)  # the K-quants' sub-blocks of 16 and 32
        assert gt.type_of(gt.scheme_of(name)) == ("TQ2_0" if name == "TQ1_0" else name)
    assert gt.type_of(parse("q8f:block32:f16:packed_u32:1")) == "Q8_0"
    assert gt.type_of(parse("mxfp4")) == "MXFP4"
    assert gt.type_of(parse("nvfp4")) == "NVFP4"
    others = ["q8s:block32:f16", "q8f:block32:bf16", "q8f:block64:f16", "q4f:block32:f16:tensor:f32", "q2s:block256"]
    others += ["mxfp8", "nf4", "q8f:block2x32:f16", "e2m1:block16:ue4m3:tensor:f16"]
    others += ["u4:block32:f16:zero_point", "u4:block32:bf16:offset", "u4:block64:f16:offset", "u5:block32:bf16:offset"]
    others += ["u4:block16:f32:offset", "q6f:block32:f32", "q4f:block32:f32:lookup:nf4", "q4s:block32:f16:lookup:iq4nl"]
    others += ["q5s:block32:f16", "q4f:block32:f16:zero_point", "u8:block32:f16:offset"]
    for other in others:
        assert gt.type_of(parse(other)) is None, other
    assert gt.type_of("q8_0") is None


ALIASES = [("q8_0", "Q8_0"), ("Q4_0", "Q4_0"), ("tq2_0", "TQ2_0"), ("q4_1", "Q4_1"), ("q5_0", "Q5_0"), ("Q5_1", "Q5_1")]


@pytest.mark.parametrize(("alias", "name"), ALIASES)
def test_gguf_names_as_scheme_names(alias: str, name: str) -> None:
    scheme = aq.QuantScheme.parse(alias)
    assert scheme == gt.scheme_of(name)
    assert gt.type_of(scheme) == name
    assert str(scheme) == gt.scheme_of(name).spelled_out()
    qt = aq.quantize(data("normal", (2, 256)), alias)
    assert gt.encode(qt)[0] == name


# -- errors --------------------------------------------------------------------------------------
def test_decode_byte_count() -> None:
    with pytest.raises(
        aq.CorruptDataError, match=r"^Q8_0 tensor of shape \(2, 64\) takes 4 blocks of 34 bytes \(136 bytes\), but "
        r"the data holds 135$",
    ):  # fmt: skip
        gt.decode(np.zeros(135, np.uint8), "Q8_0", (2, 64))


def test_decode_shapes() -> None:
    with pytest.raises(aq.ShapeError, match=r"^TQ2_0 tensor of shape \(2, 128\): the last axis \(128\) must be a "
                       r"multiple of the TQ2_0 block of 256; GGUF stores whole blocks per row$"):  # fmt: skip
        gt.decode(np.zeros(132, np.uint8), "TQ2_0", (2, 128))
    with pytest.raises(aq.ShapeError, match=r"^shape \(\) has no axes; a GGUF tensor has at least one"):
        gt.decode(np.zeros(34, np.uint8), "Q8_0", ())
    with pytest.raises(aq.ShapeError, match=r"Q8_0 tensor shape"):
        gt.decode(np.zeros(34, np.uint8), "Q8_0", (0, 32))


def test_decode_bad_arguments() -> None:
    with pytest.raises(aq.SchemeError, match=r"^type_name must be a GGUF type name \(str\), got int$"):
        gt.decode(np.zeros(34, np.uint8), 8, (32,))
    with pytest.raises(aq.SchemeError, match=r"^global_scale is NVFP4's per-tensor scale; a Q8_0 tensor has none$"):
        gt.decode(np.zeros(34, np.uint8), "Q8_0", (32,), global_scale=1.0)
    with pytest.raises(aq.CorruptDataError, match=r"^Q8_0 data must be the tensor's bytes"):
        gt.decode(["x"] * 34, "Q8_0", (32,))
    raw = nvfp4_block([0x38] * 4, np.zeros(64, np.uint8))
    for g, msg in [
        (-1.0, r"^global_scale -1\.0 is not a finite, non-negative float32$"),
        (float("nan"), r"^global_scale nan is not a finite, non-negative float32$"),
        (0.1, r"^global_scale 0\.1 is not a finite, non-negative float32$"),  # not an f32 value
        (
            np.ones(2, np.float32),
            r"^global_scale must hold exactly one value \(the per-tensor scale\), got shape \(2,\)$",
        ),
        ("x", r"^global_scale must be one float"),
    ]:
        with pytest.raises(aq.ParamsError, match=msg):
            gt.decode(raw, "NVFP4", (64,), global_scale=g)


def test_encode_errors() -> None:
    with pytest.raises(aq.ParamsError, match=r"^qt must be an aq\.QuantizedTensor, got ndarray$"):
        gt.encode(np.zeros(32, np.float32))
    qt = aq.quantize(data("normal", (2, 64)), "q8s:block32:f16")
    with pytest.raises(aq.SchemeError) as err:
        gt.encode(qt)
    assert str(err.value) == (
        "scheme q8s:block32:f16 has no GGUF block type; the schemes that map (any store) are: q8f:block32:f16 -> "
        "Q8_0; q4f:block32:f16 -> Q4_0; u4:block32:f16:offset -> Q4_1; q5f:block32:f16 -> Q5_0; "
        "u5:block32:f16:offset -> Q5_1; q2s:block256:f16 -> TQ2_0; mxfp4 -> MXFP4; "
        "e2m1:block16:ue4m3:packed_native -> NVFP4; u2:block16:f32:offset -> Q2_K; q3f:block16:f32 -> Q3_K; "
        "u4:block32:f32:offset -> Q4_K; u5:block32:f32:offset -> Q5_K; q6f:block16:f32 -> Q6_K; "
        "q4f:block32:f16:lookup:iq4nl -> IQ4_NL; q4f:block32:f32:lookup:iq4nl -> IQ4_XS; and nvfp4 (two-level) -> "
        "NVFP4 with its per-tensor scale as a separate F32 tensor"
    )
    q8 = aq.quantize(data("normal", (2, 64)), "q8f:block32:f16")
    with pytest.raises(aq.SchemeError, match=r"^scheme q8f:block32:f16 maps to GGUF Q8_0, not 'TQ1_0'$"):
        gt.encode(q8, "TQ1_0")
    partial = aq.quantize(data("normal", (2, 48)), "q8f:block32:f16")
    with pytest.raises(aq.ShapeError, match=r"^Q8_0 tensor of shape \(2, 48\): the last axis \(48\) must be a "):
        gt.encode(partial)
    bad = aq.QuantizedTensor(q8.scheme, q8.shape, np.float32, q8.values, np.full((2, 2), 0.1, np.float32))
    with pytest.raises(aq.ParamsError, match=r"is not a stored F16 value"):
        gt.encode(bad)


# -- fuzz ----------------------------------------------------------------------------------------
def fuzz_gguf_types(data: bytes) -> None:
    """Any bytes as any mapped type: a tensor, a reason, or a typed error, nothing else."""
    if len(data) < 2:
        return
    name = gt.EXACT[data[0] % len(gt.EXACT)]
    block, size = gguf.GGML_QUANT_SIZES[T[name]]
    rows = data[1] % 3 + 1
    body = data[2:]
    cols = block * max(1, len(body) // size // rows)
    try:
        qt, why = gt.decode(np.frombuffer(body, np.uint8), name, (rows, cols), backend="numpy")
    except QuantizationError:
        return
    assert (qt is None) != (why == "")
    if qt is not None:
        np.testing.assert_array_equal(
            bits(aq.dequantize(qt)), bits(gguf_values(np.frombuffer(body, np.uint8).reshape(rows, -1), name))
        )


def test_fuzz_gguf_types() -> None:
    rng = np.random.default_rng(2)
    for n in [0, 1, 2, 20, 36, 70, 110, 164, 300, 1000]:
        for _ in range(20):
            fuzz_gguf_types(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
