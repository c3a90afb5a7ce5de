"""Zero points and every width from 1 to 8 bits in compressed-tensors' integer formats, against compressed-tensors.

The oracle is the installed compressed-tensors: its ``PackedQuantizationCompressor`` and
``IntQuantizationCompressor`` (compress and decompress), its dense packer ``pack_to_int32`` /
``unpack_from_int32`` (zero points packed with ``packed_dim=0``) and its asymmetric observer
arithmetic (``calculate_qparams`` with ``symmetric=False``). compressed-tensors dequantizes
``(code - zero_point) * scale`` in the scale dtype, so arrayquant's f32 result is compared after
a cast to that dtype, bit for bit (see arrayquant/io/compressed_tensors/ints.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ct = pytest.importorskip("compressed_tensors")
torch = pytest.importorskip("torch")

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402

import arrayquant as aq  # noqa: E402
from arrayquant.io.compressed_tensors import ints as ct_int  # noqa: E402

from .test_ct_int import NAME, NP, SCALE_DT, cast, ct_decompress, ct_quantize, same_bits, sample, to_torch  # noqa: E402

# (scheme, shape): every width, both signs of code, per group / per row / per tensor, the three scale dtypes.
# 4-bit weights with several groups have more than 8 rows: compressed-tensors 0.20.1 cannot unpack 4-bit zero
# points that pack into one word row (unpack_from_int32's byte view of the transposed (groups, 1) words fails)
CASES = [
    ("u4:block128:bf16:zero_point", (12, 256)),  # W4A16_ASYM
    ("q4f:block32:f16:zero_point", (9, 64)),
    ("u4:block32:f32:zero_point:native", (17, 96)),
    ("u8:block64:bf16:zero_point", (3, 128)),  # W8A16, asymmetric
    ("q8f:block48:f16:zero_point", (33, 48)),  # per row; 33 rows of zero points: 9 words down the grid
    ("u1:block32:f32:zero_point", (40, 64)),
    ("u2:block16:bf16:zero_point", (7, 48)),
    ("u3:block32:f16:zero_point", (35, 96)),  # 3-bit zero points cross words down the grid
    ("q3f:block32:bf16:zero_point", (4, 64)),
    ("u5:block64:f32:zero_point", (6, 128)),
    ("q5s:block32:f16:zero_point", (3, 96)),
    ("u6:block32:bf16:zero_point:packed_native", (9, 64)),
    ("q6f:block24:f32:zero_point", (2, 72)),
    ("u7:block40:f16:zero_point", (11, 40)),  # per row, 7-bit
    ("q7s:block32:bf16:zero_point:packed_u32:1", (5, 64)),  # packed down the columns in arrayquant
    ("u4:zero_point", (3, 64)),  # per tensor: one int8 zero point
    ("q8f:tensor:bf16:zero_point", (2, 32)),
    ("u6:tensor:f16:zero_point", (3, 40)),
    # the symmetric presets W3A16 ... W7A16 (dense fields crossing words, no zero point)
    ("q3f:block32:bf16", (4, 128)),
    ("q5s:block64:f16", (3, 128)),
    ("q6f:block32:f32", (5, 96)),
    ("q7s:block48:bf16", (3, 48)),
    ("q3s:tensor:f32", (3, 40)),
]


def _ct_codes_and_zero(qt: aq.QuantizedTensor) -> tuple[np.ndarray, np.ndarray | None]:
    """compressed-tensors' signed codes and zero points of ``qt`` (``u{b}`` fields less ``2**(b-1)``)."""
    shift = (1 << (qt.scheme.value.bits - 1)) if qt.scheme.value.is_unsigned else 0
    codes = (np.asarray(qt.codes()).astype(np.int16) - shift).astype(np.int8)
    if qt.zero_point is None:
        return codes, None
    return codes, (np.asarray(qt.zero_point).astype(np.int16) - shift).astype(np.int8)


