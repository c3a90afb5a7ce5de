"""GGUF bytes equal llama.cpp's own: ``calibration="ggml"`` and ``arrayquant quantize`` against ggml.

The oracle is ggml-base compiled from the pinned llama-cpp-python sdist (``tests/ggml_oracle.py``),
called through ctypes: ``ggml_quantize_chunk``, what llama-quantize writes every block with, and
``dequantize_row_*``. Every comparison is of bytes (codes and stored scales), exactly.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.io.gguf import types as gguf_types

from . import ggml_oracle

gguf = pytest.importorskip("gguf")

TYPES = ["Q8_0", "Q4_0", "MXFP4", "NVFP4", "TQ1_0", "TQ2_0"]


def _below_powers(shape: tuple[int, int]) -> np.ndarray:
    """Blocks whose largest value sits just below (or on) a power of two: log2's rounding edge."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    k = rng.integers(-20, 12, size=shape[0])
    top = np.ldexp(np.float32(1), k).astype(np.float32)
    for i in range(shape[0]):
        edge = [np.nextafter(top[i], np.float32(0)), top[i], np.nextafter(np.nextafter(top[i], 0), 0)][i % 3]
        x[i] *= top[i] / 2
        x[i, ::16] = edge * (1 if i % 2 else -1)
    return x


def _data(dist: str, shape: tuple[int, int] = (48, 512)) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(dist.encode()))
    if dist == "normal":
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)
    if dist == "heavy":
        return (rng.standard_t(2, shape) * 0.3).astype(np.float32)
    if dist == "ties":  # multiples of 1/8: many values exactly half way between codes
        return (rng.integers(-64, 65, shape) / 8).astype(np.float32)
    if dist == "scales":  # rows from 1e-30 to 1e4, zeros and constant blocks
        x = rng.standard_normal(shape).astype(np.float32)
        x *= np.logspace(-30, 4, shape[0], dtype=np.float64).astype(np.float32)[:, None]
        x[0] = 0
        x[1] = 3.0
        x[2, :64] = -0.0
        return x
    if dist == "edges":
        return _below_powers(shape)
    raise KeyError(dist)


DISTS = ["normal", "heavy", "ties", "scales", "edges"]


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("type_name", TYPES)
def test_ggml_calibration_is_ggml_quantize_chunk(oracle: object, type_name: str, dist: str) -> None:
    x = _data(dist)
    scheme = gguf_types.scheme_of(type_name)
    qt = aq.quantize(x, scheme, calibration="ggml")
    name, raw = gguf_types.encode(qt, type_name)
    assert name == type_name
    want = ggml_oracle.quantize(x, type_name)
    assert raw.shape == want.shape
    diff = np.flatnonzero((raw != want).any(axis=-1))
    assert diff.size == 0, f"{diff.size} of {raw.shape[0]} rows differ, first row {diff[:1]}"


