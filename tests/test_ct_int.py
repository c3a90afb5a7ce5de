"""Integer compressed-tensors formats (``pack-quantized``, ``int-quantized``) against compressed-tensors itself.

The oracle is the installed compressed-tensors: its ``PackedQuantizationCompressor`` /
``IntQuantizationCompressor`` (compress and decompress), its ``pack_to_int32`` /
``unpack_from_int32`` and its observer arithmetic (``calculate_qparams``). compressed-tensors
dequantizes in the scale dtype (``code.to(scale.dtype) * scale``), so arrayquant's f32 result is
compared after a cast to that dtype, bit for bit (see arrayquant/io/ct_int.py).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

ct = pytest.importorskip("compressed_tensors")
torch = pytest.importorskip("torch")

from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402

import arrayquant as aq  # noqa: E402
from arrayquant.io.compressed_tensors import ints as ct_int  # noqa: E402

NAME = "model.layers.0.mlp.down_proj"
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
SCALE_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def to_torch(a: np.ndarray) -> Any:
    if a.dtype == NP["bfloat16"]:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a).copy())


def to_numpy(t: Any) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def sample(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Normal, uniform, heavy-tailed and tiny/huge magnitudes; one all-zero row and exact ties."""
    rng = np.random.default_rng(seed)
    kind = seed % 4
    if kind == 0:
        x = rng.standard_normal(shape)
    elif kind == 1:
        x = rng.uniform(-1, 1, shape)
    elif kind == 2:
        x = rng.standard_t(2, shape)
    else:
        x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-20, 20, (shape[0], 1))
    x = x.astype(np.float32)
    x[0] = 0
    if shape[0] > 2:
        x[1, :4] = [0.5, -0.5, 1.5, -2.5]  # halves: ties go to even in both
    return x


def ct_decompress(entries: dict[str, np.ndarray], fmt: str, args: dict[str, Any]) -> np.ndarray:
    """compressed-tensors' own decompression of these entries (local names, torch tensors)."""
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    sd = {k.removeprefix(NAME + "."): to_torch(v) for k, v in entries.items()}
    comp = PackedQuantizationCompressor if fmt == "pack-quantized" else IntQuantizationCompressor
    return to_numpy(comp.decompress(sd, scheme)["weight"])


def ct_quantize(x: np.ndarray, args: dict[str, Any], dt: str, fmt: str = "pack-quantized") -> dict[str, np.ndarray]:
    """compressed-tensors' own observer scales (model dtype ``dt``) and compressor, from float weights."""
    if dt == "float16":  # a float16 model holds finite float16 weights
        x = np.clip(x, -60000, 60000)
    w = torch.from_numpy(x).to(TORCH[dt])
    qargs = QuantizationArgs(**args)
    if qargs.strategy == "group":
        g = w.reshape(w.shape[0], -1, qargs.group_size)
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    elif qargs.strategy == "channel":
        lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    else:
        lo, hi = w.min().reshape(1), w.max().reshape(1)
    scale, zp = calculate_qparams(lo, hi, qargs)
    sd = {"weight": w, "weight_scale": scale.to(TORCH[dt]), "weight_zero_point": zp}
    if fmt == "pack-quantized":
        scheme = QuantizationScheme(targets=["Linear"], weights=qargs)
        out = PackedQuantizationCompressor.compress(sd, scheme)
    else:
        scheme = QuantizationScheme(targets=["Linear"], weights=qargs, input_activations=QuantizationArgs(num_bits=8))
        out = IntQuantizationCompressor.compress(sd, scheme)
    return {f"{NAME}.{k}": to_numpy(v) for k, v in out.items()}


def cast(a: Any, dt: str) -> np.ndarray:
    """arrayquant's f32 result rounded to compressed-tensors' scale dtype (overflow to inf, as torch does)."""
    with np.errstate(over="ignore"):
        return np.asarray(a, np.float32).astype(NP[dt])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    return a.tobytes() == b.tobytes()


