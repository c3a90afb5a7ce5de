"""The checkpoint subcommands: quantize, dequantize, inspect, compare and the demo checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.io._select import Selection
from arrayquant.io.arrayquant.checkpoint import save_stream
from arrayquant.io.arrayquant.requantize import why_not
from arrayquant.io.safetensors.reader import Entry

SCHEME = "q4s:block32:f16"


def _quantized_names(path: Path) -> set[str]:
    return {k for k, v in aq.load(path, backend="numpy").items() if isinstance(v, aq.QuantizedTensor)}


def _metadata(path: Path) -> dict[str, str]:
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return dict(json.loads(f.read(n)).get("__metadata__", {}))


def _default_weights(path: Path) -> set[str]:
    loaded = aq.load(path, backend="numpy")
    return {k for k, v in loaded.items() if v.ndim == 2 and "norm" not in k and not k.endswith("bias")}


def test_demo_writes_a_small_model(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tensors = aq.load(model, backend="numpy")
    assert tensors["layers.0.attn.q_proj.weight"].shape == (256, 256)
    assert all(v.dtype == np.float32 for v in tensors.values())
    assert {v.ndim for v in tensors.values()} == {1, 2}
    assert any("norm" in k for k in tensors)
    assert any(k.endswith("bias") for k in tensors)
    assert main(["demo", "--write-checkpoint", str(model)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert str(model) in out


def test_quantize_end_to_end(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model-q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", SCHEME, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # --quiet: no progress bar
    weights = _default_weights(model)
    assert f"quantized {len(weights)} of 22 tensors" in captured.out
    assert "MiB ->" in captured.out
    assert "SQNR: mean" in captured.out
    assert "worst" in captured.out
    original, loaded = aq.load(model, backend="numpy"), aq.load(out, backend="numpy")
    assert set(loaded) == set(original)
    assert _quantized_names(out) == weights
    for name, x in original.items():
        got = loaded[name]
        if name in weights:
            assert str(got.scheme) == SCHEME
            assert got.shape == x.shape
            y = aq.dequantize(got)
            sqnr = 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((y - x).astype(np.float64) ** 2))
            assert sqnr > 15, name  # 4-bit values with f16 block scales: about 19 dB on this data
            np.testing.assert_array_equal(aq.to_bytes(got), aq.to_bytes(aq.quantize(x, SCHEME)))
        else:
            assert got.dtype == x.dtype, name
            assert got.tobytes() == x.tobytes(), name  # copied bit for bit
    assert out.stat().st_size < model.stat().st_size / 4
    assert _metadata(out)["source"] == "arrayquant demo --write-checkpoint"  # the input's metadata carries over


def test_progress_bar_unless_quiet(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quantize", str(model), str(tmp_path / "q.safetensors"), "--scheme", "q8s"]) == 0
    err = capsys.readouterr().err
    assert "quantize" in err
    assert "100%" in err


NORMS = {"layers.0.input_norm.weight", "layers.0.post_attn_norm.weight", "layers.1.input_norm.weight"}
NORMS |= {"layers.1.post_attn_norm.weight", "norm.weight"}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--include", "*.q_proj.weight"], lambda w: {"layers.0.attn.q_proj.weight", "layers.1.attn.q_proj.weight"}),
        (["--include", "*norm*"], lambda w: NORMS),  # --include replaces the default 2-D rule
        (["--include", "layers.1.*", "--exclude", "*.bias", "--exclude", "*norm*"], lambda w: {
            n for n in w if n.startswith("layers.1.")}),
        (["--exclude", "*mlp*", "--exclude", "embed*"], lambda w: {n for n in w if ".attn." in n}),
        (["--min-size", "131072"], lambda w: {"embed_tokens.weight"} | {n for n in w if ".mlp." in n}),
    ],
    ids=["include", "include-1d", "include-exclude", "exclude", "min-size"],
)  # fmt: skip
def test_include_exclude_min_size(
    model: Path, tmp_path: Path, options: list[str], expected: Callable[[set[str]], set[str]]
) -> None:
    want = expected(_default_weights(model))
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", "q8s:block32:f16", "--quiet", *options]) == 0
    assert _quantized_names(out) == want
    original, loaded = aq.load(model, backend="numpy"), aq.load(out, backend="numpy")
    for name in set(original) - want:
        assert loaded[name].tobytes() == original[name].tobytes()


def test_selection_rules() -> None:
    e = lambda name, dtype="F32", shape=(8, 8): Entry(name, dtype, shape, 0, 0)
    selected = lambda entry, include, exclude, min_size: why_not(entry, Selection(include, exclude, min_size)) is None
    assert selected(e("a.weight"), [], [], 0)
    assert not selected(e("a.bias"), [], [], 0)  # a 2-D bias is still a bias
    assert not selected(e("a.layernorm.weight"), [], [], 0)
    assert not selected(e("a.weight", shape=(8,)), [], [], 0)  # by default only 2-D
    assert not selected(e("a.weight", shape=(2, 4, 8)), [], [], 0)
    assert not selected(e("a.weight", dtype="I32"), ["*"], [], 0)  # never integer tensors
    assert not selected(e("a.weight", shape=()), ["*"], [], 0)  # nor scalars
    assert selected(e("a.weight", dtype="BF16", shape=(8,)), ["a.*"], [], 0)
    assert not selected(e("a.weight"), [], ["a.*"], 0)
    assert not selected(e("a.weight"), [], [], 65)
    assert selected(e("a.weight"), [], [], 64)


def test_bf16_input_and_other_dtypes_copied(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.02, (64, 96)).astype(ml_dtypes.bfloat16)
    tensors = {
        "w": w,
        "b": rng.normal(0, 1, 96).astype(ml_dtypes.bfloat16),
        "ids": np.arange(10, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "fp8": rng.normal(0, 1, (4, 8)).astype(ml_dtypes.float8_e4m3fn),
    }
    src, dst = tmp_path / "bf16.safetensors", tmp_path / "q.safetensors"
    save_stream(src, tensors.items())
    assert main(["quantize", str(src), str(dst), "--scheme", "nvfp4", "--quiet"]) == 0
    capsys.readouterr()
    loaded = aq.load(dst, backend="numpy")
    assert isinstance(loaded["w"], aq.QuantizedTensor)
    assert json.loads(_metadata(dst)["arrayquant.tensor.w"])["dtype"] == "bfloat16"
    np.testing.assert_array_equal(aq.to_bytes(loaded["w"]), aq.to_bytes(aq.quantize(w, "nvfp4")))
    for name in ("b", "ids", "mask", "fp8"):
        assert loaded[name].dtype == tensors[name].dtype
        assert loaded[name].tobytes() == tensors[name].tobytes()
    # dequantize back to the original dtype by default
    back = tmp_path / "dq.safetensors"
    assert main(["dequantize", str(dst), str(back)]) == 0
    assert aq.load(back, backend="numpy")["w"].dtype == w.dtype


def test_other_backend_writes_the_same_file(model: Path, tmp_path: Path) -> None:
    pytest.importorskip("array_api_strict")
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert main(["quantize", str(model), str(a), "--scheme", "nvfp4", "--quiet", "--backend", "numpy"]) == 0
    argv = ["quantize", str(model), str(b), "--scheme", "nvfp4", "--quiet"]
    assert main([*argv, "--backend", "array_api_strict", "--device", "device1"]) == 0
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("backend", ["array_api_strict", "torch", "jax", "dask"])
def test_bf16_on_every_backend(backend: str, tmp_path: Path) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    pytest.importorskip(backend)
    w = np.random.default_rng(2).normal(0, 0.02, (64, 64)).astype(ml_dtypes.bfloat16)
    src, a, b = tmp_path / "bf16.safetensors", tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_stream(src, [("w", w)])
    assert main(["quantize", str(src), str(a), "--scheme", SCHEME, "--quiet", "--backend", "numpy"]) == 0
    assert main(["quantize", str(src), str(b), "--scheme", SCHEME, "--quiet", "--backend", backend]) == 0
    assert a.read_bytes() == b.read_bytes()  # bfloat16 goes through f32 (exact) where a backend lacks it


def test_dequantize(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q, dq = tmp_path / "q.safetensors", tmp_path / "dq.safetensors"
    assert main(["quantize", str(model), str(q), "--scheme", "q8s:block32:f16", "--quiet"]) == 0
    assert main(["dequantize", str(q), str(dq), "--dtype", "float16"]) == 0
    assert "dequantized 13 of 22 tensors to float16" in capsys.readouterr().out
    original, loaded, quantized = (aq.load(p, backend="numpy") for p in (model, dq, q))
    assert set(loaded) == set(original)
    for name, x in original.items():
        y = loaded[name]
        assert not isinstance(y, aq.QuantizedTensor)
        if isinstance(quantized[name], aq.QuantizedTensor):
            assert y.dtype == np.float16
            np.testing.assert_array_equal(y, aq.dequantize(quantized[name], np.float16))
            err = (y.astype(np.float64) - x) ** 2
            assert 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum(err)) > 35  # 8-bit values
        else:
            assert y.dtype == x.dtype
            assert y.tobytes() == x.tobytes()
    assert main(["dequantize", str(q), str(dq)]) == 0
    assert all(v.dtype == np.float32 for v in aq.load(dq, backend="numpy").values())  # the original dtype


def test_inspect(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(q), "--scheme", "nvfp4", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(q)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line.strip() and "." in line}
    original = aq.load(model, backend="numpy")
    assert set(original) <= set(rows)
    q_proj = rows["layers.0.attn.q_proj.weight"]
    assert q_proj[:2] == ["256x256", "nvfp4"]
    assert int(q_proj[2].replace(",", "")) == aq.quantized_nbytes("nvfp4", (256, 256))
    low, high = (float(v) for v in q_proj[3].split(".."))
    assert 0 < low <= high
    assert q_proj[4] == "x"
    assert rows["norm.weight"] == ["256", "float32", "1,024", "-"]
    assert "22 tensors, 13 quantized" in out


def test_compare_and_plot(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    q, png = tmp_path / "q.safetensors", tmp_path / "errors.png"
    assert main(["quantize", str(model), str(q), "--scheme", SCHEME, "--quiet"]) == 0
    summary = capsys.readouterr().out
    assert main(["compare", str(model), str(q), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if "." in line.split(" ")[0]}
    for name in aq.load(model, backend="numpy"):
        assert name in rows
    assert rows["norm.weight"][-1] == "identical"
    q_proj = rows["layers.0.attn.q_proj.weight"]
    assert q_proj[0] == SCHEME
    assert 15 < float(q_proj[1]) < 25
    assert 0 < float(q_proj[2]) < 0.1
    # the same figures as the quantize summary
    assert summary.splitlines()[2].split(" (")[0] in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_without_plot(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(model), str(model)]) == 0
    out = capsys.readouterr().out
    assert out.count("identical") == 22
    assert "no quantized tensor" in out


def test_missing_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.safetensors"
    for argv in (
        ["quantize", str(missing), str(tmp_path / "out.safetensors"), "--scheme", SCHEME],
        ["inspect", str(missing)],
        ["dequantize", str(missing), str(tmp_path / "out.safetensors")],
        ["compare", str(missing), str(missing)],
    ):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("arrayquant: error: No such file or directory")
        assert str(missing) in err
        assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
    nowhere = tmp_path / "no" / "such" / "folder"
    assert main(["demo", "--write-checkpoint", str(nowhere / "m.safetensors")]) == 1
    assert capsys.readouterr().err == f"arrayquant: error: No such file or directory: {nowhere}\n"


def test_bad_scheme_exits_1_before_any_output(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", "q4s:block32:f99"]) == 1
    err = capsys.readouterr()
    assert "SchemeError" in err.err
    assert "f99" in err.err
    assert "Traceback" not in err.err
    assert err.out == ""
    assert not out.exists()


def test_failure_midway_leaves_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "nan.safetensors", tmp_path / "q.safetensors"
    bad = np.ones((8, 32), np.float32)
    bad[3, 5] = np.nan
    save_stream(src, [("a.weight", np.ones((8, 32), np.float32)), ("b.weight", bad)])
    assert main(["quantize", str(src), str(out), "--scheme", "q8s", "--quiet"]) == 1
    assert "NonFiniteInputError" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.safetensors"]  # no output, no temporary files


def test_library_errors_exit_1(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(q), "--scheme", "q8s", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["quantize", str(q), str(tmp_path / "qq.safetensors"), "--scheme", "q8s"]) == 1
    assert "already holds 13 quantized tensors" in capsys.readouterr().err
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint at all")
    assert main(["inspect", str(junk)]) == 1
    err = capsys.readouterr().err
    assert "CorruptDataError" in err
    assert "Traceback" not in err
    with pytest.raises(aq.CorruptDataError):
        main(["--debug", "inspect", str(junk)])
    with pytest.raises(FileNotFoundError):
        main(["--debug", "inspect", str(tmp_path / "missing")])


@pytest.mark.parametrize(
    "argv",
    [
        ["quantize", "a.safetensors", "b.safetensors"],  # no --scheme
        ["quantize", "a.safetensors", "--scheme", "q8s"],  # no OUT
        ["quantize", "a", "b", "--scheme", "q8s", "--min-size", "big"],
        ["quantize", "a", "b", "--scheme", "q8s", "--min-size", "-1"],
        ["dequantize", "a", "b", "--dtype", "int8"],
        ["compare", "a"],
        ["inspect"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_missing_optional_libraries(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert main(["quantize", str(model), str(tmp_path / "q.safetensors"), "--scheme", "q8s"]) == 1
    err = capsys.readouterr().err
    assert "BackendUnavailableError" in err
    assert "tqdm" in err
    assert "pip install 'arrayquant[cli]'" in err
    for name in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["compare", str(model), str(model), "--plot", str(tmp_path / "e.png")]) == 1
    err = capsys.readouterr().err
    assert "matplotlib" in err
    assert "pip install 'arrayquant[cli]'" in err


_WITHOUT_EXTRAS = """
import sys
for name in ("tqdm", "matplotlib", "safetensors", "ml_dtypes"):
    sys.modules[name] = None
from arrayquant.cli import main
assert main(["demo", "--rows", "32", "--cols", "64", "--repeat", "1", "--backend", "numpy"]) == 0
assert main(["demo", "--write-checkpoint", sys.argv[1]]) == 0
assert main(["inspect", sys.argv[1]]) == 0
assert main(["quantize", sys.argv[1], sys.argv[1] + ".q", "--scheme", "q8s"]) == 1
print("ok")
"""


def test_demo_needs_no_extras(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS, str(tmp_path / "m.safetensors")],
        capture_output=True,
        text=True,
        timeout=3600,  # a hang guard only: a slow machine is not a failure
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("ok")
    assert "pip install 'arrayquant[cli]'" in proc.stderr
