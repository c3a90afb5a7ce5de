"""Checkpoints (``aq.save`` / ``aq.load``) and the Burn byte layout: round trips, atomic writes, validation.

Round trips are bit for bit: the stored values, scales and per-tensor scale, the Burn bytes and
the dequantized floats of a loaded tensor equal those of the tensor that was saved, on every
backend of the ``xp`` fixture and across backends. Broken files are built with the raw
safetensors API (``serialize`` + ``TensorSpec``), never with ``aq.save`` itself, and each one
must end in a typed error whose message names the tensor.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import struct
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors

import arrayquant as aq
import arrayquant.io.arrayquant.checkpoint as checkpoint
from arrayquant.backends import shim

VALUES = ("q8s", "q8f", "q4s", "q4f", "q2s", "q2f", "e4m3", "e5m2", "e2m1")
LEVELS = (
    "tensor:f32",
    "tensor:f16",
    "block8:f16",
    "block8:bf16",
    "block8:ue4m3",
    "block8:ue8m0",
    "block8:ue4m3:tensor:f32",
)
STORES = ("native", "packed_u32", "packed_u32:1", "packed_native")
TWO_LEVEL = "q8s:block4:ue4m3:tensor:f32:native"
SMALLEST_UE8M0_BITS = 0x00400000  # 2^-127 as f32 bits

# safetensors header dtype -> the dtype name TensorSpec takes
SPEC_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}


def schemes_for(value: str) -> list[str]:
    """Every level combination and store that fits ``value`` (packed_native is E2M1 only)."""
    out = []
    for level, store in itertools.product(LEVELS, STORES):
        if store == "packed_native" and value != "e2m1":
            continue
        out.append(f"{value}:{level}:{store}")
    return out


def sample(shape: tuple[int, ...] = (5, 19), seed: int = 0) -> np.ndarray:
    """Normal data with an all-zero row (zero block scales) and a few large entries."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    x[1] = 0
    x.reshape(-1)[:3] = [100.0, -0.0, 1e-6]
    return x


def settle(qt: aq.QuantizedTensor) -> aq.QuantizedTensor:
    """Compute a lazy (dask) tensor once so later reads do not re-run the quantization graph."""
    if not hasattr(qt.values, "persist"):
        return qt
    import dask

    values, scales, glob = dask.persist(qt.values, qt.scales, qt.global_scale)  # one shared computation
    return dataclasses.replace(qt, values=values, scales=scales, global_scale=glob)


def host_bits(arr: Any) -> np.ndarray:
    """The bit pattern of a float array on the host, so -0.0 and 0.0 differ."""
    host = np.ascontiguousarray(shim.to_host(arr))
    return host.view(np.dtype(f"u{host.dtype.itemsize}"))


def assert_same_tensor(
    got: aq.QuantizedTensor, want: aq.QuantizedTensor, want_bytes: bytes | None = None, want_deq: Any = None
) -> None:
    """Same scheme, shape, stored arrays, Burn bytes and dequantized bits (expected ones may be passed in)."""
    assert got.scheme == want.scheme
    assert tuple(got.shape) == tuple(want.shape)
    assert aq.to_bytes(got) == (aq.to_bytes(want) if want_bytes is None else want_bytes)
    np.testing.assert_array_equal(shim.to_host(got.values), shim.to_host(want.values))
    got_s, want_s = host_bits(got.scales), host_bits(want.scales)
    if got.scheme.scale_dtype is aq.ScaleDtype.UE8M0:
        # docs/spec.md, backends: those that flush subnormals hold UE8M0's smallest value 2^-127 as 0;
        # both are the stored code 0x00 (to_bytes above is identical)
        got_s, want_s = (np.where(b == SMALLEST_UE8M0_BITS, 0, b) for b in (got_s, want_s))
    np.testing.assert_array_equal(got_s, want_s)
    if want.global_scale is None:
        assert got.global_scale is None
    else:
        np.testing.assert_array_equal(host_bits(got.global_scale), host_bits(want.global_scale))
    want_deq = host_bits(aq.dequantize(want)) if want_deq is None else want_deq
    np.testing.assert_array_equal(host_bits(aq.dequantize(got)), want_deq)


# ---------------------------------------------------------------------------------------------
# raw safetensors files, for the broken cases
# ---------------------------------------------------------------------------------------------

Entry = tuple[str, list[int], bytes]  # header dtype, shape, raw little-endian bytes


