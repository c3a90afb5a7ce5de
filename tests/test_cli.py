"""The ``arrayquant`` command: demo table, backends listing, exit codes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from arrayquant.cli import DEMO_SCHEMES, demo_data, main


def test_demo_prints_a_row_per_scheme(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "64", "--cols", "96", "--repeat", "1", "--backend", "numpy"]) == 0
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()[1:]
        for line in out.splitlines()
        if line.split()[:1] in ([s] for s in DEMO_SCHEMES)
    }
    assert set(rows) == set(DEMO_SCHEMES)
    # bits per value from the layout, computed here: q8s packs 4 codes a word, plus one f32 scale
    assert float(rows["q8s"][0]) == pytest.approx(8 * (64 * 96 + 4) / (64 * 96), abs=5e-4)
    # q4s with f16 scales per 32 values: 4 bits + 16/32 bits
    assert float(rows["q4s:block32:f16"][0]) == pytest.approx(4.5, abs=5e-4)
    sqnr = {k: float(v[1]) for k, v in rows.items()}
    assert sqnr["q8s:block32:f16"] > sqnr["q4s:block32:f16"] > sqnr["q2s:block64:f16"]
    assert all(float(v[3]) > 0 and float(v[4]) > 0 for v in rows.values())


def test_demo_data_is_deterministic_and_weight_like() -> None:
    a, b = demo_data(), demo_data()
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32
    assert a.nbytes == 4 * 2**20
    assert abs(float(a.std()) - 0.02) < 0.01
    assert float(np.abs(a).max()) > 10 * 0.02


def test_bad_scheme_exits_1_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scheme", "q8s:block3:f99"]) == 1
    err = capsys.readouterr()
    assert "SchemeError" in err.err
    assert "unknown token 'f99'" in err.err
    assert "Traceback" not in err.err
    assert err.out == ""


def test_debug_shows_the_exception() -> None:
    from arrayquant import SchemeError

    with pytest.raises(SchemeError):
        main(["--debug", "demo", "--scheme", "nvfp4:x"])


def test_usage_error_exits_2() -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", "--rows", "many"])
    assert info.value.code == 2


def test_backends_lists_every_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    for name in ("numpy", "cupy", "torch", "jax", "dask", "array_api_strict"):
        assert any(line.startswith(name + " ") for line in out.splitlines()), name


def test_console_script_runs_the_demo() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "arrayquant.cli", "demo", "--rows", "32", "--cols", "64", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "q4s:block16:ue4m3:tensor:f32" in proc.stdout
