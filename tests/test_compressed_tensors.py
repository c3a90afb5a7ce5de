"""compressed-tensors (vLLM) NVFP4 interop: ``read_nvfp4`` / ``write_nvfp4`` against files made here.

The compressed-tensors layout is built by the tests themselves, independently of the module
under test: E2M1 codes packed two per byte with NumPy (low nibble first), block scales cast to
``float8_e4m3fn`` with ml_dtypes, and the global scale stored as the f32 divisor ``1 / g``;
the files are written with the raw safetensors API. compressed-tensors' own quantizer is
imitated too (``global = 448 * 6 / amax``, scales rounded to nearest E4M3, E2M1 thresholds), to
read what it writes.

Values and block scales go through bit for bit in both directions. The per-tensor scale goes
through an f32 reciprocal, which is exact for some values of ``g`` and one ulp off for the rest
(see arrayquant/io/compressed_tensors.py); the tests count both kinds and bound the effect.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors

import arrayquant as aq
from arrayquant.backends import shim
from arrayquant.io import read_nvfp4, write_nvfp4

NAME = "model.layers.0.mlp.down_proj"
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
ONE = np.float32(1)


def sample(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(10.0 ** rng.uniform(-3, 3))
    x.reshape(-1)[:16] = 0  # one all-zero block
    return x


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """compressed-tensors' pack_fp4_to_uint8 on codes: pairs along the last axis, low nibble first."""
    codes = codes.astype(np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), np.uint8)
    out[..., 0::2], out[..., 1::2] = packed & 0x0F, packed >> 4
    return out


def ct_entries_from(qt: aq.QuantizedTensor, name: str = NAME) -> dict[str, np.ndarray]:
    """The compressed-tensors entries of an aq nvfp4 tensor, built without the module under test."""
    scales = np.asarray(qt.scales, np.float32)
    f8 = scales.astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(f8.astype(np.float32), scales)  # stored scales are on the E4M3 grid
    g = np.float32(qt.global_scale[0])
    return {
        f"{name}.weight_packed": pack_nibbles(np.asarray(qt.codes())),
        f"{name}.weight_scale": f8,
        f"{name}.weight_global_scale": np.array([ONE / g], np.float32),
    }


def ct_quantize(x: np.ndarray, name: str = NAME) -> dict[str, np.ndarray]:
    """compressed-tensors' NVFP4 weight quantization (generate_gparam, fp8 scales, cast_to_fp4)."""
    amax = np.float32(np.max(np.abs(x)))
    gs = np.float32(np.float32(448 * 6) / amax)
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    local = (np.max(np.abs(blocks), axis=-1) / np.float32(6) * gs).astype(np.float32)
    f8 = np.minimum(local, np.float32(448)).astype(ml_dtypes.float8_e4m3fn)  # round to nearest
    eff = (f8.astype(np.float32) / gs).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(eff[..., None] > 0, blocks / eff[..., None], 0).astype(np.float32)
    a = np.abs(y)
    mag = np.select(
        [a >= 5, a >= 3.5, a > 2.5, a >= 1.75, a > 1.25, a >= 0.75, a > 0.25], [7, 6, 5, 4, 3, 2, 1], default=0
    ).astype(np.uint8)
    codes = (mag | (np.signbit(y).astype(np.uint8) << 3)).reshape(x.shape)
    return {
        f"{name}.weight_packed": pack_nibbles(codes),
        f"{name}.weight_scale": f8,
        f"{name}.weight_global_scale": np.array([gs], np.float32),
    }


SPEC = {"uint8": "uint8", "float8_e4m3fn": "float8_e4m3fn", "float32": "float32", "float16": "float16"}


def write_file(path: Path, entries: dict[str, np.ndarray]) -> Path:
    """A safetensors file of these arrays via serialize/TensorSpec, plus unrelated model entries."""
    entries = {
        **entries,
        f"{NAME}.input_global_scale": np.array([3.0], np.float32),
        "model.norm.weight": np.ones(4, np.float16),
    }
    buffers = {k: np.ascontiguousarray(v).reshape(-1).view(np.uint8) for k, v in entries.items()}
    specs = {
        k: safetensors.TensorSpec(
            dtype=SPEC[str(v.dtype)], shape=list(v.shape), data_ptr=buffers[k].ctypes.data, data_len=buffers[k].size
        )
        for k, v in entries.items()
    }
    path.write_bytes(safetensors.serialize(specs, metadata={"format": "pt"}))
    return path


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in f32 units in the last place, for finite values of the same sign."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