CASES = [  # (value, block or None for per-tensor, scale dtype, shape)
    ("q4s", 32, "bf16", (4, 64)),
    ("q4f", 128, "f16", (3, 256)),
    ("q4s", 12, "f32", (3, 36)),
    ("q8s", 64, "bf16", (5, 128)),
    ("q8f", 16, "f32", (2, 48)),
    ("q8s", 36, "f16", (3, 36)),  # per-row, 36 columns: 9 words per row
    ("q2s", 16, "f32", (4, 48)),
    ("q2f", 40, "bf16", (3, 40)),  # per-row, 40 columns: 3 words, 8 padding fields
    ("q4s", 96, "f32", (6, 96)),  # per-row
    ("q8s", None, "f32", (3, 64)),
    ("q4f", None, "bf16", (2, 32)),
]


def scheme_of(value: str, block: int | None, sdt: str) -> aq.QuantScheme:
    s = aq.QuantScheme().with_value(value)
    return s.per_tensor(sdt) if block is None else s.per_block(block, sdt)


# ---------------------------------------------------------------------------------------------
# (a) arrayquant -> compressed-tensors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "block", "sdt", "shape"), CASES)
def test_ct_decompresses_what_arrayquant_writes_bit_for_bit(
    value: str, block: int | None, sdt: str, shape: Any
) -> None:
    scheme = scheme_of(value, block, sdt)
    fmt, args = ct_int.weight_args(scheme, shape=shape)
    assert fmt == "pack-quantized"
    QuantizationArgs(**args)  # compressed-tensors accepts the arguments as written
    for seed in range(8):
        x = sample(shape, seed)
        qt = aq.quantize(x, scheme)
        entries = ct_int.write(qt, NAME)
        assert sorted(entries) == [f"{NAME}.weight_packed", f"{NAME}.weight_scale", f"{NAME}.weight_shape"]
        packed = entries[f"{NAME}.weight_packed"]
        assert packed.dtype == np.int32
        assert packed.shape == (shape[0], -(-shape[1] * args["num_bits"] // 32))
        assert entries[f"{NAME}.weight_shape"].dtype == np.int64
        assert entries[f"{NAME}.weight_shape"].tolist() == list(shape)
        scale = entries[f"{NAME}.weight_scale"]
        assert scale.dtype == NP[SCALE_DT[sdt]]
        # the codes, as compressed-tensors' own unpacker reads them
        codes = unpack_from_int32(torch.from_numpy(packed), args["num_bits"], torch.Size(shape)).numpy()
        assert np.array_equal(codes, np.asarray(qt.codes()))
        # the words, as compressed-tensors' own packer writes them
        want = pack_to_int32(torch.from_numpy(np.asarray(qt.codes()).astype(np.int8)), args["num_bits"]).numpy()
        assert same_bits(packed, want)
        got = ct_decompress(entries, fmt, args)
        mine = cast(aq.dequantize(qt), SCALE_DT[sdt])
        assert same_bits(got, mine), f"seed {seed}"


def test_per_row_and_group_of_all_columns_store_the_same_and_decode_alike() -> None:
    scheme = aq.QuantScheme().with_value("q4s").per_block(64, "bf16")
    qt = aq.quantize(sample((4, 64), 3), scheme)
    _, channel = ct_int.weight_args(scheme, shape=(4, 64))
    _, group = ct_int.weight_args(scheme)
    assert (channel["strategy"], channel["group_size"]) == ("channel", None)
    assert (group["strategy"], group["group_size"]) == ("group", 64)
    entries = ct_int.write(qt, NAME)
    assert same_bits(ct_decompress(entries, "pack-quantized", channel), ct_decompress(entries, "pack-quantized", group))


def test_weight_args_are_what_compressed_tensors_dumps() -> None:
    import torch as t

    _, args = ct_int.weight_args(aq.QuantScheme().with_value("q4f").per_block(128, "bf16"))
    want = QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=128, scale_dtype=t.bfloat16
    )
    assert args == want.model_dump(mode="json")
    _, args = ct_int.weight_args(aq.QuantScheme().with_value("q8s"))
    assert args == QuantizationArgs(num_bits=8, strategy="tensor", scale_dtype=t.float32).model_dump(mode="json")


def test_eight_bit_words_hold_code_plus_128_low_byte_first() -> None:
    """Worked value: codes [-128, 127, 0, 1] + 128 = bytes 00 FF 80 81, little-endian in one int32."""
    scheme = aq.QuantScheme().with_value("q8f").per_block(4)
    codes = np.array([[-128, 127, 0, 1]], np.int8)
    qt = aq.QuantizedTensor(scheme, (1, 4), np.float32, aq.pack(codes, scheme), np.array([[0.5]], np.float32))
    packed = ct_int.write(qt, "")["weight_packed"]
    assert packed.view(np.uint32).tolist() == [[0x8180FF00]]


# ---------------------------------------------------------------------------------------------
# (b) compressed-tensors -> arrayquant
# ---------------------------------------------------------------------------------------------

CT_ARGS = [  # (args, model/scale dtype, shape)
    ({"num_bits": 4, "strategy": "group", "group_size": 32}, "bfloat16", (4, 128)),
    ({"num_bits": 4, "strategy": "group", "group_size": 128}, "float16", (3, 256)),
    ({"num_bits": 4, "strategy": "channel"}, "float32", (5, 72)),
    ({"num_bits": 8, "strategy": "channel"}, "bfloat16", (4, 64)),
    ({"num_bits": 8, "strategy": "group", "group_size": 16}, "float32", (3, 48)),
    ({"num_bits": 2, "strategy": "group", "group_size": 16}, "float16", (4, 48)),
    ({"num_bits": 2, "strategy": "channel"}, "float32", (2, 40)),
    ({"num_bits": 8, "strategy": "tensor"}, "float32", (3, 64)),
]


@pytest.mark.parametrize(("args", "dt", "shape"), CT_ARGS)
def test_arrayquant_reads_what_ct_compresses_bit_for_bit(args: dict[str, Any], dt: str, shape: Any) -> None:
    full = {"num_bits": 4, "type": "int", "symmetric": True, "dynamic": False, **args}
    saw_min = False
    for seed in range(8):
        entries = ct_quantize(sample(shape, seed), full, dt)
        assert sorted(entries) == [f"{NAME}.weight_packed", f"{NAME}.weight_scale", f"{NAME}.weight_shape"]
        qt = ct_int.read(entries, NAME, "pack-quantized", full, backend="numpy")
        bits = full["num_bits"]
        assert qt.scheme.value is {8: aq.QuantValue.Q8F, 4: aq.QuantValue.Q4F, 2: aq.QuantValue.Q2F}[bits]
        assert qt.shape == shape
        ct_codes = unpack_from_int32(
            torch.from_numpy(entries[f"{NAME}.weight_packed"]), bits, torch.Size(shape)
        ).numpy()
        assert np.array_equal(np.asarray(qt.codes()), ct_codes)
        saw_min |= bool(np.any(ct_codes == -(1 << (bits - 1))))
        got = ct_decompress(entries, "pack-quantized", full)
        assert qt.dtype == NP[dt] or dt == "bfloat16"  # the scale dtype, CT's weight dtype (NumPy: f32 for bf16)
        mine = cast(aq.dequantize(qt, "float32"), dt)
        assert same_bits(got, mine), f"seed {seed}"
        # and back: arrayquant writes the same entries compressed-tensors did
        again = ct_int.write(qt, NAME)
        for key, arr in entries.items():
            assert same_bits(again[key], arr), key
    assert saw_min  # compressed-tensors' observer uses the -2**(bits-1) code, hence the full-range value


def test_int_quantized_w8a8_weights_read_bit_for_bit() -> None:
    args = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
    for seed in range(4):
        entries = ct_quantize(sample((4, 64), seed), args, "bfloat16", fmt="int-quantized")
        assert sorted(entries) == [f"{NAME}.weight", f"{NAME}.weight_scale"]
        assert entries[f"{NAME}.weight"].dtype == np.int8
        qt = ct_int.read(entries, NAME, "int-quantized", args, backend="numpy")
        assert np.array_equal(np.asarray(qt.codes()), entries[f"{NAME}.weight"])
        got = ct_decompress(entries, "int-quantized", args)
        assert same_bits(got, cast(aq.dequantize(qt), "bfloat16"))


def test_read_as_the_symmetric_value_when_asked() -> None:
    scheme = aq.QuantScheme().with_value("q4s").per_block(32, "f16")
    qt = aq.quantize(sample((3, 64), 5), scheme)
    _, args = ct_int.weight_args(scheme)
    back = ct_int.read(ct_int.write(qt, NAME), NAME, "pack-quantized", args, value="q4s", backend="numpy")
    assert back.scheme == scheme
    assert np.array_equal(np.asarray(back.codes()), np.asarray(qt.codes()))
    assert np.array_equal(np.asarray(back.scales), np.asarray(qt.scales))
    entries = ct_quantize(sample((3, 64), 0), {**args, "scale_dtype": None}, "float16")
    with pytest.raises(aq.CorruptDataError, match=r"code -8 at flat index \d+ is outside q4s's range; read it as q4f"):
        ct_int.read(entries, NAME, "pack-quantized", args, value="q4s")
    with pytest.raises(aq.SchemeError, match="value q8s does not hold 4-bit compressed-tensors codes; use q4f"):
        ct_int.read(entries, NAME, "pack-quantized", args, value="q8s")


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme",
    [
        aq.QuantScheme.nvfp4(),
        aq.QuantScheme.mxfp4(),
        aq.QuantScheme.nf4(),
        aq.QuantScheme().with_value("q4s").per_block((4, 32)),  # 2-D block
        aq.QuantScheme().with_value("q4s").per_block(32, "ue8m0"),
        aq.QuantScheme().with_value("q8s").per_block(32, "f16").per_tensor("f32"),  # two-level
        aq.QuantScheme().with_value("e4m3").per_block(32),
    ],
)
def test_schemes_that_do_not_map(scheme: aq.QuantScheme) -> None:
    assert ct_int.weight_args(scheme) is None
    qt = aq.quantize(sample((4, 64), 1), scheme)
    with pytest.raises(aq.SchemeError, match="compressed-tensors pack-quantized does not hold the scheme"):
        ct_int.write(qt, NAME)


