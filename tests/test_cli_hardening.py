"""The command line protects the user's files and fails in one line: issue 9, items 5, 9, 10, 12-16."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
import arrayquant.cli as cli
from arrayquant.cli import common, demo, main
from arrayquant.cli import parser as cli_parser
from arrayquant.io.arrayquant import requantize
from arrayquant.io.arrayquant.checkpoint import save_stream

SCHEME = "q4s:block32:f16"


@pytest.fixture
def quantized(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(path), "--scheme", SCHEME, "--quiet"]) == 0
    capsys.readouterr()
    return path


def _one_error_line(err: str) -> str:
    assert err.count("\n") == 1, err
    assert err.startswith("arrayquant: error: "), err
    assert "Traceback" not in err
    return err


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A plain safetensors file written here byte by byte (the names exactly as given)."""
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        kind = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[a.dtype]
        header[name] = {"dtype": kind, "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    head = json.dumps(header).encode()  # ensure_ascii: a lone surrogate is written as \ud800
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


# ---------------------------------------------------------------------------------------------
# 5: names that cannot be printed
# ---------------------------------------------------------------------------------------------

ODD_NAMES = ["\ud800", "evil\x1b[31m.weight", "line\nbreak"]


def test_unprintable_names_are_shown_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    tensors = {name: rng.normal(0, 1, (4, 32)).astype(np.float32) for name in ODD_NAMES}
    src, q = tmp_path / "odd.safetensors", tmp_path / "odd-q.safetensors"
    _safetensors(src, tensors)
    assert main(["quantize", str(src), str(q), "--scheme", "q8s", "--include", "*", "--quiet"]) == 0
    capsys.readouterr()
    for argv in (["inspect", str(src)], ["inspect", str(q)], ["compare", str(src), str(q)]):
        assert main(argv) == 0  # no UnicodeEncodeError from a strict UTF-8 stdout
        out = capsys.readouterr().out
        out.encode("utf-8")  # everything printed can be encoded
        assert "\\ud800" in out
        assert "evil\\x1b[31m.weight" in out
        assert "line\\nbreak" in out
        assert "\x1b" not in out


def test_shown_escapes_only_what_cannot_be_printed() -> None:
    assert common.shown("layers.0.weight") == "layers.0.weight"
    assert common.shown("gewicht.ä.日本") == "gewicht.ä.日本"
    assert common.shown("\ud800x") == "\\ud800x"
    assert common.shown("a\tb\x00") == "a\\tb\\x00"


# ---------------------------------------------------------------------------------------------
# 9: one line and exit 1 (130 for Ctrl-C) for every failure
# ---------------------------------------------------------------------------------------------


def test_compare_with_an_infinite_error_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = np.ones((4, 8), np.float32)
    y = x.copy()
    y[1, 2] = np.inf
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_stream(a, [("w", x), ("v", x)])
    save_stream(b, [("w", y), ("v", x)])
    assert main(["compare", str(a), str(b)]) == 1
    captured = capsys.readouterr()
    err = _one_error_line(captured.err)
    assert "not finite" in err
    assert "'w'" in err
    rows = {line.split()[0]: line.split()[1:] for line in captured.out.splitlines()[2:] if line[:2] in ("w ", "v ")}
    assert rows["w"][:3] == ["float32", "-inf", "inf"]  # 10 log10(signal / inf): the table still shows it
    assert rows["v"][-1] == "identical"


@pytest.mark.parametrize("name", ["errors.txt", "errors", "errors.png.json"])
def test_plot_extension_checked_before_any_work(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    missing = tmp_path / "missing.safetensors"  # not even opened: the plot path is checked first
    assert main(["compare", str(missing), str(missing), "--plot", str(tmp_path / name)]) == 1
    err = _one_error_line(capsys.readouterr().err)
    assert f"--plot {tmp_path / name} has " in err
    assert ".png" in err
    assert ".svg" in err
    assert ".pdf" in err
    assert "No such file" not in err
    assert list(tmp_path.iterdir()) == []


def test_plot_to_svg(model: Path, quantized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    svg = tmp_path / "errors.svg"
    assert main(["compare", str(model), str(quantized), "--plot", str(svg)]) == 0
    assert f"wrote {svg}" in capsys.readouterr().out
    assert b"<svg" in svg.read_bytes()[:1000]


def test_ctrl_c_exits_130_in_one_line(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(requantize, "save_stream", interrupted)
    assert main(["quantize", str(model), str(tmp_path / "q.safetensors"), "--scheme", "q8s", "--quiet"]) == 130
    assert capsys.readouterr().err == "arrayquant: interrupted\n"
    with pytest.raises(KeyboardInterrupt):
        main(["quantize", str(model), str(tmp_path / "q.safetensors"), "--scheme", "q8s", "--quiet", "--debug"])


def test_huge_demo_refused_up_front(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "100000", "--cols", "100000"]) == 1
    captured = capsys.readouterr()
    err = _one_error_line(captured.err)
    assert "37.3 GiB" in err  # 1e10 float32 values
    assert "smaller --rows/--cols" in err
    assert captured.out == ""


def test_memory_error_exits_1_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def no_memory(*args: object) -> np.ndarray:
        raise MemoryError("Unable to allocate 3.00 GiB for an array with shape (1, 2) and data type float32")

    monkeypatch.setattr(demo, "demo_data", no_memory)
    assert main(["demo", "--rows", "8", "--cols", "32", "--scheme", "q8s"]) == 1
    err = _one_error_line(capsys.readouterr().err)
    assert err.startswith("arrayquant: error: out of memory (Unable to allocate 3.00 GiB")


@pytest.mark.parametrize("option", ["--rows", "--cols", "--repeat"])
def test_demo_sizes_must_be_positive(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", option, "0"])
    assert info.value.code == 2
    assert "expected a whole number >= 1, got 0" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 10: OUT must not be IN
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["same", "symlink", "hardlink", "dotted"])
@pytest.mark.parametrize("command", ["quantize", "dequantize"])
def test_out_that_is_in_is_refused(
    link: str, command: str, model: Path, quantized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = model if command == "quantize" else quantized
    before = src.read_bytes()
    if link == "same":
        out = src
    elif link == "symlink":
        out = tmp_path / "link.safetensors"
        out.symlink_to(src)
    elif link == "hardlink":
        out = tmp_path / "hard.safetensors"
        os.link(src, out)
    else:
        out = tmp_path / "." / src.name
    extra = ["--scheme", "q8s", "--quiet"] if command == "quantize" else []
    assert main([command, str(src), str(out), *extra]) == 1
    err = _one_error_line(capsys.readouterr().err)
    assert f"OUT {out} is the same file as IN {src}" in err
    assert src.read_bytes() == before
    assert _hidden(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 12: SIGTERM, SIGHUP (and SIGINT) remove the hidden temporary files; OUT a folder
# ---------------------------------------------------------------------------------------------

_SLOW = """
import os, sys, time
import arrayquant.io.arrayquant.requantize as commands
from arrayquant.cli import main

stage = sys.argv[1]
if stage == "spool":  # the second tensor waits: the spool holds the first
    dequantize, calls = commands.dequantize, []

    def slow(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            print("ready", flush=True)
            time.sleep(60)
        return dequantize(*args, **kwargs)

    commands.dequantize = slow
else:  # the output's temporary file is written and about to be synced, the spool is full
    fsync = os.fsync

    def slow_fsync(fd):
        print("ready", flush=True)
        time.sleep(60)
        return fsync(fd)

    os.fsync = slow_fsync
sys.exit(main(["dequantize", sys.argv[2], sys.argv[3]]))
"""

_SIGNALS = [s for s in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, s)]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("stage", ["spool", "tmp"])
@pytest.mark.parametrize("signame", _SIGNALS)
def test_signals_remove_temporary_files(stage: str, signame: str, quantized: Path, tmp_path: Path) -> None:
    work = tmp_path / "out"
    work.mkdir()
    out = work / "dq.safetensors"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW, stage, str(quantized), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.stderr else ""
        hidden = _hidden(work)
        assert any(n.endswith(".spool") for n in hidden), hidden  # the test stops it mid-write
        if stage == "tmp":
            assert any(n.endswith(".tmp") for n in hidden), hidden
        signum = getattr(signal, signame)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=600)  # a hang guard only
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if signame == "SIGINT":
        assert proc.returncode == 130
        assert err == "arrayquant: interrupted\n"
    else:
        assert proc.returncode == 128 + signum
        assert err == f"arrayquant: stopped by {signame}\n"
    assert list(work.iterdir()) == []  # no output, no .spool, no .tmp


def test_signal_handlers_are_restored(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {s: signal.getsignal(getattr(signal, s)) for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)}
    assert main(["inspect", str(model)]) == 0
    assert {s: signal.getsignal(getattr(signal, s)) for s in before} == before


@pytest.mark.parametrize("command", ["quantize", "dequantize", "demo"])
def test_out_that_is_a_folder_is_named(
    command: str, quantized: Path, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    argv = {
        "quantize": ["quantize", str(model), str(folder), "--scheme", "q8s", "--quiet"],
        "dequantize": ["dequantize", str(quantized), str(folder)],
        "demo": ["demo", "--write-checkpoint", str(folder)],
    }[command]
    assert main(argv) == 1
    assert capsys.readouterr().err == f"arrayquant: error: Is a directory: {folder}\n"
    assert list(folder.iterdir()) == []
    assert _hidden(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 13: NaN in a checkpoint: the tensor named, and --nonfinite
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def dirty(tmp_path: Path) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(3).normal(0, 1, (8, 32)).astype(np.float32)
    x[3, 5], x[6, 1], x[7, 31] = np.nan, np.inf, -np.inf
    path = tmp_path / "nan.safetensors"
    save_stream(path, [("a.weight", np.ones((8, 32), np.float32)), ("b.weight", x)])
    return path, x


def test_nan_names_the_tensor_and_the_cli_fix(
    dirty: tuple[Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = dirty
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(src), str(out), "--scheme", "q8s", "--quiet"]) == 1
    err = _one_error_line(capsys.readouterr().err)
    assert err.startswith(f"arrayquant: error: NonFiniteInputError: tensor 'b.weight' of {src} has 3 non-finite")
    assert "(3, 5)" in err
    assert "--nonfinite zero" in err
    assert "--nonfinite saturate" in err
    assert "check_finite" not in err
    assert "xp.where" not in err
    assert not out.exists()
    assert main(["quantize", str(src), str(out), "--scheme", "q8s", "--quiet", "--nonfinite", "error"]) == 1
    assert "tensor 'b.weight'" in capsys.readouterr().err


def test_nonfinite_zero(dirty: tuple[Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, x = dirty
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(src), str(out), "--scheme", "q8s", "--quiet", "--nonfinite", "zero"]) == 0
    assert "set 3 NaN or infinite values to 0 in 1 tensors (e.g. 'b.weight')" in capsys.readouterr().err
    qt = aq.load(out, backend="numpy")["b.weight"]
    y = aq.dequantize(qt)
    bad = ~np.isfinite(x)
    np.testing.assert_array_equal(y[bad], 0)
    # the scale comes from the finite values only: max |x| / 127
    want = np.float32(np.abs(x[~bad]).max()) / np.float32(127)
    assert float(np.asarray(qt.scales).reshape(-1)[0]) == pytest.approx(float(want), rel=1e-6)


def test_nonfinite_saturate(dirty: tuple[Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, x = dirty
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(src), str(out), "--scheme", "q8s", "--quiet", "--nonfinite", "saturate"]) == 0
    capsys.readouterr()
    y = aq.dequantize(aq.load(out, backend="numpy")["b.weight"])
    top = float(np.abs(x[np.isfinite(x)]).max())
    assert y[3, 5] == 0  # NaN gives code 0
    assert float(y[6, 1]) == pytest.approx(top, rel=1e-6)  # +inf saturates to the top of the range
    assert float(y[7, 31]) == pytest.approx(-top, rel=1e-6)


def test_nonfinite_is_a_choice(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["quantize", "a", "b", "--scheme", "q8s", "--nonfinite", "clip"])
    assert info.value.code == 2
    assert "invalid choice: 'clip'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 14: compare the wrong way round or unrelated files; dequantize of nothing quantized
# ---------------------------------------------------------------------------------------------


def test_compare_swapped_exits_1(model: Path, quantized: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(quantized), str(model)]) == 1
    captured = capsys.readouterr()
    err = _one_error_line(captured.err)
    assert f"ORIGINAL {quantized} holds 13 quantized tensors" in err
    assert f"and QUANTIZED {model} holds none: the arguments look swapped" in err
    assert captured.out == ""


def test_compare_two_quantized_files_exits_1(quantized: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(quantized), str(quantized)]) == 1
    err = _one_error_line(capsys.readouterr().err)
    assert "holds 13 quantized tensors" in err
    assert "swapped" not in err
    assert "give the float checkpoint first" in err


def test_compare_unrelated_files_exits_1(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.safetensors"
    save_stream(other, [("encoder.w", np.ones((4, 32), np.float32))])
    assert main(["compare", str(model), str(other)]) == 1
    captured = capsys.readouterr()
    err = _one_error_line(captured.err)
    assert "have no tensor name in common" in err
    assert "(22 tensors, e.g. 'embed_tokens.weight')" in err
    assert "(1 tensors, e.g. 'encoder.w')" in err
    assert captured.out == ""


def test_compare_nothing_comparable_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_stream(a, [("w", np.ones((4, 32), np.float32))])
    save_stream(b, [("w", np.ones((8, 32), np.float32))])
    assert main(["compare", str(a), str(b)]) == 1
    captured = capsys.readouterr()
    assert "nothing could be compared" in _one_error_line(captured.err)
    assert "differs" in captured.out


def test_compare_with_a_dequantized_file_still_works(
    model: Path, quantized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dq = tmp_path / "dq.safetensors"
    assert main(["dequantize", str(quantized), str(dq)]) == 0
    capsys.readouterr()
    assert main(["compare", str(model), str(dq)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"note: QUANTIZED {dq} holds no quantized tensor; its floats were compared\n")
    original, back = aq.load(model, backend="numpy"), aq.load(dq, backend="numpy")
    x, y = (t["layers.0.attn.q_proj.weight"].astype(np.float64) for t in (original, back))
    want = 10 * np.log10(np.sum(x**2) / np.sum((y - x) ** 2))
    row = next(line.split() for line in out.splitlines() if line.startswith("layers.0.attn.q_proj.weight "))
    assert row[1:3] == ["float32", f"{want:.2f}"]


def test_dequantize_of_nothing_quantized_warns(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dq.safetensors"
    assert main(["dequantize", str(model), str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"warning: {model} holds no quantized tensor; the output is a copy of the input\n"
    assert "dequantized 0 of 22 tensors" in captured.out


# ---------------------------------------------------------------------------------------------
# 15: CLI spelling in errors, nf4, --debug anywhere, help and defaults, one order
# ---------------------------------------------------------------------------------------------

PYTHON_ADVICE = ("QuantScheme", "with_", "per_block(", "per_tensor(", "table=", "aq.", "check_finite", " enum")


@pytest.mark.parametrize(
    ("text", "cli_spelling"),
    [
        ("nvfp4:block32", "e2m1:block16:ue4m3:tensor:f32:packed_native"),
        ("q8s:packed_native", "fields are a byte each already; use :native in the scheme text"),
        ("u4:block32", "add ':zero_point' (x = s * (q - z)) or ':offset' (x = d * q + m), or use the signed value q4f"),
        ("q4f:block32:f16:offset", "needs an unsigned value such as u4, not Q4F"),
        ("e4m3:ocp", "e4m3:block32:ue8m0:native:ocp"),
        ("q8s:block32:f32:tensor:f32", "block<N>:ue4m3 or block<N>:f16, or drop tensor:f32"),
        ("q8s:block32:f16:tensor:f16", "use tensor:f32"),
        ("e4m3:lookup", "e.g. q4f:block64:f32:lookup:nf4"),
        ("q8s:lookup", "use --scheme nf4, or end the scheme text with :nf4"),
        ("zz", "use one of 'q8f'"),
    ],
)
def test_errors_give_the_cli_spelling(
    text: str, cli_spelling: str, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q.safetensors"
    for argv in (["quantize", str(model), str(out), "--scheme", text], ["demo", "--scheme", text]):
        assert main(argv) == 1
        captured = capsys.readouterr()
        err = _one_error_line(captured.err)  # one line: no progress bar started before the check
        assert cli_spelling in err
        for advice in PYTHON_ADVICE:
            assert advice not in err, advice
        assert captured.out == ""
    assert not out.exists()


def test_cli_message_rewrites_python_advice() -> None:
    assert cli.cli_message("x; pass check_finite=False to saturate") == "x; rerun with --nonfinite saturate to saturate"
    assert (
        cli.cli_message("p; build on QuantScheme.mxfp4()")
        == "p; spell it out instead: e2m1:block32:ue8m0:packed_native"
    )
    assert cli.cli_message("drop the table or use scheme.with_mode('lookup')") == (
        "drop the table or use :lookup in the scheme text"
    )
    assert cli.cli_message("nothing to rewrite") == "nothing to rewrite"


def test_nf4_from_the_cli(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q, dq = tmp_path / "q.safetensors", tmp_path / "dq.safetensors"
    assert main(["quantize", str(model), str(q), "--scheme", "nf4", "--quiet"]) == 0
    assert "tensors with nf4" in capsys.readouterr().out
    assert main(["dequantize", str(q), str(dq)]) == 0
    x = aq.load(model, backend="numpy")["layers.0.attn.q_proj.weight"]
    y = aq.load(dq, backend="numpy")["layers.0.attn.q_proj.weight"]
    # NF4 as bitsandbytes: per 64 values, absmax times one of the 16 NF4 levels (the nearest)
    nf4 = np.asarray(aq.NF4, np.float64)
    blocks = x.reshape(-1, 64).astype(np.float64)
    absmax = np.abs(blocks).max(axis=1, keepdims=True)
    nearest = nf4[np.abs(blocks[..., None] / absmax[..., None] - nf4).argmin(axis=-1)]
    np.testing.assert_allclose(y.reshape(-1, 64), nearest * absmax, rtol=1e-6, atol=1e-9)
    assert main(["demo", "--rows", "16", "--cols", "128", "--repeat", "1", "--scheme", "nf4"]) == 0
    assert any(line.startswith("nf4 ") for line in capsys.readouterr().out.splitlines())


def test_scheme_checked_before_the_progress_bar(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(model), str(out), "--scheme", "q4f:block32:lookup"]) == 1  # no table: refused
    err = _one_error_line(capsys.readouterr().err)
    assert "ParamsError" in err
    assert "%" not in err  # tqdm never started
    assert not out.exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_before_or_after_the_subcommand(where: str, model: Path) -> None:
    argv = ["inspect", str(model.with_suffix(".nope"))]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    with pytest.raises(FileNotFoundError):
        main(argv)
    with pytest.raises(aq.SchemeError):
        main(["demo", "--scheme", "nvfp4:x", "--debug"] if where == "after" else ["--debug", "demo", "--scheme", "x"])


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_argument_has_help_and_shows_its_default() -> None:
    parser = cli_parser.build_parser()
    subs = _subparsers(parser)
    assert set(subs) == {"demo", "backends", "bench", "quantize", "dequantize", "inspect", "compare"}
    for name, sub in [("arrayquant", parser), *subs.items()]:
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, (name, action.dest)
        text = sub.format_help()
        for action in sub._actions:
            if action.option_strings and not cli_parser.quiet_default(action):
                assert f"(default: {action.default})" in " ".join(text.split()), (name, action.dest)
    demo = " ".join(subs["demo"].format_help().split())
    assert "rows of the f32 demo data (default: 1024)" in demo
    assert "(default: None)" not in demo
    quantize = " ".join(subs["quantize"].format_help().split())
    assert "(default: error)" in quantize
    assert "only tensors of N elements or more (default: 0)" in quantize
    assert "(default: ('gguf'" not in " ".join(subs["bench"].format_help().split())  # its help says it


def test_inspect_and_compare_list_tensors_in_one_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(4)
    tensors = {  # widest dtype first in the file: f32 before bf16, and i8 codes last once quantized
        "layers.10.w": rng.normal(0, 1, (4, 32)).astype(np.float32),
        "layers.2.w": rng.normal(0, 1, (4, 32)).astype(ml_dtypes.bfloat16),
        "layers.2.b": rng.normal(0, 1, 32).astype(np.float32),
        "embed": rng.normal(0, 1, (4, 32)).astype(np.float32),
    }
    src, q = tmp_path / "m.safetensors", tmp_path / "q.safetensors"
    save_stream(src, tensors.items())
    assert main(["quantize", str(src), str(q), "--scheme", "q8s:native", "--quiet", "--include", "*.w"]) == 0
    capsys.readouterr()
    want = ["embed", "layers.2.b", "layers.2.w", "layers.10.w"]  # natural order
    for argv in (["inspect", str(src)], ["inspect", str(q)], ["compare", str(src), str(q)]):
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split()[0] for line in lines[2 : 2 + len(want)]] == want, argv


# ---------------------------------------------------------------------------------------------
# 16: the demo explains its data and names its device
# ---------------------------------------------------------------------------------------------


def test_demo_explains_outliers_and_names_the_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "64", "--cols", "96", "--repeat", "1", "--backend", "numpy", "--scheme", "q8s"]) == 0
    out = capsys.readouterr().out
    assert "outliers" in out
    assert "one value in about 2000 scaled 25x" in out
    assert "per-tensor scale (q8s)" in out
    assert "backend numpy, device cpu\n" in out
    assert "device default" not in out
    # what the note claims, on the demo's default data: 8 bits per tensor below 4 bits per block of 32
    assert main(["demo", "--repeat", "1", "--backend", "numpy", "--scheme", "q8s", "--scheme", "q4s:block32:f16"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    sqnr = {r[0]: float(r[2]) for r in rows if r[:1] in (["q8s"], ["q4s:block32:f16"])}
    assert sqnr["q8s"] < sqnr["q4s:block32:f16"]


def test_demo_device_of_another_backend(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("array_api_strict")
    argv = ["demo", "--rows", "8", "--cols", "32", "--repeat", "1", "--scheme", "q8s", "--backend", "array_api_strict"]
    assert main([*argv, "--device", "device1"]) == 0
    assert "backend array_api_strict, device device1\n" in capsys.readouterr().out
    assert main(argv) == 0
    assert "backend array_api_strict, device cpu\n" in capsys.readouterr().out  # as `backends` lists it


def test_demo_sqnr_matches_numpy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "64", "--cols", "96", "--repeat", "1", "--backend", "numpy", "--scheme", "q8s"]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("q8s "))
    x = cli.demo_data(64, 96).astype(np.float64)
    scale = np.float32(np.abs(x).max() * 2 / 254)  # the q8s scale: range / (2 * 127)
    y = np.clip(np.round(x / scale), -127, 127) * scale
    want = 10 * math.log10(np.sum(x**2) / np.sum((y - x) ** 2))
    assert float(row[2]) == pytest.approx(want, abs=0.02)


def test_console_script_help_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "arrayquant.cli", "quantize", "--help"],
        capture_output=True,
        text=True,
        timeout=3600,  # a hang guard only: a slow machine is not a failure
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--nonfinite {error,zero,saturate}" in proc.stdout
    assert textwrap.dedent(proc.stdout).count("--debug") == 2  # usage line and its help
