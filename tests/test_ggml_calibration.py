"""``calibration="ggml"`` without the compiled oracle: its refusals, backends and worked examples.

Byte equality with ggml itself is in ``test_ggml_bytes.py``; these cases are checked by hand from
the C of ggml-quants.c (``quantize_row_*_ref``).
"""

from __future__ import annotations

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import NonFiniteInputError, ParamsError, SchemeError, ShapeError


def test_q8_0_codes_come_from_the_unrounded_scale() -> None:
    # amax 1.0: d = 1/127 in f32; f16(d) = 0.007873535..., codes round(x * 127), ties away from zero
    x = np.zeros(32, np.float32)
    x[:4] = [1.0, -1.0, 0.5, 2.5 / 127]
    qt = aq.quantize(x, "q8_0", calibration="ggml")
    assert qt.codes()[:4].tolist() == [127, -127, 64, 3]  # 63.5 -> 64 and 2.5 -> 3: away from zero
    assert qt.scales.tolist() == [float(np.float16(np.float32(1) / np.float32(127)))]


def test_q4_0_scale_takes_the_sign_of_the_largest_element() -> None:
    x = np.zeros((2, 32), np.float32)
    x[0, :3] = [4.0, -1.0, 1.0]  # max +4: d = 4 / -8 = -0.5
    x[1, :3] = [-4.0, 1.0, 3.9]  # max -4: d = +0.5
    qt = aq.quantize(x, "q4_0", calibration="ggml")
    assert qt.scales.tolist() == [[-0.5], [0.5]]
    # codes min(15, trunc(x / d + 8.5)) - 8
    assert qt.codes()[0, :3].tolist() == [-8, 2, -2]
    assert qt.codes()[1, :3].tolist() == [-8, 2, 7]  # 3.9 / 0.5 + 8.5 = 16.3 -> 16 -> 15
    assert aq.dequantize(qt)[0, :3].tolist() == [4.0, -1.0, 1.0]


def test_all_zero_q4_0_block_is_negative_zero_as_in_ggml() -> None:
    qt = aq.quantize(np.zeros((1, 32), np.float32), "q4_0", calibration="ggml")
    assert np.signbit(qt.scales).all()  # 0 / -8 = -0.0
    assert np.signbit(aq.dequantize(qt)).all()


def test_mxfp4_exponent_is_floor_log2_minus_2_and_zero_is_plus_zero() -> None:
    x = np.zeros(32, np.float32)
    x[:3] = [5.0, -0.1, -0.0]  # floor(log2 5) - 2 = 0: scale 1
    qt = aq.quantize(x, "mxfp4", calibration="ggml")
    assert qt.scales.tolist() == [1.0]
    assert qt.codes()[:3].tolist() == [6, 0, 0]  # 5: a tie of 4 (code 6) and 6 (code 7), the first; -0.1 -> +0


def test_tensors_stay_on_their_backend() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    for scheme in ("q8_0", "q4_0", "tq2_0", "mxfp4", "e2m1:block16:ue4m3"):
        want = aq.quantize(x, scheme, calibration="ggml")
        got = aq.quantize(torch.from_numpy(x), scheme, calibration="ggml")
        assert isinstance(got.values, torch.Tensor)
        np.testing.assert_array_equal(got.values.numpy(), want.values)
        np.testing.assert_array_equal(got.scales.numpy(), want.scales)


@pytest.mark.parametrize(
    ("scheme", "kwargs", "error", "text"),
    [
        ("q8s", {}, SchemeError, "calibration 'ggml' is llama.cpp's quantizer for the GGUF block types, and q8s"),
        ("nvfp4", {}, SchemeError, "is none of them"),  # the two-level nvfp4: ggml has no per-tensor level
        ("q8_0", {"importance": np.ones(64, np.float32)}, ParamsError, "drop importance"),
        ("q8_0", {"params": aq.QParams(np.ones((2, 2), np.float32))}, ParamsError, "drop params"),
    ],
)
def test_refusals(scheme: str, kwargs: dict, error: type, text: str) -> None:
    x = np.ones((2, 64), np.float32)
    with pytest.raises(error, match=None) as info:
        aq.quantize(x, scheme, calibration="ggml", **kwargs)
    assert text in str(info.value)


def test_partial_block_refused() -> None:
    with pytest.raises(ShapeError, match="whole blocks of 32 along the last axis, as ggml does, but x has 40"):
        aq.quantize(np.ones((2, 40), np.float32), "q8_0", calibration="ggml")


def test_non_finite_refused_even_unchecked() -> None:
    x = np.ones((1, 32), np.float32)
    x[0, 3] = np.nan
    with pytest.raises(NonFiniteInputError, match=r"index \(0, 3\)"):
        aq.quantize(x, "q8_0", calibration="ggml", check_finite=False)


def test_dask_refused() -> None:
    da = pytest.importorskip("dask.array")
    with pytest.raises(SchemeError, match=r"runs eagerly on the host; pass x.compute\(\)"):
        aq.quantize(da.ones((2, 32), dtype="float32"), "q8_0", calibration="ggml")


def test_compute_range_refused() -> None:
    with pytest.raises(SchemeError, match="compute_range cannot express calibration 'ggml'"):
        aq.compute_range(np.ones((2, 32), np.float32), "q8_0", calibration="ggml")
