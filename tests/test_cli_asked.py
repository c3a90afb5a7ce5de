"""The commands do what was asked, or refuse with exit 1 and the reason: issue 21, item 4.

1. An OUT named ``.gguf`` or ``.bpk`` is written in that format, or refused.
2. Weights quantized already are refused in GGUF and Burnpack files, or re-quantized with ``--requantize``.
3. Folder schemes as the README spells them (``e4m3``, ...); advice names a command that works.
4. Folder quantize prints sizes and SQNR, and warns about tensors below the quality floor.
5. Path problems are a ``PathError``, printed alone; ``--max-shard-size`` needs a unit; help texts.
6. A model folder is not written as a ``.gguf`` or ``.bpk``.
7. ``--no-fused-shards``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.io.arrayquant.checkpoint import save_stream
from arrayquant.io.safetensors.reader import SafetensorsFile

pytest.importorskip("ml_dtypes")
pytest.importorskip("tqdm")

Q = "model.layers.0.self_attn.q_proj.weight"
UP = "model.layers.0.mlp.up_proj.weight"


def _w(rows: int, cols: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(np.float32)


def _folder(path: Path, tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A Hugging Face-shaped llama folder: config.json and one model.safetensors."""
    tensors = tensors or {Q: _w(64, 256, 1), UP: _w(128, 256, 2), "model.norm.weight": np.ones(256, np.float32)}
    path.mkdir(parents=True)
    save_stream(path / "model.safetensors", tensors.items(), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 96}))
    return path


def _floats() -> dict[str, np.ndarray]:
    return {
        "token_embd.weight": _w(64, 64, 3),
        "blk.0.attn_q.weight": _w(64, 64, 4),
        "blk.0.attn_norm.weight": _w(1, 64, 5)[0],
    }


@pytest.fixture
def gguf_q8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    pytest.importorskip("gguf")
    f32 = tmp_path / "model-f32.gguf"
    aq.save(f32, _floats(), metadata={"general.architecture": "llama", "llama.block_count": 1})
    q8 = tmp_path / "model-q8_0.gguf"
    assert main(["quantize", str(f32), str(q8), "--scheme", "q8_0", "--quiet"]) == 0
    capsys.readouterr()
    return q8


@pytest.fixture
def bpk_q8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    pytest.importorskip("cbor2")
    f32 = tmp_path / "model.bpk"
    ids = {name: k for k, name in enumerate(_floats())}
    aq.save(f32, _floats(), param_ids=ids, metadata={"model": "tiny"})
    q8 = tmp_path / "model-q8.bpk"
    assert main(["quantize", str(f32), str(q8), "--scheme", "q8s:block32:f16", "--quiet"]) == 0
    capsys.readouterr()
    return q8


def _one_error(err: str) -> str:
    """The whole of stderr is one error line: no progress bar or note before it."""
    assert err.count("\n") == 1, err
    assert err.startswith("arrayquant: error: "), err
    return err


def _advised(err: str, after: str) -> list[str]:
    """The arguments of the ``arrayquant ...`` command an error message advises, after ``after``."""
    line = err.split(after, 1)[1].strip()
    words = shlex.split(line.split(" (", 1)[0])
    assert words[0] == "arrayquant", line
    return words[1:]


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------------------------------------
# 1. the format OUT names is the format written
# ---------------------------------------------------------------------------------------------


