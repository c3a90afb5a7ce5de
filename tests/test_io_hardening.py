"""One safetensors reader for ``aq.load``, the CLI and ``read_nvfp4``; linear streaming; quantized names.

Hostile files are written byte by byte here (a JSON header and the data), never with arrayquant,
and each must end in the same typed error whichever reader meets it: :func:`arrayquant.load`,
the CLI's :class:`arrayquant.io.arrayquant.layout.Checkpoint` (and a CLI command, which exits 1), and
:func:`arrayquant.io.read_nvfp4`. Expected values come from NumPy or are worked by hand.
"""

from __future__ import annotations

import json
import struct
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.io import read_nvfp4
from arrayquant.io.arrayquant.checkpoint import save_stream
from arrayquant.io.arrayquant.layout import Checkpoint
from arrayquant.io.safetensors.reader import SafetensorsFile

TWO_LEVEL = "q8s:block4:ue4m3:tensor:f32:native"
# the worked example of the Burn layout: values, two UE4M3 block scales (0.5, 0.125), g = 3
EXAMPLE_VALUES = bytes.fromhex("00 19 33 4C 66 7F 80 FF")
EXAMPLE_SCALES = bytes.fromhex("30 20")
EXAMPLE_GLOBAL = struct.pack("<f", 3.0)
EXAMPLE_DEQUANTIZED = [0.0, 37.5, 76.5, 114.0, 38.25, 47.625, -48.0, -0.375]  # code * 3 * (0.5 | 0.125), by hand


def write_file(path: Path, header: dict[str, Any], data: bytes = b"") -> Path:
    """A safetensors file with exactly this JSON header and data (for lies a serializer refuses)."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def write_text_header(path: Path, text: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def through_load(path: Path) -> None:
    aq.load(path, backend="numpy")


def through_cli_reader(path: Path) -> None:
    with Checkpoint(path) as ck:
        for e in ck.tensors:
            if e.name in ck.described:
                ck.quantized(e.name)
            else:
                ck.array(e.name)


READERS: list[Callable[[Path], None]] = [through_load, through_cli_reader]


def assert_cli_refuses(path: Path, error: type[Exception], pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every command that reads ``path`` exits 1 with one line naming the error type; none writes."""
    out = path.parent / "cli-out.safetensors"
    for argv in (["inspect", str(path)], ["dequantize", str(path), str(out)], ["compare", str(path), str(path)]):
        capsys.readouterr()
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(f"arrayquant: error: {error.__name__}: "), err
        assert "Traceback" not in err
        with pytest.raises(error, match=pattern):
            main(["--debug", *argv])
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# one reader, one set of checks (items 3 and 4)
# ---------------------------------------------------------------------------------------------

