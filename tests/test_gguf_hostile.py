"""Hostile GGUF files and failing writes: bounded costs, typed errors, and messages that name the culprit.

The hostile files are written byte by byte with ``struct`` (or patched from a file gguf-py wrote),
so that nothing here trusts the code under test to build them. Costs are measured in a fresh
Python process: peak RSS (``ru_maxrss``) before and after, and wall time, with generous bounds
that a reader doing work per stored item (gguf-py's ``GGUFReader``: one NumPy view per item)
fails by an order of magnitude.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import CorruptDataError, ParamsError, ShapeError
from arrayquant.io import gguf as G
from arrayquant.io.gguf.container import TensorInfo
from arrayquant.io.gguf.reader import tensor_value
from arrayquant.io.importance import load_importance

gguf = pytest.importorskip("gguf")

GT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType
MiB = 1 << 20
LIMIT_MIB, LIMIT_S = 256, 5.0  # per 4 MiB hostile file, for each of load, read_metadata and quantize_file
MAX_KEY_VALUES, MAX_KEY_BYTES, MAX_ALIGNMENT = 1 << 16, (1 << 16) - 1, 1 << 16  # the documented limits


def _text(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _many_tiny_key_values(size: int) -> bytes:
    """~size bytes of key/values of 21 bytes each: an 8-byte key and a UINT8 value."""
    n = size // 21
    return _header(0, n) + b"".join(_text(f"{i:08x}") + struct.pack("<IB", 0, 1) for i in range(n))


def _big_numeric_array(size: int) -> bytes:
    """One UINT8 array filling the file."""
    n = size - 64
    return _header(0, 1) + _text("bomb") + struct.pack("<IIQ", 9, 0, n) + bytes(n)


def _many_empty_strings(size: int) -> bytes:
    """One string array of empty strings (8 bytes each: the length 0) filling the file."""
    n = size // 8
    return _header(0, 1) + _text("bomb") + struct.pack("<IIQ", 9, 8, n) + bytes(8 * n)


BOMBS = {
    "many_tiny_key_values": _many_tiny_key_values,
    "big_numeric_array": _big_numeric_array,
    "many_empty_strings": _many_empty_strings,
}

# Runs in a fresh interpreter: warms every path on a small file, then times each operation on the
# hostile one and prints one JSON line per operation; stops at the first over its bounds.
CHILD = r"""
import json, resource, sys, time
import numpy as np
import arrayquant as aq
from arrayquant.errors import QuantizationError
from arrayquant.io import gguf as G

path, warm, out, limit_mib, limit_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
ops = {
    "load": aq.load,
    "read_metadata": G.read_metadata,
    "quantize_file": lambda p: G.quantize_file(p, out, "q8_0"),
}
G.save(warm, {"blk.0.ffn_up.weight": np.ones((2, 32), np.float32)}, metadata={"t": ["a", "b"], "n": [1, 2]})
for op in ops.values():
    op(warm)
per_mib = 1024 * 1024 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name, op in ops.items():
    error = None
    start = time.perf_counter()
    try:
        op(path)
    except QuantizationError as e:
        error = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / per_mib
    print(json.dumps({"op": name, "seconds": seconds, "grown_mib": grown, "error": error}), flush=True)
    if seconds > limit_s or grown > limit_mib:
        break