def test_dequantize_gguf_to_gguf_writes_gguf(gguf_q8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arrayquant.io.gguf import read_metadata

    back = tmp_path / "back.gguf"
    assert main(["dequantize", str(gguf_q8), str(back)]) == 0
    assert "dequantized 2 of 3 tensors to float32; wrote" in capsys.readouterr().out
    assert back.read_bytes()[:4] == b"GGUF"
    got, q8 = aq.load(back, backend="numpy"), aq.load(gguf_q8, backend="numpy")
    assert list(got) == list(q8)  # names and order kept
    for name, t in q8.items():
        want = aq.dequantize(t, np.float32) if isinstance(t, aq.QuantizedTensor) else t
        np.testing.assert_array_equal(got[name], want)
        assert got[name].dtype == np.float32
    meta = read_metadata(back)
    assert meta["general.architecture"].value == "llama"
    assert meta["llama.block_count"].value == 1
    assert meta["general.file_type"].value == 0  # ALL_F32, no longer MOSTLY_Q8_0
    assert main(["dequantize", str(gguf_q8), str(tmp_path / "half.gguf"), "--dtype", "float16"]) == 0
    assert aq.load(tmp_path / "half.gguf", backend="numpy")["blk.0.attn_q.weight"].dtype == np.float16
    assert read_metadata(tmp_path / "half.gguf")["general.file_type"].value == 1  # MOSTLY_F16


def test_dequantize_bpk_to_bpk_writes_burnpack(
    bpk_q8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from arrayquant.io.burn.burnpack import read_burnpack

    back = tmp_path / "back.bpk"
    assert main(["dequantize", str(bpk_q8), str(back)]) == 0
    assert "dequantized 2 of 3 tensors to float32; wrote" in capsys.readouterr().out
    assert back.read_bytes()[:4] == b"NRUB"
    got, q8 = read_burnpack(back, backend="numpy"), read_burnpack(bpk_q8, backend="numpy")
    for name, t in q8.tensors.items():
        want = aq.dequantize(t, np.float32) if isinstance(t, aq.QuantizedTensor) else t
        np.testing.assert_array_equal(got.tensors[name], want)
    assert got.param_ids == q8.param_ids
    assert got.metadata == q8.metadata == {"model": "tiny"}


def test_dequantize_safetensors_to_bpk(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cbor2")
    q = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(q), "--scheme", "q8s", "--quiet"]) == 0
    back = tmp_path / "back.bpk"
    assert main(["dequantize", str(q), str(back)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert back.read_bytes()[:4] == b"NRUB"
    w = "layers.0.attn.q_proj.weight"
    np.testing.assert_array_equal(aq.load(back, backend="numpy")[w], aq.dequantize(aq.load(q, backend="numpy")[w]))


def test_outputs_named_for_another_format_are_refused(
    gguf_q8: Path, bpk_q8: Path, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (
            ["dequantize", str(gguf_q8), str(tmp_path / "o.bpk")],
            "names a Burnpack file; name OUT with .gguf or .safetensors",
        ),
        (
            ["dequantize", str(bpk_q8), str(tmp_path / "o.gguf")],
            "names a GGUF file; name OUT with .bpk or .safetensors",
        ),
        (["dequantize", str(model), str(tmp_path / "o.gguf")], "GGUF files come from llama.cpp's converters"),
        (["quantize", str(model), str(tmp_path / "o.gguf"), "--scheme", "q8_0"], "GGUF files come from llama.cpp's"),
        (["quantize", str(gguf_q8), str(tmp_path / "o.safetensors"), "--scheme", "q8_0"], "name OUT with .gguf"),
        (["quantize", str(bpk_q8), str(tmp_path / "o.gguf"), "--scheme", "q8s"], "name OUT with .bpk"),
        (
            ["quantize", str(model), str(tmp_path / "o.bpk"), "--scheme", "q8s", "--format", "arrayquant"],
            "OUT {} names a Burnpack file but --format arrayquant makes quantize write safetensors".format(
                tmp_path / "o.bpk"
            ),
        ),
        (
            [
                "quantize",
                str(model),
                str(tmp_path / "o.safetensors"),
                "--scheme",
                "q8s",
                "--format",
                "compressed-tensors",
            ],
            "--format compressed-tensors writes a model folder",
        ),
    ]
    for argv, message in cases:
        assert main(argv) == 1, argv
        assert message in _one_error(capsys.readouterr().err), argv
    assert not list(tmp_path.glob("o.*"))
    assert _hidden(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 2. quantized weights are not quantized again unless asked
# ---------------------------------------------------------------------------------------------


def test_requantizing_gguf_is_refused_or_done_through_floats(
    gguf_q8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from arrayquant.io.gguf import types as gguf_types

    q4 = tmp_path / "model-q4_0.gguf"
    assert main(["quantize", str(gguf_q8), str(q4), "--scheme", "q4_0", "--pure"]) == 1
    err = _one_error(capsys.readouterr().err)
    assert "PathError: IN" in err
    assert "holds 2 weight(s) quantized already that --scheme q4_0 would quantize again" in err
    assert "'token_embd.weight', Q8_0" in err
    assert "rerun with --requantize" in err
    assert not q4.exists()

    assert main(["quantize", str(gguf_q8), str(q4), "--scheme", "q4_0", "--pure", "--requantize", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "quantized 2 tensors as Q4_0" in out
    assert "re-quantized 2 of them through float32 (--requantize): Q8_0 x2" in out
    assert _hidden(tmp_path) == []  # the float copy is gone
    # the same as dequantizing to a float32 GGUF, then quantizing that
    floats, ref = tmp_path / "f32.gguf", tmp_path / "ref.gguf"
    assert main(["dequantize", str(gguf_q8), str(floats)]) == 0
    assert main(["quantize", str(floats), str(ref), "--scheme", "q4_0", "--pure", "--quiet"]) == 0
    capsys.readouterr()
    got, want, q8 = (aq.load(f, backend="numpy") for f in (q4, ref, gguf_q8))
    for name in ("token_embd.weight", "blk.0.attn_q.weight"):
        assert got[name].scheme == gguf_types.scheme_of("Q4_0")
        assert aq.to_bytes(got[name]) == aq.to_bytes(want[name])
        assert aq.sqnr(aq.dequantize(q8[name]), got[name]) > 15  # IN's values, quantized again
    np.testing.assert_array_equal(got["blk.0.attn_norm.weight"], q8["blk.0.attn_norm.weight"])

    # the type it holds already is no re-quantization: copied, as llama-quantize does
    assert main(["quantize", str(gguf_q8), str(tmp_path / "same.gguf"), "--scheme", "q8_0", "--quiet"]) == 0
    assert "already Q8_0, copied unchanged" in capsys.readouterr().out


def test_requantizing_burnpack_is_refused_or_done_through_floats(
    bpk_q8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from arrayquant.io.burn.burnpack import read_burnpack

    q4 = tmp_path / "model-q4.bpk"
    assert main(["quantize", str(bpk_q8), str(q4), "--scheme", "q4s:block32:f16"]) == 1
    err = _one_error(capsys.readouterr().err)
    assert "PathError: IN" in err
    assert "'token_embd.weight', q8s:block32:f16" in err
    assert "--requantize" in err
    assert not q4.exists()
    argv = ["quantize", str(bpk_q8), str(q4), "--scheme", "q4s:block32:f16", "--requantize", "--quiet"]
    assert main(argv) == 0
    assert "re-quantized 2 of them through float32 (--requantize): q8s:block32:f16 x2" in capsys.readouterr().out
    assert _hidden(tmp_path) == []
    floats, ref = tmp_path / "f32.bpk", tmp_path / "ref.bpk"
    assert main(["dequantize", str(bpk_q8), str(floats)]) == 0
    assert main(["quantize", str(floats), str(ref), "--scheme", "q4s:block32:f16", "--quiet"]) == 0
    capsys.readouterr()
    got, want, q8 = (read_burnpack(f, backend="numpy") for f in (q4, ref, bpk_q8))
    for name in ("token_embd.weight", "blk.0.attn_q.weight"):
        assert str(got.tensors[name].scheme) == "q4s:block32:f16"
        assert aq.to_bytes(got.tensors[name]) == aq.to_bytes(want.tensors[name])
        assert aq.sqnr(aq.dequantize(q8.tensors[name]), got.tensors[name]) > 15  # IN's values, quantized again
    assert got.param_ids == q8.param_ids
    assert got.metadata == q8.metadata


def test_requantize_is_for_gguf_and_burnpack(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["quantize", str(model), str(tmp_path / "q.safetensors"), "--scheme", "q8s", "--requantize"]
    assert main(argv) == 1
    assert "--requantize applies to GGUF and Burnpack IN" in _one_error(capsys.readouterr().err)


# ---------------------------------------------------------------------------------------------
# 3. folder schemes as the docs spell them; advice that works
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "strategy", "scale"),
    [("e4m3", "tensor", "F32"), ("e4m3:block128:bf16", "group", "BF16"), ("e4m3:block128x128:f32", "block", "F32")],
)
def test_folder_takes_e4m3_as_the_docs_spell_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheme: str, strategy: str, scale: str
) -> None:
    src = _folder(tmp_path / "m")
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", scheme, "--quiet"]) == 0
    out = capsys.readouterr().out
    native = f"{scheme}:native"
    assert f"note: compressed-tensors stores e4m3 values one per byte: {scheme} is written as {native}" in out
    assert f"quantized 2 Linear weights with {native} as float-quantized" in out
    qc = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "float-quantized"
    assert next(iter(qc["config_groups"].values()))["weights"]["strategy"] == strategy
    with SafetensorsFile(tmp_path / "q" / "model.safetensors") as st:
        assert st.entries[Q].dtype == "F8_E4M3"
        assert st.entries[Q.replace(".weight", ".weight_scale")].dtype == scale
    got = aq.load(tmp_path / "q", backend="numpy")[Q]
    assert aq.to_bytes(got) == aq.to_bytes(aq.quantize(_w(64, 256, 1), native))


def test_a_scheme_no_folder_holds_is_refused_with_a_command_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _folder(tmp_path / "m")
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "e5m2"]) == 1
    err = _one_error(capsys.readouterr().err)
    assert "SchemeError: scheme e5m2 has no compressed-tensors format, the layout a model folder is written in" in err
    assert len(err.replace(str(tmp_path), "")) < 450  # not the 700 characters of every format and argument
    argv = _advised(err, "quantize the weights into arrayquant's own layout:")
    assert argv == ["quantize", str(src / "model.safetensors"), f"{tmp_path / 'q'}.safetensors", "--scheme", "e5m2"]
    assert main([*argv, "--quiet"]) == 0  # the advice works
    assert "quantized 2 of 3 tensors with e5m2" in capsys.readouterr().out
    assert not (tmp_path / "q").exists()

    # --format arrayquant on a folder: no loop back to --format compressed-tensors
    assert main(["quantize", str(src), str(tmp_path / "a"), "--scheme", "e5m2", "--format", "arrayquant"]) == 1
    err = _one_error(capsys.readouterr().err)
    assert "(drop --format arrayquant)" in err
    assert "--format compressed-tensors" not in err
    argv = _advised(err, "quantize the weights:")
    assert main([*argv, "--quiet"]) == 0
    assert (tmp_path / "a.safetensors").is_file()


# ---------------------------------------------------------------------------------------------
# 4. sizes, SQNR and a quality floor for folders
# ---------------------------------------------------------------------------------------------


def test_folder_quantize_prints_sizes_and_sqnr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _folder(tmp_path / "m")
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "mxfp8", "--quiet"]) == 0
    captured = capsys.readouterr()
    before = (src / "model.safetensors").stat().st_size / 2**20
    after = (tmp_path / "q" / "model.safetensors").stat().st_size / 2**20
    assert f"size: {before:.1f} MiB -> {after:.1f} MiB of weight files" in captured.out
    loaded = aq.load(tmp_path / "q", backend="numpy")
    sqnr = {name: aq.sqnr(x, loaded[name]) for name, x in ((Q, _w(64, 256, 1)), (UP, _w(128, 256, 2)))}
    worst = min(sqnr, key=sqnr.__getitem__)
    mean = sum(sqnr.values()) / 2
    assert f"SQNR: mean {mean:.2f} dB, worst {sqnr[worst]:.2f} dB ({worst})" in captured.out
    assert captured.err == ""


def test_quantize_warns_below_the_quality_floor(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _folder(tmp_path / "m")
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "q2s:block256:f16", "--quiet"]) == 0  # per row
    err = capsys.readouterr().err
    assert "warning: 2 of 2 quantized tensors are below 3 dB SQNR" in err
    assert "a scheme with more bits or smaller blocks" in err
    assert main(["quantize", str(model), str(tmp_path / "q2.safetensors"), "--scheme", "q2s", "--quiet"]) == 0
    assert "warning: 13 of 13 quantized tensors are below 3 dB SQNR" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 5. path problems, shard sizes, help
# ---------------------------------------------------------------------------------------------


def test_path_problems_are_path_errors_printed_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _folder(tmp_path / "m")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "mxfp8", "--quiet"]) == 0
    capsys.readouterr()
    cases = [
        (src, src / "inside", "lies inside"),
        (src, tmp_path / "used", "exists and is not an empty folder"),
        (tmp_path / "plain", tmp_path / "o1", "holds neither model.safetensors nor"),
        (tmp_path / "q", tmp_path / "o2", "is already quantized"),
    ]
    for source, target, message in cases:
        assert main(["quantize", str(source), str(target), "--scheme", "mxfp8"]) == 1  # not --quiet
        err = _one_error(capsys.readouterr().err)  # no progress bar before it
        assert err.startswith("arrayquant: error: PathError: "), err
        assert message in err, err
        with pytest.raises(aq.PathError, match=message):
            aq.quantize_model(source, target, "mxfp8")
    assert issubclass(aq.PathError, aq.ShapeError)  # code that caught ShapeError still does
    assert not (src / "inside").exists()
    assert not (tmp_path / "o1").exists()