F32_2 = np.array([1.5, -2.0], "<f4").tobytes()
HOSTILE = {
    "deep": (b"[" * 100_000 + b"]" * 100_000, b"", aq.CorruptDataError, r"unreadable safetensors header"),
    "deep-object": (
        b'{"w": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"",
        aq.CorruptDataError,
        r"unreadable safetensors header",
    ),
    "inf-extent": (
        b'{"w": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 8]}}',
        F32_2,
        aq.CorruptDataError,
        r"entry 'w' has shape \[inf\]; a shape is a list of non-negative integers",
    ),
    "lower-case-dtype": (
        b'{"w": {"dtype": "f32", "shape": [2], "data_offsets": [0, 8]}}',
        F32_2,
        aq.CorruptDataError,
        r"entry 'w' has dtype 'f32', expected one of F64, F32, .* \(the safetensors names, upper case\)",
    ),
    "text-and-float-extents": (
        b'{"w": {"dtype": "F32", "shape": ["2", 2.9], "data_offsets": [0, 8]}}',
        F32_2,
        aq.CorruptDataError,
        r"entry 'w' has shape \['2', 2\.9\]; a shape is a list of non-negative integers",
    ),
    "bool-extent": (
        b'{"w": {"dtype": "F32", "shape": [true, 2], "data_offsets": [0, 8]}}',
        F32_2,
        aq.CorruptDataError,
        r"entry 'w' has shape \[True, 2\]",
    ),
    "float-offsets": (
        b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8.0]}}',
        F32_2,
        aq.CorruptDataError,
        r"entry 'w' has data_offsets \[0, 8\.0\]; expected two integers \[start, end\]",
    ),
    "not-an-entry": (b'{"w": [1, 2, 3]}', b"", aq.CorruptDataError, r"entry 'w' is not a safetensors entry"),
    "overlap": (
        b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},'
        b' "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
        F32_2,
        aq.CorruptDataError,
        r"entry 'b' at data_offsets \[4, 8\] overlaps entry 'a' \[0, 8\]",
    ),
    "same-bytes-twice": (
        b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},'
        b' "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
        F32_2,
        aq.CorruptDataError,
        r"at data_offsets \[0, 8\] overlaps entry '[ab]' \[0, 8\]",
    ),
    "gap": (
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
        F32_2,
        aq.CorruptDataError,
        r"entry 'a' at data_offsets \[4, 8\] leaves the bytes \[0, 4\] of the data section to no entry",
    ),
    "trailing-bytes": (
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        F32_2,
        aq.CorruptDataError,
        r"the data section has 8 bytes but entry 'a' ends at 4; the file is padded or corrupt",
    ),
    "beyond-the-data": (
        b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}',
        F32_2,
        aq.CorruptDataError,
        r"entry 'a' of shape \[4\] needs 16 bytes at data_offsets \[0, 16\], beyond the 8-byte data section",
    ),
    "rank-65": (
        json.dumps({"w": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}).encode(),
        F32_2[:4],
        aq.ShapeError,
        r"entry 'w' has 65 axes; NumPy arrays have at most 64, so it cannot be read",
    ),
    "zero-size-beyond-numpy": (
        json.dumps({"w": {"dtype": "F32", "shape": [0, 2**62], "data_offsets": [0, 0]}}).encode(),
        b"",
        aq.ShapeError,
        r"entry 'w' has shape \[0, 4611686018427387904\]; NumPy refuses shapes whose extents other than 0 times "
        r"the item size exceed 9223372036854775807 bytes",
    ),
}


def test_the_hostile_shapes_are_beyond_numpy() -> None:
    """The oracle for the two ShapeError cases: NumPy itself cannot build those arrays."""
    with pytest.raises(ValueError, match="maximum supported dimension"):
        np.empty((1,) * 65, np.float32)
    with pytest.raises(ValueError, match="array is too big"):
        np.empty((0, 2**62), np.float32)
    assert np.empty((0, 2**62), np.uint8).size == 0  # the limit is in bytes: one byte per item still fits


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("read", READERS, ids=["load", "cli-reader"])
def test_every_reader_refuses_alike(case: str, read: Callable[[Path], None], tmp_path: Path) -> None:
    text, data, error, pattern = HOSTILE[case]
    path = write_text_header(tmp_path / "h.safetensors", text, data)
    with pytest.raises(error, match=pattern) as info:
        read(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("case", ["deep", "lower-case-dtype", "overlap", "rank-65", "zero-size-beyond-numpy"])
def test_cli_commands_refuse_alike(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, data, error, pattern = HOSTILE[case]
    assert_cli_refuses(write_text_header(tmp_path / "h.safetensors", text, data), error, pattern, capsys)


@pytest.mark.parametrize(
    "case",
    ["deep", "lower-case-dtype", "text-and-float-extents", "overlap", "gap", "rank-65", "zero-size-beyond-numpy"],
)
def test_read_nvfp4_refuses_alike(case: str, tmp_path: Path) -> None:
    """The hostile entry is named like the weight's own, so no reader can skip it."""
    text, data, error, pattern = HOSTILE[case]
    for old in (b'"w"', b'"a"', b'"b"'):
        text = text.replace(old, old[:-1] + b'.weight_packed"')
    pattern = pattern.replace("entry 'w'", r"entry 'w\.weight_packed'")
    pattern = pattern.replace("entry 'a'", r"entry 'a\.weight_packed'").replace(
        "entry 'b'", r"entry 'b\.weight_packed'"
    )
    path = write_text_header(tmp_path / "h.safetensors", text, data)
    with pytest.raises(error, match=pattern):
        read_nvfp4(path, "w")


def test_header_beyond_the_safetensors_limit(tmp_path: Path) -> None:
    """A header over 100 MiB is refused before it is read (the file is sparse: nothing is written)."""
    from arrayquant.io.safetensors.reader import HEADER_LIMIT

    path = tmp_path / "big.safetensors"
    with path.open("wb") as f:
        f.write(struct.pack("<Q", HEADER_LIMIT + 8))
        f.truncate(HEADER_LIMIT + 64)
    assert HEADER_LIMIT == 100 * 2**20
    pattern = rf"declares a {HEADER_LIMIT + 8}-byte header, beyond safetensors' limit of {HEADER_LIMIT} bytes"
    for read in READERS:
        with pytest.raises(aq.CorruptDataError, match=pattern):
            read(path)


@pytest.mark.parametrize(("version", "name"), [("2", "w.qvalues"), ("2", "w.scales"), ("1", "w.table"), ("2", "")])
def test_described_name_no_writer_allows(version: str, name: str, tmp_path: Path) -> None:
    info = json.dumps({"scheme": "q8s", "dtype": "float32", "shape": [2]})
    meta = {"arrayquant.format": version, f"arrayquant.tensor.{name}": info}
    path = write_file(tmp_path / "d.safetensors", {"__metadata__": meta})
    pattern = rf"the metadata describes a quantized tensor named {name!r}, which no writer allows"
    for read in READERS:
        with pytest.raises(aq.CorruptDataError, match=pattern):
            read(path)


def test_read_nvfp4_checks_entries_it_does_not_need(tmp_path: Path) -> None:
    """A broken entry elsewhere in the file is refused too: the file is read through the one reader."""
    good = aq.io.write_nvfp4(aq.quantize(np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32), "nvfp4"), "fc")
    path = tmp_path / "ct.safetensors"
    safetensors.numpy.save_file(good, str(path))
    assert read_nvfp4(path, "fc", backend="numpy").shape == (2, 32)  # the file itself is good
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8 : 8 + header_len])
    data = path.read_bytes()[8 + header_len :]
    header["other"] = {"dtype": "F32", "shape": ["2"], "data_offsets": [len(data), len(data) + 8]}
    write_file(path, header, data + F32_2)
    with pytest.raises(aq.CorruptDataError, match=r"entry 'other' has shape \['2'\]"):
        read_nvfp4(path, "fc")


