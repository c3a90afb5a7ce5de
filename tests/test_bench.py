"""The benchmark script runs end to end on a small input (speed is not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_bench_runs_small(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(BENCH), "--size", "256", "--repeat", "1", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    for name in (*CASES, "quantize", "dequantize", "GB/s median", "MiB extra"):
        assert name in proc.stdout, name
    assert "PASS" in proc.stdout or "MISS" in proc.stdout
    doc = json.loads(out.read_text())
    cases = {(r["case"], r["op"]) for r in doc["results"]}
    assert ("q8s", "quantize") in cases
    assert ("q4s:block32:f16", "dequantize") in cases
    for preset in ("nvfp4", "mxfp4", "mxfp8"):
        for op in ("quantize", "dequantize"):
            assert (preset, op) in cases
            assert (f"numpy+ml_dtypes {preset}", op) in cases
    ratios = {r["case"]: r["vs_numpy"] for r in doc["results"] if r["op"] == "quantize"}
    assert all(ratios[p] is not None and ratios[p] > 0 for p in ("nvfp4", "mxfp4", "mxfp8"))
    assert "nvfp4                    quantize" in proc.stdout.split("targets")[-1]
