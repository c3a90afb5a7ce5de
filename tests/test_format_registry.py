"""The format table: one protocol per format, and ``aq.quantize_file`` / ``aq.dequantize_file`` over it.

Every format's entry module must implement the same functions with the same required
parameters (a new format that forgets one fails here, not in a user's hands). The file-level
functions must reach the format that writes each (input, output) pair, say which pairs and
options they refuse, and give the same tensors as quantizing them one by one in memory.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import SchemeError
from arrayquant.io import formats
from arrayquant.io.arrayquant.checkpoint import save_stream

PROTOCOL = ("sniff", "load", "iter_tensors", "tensor_shapes", "save", "quantize_file", "dequantize_file")


def _x(rows: int = 8, cols: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def _floats(path: Path) -> dict[str, np.ndarray]:
    tensors = {"layers.0.fc.weight": _x(8, 64, 1), "layers.0.norm.weight": np.ones(64, np.float32)}
    save_stream(path, iter(tensors.items()))
    return tensors


@pytest.mark.parametrize("fmt", formats.FORMATS, ids=[f.name for f in formats.FORMATS])
def test_every_format_implements_the_protocol(fmt: formats.Format) -> None:
    if fmt.extra:
        pytest.importorskip({"gguf": "gguf", "burn": "cbor2", "onnx": "onnx"}[fmt.extra])
    module = fmt.module()
    assert fmt.name == module.NAME
    for name in PROTOCOL:
        assert callable(getattr(module, name, None)), f"{fmt.entry} has no {name}"
    positional = {
        "sniff": ["path"],
        "load": ["path"],
        "iter_tensors": ["path"],
        "tensor_shapes": ["path"],
        "save": ["path", "tensors"],
        "quantize_file": ["src", "dst", "scheme"],
        "dequantize_file": ["src", "dst"],
    }
    for name, want in positional.items():
        params = inspect.signature(getattr(module, name)).parameters.values()
        got = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert got == want, f"{fmt.entry}.{name}{got}"
    for name, keywords in (
        ("load", {"backend", "device"}),
        ("quantize_file", {"include", "exclude", "progress", "calibration", "importance"}),
        ("dequantize_file", {"dtype", "names"}),
    ):
        params = inspect.signature(getattr(module, name)).parameters
        assert keywords <= set(params), f"{fmt.entry}.{name} lacks {keywords - set(params)}"


def test_names_suffixes_and_unknown_formats() -> None:
    assert formats.names() == ("gguf", "burnpack", "compressed-tensors", "onnx", "matmulnbits", "arrayquant")
    assert formats.by_suffix("m.GGUF") == "gguf"
    assert formats.by_suffix("m.bpk") == "burnpack"
    assert formats.by_suffix("m.safetensors") == "arrayquant"
    assert formats.by_suffix("folder") is None
    assert formats.by_suffix("model.onnx") == "onnx"  # matmulnbits names no suffix: it is never detected
    assert formats.get_format("burnpack").title == "Burnpack"
    with pytest.raises(
        SchemeError, match=r"format 'tflite' is not one arrayquant knows; use one of 'gguf', 'burnpack'"
    ):
        formats.get_format("tflite")


def test_quantize_file_on_safetensors_matches_quantize(tmp_path: Path) -> None:
    src = tmp_path / "m.safetensors"
    tensors = _floats(src)
    seen: list[str] = []
    summary = aq.quantize_file(src, tmp_path / "q.safetensors", "q4s:block32:f16", progress=seen.append)
    assert isinstance(summary, aq.QuantizeSummary)
    assert (summary.format, summary.scheme, summary.stored_as) == ("arrayquant", "q4s:block32:f16", "q4s:block32:f16")
    assert summary.quantized == ["layers.0.fc.weight"]
    assert summary.left_out == {"layers.0.norm.weight": "rank 1 (only 2-d weights by default)"}
    loaded = aq.load(tmp_path / "q.safetensors", backend="numpy")
    want = aq.quantize(tensors["layers.0.fc.weight"], "q4s:block32:f16")
    got = loaded["layers.0.fc.weight"]
    np.testing.assert_array_equal(np.asarray(got.values), np.asarray(want.values))
    np.testing.assert_array_equal(np.asarray(got.scales), np.asarray(want.scales))
    np.testing.assert_array_equal(loaded["layers.0.norm.weight"], tensors["layers.0.norm.weight"])

    back = aq.dequantize_file(tmp_path / "q.safetensors", tmp_path / "f.safetensors")
    assert isinstance(back, aq.DequantizeSummary)
    assert (back.format, back.dequantized) == ("arrayquant", ["layers.0.fc.weight"])
    floats = aq.load(tmp_path / "f.safetensors", backend="numpy")
    np.testing.assert_array_equal(floats["layers.0.fc.weight"], aq.dequantize(want))


def test_the_output_suffix_or_format_picks_the_writer(tmp_path: Path) -> None:
    pytest.importorskip("cbor2")
    src = tmp_path / "m.safetensors"
    tensors = _floats(src)
    summary = aq.quantize_file(src, tmp_path / "q.bpk", "q8s")
    assert summary.format == "burnpack"
    assert formats.detect(tmp_path / "q.bpk") == "burnpack"
    renamed = tmp_path / "q.bin"
    assert aq.quantize_file(src, renamed, "q8s", format="burnpack").format == "burnpack"
    assert renamed.read_bytes() == (tmp_path / "q.bpk").read_bytes()
    np.testing.assert_array_equal(
        aq.dequantize(aq.load(renamed, backend="numpy")["layers.0.fc.weight"]),
        aq.dequantize(aq.quantize(tensors["layers.0.fc.weight"], "q8s")),
    )
    # and from the Burnpack file back to a safetensors file of floats
    back = aq.dequantize_file(renamed, tmp_path / "f.safetensors")
    assert (back.format, back.dequantized) == ("arrayquant", ["layers.0.fc.weight"])
    assert formats.detect(tmp_path / "f.safetensors") == "arrayquant"


def test_a_folder_output_is_compressed_tensors(tmp_path: Path) -> None:
    src = tmp_path / "m.safetensors"
    _floats(src)
    summary = aq.quantize_file(src, tmp_path / "out", "nvfp4", format="compressed-tensors")
    assert (summary.format, summary.stored_as) == ("compressed-tensors", "nvfp4-pack-quantized")
    assert summary.quantized == ["layers.0.fc"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "nvfp4-pack-quantized"
    assert formats.detect(tmp_path / "out") == "compressed-tensors"
    # a model folder in: a folder out, by default
    again = aq.dequantize_file(tmp_path / "out", tmp_path / "float")
    assert again.format == "compressed-tensors"
    assert again.dequantized


def test_refused_pairs_and_options_name_what_is_written(tmp_path: Path) -> None:
    src = tmp_path / "m.safetensors"
    _floats(src)
    with pytest.raises(SchemeError, match=r"does not write GGUF from safetensors; it writes gguf -> gguf"):
        aq.quantize_file(src, tmp_path / "q.gguf", "q8_0")
    with pytest.raises(SchemeError, match=r"quantize_file into safetensors does not take max_shard_size"):
        aq.quantize_file(src, tmp_path / "q.safetensors", "q8s", max_shard_size="1GB")
    with pytest.raises(
        SchemeError, match=r"quantize_file does not write ONNX from safetensors; it writes gguf -> gguf"
    ):
        aq.quantize_file(src, tmp_path / "q.onnx", "q8s", format="onnx")
    with pytest.raises(SchemeError, match=r"format 'tflite' is not one arrayquant knows"):
        aq.quantize_file(src, tmp_path / "q.tflite", "q8s", format="tflite")
    assert not (tmp_path / "q.gguf").exists()
    assert not (tmp_path / "q.safetensors").exists()
    aq.quantize_file(src, tmp_path / "q.safetensors", "q8s")
    with pytest.raises(SchemeError, match=r"dequantize_file does not write GGUF from safetensors"):
        aq.dequantize_file(tmp_path / "q.safetensors", tmp_path / "f.gguf")


def test_gguf_files_go_through_the_gguf_format(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    src = tmp_path / "m-f16.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    x = _x(8, 64, 3)
    w.add_tensor("blk.0.attn_q.weight", x.astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    summary = aq.quantize_file(src, tmp_path / "q.gguf", "q8_0")
    assert (summary.format, summary.stored_as, summary.quantized) == ("gguf", "Q8_0", ["blk.0.attn_q.weight"])
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "q.gguf")).tensors}
    assert types == {"blk.0.attn_q.weight": "Q8_0", "blk.0.attn_norm.weight": "F32"}
    with pytest.raises(SchemeError, match=r"quantize_file into GGUF does not take min_size"):
        aq.quantize_file(src, tmp_path / "r.gguf", "q8_0", min_size=10)
    back = aq.dequantize_file(tmp_path / "q.gguf", tmp_path / "f.gguf")
    assert (back.format, back.dequantized) == ("gguf", ["blk.0.attn_q.weight"])
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "f.gguf")).tensors}
    assert types["blk.0.attn_q.weight"] == "F32"
