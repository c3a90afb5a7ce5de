"""compressed-tensors MXFP8 / MXFP4 / FP8 (float-quantized) weights, against the real library.

(a) compressed-tensors' own compressor classes decompress what ``ct_float.write`` made, and the
result is compared with ``aq.dequantize``; (b) compressed-tensors' compressors compress float
weights with scales compressed-tensors computed itself (``calculate_qparams``), ``ct_float.read``
reads that, and ``aq.dequantize`` is compared with compressed-tensors' decompression. The
``weights`` arguments are checked against compressed-tensors' ``QuantizationArgs`` serializer and
its presets; scale rules against worked values.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

pytest.importorskip("compressed_tensors")
torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization import quant_scheme as presets  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402

import arrayquant as aq  # noqa: E402
from arrayquant.errors import CorruptDataError, ParamsError, SchemeError, ShapeError  # noqa: E402
from arrayquant.io.compressed_tensors import floats as ct_float  # noqa: E402

COMPRESSOR = {
    "mxfp8-quantized": MXFP8QuantizationCompressor,
    "mxfp4-pack-quantized": MXFP4PackedCompressor,
    "float-quantized": FloatQuantizationCompressor,
}
SCHEMES = [
    "mxfp8",
    "mxfp4",
    "e4m3:tensor:f32:native",
    "e4m3:block128x128:f32:native",
    "e4m3:block32x64:f32:native",
    "e4m3:block64:f32:native",
    "e4m3:block32:f32:native",
]
SHAPES = [(64, 128), (48, 64), (130, 256)]


def sample(shape: tuple[int, int], dist: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dist == "normal":
        x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3)
    elif dist == "heavy":
        x = rng.standard_t(2, shape)
    else:  # uniform with outliers and an all-zero row
        x = rng.uniform(-1, 1, shape)
        x.reshape(-1)[rng.integers(0, x.size, 8)] *= 300
        x[1] = 0
    return x.astype(np.float32)


def to_torch(a: np.ndarray) -> Any:
    a = np.ascontiguousarray(a)
    if a.dtype.name == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t: Any) -> np.ndarray:
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def ct_scheme(args: dict[str, Any]) -> Any:
    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))


def ct_decompress(fmt: str, args: dict[str, Any], entries: dict[str, np.ndarray]) -> np.ndarray:
    local = {k.rsplit(".", 1)[-1]: to_torch(v) for k, v in entries.items()}  # compressors take local names
    out = COMPRESSOR[fmt].decompress(local, ct_scheme(args))
    return out["weight"].float().numpy()


def ct_minmax(w: Any, args: dict[str, Any]) -> tuple[Any, Any]:
    """Per-scale min / max, shaped as compressed-tensors' weight_scale for the strategy."""
    strategy, (rows, cols) = args["strategy"], w.shape
    if strategy == "tensor":
        return w.min().reshape(1), w.max().reshape(1)
    if strategy == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    if strategy == "group":
        g = w.reshape(rows, cols // args["group_size"], args["group_size"])
        return g.amin(-1), g.amax(-1)
    h, wd = args["block_structure"]
    nr, nc = -(-rows // h), -(-cols // wd)
    padded = torch.nn.functional.pad(w, (0, nc * wd - cols, 0, nr * h - rows))  # zeros: calculate_qparams adds 0 anyway
    b = padded.reshape(nr, h, nc, wd)
    return b.amin((1, 3)), b.amax((1, 3))


# -- (a) arrayquant writes, compressed-tensors decompresses -----------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dist", ["normal", "heavy", "outliers"])
def test_ct_decompresses_what_arrayquant_wrote(scheme: str, shape: tuple[int, int], dist: str) -> None:
    qt = aq.quantize(sample(shape, dist, zlib.crc32(repr((scheme, shape, dist)).encode())), scheme)
    fmt, args = ct_float.weight_args(qt.scheme, qt.shape)
    got = ct_decompress(fmt, args, ct_float.write(qt, "m"))
    np.testing.assert_array_equal(got, np.asarray(aq.dequantize(qt)))  # bit for bit


@pytest.mark.parametrize("rule", ["round_up", "ocp"])
@pytest.mark.parametrize("preset", ["mxfp8", "mxfp4"])
def test_both_scale_rules_decode_in_ct(preset: str, rule: str) -> None:
    scheme = getattr(aq.QuantScheme, preset)().with_scale_rule(rule)
    qt = aq.quantize(sample((32, 128), "heavy", 3), scheme)
    fmt, args = ct_float.weight_args(qt.scheme)
    np.testing.assert_array_equal(ct_decompress(fmt, args, ct_float.write(qt, "")), np.asarray(aq.dequantize(qt)))


@pytest.mark.parametrize("sdt", ["bf16", "f16"])
@pytest.mark.parametrize("block", ["tensor", "block64", "block32x32"])
def test_low_precision_scales_ct_rounds_product(sdt: str, block: str) -> None:
    # compressed-tensors multiplies in the scale's dtype: its output is aq's exact f32 product rounded
    scheme = f"e4m3:{block}:{sdt}:native"
    qt = aq.quantize(sample((64, 128), "normal", 5), scheme)
    fmt, args = ct_float.weight_args(qt.scheme, qt.shape)
    entries = ct_float.write(qt, "m")
    assert entries["m.weight_scale"].dtype.name == {"bf16": "bfloat16", "f16": "float16"}[sdt]
    want = np.asarray(aq.dequantize(qt), np.float32)
    rounded = want.astype(ml_dtypes.bfloat16 if sdt == "bf16" else np.float16).astype(np.float32)
    got = ct_decompress(fmt, args, entries)
    np.testing.assert_array_equal(got, rounded)
    assert not np.array_equal(got, want)  # the rounding is real, so this test measures something


def test_entry_names_dtypes_shapes() -> None:
    x = sample((96, 128), "normal", 7)
    mx8 = ct_float.write(aq.quantize(x, "mxfp8"), "fc")
    assert {k: (v.dtype.name, v.shape) for k, v in mx8.items()} == {
        "fc.weight": ("float8_e4m3fn", (96, 128)),
        "fc.weight_scale": ("uint8", (96, 4)),
    }
    mx4 = ct_float.write(aq.quantize(x, "mxfp4"), "fc")
    assert {k: (v.dtype.name, v.shape) for k, v in mx4.items()} == {
        "fc.weight_packed": ("uint8", (96, 64)),
        "fc.weight_scale": ("uint8", (96, 4)),
    }
    fp8 = ct_float.write(aq.quantize(x, "e4m3:block128x128:f32:native"), "fc")
    assert {k: (v.dtype.name, v.shape) for k, v in fp8.items()} == {
        "fc.weight": ("float8_e4m3fn", (96, 128)),
        "fc.weight_scale": ("float32", (1, 1)),
    }
    row = ct_float.write(aq.quantize(x, "e4m3:block128:f32:native"), "")
    assert row["weight_scale"].shape == (96, 1)
    ten = ct_float.write(aq.quantize(x, "e4m3:tensor:f32:native"), "")
    assert ten["weight_scale"].shape == (1,)


def test_mxfp4_packing_order_worked() -> None:
    # row [1, -2, 0, 6, 0...]: E2M1 codes 2, 0xC, 0, 7 -> bytes 0xC2, 0x70 (element 2k in the low nibble)
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [1, -2, 0, 6]
    out = ct_float.write(aq.quantize(x, "mxfp4"), "")
    assert out["weight_packed"][0, :2].tolist() == [0xC2, 0x70]
    assert out["weight_scale"].tolist() == [[127]]  # 2^0


# -- arguments as compressed-tensors serializes them ------------------------------------------
@pytest.mark.parametrize(
    ("scheme", "shape", "preset"),
    [
        ("mxfp8", None, presets.MXFP8),
        ("mxfp4", None, presets.MXFP4),
        ("e4m3:tensor:f32:native", None, presets.FP8),
        ("e4m3:block128x128:f32:native", None, presets.FP8_BLOCK),
        ("e4m3:block256:f32:native", (64, 256), presets.FP8_DYNAMIC),
    ],
)
def test_weight_args_equal_ct_presets(scheme: str, shape: Any, preset: dict[str, Any]) -> None:
    _, args = ct_float.weight_args(aq.QuantScheme.parse(scheme), shape)
    assert args == preset["weights"].model_dump()
    assert QuantizationArgs(**args).model_dump() == args  # round-trips through the parser


def test_weight_args_group_and_format_names() -> None:
    fmt, args = ct_float.weight_args(aq.QuantScheme.parse("e4m3:block64:bf16:native"), (8, 128))
    assert fmt == "float-quantized"
    assert (args["strategy"], args["group_size"]) == ("group", 64)
    assert ct_float.weight_args(aq.QuantScheme.mxfp8().with_scale_rule("ocp"))[0] == "mxfp8-quantized"
    assert ct_float.weight_args(aq.QuantScheme.mxfp4())[0] == "mxfp4-pack-quantized"


@pytest.mark.parametrize(
    "scheme",
    ["q8s", "nvfp4", "e4m3:block16:ue8m0:native", "e4m3:block32:f16:tensor:f32:native", "e4m3", "e5m2:tensor:f32"],
)
def test_unmapped_schemes(scheme: str) -> None:
    s = aq.QuantScheme.parse(scheme)
    assert ct_float.weight_args(s) is None
    qt = aq.quantize(sample((4, 64), "normal", 1), s)
    with pytest.raises(SchemeError, match="no compressed-tensors float layout; the schemes that map are: mxfp8"):
        ct_float.write(qt, "w")


# -- (b) compressed-tensors compresses, arrayquant reads --------------------------------------
CT_ARGS = {
    "mxfp8": presets.MXFP8["weights"].model_dump(),
    "mxfp4": presets.MXFP4["weights"].model_dump(),
    "tensor": presets.FP8["weights"].model_dump(),
    "channel": presets.FP8_DYNAMIC["weights"].model_dump(),
    "block": presets.FP8_BLOCK["weights"].model_dump(),
    "group": {**presets.FP8["weights"].model_dump(), "strategy": "group", "group_size": 64},
}
FMT = {"mxfp8": "mxfp8-quantized", "mxfp4": "mxfp4-pack-quantized"}


@pytest.mark.parametrize("kind", list(CT_ARGS))
@pytest.mark.parametrize("shape", [(64, 128), (200, 320)])
@pytest.mark.parametrize("dist", ["normal", "heavy", "outliers"])
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
def test_arrayquant_reads_what_ct_compressed(kind: str, shape: tuple[int, int], dist: str, wdtype: str) -> None:
    args = CT_ARGS[kind]
    fmt = FMT.get(kind, "float-quantized")
    w = torch.from_numpy(sample(shape, dist, 11)).to(getattr(torch, wdtype))
    mn, mx = ct_minmax(w, args)
    scale, _ = calculate_qparams(mn, mx, QuantizationArgs(**args))
    scheme = ct_scheme(args)
    compressed = COMPRESSOR[fmt].compress({"weight": w, "weight_scale": scale}, scheme)
    entries = {f"l.{k}": to_numpy(v) for k, v in compressed.items()}
    ct_out = COMPRESSOR[fmt].decompress(dict(compressed), scheme)["weight"]
    qt = ct_float.read(entries, "l", fmt, args)
    got = np.asarray(aq.dequantize(qt), np.float32)
    if ct_out.dtype == torch.float32:
        np.testing.assert_array_equal(got, ct_out.numpy())
    else:  # bf16 arithmetic in compressed-tensors: aq's exact f32 product rounded to bf16
        np.testing.assert_array_equal(got.astype(ml_dtypes.bfloat16).astype(np.float32), ct_out.float().numpy())
    # and written back, compressed-tensors' entries come out byte for byte
    again = ct_float.write(qt, "l")
    assert again.keys() == entries.keys()
    for k, v in entries.items():
        np.testing.assert_array_equal(again[k].view(np.uint8), np.ascontiguousarray(v).view(np.uint8))


# -- scale rules, worked values ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("bits", "amax", "ct_code", "round_up", "ocp"),
    [
        (4, 6.5, 127, 128, 127),  # CT: 1.625 * 2^2 keeps 2^2 -> scale 1, 6.5 clips to 6
        (4, 7.5, 128, 128, 127),  # CT rounds 1.875 up to 2^3 -> scale 2
        (4, 6.0, 127, 127, 127),
        (8, 448.0, 128, 127, 127),  # CT: 1.75 * 2^8 rounds up to 2^9 -> scale 2; aq fits 448 at scale 1
        (8, 300.0, 127, 127, 127),
    ],
)
def test_mx_scale_rules(bits: int, amax: float, ct_code: int, round_up: int, ocp: int) -> None:
    args = CT_ARGS["mxfp8" if bits == 8 else "mxfp4"]
    m = torch.tensor([[amax]], dtype=torch.bfloat16)
    scale, _ = calculate_qparams(-m, m, QuantizationArgs(**args))
    assert MXFP8QuantizationCompressor._compress_scale(scale, QuantizationArgs(**args)).item() == ct_code
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = amax
    base = aq.QuantScheme.mxfp8() if bits == 8 else aq.QuantScheme.mxfp4()
    for rule, code in (("round_up", round_up), ("ocp", ocp)):
        qt = aq.quantize(x, base.with_scale_rule(rule))
        assert ct_float.write(qt, "")["weight_scale"].tolist() == [[code]]


# -- errors ----------------------------------------------------------------------------------
def _mx8() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    qt = aq.quantize(sample((4, 64), "normal", 2), "mxfp8")
    return ct_float.write(qt, "w"), CT_ARGS["mxfp8"]


def test_read_errors() -> None:
    entries, args = _mx8()
    with pytest.raises(CorruptDataError, match=r"no 'w.weight_scale'"):
        ct_float.read({"w.weight": entries["w.weight"]}, "w", "mxfp8-quantized", args)
    bad = dict(entries, **{"w.weight_scale": np.full((4, 2), 255, np.uint8)})
    with pytest.raises(CorruptDataError, match=r"0xFF .* not a UE8M0 scale"):
        ct_float.read(bad, "w", "mxfp8-quantized", args)
    bad = dict(entries, **{"w.weight_scale": entries["w.weight_scale"].astype(np.float32)})
    with pytest.raises(CorruptDataError, match="stores E8M0 scales as U8"):
        ct_float.read(bad, "w", "mxfp8-quantized", args)
    bad = dict(entries, **{"w.weight_scale": entries["w.weight_scale"][:, :1]})
    with pytest.raises(ShapeError, match=r"has shape \(4, 1\), but .* takes \(4, 2\)"):
        ct_float.read(bad, "w", "mxfp8-quantized", args)
    nan = entries["w.weight"].view(np.uint8).copy()
    nan[0, 3] = 0x7F
    with pytest.raises(CorruptDataError, match="0x7F at flat index 3 is an E4M3 NaN"):
        ct_float.read(dict(entries, **{"w.weight": nan}), "w", "mxfp8-quantized", args)
    with pytest.raises(CorruptDataError, match="stores it as F8_E4M3"):
        ct_float.read(dict(entries, **{"w.weight": np.zeros((4, 64), np.float32)}), "w", "mxfp8-quantized", args)
    with pytest.raises(SchemeError, match="takes num_bits 8, strategy 'group', group_size 32"):
        ct_float.read(entries, "w", "mxfp8-quantized", dict(args, group_size=16))
    with pytest.raises(SchemeError, match="not one of this module's"):
        ct_float.read(entries, "w", "pack-quantized", args)
    with pytest.raises(SchemeError, match="must be symmetric, static float"):
        ct_float.read(entries, "w", "mxfp8-quantized", dict(args, symmetric=False))


def test_read_float_errors() -> None:
    entries = {"weight": np.zeros((4, 64), ml_dtypes.float8_e4m3fn), "weight_scale": np.array([-1.0], np.float32)}
    with pytest.raises(CorruptDataError, match=r"holds -1.0 at flat index 0; scales must be positive and finite"):
        ct_float.read(entries, "", "float-quantized", CT_ARGS["tensor"])
    entries["weight_scale"] = np.array([1], np.int32)
    with pytest.raises(CorruptDataError, match="float32, float16 or bfloat16"):
        ct_float.read(entries, "", "float-quantized", CT_ARGS["tensor"])
    entries["weight_scale"] = np.ones((4, 1), np.float32)
    with pytest.raises(SchemeError, match="strategy 'token' has no arrayquant scheme"):
        ct_float.read(entries, "", "float-quantized", dict(CT_ARGS["tensor"], strategy="token"))
    with pytest.raises(SchemeError, match="needs block_structure"):
        ct_float.read(entries, "", "float-quantized", dict(CT_ARGS["block"], block_structure=None))
    with pytest.raises(ShapeError, match="not a multiple of the group of 48"):
        ct_float.read(entries, "", "float-quantized", dict(CT_ARGS["group"], group_size=48))
    with pytest.raises(SchemeError, match=r"FP8 \(num_bits 8\); the config says num_bits 4"):
        ct_float.read(entries, "", "float-quantized", dict(CT_ARGS["tensor"], num_bits=4))


def test_write_errors() -> None:
    with pytest.raises(ParamsError, match=r"must be an aq.QuantizedTensor, got ndarray"):
        ct_float.write(np.zeros(3), "w")  # type: ignore[arg-type]
    qt = aq.quantize(sample((4, 48), "normal", 1), "mxfp8")
    with pytest.raises(ShapeError, match=r"groups of 32 needs the last axis to be a multiple of 32"):
        ct_float.write(qt, "w")
    qt = aq.quantize(np.ones((2, 2, 32), np.float32), "mxfp8")
    with pytest.raises(ShapeError, match="which are rank 2"):
        ct_float.write(qt, "w")
