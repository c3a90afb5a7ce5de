"""One registry for every format: ``aq.load``/``aq.save`` by content and name, the commands on GGUF and Burnpack.

Files are written by the formats' own tools where the test needs an outside reader (gguf-py's
``GGUFWriter`` and ``GGUFReader``); the formats' bytes themselves are checked in
``test_gguf.py``, ``test_gguf_types.py`` and ``test_burnpack.py``. Here the question is whether
every entry point reaches the right module and says what it does.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.errors import BackendUnavailableError, SchemeError
from arrayquant.io import formats
from arrayquant.io.arrayquant.checkpoint import save_stream

gguf = pytest.importorskip("gguf")
pytest.importorskip("cbor2")
pytest.importorskip("ml_dtypes")


def _x(rows: int = 8, cols: int = 256, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def _gguf_f16(path: Path) -> dict[str, np.ndarray]:
    """A small llama-like GGUF written by gguf-py: f16 weights, an f32 norm, an IQ2_XXS tensor, metadata."""
    tensors = {"blk.0.attn_q.weight": _x(8, 256, 1), "blk.0.ffn_up.weight": _x(16, 256, 2)}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_token_list(["<s>", "a", "b"])
    for name, x in tensors.items():
        w.add_tensor(name, x.astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(256, np.float32))
    # IQ2_XXS bytes (a vector codebook gguf-py only dequantizes): grid indices at random, f16 d = 0.01
    iq2 = np.random.default_rng(3).integers(0, 256, (4, 66), dtype=np.uint8)
    iq2[:, :2] = np.array([0.01], "<f2").view(np.uint8)
    w.add_tensor("blk.0.iq2.weight", iq2, raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def test_detect_by_content_not_name(tmp_path: Path) -> None:
    x = _x()
    aq.save(tmp_path / "a.safetensors", {"w": aq.quantize(x, "q8s")})
    aq.save(tmp_path / "b.gguf", {"w": aq.quantize(x, "q8_0")})
    aq.save(tmp_path / "c.bpk", {"w": aq.quantize(x, "q8s")})
    aq.save(tmp_path / "d.safetensors", {"m.weight": aq.quantize(x, "mxfp8")}, format="compressed-tensors")
    for src, kind in (("a.safetensors", "arrayquant"), ("b.gguf", "gguf"), ("c.bpk", "burnpack")):
        (tmp_path / f"renamed-{kind}.bin").write_bytes((tmp_path / src).read_bytes())
        assert formats.detect(tmp_path / f"renamed-{kind}.bin") == kind
    assert formats.detect(tmp_path / "d.safetensors") == "compressed-tensors"
    assert formats.detect(tmp_path) == "compressed-tensors"  # a folder
    # aq.load reads each by its content, whatever its name
    want = aq.dequantize(aq.quantize(x, "q8s"))
    np.testing.assert_array_equal(aq.dequantize(aq.load(tmp_path / "renamed-burnpack.bin")["w"]), want)
    assert str(aq.load(tmp_path / "renamed-gguf.bin")["w"].scheme) == "q8f:block32:f16"


def test_save_picks_the_format_by_suffix_or_name(tmp_path: Path) -> None:
    qt = aq.quantize(_x(), "q8_0")
    aq.save(tmp_path / "m.gguf", {"w": qt}, metadata={"general.name": "m"})
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert [t.name for t in reader.tensors] == ["w"]
    assert reader.tensors[0].tensor_type == gguf.GGMLQuantizationType.Q8_0
    aq.save(tmp_path / "m.bpk", {"w": qt}, metadata={"k": "v"})
    assert (tmp_path / "m.bpk").read_bytes()[:4] == b"NRUB"
    aq.save(tmp_path / "m.bin", {"w": qt}, format="burnpack")  # the name says nothing: format= decides
    assert (tmp_path / "m.bin").read_bytes()[:4] == b"NRUB"
    with pytest.raises(SchemeError, match=r"format 'arrayquant' takes no options, got \['metadata'\]"):
        aq.save(tmp_path / "m.safetensors", {"w": qt}, metadata={"k": "v"})
    with pytest.raises(
        SchemeError,
        match=r"format 'tflite' is not one aq.save writes; use one of 'gguf', 'burnpack', 'compressed-tensors'",
    ):
        aq.save(tmp_path / "m.tflite", {"w": qt}, format="tflite")
    with pytest.raises(SchemeError, match=r"aq.save does not write ONNX files: an ONNX file is a model"):
        aq.save(tmp_path / "m.onnx", {"w": qt})  # by its suffix


def test_a_missing_format_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> object:
        raise ModuleNotFoundError("No module named 'cbor2'", name="cbor2")

    monkeypatch.setattr(formats.importlib, "import_module", missing)
    with pytest.raises(
        BackendUnavailableError, match=r"the burnpack format needs cbor2 \(pip install 'arrayquant\[burn\]'\)"
    ):
        formats.format_module("burnpack")
    with pytest.raises(SchemeError, match="format 'tflite' is not one arrayquant knows; use one of 'gguf', 'burnpack'"):
        formats.format_module("tflite")


def test_cli_on_gguf_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The llama.cpp workflow: re-quantize, inspect, compare, dequantize — all on GGUF files."""
    f16, q8 = tmp_path / "model-f16.gguf", tmp_path / "model-q8_0.gguf"
    weights = _gguf_f16(f16)
    assert main(["quantize", str(f16), str(q8), "--scheme", "q8_0", "--quiet"]) == 1  # it holds an IQ2_XXS weight
    err = capsys.readouterr().err
    assert "holds 1 weight(s) quantized already that --scheme q8_0 would quantize again" in err
    assert "(e.g. 'blk.0.iq2.weight', IQ2_XXS)" in err
    assert "rerun with --requantize" in err
    assert not q8.exists()
    argv = ["quantize", str(f16), str(q8), "--scheme", "q8_0", "--exclude", "blk.0.iq2.weight", "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "quantized 2 tensors as Q8_0" in out
    reader = gguf.GGUFReader(str(q8))  # llama.cpp's own reader: keys kept, types by GGUF name
    assert {f.name for f in gguf.GGUFReader(str(f16)).fields.values()} <= {f.name for f in reader.fields.values()}
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0"
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert types["blk.0.iq2.weight"] == "IQ2_XXS"  # already quantized and excluded: left as it was

    assert main(["inspect", str(q8)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"blk\.0\.attn_q\.weight\s+8x256\s+q8f:block32:f16", out)
    assert "IQ2_XXS read as float32 values" in out  # never silently: the note says how it was read

    assert main(["compare", str(f16), str(q8)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"blk\.0\.ffn_up\.weight\s+q8f:block32:f16\s+\d+\.\d", out)
    assert re.search(r"blk\.0\.attn_norm\.weight\s+float32\s+inf\s+0\s+identical", out)

    back = tmp_path / "back.safetensors"
    assert main(["dequantize", str(q8), str(back)]) == 0
    loaded = aq.load(back, backend="numpy")
    q8_read = aq.load(q8, backend="numpy")
    for name in weights:
        np.testing.assert_array_equal(loaded[name], aq.dequantize(q8_read[name]))


def test_cli_refuses_format_mixups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f16 = tmp_path / "model-f16.gguf"
    _gguf_f16(f16)
    st = tmp_path / "m.safetensors"
    save_stream(st, iter([("w", _x())]))
    assert main(["quantize", str(st), str(tmp_path / "m.gguf"), "--scheme", "q8_0", "--format", "gguf"]) == 1
    assert "GGUF files come from llama.cpp's converters" in capsys.readouterr().err
    assert (
        main(["quantize", str(f16), str(tmp_path / "x.safetensors"), "--scheme", "q8s", "--format", "arrayquant"]) == 1
    )
    assert "is a gguf file: quantize writes gguf from it; turn it into safetensors with arrayquant dequantize" in (
        capsys.readouterr().err
    )
    assert main(["quantize", str(f16), str(tmp_path / "y.gguf"), "--scheme", "q8_0", "--min-size", "9"]) == 1
    assert "--min-size, --backend, --device and --nonfinite do not apply to gguf files" in capsys.readouterr().err
    assert not list(tmp_path.glob("x.*"))
    assert not (tmp_path / "y.gguf").exists()


def test_cli_safetensors_to_burnpack_and_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The Burn bridge: a safetensors checkpoint into a Burnpack file, re-quantized, inspected, compared."""
    src = tmp_path / "model.safetensors"
    x, b = _x(16, 128, 4), np.zeros(16, np.float32)
    save_stream(src, iter([("fc.weight", x), ("fc.bias", b)]))
    bpk = tmp_path / "model.bpk"
    assert main(["quantize", str(src), str(bpk), "--scheme", "q4s:block32:f16", "--quiet"]) == 0  # by suffix
    assert "quantized 1 of 2 tensors" in capsys.readouterr().out
    assert bpk.read_bytes()[:4] == b"NRUB"
    got = aq.load(bpk, backend="numpy")
    assert aq.to_bytes(got["fc.weight"]) == aq.to_bytes(aq.quantize(x, "q4s:block32:f16"))
    np.testing.assert_array_equal(got["fc.bias"], b)

    named = tmp_path / "model.bin"  # a name that says nothing: --format says burnpack
    assert main(["quantize", str(src), str(named), "--scheme", "q8s", "--format", "burnpack", "--quiet"]) == 0
    capsys.readouterr()
    assert named.read_bytes()[:4] == b"NRUB"
    assert aq.to_bytes(aq.load(named)["fc.weight"]) == aq.to_bytes(aq.quantize(x, "q8s"))

    again = tmp_path / "model-q8.bpk"
    assert main(["quantize", str(bpk), str(again), "--scheme", "q8s"]) == 1  # its weight is quantized already
    assert "holds 1 weight(s) quantized already that --scheme q8s would quantize again" in capsys.readouterr().err
    assert main(["quantize", str(bpk), str(again), "--scheme", "q8s", "--requantize"]) == 0  # a .bpk in: a .bpk out
    assert "re-quantized 1 of them through float32 (--requantize): q4s:block32:f16 x1" in capsys.readouterr().out
    assert main(["inspect", str(bpk)]) == 0
    assert re.search(r"fc\.weight\s+16x128\s+q4s:block32:f16", capsys.readouterr().out)
    assert main(["compare", str(src), str(bpk)]) == 0
    assert re.search(r"fc\.weight\s+q4s:block32:f16\s+\d+\.\d", capsys.readouterr().out)
    back = tmp_path / "back.safetensors"
    assert main(["dequantize", str(bpk), str(back)]) == 0
    np.testing.assert_array_equal(
        aq.load(back, backend="numpy")["fc.weight"], aq.dequantize(aq.quantize(x, "q4s:block32:f16"))
    )
