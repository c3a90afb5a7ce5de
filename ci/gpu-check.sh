#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU and CuPy (the lent device's image has CuPy, numpy,
# pytest, hypothesis and ml_dtypes, but not array-api-compat). Before a run, fetch the missing
# wheel here into .whl/ (ignored by git) and carry it:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl array-api-compat
# Then on the device:  bash ci/gpu-check.sh   (writes its report under $OUT, or gpu-report/)
# It runs the conformance suite (the search calibrations included) on numpy and cupy, then a short benchmark against the device's
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
  tests/test_backends.py tests/test_dlpack.py tests/test_calibration_search.py --junitxml "$out/junit.xml" 2>&1 | tail -n 30 | tee "$out/pytest.txt"
status=${PIPESTATUS[0]}

# the benchmark: arrayquant's cases on the GPU (CUDA-synchronised timings) beside the device's own
# copy bandwidth and the obvious CuPy forms, measured in the same run; CPU peers are left out
timeout 90 python3 -m arrayquant bench --backend cupy --size 8192 --repeat 5 --peers none \
  --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
bench_status=${PIPESTATUS[0]}
{
  echo "pytest: $(grep -Eo '[0-9]+ (passed|failed|error|errors|skipped)' "$out/pytest.txt" | paste -sd, -)"
  echo "bench exit status: $bench_status"
  grep -E '^(cupy.copyto|q[0-9]s|nvfp4|mxfp)' "$out/bench.txt" | awk '{printf "%-28s %-10s %8s GB/s  %5s x copy\n", $1, $2, $3, $5}'
} > "$out/report.txt"
cat "$out/report.txt"
[ "$status" -eq 0 ] && status=$bench_status
exit "$status"