def test_quantized_tensor_without_values_fails_in_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to be dropped silently by ``dequantize`` (exit 0): the CLI reader now checks what load checks."""
    path = tmp_path / "q.safetensors"
    aq.save(path, {"w": aq.quantize(np.ones((2, 8), np.float32), "q8s:block4:f16"), "b": np.zeros(2, np.float32)})
    entries = safetensors.numpy.load_file(str(path))
    entries.pop("w.qvalues")
    with path.open("rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    safetensors.numpy.save_file(entries, str(path), metadata=meta)
    pattern = r"^tensor 'w' is described in the metadata but its values entry 'w\.qvalues' is missing$"
    for read in READERS:
        with pytest.raises(aq.CorruptDataError, match=pattern):
            read(path)
    assert_cli_refuses(path, aq.CorruptDataError, pattern, capsys)


def test_rank_65_shape_in_from_bytes() -> None:
    with pytest.raises(aq.ShapeError, match=r"^shape has 65 axes; quantized tensors have at most 32"):
        aq.from_bytes(bytes(10), "q8s:native", (1,) * 65, backend="numpy")


@pytest.mark.parametrize(
    ("buf", "why"),
    [
        (np.zeros(8, np.int8)[::2], r"casts are restricted to C-contiguous views"),
        (np.zeros(1, "datetime64[s]"), r"cannot include dtype"),
        ("abcd", r"a bytes-like object is required"),
        (None, r"a bytes-like object is required"),
    ],
    ids=["strided", "datetime", "str", "none"],
)
def test_from_bytes_refuses_what_is_no_buffer(buf: Any, why: str) -> None:
    pattern = rf"^buf must be a contiguous bytes-like object \(bytes, bytearray, memoryview\), got \w+ \(.*{why}"
    with pytest.raises(aq.DTypeError, match=pattern):
        aq.from_bytes(buf, "q8s:native", (4,), backend="numpy")


def test_from_bytes_refuses_a_lookup_scheme_without_codebook() -> None:
    """The Burn layout has no table: accepting it gave a tensor that dequantize then refused."""
    buf = bytes(4) + struct.pack("<f", 1.0)
    with pytest.raises(aq.ParamsError, match=r"^scheme q8s:lookup looks its values up in a table of your own"):
        aq.from_bytes(buf, "q8s:lookup", (4,), backend="numpy")
    with pytest.raises(aq.SchemeError, match=r"scheme text must be a str, got list"):
        aq.from_bytes(buf, ["q8s"], (4,), backend="numpy")  # type: ignore[arg-type]


def test_rank_beyond_the_core_limit_in_the_metadata(tmp_path: Path) -> None:
    """Rank 40 fits NumPy but not a quantized tensor: the core's limit, named with the tensor."""
    shape = [1] * 40
    info = json.dumps({"scheme": "q8s", "dtype": "float32", "shape": shape})
    header = {
        "__metadata__": {"arrayquant.format": "2", "arrayquant.tensor.w": info},
        "w.qvalues": {"dtype": "I8", "shape": shape, "data_offsets": [0, 1]},
        "w.scales": {"dtype": "F32", "shape": [1], "data_offsets": [1, 5]},
    }
    path = write_file(tmp_path / "r.safetensors", header, bytes(1) + struct.pack("<f", 1.0))
    for read in READERS:
        with pytest.raises(aq.ShapeError, match=r"^tensor 'w': w shape in the metadata has 40 axes; .* at most 32"):
            read(path)