def read_entries(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    """The entries and metadata of a safetensors file, through the format library itself."""
    blob = path.read_bytes()
    header_len = int.from_bytes(blob[:8], "little")
    meta = json.loads(blob[8 : 8 + header_len]).get("__metadata__", {})
    entries = {k: (v["dtype"], list(v["shape"]), bytes(v["data"])) for k, v in safetensors.deserialize(blob)}
    return entries, meta


def write_raw(path: Path, entries: Mapping[str, Entry], metadata: Mapping[str, str] | None) -> Path:
    """A safetensors file with exactly these entries, written with ``serialize``/``TensorSpec``."""
    buffers = {k: np.frombuffer(raw, np.uint8) if raw else np.zeros(0, np.uint8) for k, (_, _, raw) in entries.items()}
    specs = {
        k: safetensors.TensorSpec(
            dtype=SPEC_DTYPES[dtype], shape=shape, data_ptr=buffers[k].ctypes.data, data_len=len(raw)
        )
        for k, (dtype, shape, raw) in entries.items()
    }
    path.write_bytes(safetensors.serialize(specs, metadata=dict(metadata) if metadata is not None else None))
    return path


def write_header(path: Path, header: Mapping[str, Any], data: bytes = b"") -> Path:
    """A file with a hand-written JSON header (for lies the serializer would refuse to write)."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def describe(scheme: str, shape: list[int], dtype: str = "float32") -> str:
    return json.dumps({"scheme": scheme, "dtype": dtype, "shape": shape})


def good_file(tmp_path: Path, scheme: str = TWO_LEVEL, shape: tuple[int, ...] = (2, 8)) -> Path:
    path = tmp_path / "good.safetensors"
    aq.save(path, {"w": aq.quantize(sample(shape), scheme), "bias": np.arange(3, dtype=np.float32)})
    return path


def broken(tmp_path: Path, edit: Callable[[dict[str, Entry], dict[str, str]], None], scheme: str = TWO_LEVEL) -> Path:
    """A valid checkpoint of ``w`` (scheme) and ``bias``, re-written raw after ``edit``."""
    entries, meta = read_entries(good_file(tmp_path, scheme))
    edit(entries, meta)
    return write_raw(tmp_path / "broken.safetensors", entries, meta)


# ---------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", VALUES)
def test_round_trip_every_level_and_store(xp: Any, value: str, tmp_path: Path) -> None:
    x = xp.asarray(sample())
    path = tmp_path / "w.safetensors"
    for text in schemes_for(value):
        qt = settle(aq.quantize(x, text))
        want_bytes, want_deq = aq.to_bytes(qt), host_bits(aq.dequantize(qt))
        aq.save(path, {"w": qt})
        loaded = aq.load(path, backend=xp.backend.library, device=xp.device)["w"]
        assert shim.backend_name(loaded.values) == xp.backend.library, text
        assert loaded.device == qt.device, text
        assert loaded.dtype == qt.dtype, text
        assert_same_tensor(loaded, qt, want_bytes, want_deq)
        # across backends: the same bytes read on NumPy
        on_numpy = aq.load(path, backend="numpy")["w"]
        assert shim.backend_name(on_numpy.values) == "numpy"
        assert aq.to_bytes(on_numpy) == want_bytes, text
        np.testing.assert_array_equal(host_bits(aq.dequantize(on_numpy)), want_deq)


def test_round_trip_covers_the_whole_matrix() -> None:
    schemes = [s for v in VALUES for s in schemes_for(v)]
    assert len(schemes) == len(set(schemes)) == 9 * 7 * 3 + 7  # e2m1 adds packed_native
    for text in schemes:
        aq.QuantScheme.parse(text)  # each one is a valid scheme


@pytest.mark.parametrize(
    ("scheme", "shape"),
    [
        ("q4s:block2x8:f16:packed_u32:1", (3, 5, 19)),
        ("e2m1:block2x16:ue4m3:tensor:f32:packed_native", (2, 3, 33)),
        ("q8f:block3x1x4:bf16:native", (4, 2, 9)),
        ("nvfp4", (3, 48)),
        ("mxfp8", (2, 64)),
        ("mxfp4", (2, 64)),
        ("q8s", (7,)),
    ],
)
def test_round_trip_other_ranks_and_presets(xp: Any, scheme: str, shape: tuple[int, ...], tmp_path: Path) -> None:
    qt = settle(aq.quantize(xp.asarray(sample(shape, seed=3)), scheme))
    path = tmp_path / "w.safetensors"
    aq.save(path, {"w": qt})
    assert_same_tensor(aq.load(path, backend=xp.backend.library, device=xp.device)["w"], qt)
    assert aq.to_bytes(aq.load(path, backend="numpy")["w"]) == aq.to_bytes(qt)


def test_round_trip_lookup_table(tmp_path: Path) -> None:
    qt = aq.quantize(sample((4, 32)), "q4f:block16:f16:lookup:packed_u32", table=np.asarray(aq.NF4, np.float32))
    path = tmp_path / "w.safetensors"
    aq.save(path, {"w": qt})
    entries, _ = read_entries(path)
    assert entries["w.table"][:2] == ("F32", [16])
    loaded = aq.load(path, backend="numpy")["w"]
    np.testing.assert_array_equal(loaded.table, qt.table)
    assert_same_tensor(loaded, qt)


def test_several_tensors_and_plain_arrays_in_one_file(xp: Any, tmp_path: Path) -> None:
    a = settle(aq.quantize(xp.asarray(sample()), "nvfp4"))
    b = settle(aq.quantize(xp.asarray(sample((3, 8), seed=1)), "q8s:block4:f16:packed_u32:1"))
    path = tmp_path / "m.safetensors"
    aq.save(path, {"layer.0.w": a, "layer.1.w": b, "layer.0.bias": xp.asarray(np.arange(5, dtype=np.float32))})
    out = aq.load(path, backend=xp.backend.library, device=xp.device)
    assert sorted(out) == ["layer.0.bias", "layer.0.w", "layer.1.w"]
    assert_same_tensor(out["layer.0.w"], a)
    assert_same_tensor(out["layer.1.w"], b)
    np.testing.assert_array_equal(shim.to_host(out["layer.0.bias"]), np.arange(5, dtype=np.float32))


def test_layout_on_disk(tmp_path: Path) -> None:
    qt = aq.quantize(sample((2, 8)), TWO_LEVEL)
    path = tmp_path / "w.safetensors"
    aq.save(path, {"w": qt})
    entries, meta = read_entries(path)
    assert meta["arrayquant.format"] == "2"
    assert json.loads(meta["arrayquant.tensor.w"]) == {"scheme": TWO_LEVEL, "dtype": "float32", "shape": [2, 8]}
    assert sorted(entries) == ["w.global_scale", "w.qvalues", "w.scales"]  # nothing under the plain name
    assert entries["w.qvalues"][:2] == ("I8", [2, 8])
    assert entries["w.scales"][:2] == ("F8_E4M3", [2, 2])
    assert entries["w.global_scale"][:2] == ("F32", [1])
    # the Burn bytes are exactly values, scales and global one after another
    assert entries["w.qvalues"][2] + entries["w.scales"][2] + entries["w.global_scale"][2] == aq.to_bytes(qt)


@pytest.mark.parametrize(
    ("scale", "header"), [("f32", "F32"), ("f16", "F16"), ("bf16", "BF16"), ("ue4m3", "F8_E4M3"), ("ue8m0", "F8_E8M0")]
)
def test_scale_dtypes_on_disk(scale: str, header: str, tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    aq.save(path, {"w": aq.quantize(sample(), f"q8s:block8:{scale}:native")})
    entries, _ = read_entries(path)
    assert entries["w.scales"][:2] == (header, [5, 3])
    assert "w.global_scale" not in entries


PLAIN = {
    "f32": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4),
    "f16": np.array([0.5, -0.0, 65504, np.inf], np.float16),
    "i64": np.array([-(2**62), -1, 0, 2**62], np.int64),
    "bf16": np.array([1.5, -3.0, 1e-30, 3.0e38], ml_dtypes.bfloat16),
    "u8": np.arange(7, dtype=np.uint8),
    "bool": np.array([True, False, True]),
    "f8": np.array([1.0, -448.0, 0.015625], ml_dtypes.float8_e4m3fn),
    "zero_d": np.array(2.5, np.float32),
}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_arrays_round_trip(name: str, tmp_path: Path) -> None:
    arr = PLAIN[name]
    path = tmp_path / "p.safetensors"
    aq.save(path, {name: arr})
    got = aq.load(path, backend="numpy")[name]
    assert isinstance(got, np.ndarray)
    assert got.dtype == arr.dtype
    assert got.shape == arr.shape
    assert got.tobytes() == arr.tobytes()


def test_plain_arrays_from_every_backend(xp: Any, tmp_path: Path) -> None:
    arrays = {"f32": PLAIN["f32"], "i64": PLAIN["i64"]}
    path = tmp_path / "p.safetensors"
    aq.save(path, {k: xp.asarray(v) for k, v in arrays.items()})
    out = aq.load(path, backend=xp.backend.library, device=xp.device)
    for k, v in arrays.items():
        assert shim.backend_name(out[k]) == xp.backend.library
        want = v.astype(np.int32) if v.dtype == np.int64 and xp.backend.library == "jax" else v  # jax without x64
        np.testing.assert_array_equal(shim.to_host(out[k]), want)


def test_round_trip_float16_and_bfloat16_originals(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    for dtype in (np.float16, ml_dtypes.bfloat16):
        qt = aq.quantize(sample().astype(dtype), "q8s:block8:f16:native")
        aq.save(path, {"w": qt})
        meta = read_entries(path)[1]
        assert json.loads(meta["arrayquant.tensor.w"])["dtype"] == np.dtype(dtype).name
        loaded = aq.load(path, backend="numpy")["w"]
        assert aq.to_bytes(loaded) == aq.to_bytes(qt)


# ---------------------------------------------------------------------------------------------
# atomic writes
# ---------------------------------------------------------------------------------------------


def _previous(tmp_path: Path) -> tuple[Path, bytes]:
    target = tmp_path / "model.safetensors"
    aq.save(target, {"w": aq.quantize(sample(), "q8s:native")})
    return target, target.read_bytes()


def _assert_intact(target: Path, before: bytes) -> None:
    assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name], "a temporary file was left behind"
    aq.load(target)  # still a valid checkpoint


def test_crash_before_rename_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target, before = _previous(tmp_path)

    def crash(src: Any, dst: Any) -> None:
        assert Path(src).stat().st_size > 0  # the new file was fully written next to the target
        raise OSError("simulated crash at rename")

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash at rename"):
        aq.save(target, {"w": aq.quantize(sample(seed=9), "nvfp4")})
    monkeypatch.undo()
    _assert_intact(target, before)


def test_crash_mid_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target, before = _previous(tmp_path)
    real_fdopen = os.fdopen

    class HalfWriter:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> HalfWriter:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

        def write(self, data: Any) -> int:
            view = memoryview(data)
            self.f.write(view[: len(view) // 2])
            self.f.flush()
            raise OSError("simulated disk full")

    monkeypatch.setattr(checkpoint.os, "fdopen", lambda fd, *a, **k: HalfWriter(real_fdopen(fd, *a, **k)))
    with pytest.raises(OSError, match="simulated disk full"):
        aq.save(target, {"w": aq.quantize(sample(seed=9), "nvfp4")})
    monkeypatch.undo()
    _assert_intact(target, before)


def test_interrupt_during_fsync_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target, before = _previous(tmp_path)

    def interrupt(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        aq.save(target, {"w": aq.quantize(sample(seed=9), "q4s:block8:f16")})
    monkeypatch.undo()
    _assert_intact(target, before)


def test_invalid_tensor_writes_nothing(tmp_path: Path) -> None:
    target, before = _previous(tmp_path)
    bad = dataclasses.replace(aq.quantize(sample(), TWO_LEVEL), global_scale=None)
    with pytest.raises(aq.MissingGlobalScaleError, match="two-level scheme"):
        aq.save(target, {"w": bad})
    _assert_intact(target, before)


def test_save_creates_a_new_file(tmp_path: Path) -> None:
    target = tmp_path / "new.safetensors"
    aq.save(str(target), {"w": aq.quantize(sample(), "q8s")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.safetensors"]


# ---------------------------------------------------------------------------------------------
# validation on load: every broken file is a typed error naming the tensor
# ---------------------------------------------------------------------------------------------


def test_broken_file_builder_round_trips_a_good_file(tmp_path: Path) -> None:
    path = broken(tmp_path, lambda entries, meta: None)
    out = aq.load(path, backend="numpy")
    assert aq.to_bytes(out["w"]) == aq.to_bytes(aq.load(tmp_path / "good.safetensors")["w"])


@pytest.mark.parametrize("version", ["3", "0", "1.0", "", "one"])
def test_unknown_format_version(tmp_path: Path, version: str) -> None:
    path = broken(tmp_path, lambda e, m: m.update({"arrayquant.format": version}))
    pattern = rf"checkpoint format '{version}'; this arrayquant reads format '2' \(and the older '1'\), upgrade it"
    with pytest.raises(aq.CorruptDataError, match=pattern):
        aq.load(path)


def test_described_tensors_without_format_key(tmp_path: Path) -> None:
    path = broken(tmp_path, lambda e, m: m.pop("arrayquant.format"))
    with pytest.raises(aq.CorruptDataError, match=r"names no arrayquant\.format; it was not written by arrayquant"):
        aq.load(path)


def test_file_without_arrayquant_metadata_loads_plain_arrays(tmp_path: Path) -> None:
    arr = np.arange(6, dtype=np.float32)
    path = write_raw(tmp_path / "plain.safetensors", {"x": ("F32", [6], arr.tobytes())}, None)
    out = aq.load(path)
    np.testing.assert_array_equal(shim.to_host(out["x"]), arr)


@pytest.mark.parametrize("text", ["q9s", "q8s:block0:f16", "q8s:packed_native", "", "nvfp4:native", "e4m3:lookup"])
def test_scheme_text_that_does_not_parse(tmp_path: Path, text: str) -> None:
    path = broken(tmp_path, lambda e, m: m.update({"arrayquant.tensor.w": describe(text, [2, 8])}))
    with pytest.raises(aq.SchemeError, match=r"^tensor 'w': "):
        aq.load(path)


@pytest.mark.parametrize(
    ("info", "error", "pattern"),
    [
        ("{not json", aq.CorruptDataError, r"tensor 'w' has unreadable metadata"),
        ("[1, 2]", aq.CorruptDataError, r"tensor 'w' has unreadable metadata"),
        (json.dumps({"scheme": TWO_LEVEL, "shape": [2, 8]}), aq.CorruptDataError, r"tensor 'w' .*'dtype'"),
        (json.dumps({"scheme": 7, "dtype": "float32", "shape": [2, 8]}), aq.SchemeError, r"tensor 'w': scheme text"),
        (describe(TWO_LEVEL, []), aq.ShapeError, r"tensor 'w': w shape in the metadata"),
        (describe(TWO_LEVEL, [2, -8]), aq.ShapeError, r"tensor 'w': w shape in the metadata"),
        (json.dumps({"scheme": TWO_LEVEL, "dtype": "float32", "shape": "2x8"}), aq.ShapeError, r"tensor 'w'"),
        (describe(TWO_LEVEL, [2, 16]), aq.ShapeError, r"tensor 'w': values have shape \(2, 8\)"),
        (describe(TWO_LEVEL, [16]), aq.ShapeError, r"tensor 'w': values have shape \(2, 8\) .* stores \(16,\)"),
        (describe(TWO_LEVEL, [2, 8], "int8"), aq.CorruptDataError, r"tensor 'w'.*dtype 'int8'"),
        (describe(TWO_LEVEL, [2, 8], "asarray"), aq.CorruptDataError, r"tensor 'w'.*dtype 'asarray'"),
        ("[" * 100_000, aq.CorruptDataError, r"tensor 'w' has unreadable metadata"),
    ],
)
def test_unreadable_tensor_metadata(tmp_path: Path, info: str, error: type[Exception], pattern: str) -> None:
    path = broken(tmp_path, lambda e, m: m.update({"arrayquant.tensor.w": info}))
    with pytest.raises(error, match=pattern):
        aq.load(path)


def test_described_tensor_without_values(tmp_path: Path) -> None:
    path = broken(tmp_path, lambda e, m: e.pop("w.qvalues"))
    with pytest.raises(
        aq.CorruptDataError, match=r"tensor 'w' is described in the metadata but its values entry 'w\.qvalues' is"
    ):
        aq.load(path)


def test_missing_scales(tmp_path: Path) -> None:
    path = broken(tmp_path, lambda e, m: e.pop("w.scales"))
    with pytest.raises(
        aq.CorruptDataError, match=r"tensor 'w' \(scheme q8s:block4:ue4m3:tensor:f32:native\) has no w\.scales"
    ):
        aq.load(path)


@pytest.mark.parametrize("stray", ["x.scales", "x.global_scale", "bias.scales", "x.table"])
def test_stray_sibling_entries(tmp_path: Path, stray: str) -> None:
    path = broken(tmp_path, lambda e, m: e.update({stray: ("F32", [1], np.float32(1).tobytes())}))
    with pytest.raises(aq.CorruptDataError, match=rf"entries \['{stray}'\] that belong to no quantized tensor"):
        aq.load(path)


def test_missing_global_scale(tmp_path: Path) -> None:
    path = broken(tmp_path, lambda e, m: e.pop("w.global_scale"))
    with pytest.raises(aq.MissingGlobalScaleError) as info:
        aq.load(path)
    msg = str(info.value)
    for part in ("tensor 'w'", TWO_LEVEL, "two-level scheme", "per-tensor scale", "w.global_scale", "re-export"):
        assert part in msg, (part, msg)


def test_unexpected_global_scale(tmp_path: Path) -> None:
    def add(e: dict[str, Entry], m: dict[str, str]) -> None:
        e["w.global_scale"] = ("F32", [1], np.float32(2).tobytes())

    path = broken(tmp_path, add, scheme="q8s:block4:f16:native")
    with pytest.raises(
        aq.UnexpectedGlobalScaleError, match=r"tensor 'w' has scheme .* one scale level.*w\.global_scale"
    ):
        aq.load(path)


@pytest.mark.parametrize(
    ("key", "entry", "error", "pattern"),
    [
        (
            "w.scales",
            ("F32", [2, 2], np.ones(4, "<f4").tobytes()),
            aq.CorruptDataError,
            r"'w\.scales' has dtype F32, expected F8_E4M3",
        ),
        (
            "w.scales",
            ("U8", [2, 2], bytes([0x30] * 4)),
            aq.CorruptDataError,
            r"'w\.scales' has dtype U8, expected F8_E4M3",
        ),
        (
            "w.scales",
            ("F8_E4M3", [4], bytes([0x30] * 4)),
            aq.ShapeError,
            r"tensor 'w': w\.scales has shape \(4,\) .* needs \(2, 2\)",
        ),
        (
            "w.scales",
            ("F8_E4M3", [2, 3], bytes([0x30] * 6)),
            aq.ShapeError,
            r"tensor 'w': w\.scales has shape \(2, 3\)",
        ),
        (
            "w.global_scale",
            ("F16", [1], np.ones(1, "<f2").tobytes()),
            aq.CorruptDataError,
            r"'w\.global_scale' has dtype F16, expected F32",
        ),
        ("w.global_scale", ("F32", [2], np.ones(2, "<f4").tobytes()), aq.ShapeError, r"tensor 'w'.*global"),
        (
            "w.qvalues",
            ("I8", [16], bytes(16)),
            aq.ShapeError,
            r"tensor 'w': values have shape \(16,\) but .* stores \(2, 8\)",
        ),
        ("w.qvalues", ("I8", [2, 7], bytes(14)), aq.ShapeError, r"tensor 'w': values have shape \(2, 7\)"),
        (
            "w.qvalues",
            ("U8", [2, 8], bytes(16)),
            aq.CorruptDataError,
            r"^tensor 'w': entry 'w\.qvalues' has dtype U8, expected I8$",
        ),
        (
            "w.qvalues",
            ("U32", [2, 2], bytes(16)),
            aq.CorruptDataError,
            r"^tensor 'w': entry 'w\.qvalues' has dtype U32, expected I8$",
        ),
    ],
)
def test_wrong_dtypes_and_shapes(tmp_path: Path, key: str, entry: Entry, error: type[Exception], pattern: str) -> None:
    path = broken(tmp_path, lambda e, m: e.update({key: entry}))
    with pytest.raises(error, match=pattern):
        aq.load(path)


@pytest.mark.parametrize(
    ("scheme", "key", "entry", "error", "pattern"),
    [
        (
            "q8s:block8:f32:native",
            "w.scales",
            ("F32", [2, 1], np.array([np.nan, 1], "<f4").tobytes()),
            aq.ParamsError,
            "nan",
        ),
        (
            "q8s:block8:f32:native",
            "w.scales",
            ("F32", [2, 1], np.array([1, -0.5], "<f4").tobytes()),
            aq.ParamsError,
            "-0.5",
        ),
        (
            "q8s:block8:f32:native",
            "w.scales",
            ("F32", [2, 1], np.array([1, np.inf], "<f4").tobytes()),
            aq.ParamsError,
            "inf",
        ),
        (
            "q8s:block8:f16:native",
            "w.scales",
            ("F16", [2, 1], np.array([1, -2], "<f2").tobytes()),
            aq.ParamsError,
            "-2",
        ),
        ("q8s:block8:bf16:native", "w.scales", ("BF16", [2, 1], bytes.fromhex("807f80bf")), aq.ParamsError, "invalid"),
        ("q8s:tensor:f32:native", "w.scales", ("F32", [1], np.array([np.nan], "<f4").tobytes()), aq.ParamsError, "nan"),
        (TWO_LEVEL, "w.global_scale", ("F32", [1], np.array([np.nan], "<f4").tobytes()), aq.ParamsError, "nan"),
        (TWO_LEVEL, "w.global_scale", ("F32", [1], np.array([-3.0], "<f4").tobytes()), aq.ParamsError, "-3"),
        (TWO_LEVEL, "w.scales", ("F8_E4M3", [2, 2], bytes([0x30, 0x7F, 0x30, 0x30])), aq.CorruptDataError, "0x7F"),
        (TWO_LEVEL, "w.scales", ("F8_E4M3", [2, 2], bytes([0x30, 0xB0, 0x30, 0x30])), aq.CorruptDataError, "0xB0"),
        ("e4m3:block8:ue8m0:native", "w.scales", ("F8_E8M0", [2, 1], bytes([0x7F, 0xFF])), aq.CorruptDataError, "0xFF"),
    ],
)
def test_nan_and_negative_scales(
    tmp_path: Path, scheme: str, key: str, entry: Entry, error: type[Exception], pattern: str
) -> None:
    path = broken(tmp_path, lambda e, m: e.update({key: entry}), scheme=scheme)
    with pytest.raises(error, match=rf"^tensor 'w': .*{pattern}"):
        aq.load(path)


@pytest.mark.parametrize("shape", [[], [1, 1]])
def test_one_element_global_scale_is_read_as_shape_one(tmp_path: Path, shape: list[int]) -> None:
    path = broken(tmp_path, lambda e, m: e.update({"w.global_scale": ("F32", shape, np.float32(2).tobytes())}))
    qt = aq.load(path)["w"]
    assert tuple(qt.global_scale.shape) == (1,)
    np.testing.assert_array_equal(qt.global_scale, [2.0])


def test_e2m1_native_byte_that_is_no_code(tmp_path: Path) -> None:
    """Found by tests/test_fuzz.py: a native E2M1 byte above 0x0F used to crash dequantize (IndexError)."""
    codes = bytes([0x01] * 7 + [0x10])

    def edit(e: dict[str, Entry], m: dict[str, str]) -> None:
        e["w.qvalues"] = ("U8", [2, 8], codes + bytes(8))

    path = broken(tmp_path, edit, scheme="e2m1:block4:ue4m3:tensor:f32:native")
    with pytest.raises(aq.CorruptDataError, match=r"^tensor 'w': byte 0x10 at flat index 7 is not an E2M1 code"):
        aq.load(path)
    buf = codes + bytes([0x38]) + np.float32(1).tobytes()
    with pytest.raises(aq.CorruptDataError, match=r"stored values: byte 0x10 at flat index 7 is not an E2M1 code"):
        aq.from_bytes(buf, "e2m1:block8:ue4m3:tensor:f32:native", (8,), backend="numpy")
    ok = aq.from_bytes(
        bytes([0x0F] * 8) + bytes([0x38]) + np.float32(1).tobytes(), "e2m1:block8:ue4m3:tensor:f32:native", (8,)
    )
    np.testing.assert_array_equal(shim.to_host(aq.dequantize(ok)), [-6.0] * 8)


def test_table_for_a_scheme_without_lookup(tmp_path: Path) -> None:
    def add(e: dict[str, Entry], m: dict[str, str]) -> None:
        e["w.table"] = ("F32", [256], np.zeros(256, "<f4").tobytes())

    path = broken(tmp_path, add)
    with pytest.raises(aq.ParamsError, match=r"^tensor 'w': .*table"):
        aq.load(path)


def test_values_byte_count_that_does_not_match(tmp_path: Path) -> None:
    """A header whose shape needs more (or fewer) bytes than its offsets span: named, never read."""
    good, _ = read_entries(good_file(tmp_path))
    data = good["w.qvalues"][2] + good["w.scales"][2] + good["w.global_scale"][2]
    meta = {"arrayquant.format": "1", "arrayquant.tensor.w": describe(TWO_LEVEL, [2, 8])}
    for shape in ([2, 9], [2, 7], [3, 8]):
        header = {
            "__metadata__": meta,
            "w": {"dtype": "I8", "shape": shape, "data_offsets": [0, 16]},
            "w.scales": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [16, 20]},
            "w.global_scale": {"dtype": "F32", "shape": [1], "data_offsets": [20, 24]},
        }
        path = write_header(tmp_path / "lie.safetensors", header, data)
        with pytest.raises(aq.CorruptDataError, match=re.escape(f"entry 'w' declares shape {shape} of I8 (")):
            aq.load(path)


def test_file_cut_short(tmp_path: Path) -> None:
    blob = good_file(tmp_path).read_bytes()
    for cut in (0, 5, 8, 20, len(blob) // 2, len(blob) - 1):
        path = tmp_path / "cut.safetensors"
        path.write_bytes(blob[:cut])
        with pytest.raises(aq.CorruptDataError, match=r"cut\.safetensors"):
            aq.load(path)


# ---------------------------------------------------------------------------------------------
# hostile files
# ---------------------------------------------------------------------------------------------

HUGE = [
    {"w": {"dtype": "F32", "shape": [2**40, 2**20], "data_offsets": [0, 2**62]}},
    {"w": {"dtype": "U8", "shape": [2**40], "data_offsets": [0, 2**40]}},
    {"w": {"dtype": "F64", "shape": [2**63, 2**63], "data_offsets": [0, 16]}},
    {"w": {"dtype": "I8", "shape": [2**64 - 1], "data_offsets": [0, 2**64 - 1]}},
    {"w": {"dtype": "F32", "shape": [4], "data_offsets": [2**63, 2**63 + 16]}},
    {"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}},
    {"w": {"dtype": "F32", "shape": [1e300], "data_offsets": [0, 16]}},
    {
        "__metadata__": {"arrayquant.format": "1", "arrayquant.tensor.w": describe("q8s:native", [2**40, 2**40])},
        "w": {"dtype": "I8", "shape": [2**40, 2**40], "data_offsets": [0, 2**80]},
    },
]


def _peak(load: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        load()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def _load_error(path: Path) -> Callable[[], object]:
    def run() -> object:
        with pytest.raises(aq.CorruptDataError):
            aq.load(path)
        return None

    return run


@pytest.mark.parametrize("header", HUGE, ids=range(len(HUGE)))
def test_huge_declared_sizes_do_not_allocate(tmp_path: Path, header: dict[str, Any]) -> None:
    path = write_header(tmp_path / "huge.safetensors", header)
    path.write_bytes(path.read_bytes().ljust(1024, b"\0"))  # a 1 KB file
    assert path.stat().st_size == 1024
    _load_error(path)()  # warm up imports and caches
    assert _peak(_load_error(path)) < 256 * 1024


def test_huge_header_length_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "len.safetensors"
    for declared in (2**63, 2**40, 1025):
        path.write_bytes(struct.pack("<Q", declared) + b"{}".ljust(1016, b" "))
        with pytest.raises(aq.CorruptDataError, match=rf"declares a {declared}-byte header but the file has only 1024"):
            aq.load(path)
        assert _peak(_load_error(path)) < 64 * 1024


def test_metadata_shape_far_beyond_the_data_does_not_allocate(tmp_path: Path) -> None:
    meta = {"arrayquant.format": "1", "arrayquant.tensor.w": describe("q8s:block4:f16:native", [2**40, 2**40])}
    entries = {"w": ("I8", [4], bytes(4)), "w.scales": ("F16", [1], bytes(2))}
    path = write_raw(tmp_path / "m.safetensors", entries, meta)

    def run() -> None:
        with pytest.raises(
            aq.ShapeError, match=r"^tensor 'w': w shape in the metadata \[1099511627776, 1099511627776\] has"
        ):
            aq.load(path)

    run()
    tracemalloc.start()
    try:
        run()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 256 * 1024


@pytest.mark.parametrize(
    "header_text",
    [
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the JSON parser's recursion limit
        b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b"\xff\xfe not utf-8",
        b"[1, 2, 3]",
        b'"a string"',
        b"",
    ],
    ids=["deep-list", "deep-value", "not-utf8", "list", "string", "empty"],
)
def test_unreadable_headers(tmp_path: Path, header_text: bytes) -> None:
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(header_text)) + header_text)
    with pytest.raises(aq.CorruptDataError, match=r"h\.safetensors"):
        aq.load(path)


@pytest.mark.parametrize(
    "metadata",
    [
        {"__metadata__": {"arrayquant.format": 1}},
        {"__metadata__": {"arrayquant.format": "1", "arrayquant.tensor.w": {"scheme": "q8s"}}},
        {"__metadata__": ["arrayquant.format", "1"]},
    ],
)
def test_metadata_that_is_not_strings(tmp_path: Path, metadata: dict[str, Any]) -> None:
    path = write_header(tmp_path / "m.safetensors", metadata)
    with pytest.raises(aq.CorruptDataError, match=r"m\.safetensors"):
        aq.load(path)


def test_metadata_is_data_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scheme, dtype and names from the file are parsed as text; nothing in them is run or unpickled."""
    import builtins
    import pickle

    marker = tmp_path / "pwned"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    refused = [
        describe(code, [2, 8]),
        describe(TWO_LEVEL, [2, 8], dtype=code),
        describe(TWO_LEVEL, [2, 8], dtype="__class__"),
        describe(TWO_LEVEL, [2, 8], dtype="__import__"),
        describe(TWO_LEVEL, [2, 8], dtype="asarray"),
        json.dumps({"scheme": TWO_LEVEL, "dtype": "float32", "shape": code}),
        pickle.dumps(code).hex(),
        code,
    ]
    ignored = json.dumps({"scheme": TWO_LEVEL, "dtype": "float32", "shape": [2, 8], "__reduce__": code})

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("loading a checkpoint must not evaluate or unpickle anything from it")

    aq.load(good_file(tmp_path))  # warm up: every import load needs has happened
    for payload in [*refused, ignored]:
        path = broken(tmp_path, lambda e, m, p=payload: m.update({"arrayquant.tensor.w": p}))
        with monkeypatch.context() as patch:
            for target, attr in ((builtins, "eval"), (builtins, "exec"), (pickle, "loads")):
                patch.setattr(target, attr, forbidden)
            if payload is ignored:  # unknown keys are data too: ignored
                assert aq.load(path)["w"].shape == (2, 8)
                continue
            with pytest.raises(aq.QuantizationError, match=r"tensor 'w'"):
                aq.load(path)
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# the Burn byte layout (docs/spec.md, "Burn's byte layout")
# ---------------------------------------------------------------------------------------------

EXAMPLE = bytes.fromhex("00 19 33 4C 66 7F 80 FF 30 20 00 00 40 40")


def _example(xp: Any) -> aq.QuantizedTensor:
    return aq.QuantizedTensor(
        aq.QuantScheme.parse(TWO_LEVEL),
        (8,),
        xp.float32,
        xp.asarray(np.array([0, 25, 51, 76, 102, 127, -128, -1], np.int8)),
        xp.asarray(np.array([0.5, 0.125], np.float32)),
        xp.asarray(np.array([3.0], np.float32)),
    )


def test_worked_example_to_bytes(xp: Any) -> None:
    assert aq.to_bytes(_example(xp)) == EXAMPLE
    assert len(EXAMPLE) == 14 == aq.quantized_nbytes(TWO_LEVEL, (8,))


def test_worked_example_from_bytes(xp: Any) -> None:
    qt = aq.from_bytes(EXAMPLE, TWO_LEVEL, (8,), backend=xp.backend.library, device=xp.device)
    assert shim.backend_name(qt.values) == xp.backend.library
    np.testing.assert_array_equal(shim.to_host(qt.values), [0, 25, 51, 76, 102, 127, -128, -1])
    np.testing.assert_array_equal(shim.to_host(qt.scales), [0.5, 0.125])
    np.testing.assert_array_equal(shim.to_host(qt.global_scale), [3.0])
    assert aq.to_bytes(qt) == EXAMPLE
    # eff = 3 * 0.5 = 1.5 for the first block, 3 * 0.125 = 0.375 for the second; -128 is read as is
    want = np.array([0, 37.5, 76.5, 114, 38.25, 47.625, -48, -0.375], np.float32)
    np.testing.assert_array_equal(shim.to_host(aq.dequantize(qt)), want)


def test_worked_example_through_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "example.safetensors"
    aq.save(path, {"w": _example(np)})
    assert aq.to_bytes(aq.load(path)["w"]) == EXAMPLE


def test_from_bytes_four_short_is_a_missing_global_scale() -> None:
    with pytest.raises(aq.MissingGlobalScaleError) as info:
        aq.from_bytes(EXAMPLE[:10], TWO_LEVEL, (8,), backend="numpy")
    msg = str(info.value)
    assert "two-level scheme" in msg
    assert "per-tensor scale" in msg
    assert "10 bytes" in msg
    assert "= 14" in msg


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 11, 12, 13, 15, 16, 18, 28])
def test_from_bytes_other_lengths_are_corrupt(size: int) -> None:
    buf = (EXAMPLE * 3)[:size]
    with pytest.raises(aq.CorruptDataError, match=rf"buffer has {size} bytes but scheme .* needs exactly 14 "):
        aq.from_bytes(buf, TWO_LEVEL, (8,), backend="numpy")


def test_from_bytes_one_level_length_errors() -> None:
    # q8s:native on (8,) needs 8 value bytes + one f32 scale; 4 short is corrupt, not a missing global
    with pytest.raises(aq.CorruptDataError, match=r"buffer has 8 bytes but .* needs exactly 12"):
        aq.from_bytes(bytes(8), "q8s:native", (8,), backend="numpy")