@pytest.mark.parametrize(("text", "shape"), CASES)
def test_ct_decompresses_what_arrayquant_writes_bit_for_bit(text: str, shape: tuple[int, int]) -> None:
    scheme = aq.QuantScheme.parse(text)
    fmt, args = ct_int.weight_args(scheme, shape=shape)
    assert fmt == "pack-quantized"
    QuantizationArgs(**args)  # compressed-tensors accepts the arguments as written
    bits, affine = args["num_bits"], scheme.mode is aq.QuantMode.ZERO_POINT
    assert args["symmetric"] is not affine
    for seed in range(6):
        x = sample(shape, seed)
        if seed % 2:
            x = x + np.float32(0.7) * np.abs(x).max()  # mostly positive: zero points far from the middle
        qt = aq.quantize(x, scheme)
        entries = ct_int.write(qt, NAME)
        parts = ["weight_packed", "weight_scale", "weight_shape"] + (["weight_zero_point"] if affine else [])
        assert sorted(entries) == sorted(f"{NAME}.{p}" for p in parts)
        codes, zero = _ct_codes_and_zero(qt)
        packed = entries[f"{NAME}.weight_packed"]
        # the words and the zero points, as compressed-tensors' own packer writes them
        assert same_bits(packed, pack_to_int32(torch.from_numpy(codes), bits).numpy())
        got_codes = unpack_from_int32(torch.from_numpy(packed), bits, torch.Size(shape)).numpy()
        assert np.array_equal(got_codes, codes)
        if affine:
            assert zero is not None
            stored = entries[f"{NAME}.weight_zero_point"]
            if args["strategy"] == "tensor":
                assert stored.dtype == np.int8
                assert same_bits(stored, zero.reshape(1))
            else:
                grid = zero.reshape(shape[0], -1)
                want = pack_to_int32(torch.from_numpy(grid.copy()), bits, packed_dim=0).numpy()
                assert stored.shape == (-(-shape[0] * bits // 32), grid.shape[1])
                assert same_bits(stored, want)
        got = ct_decompress(entries, fmt, args)
        mine = cast(aq.dequantize(qt), SCALE_DT[scheme.scale_dtype.value])
        assert same_bits(got, mine), f"seed {seed}"


def test_zero_points_are_used_and_worked_words() -> None:
    """Worked value: u4 zero point of [-1, 0, 0.5, 2]: s = 0.2, z = 5; fields 0, 5, 7, 15 -> 0xF750."""
    qt = aq.quantize(np.array([[-1.0, 0.0, 0.5, 2.0]], np.float32), "u4:block4:f32:zero_point")
    entries = ct_int.write(qt, "")
    assert entries["weight_packed"].view(np.uint32).tolist() == [[0xF750]]
    assert entries["weight_zero_point"].view(np.uint32).tolist() == [[5]]  # the field z (= -3 + 8)
    args = ct_int.weight_args(qt.scheme)[1]
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    state = {k: to_torch(v) for k, v in entries.items()}
    zp = PackedQuantizationCompressor.decompress(state, scheme)["weight_zero_point"]
    assert zp.tolist() == [[-3]]  # compressed-tensors' own zero point, in its signed range
    s = np.float32(0.2)
    want = (np.array([0, 5, 7, 15], np.float32) - 5) * s
    assert ct_decompress({f"{NAME}.{k}": v for k, v in entries.items()}, "pack-quantized", args).tolist() == [
        want.tolist()
    ]


def test_weight_args_are_what_compressed_tensors_dumps() -> None:
    _, args = ct_int.weight_args(aq.QuantScheme.parse("u4:block128:bf16:zero_point"))
    want = QuantizationArgs(
        num_bits=4, type="int", symmetric=False, strategy="group", group_size=128, scale_dtype=torch.bfloat16
    )
    assert args == want.model_dump(mode="json")
    # W4A16_ASYM, as compressed-tensors' preset dumps it, but for the scale dtype arrayquant names
    preset = ct.quantization.preset_name_to_scheme("W4A16_ASYM", ["Linear"]).weights.model_dump(mode="json")
    assert {k: v for k, v in args.items() if k != "scale_dtype"} == preset
    _, args = ct_int.weight_args(aq.QuantScheme.parse("q6f:block128:f16"))
    preset = ct.quantization.preset_name_to_scheme("W6A16", ["Linear"]).weights.model_dump(mode="json")
    assert {k: v for k, v in args.items() if k != "scale_dtype"} == preset
    _, args = ct_int.weight_args(aq.QuantScheme.parse("u8:tensor:bf16:zero_point"))
    assert args == QuantizationArgs(
        num_bits=8, symmetric=False, strategy="tensor", scale_dtype=torch.bfloat16
    ).model_dump(mode="json")


# ---------------------------------------------------------------------------------------------
# compressed-tensors -> arrayquant
# ---------------------------------------------------------------------------------------------

CT_ARGS = [  # (args, model/scale dtype, shape)
    ({"num_bits": 4, "strategy": "group", "group_size": 128}, "bfloat16", (12, 256)),  # W4A16_ASYM
    ({"num_bits": 4, "strategy": "group", "group_size": 32}, "float16", (33, 64)),
    ({"num_bits": 8, "strategy": "channel"}, "bfloat16", (5, 64)),  # W8A16, asymmetric per row
    ({"num_bits": 8, "strategy": "group", "group_size": 16}, "float32", (3, 48)),
    ({"num_bits": 3, "strategy": "group", "group_size": 32}, "bfloat16", (37, 64)),
    ({"num_bits": 5, "strategy": "group", "group_size": 64}, "float16", (6, 128)),
    ({"num_bits": 6, "strategy": "channel"}, "float32", (9, 40)),
    ({"num_bits": 7, "strategy": "group", "group_size": 16}, "bfloat16", (3, 48)),
    ({"num_bits": 2, "strategy": "group", "group_size": 16}, "float32", (4, 48)),
    ({"num_bits": 1, "strategy": "group", "group_size": 32}, "float32", (40, 64)),
    ({"num_bits": 4, "strategy": "tensor"}, "float32", (3, 64)),
    ({"num_bits": 8, "strategy": "tensor"}, "bfloat16", (3, 64)),
]


@pytest.mark.parametrize(("args", "dt", "shape"), CT_ARGS)
def test_arrayquant_reads_what_ct_compresses_bit_for_bit(args: dict[str, Any], dt: str, shape: Any) -> None:
    full = {"type": "int", "symmetric": False, "dynamic": False, **args}
    bits = full["num_bits"]
    for seed in range(6):
        # a float16 model's max - min must be finite in float16, else compressed-tensors' scale is inf
        x = np.clip(sample(shape, seed), -30000, 30000) if dt == "float16" else sample(shape, seed)
        entries = ct_quantize(x, full, dt)
        assert f"{NAME}.weight_zero_point" in entries
        got = ct_decompress(entries, "pack-quantized", full)
        qt = ct_int.read(entries, NAME, "pack-quantized", full, backend="numpy")
        assert qt.scheme.mode is aq.QuantMode.ZERO_POINT
        assert qt.scheme.value is (aq.QuantValue(f"q{bits}f") if bits > 1 else aq.QuantValue.U1)
        assert qt.shape == shape
        ct_codes = unpack_from_int32(torch.from_numpy(entries[f"{NAME}.weight_packed"]), bits, torch.Size(shape))
        assert np.array_equal(_ct_codes_and_zero(qt)[0], ct_codes.numpy())
        assert same_bits(cast(aq.dequantize(qt, "float32"), dt), got), f"seed {seed}"
        again = ct_int.write(qt, NAME)  # and back: the same entries compressed-tensors wrote
        assert sorted(again) == sorted(entries)
        for key, arr in entries.items():
            assert same_bits(again[key], arr), key
        # the same bits read as unsigned codes: codes and zero points 2**(bits-1) higher, same values
        unsigned = ct_int.read(entries, NAME, "pack-quantized", full, value=f"u{bits}", backend="numpy")
        assert unsigned.scheme.value is aq.QuantValue(f"u{bits}")
        assert unsigned.zero_point.dtype == np.uint8
        shift = 1 << (bits - 1) if bits > 1 else 0
        widen = lambda a: np.asarray(a).astype(np.int16)
        assert np.array_equal(widen(unsigned.codes()), widen(qt.codes()) + shift)
        assert np.array_equal(widen(unsigned.zero_point), widen(qt.zero_point) + shift)
        assert same_bits(np.asarray(aq.dequantize(unsigned, "float32")), np.asarray(aq.dequantize(qt, "float32")))
        for key, arr in ct_int.write(unsigned, NAME).items():
            assert same_bits(arr, entries[key]), key


def test_ct_compressor_gives_arrayquant_codes_from_its_values() -> None:
    """compressed-tensors' compressor, given arrayquant's scales, zero points and decoded weight, stores our codes."""
    for text, shape in [("u4:block32:f32:zero_point", (6, 128)), ("q5f:block16:f32:zero_point", (4, 64))]:
        qt = aq.quantize(sample(shape, 3)[1:], text)  # no row of zeros: compressed-tensors cannot divide by 0
        entries = ct_int.write(qt, NAME)
        args = ct_int.weight_args(qt.scheme)[1]
        scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
        zp = _ct_codes_and_zero(qt)[1]
        assert zp is not None
        state = {
            "weight": torch.from_numpy(np.asarray(aq.dequantize(qt, "float32"))),
            "weight_scale": torch.from_numpy(np.asarray(qt.scales, np.float32)),
            "weight_zero_point": torch.from_numpy(zp.copy()),
        }
        out = PackedQuantizationCompressor.compress(state, scheme)
        for key, arr in out.items():
            assert same_bits(arr.numpy(), entries[f"{NAME}.{key}"]), (text, key)


def test_rounding_order_differs_only_where_adding_z_makes_a_tie() -> None:
    """compressed-tensors rounds ``x / s + z``, arrayquant ``round(x / s) + z``: 0.49999997 + 1 is 1.5 in f32."""
    below_half = np.nextafter(np.float32(0.5), np.float32(0))
    x = np.array([[below_half, 0.25, 3.0, -1.0]], np.float32)
    scale, zero = np.array([[1.0]], np.float32), np.array([[-7]], np.int8)  # z = -7 + 8 = 1 in u4 terms
    params = aq.QParams(scales=scale, zero_point=(zero.astype(np.int16) + 8).astype(np.uint8))
    qt = aq.quantize(x, "u4:block4:f32:zero_point", params)
    assert qt.codes().tolist() == [[1, 1, 4, 0]]  # round(0.49999997) = 0, then + 1
    args = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 4}
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    state = {
        "weight": torch.from_numpy(x),
        "weight_scale": torch.from_numpy(scale),
        "weight_zero_point": to_torch(zero),
    }
    out = PackedQuantizationCompressor.compress(state, scheme)
    theirs = unpack_from_int32(out["weight_packed"], 4, torch.Size((1, 4))).numpy() + 8
    assert theirs.tolist() == [[2, 1, 4, 0]]  # 0.49999997 + 1 rounds to the tie 1.5 first, then to 2


def test_int_quantized_zero_points_read_bit_for_bit() -> None:
    args = {"num_bits": 8, "type": "int", "symmetric": False, "strategy": "channel", "dynamic": False}
    for seed in range(4):
        entries = ct_quantize(sample((4, 64), seed), args, "bfloat16", fmt="int-quantized")
        assert entries[f"{NAME}.weight_zero_point"].dtype == np.int8
        assert entries[f"{NAME}.weight_zero_point"].shape == (4, 1)
        qt = ct_int.read(entries, NAME, "int-quantized", args, backend="numpy")
        assert np.array_equal(np.asarray(qt.codes()), entries[f"{NAME}.weight"])
        assert np.array_equal(np.asarray(qt.zero_point), entries[f"{NAME}.weight_zero_point"])
        got = ct_decompress(entries, "int-quantized", args)
        assert same_bits(got, cast(aq.dequantize(qt), "bfloat16"))


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


def _good() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    qt = aq.quantize(sample((3, 64), 2), "q4f:block32:bf16:zero_point")
    return ct_int.write(qt, NAME), ct_int.weight_args(qt.scheme)[1]


def test_schemes_that_do_not_map() -> None:
    for text in ("u4:block32:f16:offset", "q4_1", "u4:block32:ue8m0:zero_point", "u4:block4x32:f16:zero_point"):
        scheme = aq.QuantScheme.parse(text)
        assert ct_int.weight_args(scheme) is None, text
        with pytest.raises(aq.SchemeError, match="compressed-tensors pack-quantized does not hold the scheme"):
            ct_int.write(aq.quantize(sample((4, 64), 1), scheme), NAME)


def test_read_refuses_what_does_not_match() -> None:
    entries, args = _good()
    zk, pk = f"{NAME}.weight_zero_point", f"{NAME}.weight_packed"
    without = {k: v for k, v in entries.items() if k != zk}
    with pytest.raises(aq.CorruptDataError, match=f"the entries have no '{zk}', which a compressed-tensors"):
        ct_int.read(without, NAME, "pack-quantized", args)
    corrupt = [
        ({**entries, zk: entries[zk].view(np.uint32)}, "has dtype uint32; compressed-tensors packs group zero points"),
        ({**entries, zk: np.zeros((3, 2), np.int8)}, "has dtype int8; compressed-tensors packs group zero points"),
    ]
    for ents, msg in corrupt:
        with pytest.raises(aq.CorruptDataError, match=msg):
            ct_int.read(ents, NAME, "pack-quantized", args)
    with pytest.raises(aq.ShapeError, match=r"has shape \(2, 2\); 4-bit zero points of the \(3, 2\) scale grid"):
        ct_int.read({**entries, zk: np.zeros((2, 2), np.int32)}, NAME, "pack-quantized", args)
    with pytest.raises(aq.SchemeError, match=r"zero points of zp_dtype 'torch\.float8_e4m3fn' do not map"):
        ct_int.read(entries, NAME, "pack-quantized", {**args, "zp_dtype": "torch.float8_e4m3fn"})
    with pytest.raises(aq.CorruptDataError, match="'symmetric' must be true or false, got 'no'"):
        ct_int.read(entries, NAME, "pack-quantized", {**args, "symmetric": "no"})
    with pytest.raises(aq.SchemeError, match="value q8f does not hold 4-bit compressed-tensors codes; use q4f"):
        ct_int.read(entries, NAME, "pack-quantized", args, value="q8f")
    sym = {k: v for k, v in entries.items() if k != zk}
    with pytest.raises(aq.SchemeError, match="value u4 needs a zero point, but these weights are symmetric; use q4f"):
        ct_int.read(sym, NAME, "pack-quantized", {**args, "symmetric": True}, value="u4")
    # a -8 zero point is not in q4s's range: every zero point field 0, every code field 8 (code 0)
    lowest = {
        **entries,
        zk: np.zeros((1, 2), np.int32),
        pk: np.full(entries[pk].shape, 0x88888888, np.uint32).view(np.int32),
    }
    with pytest.raises(
        aq.CorruptDataError, match="zero point -8 at flat index 0 is outside q4s's range; read it as q4f"
    ):
        ct_int.read(lowest, NAME, "pack-quantized", args, value="q4s")
    assert ct_int.read(lowest, NAME, "pack-quantized", args).zero_point.tolist() == [[-8, -8]] * 3


def test_read_refuses_per_tensor_zero_points_out_of_range() -> None:
    qt = aq.quantize(sample((3, 64), 2), "q4f:tensor:bf16:zero_point")
    entries, args = ct_int.write(qt, NAME), ct_int.weight_args(qt.scheme)[1]
    zk = f"{NAME}.weight_zero_point"
    assert entries[zk].dtype == np.int8
    assert entries[zk].shape == (1,)
    with pytest.raises(aq.CorruptDataError, match=r"holds 9 at flat index 0, outside the 4-bit range \[-8, 7\]"):
        ct_int.read({**entries, zk: np.array([9], np.int8)}, NAME, "pack-quantized", args)
    with pytest.raises(aq.CorruptDataError, match="has dtype int32 for 4-bit zero points; compressed-tensors stores"):
        ct_int.read({**entries, zk: np.array([1], np.int32)}, NAME, "pack-quantized", args)
    with pytest.raises(aq.ShapeError, match=r"has shape \(2,\); zero points of this weight take \(1,\)"):
        ct_int.read({**entries, zk: np.array([1, 2], np.int8)}, NAME, "pack-quantized", args)


def test_zero_point_entries_in_bfloat16_models_keep_their_dtype() -> None:
    entries, _ = _good()
    assert entries[f"{NAME}.weight_scale"].dtype == NP["bfloat16"]
    assert entries[f"{NAME}.weight_zero_point"].dtype == np.int32