def test_one_safetensors_reader() -> None:
    """Every command and format reads safetensors through the one reader: no second header parser."""
    root = Path(aq.__file__).resolve().parent
    owners = {
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "def read_header(" in p.read_text(encoding="utf-8")
        or "class SafetensorsFile" in p.read_text(encoding="utf-8")
    }
    assert owners == {"io/safetensors/reader.py"}
    assert issubclass(Checkpoint, SafetensorsFile)


# ---------------------------------------------------------------------------------------------
# quantized values under their own name (item 11), and files of format 1
# ---------------------------------------------------------------------------------------------


def _linear_file(tmp_path: Path, scheme: str) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((4, 32)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    path = tmp_path / "linear.safetensors"
    aq.save(path, {"weight": aq.quantize(weight, scheme), "bias": bias})
    return path, weight, bias


@pytest.mark.parametrize("scheme", ["q8s:native", "q4s:block32:f16", "q8s:block8:bf16:native"])
def test_a_float_loader_does_not_find_the_weight(scheme: str, tmp_path: Path) -> None:
    path, _, bias = _linear_file(tmp_path, scheme)
    found = safetensors.numpy.load_file(str(path))
    assert set(found) == {"weight.qvalues", "weight.scales", "bias"}  # no "weight"
    np.testing.assert_array_equal(found["bias"], bias)  # plain arrays keep their names


def test_no_entry_under_the_plain_name_for_any_level(tmp_path: Path) -> None:
    """Two-level and F8-scaled schemes too (read from the header: NumPy has no F8 for load_file)."""
    for scheme in ("nvfp4", "mxfp8", TWO_LEVEL):
        path, _, _ = _linear_file(tmp_path, scheme)
        with path.open("rb") as f:
            keys = set(json.loads(f.read(int.from_bytes(f.read(8), "little")))) - {"__metadata__"}
        assert "weight" not in keys
        assert {"weight.qvalues", "weight.scales", "bias"} <= keys


@pytest.mark.parametrize("scheme", ["q8s:native", "nvfp4"])
def test_torch_load_state_dict_fails_loudly(scheme: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import safetensors.torch

    path, _, _ = _linear_file(tmp_path, scheme)
    layer = torch.nn.Linear(32, 4)
    with pytest.raises(RuntimeError, match=r"(?s)Missing key\(s\) in state_dict: \"weight\".*Unexpected key\(s\)"):
        layer.load_state_dict(safetensors.torch.load_file(str(path)))


def test_the_cli_writes_no_float_looking_weight(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "m.safetensors", tmp_path / "q.safetensors"
    weight = np.random.default_rng(6).standard_normal((8, 64)).astype(np.float32)
    save_stream(src, [("layer.weight", weight), ("layer.bias", np.ones(8, np.float32))])
    assert main(["quantize", str(src), str(dst), "--scheme", "q8s:native", "--quiet"]) == 0
    keys = set(safetensors.numpy.load_file(str(dst)))
    assert keys == {"layer.weight.qvalues", "layer.weight.scales", "layer.bias"}
    capsys.readouterr()
    assert main(["inspect", str(dst)]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:] if line.strip()}
    assert rows["layer.weight"][:3] == ["8x64", "q8s:native", f"{8 * 64 + 4:,}"]  # int8 codes + one f32 scale
    assert "layer.weight.qvalues" not in rows


def _format_one(tmp_path: Path) -> Path:
    """The worked example as format 1 wrote it: the values under the tensor's own name."""
    entries = {
        "w": np.frombuffer(EXAMPLE_VALUES, np.int8),
        "w.scales": np.frombuffer(EXAMPLE_SCALES, np.uint8),
        "w.global_scale": np.frombuffer(EXAMPLE_GLOBAL, "<f4"),
        "bias": np.array([0.25, -1.0], np.float32),
    }
    meta = {
        "arrayquant.format": "1",
        "arrayquant.tensor.w": json.dumps({"scheme": TWO_LEVEL, "dtype": "float32", "shape": [8]}),
    }
    path = tmp_path / "v1.safetensors"
    safetensors.numpy.save_file(entries, str(path), metadata=meta)
    # F8_E4M3 scales: rewrite the header's dtype of the uint8 stand-in (same bytes, same size)
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    header["w.scales"]["dtype"] = "F8_E4M3"
    return write_file(path, header, blob[8 + n :])


def test_files_of_format_one_still_load(tmp_path: Path) -> None:
    out = aq.load(_format_one(tmp_path), backend="numpy")
    assert sorted(out) == ["bias", "w"]
    qt = out["w"]
    assert qt.scheme == aq.QuantScheme.parse(TWO_LEVEL)
    assert aq.to_bytes(qt) == EXAMPLE_VALUES + EXAMPLE_SCALES + EXAMPLE_GLOBAL
    assert aq.dequantize(qt).tolist() == EXAMPLE_DEQUANTIZED
    assert out["bias"].tolist() == [0.25, -1.0]


def test_files_of_format_one_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, dst = _format_one(tmp_path), tmp_path / "dq.safetensors"
    assert main(["dequantize", str(path), str(dst)]) == 0
    assert "dequantized 1 of 2 tensors" in capsys.readouterr().out
    back = safetensors.numpy.load_file(str(dst))
    assert back["w"].tolist() == EXAMPLE_DEQUANTIZED
    assert main(["inspect", str(path)]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:] if line.strip()}
    assert rows["w"][:3] == ["8", TWO_LEVEL, "14"]  # 8 values + 2 scales + 4-byte global


def test_format_two_refuses_the_plain_name_beside_qvalues(tmp_path: Path) -> None:
    path, _, _ = _linear_file(tmp_path, "q8s:native")
    entries = safetensors.numpy.load_file(str(path))
    entries["weight"] = np.zeros((4, 32), np.float32)
    with path.open("rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    safetensors.numpy.save_file(entries, str(path), metadata=meta)
    pattern = r"entry 'weight' has the name of the quantized tensor 'weight' \(whose values are 'weight\.qvalues'\)"
    for read in READERS:
        with pytest.raises(aq.CorruptDataError, match=pattern):
            read(path)


def test_stray_qvalues_entry(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    safetensors.numpy.save_file({"x.qvalues": np.zeros(2, np.int8)}, str(path), metadata={"arrayquant.format": "2"})
    for read in READERS:
        with pytest.raises(aq.CorruptDataError, match=r"entries \['x\.qvalues'\] that belong to no quantized tensor"):
            read(path)


@pytest.mark.parametrize("name", ["w.qvalues", "w.scales", "arrayquant.x", ""])
def test_names_a_writer_refuses(name: str, tmp_path: Path) -> None:
    path = tmp_path / "n.safetensors"
    for write in (
        lambda: aq.save(path, {name: np.zeros(2, np.float32)}),
        lambda: save_stream(path, [(name, np.zeros(2))]),
    ):
        with pytest.raises(aq.ShapeError, match=rf"tensor name {name!r} is not allowed; .*'\.qvalues'"):
            write()
    assert not path.exists()


def test_save_stream_refuses_a_name_twice(tmp_path: Path) -> None:
    path = tmp_path / "d.safetensors"
    qt = aq.quantize(np.ones(4, np.float32), "q8s")
    with pytest.raises(aq.ShapeError, match=r"^tensor name 'w' appears twice; each name must be unique$"):
        save_stream(path, [("w", qt), ("w", np.zeros(2, np.float32))])
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# many tensors (item 2): correctness at the scale that used to be quadratic; timings in ci/io_scale.py
# ---------------------------------------------------------------------------------------------


def _python_calls(run: Callable[[], object]) -> int:
    """How many Python-level calls (generator steps included) ``run`` makes: a count, not a timing."""
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        count += event == "call"

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


@pytest.mark.parametrize("what", ["save_stream plain", "save_stream quantized", "load", "cli reader"])
def test_work_grows_linearly_with_the_number_of_tensors(what: str, tmp_path: Path) -> None:
    """4x the tensors, about 4x the calls (the quadratic save_stream made 10-13x at these sizes)."""
    one = np.ones(1, np.float32)
    item = aq.quantize(one, "q8s") if "quantized" in what else one
    path = tmp_path / "n.safetensors"

    def calls(n: int) -> int:
        items = [(f"t{i}", item) for i in range(n)]
        if what.startswith("save_stream"):
            return _python_calls(lambda: save_stream(path, items))
        save_stream(path, items)
        if what == "load":
            return _python_calls(lambda: aq.load(path, backend="numpy"))
        return _python_calls(lambda: through_cli_reader(path))

    calls(10)  # imports and caches
    small, large = calls(250), calls(1000)
    assert large / small < 4.5, (small, large)


def test_sixteen_thousand_tiny_tensors_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = 16_000
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    one = np.ones(1, np.float32)
    codes = aq.quantize(np.array([2.0], np.float32), "q8s:native")  # code 127, scale 2/127
    items = [(f"t{i}", codes if i % 2 else one * i) for i in range(n)]
    save_stream(src, items)
    assert main(["dequantize", str(src), str(dst)]) == 0
    assert f"dequantized {n // 2} of {n} tensors" in capsys.readouterr().out
    back = safetensors.numpy.load_file(str(dst))
    assert len(back) == n
    two = np.float32(127) * (np.float32(2) / np.float32(127))  # code times scale, in f32
    for i in (0, 1, 2, 7_777, n - 2, n - 1):
        assert back[f"t{i}"].tolist() == ([float(two)] if i % 2 else [float(i)])


def test_zero_size_entries_cost_little_memory_each(tmp_path: Path) -> None:
    """``aq.load`` allocates a small, bounded amount per entry: the header is parsed into compact records."""
    n = 20_000
    header = {f"z{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(n)}
    path = write_file(tmp_path / "z.safetensors", header)
    aq.load(path, backend="numpy")  # imports and caches
    tracemalloc.start()
    try:
        out = aq.load(path, backend="numpy")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(out) == n
    assert all(v.shape == (0,) and v.dtype == np.float32 for v in out.values())
    assert peak / n < 800, peak / n  # about 400 bytes; format-1 era code took 1,200 (and 1.9 KB of RSS)


def test_read_nvfp4_refuses_ranks_the_core_cannot_hold() -> None:
    from arrayquant.io.compressed_tensors import read_nvfp4, write_nvfp4

    entries = write_nvfp4(aq.quantize(np.ones((2, 32), np.float32), "nvfp4"), "fc", scale_codes=True)
    deep = {k: v if k == "fc.weight_global_scale" else v.reshape((1,) * 31 + v.shape) for k, v in entries.items()}
    with pytest.raises(aq.ShapeError, match=r"weight 'fc' shape has 33 axes; quantized tensors have at most 32"):
        read_nvfp4(deep, "fc", backend="numpy")


def test_save_refuses_a_name_that_is_not_unicode(tmp_path) -> None:
    with pytest.raises(aq.ShapeError, match=r"tensor name '\\ud800' is not valid Unicode text"):
        aq.save(str(tmp_path / "x.safetensors"), {"\ud800": np.ones(2, np.float32)})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bits", [0x7F800001, 0xFFC00000, 0x7F800000, 0x00000000])
def test_read_nvfp4_refuses_a_bad_divisor_without_a_warning(bits: int) -> None:
    # a signalling NaN (0x7F800001) made NumPy warn "invalid value" before the typed error
    from arrayquant.io.compressed_tensors import read_nvfp4, write_nvfp4

    entries = write_nvfp4(aq.quantize(np.ones((2, 32), np.float32), "nvfp4"), "fc", scale_codes=True)
    entries["fc.weight_global_scale"] = np.array([bits], np.uint32).view(np.float32)
    with pytest.raises(aq.ParamsError, match=r"'fc.weight_global_scale' is .*must be a positive finite f32"):
        read_nvfp4(entries, "fc", backend="numpy")