SHAPES = [(2, 32), (3, 64), (4, 16), (2, 3, 32), (1, 256)]


# ---------------------------------------------------------------------------------------------
# arrayquant -> compressed-tensors -> arrayquant
# ---------------------------------------------------------------------------------------------


def test_write_matches_the_layout_built_independently() -> None:
    for i, shape in enumerate(SHAPES):
        qt = aq.quantize(sample(shape, i), "nvfp4")
        got, want = write_nvfp4(qt, NAME), ct_entries_from(qt)
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].dtype == want[key].dtype, key
            assert got[key].shape == want[key].shape, key
            assert got[key].tobytes() == want[key].tobytes(), key
        assert got[f"{NAME}.weight_packed"].shape == (*shape[:-1], shape[-1] // 2)
        assert got[f"{NAME}.weight_scale"].shape == (*shape[:-1], shape[-1] // 16)
    codes = write_nvfp4(qt, scale_codes=True)
    assert sorted(codes) == ["weight_global_scale", "weight_packed", "weight_scale"]
    assert codes["weight_scale"].dtype == np.uint8


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    """Bit for bit where the reciprocal allows it; one ulp of g (and its products) where it cannot."""
    exact = inexact = 0
    worst = 0
    for seed in range(200):
        shape = SHAPES[seed % len(SHAPES)]
        qt = aq.quantize(sample(shape, seed), "nvfp4")
        path = write_file(tmp_path / "ct.safetensors", ct_entries_from(qt))
        back = read_nvfp4(path, NAME, backend="numpy")
        assert back.scheme == aq.QuantScheme.nvfp4()
        assert back.shape == shape
        np.testing.assert_array_equal(back.values, qt.values)
        np.testing.assert_array_equal(back.scales, qt.scales)
        g, g2 = np.float32(qt.global_scale[0]), np.float32(back.global_scale[0])
        assert g2 == ONE / (ONE / g)  # read divides exactly as vLLM: f32(1 / divisor)
        if ONE / (ONE / g) == g:
            exact += 1
            assert aq.to_bytes(back) == aq.to_bytes(qt)
            np.testing.assert_array_equal(aq.dequantize(back), aq.dequantize(qt))
        else:
            inexact += 1
            assert ulps(np.array([g2]), np.array([g]))[0] == 1
            # no f32 divisor at all gives g back: the reciprocal genuinely misses it
            d = ONE / g
            for cand in (np.nextafter(d, np.float32(0)), d, np.nextafter(d, np.float32(np.inf))):
                assert ONE / cand != g
            a, b = aq.dequantize(back), aq.dequantize(qt)
            nz = b != 0
            assert np.array_equal(a == 0, b == 0)
            worst = max(worst, int(ulps(a[nz], b[nz]).max(initial=0)))
    # the reciprocal is exact for about 83% of f32 values (module notes); both kinds occur here
    assert exact + inexact == 200
    assert 0.05 < inexact / 200 < 0.35, (exact, inexact)
    assert worst <= 2, worst
    print(f"\nnvfp4 aq->ct->aq: g exact {exact}/200, one ulp off {inexact}/200, worst dequantized diff {worst} ulp")


def test_read_from_a_mapping_and_from_aq_load(tmp_path: Path) -> None:
    qt = aq.quantize(sample((2, 32), 7), "nvfp4")
    entries = ct_entries_from(qt)
    from_map = read_nvfp4(entries, NAME, backend="numpy")
    codes = {k: (v.view(np.uint8) if v.dtype == ml_dtypes.float8_e4m3fn else v) for k, v in entries.items()}
    from_codes = read_nvfp4(codes, NAME, backend="numpy")
    path = write_file(tmp_path / "ct.safetensors", entries)
    from_load = read_nvfp4(aq.load(path, backend="numpy"), NAME, backend="numpy")  # plain arrays of a CT file
    want = aq.to_bytes(read_nvfp4(path, NAME, backend="numpy"))
    assert aq.to_bytes(from_map) == aq.to_bytes(from_codes) == aq.to_bytes(from_load) == want
    unprefixed = {k.rsplit(".", 1)[-1]: v for k, v in entries.items()}
    assert aq.to_bytes(read_nvfp4(unprefixed, "", backend="numpy")) == want


def test_read_on_every_backend(xp: Any, tmp_path: Path) -> None:
    qt = aq.quantize(sample((3, 64), 11), "nvfp4")
    path = write_file(tmp_path / "ct.safetensors", ct_entries_from(qt))
    got = read_nvfp4(path, NAME, backend=xp.backend.library, device=xp.device)
    assert shim.backend_name(got.values) == xp.backend.library
    assert aq.to_bytes(got) == aq.to_bytes(read_nvfp4(path, NAME, backend="numpy"))
    host = shim.to_host(aq.dequantize(got))
    np.testing.assert_array_equal(host, aq.dequantize(read_nvfp4(path, NAME, backend="numpy")))


def test_read_then_save_as_an_arrayquant_checkpoint(tmp_path: Path) -> None:
    qt = aq.quantize(sample((4, 32), 5), "nvfp4")
    back = read_nvfp4(write_file(tmp_path / "ct.safetensors", ct_entries_from(qt)), NAME, backend="numpy")
    aq.save(tmp_path / "aq.safetensors", {"w": back})
    assert aq.to_bytes(aq.load(tmp_path / "aq.safetensors")["w"]) == aq.to_bytes(back)


# ---------------------------------------------------------------------------------------------
# compressed-tensors -> arrayquant -> compressed-tensors
# ---------------------------------------------------------------------------------------------


def test_compressed_tensors_quantizer_output(tmp_path: Path) -> None:
    same_divisor = 0
    worst = 0
    for seed in range(100):
        shape = SHAPES[seed % len(SHAPES)]
        x = sample(shape, 100 + seed)
        ct = ct_quantize(x)
        qt = read_nvfp4(write_file(tmp_path / "ct.safetensors", ct), NAME, backend="numpy")
        gs = ct[f"{NAME}.weight_global_scale"][0]
        assert qt.global_scale[0] == ONE / gs
        # the codes and scales are compressed-tensors' own, read back unchanged
        np.testing.assert_array_equal(np.asarray(qt.codes()), unpack_nibbles(ct[f"{NAME}.weight_packed"]))
        np.testing.assert_array_equal(qt.scales, ct[f"{NAME}.weight_scale"].astype(np.float32))
        # dequantized: arrayquant multiplies by f32(1/gs), compressed-tensors divides by gs
        values = E2M1[unpack_nibbles(ct[f"{NAME}.weight_packed"])].reshape(*shape[:-1], -1, 16)
        ct_eff = (ct[f"{NAME}.weight_scale"].astype(np.float32) / gs).astype(np.float32)
        ct_deq = (values * ct_eff[..., None]).reshape(shape)
        aq_deq = aq.dequantize(qt)
        assert np.array_equal(aq_deq == 0, ct_deq == 0)
        nz = ct_deq != 0
        worst = max(worst, int(ulps(aq_deq[nz], ct_deq[nz]).max(initial=0)))
        np.testing.assert_allclose(aq_deq, ct_deq, rtol=2**-21, atol=0)
        # and it dequantizes close to the input, as NVFP4 does (|err| <= half a step of 6 * eff)
        assert np.all(np.abs(aq_deq - x) <= np.repeat(ct_eff, 16, axis=-1).reshape(shape) * 1.0 + 1e-30)
        # written back: the same bytes, and a divisor vLLM turns into the same multiplier
        out = write_nvfp4(qt, NAME)
        for key in (f"{NAME}.weight_packed", f"{NAME}.weight_scale"):
            assert out[key].tobytes() == ct[key].tobytes()
        divisor = out[f"{NAME}.weight_global_scale"][0]
        assert ONE / divisor == ONE / gs
        same_divisor += int(divisor == gs)
    assert worst <= 2, worst
    print(
        f"\nct->aq: dequantized vs compressed-tensors' division: worst {worst} ulp; "
        f"ct->aq->ct: same divisor {same_divisor}/100 (all give vLLM the same multiplier)"
    )


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


def _entries() -> dict[str, np.ndarray]:
    return ct_entries_from(aq.quantize(sample((2, 32), 3), "nvfp4"))


def test_missing_global_scale() -> None:
    entries = _entries()
    del entries[f"{NAME}.weight_global_scale"]
    with pytest.raises(aq.MissingGlobalScaleError) as info:
        read_nvfp4(entries, NAME)
    msg = str(info.value)
    for part in (NAME, "two-level scheme", "per-tensor scale", "weight_global_scale", "divisor"):
        assert part in msg, (part, msg)


@pytest.mark.parametrize("part", ["weight_packed", "weight_scale"])
def test_missing_packed_or_scale(part: str) -> None:
    entries = _entries()
    del entries[f"{NAME}.{part}"]
    with pytest.raises(aq.CorruptDataError, match=rf"the mapping has no '{NAME}\.{part}'"):
        read_nvfp4(entries, NAME)
    with pytest.raises(aq.CorruptDataError, match=r"has no 'other\.weight_packed'"):
        read_nvfp4(_entries(), "other")


@pytest.mark.parametrize("value", [0.0, -1.0, np.nan, np.inf, 1e-45])
def test_bad_divisor(value: float) -> None:
    entries = _entries()
    entries[f"{NAME}.weight_global_scale"] = np.array([value], np.float32)
    with pytest.raises(aq.ParamsError, match=r"weight_global_scale' is .*positive finite f32"):
        read_nvfp4(entries, NAME)


def test_bad_shapes_and_dtypes() -> None:
    entries = _entries()
    entries[f"{NAME}.weight_scale"] = entries[f"{NAME}.weight_scale"][:, :1]
    with pytest.raises(aq.ShapeError, match=r"weight_scale' has shape \(2, 1\).* data of shape \(2, 32\).* \(2, 2\)"):
        read_nvfp4(entries, NAME)
    entries = _entries()
    entries[f"{NAME}.weight_global_scale"] = np.ones(2, np.float32)
    with pytest.raises(aq.ShapeError, match=r"exactly one f32 divisor"):
        read_nvfp4(entries, NAME)
    entries = _entries()
    entries[f"{NAME}.weight_scale"] = entries[f"{NAME}.weight_scale"].astype(np.float16)
    with pytest.raises(aq.CorruptDataError, match=r"weight_scale' has dtype float16"):
        read_nvfp4(entries, NAME)
    entries = _entries()
    entries[f"{NAME}.weight_packed"] = entries[f"{NAME}.weight_packed"].astype(np.int8)
    with pytest.raises(aq.CorruptDataError, match=r"weight_packed' has dtype int8"):
        read_nvfp4(entries, NAME)


@pytest.mark.parametrize("code", [0x7F, 0xFF, 0xB8, 0x80])
def test_nan_or_negative_block_scales(code: int) -> None:
    entries = _entries()
    bad = entries[f"{NAME}.weight_scale"].view(np.uint8).copy()
    bad[0, 1] = code
    entries[f"{NAME}.weight_scale"] = bad
    with pytest.raises(aq.CorruptDataError, match=rf"scale code 0x{code:02X} at index 1 is not a UE4M3 scale"):
        read_nvfp4(entries, NAME)


def test_hostile_files(tmp_path: Path) -> None:
    path = tmp_path / "h.safetensors"
    header = {f"{NAME}.weight_packed": {"dtype": "U8", "shape": [2**40, 2**40], "data_offsets": [0, 2**80]}}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(16))
    with pytest.raises(aq.CorruptDataError, match=r"weight_packed' of shape \[1099511627776, 1099511627776\] needs"):
        read_nvfp4(path, NAME)
    header = {f"{NAME}.weight_scale": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(4))
    with pytest.raises(aq.CorruptDataError, match=r"weight_scale' has dtype F32, but .* F8_E4M3"):
        read_nvfp4(path, NAME)
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(aq.CorruptDataError, match=r"declares a \d+-byte header"):
        read_nvfp4(path, NAME)
    path.write_bytes(struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(aq.CorruptDataError, match=r"unreadable safetensors header"):
        read_nvfp4(path, NAME)


def test_write_refuses_other_schemes_and_shapes() -> None:
    with pytest.raises(aq.SchemeError, match=r"stores the scheme nvfp4 .* not mxfp4"):
        write_nvfp4(aq.quantize(sample((2, 32), 0), "mxfp4"))
    with pytest.raises(aq.SchemeError, match=r"not e2m1:block16:ue4m3:packed_native"):
        write_nvfp4(aq.quantize(sample((2, 32), 0), "e2m1:block16:ue4m3:packed_native"))
    with pytest.raises(aq.ShapeError, match=r"shape \(2, 24\): .* multiple of 16"):
        write_nvfp4(aq.quantize(sample((2, 24), 0), "nvfp4"))
    with pytest.raises(aq.ParamsError, match=r"must be an aq\.QuantizedTensor"):
        write_nvfp4(np.ones(4))  # type: ignore[arg-type]