def test_max_shard_size_needs_a_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _folder(tmp_path / "m")
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "mxfp8", "--max-shard-size", "5"]) == 1
    err = _one_error(capsys.readouterr().err)
    assert "--max-shard-size 5 has no unit; write one, e.g. 5GB, 5MB or 5GiB (5B if you mean 5 bytes" in err
    assert not (tmp_path / "q").exists()
    argv = ["quantize", str(src), str(tmp_path / "q"), "--scheme", "mxfp8", "--max-shard-size", "40KB", "--quiet"]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    assert len(list((tmp_path / "q").glob("model-*-of-*.safetensors"))) == 2


def test_help_names_every_kind_of_in_and_out(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("quantize", "dequantize"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for kind in (".safetensors", "model folder", ".gguf", ".bpk"):
            assert kind in text, (command, kind)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "model folder, GGUF or Burnpack file" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------------------------------------
# 6. a folder is not written under a file format's name
# ---------------------------------------------------------------------------------------------


def test_folder_to_gguf_or_bpk_is_refused_with_advice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _folder(tmp_path / "m")
    assert main(["quantize", str(src), str(tmp_path / "m.gguf"), "--scheme", "q8_0"]) == 1
    err = _one_error(capsys.readouterr().err)
    assert "is a model folder and OUT" in err
    assert "python convert_hf_to_gguf.py" in err
    assert not (tmp_path / "m.gguf").exists()
    pytest.importorskip("cbor2")
    assert main(["quantize", str(src), str(tmp_path / "m.bpk"), "--scheme", "q8s"]) == 1
    err = _one_error(capsys.readouterr().err)
    assert "names a Burnpack file: name a new folder" in err
    assert not (tmp_path / "m.bpk").exists()
    assert main([*_advised(err, "quantize the weights:"), "--quiet"]) == 0
    assert (tmp_path / "m.bpk").read_bytes()[:4] == b"NRUB"


# ---------------------------------------------------------------------------------------------
# 7. --no-fused-shards
# ---------------------------------------------------------------------------------------------


def test_no_fused_shards_keeps_each_global_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = "model.layers.0.self_attn.{}_proj.weight"
    tensors = {proj.format(n): _w(64, 64, k, s) for k, (n, s) in enumerate((("q", 1.0), ("k", 3.0), ("v", 0.2)))}
    src = _folder(tmp_path / "m", tensors)

    def globals_of(folder: Path) -> list[float]:
        with SafetensorsFile(folder / "model.safetensors") as st:
            return [float(st.array(proj.format(n) + "_global_scale")[0]) for n in "qkv"]

    assert main(["quantize", str(src), str(tmp_path / "fused"), "--scheme", "nvfp4", "--quiet"]) == 0
    assert main(["quantize", str(src), str(tmp_path / "own"), "--scheme", "nvfp4", "--quiet", "--no-fused-shards"]) == 0
    capsys.readouterr()
    assert len(set(globals_of(tmp_path / "fused"))) == 1  # one level shared by the fused q/k/v
    assert len(set(globals_of(tmp_path / "own"))) == 3
    argv = ["quantize", str(src / "model.safetensors"), str(tmp_path / "f.safetensors"), "--scheme", "q8s"]
    assert main([*argv, "--no-fused-shards"]) == 1
    assert "--no-fused-shards applies to --format compressed-tensors only" in capsys.readouterr().err