def test_write_refuses_bad_inputs() -> None:
    with pytest.raises(aq.ParamsError, match=r"qt must be an aq\.QuantizedTensor, got ndarray"):
        ct_int.write(np.zeros((2, 2)), NAME)  # type: ignore[arg-type]
    scheme = aq.QuantScheme().with_value("q4s").per_block(32)
    with pytest.raises(aq.ShapeError, match=r"shape \(2, 3, 64\): compressed-tensors pack-quantized stores 2-D"):
        ct_int.write(aq.quantize(np.ones((2, 3, 64), np.float32), scheme), NAME)
    with pytest.raises(aq.ShapeError, match="multiple of the group size 32"):
        ct_int.write(aq.quantize(np.ones((2, 48), np.float32), scheme), NAME)


def good() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    scheme = aq.QuantScheme().with_value("q4s").per_block(32, "bf16")
    qt = aq.quantize(sample((3, 64), 2), scheme)
    return ct_int.write(qt, NAME), ct_int.weight_args(scheme)[1]


def test_read_refuses_formats_and_arguments_that_do_not_map() -> None:
    entries, args = good()
    cases = [
        ("float-quantized", args, "format 'float-quantized' is not an integer compressed-tensors format"),
        ("pack-quantized", {**args, "type": "float"}, "weights of type 'float' with 4 bits do not map"),
        ("pack-quantized", {**args, "num_bits": 9}, "weights of type 'int' with 9 bits do not map"),
        ("pack-quantized", {**args, "num_bits": 0}, "with 0 bits do not map; arrayquant holds int weights of 1 to 8"),
        ("pack-quantized", {**args, "num_bits": 1}, r"1-bit symmetric weights \(codes -1 and 0\) have no arrayquant"),
        ("pack-quantized", {**args, "dynamic": True}, "dynamic weight quantization stores no scales"),
        ("pack-quantized", {**args, "strategy": "block"}, "strategy 'block' does not map"),
    ]
    for fmt, a, msg in cases:
        with pytest.raises(aq.SchemeError, match=msg):
            ct_int.read(entries, NAME, fmt, a)
    with pytest.raises(aq.CorruptDataError, match="strategy 'group' needs a positive integer group_size, got 0"):
        ct_int.read(entries, NAME, "pack-quantized", {**args, "group_size": 0})


