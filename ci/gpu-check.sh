#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU and CuPy (the lent device's image has CuPy, numpy,
# pytest, hypothesis and ml_dtypes, but not array-api-compat). Before a run, fetch the missing
# wheel here into .whl/ (ignored by git) and carry it:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl array-api-compat
# Then on the device:  bash ci/gpu-check.sh   (writes its report under $OUT, or gpu-report/)
# It runs the conformance suite on numpy and cupy, then a short benchmark against the device's
# own copy bandwidth, and must finish in under 5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-report}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/aq-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/aq-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true

ARRAYQUANT_TEST_BACKENDS=numpy,cupy timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  -m "not slow" -W error tests/test_conformance.py tests/test_roundup.py tests/test_burn_examples.py \
  tests/test_backends.py --junitxml "$out/junit.xml" 2>&1 | tail -n 30 | tee "$out/pytest.txt"
status=${PIPESTATUS[0]}

timeout 60 python3 - "$out" <<'PY' 2>&1 | tee "$out/bench.txt"
import json, sys
import cupy as cp
import arrayquant as aq

x = cp.random.standard_normal((8192, 8192), dtype=cp.float32) * 0.05
gb = x.nbytes / 1e9


def timed(fn, n=10):
    fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    best = float("inf")
    for _ in range(n):
        start.record(); fn(); stop.record(); stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return best


dst = cp.empty_like(x)
rows = {"copy": gb / timed(lambda: cp.copyto(dst, x))}
for scheme in ("q8s", "q8s:block32:f16", "q4s:block32:f16", "q8s:block16:ue4m3:tensor:f32"):
    qt = aq.quantize(x, scheme)
    assert isinstance(qt.values, cp.ndarray) and qt.device == x.device
    rows[f"{scheme} quantize"] = gb / timed(lambda s=scheme: aq.quantize(x, s))
    rows[f"{scheme} dequantize"] = gb / timed(lambda q=qt: aq.dequantize(q))
for name, rate in rows.items():
    print(f"{name:<40} {rate:8.1f} GB/s  {rate / rows['copy']:.2f} x copy")
json.dump(rows, open(f"{sys.argv[1]}/bench.json", "w"), indent=1)
PY
exit "$status"
