"""Burnpack files (``io/burn/``), checked against Burn's layout rebuilt by hand.

The oracle is an independent reader and writer in this module (``struct`` + ``cbor2``) that
follows Burn's source at commit 2c06be35 (``crates/burn-pack/src/{base,reader,writer}.rs``):
10-byte little-endian header, CBOR metadata, data section at the next multiple of 256, each
tensor's start a multiple of 256, offsets relative to the data section. QFloat dtypes are
written here as literal dicts, spelled from cubecl's ``QuantScheme`` serde; quantized bytes are
compared with Burn's own test vector (``should_pack_unpack_two_level_scales``) or ``aq.to_bytes``.
"""

from __future__ import annotations

import os
import random
import re
import struct
import tempfile
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cbor2 = pytest.importorskip("cbor2")
ml_dtypes = pytest.importorskip("ml_dtypes")

import arrayquant as aq  # noqa: E402
from arrayquant.errors import (  # noqa: E402
    CorruptDataError,
    DTypeError,
    NonFiniteInputError,
    QuantizationError,
    SchemeError,
    ShapeError,
)
from arrayquant.io.burn import burnpack as bp  # noqa: E402
from arrayquant.io.safetensors.reader import Passthrough, SafetensorsFile  # noqa: E402

MAGIC = 0x4255524E


