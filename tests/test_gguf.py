"""GGUF files: read, written and re-quantized, checked against gguf-py (llama.cpp's own Python package).

Files are made by gguf-py's ``GGUFWriter`` with ``gguf.quants.quantize`` and read by arrayquant;
what arrayquant writes is read back by gguf-py's ``GGUFReader`` and ``gguf.quants.dequantize``.
Values are compared bit for bit.
"""

from __future__ import annotations

import os
import struct
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import (
    CorruptDataError,
    DTypeError,
    NonFiniteInputError,
    ParamsError,
    QuantizationError,
    SchemeError,
    ShapeError,
)
from arrayquant.fused import ggml_blocks
from arrayquant.io import gguf as G
from arrayquant.io.gguf import types as gguf_types
from arrayquant.io.gguf.writer import ARRAY_TYPES

gguf = pytest.importorskip("gguf")
ml_dtypes = pytest.importorskip("ml_dtypes")

GT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType
# every type gguf-py can quantize, as the issue lists them
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4", "BF16")


def _bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def _write(
    path: Path,
    tensors: list[tuple[str, np.ndarray, str]],
    kv: list[tuple[str, Any, Any, Any]] = (),
    arch: str = "llama",
) -> None:  # type: ignore[assignment]
    """A GGUF file by gguf-py: tensors (name, float data, GGUF type) quantized by gguf.quants.

    uint8 data of a quantized type is taken as that type's bytes, as they are (rows of blocks).
    """
    w = gguf.GGUFWriter(str(path), arch)
    for key, value, vtype, sub in kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, data, type_name in tensors:
        qtype = GT[type_name]
        if type_name in ("F32", "F16", "F64", "I8", "I16", "I32", "I64"):
            w.add_tensor(name, data)
        elif data.dtype == np.uint8:
            w.add_tensor(name, data, raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _as_floats(value: Any) -> np.ndarray:
    if isinstance(value, aq.QuantizedTensor):
        return np.asarray(aq.dequantize(value), np.float32)
    return np.asarray(value).astype(np.float32)


def _block(type_name: str) -> int:
    return gguf.GGML_QUANT_SIZES[GT[type_name]][0]


SHAPES = [(2, 1), (3, 4, 2), (6,)]  # in blocks of the type: (rows..., blocks per row)


def _iq2_xxs(rng: np.random.Generator, rows: int, blocks: int) -> np.ndarray:
    """IQ2_XXS bytes (a vector codebook, no arrayquant scheme): grid indices at random, f16 d = 0.01."""
    raw = rng.integers(0, 256, (rows, blocks, 66), dtype=np.uint8)
    raw[..., :2] = np.array([0.01], "<f2").view(np.uint8)  # block_iq2_xxs: d, then qs[32] (uint16)
    return raw.reshape(rows, blocks * 66)


def _negative_d(raw: np.ndarray, type_name: str, block: int) -> np.ndarray:
    """gguf-py's bytes with block ``block``'s f16 d (its first two bytes) negated: no arrayquant tensor."""
    size = gguf.GGML_QUANT_SIZES[GT[type_name]][1]
    out = raw.copy().reshape(-1, size)
    out[block, 1] |= 0x80  # the f16 sign bit
    return out.reshape(raw.shape)


def _data(rng: np.random.Generator, type_name: str, shape_in_blocks: tuple[int, ...]) -> np.ndarray:
    shape = (*shape_in_blocks[:-1], shape_in_blocks[-1] * _block(type_name))
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(rng.uniform(0.01, 10))
    flat = x.reshape(-1)
    flat[: min(64, flat.size)] = 0.0  # an all-zero block, where scales are 0
    return x


# ---------------------------------------------------------------------------------------------
# files written by gguf-py, read by arrayquant


@pytest.mark.parametrize("type_name", QUANTIZABLE)
@pytest.mark.parametrize("blocks", SHAPES)
def test_gguf_py_files_read_bit_for_bit(tmp_path: Path, type_name: str, blocks: tuple[int, ...]) -> None:
    rng = np.random.default_rng([QUANTIZABLE.index(type_name), SHAPES.index(blocks)])
    x = _data(rng, type_name, blocks)
    path = tmp_path / "m.gguf"
    _write(path, [("w.weight", x, type_name), ("b", x.reshape(-1)[:7].copy(), "F32")])
    reader = gguf.GGUFReader(str(path))
    expected = gguf.quants.dequantize(np.asarray(reader.tensors[0].data), GT[type_name])
    items = list(G.iter_tensors(path))
    assert [(n, note == "") for n, _, note in items][1] == ("b", True)
    name, value, note = items[0]
    assert name == "w.weight"
    got = _as_floats(value)
    assert got.shape == x.shape
    np.testing.assert_array_equal(_bits(got), _bits(expected))
    if type_name == "BF16":
        assert value.dtype == ml_dtypes.bfloat16
        assert note == ""
    elif isinstance(value, aq.QuantizedTensor):
        assert type_name in gguf_types.EXACT
        assert note == ""
        assert str(value.scheme) == str(gguf_types.scheme_of(type_name))
    else:
        assert note.startswith(f"{type_name} read as float32 values: ")
        assert value.dtype == np.float32
    loaded = G.load(path, backend="numpy")
    assert list(loaded) == ["w.weight", "b"]
    np.testing.assert_array_equal(_bits(_as_floats(loaded["w.weight"])), _bits(expected))


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4"])
def test_exact_types_come_as_quantized_tensors(tmp_path: Path, type_name: str) -> None:
    # no all-zero block; for Q4_0 a negative extreme in every block: ggml writes d = max / -8, so a
    # positive extreme gives d < 0 with q = 0, which no arrayquant code matches (read as floats)
    rng = np.random.default_rng(40 + len(type_name))
    x = rng.uniform(0.5, 2.0, (3, 2 * _block(type_name))).astype(np.float32)
    x *= -1 if type_name in ("Q4_0", "Q5_0") else rng.choice([-1, 1], (3, 1)).astype(np.float32)
    path = tmp_path / "e.gguf"
    _write(path, [("w", x, type_name)])
    ((_, value, note),) = list(G.iter_tensors(path))
    assert isinstance(value, aq.QuantizedTensor)
    assert note == ""
    assert str(value.scheme) == str(gguf_types.scheme_of(type_name))
    raw = np.asarray(gguf.GGUFReader(str(path)).tensors[0].data)
    np.testing.assert_array_equal(_bits(aq.dequantize(value)), _bits(gguf.quants.dequantize(raw, GT[type_name])))


def test_types_not_schemes_say_why(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    path = tmp_path / "m.gguf"
    q41 = _negative_d(gguf.quants.quantize(_data(rng, "Q4_1", (2, 2)), GT.Q4_1), "Q4_1", 3)
    d = float(q41.reshape(4, 20)[3, :2].view("<f2")[0])
    assert d < 0
    _write(path, [("a", q41, "Q4_1"), ("b", _iq2_xxs(rng, 2, 1), "IQ2_XXS")])
    items = list(G.iter_tensors(path))
    assert {n: note for n, _, note in items} == {
        "a": f"Q4_1 read as float32 values: Q4_1 block 3 (row (1,), block 1 of the row) has d = {d}: arrayquant's "
        "offset-mode scales are >= 0 (ggml writes d = (max - min) / qmax, never negative)",
        "b": "IQ2_XXS read as float32 values: its blocks are not an arrayquant scheme",
    }
    reader = gguf.GGUFReader(str(path))
    for (_, value, _), t in zip(items, reader.tensors, strict=True):
        assert not isinstance(value, aq.QuantizedTensor)
        np.testing.assert_array_equal(_bits(value), _bits(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "int16", "int32", "int64"])
def test_plain_types_are_arrays_of_their_dtype(tmp_path: Path, dtype: str) -> None:
    x = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    path = tmp_path / "p.gguf"
    _write(
        path, [("t", x, {"float32": "F32", "float16": "F16", "float64": "F64"}.get(dtype, dtype.replace("int", "I")))]
    )
    ((name, value, note),) = list(G.iter_tensors(path))
    assert (name, note, value.dtype, value.shape) == ("t", "", np.dtype(dtype), x.shape)
    np.testing.assert_array_equal(value, x)


def test_type_gguf_py_cannot_dequantize_is_a_scheme_error(tmp_path: Path) -> None:
    # Q8_1 is a ggml type (block 32, 36 bytes) that gguf-py cannot turn into values
    path = tmp_path / "q81.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("x", np.zeros((2, 40), np.uint8), raw_dtype=GT.Q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(SchemeError, match=r"tensor 'x' is Q8_1, which gguf-py cannot dequantize"):
        list(G.iter_tensors(path))


def test_sniff(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path, [])
    short = tmp_path / "short"
    short.write_bytes(b"GG")
    assert G.sniff(path)
    assert not G.sniff(short)
    assert not G.sniff(tmp_path / "missing")
    assert not G.sniff(tmp_path)


# ---------------------------------------------------------------------------------------------
# files written by arrayquant, read by gguf-py


def test_save_arrays_and_metadata_read_by_gguf_py(tmp_path: Path) -> None:
    arrays = {
        "f32": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
        "f16": np.arange(6, dtype=np.float16),
        "bf16": np.array([1.5, -2.0, 3.25], ml_dtypes.bfloat16),
        "f64": np.array([[0.1]], np.float64),
        "i8": np.array([-128, 127], np.int8),
        "i64": np.array([2**40], np.int64),
    }
    meta = {
        "llama.context_length": 4096,
        "llama.rope.freq_base": 10000.5,
        "general.name": "tiny",
        "tokenizer.ggml.tokens": ["<s>", "a"],
        "tokenizer.ggml.token_type": [3, 1],
        "tokenizer.ggml.scores": [0.0, -1.5],
        "x.flag": True,
        "x.neg": -5,
        "x.big": 2**40,
        "x.typed": gguf.GGUFValue(7, VT.UINT8),
        "x.empty": gguf.GGUFValue([], VT.ARRAY, VT.INT32),
    }
    path = tmp_path / "out.gguf"
    G.save(path, arrays, metadata=meta, arch="llama")
    r = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == ["general.architecture", *meta]
    types = {k: [t.name for t in f.types] for k, f in fields.items()}
    assert types == {
        "general.architecture": ["STRING"],
        "llama.context_length": ["UINT32"],
        "llama.rope.freq_base": ["FLOAT32"],
        "general.name": ["STRING"],
        "tokenizer.ggml.tokens": ["ARRAY", "STRING"],
        "tokenizer.ggml.token_type": ["ARRAY", "INT32"],
        "tokenizer.ggml.scores": ["ARRAY", "FLOAT32"],
        "x.flag": ["BOOL"],
        "x.neg": ["INT32"],
        "x.big": ["INT64"],
        "x.typed": ["UINT8"],
        "x.empty": ["ARRAY"],
    }
    assert fields["general.architecture"].contents() == "llama"
    assert fields["tokenizer.ggml.tokens"].contents() == ["<s>", "a"]
    assert fields["llama.rope.freq_base"].contents() == 10000.5
    assert fields["x.empty"].contents() == []
    assert int(fields["x.empty"].parts[3][0]) == VT.INT32
    got = {t.name: t for t in r.tensors}
    assert list(got) == list(arrays)
    for name, x in arrays.items():
        t = got[name]
        assert t.tensor_type.name == ARRAY_TYPES[x.dtype.name]
        assert tuple(reversed(t.shape.tolist())) == x.shape
        assert np.asarray(t.data).tobytes() == x.tobytes()
    # and back through arrayquant, metadata included
    md = G.read_metadata(path)
    assert md["x.empty"] == gguf.GGUFValue([], VT.ARRAY, VT.INT32)
    assert md["x.big"] == gguf.GGUFValue(2**40, VT.INT64, None)
    back = G.load(path, backend="numpy")
    for name, x in arrays.items():
        assert back[name].dtype == x.dtype
        assert back[name].tobytes() == x.tobytes()


@pytest.mark.parametrize("type_name", gguf_types.EXACT)
@pytest.mark.parametrize("shape", [(4, 256), (2, 3, 512)])
def test_saved_quantized_tensors_read_by_gguf_py(tmp_path: Path, type_name: str, shape: tuple[int, ...]) -> None:
    scheme = gguf_types.scheme_of(type_name)
    assert scheme is not None
    rng = np.random.default_rng(len(type_name) + len(shape))
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(3)
    x[0, :40] = 0.0
    # the K-quants' scales are an f16 times small integers: ggml's quantizer makes them so, MinMax does not
    qt = aq.quantize(x, scheme, calibration="ggml" if type_name in ggml_blocks.KTYPES else "minmax")
    path = tmp_path / "q.gguf"
    G.save(path, {"w": qt})
    r = gguf.GGUFReader(str(path))
    (t,) = r.tensors
    assert t.tensor_type.name == gguf_types.type_of(scheme)  # TQ1_0's scheme is written as TQ2_0
    assert tuple(reversed(t.shape.tolist())) == shape
    expected = np.asarray(aq.dequantize(qt), np.float32)
    got = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    # equal values; bit for bit except that E2M1's -0 (code 8) is +0 in GGUF's FP4 table
    np.testing.assert_array_equal(got, expected)
    nonzero = expected != 0
    np.testing.assert_array_equal(_bits(got)[nonzero], _bits(expected)[nonzero])
    if type_name not in ("MXFP4", "NVFP4"):
        np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_save_refuses_what_gguf_cannot_hold(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    qt = aq.quantize(np.ones((2, 32), np.float32), "q8s:block32")
    with pytest.raises(SchemeError, match=r"scheme .* has no GGUF type; GGUF holds exactly Q8_0"):
        G.save(path, {"w": qt})
    with pytest.raises(DTypeError, match=r"tensor 'm': GGUF holds arrays of .*bfloat16.*, not bool"):
        G.save(path, {"m": np.zeros(3, bool)})
    with pytest.raises(ShapeError, match=r"tensor 'v' has 5 dimensions; GGUF tensors have at most 4"):
        G.save(path, {"v": np.zeros((1, 1, 1, 1, 2), np.float32)})
    with pytest.raises(ParamsError, match=r"metadata 'k': dict has no GGUF value type"):
        G.save(path, {}, metadata={"k": {}})
    with pytest.raises(ParamsError, match=r"metadata 'k': an empty list has no item type"):
        G.save(path, {}, metadata={"k": []})
    with pytest.raises(ParamsError, match=r"metadata 'k': a list must hold only str"):
        G.save(path, {}, metadata={"k": [1, "a"]})
    with pytest.raises(ParamsError, match=r"metadata 'k': 18446744073709551616 does not fit a 64-bit integer"):
        G.save(path, {}, metadata={"k": 2**64})
    with pytest.raises(ParamsError, match=r"metadata key 'GGUF.version'"):
        G.save(path, {}, metadata={"GGUF.version": 3})
    with pytest.raises(ParamsError, match=r"'general.alignment' must be a UINT32 power of two, got 24"):
        G.save(path, {}, metadata={"general.alignment": 24})
    with pytest.raises(ParamsError, match=r"cannot be written as GGUF: .*format requires 0 <= number <= 255"):
        G.save(path, {}, metadata={"k": gguf.GGUFValue(300, VT.UINT8)})
    with pytest.raises(ParamsError, match=r"the metadata cannot be written as GGUF: 'utf-8' codec can't encode"):
        G.save(path, {}, metadata={"k": "\ud800"})
    assert not path.exists()
    assert os.listdir(tmp_path) == []  # no temporary file left behind


def test_save_with_custom_alignment(tmp_path: Path) -> None:
    path = tmp_path / "a.gguf"
    G.save(path, {"a": np.ones(3, np.float32), "b": np.arange(5, dtype=np.float32)}, metadata={"general.alignment": 64})
    r = gguf.GGUFReader(str(path))
    assert r.alignment == 64
    assert all(t.data_offset % 64 == 0 for t in r.tensors)
    np.testing.assert_array_equal(G.load(path, backend="numpy")["b"], np.arange(5, dtype=np.float32))


# ---------------------------------------------------------------------------------------------
# re-quantizing a GGUF file


def _model(path: Path, *, nan: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    q = f(64, 64)
    if nan:
        q[3, 3] = np.nan
    floats = {
        "token_embd.weight": (f(16, 64), "F16"),
        "blk.0.attn_norm.weight": (f(64), "F32"),
        "blk.0.attn_q.weight": (q, "F32"),
        "blk.0.attn_k.weight": (f(32, 64), "BF16"),
        "blk.0.attn_v.weight": (f(32, 64), "Q4_1"),  # quantized already
        "blk.0.ffn_gate_inp.weight": (f(4, 64), "F32"),  # MoE router
        "blk.0.ffn_up.weight": (f(2, 8, 64), "F16"),  # experts, 3-d
        "blk.0.ffn_down.weight": (f(64, 48), "F32"),  # rows not whole blocks of 32
        "blk.0.attn_q.bias": (f(1, 64), "F32"),
        "blk.0.mask": (f(4, 64), "F32"),
        "output_norm.weight": (f(64), "F32"),
        "output.weight": (f(16, 64), "F16"),
    }
    kv = [
        ("general.name", "tiny", VT.STRING, None),
        ("general.file_type", 1, VT.UINT32, None),
        ("llama.block_count", 1, VT.UINT32, None),
        ("llama.rope.freq_base", 10000.0, VT.FLOAT32, None),
        ("tokenizer.ggml.model", "gpt2", VT.STRING, None),
        ("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "é"], VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.scores", [0.0, 0.0, -1.0, -2.0], VT.ARRAY, VT.FLOAT32),
        ("tokenizer.ggml.token_type", [3, 3, 1, 1], VT.ARRAY, VT.INT32),
        ("tokenizer.ggml.add_bos_token", True, VT.BOOL, None),
        ("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}", VT.STRING, None),
        ("x.i64", -(2**40), VT.INT64, None),
    ]
    meta = {key: gguf.GGUFValue(value, vtype, sub) for key, value, vtype, sub in kv}
    tensors: dict[str, Any] = {}
    for name, (x, type_name) in floats.items():
        tensors[name] = x.astype(np.float16) if type_name == "F16" else x if type_name == "F32" else _Raw(x, type_name)
    _save_raw(path, tensors, meta)
    return {name: x for name, (x, _) in floats.items()}


class _Raw:
    def __init__(self, x: np.ndarray, type_name: str) -> None:
        self.x, self.type_name = x, type_name


def _save_raw(path: Path, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
    """A gguf-py file with exactly these key/values (architecture first) and tensors."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.kv_data[0].clear()
    w.kv_data[0]["general.architecture"] = gguf.GGUFValue("llama", VT.STRING)
    for key, v in meta.items():
        w.kv_data[0][key] = v
    for name, x in tensors.items():
        if isinstance(x, _Raw):
            w.add_tensor(name, gguf.quants.quantize(x.x, GT[x.type_name]), raw_dtype=GT[x.type_name])
        else:
            w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _fields(path: Path) -> list[tuple[str, list[str], Any]]:
    r = gguf.GGUFReader(str(path))
    return [(k, [t.name for t in f.types], f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")]


def test_quantize_file_keeps_everything_and_quantizes_as_llama_quantize(tmp_path: Path) -> None:
    src, dst = tmp_path / "m-f16.gguf", tmp_path / "m-q8_0.gguf"
    floats = _model(src)
    seen: list[str] = []
    summary = G.quantize_file(src, dst, "q8_0", progress=seen.append)
    rin, rout = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(dst))
    # every key/value, in order, field by field; general.file_type now says Q8_0, quantization_version added
    before, after = _fields(src), _fields(dst)
    assert [k for k, _, _ in after] == [k for k, _, _ in before] + ["general.quantization_version"]
    for (k, types, value), (k2, types2, value2) in zip(before, after, strict=False):
        assert (k, types) == (k2, types2)
        if k == "general.file_type":
            assert value2 == int(gguf.LlamaFileType.MOSTLY_Q8_0) == 7
        else:
            assert value == value2, k
    assert after[-1] == ("general.quantization_version", ["UINT32"], 2)
    # every tensor, in order, with its shape
    assert [t.name for t in rout.tensors] == [t.name for t in rin.tensors] == seen
    assert [t.shape.tolist() for t in rout.tensors] == [t.shape.tolist() for t in rin.tensors]
    types = {t.name: t.tensor_type.name for t in rout.tensors}
    quantized = [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.ffn_up.weight",
        "output.weight",
    ]
    assert summary.quantized == quantized
    # rows of 48 are no whole Q8_0 blocks: llama-quantize's tensor_type_fallback writes F16
    assert summary.fallback == {"blk.0.ffn_down.weight": "F16"}
    assert types["blk.0.ffn_down.weight"] == "F16"
    assert summary.stored_as == "Q8_0"
    assert summary.format == "gguf"
    assert {n for n, t in types.items() if t == "Q8_0"} == set(quantized)
    assert summary.left_out == {
        "blk.0.attn_v.weight": (
            "already quantized as Q4_1; llama-quantize does not re-quantize by default, copied unchanged"
        ),
        "blk.0.ffn_gate_inp.weight": "llama-quantize keeps '*ffn_gate_inp.weight*' tensors as they are",
        "blk.0.mask": "not a weight (llama-quantize quantizes tensors whose names end in 'weight')",
    }
    # tensors left alone are byte for byte the same; quantized ones are aq.quantize's, read by gguf-py
    by_in = {t.name: t for t in rin.tensors}
    for t in rout.tensors:
        if t.name in quantized:
            x = np.asarray(by_in[t.name].data).astype(np.float32)  # the F16/F32/BF16 values as stored
            if by_in[t.name].tensor_type.name == "BF16":
                x = gguf.quants.dequantize(np.asarray(by_in[t.name].data), GT.BF16)
            expected = aq.dequantize(aq.quantize(x, gguf_types.scheme_of("Q8_0"), calibration="ggml"))
            np.testing.assert_array_equal(_bits(gguf.quants.dequantize(np.asarray(t.data), GT.Q8_0)), _bits(expected))
        elif t.name in summary.fallback:
            f32 = np.asarray(by_in[t.name].data).astype(np.float32)
            assert np.asarray(t.data).tobytes() == f32.astype("<f2").tobytes()
        else:
            assert t.tensor_type == by_in[t.name].tensor_type
            assert np.asarray(t.data).tobytes() == np.asarray(by_in[t.name].data).tobytes()
    assert set(floats) == set(types)


@pytest.mark.parametrize("type_name", gguf_types.EXACT)
def test_quantize_file_to_every_exact_type(tmp_path: Path, type_name: str) -> None:
    src, dst = tmp_path / "m.gguf", tmp_path / "o.gguf"
    rng = np.random.default_rng(gguf_types.EXACT.index(type_name))
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)
    _write(src, [("blk.0.ffn_up.weight", x.astype(np.float16), "F16"), ("blk.0.ffn_norm.weight", x[0, 0], "F32")])
    summary = G.quantize_file(src, dst, type_name.lower(), pure=True)  # the type alone, as llama-quantize --pure
    written = type_name  # tq1_0 too, though its scheme is TQ2_0's
    assert summary.quantized == ["blk.0.ffn_up.weight"]
    assert summary.stored_as == written
    r = gguf.GGUFReader(str(dst))
    assert [t.tensor_type.name for t in r.tensors] == [written, "F32"]
    ftype = {"MXFP4": "MOSTLY_MXFP4_MOE", "Q3_K": "MOSTLY_Q3_K_M", "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M"}
    assert r.fields["general.file_type"].contents() == int(
        getattr(gguf.LlamaFileType, ftype.get(written, f"MOSTLY_{written}"))
    )
    got = gguf.quants.dequantize(np.asarray(r.tensors[0].data), r.tensors[0].tensor_type)
    f32 = x.astype(np.float16).astype(np.float32)
    expected = np.asarray(aq.dequantize(aq.quantize(f32, gguf_types.scheme_of(type_name), calibration="ggml")))
    np.testing.assert_array_equal(got, expected)  # -0 and +0 compare equal: GGUF's FP4 table has no -0
    nonzero = expected != 0
    np.testing.assert_array_equal(_bits(got)[nonzero], _bits(expected)[nonzero])


def test_quantize_file_include_exclude_and_in_place(tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    _model(src)
    summary = G.quantize_file(src, src, "q8f:block32:f16", include=["blk.*"], exclude=["*attn_k*"])
    assert summary.quantized == ["blk.0.attn_q.weight", "blk.0.ffn_up.weight"]
    for name in ("token_embd.weight", "output.weight"):
        assert summary.left_out[name] == "not named by include"
    assert summary.left_out["blk.0.attn_k.weight"] == "named by exclude"
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(src)).tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0"
    assert types["token_embd.weight"] == "F16"
    # re-running: the quantized tensors are Q8_0 already and copied
    again = G.quantize_file(src, tmp_path / "again.gguf", "q8_0")
    assert again.left_out["blk.0.attn_q.weight"] == "already Q8_0, copied unchanged"
    assert sorted(os.listdir(tmp_path)) == ["again.gguf", "m.gguf"]


def test_quantize_file_copies_empty_arrays(tmp_path: Path) -> None:
    src, dst = tmp_path / "e.gguf", tmp_path / "o.gguf"
    meta = {"x.empty": gguf.GGUFValue([], VT.ARRAY, VT.UINT16), "x.after": 3}
    G.save(src, {"a.weight": np.ones((2, 32), np.float32)}, metadata=meta, arch="llama")
    G.quantize_file(src, dst, "q8_0")
    r = gguf.GGUFReader(str(dst))
    assert [k for k in r.fields if not k.startswith("GGUF.")] == [
        "general.architecture",
        "x.empty",
        "x.after",
        "general.file_type",
        "general.quantization_version",
    ]
    empty = r.fields["x.empty"]
    assert empty.contents() == []
    assert int(empty.parts[3][0]) == VT.UINT16
    assert int(empty.parts[4][0]) == 0
    assert r.tensors[0].tensor_type == GT.Q8_0


def test_quantize_file_file_type_is_kept_when_nothing_is_quantized(tmp_path: Path) -> None:
    src, dst = tmp_path / "m.gguf", tmp_path / "o.gguf"
    _model(src)
    summary = G.quantize_file(src, dst, "q8_0", include=["nothing"])
    assert summary.quantized == []
    assert _fields(dst) == _fields(src)


def test_quantize_file_refuses_schemes_without_a_gguf_type(tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    _model(src)
    with pytest.raises(SchemeError, match=r"scheme .* has no GGUF type; GGUF holds exactly Q8_0 \(q8f:block32:f16"):
        G.quantize_file(src, tmp_path / "o.gguf", "q8s:block32")
    with pytest.raises(SchemeError, match=r"scheme must be a QuantScheme or its text, got int"):
        G.quantize_file(src, tmp_path / "o.gguf", 8)  # type: ignore[arg-type]
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]


def test_quantize_file_is_atomic(tmp_path: Path) -> None:
    src, dst = tmp_path / "m.gguf", tmp_path / "o.gguf"
    _model(src, nan=True)
    dst.write_bytes(b"old")
    with pytest.raises(NonFiniteInputError):
        G.quantize_file(src, dst, "q8_0")
    assert dst.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["m.gguf", "o.gguf"]


def test_quantize_file_streams_tensor_by_tensor(tmp_path: Path) -> None:
    src, dst = tmp_path / "big.gguf", tmp_path / "q.gguf"
    rng = np.random.default_rng(3)
    n, shape = 12, (256, 1024)  # 1 MiB of F32 per tensor, 12 MiB in all
    w = gguf.GGUFWriter(str(src), "llama", use_temp_file=True)
    for i in range(n):
        w.add_tensor(f"blk.{i}.ffn_up.weight", rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    G.quantize_file(src, dst, "q8_0")  # first calls fill caches (kernels, gguf-py tables) that stay
    tracemalloc.start()
    try:
        G.quantize_file(src, dst, "q8_0")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one = 4 * shape[0] * shape[1]
    assert peak < 6 * one, f"peak {peak / 2**20:.1f} MiB for tensors of {one / 2**20:.1f} MiB"
    assert len(gguf.GGUFReader(str(dst)).tensors) == n


# ---------------------------------------------------------------------------------------------
# two-level nvfp4 as llama.cpp stores it: NVFP4 blocks + the F32 per-tensor scale '<name>.scale'

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
MOSTLY_NVFP4 = 39  # llama.cpp's LLAMA_FTYPE_MOSTLY_NVFP4


def _away_from_zero(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values no E2M1 code rounds to -0 (GGUF's FP4 table has no -0): within 0.3x of each row's largest."""
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    rows = rng.uniform(0.01, 100, (*shape[:-1], 1))
    return (sign * rng.uniform(0.3, 1.0, shape) * rows).astype(np.float32)


def _assert_llama_cpp_values(got: np.ndarray, qt: aq.QuantizedTensor) -> None:
    """llama.cpp's values (block value times the scale tensor) against aq.dequantize(qt).

    llama.cpp forms f32(f32(s * v) * g) (ggml_mul after the matmul), arrayquant f32(f32(g * s) * v);
    s * v is exact, so the two are the same f32 wherever |v| is a power of two, and within one
    rounding (1 ulp) where v is 1.5, 3 or 6.
    """
    expected = np.asarray(aq.dequantize(qt), np.float32)
    codes = np.asarray(qt.codes()).astype(np.intp)
    pow2 = np.isin(codes & 7, (1, 2, 4, 6))
    np.testing.assert_array_equal(_bits(got)[pow2], _bits(expected)[pow2])
    np.testing.assert_array_max_ulp(got, expected, maxulp=1)


def _nvfp4_blocks(rng: np.random.Generator, rows: int, cols: int, scale_byte: int | None = None) -> np.ndarray:
    """Raw GGUF NVFP4 bytes built by hand: per 64 values four UE4M3 scale bytes, then 32 nibble bytes."""
    n = rows * cols // 64
    d = rng.integers(0x20, 0x50, (n, 4), dtype=np.uint8)  # UE4M3 2^-2 .. 2^3, normal
    if scale_byte is not None:
        d[0, 0] = scale_byte
    qs = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    return np.concatenate([d, qs], axis=1).reshape(rows, cols // 64 * 36)


def _save_pair(path: Path, blocks: np.ndarray, cols: int, scale: Any, scale_type: str = "F32") -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.ffn_up.weight", blocks, raw_dtype=GT.NVFP4)
    if scale_type == "F16":
        w.add_tensor("blk.0.ffn_up.scale", np.asarray(scale, np.float16))
    else:
        w.add_tensor("blk.0.ffn_up.scale", np.asarray(scale, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(cols, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_save_two_level_nvfp4_as_llama_cpp_pair(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    x = _away_from_zero(rng, (8, 256))
    qt = aq.quantize(x, aq.QuantScheme.nvfp4())
    with pytest.raises(SchemeError, match=r"cannot be folded into GGUF NVFP4's UE4M3 block scales"):
        gguf_types.encode(qt)  # this tensor's per-tensor scale does not fold: it needs the pair
    path = tmp_path / "p.gguf"
    G.save(path, {"blk.0.attn_q.weight": qt, "blk.0.attn_norm.weight": np.ones(256, np.float32)})
    r = gguf.GGUFReader(str(path))
    assert [(t.name, t.tensor_type.name, t.shape.tolist()) for t in r.tensors] == [
        ("blk.0.attn_q.weight", "NVFP4", [256, 8]),
        ("blk.0.attn_q.scale", "F32", [1]),
        ("blk.0.attn_norm.weight", "F32", [256]),
    ]
    w, s, _ = r.tensors
    g = np.asarray(s.data, np.float32)
    np.testing.assert_array_equal(_bits(g), _bits(qt.global_scale))  # the f32 global scale, bit for bit
    blocks = gguf.quants.dequantize(np.asarray(w.data), GT.NVFP4)
    # the blocks hold the UE4M3 block scales unchanged: E2M1 table value times the block scale
    oracle = E2M1[np.asarray(qt.codes()).astype(np.intp)] * np.repeat(np.asarray(qt.scales, np.float32), 16, axis=-1)
    np.testing.assert_array_equal(_bits(blocks), _bits(oracle))
    _assert_llama_cpp_values(blocks * g[0], qt)
    # read back: one two-level tensor, codes, scales and global scale bit for bit
    back = G.load(path, backend="numpy")
    assert list(back) == ["blk.0.attn_q.weight", "blk.0.attn_norm.weight"]
    assert back["blk.0.attn_q.weight"].scheme == aq.QuantScheme.nvfp4()
    assert aq.to_bytes(back["blk.0.attn_q.weight"]) == aq.to_bytes(qt)
    seen = [(n, type(v).__name__, note) for n, v, note in G.iter_tensors(path)]
    assert seen == [
        (
            "blk.0.attn_q.weight",
            "QuantizedTensor",
            "NVFP4 with its per-tensor scale blk.0.attn_q.scale (llama.cpp layout)",
        ),
        ("blk.0.attn_norm.weight", "ndarray", ""),
    ]


def test_llama_cpp_nvfp4_pair_reads_as_one_two_level_tensor(tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    blocks = _nvfp4_blocks(rng, 4, 128)
    path = tmp_path / "l.gguf"
    _save_pair(path, blocks, 128, [0.37])
    ((name, qt, note), (norm, _, _)) = list(G.iter_tensors(path))
    assert (name, note, norm) == (
        "blk.0.ffn_up.weight",
        "NVFP4 with its per-tensor scale blk.0.ffn_up.scale (llama.cpp layout)",
        "blk.0.ffn_norm.weight",
    )
    assert isinstance(qt, aq.QuantizedTensor)
    assert qt.scheme == aq.QuantScheme.nvfp4()
    np.testing.assert_array_equal(_bits(qt.global_scale), _bits(np.float32([0.37])))
    got = gguf.quants.dequantize(blocks, GT.NVFP4) * np.float32(0.37)
    _assert_llama_cpp_values(got, qt)


def test_llama_cpp_nvfp4_pair_with_blocks_not_exact_reads_scaled_floats(tmp_path: Path) -> None:
    rng = np.random.default_rng(13)
    blocks = _nvfp4_blocks(rng, 2, 64, scale_byte=0xFF)  # ggml reads 480, outside UE4M3
    path = tmp_path / "l.gguf"
    _save_pair(path, blocks, 64, [0.25])
    (name, value, note), _ = list(G.iter_tensors(path))
    assert name == "blk.0.ffn_up.weight"
    assert isinstance(value, np.ndarray)
    assert note.startswith("NVFP4 read as float32 values: NVFP4 ")
    assert note.endswith("; times its per-tensor scale blk.0.ffn_up.scale (llama.cpp layout)")
    expected = gguf.quants.dequantize(blocks, GT.NVFP4) * np.float32(0.25)  # exact: a power of two
    np.testing.assert_array_equal(_bits(value), _bits(expected))


@pytest.mark.parametrize(
    ("scale", "scale_type", "why"),
    [
        ([-1.0], "F32", "holds -1.0, not a finite positive float32"),
        ([0.0], "F32", "holds 0.0, not a finite positive float32"),
        ([np.nan], "F32", "holds nan, not a finite positive float32"),
        ([np.inf], "F32", "holds inf, not a finite positive float32"),
        ([0.5, 0.5], "F32", "is F32 of shape [2], not one F32 value"),
        ([0.5], "F16", "is F16 of shape [1], not one F32 value"),
    ],
)
def test_nvfp4_scale_tensor_that_is_no_valid_scale_is_not_applied(
    tmp_path: Path, scale: list[float], scale_type: str, why: str
) -> None:
    rng = np.random.default_rng(14)
    blocks = _nvfp4_blocks(rng, 2, 64)
    path = tmp_path / "l.gguf"
    _save_pair(path, blocks, 64, scale, scale_type)
    (name, qt, note), (sname, s, snote), _ = list(G.iter_tensors(path))
    assert (name, sname) == ("blk.0.ffn_up.weight", "blk.0.ffn_up.scale")
    assert note == f"NVFP4 read single-level: its per-tensor scale tensor 'blk.0.ffn_up.scale' {why}, not applied"
    assert snote == f"read as a plain array: not applied as 'blk.0.ffn_up.weight''s NVFP4 per-tensor scale, it {why}"
    assert isinstance(qt, aq.QuantizedTensor)
    assert qt.scheme == gguf_types.scheme_of("NVFP4")  # single level
    assert qt.global_scale is None
    np.testing.assert_array_equal(_bits(aq.dequantize(qt)), _bits(gguf.quants.dequantize(blocks, GT.NVFP4)))
    assert np.asarray(s).tobytes() == np.asarray(scale, np.float16 if scale_type == "F16" else np.float32).tobytes()
    back = G.load(path, backend="numpy")
    assert list(back) == ["blk.0.ffn_up.weight", "blk.0.ffn_up.scale", "blk.0.ffn_norm.weight"]
    assert back["blk.0.ffn_up.weight"].global_scale is None


def test_save_nvfp4_scale_name_clash_is_a_shape_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(15)
    qt = aq.quantize(_away_from_zero(rng, (2, 64)), aq.QuantScheme.nvfp4())
    path = tmp_path / "c.gguf"
    for tensors in (
        {"a.weight": qt, "a.scale": np.ones(1, np.float32)},
        {"a.scale": np.ones(1, np.float32), "a.weight": qt},
    ):
        with pytest.raises(
            ShapeError,
            match=r"tensor 'a\.weight': its nvfp4 per-tensor scale goes in the F32 tensor 'a\.scale' "
            r"\(llama\.cpp's layout: '\.weight' -> '\.scale'\), which is also the name of another tensor; rename one",
        ):
            G.save(path, tensors)
    with pytest.raises(ShapeError, match=r"tensor 'a': its nvfp4 per-tensor scale goes in the F32 tensor 'a\.scale'"):
        G.save(path, {"a.weight": qt, "a": qt})  # both would write 'a.scale'
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("scheme", [aq.QuantScheme.nvfp4(), "e2m1:block16:ue4m3:tensor:f32:packed_native"])
def test_quantize_file_two_level_nvfp4_writes_llama_cpp_pairs(tmp_path: Path, scheme: Any) -> None:
    src, dst = tmp_path / "m.gguf", tmp_path / "o.gguf"
    rng = np.random.default_rng(16)
    up, gate = _away_from_zero(rng, (4, 128)), _away_from_zero(rng, (2, 3, 64))
    _write(
        src,
        [
            ("blk.0.ffn_up.weight", up.astype(np.float16), "F16"),
            ("blk.0.ffn_norm.weight", up[0], "F32"),
            ("blk.0.ffn_gate.weight", gate, "F32"),
            ("blk.0.attn_k.weight", up, "F32"),
            ("blk.0.attn_k.scale", np.ones(1, np.float32), "F32"),  # taken: attn_k stays as it is
        ],
    )
    seen: list[str] = []
    summary = G.quantize_file(src, dst, scheme, progress=seen.append)
    assert summary.stored_as == "NVFP4"
    assert summary.quantized == ["blk.0.ffn_up.weight", "blk.0.ffn_gate.weight"]
    assert summary.left_out == {
        "blk.0.attn_k.weight": "its nvfp4 per-tensor scale would go in 'blk.0.attn_k.scale' "
        "(llama.cpp's '.weight' -> '.scale'), a name the file already has; kept as F32"
    }
    r = gguf.GGUFReader(str(dst))
    assert [(t.name, t.tensor_type.name) for t in r.tensors] == [
        ("blk.0.ffn_up.weight", "NVFP4"),
        ("blk.0.ffn_up.scale", "F32"),
        ("blk.0.ffn_norm.weight", "F32"),
        ("blk.0.ffn_gate.weight", "NVFP4"),
        ("blk.0.ffn_gate.scale", "F32"),
        ("blk.0.attn_k.weight", "F32"),
        ("blk.0.attn_k.scale", "F32"),
    ]
    assert seen == [t.name for t in r.tensors]
    assert r.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_NVFP4) == MOSTLY_NVFP4
    by = {t.name: t for t in r.tensors}
    back = G.load(dst, backend="numpy")
    assert "blk.0.ffn_up.scale" not in back
    assert back["blk.0.attn_k.scale"].tolist() == [1.0]  # an F32 weight next to it: no NVFP4 pair
    for name, x in (("blk.0.ffn_up", up.astype(np.float16).astype(np.float32)), ("blk.0.ffn_gate", gate)):
        qt = aq.quantize(x, aq.QuantScheme.nvfp4())
        assert by[f"{name}.scale"].shape.tolist() == [1]
        g = np.asarray(by[f"{name}.scale"].data, np.float32)
        np.testing.assert_array_equal(_bits(g), _bits(qt.global_scale))
        got = gguf.quants.dequantize(np.asarray(by[f"{name}.weight"].data), GT.NVFP4) * g[0]
        _assert_llama_cpp_values(got.reshape(x.shape), qt)
        assert aq.to_bytes(back[f"{name}.weight"]) == aq.to_bytes(qt)


# ---------------------------------------------------------------------------------------------
# broken and lying files


def _one_tensor(tmp_path: Path) -> tuple[Path, bytes, int]:
    """A valid file with tensor 'weight_x' (F32, 4 x 8) and where its tensor info starts."""
    path = tmp_path / "ok.gguf"
    _write(
        path,
        [("weight_x", np.arange(32, dtype=np.float32).reshape(4, 8), "F32")],
        kv=[("tokenizer.ggml.tokens", ["a", "bc"], VT.ARRAY, VT.STRING), ("k.u32", 5, VT.UINT32, None)],
    )
    data = path.read_bytes()
    info = data.index(b"weight_x") - 8  # the name's u64 length comes first
    return path, data, info


def _patched(tmp_path: Path, data: bytes, at: int, fmt: str, value: int) -> Path:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, at, value)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(buf))
    return bad


def test_truncated_files(tmp_path: Path) -> None:
    path, data, info = _one_tensor(tmp_path)
    bad = tmp_path / "cut.gguf"
    for cut, pattern in [
        (0, r"0 bytes, too short for a GGUF header"),
        (10, r"10 bytes, too short"),
        (30, r"the header claims 3 key/values and 1 tensors, more than the 6 bytes left in the file can hold"),
        (
            data.index(b"bc") + 1,
            r"truncated or lying GGUF header: item 1 of 'tokenizer.ggml.tokens' at byte \d+ needs 2",
        ),
        (info + 5, r"truncated or lying GGUF header: the length of the name of tensor 0 at byte \d+ needs 8 bytes"),
        (len(data) - 4, r"tensor 'weight_x' claims bytes .* past the end of the"),
    ]:
        bad.write_bytes(data[:cut])
        with pytest.raises(CorruptDataError, match=pattern):
            list(G.iter_tensors(bad))
    assert G.load(path, backend="numpy")["weight_x"].shape == (4, 8)


def test_bad_magic_version_and_endianness(tmp_path: Path) -> None:
    _, data, _ = _one_tensor(tmp_path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUG" + data[4:])
    with pytest.raises(CorruptDataError, match=r"not a GGUF file \(magic b'GGUG', expected b'GGUF'\)"):
        G.load(bad)
    with pytest.raises(CorruptDataError, match=r"GGUF version 7; versions 2, 3 are read"):
        G.load(_patched(tmp_path, data, 4, "<I", 7))
    with pytest.raises(CorruptDataError, match=r"a big-endian GGUF file; only little-endian"):
        G.load(_patched(tmp_path, data, 4, ">I", 3))


def test_lying_counts_and_lengths(tmp_path: Path) -> None:
    _, data, _ = _one_tensor(tmp_path)
    with pytest.raises(CorruptDataError, match=r"claims 3 key/values and 1000000000 tensors, more than the 328 bytes"):
        G.read_metadata(_patched(tmp_path, data, 8, "<Q", 10**9))
    with pytest.raises(CorruptDataError, match=r"claims 4611686018427387904 key/values"):
        G.read_metadata(_patched(tmp_path, data, 16, "<Q", 2**62))
    key = data.index(b"tokenizer.ggml.tokens")
    # the array's length: after the key, its value type (u32) and item type (u32)
    n_at = key + len(b"tokenizer.ggml.tokens") + 8
    with pytest.raises(CorruptDataError, match=r"'tokenizer.ggml.tokens' claims 1099511627776 items"):
        G.read_metadata(_patched(tmp_path, data, n_at, "<Q", 2**40))
    with pytest.raises(CorruptDataError, match=r"truncated or lying GGUF header: the 1000000 strings"):
        G.read_metadata(_patched(tmp_path, data, n_at, "<Q", 10**6))
    with pytest.raises(CorruptDataError, match=r"truncated or lying GGUF header: item 0 of 'tokenizer.ggml.tokens'"):
        G.read_metadata(_patched(tmp_path, data, n_at + 8, "<Q", 2**50))
    with pytest.raises(CorruptDataError, match=r"key 'tokenizer.ggml.tokens' is an array of arrays"):
        G.read_metadata(_patched(tmp_path, data, n_at - 4, "<I", 9))
    with pytest.raises(CorruptDataError, match=r"key 'tokenizer.ggml.tokens' has value type 13"):
        G.read_metadata(_patched(tmp_path, data, n_at - 8, "<I", 13))
    name_len = key - 8
    with pytest.raises(
        CorruptDataError, match=r"truncated or lying GGUF header: key 1 at byte \d+ needs 9223372036854775808 bytes"
    ):
        G.read_metadata(_patched(tmp_path, data, name_len, "<Q", 2**63))
    with pytest.raises(CorruptDataError, match=r"key 1 at byte 77 is not UTF-8 \(invalid start byte\)"):
        G.read_metadata(_patched(tmp_path, data, key, "<B", 0xFF))
    dup = tmp_path / "dup.gguf"
    _write(dup, [], kv=[("k.aaa", 1, VT.UINT32, None), ("k.bbb", 2, VT.UINT32, None)])
    with pytest.raises(CorruptDataError, match=r"key 'k.aaa' appears twice"):
        G.read_metadata(_bytes(tmp_path, dup.read_bytes().replace(b"k.bbb", b"k.aaa")))


def _bytes(tmp_path: Path, data: bytes | bytearray) -> Path:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    return bad


def test_lying_tensor_infos(tmp_path: Path) -> None:
    _, data, info = _one_tensor(tmp_path)
    dims_at = info + 8 + len(b"weight_x") + 4
    type_at = dims_at + 16
    offset_at = type_at + 4
    with pytest.raises(CorruptDataError, match=r"tensor 'weight_x' claims bytes .* past the end of the \d+-byte file"):
        G.load(_patched(tmp_path, data, offset_at, "<Q", 2**40))
    with pytest.raises(CorruptDataError, match=r"tensor 'weight_x' claims bytes .*\(137438953472 bytes of F32"):
        G.load(_patched(tmp_path, data, dims_at + 8, "<Q", 2**32 // 1))
    with pytest.raises(
        CorruptDataError, match=r"tensor 'weight_x' starts at data offset 4, not a multiple of the alignment 32"
    ):
        G.load(_patched(tmp_path, data, offset_at, "<Q", 4))
    with pytest.raises(CorruptDataError, match=r"tensor 'weight_x' has type id 99, which is no GGML type"):
        G.load(_patched(tmp_path, data, type_at, "<I", 99))
    with pytest.raises(
        CorruptDataError, match=r"tensor 'weight_x' \(Q8_0\) has rows of 8 values, not whole blocks of 32"
    ):
        G.load(_patched(tmp_path, data, type_at, "<I", int(GT.Q8_0)))
    with pytest.raises(CorruptDataError, match=r"tensor 'weight_x' has 5 dimensions; GGUF tensors have at most 4"):
        G.load(_patched(tmp_path, data, info + 8 + len(b"weight_x"), "<I", 5))


def test_overlapping_and_duplicate_tensors(tmp_path: Path) -> None:
    path = tmp_path / "two.gguf"
    _write(path, [("aa", np.zeros(8, np.float32), "F32"), ("bb", np.ones(8, np.float32), "F32")])
    data = path.read_bytes()
    b_info = data.index(b"bb") - 8
    offset_at = b_info + 8 + 2 + 4 + 8 + 4
    with pytest.raises(CorruptDataError, match=r"tensor 'bb' overlaps the tensor before it \(data offset 0\)"):
        G.load(_patched(tmp_path, data, offset_at, "<Q", 0))
    with pytest.raises(CorruptDataError, match=r"tensor 'aa' appears twice"):
        G.load(_bytes(tmp_path, data.replace(b"bb", b"aa")))


def test_bad_alignment(tmp_path: Path) -> None:
    path = tmp_path / "al.gguf"
    _write(path, [("t", np.zeros(4, np.float32), "F32")], kv=[("general.alignment", 64, VT.UINT32, None)])
    data = path.read_bytes()
    at = data.index(b"general.alignment") + len(b"general.alignment")
    with pytest.raises(CorruptDataError, match=r"general.alignment is 48, not a power of two"):
        G.load(_patched(tmp_path, data, at + 4, "<I", 48))
    with pytest.raises(CorruptDataError, match=r"general.alignment has value type 5, not UINT32"):
        G.load(_patched(tmp_path, data, at, "<I", 5))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorruptDataError, match=r"cannot open .*missing.gguf: No such file"):
        G.load(tmp_path / "missing.gguf")
    with pytest.raises(CorruptDataError, match=r"is not a file"):
        G.load(tmp_path)


def fuzz_gguf(data: bytes) -> None:
    """Fuzz target: read ``data`` as a GGUF file every way arrayquant does; only typed errors may escape."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.gguf"
        path.write_bytes(data)
        try:
            G.sniff(path)
            G.read_metadata(path)
            for _, value, _ in G.iter_tensors(path):
                if isinstance(value, aq.QuantizedTensor):
                    aq.dequantize(value)
        except QuantizationError:
            pass


def _mutations(data: bytes, rng: np.random.Generator, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        buf = bytearray(data)
        kind = rng.integers(4)
        if kind == 0:  # random bytes
            for _ in range(rng.integers(1, 6)):
                buf[rng.integers(len(buf))] = rng.integers(256)
        elif kind == 1:  # a random u64 somewhere
            at = int(rng.integers(len(buf) - 8))
            struct.pack_into("<Q", buf, at, [0, 1, 2**31, 2**32 + 1, 2**62, 2**64 - 1][rng.integers(6)])
        elif kind == 2:
            buf = buf[: rng.integers(len(buf))]
        else:
            at = int(rng.integers(len(buf) - 4))
            struct.pack_into("<I", buf, at, int(rng.integers(0, 64)))
        out.append(bytes(buf))
    return out


def test_fuzz_gguf_only_typed_errors(tmp_path: Path) -> None:
    path = tmp_path / "seed.gguf"
    rng = np.random.default_rng(11)
    _write(
        path,
        [
            ("q.weight", _data(rng, "Q8_0", (2, 2)), "Q8_0"),
            ("m.weight", _data(rng, "MXFP4", (1, 2)), "MXFP4"),
            ("k.weight", _data(rng, "Q4_1", (1, 1)), "Q4_1"),
            ("b", np.ones(3, np.float32), "F32"),
        ],
        kv=[("tokenizer.ggml.tokens", ["a", "b"], VT.ARRAY, VT.STRING), ("s", 1.5, VT.FLOAT32, None)],
    )
    data = path.read_bytes()
    fuzz_gguf(data)
    for case in _mutations(data, rng, 300):
        fuzz_gguf(case)


def test_load_onto_another_backend(tmp_path: Path) -> None:
    xp = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(5)
    x = _data(rng, "Q8_0", (2, 1))
    path = tmp_path / "m.gguf"
    _write(path, [("q", x, "Q8_0"), ("b", x[0].copy(), "F32"), ("k", _iq2_xxs(rng, 2, 1), "IQ2_XXS")])
    out = G.load(path, backend="array_api_strict")
    assert isinstance(out["q"], aq.QuantizedTensor)
    strict = type(xp.asarray([1.0]))
    assert isinstance(out["b"], strict)
    assert isinstance(out["k"], strict)  # read as floats, then moved
    np.testing.assert_array_equal(np.asarray(out["b"]), x[0])
    expected = gguf.quants.dequantize(np.asarray(gguf.GGUFReader(str(path)).tensors[2].data), GT.IQ2_XXS)
    np.testing.assert_array_equal(_bits(np.asarray(out["k"])), _bits(expected))
