"""``--calibration`` and ``--importance`` on the command line: quantize, compare and demo."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.cli.common import CommandError, check_calibration

SCHEME = "q4s:block32:f16"
Q = "layers.0.attn.q_proj.weight"  # 256 x 256 in the demo checkpoint


def _sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    return 10 * math.log10(np.sum(x64**2) / np.sum((y.astype(np.float64) - x64) ** 2))


def test_quantize_with_a_calibration(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", SCHEME, "--calibration", "absmean", "--quiet"]) == 0
    assert f"with {SCHEME} (absmean calibration)" in capsys.readouterr().out
    x = aq.load(model, backend="numpy")[Q]
    got = aq.load(out, backend="numpy")[Q]
    want = aq.quantize(x, SCHEME, calibration="absmean")
    np.testing.assert_array_equal(np.asarray(got.scales), np.asarray(want.scales))
    np.testing.assert_array_equal(np.asarray(got.values), np.asarray(want.values))
    # the option took effect: absmean's scales are not MinMax's (max |x| / 7 per block, here)
    blocks = np.abs(x.reshape(256, 8, 32)).max(axis=2)
    minmax = (blocks / 7).astype(np.float16)
    assert not np.array_equal(np.asarray(got.scales).reshape(256, 8), minmax)


def test_quantize_default_is_minmax(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", SCHEME, "--quiet"]) == 0
    assert "calibration)" not in capsys.readouterr().out
    x = aq.load(model, backend="numpy")[Q]
    scales = np.asarray(aq.load(out, backend="numpy")[Q].scales, np.float32).reshape(256, 8)
    amax = np.abs(x.reshape(256, 8, 32)).max(axis=2)
    # MinMax: the block's max |x| over 7, stored rounded up to f16 (never below the exact quotient)
    assert np.all(scales >= amax / 7)
    assert np.all(scales <= (amax / 7) * (1 + 2.0**-10))


def test_unknown_calibration_fails_before_output(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", SCHEME, "--calibration", "bogus", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "arrayquant: error: SchemeError:" in err
    assert "'bogus'" in err
    assert not out.exists()


def test_calibration_the_scheme_refuses(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.safetensors"
    argv = ["quantize", str(model), str(out), "--scheme", "nvfp4", "--calibration", "absmean", "--quiet"]
    assert main(argv) == 1
    assert "absmean" in capsys.readouterr().err
    assert not out.exists()


def test_importance_needs_a_search(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    imp = tmp_path / "imp.safetensors"
    save_file({Q: np.ones(256, np.float32)}, str(imp))
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", SCHEME, "--importance", str(imp), "--quiet"]) == 1
    assert "--importance weights a search: give it with --calibration mse or --calibration 4over6" in (
        capsys.readouterr().err
    )
    assert not out.exists()
    with pytest.raises(CommandError, match="--importance weights a search"):
        check_calibration(aq.QuantScheme.parse(SCHEME), None, weighted=True)
    assert check_calibration(aq.QuantScheme.parse(SCHEME), None) == {}  # the plain call: MinMax


def test_importance_missing_file(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.safetensors"
    missing = tmp_path / "nope.safetensors"
    argv = ["quantize", str(model), str(out), "--scheme", SCHEME, "--calibration", "mse", "--importance", str(missing)]
    assert main([*argv, "--quiet"]) == 1
    assert f"arrayquant: error: No such file or directory: {missing}" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("vectors", "message"),
    [
        ({Q: np.ones(256), "lm_head.weight": np.ones(256)}, r"ParamsError: 1 of the 2 importance vectors .*'lm_head"),
        ({Q: np.ones(255)}, r"ShapeError: importance vector 'layers\.0\.attn\.q_proj\.weight' .* has 255 values"),
        ({Q: -np.ones(256)}, r"ParamsError: importance vector .* holds 256 negative values"),
        ({Q: np.full(256, np.nan)}, r"NonFiniteInputError: importance vector .* holds 256 NaN"),
    ],
)
def test_importance_that_does_not_fit(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], vectors: dict[str, np.ndarray], message: str
) -> None:
    imp = tmp_path / "imp.safetensors"
    save_file({k: v.astype(np.float32) for k, v in vectors.items()}, str(imp))
    out = tmp_path / "q.safetensors"
    argv = ["quantize", str(model), str(out), "--scheme", SCHEME, "--calibration", "mse", "--importance", str(imp)]
    assert main([*argv, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("arrayquant: error: ")
    assert re.search(message, err), err
    assert not out.exists()


def test_importance_weights_the_named_tensor(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v = np.linspace(0.0, 4.0, 256, dtype=np.float32) ** 2
    imp = tmp_path / "imp.safetensors"
    save_file({Q: v}, str(imp))
    out = tmp_path / "q.safetensors"
    argv = ["quantize", str(model), str(out), "--scheme", SCHEME, "--calibration", "mse", "--importance", str(imp)]
    assert main([*argv, "--quiet"]) == 0
    assert f"importance: 1 of 13 quantized tensors weighted by {imp}" in capsys.readouterr().out
    x, got = aq.load(model, backend="numpy"), aq.load(out, backend="numpy")
    want = aq.quantize(x[Q], SCHEME, calibration="mse", importance=v)
    np.testing.assert_array_equal(np.asarray(got[Q].scales), np.asarray(want.scales))
    other = "layers.0.attn.k_proj.weight"  # no vector: searched unweighted
    plain = aq.quantize(x[other], SCHEME, calibration="mse")
    np.testing.assert_array_equal(np.asarray(got[other].scales), np.asarray(plain.scales))


def test_calibration_reaches_model_folders_and_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--calibration and --importance work on a model folder and a GGUF file too, and their output stays
    a plain compressed-tensors folder or GGUF file."""
    rng = np.random.default_rng(8)
    x = (rng.standard_t(3, (64, 128)) * 0.02).astype(np.float32)
    folder = tmp_path / "folder"
    folder.mkdir()
    save_file({"layers.0.up_proj.weight": x}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text("{}")
    imp = rng.uniform(0, 2, 128).astype(np.float32)
    save_file({"layers.0.up_proj.weight": imp}, str(tmp_path / "imp.safetensors"))
    args = ["--calibration", "mse", "--importance", str(tmp_path / "imp.safetensors"), "--quiet"]
    assert main(["quantize", str(folder), str(tmp_path / "o"), "--scheme", "mxfp4", *args]) == 0
    got = aq.load(tmp_path / "o", backend="numpy")["layers.0.up_proj.weight"]
    want = aq.quantize(x, "mxfp4", calibration="mse", importance=imp)
    assert np.array_equal(aq.dequantize(got), aq.dequantize(want))
    assert not np.array_equal(aq.dequantize(got), aq.dequantize(aq.quantize(x, "mxfp4")))  # the search changed it
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tensor("blk.0.attn_q.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "o.gguf"
    assert main(["quantize", str(path), str(out), "--scheme", "q8_0", "--calibration", "mse", "--quiet"]) == 0
    capsys.readouterr()
    got = aq.load(out, backend="numpy")["blk.0.attn_q.weight"]
    assert aq.to_bytes(got) == aq.to_bytes(aq.quantize(x, "q8_0", calibration="mse"))
    save_file({"nope.weight": imp}, str(tmp_path / "bad.safetensors"))
    bad = ["--calibration", "mse", "--importance", str(tmp_path / "bad.safetensors")]
    assert main(["quantize", str(path), str(tmp_path / "x.gguf"), "--scheme", "q8_0", *bad]) == 1
    assert "nope.weight" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_compare_shows_each_calibration(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", SCHEME, "--quiet"]) == 0
    capsys.readouterr()
    argv = ["compare", str(model), str(out), "--calibration", "minmax", "--calibration", "absmean"]
    assert main([*argv, "--calibration", "4over6"]) == 0
    text = capsys.readouterr().out
    table = text.split("gain over QUANTIZED's):\n")[1]
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:] if line.startswith("layers.")}
    assert len(rows) == 12
    x, q = aq.load(model, backend="numpy")[Q], aq.load(out, backend="numpy")[Q]
    given = _sqnr(x, np.asarray(aq.dequantize(q)))  # measured here with NumPy
    scheme, before, minmax, _, _, _, fourover6 = rows[Q]
    assert scheme == SCHEME
    assert float(before) == pytest.approx(given, abs=0.01)
    assert minmax == f"{given:.2f}"
    assert rows[Q][3] == "(+0.00)"
    absmean = _sqnr(x, np.asarray(aq.dequantize(aq.quantize(x, SCHEME, calibration="absmean"))))
    assert rows[Q][4] == f"{absmean:.2f}"
    assert fourover6 == "-"  # an integer scheme has no 4-over-6 choice
    assert "minmax: mean gain +0.00 dB over 13 tensors" in text
    assert "4over6: not used where shown '-' (SchemeError:" in text


def test_demo_calibration_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--rows", "64", "--cols", "96", "--repeat", "1", "--backend", "numpy"]
    assert main([*argv, "--scheme", "q8s", "--scheme", "nvfp4", "--calibration", "absmean"]) == 0
    out = capsys.readouterr().out
    table = out.split("relative to minmax's)\n")[1].splitlines()
    q8s = table[2].split()
    assert q8s[0] == "q8s"
    x = aq.cli.demo_data(64, 96).astype(np.float64)
    scale = np.float32(np.abs(x).max() * 2 / 254)  # the q8s scale: range / (2 * 127)
    want = _sqnr(x, np.clip(np.round(x / scale), -127, 127) * scale)
    assert float(q8s[1]) == pytest.approx(want, abs=0.02)
    absmean = _sqnr(x, np.asarray(aq.dequantize(aq.quantize(x.astype(np.float32), "q8s", calibration="absmean"))))
    assert float(q8s[2]) == pytest.approx(absmean, abs=0.01)
    assert float(q8s[3].strip("(,")) == pytest.approx(absmean - want, abs=0.02)
    assert table[3].split()[:3] == ["nvfp4", table[3].split()[1], "-"]  # absmean refused for a two-level scheme
    assert "absmean: '-' where the scheme does not take it, e.g. SchemeError:" in out


def test_demo_without_calibration_hints_at_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "8", "--cols", "32", "--repeat", "1", "--scheme", "q8s"]) == 0
    out = capsys.readouterr().out
    assert "arrayquant demo --calibration mse --calibration 4over6 shows" in out
    assert "by calibration" not in out


def test_demo_unknown_calibration_fails_before_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "8", "--cols", "32", "--scheme", "q8s", "--calibration", "bogus"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "SchemeError:" in captured.err
    assert "'bogus'" in captured.err