@pytest.mark.parametrize("type_name", TYPES)
def test_files_llama_cpp_wrote_read_exactly(oracle: object, type_name: str) -> None:
    x = _data("normal") * 10
    raw = ggml_oracle.quantize(x, type_name)
    qt, why = gguf_types.decode(raw, type_name, x.shape, backend="numpy")
    assert why == ""
    assert qt is not None
    want = ggml_oracle.dequantize(raw, type_name, x.shape)
    got = np.asarray(aq.dequantize(qt), np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # -0.0 included
    if type_name == "Q4_0":
        assert (np.asarray(qt.scales) < 0).mean() > 0.3  # llama.cpp's d = max / -8: about half negative
    assert gguf_types.encode(qt, type_name)[1].tobytes() == raw.tobytes()  # and back to the same bytes


def _gguf_file(path: Path, dtype: str) -> dict[str, np.ndarray]:
    """A small llama-shaped GGUF of float weights (``dtype`` F32, F16 or BF16) and a norm; its f32 values."""
    rng = np.random.default_rng(3)
    shapes = {
        "token_embd.weight": (40, 512),
        "blk.0.attn_q.weight": (64, 512),
        "blk.0.attn_k.weight": (32, 512),
        "blk.0.ffn_up.weight": (96, 256),
        "blk.0.ffn_down.weight": (48, 768),
        "blk.0.ffn_gate.weight": (16, 384),  # 384: no whole 256-blocks (TQ falls back to Q4_0)
    }
    w = gguf.GGUFWriter(str(path), "llama")
    values = {}
    for name, shape in shapes.items():
        x = (rng.standard_t(4, shape) * 0.05).astype(np.float32)
        if dtype == "BF16":  # gguf-py takes bfloat16 as its raw bits
            import ml_dtypes

            half = x.astype(ml_dtypes.bfloat16)
            w.add_tensor(name, half.view(np.uint16), raw_shape=shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
            values[name] = half.astype(np.float32)
            continue
        stored = x.astype(np.float16) if dtype == "F16" else x
        w.add_tensor(name, stored)
        values[name] = stored.astype(np.float32)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(512, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values


@pytest.mark.parametrize("dtype", ["F32", "F16"])
@pytest.mark.parametrize("type_name", TYPES)
def test_cli_quantize_writes_llama_quantize_bytes(
    oracle: object, tmp_path: Path, type_name: str, dtype: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "m.gguf", tmp_path / "q.gguf"
    values = _gguf_file(src, dtype)
    # --pure: every weight in the one type (llama-quantize's mix for the file type is test_gguf_mixes.py's)
    assert main(["quantize", str(src), str(dst), "--scheme", type_name.lower(), "--pure", "--quiet"]) == 0
    capsys.readouterr()
    r = gguf.GGUFReader(str(dst))
    got = {t.name: t for t in r.tensors}
    equal = 0
    for name, x in values.items():
        t = got[name]
        want_type = type_name
        if x.shape[-1] % {"TQ1_0": 256, "TQ2_0": 256, "NVFP4": 64}.get(type_name, 32):
            want_type = "Q4_0"  # llama-quantize's tensor_type_fallback for TQ on 384-wide rows
        if type_name == "NVFP4" and x.shape[-1] % 64:
            want_type = dtype  # no fallback: kept
        assert t.tensor_type.name == want_type, name
        if want_type in ("F32", "F16"):
            continue
        want = ggml_oracle.quantize(x, want_type)
        assert np.asarray(t.data).tobytes() == want.tobytes(), name
        equal += 1
    assert equal == len(values) - (type_name == "NVFP4" and any(v.shape[-1] % 64 for v in values.values()))
    want_ftype = {"MXFP4": "MOSTLY_MXFP4_MOE"}.get(type_name, f"MOSTLY_{type_name}")
    assert r.fields["general.file_type"].contents() == int(getattr(gguf.LlamaFileType, want_ftype))
    assert got["blk.0.attn_norm.weight"].tensor_type.name == "F32"


def test_cli_says_which_tensors_fell_back(oracle: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "m.gguf", tmp_path / "q.gguf"
    _gguf_file(src, "F32")
    assert main(["quantize", str(src), str(dst), "--scheme", "tq1_0", "--pure", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "blk.0.ffn_gate.weight: rows of TQ1_0 blocks do not fit, written as Q4_0 (llama-quantize's fallback)" in out


def test_cli_minmax_by_name_writes_arrayquant_rule(oracle: object, tmp_path: Path) -> None:
    src, dst = tmp_path / "m.gguf", tmp_path / "q.gguf"
    values = _gguf_file(src, "F32")
    assert main(["quantize", str(src), str(dst), "--scheme", "q8_0", "--calibration", "minmax", "--quiet"]) == 0
    t = {t.name: t for t in gguf.GGUFReader(str(dst)).tensors}["blk.0.attn_q.weight"]
    x = values["blk.0.attn_q.weight"]
    want = gguf_types.encode(aq.quantize(x, "q8_0"), "Q8_0")[1]
    assert np.asarray(t.data).tobytes() == want.tobytes()
    assert want.tobytes() != ggml_oracle.quantize(x, "Q8_0").tobytes()  # the two rules differ