# -- an independent reader and writer of Burn's layout ----------------------------------------------
def parse(data: bytes) -> dict[str, Any]:
    """Burn's layout read with struct + cbor2, checking what Burn's writer guarantees."""
    magic, version, size = struct.unpack_from("<IHI", data, 0)
    assert data[:4] == b"NRUB"
    assert magic == MAGIC
    assert version == 1
    meta = cbor2.loads(data[10 : 10 + size])
    start = -(-(10 + size) // 256) * 256
    assert start % 256 == 0
    assert set(data[10 + size : start]) <= {0}
    out: dict[str, Any] = {"data_start": start, "meta": meta, "tensors": {}}
    ends = [0]
    for name, desc in meta["tensors"].items():
        a, b = desc["data_offsets"]
        assert a % 256 == 0
        assert a <= b
        assert start + b <= len(data)
        out["tensors"][name] = {**desc, "bytes": data[start + a : start + b]}
        ends.append(b)
    assert len(data) == start + max(ends)
    return out


def build(
    tensors: Sequence[tuple[str, Any, list[int], bytes, int | None]], extra: dict[str, Any] | None = None
) -> bytes:
    """A Burnpack file laid out as Burn's writer does, from (name, dtype, shape, bytes, param_id)."""
    descs, data, at = {}, b"", 0
    for name, dtype, shape, raw, pid in tensors:
        start = -(-at // 256) * 256
        data += bytes(start - at) + raw
        desc = {"dtype": dtype, "shape": shape, "data_offsets": [start, start + len(raw)]}
        if pid is not None:
            desc["param_id"] = pid
        descs[name] = desc
        at = start + len(raw)
    meta = cbor2.dumps({"tensors": dict(sorted(descs.items())), **(extra or {})})
    head = struct.pack("<IHI", MAGIC, 1, len(meta)) + meta
    return head + bytes(-len(head) % 256) + data


def header_and_meta(meta: Any, size: int | None = None, version: int = 1) -> bytes:
    raw = cbor2.dumps(meta) if not isinstance(meta, bytes) else meta
    head = struct.pack("<IHI", MAGIC, version, len(raw) if size is None else size) + raw
    return head + bytes(-len(head) % 256)


def write(tmp_path: Path, data: bytes, name: str = "m.bpk") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# Burn's serde of the schemes below, spelled out (cubecl-common quant/scheme.rs at 48348968)
BURN_SCHEMES: dict[str, dict[str, Any]] = {
    "q8s:native": {"value": "Q8S", "store": "Native", "mode": "Symmetric", "tensor": None, "block": None},
    "q4s:block32": {
        "value": "Q4S",
        "store": {"PackedU32": 0},
        "mode": "Symmetric",
        "tensor": None,
        "block": {"size": {"storage": [32, 1, 1, 1, 1], "len": 1}, "dtype": "F32"},
    },
    "nvfp4": {
        "value": "E2M1",
        "store": {"PackedNative": 0},
        "mode": "Symmetric",
        "tensor": "F32",
        "block": {"size": {"storage": [16, 1, 1, 1, 1], "len": 1}, "dtype": "UE4M3"},
    },
    "mxfp8": {
        "value": "E4M3",
        "store": "Native",
        "mode": "Symmetric",
        "tensor": None,
        "block": {"size": {"storage": [32, 1, 1, 1, 1], "len": 1}, "dtype": "UE8M0"},
    },
}
# Burn's test vector (burn-std quantization.rs, should_pack_unpack_two_level_scales)
TWO_LEVEL = {
    "value": "Q8S",
    "store": "Native",
    "mode": "Symmetric",
    "tensor": "F32",
    "block": {"size": {"storage": [4, 1, 1, 1, 1], "len": 1}, "dtype": "UE4M3"},
}
TWO_LEVEL_BYTES = bytes([0, 25, 51, 76, 102, 127, 128, 255, 0x30, 0x20]) + struct.pack("<f", 3.0)


def weights() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((8, 64)).astype(np.float32)


def mixed() -> dict[str, Any]:
    x = weights()
    return {
        "enc.w": x,
        "enc.b": np.arange(3, dtype=np.float64),
        "half": x[:2].astype(np.float16),
        "brain": x[:3, :5].astype(ml_dtypes.bfloat16),
        "ids": np.array([-(2**40), 5], np.int64),
        "u": np.arange(7, dtype=np.uint8),
        "u64": np.array([2**63 + 1], np.uint64),
        "mask": np.array([[True, False, True]]),
        "empty": np.zeros((0, 4), np.float32),
        "q": aq.quantize(x, "q4s:block32"),
    }


# -- writing: Burn's layout --------------------------------------------------------------------------
def test_written_file_parses_independently(tmp_path: Path) -> None:
    tensors = mixed()
    path = tmp_path / "m.bpk"
    bp.save(path, tensors, param_ids={"enc.w": 2**64 - 1, "u": 0}, metadata={"producer": "t", "a": "é"})
    f = parse(path.read_bytes())
    assert list(f["meta"]) == ["tensors", "metadata"]  # struct field order; empty scalars left out
    assert f["meta"]["metadata"] == {"a": "é", "producer": "t"}
    names = list(f["meta"]["tensors"])
    assert names == sorted(names, key=lambda n: n.encode())  # a BTreeMap: by UTF-8 bytes
    # data in the order given, each start the previous end rounded up to 256
    order = sorted(f["tensors"], key=lambda n: f["tensors"][n]["data_offsets"][0])
    assert order == list(tensors)
    at = 0
    for n in tensors:
        a, b = f["tensors"][n]["data_offsets"]
        assert a == -(-at // 256) * 256
        at = b
    t = f["tensors"]
    assert t["enc.w"]["dtype"] == "F32"
    assert t["enc.w"]["shape"] == [8, 64]
    assert t["enc.w"]["bytes"] == tensors["enc.w"].astype("<f4").tobytes()
    assert t["enc.w"]["param_id"] == 2**64 - 1
    assert t["u"]["param_id"] == 0
    assert "param_id" not in t["half"]
    assert t["enc.b"]["dtype"] == "F64"
    assert t["enc.b"]["bytes"] == np.arange(3, dtype="<f8").tobytes()
    assert t["half"]["dtype"] == "F16"
    assert t["half"]["bytes"] == tensors["half"].astype("<f2").tobytes()
    assert t["brain"]["dtype"] == "BF16"
    assert t["brain"]["bytes"] == tensors["brain"].view("<u2").tobytes()
    assert t["ids"]["dtype"] == "I64"
    assert t["ids"]["bytes"] == struct.pack("<qq", -(2**40), 5)
    assert t["u"]["dtype"] == "U8"
    assert t["u"]["bytes"] == bytes(range(7))
    assert t["u64"]["dtype"] == "U64"
    assert t["u64"]["bytes"] == struct.pack("<Q", 2**63 + 1)
    assert t["mask"]["dtype"] == {"Bool": "Native"}
    assert t["mask"]["bytes"] == b"\x01\x00\x01"
    assert t["mask"]["shape"] == [1, 3]
    assert t["empty"]["shape"] == [0, 4]
    assert t["empty"]["bytes"] == b""
    assert t["q"]["dtype"] == {"QFloat": BURN_SCHEMES["q4s:block32"]}
    assert t["q"]["bytes"] == aq.to_bytes(tensors["q"])


def test_empty_file_is_header_metadata_and_padding(tmp_path: Path) -> None:
    path = tmp_path / "e.bpk"
    bp.save(path, {})
    meta = cbor2.dumps({"tensors": {}})
    assert path.read_bytes() == struct.pack("<IHI", MAGIC, 1, len(meta)) + meta + bytes(256 - 10 - len(meta))
    assert bp.load(path) == {}


def test_empty_last_tensor_keeps_its_padding(tmp_path: Path) -> None:
    # Burn's writer pads up to every tensor's start, an empty last one's too
    path = tmp_path / "e.bpk"
    bp.save(path, {"a": np.ones(3, np.float32), "z": np.zeros(0, np.float32)})
    f = parse(path.read_bytes())
    assert f["tensors"]["z"]["data_offsets"] == [256, 256]
    assert len(path.read_bytes()) == f["data_start"] + 256
    assert bp.load(path, backend="numpy")["z"].shape == (0,)


def test_metadata_ending_on_a_boundary_needs_no_padding(tmp_path: Path) -> None:
    path = tmp_path / "b.bpk"
    for n in range(300):  # a metadata value long enough that header + metadata is exactly 256 bytes
        bp.save(path, {"w": np.ones(2, np.float32)}, metadata={"k": "x" * n})
        size = struct.unpack_from("<I", path.read_bytes(), 6)[0]
        if 10 + size == 256:
            break
    else:
        pytest.fail("no metadata length lands on 256")
    data = path.read_bytes()
    assert parse(data)["data_start"] == 256
    assert data[256:] == np.ones(2, "<f4").tobytes()
    assert bp.load(path, backend="numpy")["w"].tolist() == [1.0, 1.0]


def test_float_scalars_are_written_at_their_narrowest_width(tmp_path: Path) -> None:
    # ciborium (Burn's CBOR codec) writes a float as f16 or f32 when that holds it exactly
    path = tmp_path / "s.bpk"
    bp.save(path, {}, scalars={"half": 0.5, "single": 1.0 + 2.0**-20, "double": 0.1})
    meta = path.read_bytes()[10 : 10 + struct.unpack_from("<I", path.read_bytes(), 6)[0]]
    assert cbor2.dumps("half") + bytes.fromhex("a1 65 46 6c 6f 61 74 f9 38 00") in meta
    assert b"\xfa" + struct.pack(">f", 1.0 + 2.0**-20) in meta
    assert b"\xfb" + struct.pack(">d", 0.1) in meta
    assert bp.read_burnpack(path).scalars == {
        "double": ("Float", 0.1),
        "half": ("Float", 0.5),
        "single": ("Float", 1.0 + 2.0**-20),
    }


def test_round_trip_is_byte_for_byte(tmp_path: Path) -> None:
    tensors = mixed()
    tensors["nv"] = aq.quantize(weights(), "nvfp4")
    tensors["mx"] = aq.quantize(weights(), "mxfp8")
    first, second = tmp_path / "a.bpk", tmp_path / "b.bpk"
    scalars = {"epoch": 3, "lr": 0.5, "done": True, "big": ("UInt", 2**64 - 1)}
    bp.save(first, tensors, param_ids={"q": 9, "mask": 1}, metadata={"k": "v"}, scalars=scalars)
    got = bp.read_burnpack(first, backend="numpy")
    assert got.param_ids == {"q": 9, "mask": 1}
    assert got.metadata == {"k": "v"}
    assert got.scalars == {
        "big": ("UInt", 2**64 - 1),
        "done": ("Bool", True),
        "epoch": ("Int", 3),
        "lr": ("Float", 0.5),
    }
    assert list(got.tensors) == list(tensors)
    for name, want in tensors.items():
        have = got.tensors[name]
        if isinstance(want, aq.QuantizedTensor):
            assert have.scheme == want.scheme
            assert aq.to_bytes(have) == aq.to_bytes(want)
        else:
            assert have.dtype == want.dtype
            assert have.shape == want.shape
            np.testing.assert_array_equal(have, want)
    bp.save(second, got.tensors, param_ids=got.param_ids, metadata=got.metadata, scalars=got.scalars)
    assert second.read_bytes() == first.read_bytes()


@pytest.mark.parametrize("scheme", list(BURN_SCHEMES))
def test_quantized_entries_are_burn_bytes(tmp_path: Path, scheme: str) -> None:
    qt = aq.quantize(weights(), scheme)
    path = tmp_path / "q.bpk"
    bp.save(path, {"w": qt})
    entry = parse(path.read_bytes())["tensors"]["w"]
    assert entry["dtype"] == {"QFloat": BURN_SCHEMES[scheme]}
    assert entry["shape"] == [8, 64]
    assert entry["bytes"] == aq.to_bytes(qt)
    back = bp.load(path, backend="numpy")["w"]
    np.testing.assert_array_equal(aq.dequantize(back), aq.dequantize(qt))


@pytest.mark.parametrize(
    ("text", "storage", "length"),
    [
        ("q4s:block1x32", [32, 1, 1, 1, 1], 1),  # leading 1s dropped
        ("q8s:block4x32:f16", [4, 32, 1, 1, 1], 2),
        ("q8s:block1x1x2x1:f16", [2, 1, 1, 1, 1], 2),  # inner 1s are extents
        ("q8s:block1:f16", [1, 1, 1, 1, 1], 0),  # BlockSize::new([1]) keeps nothing
    ],
)
def test_block_sizes_are_written_canonically(text: str, storage: list[int], length: int) -> None:
    enc = bp.encode_scheme(text)
    assert enc["block"]["size"] == {"storage": storage, "len": length}
    assert bp.decode_scheme(enc) == aq.QuantScheme.parse(text)


def test_schemes_burn_cannot_hold_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SchemeError, match=r"block extents \[256\].*u8"):
        bp.encode_scheme("q2s:block256:f16")
    with pytest.raises(SchemeError, match="table, which Burn's quantized bytes do not carry"):
        bp.encode_scheme("nf4")
    qt = aq.quantize(np.ones((2, 64), np.float32), "nf4")
    with pytest.raises(SchemeError, match=r"tensor 'w': .*table"):
        bp.save(tmp_path / "x.bpk", {"w": qt})
    assert not (tmp_path / "x.bpk").exists()


def test_writer_errors_are_typed(tmp_path: Path) -> None:
    path = tmp_path / "x.bpk"
    with pytest.raises(DTypeError, match="complex64, which Burnpack cannot hold"):
        bp.save(path, {"c": np.ones(2, np.complex64)})
    with pytest.raises(ShapeError, match="'a' appears twice"):
        bp.save_stream(path, iter([("a", np.ones(1)), ("a", np.ones(1))]))
    with pytest.raises(ShapeError, match=r"param id of 'a' is -1"):
        bp.save(path, {"a": np.ones(1)}, param_ids={"a": -1})
    with pytest.raises(ShapeError, match=r"param ids for tensors that are not written: \['b'\]"):
        bp.save(path, {"a": np.ones(1)}, param_ids={"b": 1})
    with pytest.raises(ShapeError, match="metadata value of 'k'"):
        bp.save(path, {"a": np.ones(1)}, metadata={"k": 3})  # type: ignore[dict-item,unused-ignore]
    with pytest.raises(ShapeError, match="scalar 's'"):
        bp.save(path, {}, scalars={"s": "text"})
    with pytest.raises(DTypeError, match="a str, not an array"):
        bp.save(path, {"a": "text"})
    assert not path.exists()
    assert [p for p in tmp_path.iterdir()] == []  # no spool or temporary file left behind


def test_a_failing_stream_leaves_the_target(tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    bp.save(path, {"a": np.ones(2, np.float32)})
    before = path.read_bytes()

    def items() -> Any:
        yield "a", np.zeros(2, np.float32)
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError, match="source failed"):
        bp.save_stream(path, items())
    assert path.read_bytes() == before


# -- reading files made by hand ----------------------------------------------------------------------
def test_hand_made_f32_file_loads(tmp_path: Path) -> None:
    a = np.arange(6, dtype="<f4").reshape(2, 3) / 4
    b = np.array([1e-3, -2.5, 3e30], "<f4")
    meta = {"metadata": {"format": "burnpack", "producer": "burn", "version": "0.22.0-pre.2"}}
    # "b" first in the data, as Burn writes in its module's order while the map is sorted
    path = write(tmp_path, build([("b", "F32", [3], b.tobytes(), 7), ("a", "F32", [2, 3], a.tobytes(), None)], meta))
    assert bp.sniff(path)
    got = bp.read_burnpack(path, backend="numpy")
    assert list(got.tensors) == ["b", "a"]  # file order
    np.testing.assert_array_equal(got.tensors["a"], [[0, 0.25, 0.5], [0.75, 1, 1.25]])
    np.testing.assert_array_equal(got.tensors["b"], np.array([1e-3, -2.5, 3e30], np.float32))
    assert got.tensors["a"].dtype == np.float32
    assert got.param_ids == {"b": 7}
    assert got.metadata == meta["metadata"]
    assert [(n, note) for n, _, note in bp.iter_tensors(path)] == [("b", ""), ("a", "")]


def test_aq_load_and_save_reach_this_module(tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    qt = aq.quantize(weights(), "nvfp4")
    aq.save(path, {"w": qt, "b": np.ones(3, np.float32)}, format="burnpack", param_ids={"w": 5})
    assert parse(path.read_bytes())["tensors"]["w"]["param_id"] == 5
    got = aq.load(path, backend="numpy")
    assert aq.to_bytes(got["w"]) == aq.to_bytes(qt)
    assert got["b"].tolist() == [1.0, 1.0, 1.0]


def test_hand_made_qfloat_is_burns_test_vector(tmp_path: Path) -> None:
    path = write(tmp_path, build([("w", {"QFloat": TWO_LEVEL}, [8], TWO_LEVEL_BYTES, None)]))
    qt = bp.load(path, backend="numpy")["w"]
    assert str(qt.scheme) == "q8s:block4:ue4m3:tensor:f32:native"
    codes = [0, 25, 51, 76, 102, 127, -128, -1]
    want = [c * 0.5 * 3 for c in codes[:4]] + [c * 0.125 * 3 for c in codes[4:]]
    assert aq.dequantize(qt).tolist() == want
    assert aq.to_bytes(qt) == TWO_LEVEL_BYTES


def test_other_dtypes_read_with_notes(tmp_path: Path) -> None:
    x = np.array([1.5, -2.0], "<f4")
    tensors = [
        ("flex", "Flex32", [2], x.tobytes(), None),
        ("b8", {"Bool": "U8"}, [3], b"\x01\x00\x01", None),
        ("b32", {"Bool": "U32"}, [2], struct.pack("<II", 0, 1), None),
        ("i16", "I16", [2], struct.pack("<hh", -3, 4), None),
        ("u32", "U32", [1], struct.pack("<I", 2**32 - 1), None),
    ]
    path = write(tmp_path, build(tensors))
    got = {n: (v, note) for n, v, note in bp.iter_tensors(path)}
    assert got["flex"][1] == "Flex32 read as float32"
    assert got["flex"][0].tolist() == [1.5, -2.0]
    assert got["b8"][1] == "Bool(U8) read as bool"
    assert got["b8"][0].tolist() == [True, False, True]
    assert got["b32"][1] == "Bool(U32) read as bool"
    assert got["b32"][0].tolist() == [False, True]
    assert got["i16"][0].tolist() == [-3, 4]
    assert got["u32"][0].tolist() == [2**32 - 1]


def test_sniff_never_raises(tmp_path: Path) -> None:
    assert not bp.sniff(tmp_path / "missing.bpk")
    assert not bp.sniff(tmp_path)  # a folder
    assert not bp.sniff(write(tmp_path, b"NRU", "short"))
    assert not bp.sniff(write(tmp_path, b"\x08\x00\x00\x00\x00\x00\x00\x00{}", "st"))
    assert bp.sniff(write(tmp_path, b"NRUB", "magic"))


# -- reading: every error typed, with what is wrong ---------------------------------------------------
GOOD = [("w", "F32", [2], struct.pack("<ff", 1, 2), None)]


def entry(dtype: Any = "F32", shape: list[int] | None = None, offsets: list[Any] | None = None) -> dict[str, Any]:
    return {"dtype": dtype, "shape": [2] if shape is None else shape, "data_offsets": offsets or [0, 8]}


DATA = bytes(256)  # a data section the descriptors below fit in
BAD_HEADERS = {
    "empty": (b"", "0 bytes, less than the 10-byte Burnpack header"),
    "short": (b"NRUB\x01\x00", "6 bytes, less than the 10-byte"),
    "magic": (b"GGUF" + bytes(300), "magic 0x46554747 is not Burnpack's 0x4255524E"),
    "version 2": (header_and_meta({"tensors": {}}, version=2), "format version 2; arrayquant reads version 1"),
    "version 0": (header_and_meta({"tensors": {}}, version=0), "format version 0"),
    "metadata_size past the end": (
        header_and_meta({"tensors": {}}, size=10_000),
        "metadata_size 10000 runs past the end",
    ),
    "metadata_size too long": (header_and_meta({"tensors": {}}, size=200), "190 bytes follow the CBOR metadata"),
    "metadata_size too short": (header_and_meta({"tensors": {}}, size=3), "not valid CBOR"),
    "metadata over 100 MiB": (header_and_meta({"tensors": {}}, size=100 * 2**20 + 1), "over Burn's limit of 104857600"),
    "not a map": (header_and_meta([1]), "not a map with a 'tensors' map"),
    "past the end": (header_and_meta({"tensors": {"w": entry()}}), "[0, 8] run past the end of the file"),
    "end before start": (header_and_meta({"tensors": {"w": entry(offsets=[8, 0])}}) + DATA, "end before they start"),
    "over 10 GiB": (header_and_meta({"tensors": {"w": entry(offsets=[0, 11 * 2**30])}}), "over Burn's limit of 10737"),
    "negative extent": (header_and_meta({"tensors": {"w": entry(shape=[-2])}}) + DATA, "shape extent -2 is not"),
    "rank 65": (header_and_meta({"tensors": {"w": entry(shape=[1] * 65)}}) + DATA, "at most 64 extents"),
    "offset not int": (header_and_meta({"tensors": {"w": entry(offsets=[0, 8.0])}}) + DATA, "data offset 8.0 is not"),
    "param_id": (header_and_meta({"tensors": {"w": {**entry(), "param_id": -1}}}) + DATA, "param_id -1 is not"),
    "unknown dtype": (header_and_meta({"tensors": {"w": entry(dtype="F8")}}) + DATA, "dtype 'F8' is not a Burn DType"),
    "bool store": (header_and_meta({"tensors": {"w": entry(dtype={"Bool": "U16"})}}) + DATA, "not a Burn DType"),
    "no offsets": (header_and_meta({"tensors": {"w": {"dtype": "F32", "shape": [2]}}}), "lacks ['data_offsets']"),
    "metadata values": (header_and_meta({"tensors": {}, "metadata": {"k": 1}}), "not a map of strings to strings"),
    "scalar": (header_and_meta({"tensors": {}, "scalars": {"s": {"Int": 2**63}}}), "scalar 's' is {'Int': 9223"),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_bad_headers_are_typed(tmp_path: Path, case: str) -> None:
    data, message = BAD_HEADERS[case]
    with pytest.raises(CorruptDataError, match=re.escape(message)):
        bp.load(write(tmp_path, data), backend="numpy")


def test_cbor_nesting_beyond_burns_limit(tmp_path: Path) -> None:
    deep: Any = 0
    for _ in range(130):
        deep = [deep]
    with pytest.raises(CorruptDataError, match="nesting at most 128"):
        bp.load(write(tmp_path, header_and_meta({"tensors": {}, "extra": deep})))
    shallow: Any = 0
    for _ in range(100):
        shallow = [shallow]
    assert bp.load(write(tmp_path, header_and_meta({"tensors": {}, "extra": shallow}), "ok.bpk")) == {}


def test_cbor_tags_and_duplicate_keys_are_refused(tmp_path: Path) -> None:
    tagged = cbor2.dumps({"tensors": {}, "metadata": {"k": cbor2.CBORTag(1, 0)}})
    with pytest.raises(CorruptDataError, match="no tags"):
        bp.load(write(tmp_path, header_and_meta(tagged)))
    unknown = cbor2.dumps({"tensors": {}, "metadata": {"k": cbor2.CBORTag(99, "v")}})
    with pytest.raises(CorruptDataError, match="CBOR tag 99"):
        bp.load(write(tmp_path, header_and_meta(unknown)))
    dup = b"\xa2" + cbor2.dumps("tensors") + b"\xa0" + cbor2.dumps("tensors") + b"\xa0"
    with pytest.raises(CorruptDataError, match="Duplicate map key"):
        bp.load(write(tmp_path, header_and_meta(dup)))


def test_offsets_overlapping_misaligned_or_mismatched(tmp_path: Path) -> None:
    data = bytes(1024)
    overlap = {"a": entry(offsets=[0, 8]), "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}
    with pytest.raises(CorruptDataError, match=r"data offset 4 is not a multiple of 256"):
        bp.load(write(tmp_path, header_and_meta({"tensors": overlap}) + data))
    overlap["b"] = {"dtype": "U8", "shape": [300], "data_offsets": [0, 300]}
    with pytest.raises(CorruptDataError, match=r"tensors 'a' and 'b' overlap \(data offsets \[0, 8\) and \[0, 300\)\)"):
        bp.load(write(tmp_path, header_and_meta({"tensors": overlap}) + data))
    wrong = {"w": entry(shape=[3], offsets=[0, 8])}
    with pytest.raises(
        CorruptDataError, match=r"dtype 'F32' and shape \[3\] need 12 bytes, but its data_offsets hold 8"
    ):
        bp.load(write(tmp_path, header_and_meta({"tensors": wrong}) + data))
    q = {"w": entry(dtype={"QFloat": TWO_LEVEL}, shape=[8], offsets=[0, 13])}
    with pytest.raises(CorruptDataError, match=r"QFloat q8s:block4:ue4m3:tensor:f32:native.*need 14 bytes.*hold 13"):
        bp.load(write(tmp_path, header_and_meta({"tensors": q}) + data))


def test_bool_bytes_other_than_0_or_1_are_corrupt(tmp_path: Path) -> None:
    path = write(tmp_path, build([("m", {"Bool": "Native"}, [3], b"\x01\x02\x00", None)]))
    with pytest.raises(CorruptDataError, match="tensor 'm': bool value 2 at flat index 1 is not 0 or 1"):
        bp.load(path)


def test_qfloat_encodings_other_than_the_target_are_refused(tmp_path: Path) -> None:
    old = {"value": "Q8S", "param": "F32", "store": "Native", "level": "Tensor", "mode": "Symmetric"}
    path = write(tmp_path, build([("w", {"QFloat": old}, [4], bytes(8), None)]))
    with pytest.raises(
        SchemeError, match=r"tensor 'w': .*before 2026-08-19.*reads the QuantScheme encoding of Burn 2c06be35"
    ):
        bp.load(path)
    lookup: dict[str, Any] = {**BURN_SCHEMES["q8s:native"], "mode": "Lookup"}
    with pytest.raises(SchemeError, match=r"mode 'Lookup'.*'Symmetric' schemes only"):
        bp.load(write(tmp_path, build([("w", {"QFloat": lookup}, [4], bytes(8), None)]), "l.bpk"))
    for bad, message in [
        ({**TWO_LEVEL, "value": "Q3S"}, "QFloat value 'Q3S' is not one of Q8F"),
        ({**TWO_LEVEL, "store": {"PackedU16": 0}}, "QFloat store"),
        ({**TWO_LEVEL, "tensor": "F8"}, "QFloat tensor scale dtype 'F8'"),
        ({**TWO_LEVEL, "block": {"size": {"storage": [4], "len": 1}, "dtype": "F32"}}, "QFloat block size"),
        ({**TWO_LEVEL, "block": {"size": [4], "dtype": "F32"}}, "QFloat block"),
        ({**TWO_LEVEL, "extra": 1}, "keys .*'extra'"),
        ("Q8S", "is not a map"),
    ]:
        with pytest.raises(SchemeError, match=message):
            bp.decode_scheme(bad)


def test_lying_sizes_allocate_nothing_like_them(tmp_path: Path) -> None:
    big = {"w": entry(shape=[2**37], offsets=[0, 2**39])}  # 512 GiB claimed, over Burn's per-tensor limit
    paths = [
        write(tmp_path, header_and_meta({"tensors": big}), "a.bpk"),
        write(tmp_path, header_and_meta({"tensors": {"w": entry(shape=[2**30], offsets=[0, 2**32])}}), "b.bpk"),
        write(tmp_path, header_and_meta({"tensors": {}}, size=2**32 - 1), "c.bpk"),
        write(tmp_path, header_and_meta({"tensors": {}}, size=50 * 2**20), "d.bpk"),
    ]
    tracemalloc.start()
    try:
        for p in paths:
            with pytest.raises(CorruptDataError):
                bp.load(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_too_many_tensors(tmp_path: Path) -> None:
    many = {f"t{i}": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for i in range(100_001)}
    with pytest.raises(CorruptDataError, match="100001 tensors is over Burn's limit of 100000"):
        bp.load(write(tmp_path, header_and_meta({"tensors": many})))


# -- re-quantizing and streaming ------------------------------------------------------------------------
def test_quantize_file_keeps_everything_else(tmp_path: Path) -> None:
    x = weights()
    src, dst = tmp_path / "m.bpk", tmp_path / "q.bpk"
    tensors = {
        "l0.weight": x,
        "l0.bias": x[0],
        "norm.weight": x[:2],
        "emb": x.astype(np.float16),
        "steps": np.arange(4, dtype=np.int64),
        "conv": np.ones((2, 2, 32), np.float32),
    }
    bp.save(src, tensors, param_ids={"l0.weight": 11, "steps": 12}, metadata={"producer": "burn"}, scalars={"n": 4})
    seen: list[str] = []
    summary = bp.quantize_file(src, dst, "q8s:block32:f16:native", progress=seen.append)
    assert (summary.scheme, summary.format) == ("q8s:block32:f16:native", "burnpack")
    assert summary.quantized == ["l0.weight", "emb"]
    assert summary.left_out == {
        "l0.bias": "rank 1 (only 2-d weights by default)",
        "norm.weight": "a norm or a bias",
        "steps": "not a float tensor (I64)",
        "conv": "rank 3 (only 2-d weights by default)",
    }
    assert seen == list(tensors)
    got = bp.read_burnpack(dst, backend="numpy")
    assert list(got.tensors) == list(tensors)
    assert (got.param_ids, got.metadata, got.scalars) == (
        {"l0.weight": 11, "steps": 12},
        {"producer": "burn"},
        {"n": ("Int", 4)},
    )
    for name in ("l0.weight", "emb"):
        want = aq.quantize(np.asarray(tensors[name], np.float32), "q8s:block32:f16:native")
        assert aq.to_bytes(got.tensors[name]) == aq.to_bytes(want)
    src_parsed, dst_parsed = parse(src.read_bytes()), parse(dst.read_bytes())
    for name in ("l0.bias", "norm.weight", "steps", "conv"):  # copied as stored
        assert dst_parsed["tensors"][name]["bytes"] == src_parsed["tensors"][name]["bytes"]
        assert dst_parsed["tensors"][name]["dtype"] == src_parsed["tensors"][name]["dtype"]
    # a second pass leaves quantized tensors alone; include/exclude pick by name
    again = bp.quantize_file(dst, tmp_path / "r.bpk", "q4s:block32", include=["*"], exclude=["emb"])
    assert again.quantized == ["l0.bias", "norm.weight", "conv"]
    assert again.left_out["emb"].startswith("quantized already")
    assert again.left_out["steps"].startswith("not a float")


def test_quantize_file_in_place_and_refusals(tmp_path: Path) -> None:
    src = tmp_path / "m.bpk"
    bp.save(src, {"w": weights()})
    bp.quantize_file(src, src, "q8s:native")
    assert str(bp.load(src, backend="numpy")["w"].scheme) == "q8s:native"
    with pytest.raises(SchemeError, match="u8"):
        bp.quantize_file(src, tmp_path / "x.bpk", "q2s:block256:f16")
    bp.save(src, {"w": np.full((2, 32), np.nan, np.float32)})
    with pytest.raises(NonFiniteInputError, match="tensor 'w' of"):
        bp.quantize_file(src, tmp_path / "x.bpk", "q8s")
    assert not (tmp_path / "x.bpk").exists()


def test_safetensors_stream_into_burnpack(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    x = weights()
    st = tmp_path / "m.safetensors"
    save_file({"w": x, "bias": x[0], "flag": np.array([True, False])}, str(st))
    dst = tmp_path / "m.bpk"
    with SafetensorsFile(st) as f:

        def items() -> Any:
            for e in f.entries.values():
                yield (e.name, aq.quantize(f.array(e.name), "nvfp4")) if e.name == "w" else (e.name, Passthrough(f, e))

        bp.save_stream(dst, items())
    parsed = parse(dst.read_bytes())["tensors"]
    assert parsed["bias"]["dtype"] == "F32"
    assert parsed["bias"]["bytes"] == x[0].tobytes()
    assert parsed["flag"]["dtype"] == {"Bool": "Native"}
    assert parsed["flag"]["bytes"] == b"\x01\x00"
    assert parsed["w"]["bytes"] == aq.to_bytes(aq.quantize(x, "nvfp4"))


def test_safetensors_dtypes_burn_lacks_are_refused(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    st = tmp_path / "f8.safetensors"
    save_file({"s": np.zeros(4, ml_dtypes.float8_e4m3fn)}, str(st))
    with (
        SafetensorsFile(st) as f,
        pytest.raises(DTypeError, match="safetensors dtype F8_E4M3, which Burn has no DType"),
    ):
        bp.save_stream(tmp_path / "x.bpk", ((e.name, Passthrough(f, e)) for e in f.entries.values()))
    assert not (tmp_path / "x.bpk").exists()


def test_a_file_cut_while_open_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    bp.save(path, {"w": np.ones(100, np.float32)})
    with bp.BurnpackFile(path) as f:
        os.truncate(path, 300)
        with pytest.raises(CorruptDataError, match="the file ends 356 bytes early; it changed or was truncated"):
            f.raw("w")


# -- fuzzing -------------------------------------------------------------------------------------------
def fuzz_burnpack(data: bytes) -> None:
    """Read ``data`` as a Burnpack file: load, iterate and re-quantize; only typed errors escape."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "f.bpk")
        with open(path, "wb") as f:
            f.write(data)
        try:
            bp.sniff(path)
            got = bp.read_burnpack(path, backend="numpy")
            for value in got.tensors.values():
                if isinstance(value, aq.QuantizedTensor):
                    aq.dequantize(value)
            list(bp.iter_tensors(path))
            bp.quantize_file(path, os.path.join(folder, "q.bpk"), "q8s")
        except QuantizationError:
            pass


def _seed_files() -> list[bytes]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "s.bpk"
        bp.save(path, mixed(), param_ids={"q": 1}, metadata={"k": "v"}, scalars={"s": 1})
        first = path.read_bytes()
    return [first, build([("w", {"QFloat": TWO_LEVEL}, [8], TWO_LEVEL_BYTES, 3)])]


def test_fuzz_burnpack_mutations() -> None:
    rng = random.Random(11)
    for seed in _seed_files():
        fuzz_burnpack(seed)
        for _ in range(60):
            data = bytearray(seed)
            kind = rng.randrange(3)
            if kind == 0:  # flip bytes in the header and metadata
                for _ in range(rng.randrange(1, 4)):
                    i = rng.randrange(min(len(data), 600))
                    data[i] = rng.randrange(256)
            elif kind == 1:  # truncate
                data = data[: rng.randrange(len(data))]
            else:  # a lying metadata_size
                data[6:10] = struct.pack("<I", rng.choice([0, 1, len(data), 2**32 - 1, rng.randrange(2**16)]))
            fuzz_burnpack(bytes(data))