"""


def _costs(path: Path, tmp_path: Path) -> list[dict[str, Any]]:
    args = [str(path), str(tmp_path / "warm.gguf"), str(tmp_path / "out.gguf"), str(LIMIT_MIB), str(LIMIT_S)]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def _assert_cheap(costs: list[dict[str, Any]]) -> None:
    shown = "; ".join(f"{c['op']}: {c['grown_mib']:.0f} MiB, {c['seconds']:.2f} s" for c in costs)
    assert [c["op"] for c in costs] == ["load", "read_metadata", "quantize_file"], f"stopped over its bounds: {shown}"
    assert max(c["grown_mib"] for c in costs) < LIMIT_MIB, shown
    assert max(c["seconds"] for c in costs) < LIMIT_S, shown


# ---------------------------------------------------------------------------------------------
# item 1: metadata costs memory and time in proportion to the file


@pytest.mark.parametrize("kind", list(BOMBS))
def test_a_4_mib_metadata_bomb_costs_little(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"{kind}.gguf"
    path.write_bytes(BOMBS[kind](4 * MiB))
    costs = _costs(path, tmp_path)
    _assert_cheap(costs)
    if kind == "many_tiny_key_values":  # refused at the header, naming the limit
        for c in costs:
            assert c["error"] is not None
            assert "CorruptDataError" in c["error"]
            assert f"more than {MAX_KEY_VALUES} (arrayquant.io.gguf.container.MAX_KEY_VALUES)" in c["error"]
    else:  # sound files: read, and copied
        assert [c["error"] for c in costs] == [None, None, None]


def test_the_limits_are_the_documented_ones() -> None:
    assert (G.MAX_KEY_VALUES, G.MAX_KEY_BYTES, G.MAX_ALIGNMENT) == (MAX_KEY_VALUES, MAX_KEY_BYTES, MAX_ALIGNMENT)


def test_too_many_key_values_is_a_typed_error_naming_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "kv.gguf"
    path.write_bytes(_many_tiny_key_values((MAX_KEY_VALUES + 1) * 21))
    pattern = r"claims 65537 key/values; more than 65536 \(arrayquant.io.gguf.container.MAX_KEY_VALUES\) are refused"
    with pytest.raises(CorruptDataError, match=pattern):
        aq.load(path)
    # at the limit a file is read, and quickly
    path.write_bytes(_many_tiny_key_values(MAX_KEY_VALUES * 21))
    start = time.perf_counter()
    md = G.read_metadata(path)
    assert time.perf_counter() - start < LIMIT_S
    assert len(md) == MAX_KEY_VALUES
    assert md["0000ffff"] == gguf.GGUFValue(1, VT.UINT8)


def test_a_key_longer_than_the_gguf_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.gguf"
    key = "k" * (MAX_KEY_BYTES + 1)
    path.write_bytes(_header(0, 1) + _text(key) + struct.pack("<IB", 0, 1))
    with pytest.raises(CorruptDataError, match=r"key 0 at byte 32 is 65536 bytes long; GGUF keys are at most 65535"):
        G.read_metadata(path)
    with pytest.raises(ParamsError, match=r"longer than GGUF's 65535 bytes for a key; shorten it"):
        G.save(tmp_path / "o.gguf", {}, metadata={key: 1})
    assert not (tmp_path / "o.gguf").exists()


def test_metadata_arrays_are_views_of_the_stored_bytes(tmp_path: Path) -> None:
    path = tmp_path / "a.gguf"
    path.write_bytes(_big_numeric_array(1 * MiB))
    n = 1 * MiB - 64
    value = G.read_metadata(path)["bomb"]
    assert (value.type, value.sub_type) == (VT.ARRAY, VT.UINT8)
    items = value.value
    assert len(items) == n
    view = np.asarray(items)
    assert (view.dtype, view.shape, view.flags.writeable) == (np.uint8, (n,), False)
    assert int(view.sum()) == 0
    assert items[0] == items[-1] == 0
    assert items[2:4] == [0, 0]
    path.write_bytes(_many_empty_strings(1 * MiB))
    strings = G.read_metadata(path)["bomb"].value
    assert len(strings) == MiB // 8
    assert strings[0] == strings[-1] == ""
    assert strings.tolist() == [""] * (MiB // 8)


def test_metadata_arrays_behave_as_lists(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    meta = {"s": ["a", "", "é", "bc"], "b": [True, False, True], "f": [0.5, -1.25], "i": [-3, 7]}
    G.save(path, {}, metadata=meta)
    md = G.read_metadata(path)
    for key, value in meta.items():
        items = md[key].value
        assert isinstance(items, G.GGUFArray)
        assert items == value
        assert value == items
        assert items.tolist() == list(items) == value
        assert items[-1] == value[-1]
        assert items[1:3] == value[1:3]
        assert repr(items).startswith("GGUFArray(")
    with pytest.raises(IndexError, match=r"index 4 out of range for 4 items"):
        md["s"].value[4]
    np.testing.assert_array_equal(np.asarray(md["b"].value), [True, False, True])
    # an array alone (no GGUFValue) is written with its own type, as stored
    G.save(tmp_path / "again.gguf", {}, metadata={k: v.value for k, v in md.items() if k != "general.architecture"})
    assert G.read_metadata(tmp_path / "again.gguf") == md


def test_a_string_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "u.gguf"
    array = struct.pack("<IIQ", 9, 8, 2) + _text("a") + struct.pack("<Q", 1) + b"\xff"
    path.write_bytes(_header(0, 1) + _text("k") + array)
    for read in (G.read_metadata, aq.load):  # every reader refuses the same files
        with pytest.raises(CorruptDataError, match=r"item 1 of 'k' at byte 66 is not UTF-8 \(invalid start byte\)"):
            read(path)
    path.write_bytes(_header(0, 1) + _text("k") + struct.pack("<I", 8) + struct.pack("<Q", 1) + b"\xfe")
    for read in (G.read_metadata, aq.load):
        with pytest.raises(CorruptDataError, match=r"the value of 'k' at byte 45 is not UTF-8"):
            read(path)


def test_a_150k_token_vocabulary_reads_and_round_trips(tmp_path: Path) -> None:
    n = 150_000
    tokens = [f"tok{i}" for i in range(n - 2)] + ["é", "<|im_end|>"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [float(i) / n for i in range(n)],
        "tokenizer.ggml.token_type": [1] * (n - 1) + [3],
        "tokenizer.ggml.merges": [f"t o{i}" for i in range(n)],
        "tokenizer.ggml.add_bos_token": True,
    }
    src, dst, again = tmp_path / "v.gguf", tmp_path / "q.gguf", tmp_path / "again.gguf"
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    aq.save(src, {"blk.0.ffn_up.weight": w}, metadata=meta, arch="qwen2")
    start = time.perf_counter()
    md = G.read_metadata(src)
    assert time.perf_counter() - start < LIMIT_S
    assert md["tokenizer.ggml.tokens"].value == tokens
    assert md["tokenizer.ggml.tokens"].value[n - 2] == "é"
    assert md["tokenizer.ggml.tokens"].sub_type == VT.STRING
    np.testing.assert_array_equal(
        np.asarray(md["tokenizer.ggml.scores"].value), np.float32(meta["tokenizer.ggml.scores"])
    )
    assert md["tokenizer.ggml.token_type"].value == meta["tokenizer.ggml.token_type"]
    assert md["tokenizer.ggml.add_bos_token"] == gguf.GGUFValue(True, VT.BOOL)
    # quantize_file keeps every key/value, byte for byte
    start = time.perf_counter()
    G.quantize_file(src, dst, "q8_0")
    assert time.perf_counter() - start < LIMIT_S
    out = G.read_metadata(dst)
    for key in meta:
        assert out[key] == md[key], key
    assert gguf.GGUFReader(str(dst)).fields["tokenizer.ggml.tokens"].contents()[-2:] == ["é", "<|im_end|>"]
    # and so does aq.save given read_metadata's values
    aq.save(again, aq.load(src), metadata=md)
    assert G.read_metadata(again) == md
    assert again.read_bytes() == src.read_bytes()


# ---------------------------------------------------------------------------------------------
# item 2: general.alignment


def _aligned(tmp_path: Path, alignment: int) -> Path:
    """A file gguf-py wrote with alignment 64, then patched to claim ``alignment``."""
    path = tmp_path / "al.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("general.alignment", 64)
    w.add_tensor("t", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray(path.read_bytes())
    at = data.index(b"general.alignment") + len(b"general.alignment") + 4
    struct.pack_into("<I", data, at, alignment)
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("alignment", [MAX_ALIGNMENT * 2, 2**31])
def test_alignment_beyond_the_limit_is_refused_on_read(alignment: int, tmp_path: Path) -> None:
    path = _aligned(tmp_path, alignment)
    pattern = rf"general.alignment is {alignment}; arrayquant reads alignments up to 65536"
    for read in (aq.load, G.read_metadata, lambda p: G.quantize_file(p, tmp_path / "o.gguf", "q8_0")):
        with pytest.raises(CorruptDataError, match=pattern):
            read(path)
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("alignment", [MAX_ALIGNMENT * 2, 2**31])
def test_alignment_beyond_the_limit_is_refused_on_write(alignment: int, tmp_path: Path) -> None:
    path = tmp_path / "w.gguf"
    pattern = rf"'general.alignment' is {alignment}; alignments up to 65536 .* use 65536 or less"
    with pytest.raises(ParamsError, match=pattern):
        G.save(path, {}, metadata={"general.alignment": alignment})
    with pytest.raises(ParamsError, match=pattern):
        aq.save(
            path, {"t": np.ones(4, np.float32)}, metadata={"general.alignment": gguf.GGUFValue(alignment, VT.UINT32)}
        )
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("alignment", [1, 4096, MAX_ALIGNMENT])
def test_alignments_llama_cpp_reads_are_kept(alignment: int, tmp_path: Path) -> None:
    path = tmp_path / "ok.gguf"
    G.save(
        path,
        {"a": np.ones(3, np.float32), "b": np.arange(5, dtype=np.float32)},
        metadata={"general.alignment": alignment},
    )
    r = gguf.GGUFReader(str(path))
    assert r.alignment == alignment
    assert all(t.data_offset % alignment == 0 for t in r.tensors)
    np.testing.assert_array_equal(aq.load(path, backend="numpy")["b"], np.arange(5, dtype=np.float32))
    assert path.stat().st_size < 4 * alignment + 1024  # padding, not more


# ---------------------------------------------------------------------------------------------
# item 3: typed errors, not tracebacks


@pytest.mark.parametrize("shape", [(4, 0), (0, 32), (2, 0, 32)])
def test_quantize_file_copies_a_weight_with_no_values(shape: tuple[int, ...], tmp_path: Path) -> None:
    src, dst = tmp_path / "z.gguf", tmp_path / "q.gguf"
    w = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    G.save(src, {"blk.0.attn_q.weight": np.zeros(shape, np.float32), "blk.0.attn_k.weight": w})
    summary = G.quantize_file(src, dst, "q8_0")
    assert summary.quantized == ["blk.0.attn_k.weight"]
    assert summary.left_out == {"blk.0.attn_q.weight": f"has no values (shape {list(shape)}); kept as F32"}
    back = aq.load(dst, backend="numpy")
    assert back["blk.0.attn_q.weight"].shape == shape
    assert back["blk.0.attn_q.weight"].dtype == np.float32
    assert isinstance(back["blk.0.attn_k.weight"], aq.QuantizedTensor)


def _imatrix(path: Path, sums: Any, counts: Any, sums_type: str = "F32") -> Path:
    w = gguf.GGUFWriter(str(path), arch="imatrix")
    w.add_type("imatrix")
    if sums_type == "F32":
        w.add_tensor("blk.0.attn_q.weight.in_sum2", np.asarray(sums, np.float32))
    else:
        qtype = GT[sums_type]
        w.add_tensor(
            "blk.0.attn_q.weight.in_sum2", gguf.quants.quantize(np.asarray(sums, np.float32), qtype), raw_dtype=qtype
        )
    w.add_tensor("blk.0.attn_q.weight.counts", np.asarray(counts, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("sums_type", ["Q8_0", "F16"])
def test_imatrix_sums_stored_as_another_type_than_f32(sums_type: str, tmp_path: Path) -> None:
    path = _imatrix(tmp_path / "imatrix.gguf", np.ones((1, 32)), [[3.0]], sums_type)
    pattern = rf"imatrix tensor 'blk.0.attn_q.weight.in_sum2' of .* is stored as {sums_type}; .* must be F32"
    with pytest.raises(CorruptDataError, match=pattern):
        load_importance(path)


def test_imatrix_mean_beyond_float32_is_a_typed_error_without_a_warning(tmp_path: Path) -> None:
    path = _imatrix(tmp_path / "imatrix.gguf", [[1.0, 3e38]], [[0.5]])
    pattern = r"'blk.0.attn_q.weight' of .*: in_sum2 / counts overflows float32 at column 1 \(3.*e\+38 / 0.5\)"
    with pytest.raises(ParamsError, match=pattern):  # filterwarnings = error: a RuntimeWarning would fail here
        load_importance(path)
    ok = _imatrix(tmp_path / "ok.gguf", [[1.0, 3e38]], [[2.0]])  # large sums, a true token count: fine
    np.testing.assert_array_equal(load_importance(ok)["blk.0.attn_q.weight"], np.float32([0.5, 1.5e38]))


@pytest.mark.parametrize("name", ["\ud800", "blk.\udcff.weight"])
def test_save_refuses_a_tensor_name_that_is_not_unicode(name: str, tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    with pytest.raises(ShapeError, match=re.escape(f"tensor name {name!r} is not valid Unicode text")):
        aq.save(path, {name: np.ones(3, np.float32)})
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# item 4: messages


class _FullDisk(io.FileIO):
    """A file on a disk with ``room`` bytes free, failing as the kernel does: a short write, then ENOSPC."""

    room = 0

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        n = min(len(data), self.room - self.tell())
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data[:n])


@pytest.mark.parametrize("room", [10, 4096])  # within the header; within the tensor data
def test_a_full_disk_names_the_file(room: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.gguf"
    target.write_bytes(b"old")
    real_open = open

    def opened(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" not in mode:
            return real_open(file, mode, *args, **kwargs)
        raw = _FullDisk(file, "wb")
        raw.room = room
        return io.BufferedWriter(raw)

    monkeypatch.setattr(gguf.gguf_writer, "open", opened, raising=False)
    x = np.ones((16, 1024), np.float32)
    with pytest.raises(OSError, match=r"No space left on device while writing this GGUF file") as got:
        aq.save(target, {"w": x})
    assert got.value.errno == errno.ENOSPC
    assert got.value.filename == str(target)
    assert "free some space or write it elsewhere" in str(got.value)
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["out.gguf"]  # the partial copy is removed


def test_a_zero_extent_quantized_tensor_is_named(tmp_path: Path) -> None:
    path = tmp_path / "q.gguf"
    G.save(path, {"blk.0.attn_q.weight": aq.quantize(np.ones((1, 32), np.float32), "q8f:block32:f16")})
    data = bytearray(path.read_bytes())
    at = data.index(b"blk.0.attn_q.weight") + len(b"blk.0.attn_q.weight") + 4  # after the name and the rank
    struct.pack_into("<Q", data, at + 8, 0)  # GGUF's second dimension, NumPy's first: shape (0, 32)
    path.write_bytes(bytes(data))
    pattern = r"tensor 'blk.0.attn_q.weight': Q8_0 tensor shape \(0, 32\).*store it as F32, or leave it out"
    with pytest.raises(ShapeError, match=pattern):
        aq.load(path)
    with pytest.raises(ShapeError, match=pattern):
        list(G.iter_tensors(path))


def test_a_zero_size_tensor_no_array_can_take_is_a_typed_error() -> None:
    """Found by the 200,000-case fuzz run: a count lie left an empty F32 tensor of shape [0, 2**62, 2**62]."""
    t = TensorInfo("w", "F32", (0, 2**62, 2**62), 0, 0)
    with pytest.raises(ShapeError, match=r"tensor 'w' has shape .*which no array can take"):
        tensor_value(np.zeros(0, np.uint8), t, None, None)