def test_read_refuses_inconsistent_entries() -> None:
    entries, args = good()
    pk, sk, shk = (f"{NAME}.{p}" for p in ("weight_packed", "weight_scale", "weight_shape"))

    def bad(change: dict[str, Any], drop: str | None = None) -> dict[str, Any]:
        out = {**entries, **change}
        if drop:
            del out[drop]
        return out

    corrupt = [
        (bad({}, drop=sk), f"the entries have no '{sk}', which a compressed-tensors pack-quantized weight"),
        (bad({}, drop=shk), f"the entries have no '{shk}'"),
        (bad({pk: entries[pk].view(np.uint32)}), f"entry '{pk}' has dtype uint32; compressed-tensors packs into int32"),
        (bad({shk: np.array([3, 64, 1])}), r"it must be 2 integers \(rows, cols\)"),
        (bad({sk: entries[sk].astype(np.float64)}), "has dtype float64; compressed-tensors integer scales are float32"),
        (bad({sk: -entries[sk]}), "scales must be finite and >= 0"),
        (bad({f"{NAME}.weight_zero_point": np.zeros((3, 2), np.int8)}), "is present, but the arguments say symmetric"),
    ]
    for ents, msg in corrupt:
        with pytest.raises(aq.CorruptDataError, match=msg):
            ct_int.read(ents, NAME, "pack-quantized", args)
    with pytest.raises(
        aq.CorruptDataError, match=r"is bfloat16, but the arguments declare scale_dtype 'torch\.float16'"
    ):
        ct_int.read(entries, NAME, "pack-quantized", {**args, "scale_dtype": "torch.float16"})
    shapes = [
        (bad({shk: np.array([3, 72])}), r"says \(3, 72\), which 4-bit packing stores as \(3, 9\)"),
        (bad({sk: entries[sk][:, :1]}), r"strategy 'group' on \(3, 64\) takes \(3, 2\)"),
    ]
    for ents, msg in shapes:
        with pytest.raises(aq.ShapeError, match=msg):
            ct_int.read(ents, NAME, "pack-quantized", args)
    with pytest.raises(aq.ShapeError, match=r"weight of shape \(3, 64\) cannot be split into groups of 24"):
        ct_int.read(entries, NAME, "pack-quantized", {**args, "group_size": 24})
    w8 = {f"{NAME}.weight": np.zeros((2, 4), np.int16), sk: np.ones((2, 1), np.float32)}
    a8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    with pytest.raises(aq.CorruptDataError, match="has dtype int16 for 8-bit weights; int-quantized stores"):
        ct_int.read(w8, NAME, "int-quantized", a8)


def test_float16_overflow_is_inf_in_ct_and_saturates_in_arrayquant() -> None:
    """The one measured difference: CT's f16 product code * scale overflows to inf; aq's f16 cast saturates."""
    args = {"num_bits": 2, "type": "int", "symmetric": True, "strategy": "channel"}
    entries = {
        f"{NAME}.weight_packed": ct_int._pack_rows(np.array([[0, 3, 1, 2]], np.uint8), 2),  # codes -2, 1, -1, 0
        f"{NAME}.weight_scale": np.array([[40000]], np.float16),
        f"{NAME}.weight_shape": np.array([1, 4]),
    }
    assert entries[f"{NAME}.weight_packed"].view(np.uint32).tolist() == [[0b10_01_11_00]]  # codes + 2, low first
    got = ct_decompress(entries, "pack-quantized", args)
    assert got.tolist() == [[-np.inf, 40000, -40000, 0]]
    qt = ct_int.read(entries, NAME, "pack-quantized", args, backend="numpy")
    assert qt.dtype == np.float16
    assert np.asarray(aq.dequantize(qt)).tolist() == [[-65504, 40000, -40000, 0]]
    assert same_bits(got, cast(aq.dequantize(qt, "float32"), "float16"))
