"""Hostile and hand-built inputs end in typed errors or correct results, never in crashes."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import to_host

TWO_LEVEL = "q8s:block4:ue4m3:tensor:f32:native"


def _qt() -> aq.QuantizedTensor:
    return aq.quantize(np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8), TWO_LEVEL)


def test_float64_beyond_float32_is_refused() -> None:
    with pytest.raises(
        aq.NonFiniteInputError, match=r"1 beyond the float32 range element\(s\) \(first at index \(0,\)"
    ):
        aq.quantize(np.array([1e39, 1.0, -2.0, 0.5]), "q8s:native")
    with pytest.raises(aq.NonFiniteInputError, match="beyond the float32 range"):
        aq.quantize(np.array([1e39, 1.0]), "q8s:native", aq.QParams(scales=np.ones(1, np.float32)))


def test_hand_built_tensor_missing_or_stray_global() -> None:
    qt = _qt()
    with pytest.raises(aq.MissingGlobalScaleError, match=r"two-level scheme .* but qt has no per-tensor scale"):
        aq.dequantize(dataclasses.replace(qt, global_scale=None))
    with pytest.raises(aq.MissingGlobalScaleError, match="per-tensor scale"):
        aq.to_bytes(dataclasses.replace(qt, global_scale=None))
    one = aq.quantize(np.ones((2, 8), np.float32), "q8s:block4:f16:native")
    with pytest.raises(aq.UnexpectedGlobalScaleError, match="qt carries a per-tensor scale"):
        aq.dequantize(dataclasses.replace(one, global_scale=np.array([2.0], np.float32)))


def test_hand_built_tensor_wrong_scales() -> None:
    qt = _qt()
    with pytest.raises(aq.ShapeError, match=r"qt\.scales has shape \(1, 1\) but scheme .* needs \(2, 2\)"):
        aq.dequantize(dataclasses.replace(qt, scales=np.ones((1, 1), np.float32)))
    with pytest.raises(aq.ShapeError, match=r"qt\.scales has shape \(3,\)"):
        aq.to_bytes(dataclasses.replace(qt, scales=np.ones(3, np.float32)))
    with pytest.raises(aq.ParamsError, match=r"qt\.scales has 1 invalid entry .*-0\.5"):
        aq.to_bytes(dataclasses.replace(qt, scales=np.array([[0.5, -0.5], [1, 1]], np.float32)))
    with pytest.raises(aq.ShapeError, match=r"qt\.values of dtype int32 .* expected int8"):
        aq.to_bytes(dataclasses.replace(qt, values=qt.values.astype(np.int32)))
    with pytest.raises(aq.DTypeError, match="not a real floating dtype"):
        aq.dequantize(dataclasses.replace(qt, dtype=None))


def test_torch_size_one_axes_pack_like_numpy() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((8, 1, 1)).astype(np.float32)
    for scheme in ("q4s:packed_u32:1", "q4s:packed_u32:2", "q2f:block2:f16:packed_u32:2"):
        want = aq.quantize(x, scheme)
        got = aq.quantize(torch.asarray(x), scheme)
        np.testing.assert_array_equal(to_host(got.values), want.values)
        np.testing.assert_array_equal(to_host(aq.dequantize(got)), aq.dequantize(want))


def test_bfloat16_numpy_input_computes_in_f32() -> None:
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(ml_dtypes.bfloat16)
    qt = aq.quantize(x, "q8s:block16:f16")
    ref = aq.quantize(x.astype(np.float32), "q8s:block16:f16")
    np.testing.assert_array_equal(qt.values, ref.values)
    assert aq.dequantize(qt).dtype == x.dtype
    for bad in ("int8", 5, float):
        with pytest.raises(aq.DTypeError, match="not a real floating dtype"):
            aq.dequantize(qt, bad)


@pytest.mark.parametrize("shape", [(), (0, 8), (-5, 8), "28", None, (2.5, 8)])
def test_from_bytes_refuses_bad_shapes(shape: object) -> None:
    with pytest.raises(aq.ShapeError, match=r"shape .*(at least one axis|sequence of integers)"):
        aq.from_bytes(bytes(28), "q8s:native", shape)  # type: ignore[arg-type]


def test_from_bytes_takes_an_int_shape_as_numpy_does() -> None:
    codes = np.arange(-12, 12, dtype=np.int8)
    buf = codes.tobytes() + np.float32(0.5).tobytes()
    np.testing.assert_array_equal(aq.from_bytes(buf, "q8s:native", 24).codes(), codes)


@pytest.mark.parametrize("buf", [28, "abc", None, 10**12])
def test_from_bytes_refuses_non_buffers(buf: object) -> None:
    with pytest.raises(aq.DTypeError, match="buf must be a contiguous bytes-like object"):
        aq.from_bytes(buf, "q8s:native", (4, 6))  # type: ignore[arg-type]


def test_from_bytes_refuses_nan_ue8m0_code() -> None:
    buf = bytes(32) + b"\xff"
    with pytest.raises(aq.CorruptDataError, match=r"scale code 0xFF at index 0 is not a UE8M0 scale"):
        aq.from_bytes(buf, "e4m3:block32:ue8m0:native", (1, 32))


def test_backend_names_are_case_insensitive() -> None:
    assert isinstance(aq.asarray([1.0], backend=" NumPy "), np.ndarray)
    qt = aq.from_bytes(aq.to_bytes(_qt()), TWO_LEVEL, (2, 8), backend="NUMPY")
    np.testing.assert_array_equal(aq.dequantize(qt), aq.dequantize(_qt()))


def test_to_backend_without_the_dtype_falls_back_to_float32() -> None:
    xps = pytest.importorskip("array_api_strict")
    qt = aq.quantize(np.ones((2, 8), np.float16), "q8s")
    moved = qt.to_backend("array_api_strict")  # array-api-strict has no float16
    assert aq.dequantize(moved).dtype == xps.float32


def test_read_only_input_is_chunked_and_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    import arrayquant.chunks

    monkeypatch.setattr(arrayquant.chunks, "CHUNK_ELEMENTS", 64)
    x = np.random.default_rng(2).standard_normal((40, 32)).astype(np.float32)
    ro = x.copy()
    ro.flags.writeable = False
    a, b = aq.quantize(ro, "q4s:block16:f16"), aq.quantize(x, "q4s:block16:f16")
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.scales, b.scales)


def test_native_e2m1_high_nibble_does_not_crash() -> None:
    qt = aq.quantize(np.linspace(-6, 6, 32, dtype=np.float32).reshape(1, 32), "e2m1:block32:f32:native")
    dirty = dataclasses.replace(qt, values=qt.values | np.uint8(0xF0))  # hand-built: readers refuse this
    np.testing.assert_array_equal(aq.dequantize(dirty), aq.dequantize(qt))
    with pytest.raises(aq.CorruptDataError):
        aq.from_bytes(aq.to_bytes(dirty), qt.scheme, qt.shape)


def test_saved_checkpoints_follow_the_umask(tmp_path) -> None:
    import os

    path = tmp_path / "w.safetensors"
    aq.save(path, {"w": np.ones(4, np.float32)})
    umask = os.umask(0o22)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
