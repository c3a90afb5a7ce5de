"""The performance suite runs end to end on a small input, as ``ci/bench.py`` and ``arrayquant bench``.

Speed is not judged here (the targets are informational); the table, the JSON, the ratios, the
checks against references and the reporting of unavailable peers are.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arrayquant import bench
from arrayquant.bench import cases, harness, jobs, reporting
from arrayquant.bench.cli import peer_list
from arrayquant.cli import main as cli_main

BENCH = Path(__file__).resolve().parents[1] / "ci" / "bench.py"
CASES = (
    "numpy.copyto",
    "numpy per-tensor",
    "numpy block32 f16",
    "q8s:native",
    "q8s:block32:f16:native",
    "q8s:block32:f16",
    "q4s:block32:f16",
    "numpy+ml_dtypes nvfp4",
    "numpy+ml_dtypes mxfp4",
    "numpy+ml_dtypes mxfp8",
    "nvfp4",
    "mxfp4",
    "mxfp8",
)
PEER_ROWS = {
    "gguf": ("gguf Q8_0", "gguf Q4_0", "gguf MXFP4"),
    "torch": ("torch int8 per-tensor", "torch int8 block32", "torch fp4 block32", "torch fp8 block32"),
    "bitsandbytes": ("bitsandbytes blockwise8 b32", "bitsandbytes fp4 b32", "bitsandbytes nf4 b32"),
    "jax.jit": tuple(f"jax.jit {s}" for s in jobs.ALL_CASES),
}


# Only a guard against a hang, far beyond any machine's time: the run's duration is never judged. A
# fresh checkout on a busy 2-core machine spent 40 s compiling Numba kernels before its first timing.
HANG_GUARD_S = 3600


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd} was still running after {HANG_GUARD_S} s, so it hangs; its stderr: {exc.stderr!r}")
    assert proc.returncode == 0, proc.stderr
    return proc


def test_ci_script_runs_small_without_peers(tmp_path: Path) -> None:
    pytest.importorskip("ml_dtypes")
    out = tmp_path / "bench.json"
    proc = _run([sys.executable, str(BENCH), "--size", "256", "--repeat", "1", "--peers", "none", "--json", str(out)])
    for name in (*CASES, "quantize", "dequantize", "GB/s median", "MiB extra", "x copy", "x peer", "one core"):
        assert name in proc.stdout, name
    doc = json.loads(out.read_text())
    for key in ("cpu", "cpu_count", "python", "numpy", "loadavg", "loadavg_end", "threads"):
        assert key in doc["machine"], key
    if hasattr(os, "sched_setaffinity"):
        assert "pinned to CPU" in doc["machine"]["threads"]
    assert doc["size"] == 256
    assert doc["repeat"] == 1
    rows = {(r["case"], r["op"]): r for r in doc["results"]}
    for case in jobs.ALL_CASES:
        for op in ("quantize", "dequantize"):
            r = rows[(case, op)]
            assert len(r["times_s"]) == 1
            assert r["gbps_median"] > 0
            assert r["vs_copy"] > 0
            assert r["vs_numpy"] is not None
            assert r["vs_numpy"] > 0
            assert r["extra_mib"] is not None
    # int8 codes and scales equal the obvious NumPy form's; MXFP8 codes equal ml_dtypes' cast
    for case in (*jobs.INT8_TENSOR_SCHEMES, *jobs.INT8_BLOCK_SCHEMES, "mxfp8"):
        assert rows[(case, "quantize")]["check"] == "exact", case
    assert all(r["kind"] not in ("peer", "jit") for r in doc["results"])
    judged = {(t["case"], t["op"], t["metric"]) for t in doc["targets"]}
    assert ("q8s:block32:f16", "quantize", "GB/s median") in judged
    assert ("nvfp4", "quantize", "GB/s median") in judged
    assert ("mxfp4", "dequantize", "GB/s median") in judged
    assert {t["verdict"] for t in doc["targets"]} <= {"PASS", "MISS"}
    # search calibrations beside MinMax: time ratio, and (fused kernels on) the portable kernels' bits
    for scheme, cal in cases.CALIBRATION_CASES:
        r = rows[(f"{scheme} {cal}", "quantize")]
        assert r["kind"] == "calibration"
        assert r["vs_minmax"] == pytest.approx(rows[(scheme, "quantize")]["gbps_median"] / r["gbps_median"])
        if cal == "mse":
            assert (f"{scheme} mse", "quantize", "x MinMax time") in judged
            if importlib.util.find_spec("numba") is not None:
                assert r["check"] == "exact", scheme
    assert "-- search calibrations" in proc.stdout
    # the quantized products from memory, beside NumPy f32 in the same run; fused f32 rows within
    # f32 rounding of the float64 product, the int8-activation rows within their activations' rounding
    gemv = {r["case"]: r for r in doc["results"] if r["kind"] == "gemv"}
    for batch in (1, 16):
        assert f"numpy f32 x @ W.T  b{batch}" in gemv
        for case in ("q4s:block32 fused", "nvfp4 fused", "mxfp8 fused", "q4s:block32 (w @ x.T).T"):
            r = gemv[f"{case} b{batch}"]
            assert float(r["check"]) < 1e-5, case
            assert r["vs_numpy"] > 0
        assert float(gemv[f"q4s:block32 fused_int8 b{batch}"]["check"]) < 0.05
    assert "-- quantized x @ W.T, the weight read from memory" in proc.stdout
    tail = proc.stdout.split("targets (informational")[-1]
    assert "q8s:block32:f16:native   quantize" in tail
    assert "only indicative" in tail  # 256 x 256 is not the size the targets are stated for


def test_arrayquant_bench_times_the_installed_peers(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    peers = ",".join(PEER_ROWS)
    cmd = [sys.executable, "-m", "arrayquant", "bench", "--size", "128", "--repeat", "1", "--no-memory", "--no-matmul"]
    proc = _run([*cmd, "--peers", peers, "--json", str(out)])
    doc = json.loads(out.read_text())
    rows = {(r["case"], r["op"]): r for r in doc["results"]}
    unavailable = doc["unavailable"]
    for peer, names in PEER_ROWS.items():
        if peer in unavailable:  # not installed here: said so, with the reason
            assert unavailable[peer]
            assert peer in proc.stdout.split("-- unavailable")[-1]
            continue
        for name in names:
            assert (name, "quantize") in rows or name in unavailable, name
    assert "gguf NVFP4" in unavailable or ("gguf NVFP4", "quantize") in rows or "gguf" in unavailable
    if "jax.jit" not in unavailable:  # arrayquant under XLA gives the same bits as on NumPy
        for case in jobs.ALL_CASES:
            assert rows[(f"jax.jit {case}", "quantize")]["check"] == "exact", case
        assert "what XLA fusion gives" in proc.stdout
    if "torch" not in unavailable:
        r = rows[("q8s:block32:f16", "quantize")]
        assert r["best_peer"] in bench.PEER_MAP["q8s:block32:f16"]
        assert r["vs_peer"] > 0
    assert all(r["extra_mib"] is None for r in doc["results"])


def _result(case: str, op: str, kind: str, gbps: float) -> bench.Result:
    return bench.Result(case, op, kind, [1.0], gbps, gbps)


def test_ratios_use_the_fastest_peer_for_the_same_job() -> None:
    rows = [
        _result("numpy.copyto", "copy", "copy", 10.0),
        _result("numpy block32 f16", "quantize", "numpy", 0.5),
        _result("q8s:block32:f16", "quantize", "arrayquant", 2.0),
        _result("gguf Q8_0", "quantize", "peer", 0.4),
        _result("torch int8 block32", "quantize", "peer", 4.0),
        _result("torch fp4 block32", "quantize", "peer", 8.0),  # another job: not compared
    ]
    cases.ratios(rows)
    aq = rows[2]
    assert aq.vs_copy == pytest.approx(0.2)
    assert aq.vs_numpy == pytest.approx(4.0)
    assert aq.best_peer == "torch int8 block32"
    assert aq.vs_peer == pytest.approx(0.5)
    assert rows[3].vs_peer is None


def test_targets_pass_and_miss() -> None:
    rows = [
        _result("q8s:block32:f16", "quantize", "arrayquant", 1.49),
        _result("q8s:block32:f16", "dequantize", "arrayquant", 3.0),
        _result("nvfp4", "quantize", "arrayquant", 0.61),
        _result("mxfp4", "dequantize", "arrayquant", 1.9),
        _result("gguf Q8_0", "quantize", "peer", 9.0),
    ]
    got = {(t["case"], t["op"]): t["verdict"] for t in bench.targets(rows)}
    assert got == {
        ("q8s:block32:f16", "quantize"): "MISS",
        ("q8s:block32:f16", "dequantize"): "PASS",
        ("nvfp4", "quantize"): "PASS",
        ("mxfp4", "dequantize"): "MISS",
    }


def test_calibration_rows_are_judged_on_time_relative_to_minmax() -> None:
    rows = [
        _result("numpy.copyto", "copy", "copy", 10.0),
        _result("nvfp4", "quantize", "arrayquant", 1.5),
        _result("nvfp4 mse", "quantize", "calibration", 0.05),  # 30x MinMax's time: at the goal
        _result("q4s:block32:f16", "quantize", "arrayquant", 1.0),
        _result("q4s:block32:f16 mse", "quantize", "calibration", 0.02),  # 50x
        _result("nvfp4 4over6", "quantize", "calibration", 0.5),  # not an mse row: timed, not judged
    ]
    cases.ratios(rows)
    assert rows[2].vs_minmax == pytest.approx(30.0)
    assert rows[5].vs_minmax == pytest.approx(3.0)
    got = {(t["case"], t["metric"]): t["verdict"] for t in bench.targets(rows) if t["metric"] == "x MinMax time"}
    assert got == {("nvfp4 mse", "x MinMax time"): "PASS", ("q4s:block32:f16 mse", "x MinMax time"): "MISS"}
    lines = bench.report({"backend": "numpy", "device": "cpu", "threads": "one"}, 64, 1, rows, {})
    assert "nvfp4 mse                quantize    30.00 x MinMax time <= 30    PASS" in lines


def test_a_failing_peer_is_reported_not_raised() -> None:
    import numpy as np

    host = np.ones((32, 32), dtype=np.float32)
    b = bench.Bench(host, host, "numpy", 1, harness.no_sync, memory=False)

    def broken() -> None:
        msg = "no kernel for this device"
        raise RuntimeError(msg)

    def silent() -> None:
        raise NotImplementedError

    b.pair(bench.Pair("peer that fails", broken, lambda q: q))
    b.pair(bench.Pair("peer whose dequantize fails", lambda: 1, lambda q: 1 / 0))
    b.pair(bench.Pair("peer without a message", silent))
    assert b.unavailable == {
        "peer that fails": "RuntimeError: no kernel for this device",
        "peer whose dequantize fails dequantize": "ZeroDivisionError: division by zero",
        "peer without a message": "NotImplementedError (raised in silent, test_bench.py)",
    }
    assert [(r.case, r.op) for r in b.results] == [("peer whose dequantize fails", "quantize")]


def test_a_wrong_output_fails_the_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for var in (*harness.THREAD_VARS, "XLA_FLAGS"):
        monkeypatch.setenv(var, "1" if var != "XLA_FLAGS" else harness.XLA_ONE_THREAD)  # restored afterwards
    monkeypatch.setattr(cases, "verify", lambda *args: "differs")
    assert cli_main(["bench", "--size", "64", "--repeat", "1", "--peers", "none", "--no-memory", "--no-matmul"]) == 1
    assert "differ from their reference" in capsys.readouterr().err


def test_checks_compare_with_the_reference() -> None:
    import numpy as np

    import arrayquant as aq

    x = np.random.default_rng(1).standard_normal((64, 64), dtype=np.float32)
    block = bench.np_quantize_block(x)
    tensor = bench.np_quantize_tensor(x)
    qt = aq.quantize(x, "q8s:block32:f16")
    assert cases.verify("q8s:block32:f16", qt, x, tensor, block) == "exact"
    codes = block[0].copy()
    codes[3, 5] += 1
    assert cases.verify("q8s:block32:f16", qt, x, tensor, (codes, block[1])) == "differs"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pinned_pins_and_restores() -> None:
    before = os.sched_getaffinity(0)
    with bench.pinned(1) as cpus:
        assert cpus is not None
        assert len(cpus) == 1
        assert set(cpus) <= before
        assert os.sched_getaffinity(0) == set(cpus)
    assert os.sched_getaffinity(0) == before
    with bench.pinned(len(before)) as cpus:
        assert cpus == sorted(before)
    with bench.pinned(len(before) + 1) as cpus:  # more than the process may use: left alone
        assert cpus is None
        assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("text", ["gguf,nope", "", "all,none"])
def test_unknown_peer_is_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="unknown peer"):
        peer_list(text)
    with pytest.raises(SystemExit) as info:
        cli_main(["bench", "--peers", text])
    assert info.value.code == 2


def test_bad_size_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["bench", "--size", "100"])
    assert info.value.code == 2


def test_performance_page_shows_a_recorded_run() -> None:
    """docs/performance.md carries the tables of the run recorded beside it, as the bench renders them."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    doc = json.loads((docs / "performance.json").read_text())
    assert doc["size"] == reporting.TARGET_SIZE
    assert doc["machine"]["backend"] == "numpy"
    assert bench.markdown(doc) in (docs / "performance.md").read_text()
