"""The ``arrayquant`` command: demo table, backends listing, exit codes."""

from __future__ import annotations

import math
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
        timeout=3600,  # a hang guard only: a slow machine is not a failure
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "q4s:block16:ue4m3:tensor:f32" in proc.stdout


# ---------------------------------------------------------------------------------------------
# arrayquant.metrics: the error report the CLI's tables use (one implementation)
# ---------------------------------------------------------------------------------------------


def _plain_sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(10 * np.log10(np.sum(x**2) / np.sum((y - x) ** 2)))


@pytest.mark.parametrize("shape", [(7,), (64, 96), (3, 300, 401)])  # the last spans several slabs
def test_metrics_match_numpy(shape: tuple[int, ...]) -> None:
    from arrayquant.metrics import error_report, sqnr

    rng = np.random.default_rng(5)
    x = rng.normal(0, 0.02, shape).astype(np.float32)
    y = (x + rng.normal(0, 1e-3, shape)).astype(np.float32)
    err = y.astype(np.float64) - x.astype(np.float64)
    r = error_report(x, y)
    assert r.count == x.size
    assert r.sqnr == pytest.approx(_plain_sqnr(x, y), rel=1e-12)
    assert sqnr(x, y) == r.sqnr
    assert r.max_abs_error == float(np.abs(err).max())
    assert r.rmse == pytest.approx(float(np.sqrt(np.mean(err**2))), rel=1e-12)


@pytest.mark.parametrize(
    ("x", "y", "want"),
    [
        ([1.0, 2.0], [1.0, 2.0], math.inf),  # equal
        ([0.0, 0.0], [0.0, 0.0], math.inf),  # equal zeros
        ([], [], math.inf),  # nothing differs
        ([0.0, 0.0], [0.0, 1.0], -math.inf),  # no signal, some noise
        ([1.0, 2.0], [1.0, np.inf], -math.inf),  # infinite error: not "math domain error"
        ([np.inf, 2.0], [np.inf, 2.5], math.nan),  # inf - inf is NaN
        ([1.0, np.nan], [1.0, 2.0], math.nan),
        ([3.0, 4.0], [3.0, 4.5], 20.0),  # 10 log10(25 / 0.25)
    ],
)
def test_sqnr_conventions(x: list[float], y: list[float], want: float) -> None:
    from arrayquant.metrics import sqnr

    got = sqnr(np.array(x), np.array(y))
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(want, rel=1e-12)


def test_error_report_of_nothing_and_of_infinity() -> None:
    from arrayquant.metrics import error_report

    r = error_report(np.zeros((0, 4)), np.zeros((0, 4)))
    assert (r.count, r.max_abs_error, r.rmse, r.sqnr) == (0, 0.0, 0.0, math.inf)
    r = error_report(np.array([1.0, 2.0]), np.array([1.0, np.inf]))
    assert (r.max_abs_error, r.rmse, r.sqnr) == (math.inf, math.inf, -math.inf)


def test_sqnr_neither_overflows_nor_underflows() -> None:
    from arrayquant.metrics import error_report

    rng = np.random.default_rng(6)
    a = rng.normal(0, 1, 1000)
    b = a + rng.normal(0, 1e-3, 1000)
    want = _plain_sqnr(a, b)
    for k in (1e200, 1e-200):
        with np.errstate(all="ignore"):  # the squares overflow (1e200) or vanish (1e-200)
            plain = _plain_sqnr(a * k, b * k)
        assert math.isnan(plain)  # the plain formula breaks down here
        r = error_report(a * k, b * k)
        assert r.sqnr == pytest.approx(want, rel=1e-9)
        assert r.rmse == pytest.approx(k * float(np.sqrt(np.mean((b - a) ** 2))), rel=1e-9)


def test_error_meter_adds_up_pieces() -> None:
    from arrayquant.metrics import ErrorMeter, error_report

    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, (40, 50))
    y = x + rng.normal(0, 0.01, (40, 50))
    y[3] *= 1e6  # pieces of very different scale
    whole = error_report(x, y)
    a, b = ErrorMeter(), ErrorMeter()
    a.add(x[:10], y[:10])
    b.add(x[10:30], y[10:30])
    b.add(x[30:], y[30:])
    a.merge(b)
    r = a.report()
    assert r.count == whole.count == 2000
    assert r.max_abs_error == whole.max_abs_error
    assert r.sqnr == pytest.approx(_plain_sqnr(x, y), rel=1e-12)
    assert r.rmse == pytest.approx(whole.rmse, rel=1e-12)


def test_metrics_take_a_quantized_tensor_and_other_backends() -> None:
    import arrayquant as aq
    from arrayquant.metrics import sqnr

    x = demo_data(32, 64)
    qt = aq.quantize(x, "q4s:block32:f16")
    y = aq.dequantize(qt)
    assert sqnr(x, qt) == pytest.approx(_plain_sqnr(x, y), rel=1e-12)
    for backend in ("array_api_strict", "torch"):
        if backend not in {b.name for b in aq.backends.available() if b.usable}:
            continue
        xb, yb = aq.asarray(x, backend=backend), aq.asarray(y, backend=backend)
        assert sqnr(xb, yb) == pytest.approx(_plain_sqnr(x, y), rel=1e-12)
        assert sqnr(xb, aq.quantize(xb, "q4s:block32:f16")) == pytest.approx(_plain_sqnr(x, y), rel=1e-12)


def test_metrics_errors() -> None:
    import arrayquant as aq
    from arrayquant.metrics import error_report

    with pytest.raises(aq.ShapeError, match=r"x has shape \(2,\) but y has shape \(3,\)"):
        error_report(np.zeros(2), np.zeros(3))
    with pytest.raises(aq.DTypeError, match="y must hold real numbers, got dtype complex128"):
        error_report(np.zeros(2), np.zeros(2, complex))
    with pytest.raises(aq.DTypeError, match="x must hold real numbers, got dtype <U1"):
        error_report(np.array(["a", "b"]), np.zeros(2))


def test_cli_error_stats_use_the_meter() -> None:
    from arrayquant.cli.stats import ErrorStats

    x = np.array([[1.0, 2.0]], np.float32)
    stats = ErrorStats(hist=np.zeros(140, np.int64))
    stats.add(x, np.array([[1.0, np.inf]], np.float32))  # was: ValueError: math domain error
    assert stats.sqnr == -math.inf
    assert stats.max_err == math.inf
    assert int(stats.hist.sum()) + stats.tiny == 2
