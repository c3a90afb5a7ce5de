"""arrayquant pinned to Burn's own test vectors and to the worked examples of docs/spec.md.

Every expected number below is copied from a Burn test (the file is cited above each case) or
printed in docs/spec.md; none is computed with arrayquant. Paths are in the
tracel-ai/burn repository.

Burn's CPU backends rounded with Rust's ``f32::round`` (half away from zero), so Burn CPU results
are reproduced with ``rounding="half_away"`` (current Burn, crates/burn-std/src/tensor/
quantization/codes.rs, rounds half to even everywhere, which is arrayquant's default).
Burn's default store is PackedU32(0); the cases compare unpacked codes (``qt.codes()``), or the
packed words where Burn's test shows words.
"""

from __future__ import annotations

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import to_host


def f32(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def host(x: object) -> np.ndarray:
    return np.asarray(to_host(x))


def q8s() -> aq.QuantScheme:
    # Burn: `QuantizedTensor::<TestBackend>::default_scheme().with_value(QuantValue::Q8S)`
    return aq.QuantScheme().with_value("q8s")


# ------------------------------------------------------------------------------------------------
# Quantize / dequantize
# ------------------------------------------------------------------------------------------------


def test_q8s_per_tensor_static_scale(xp):
    # crates/burn-backend-tests/src/tensor/quantization/ops/extended/quantize.rs
    #   (also crates/burn-tensor-tests/src/tensor/quantization/ops/extended/quantize.rs)
    #   should_support_quantize_symmetric_int8: [-1.8, -1.0, 0.0, 0.5] with the given scale
    #   0.014_173_228 -> [-127, -71, 0, 35], one scale, equal to the one given.
    x = xp.asarray(f32([-1.8, -1.0, 0.0, 0.5]))
    params = aq.QParams(scales=xp.asarray(f32([0.014_173_228])))
    for scheme in (q8s(), q8s().with_store("native")):
        qt = aq.quantize(x, scheme, params, rounding="half_away")
        np.testing.assert_array_equal(host(qt.codes()), np.array([-127, -71, 0, 35], np.int8))
        assert host(qt.codes()).dtype == np.int8
        np.testing.assert_array_equal(host(qt.scales), f32([0.014_173_228]))


def test_q8s_per_tensor_dynamic_and_dequantize(xp):
    # crates/burn-tensor/src/tensor/quantization/strategy.rs
    #   test_int8_symmetric_quantization: SymmetricQuantization::new(-1.8, 0.5) on
    #   [-1.8, -1.0, 0.0, 0.5] -> q [-127, -71, 0, 35], dequantized (assert_eq!, exact f32)
    #   [-1.8, -1.0062993, 0.0, 0.496063].
    x = xp.asarray(f32([-1.8, -1.0, 0.0, 0.5]))
    qt = aq.quantize(x, q8s().with_store("native"), rounding="half_away")
    np.testing.assert_array_equal(host(qt.codes()), np.array([-127, -71, 0, 35], np.int8))
    d = host(aq.dequantize(qt))
    assert d.dtype == np.float32
    np.testing.assert_array_equal(d, f32([-1.8, -1.0062993, 0.0, 0.496063]))


def test_q8s_per_block_strategy(xp):
    # crates/burn-tensor/src/tensor/quantization/strategy.rs
    #   test_int8_symmetric_quantization_per_block: two blocks of 4, each [-1.8, -1.0, 0.0, 0.5]
    #   -> [-127, -71, 0, 35, -127, -71, 0, 35], dequantized
    #   [-1.8, -1.0062993, 0.0, 0.496063] per block.
    x = xp.asarray(f32([-1.8, -1.0, 0.0, 0.5, -1.8, -1.0, 0.0, 0.5]))
    qt = aq.quantize(x, q8s().per_block([4], "f32"), rounding="half_away")
    np.testing.assert_array_equal(host(qt.codes()), np.array([-127, -71, 0, 35, -127, -71, 0, 35], np.int8))
    np.testing.assert_array_equal(host(aq.dequantize(qt)), f32([-1.8, -1.0062993, 0.0, 0.496063] * 2))


def test_q8s_dynamic_representable_values(xp):
    # crates/burn-backend-tests/src/tensor/quantization/ops/extended/quantize.rs
    #   should_support_quantize_dynamic_int8: [5., 0., 4., -12.7] -> [50, 0, 40, -127],
    #   scale 0.1 (compared with assert_eq on the quantized data).
    x = xp.asarray(f32([5.0, 0.0, 4.0, -12.7]))
    for scheme in (q8s(), q8s().with_store("native")):
        qt = aq.quantize(x, scheme, rounding="half_away")
        np.testing.assert_array_equal(host(qt.codes()), np.array([50, 0, 40, -127], np.int8))
        np.testing.assert_array_equal(host(qt.scales), f32([0.1]))


# crates/burn-backend-tests/src/tensor/quantization/ops/extended/quantize.rs
#   should_quantize_dequantize_symmetric_arange_16x16 (per-tensor Q8S, arange 0..256 as 16x16):
#   the dequantized values are pairs k * 2.007874 (first 64 of the 256 listed here, then the last 4).
_ARANGE_PER_TENSOR_HEAD = [
    0.0, 0.0, 2.007874, 2.007874, 4.015748, 4.015748, 6.023622, 6.023622, 8.031496,
    8.031496, 10.03937, 10.03937, 12.047244, 12.047244, 14.055119, 14.055119, 16.062992,
    16.062992, 18.070866, 18.070866, 20.07874, 20.07874, 22.086615, 22.086615, 24.094488,
    24.094488, 26.102362, 26.102362, 28.110237, 28.110237, 30.11811, 30.11811, 32.125984,
    32.125984, 34.133858, 34.133858, 36.14173, 36.14173, 38.149605, 38.149605, 40.15748,
    40.15748, 42.165356, 42.165356, 44.17323, 44.17323, 46.181103, 46.181103, 48.188976,
    48.188976, 50.19685, 50.19685, 52.204723, 52.204723, 54.212597, 54.212597, 56.220474,
    56.220474, 58.228348, 58.228348, 60.23622, 60.23622, 62.244095, 62.244095,
]  # fmt: skip
_ARANGE_PER_TENSOR_TAIL = [252.99213, 252.99213, 255.0, 255.0]


def test_q8s_arange_16x16_per_tensor(xp):
    x = xp.asarray(np.arange(256, dtype=np.float32).reshape(16, 16))
    qt = aq.quantize(x, q8s(), rounding="half_away")
    d = host(aq.dequantize(qt)).ravel()
    np.testing.assert_array_equal(d[:64], f32(_ARANGE_PER_TENSOR_HEAD))
    np.testing.assert_array_equal(d[-4:], f32(_ARANGE_PER_TENSOR_TAIL))
    np.testing.assert_array_equal(host(qt.scales), f32([2.007874]))


# crates/burn-backend-tests/src/tensor/quantization/ops/extended/quantize.rs
#   should_quantize_dequantize_symmetric_per_block_arange_16x16: block [2, 16] (F32 scales) on
#   arange 0..256 as 16x16, all 256 dequantized values.
_ARANGE_PER_BLOCK = [
    0.0, 0.97637796, 1.9527559, 2.929134, 3.9055119, 4.88189, 6.102362, 7.07874, 8.055119,
    9.031496, 10.0078745, 10.984252, 11.96063, 12.937008, 13.913386, 14.889764, 16.110237,
    17.086615, 18.062992, 19.03937, 20.015749, 20.992126, 21.968504, 22.944881, 23.92126,
    24.897638, 26.11811, 27.094488, 28.070866, 29.047245, 30.023623, 31.0, 32.244095,
    33.23622, 34.228348, 35.220474, 36.212597, 37.204723, 38.19685, 39.188976, 40.181103,
    41.17323, 42.165356, 43.157482, 44.149605, 45.14173, 46.133858, 47.125984, 48.11811,
    49.110237, 50.102364, 51.09449, 52.086613, 53.07874, 54.070866, 55.062992, 56.05512,
    57.047245, 58.03937, 59.031498, 60.02362, 61.015747, 62.007874, 63.0, 64.33071,
    65.07874, 65.826775, 67.32284, 68.07087, 68.8189, 70.314964, 71.062996, 71.81102,
    73.30708, 74.055115, 74.80315, 76.29921, 77.04724, 77.79527, 79.291336, 80.03937,
    80.7874, 82.28346, 83.031494, 83.779526, 85.27559, 86.02362, 86.77165, 88.267715,
    89.01575, 89.76378, 91.25984, 92.00787, 92.755905, 94.25197, 95.0, 96.0, 97.0, 98.0,
    99.0, 100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 106.0, 107.0, 108.0, 109.0, 110.0,
    111.0, 112.0, 113.0, 114.0, 115.0, 116.0, 117.0, 118.0, 119.0, 120.0, 121.0, 122.0,
    123.0, 124.0, 125.0, 126.0, 127.0, 127.70079, 128.95276, 130.20473, 131.4567, 131.4567,
    132.70866, 133.96063, 135.2126, 136.46457, 136.46457, 137.71654, 138.9685, 140.22047,
    141.47244, 141.47244, 142.72441, 143.97638, 145.22835, 146.48032, 146.48032, 147.73228,
    148.98425, 150.23622, 151.48819, 151.48819, 152.74016, 153.99213, 155.2441, 156.49606,
    156.49606, 157.74803, 159.0, 159.41733, 160.92126, 162.4252, 162.4252, 163.92914,
    165.43307, 165.43307, 166.93701, 168.44095, 168.44095, 169.94489, 171.44882, 171.44882,
    172.95276, 174.4567, 174.4567, 175.96063, 177.46457, 177.46457, 178.9685, 180.47244,
    180.47244, 181.97638, 183.48032, 183.48032, 184.98425, 186.48819, 186.48819, 187.99213,
    189.49606, 189.49606, 191.0, 191.3937, 193.14961, 193.14961, 194.90552, 196.66142,
    196.66142, 198.41733, 198.41733, 200.17323, 200.17323, 201.92914, 203.68504, 203.68504,
    205.44095, 205.44095, 207.19685, 207.19685, 208.95276, 210.70866, 210.70866, 212.46457,
    212.46457, 214.22047, 214.22047, 215.97638, 217.73228, 217.73228, 219.48819, 219.48819,
    221.2441, 221.2441, 223.0, 224.8819, 224.8819, 226.88977, 226.88977, 228.89764,
    228.89764, 230.90552, 230.90552, 232.91339, 232.91339, 234.92126, 234.92126, 236.92914,
    236.92914, 238.93701, 238.93701, 240.94489, 240.94489, 242.95276, 242.95276, 244.96063,
    244.96063, 246.9685, 246.9685, 248.97638, 248.97638, 250.98425, 250.98425, 252.99213,
    252.99213, 255.0, 255.0,
]  # fmt: skip


def test_q8s_arange_16x16_per_block_2x16(xp):
    x = xp.asarray(np.arange(256, dtype=np.float32).reshape(16, 16))
    qt = aq.quantize(x, q8s().per_block([2, 16], "f32"), rounding="half_away")
    assert tuple(qt.scales.shape) == (8, 1)
    d = host(aq.dequantize(qt))
    assert d.shape == (16, 16)
    np.testing.assert_array_equal(d.ravel(), f32(_ARANGE_PER_BLOCK))


# crates/burn-std/src/tensor/quantization/codes.rs
#   codes_round_to_the_nearest_value_and_saturate: with scale 1.0, Q8S 2.5 -> 2, 3.5 -> 4,
#   -126.5 -> -126, 1.4 -> 1, 1e9 -> 127, -1e9 -> -127; Q4S -6.5 -> -6 ("a tie rounds to the
#   even integer"). That is current Burn (HalfEven, like its GPU kernels) = arrayquant's default.
# crates/burn-tensor/src/tensor/quantization/strategy.rs (quantize_one:
#   `value.div(self.scale).round().clamp(a, b)`) is Burn's older CPU path: Rust f32::round, half
#   away from zero, so the ties go 2.5 -> 3, 3.5 -> 4, -126.5 -> -127, -6.5 -> -7.
_TIES_Q8S = [2.5, 3.5, -126.5, 1.4, 1e9, -1e9]


def test_ties_half_even_default_and_half_away(xp):
    x = xp.asarray(f32(_TIES_Q8S))
    params = aq.QParams(scales=xp.asarray(f32([1.0])))
    even = host(aq.quantize(x, q8s().with_store("native"), params).codes())
    away = host(aq.quantize(x, q8s().with_store("native"), params, rounding="half_away").codes())
    np.testing.assert_array_equal(even, np.array([2, 4, -126, 1, 127, -127], np.int8))
    np.testing.assert_array_equal(away, np.array([3, 4, -127, 1, 127, -127], np.int8))
    # the two rules differ exactly on the ties that round to an odd integer away from zero
    assert list(np.flatnonzero(even != away)) == [0, 2]

    x4 = xp.asarray(f32([-6.5]))
    for scheme in (aq.QuantScheme().with_value("q4s"), aq.QuantScheme().with_value("q4s").with_store("native")):
        assert host(aq.quantize(x4, scheme, params).codes()).tolist() == [-6]
        assert host(aq.quantize(x4, scheme, params, rounding="half_away").codes()).tolist() == [-7]


# ------------------------------------------------------------------------------------------------
# Calibration and parameters
# ------------------------------------------------------------------------------------------------


def test_compute_range_per_tensor(xp):
    # crates/burn-tensor-tests/src/tensor/quantization/calibration.rs
    #   min_max_calibration_range_per_tensor: [-1.8, -1.0, 0.0, 0.5] -> min [-1.8], max [0.5]
    #   (assert_eq, exact).
    lo, hi = aq.compute_range(xp.asarray(f32([-1.8, -1.0, 0.0, 0.5])), q8s())
    np.testing.assert_array_equal(host(lo), f32([-1.8]))
    np.testing.assert_array_equal(host(hi), f32([0.5]))


def test_compute_range_per_block(xp):
    # crates/burn-tensor-tests/src/tensor/quantization/calibration.rs
    #   min_max_calibration_range_per_block: 4x4 data, block [4] -> min [[-1.8], [-0.5], [0.01],
    #   [-0.04]], max [[0.5], [1.8], [0.04], [-0.01]] (assert_eq, exact).
    x = f32([
        [-1.8, -1.0, 0.0, 0.5],
        [1.8, 1.0, 0.0, -0.5],
        [0.01, 0.02, 0.03, 0.04],
        [-0.01, -0.02, -0.03, -0.04],
    ])  # fmt: skip
    lo, hi = aq.compute_range(xp.asarray(x), q8s().per_block([4], "f32"))
    np.testing.assert_array_equal(host(lo), f32([[-1.8], [-0.5], [0.01], [-0.04]]))
    np.testing.assert_array_equal(host(hi), f32([[0.5], [1.8], [0.04], [-0.01]]))


def test_compute_q_params_per_tensor(xp):
    # crates/burn-backend-tests/src/tensor/quantization/scheme.rs
    #   per_tensor_symmetric_int8: range (0.5, 1.8) -> scales [0.014_173_23]. Burn compares with
    #   Tolerance::default() (0.5 %); the printed decimal is 7 digits, so allow 1e-6 relative.
    p = aq.compute_q_params(q8s(), xp.asarray(f32([0.5])), xp.asarray(f32([1.8])))
    assert p.global_scale is None
    np.testing.assert_allclose(host(p.scales), f32([0.014_173_23]), rtol=1e-6)


def test_compute_q_params_per_block(xp):
    # crates/burn-backend-tests/src/tensor/quantization/scheme.rs
    #   per_block_symmetric_int8: block [4], min [-1.8, -0.5, 0.01, -0.04],
    #   max [0.5, 1.8, 0.04, -0.01] -> [0.014_173_23, 0.014_173_23, 0.000_314_96, 0.000_314_96]
    #   (Tolerance::default(); 0.000_314_96 is printed to 5 digits, hence rtol 1e-5).
    lo = xp.asarray(f32([-1.8, -0.5, 0.01, -0.04]))
    hi = xp.asarray(f32([0.5, 1.8, 0.04, -0.01]))
    p = aq.compute_q_params(q8s().per_block([4], "f32"), lo, hi)
    assert p.global_scale is None
    np.testing.assert_allclose(host(p.scales), f32([0.014_173_23, 0.014_173_23, 0.000_314_96, 0.000_314_96]), rtol=1e-5)


def test_compute_q_params_two_level_spec_example(xp):
    # docs/spec.md, two-level normalisation: block scales
    #   [0.014173228, 0.014173228, 0.00031496063, 0.00031496063] -> g = 3.163667e-05,
    #   block [448, 448, 9.955555, 9.955555]. Those block scales are exactly the Q8S scales of
    #   Burn's per_block_symmetric_int8 range (crates/burn-backend-tests/src/tensor/quantization/
    #   scheme.rs), so that range is the input. The spec prints rounded decimals (7 significant
    #   digits, not always enough to name one f32), so these compare within 1 ulp of the f32
    #   nearest to each printed decimal.
    lo = xp.asarray(f32([-1.8, -0.5, 0.01, -0.04]))
    hi = xp.asarray(f32([0.5, 1.8, 0.04, -0.01]))
    one = aq.compute_q_params(q8s().per_block([4], "ue4m3"), lo, hi)
    np.testing.assert_array_max_ulp(
        host(one.scales), f32([0.014173228, 0.014173228, 0.00031496063, 0.00031496063]), maxulp=1
    )
    two_level = q8s().per_block([4], "ue4m3").per_tensor("f32")
    p = aq.compute_q_params(two_level, lo, hi)
    assert p.global_scale is not None
    g = host(p.global_scale)
    assert g.shape == (1,)
    assert g.dtype == np.float32
    np.testing.assert_array_max_ulp(g, f32([3.163667e-05]), maxulp=1)
    s = host(p.scales)
    assert s.dtype == np.float32
    np.testing.assert_array_max_ulp(s, f32([448.0, 448.0, 9.955555, 9.955555]), maxulp=1)


# ------------------------------------------------------------------------------------------------
# Storage: packed words and sizes
# ------------------------------------------------------------------------------------------------


def _words(values: object) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def test_pack_i8s_to_u32(xp):
    # crates/burn-std/src/tensor/quantization.rs (also crates/burn-tensor/src/tensor/quantization/
    #   bytes.rs): should_pack_i8s_to_u32: [-128, 2, -3, 127] -> [2147287680];
    #   should_pack_i8s_to_u32_padded: [-128, 2, -3, 127, 55] -> [2147287680, 55];
    #   should_unpack_u32s_to_i8s(_padded): the inverse.
    words = aq.pack(xp.asarray(np.array([-128, 2, -3, 127], np.int8)), q8s())
    np.testing.assert_array_equal(host(words), _words([2147287680]))
    assert host(words).dtype == np.uint32
    codes5 = np.array([-128, 2, -3, 127, 55], np.int8)
    words5 = aq.pack(xp.asarray(codes5), q8s())
    np.testing.assert_array_equal(host(words5), _words([2147287680, 55]))
    unpacked = aq.unpack(xp.asarray(_words([2147287680, 55])), q8s(), (5,))
    np.testing.assert_array_equal(host(unpacked), codes5)


_Q4_ARANGE_WORDS = [
    0, 286331136, 286331153, 572657937, 572662306, 857874978, 858993459, 858993459,
    1145324612, 1145324612, 1431655748, 1431655765, 1717982549, 1717986918, 2003199590,
    2004318071,
]  # fmt: skip
_Q4_ARANGE_CODES = [
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5,
    5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6,
    6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
]  # fmt: skip


def test_q4s_unpack_and_pack_arange_words(xp):
    # crates/burn-std/src/tensor/quantization.rs should_unpack_u32s_to_i8s_arange: 16 Q4S words
    #   -> 128 codes (eight 4-bit fields per word, first in the low bits).
    q4s = aq.QuantScheme().with_value("q4s")
    codes = aq.unpack(xp.asarray(_words(_Q4_ARANGE_WORDS)), q4s, (128,))
    np.testing.assert_array_equal(host(codes), np.array(_Q4_ARANGE_CODES, np.int8))
    words = aq.pack(xp.asarray(np.array(_Q4_ARANGE_CODES, np.int8)), q4s)
    np.testing.assert_array_equal(host(words), _words(_Q4_ARANGE_WORDS))


def test_q8s_rows_padded_to_whole_words(xp):
    # crates/burn-std/src/tensor/quantization.rs packing_bytes_along_rows_pads_each_row:
    #   Q8S PackedU32(0), [2, 3] values 0..6 -> words [0x0002_0100, 0x0005_0403].
    codes = np.arange(6, dtype=np.int8).reshape(2, 3)
    words = aq.pack(xp.asarray(codes), q8s().with_store("packed_u32:0"))
    np.testing.assert_array_equal(host(words), _words([[0x0002_0100], [0x0005_0403]]))
    np.testing.assert_array_equal(host(aq.unpack(words, q8s(), (2, 3))), codes)


def test_q4s_packed_along_inner_and_outer_axis(xp):
    # crates/burn-std/src/tensor/quantization.rs packing_along_the_outer_axis_packs_the_transposed_rows:
    #   Q4S rows [[0..8], [-1; 8]] as [2, 8] PackedU32(0), and their transpose [8, 2] PackedU32(1),
    #   both give the words [0x7654_3210, 0xFFFF_FFFF].
    q4s = aq.QuantScheme().with_value("q4s")
    rows = np.array([[0, 1, 2, 3, 4, 5, 6, 7], [-1] * 8], np.int8)
    inner = aq.pack(xp.asarray(rows), q4s.with_store("packed_u32:0"))
    np.testing.assert_array_equal(host(inner), _words([[0x7654_3210], [0xFFFF_FFFF]]))
    outer_scheme = q4s.with_store("packed_u32:1")
    outer = aq.pack(xp.asarray(np.ascontiguousarray(rows.T)), outer_scheme)
    np.testing.assert_array_equal(host(outer), _words([[0x7654_3210, 0xFFFF_FFFF]]))
    np.testing.assert_array_equal(host(aq.unpack(outer, outer_scheme, (8, 2))), rows.T)


def test_q8s_packed_along_outermost_axis_rank3(xp):
    # crates/burn-std/src/tensor/quantization.rs packing_along_an_outer_axis_swaps_it_innermost:
    #   Q8S PackedU32(2), shape [4, 2, 3], values 0..24 -> words (in Burn's serialisation order,
    #   the packed axis swapped innermost: line (k, j) for axis-2 index k, axis-1 index j)
    #   [0x120C_0600, 0x150F_0903, 0x130D_0701, 0x1610_0A04, 0x140E_0802, 0x1711_0B05].
    # aq.pack returns the words array shaped [1, 2, 3] (packed axis shortened); the word of line
    # (j, k) there is Burn's word number k * 2 + j. Only the word contents are compared here: the
    # order in which to_bytes writes them is a separate question (see the report).
    burn = [0x120C_0600, 0x150F_0903, 0x130D_0701, 0x1610_0A04, 0x140E_0802, 0x1711_0B05]
    expected = np.array([[[burn[k * 2 + j] for k in range(3)] for j in range(2)]], np.uint32)
    scheme = q8s().with_store("packed_u32:2")
    codes = np.arange(24, dtype=np.int8).reshape(4, 2, 3)
    words = aq.pack(xp.asarray(codes), scheme)
    np.testing.assert_array_equal(host(words), expected)
    np.testing.assert_array_equal(host(aq.unpack(words, scheme, (4, 2, 3))), codes)


def test_quantized_nbytes_burn_layouts():
    # docs/spec.md, Burn byte layout worked example and crates/burn-std/src/tensor/quantization.rs
    #   should_pack_unpack_two_level_scales: Q8S Native, block [4] UE4M3, per-tensor F32, 8 values
    #   -> 8 + 2 + 4 = 14 bytes.
    two_level = q8s().with_store("native").per_block([4], "ue4m3").per_tensor("f32")
    assert aq.quantized_nbytes("q8s:block4:ue4m3:tensor:f32:native", (8,)) == 14
    assert aq.quantized_nbytes(two_level, (8,)) == 14
    # same file, should_pack_unpack_ue8m0_block_scales: block [4] UE8M0, no global -> 8 + 2.
    assert aq.quantized_nbytes(q8s().with_store("native").per_block([4], "ue8m0"), (8,)) == 10
    # same file, storage_elements doc: a [3, 3] Q4 PackedU32 tensor takes 3 words (not 2),
    # plus one f32 scale.
    assert aq.quantized_nbytes(aq.QuantScheme().with_value("q4s"), (3, 3)) == 3 * 4 + 4


def test_quantized_tensor_nbytes_two_level(xp):
    # docs/spec.md, Burn byte layout worked example size (14 bytes) through a real quantized tensor.
    scheme = aq.QuantScheme.parse("q8s:block4:ue4m3:tensor:f32:native")
    x = xp.asarray(f32([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, -6.0, -0.5]))
    qt = aq.quantize(x, scheme)
    assert qt.nbytes == 14


# ------------------------------------------------------------------------------------------------
# Scale round-up (docs/spec.md, "The round-up rule")
# ------------------------------------------------------------------------------------------------

_ROUND_UP_EXAMPLES = [
    ("f16", 1.0012, 1.001953125),
    ("ue4m3", 0.3, 0.3125),
    ("ue4m3", 1e-3, 2.0**-9),
    ("ue4m3", 500.0, 448.0),
    ("bf16", 0.3, 0.30078125),
]


@pytest.mark.parametrize(("dtype", "scale", "stored"), _ROUND_UP_EXAMPLES)
def test_round_up_scalar(dtype, scale, stored):
    assert aq.ScaleDtype(dtype).round_up(scale) == stored
    assert getattr(aq.ScaleDtype, dtype.upper()).round_up(scale) == stored


def test_round_up_scales_array(xp):
    for dtype, scale, stored in _ROUND_UP_EXAMPLES:
        out = aq.round_up_scales(xp.asarray(f32([scale])), dtype)
        h = host(out)
        assert h.dtype == np.float32
        np.testing.assert_array_equal(h, f32([stored]), err_msg=f"{dtype} {scale}")
    # all examples of one dtype in one array, shape kept
    out = host(aq.round_up_scales(xp.asarray(f32([[0.3, 1e-3, 500.0]])), "ue4m3"))
    np.testing.assert_array_equal(out, f32([[0.3125, 2.0**-9, 448.0]]))
