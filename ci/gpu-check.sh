#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU and CuPy (the lent device's image has CuPy, numpy,
# pytest, hypothesis and ml_dtypes, but not array-api-compat). Before a run, fetch the missing
# wheel here into .whl/ (ignored by git) and carry it:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl array-api-compat
# Then on the device:  bash ci/gpu-check.sh   (writes its report under $OUT, or gpu-report/)
# It runs the conformance suite (the search calibrations included) on numpy and cupy, then the fused
# CuPy kernels' tests and the conformance suite again with them on (ARRAYQUANT_FUSED_GPU=1), then a
# short benchmark (fused kernels on) against the device's own copy bandwidth; it must finish in under
# 5 minutes and writes every result to $OUT/report.txt. Nothing here needs numba (not on the image).
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

# the whole run must end within 5 minutes: each step gets at most its cap and what is left
deadline=285
step() {
  local cap=$1 left=$((deadline - SECONDS))
  shift
  [ "$left" -lt 10 ] && left=10
  [ "$cap" -lt "$left" ] && left=$cap
  timeout "$left" "$@"
}
summary() { grep -Eo '[0-9]+ (passed|failed|error|errors|skipped|deselected)' "$1" | paste -sd, -; }
pytest_args=(-q -p no:cacheprovider -o addopts="" -m "not slow" -W error)

# 1. the portable kernels on numpy and cupy (the fused GPU kernels off, their default)
ARRAYQUANT_FUSED_GPU=0 ARRAYQUANT_TEST_BACKENDS=numpy,cupy step 110 python3 -m pytest "${pytest_args[@]}" \
  tests/test_conformance.py tests/test_roundup.py tests/test_burn_examples.py \
  tests/test_backends.py tests/test_dlpack.py tests/test_calibration_search.py --junitxml "$out/junit.xml" 2>&1 \
  | tail -n 30 | tee "$out/pytest.txt"
status=${PIPESTATUS[0]}

# 2. the fused CuPy kernels (arrayquant/fused/cupy_kernels.py) against the portable path, bit for bit,
# and the quantized matrix product (cupy_matmul.py) against the sequential f32 dot product, exactly
# (their CUDA-as-C++ host runs are left to the CPU suite)
ARRAYQUANT_FUSED_GPU=1 step 60 python3 -m pytest "${pytest_args[@]}" -rs -k "not on_host" tests/test_fused_cupy.py \
  tests/test_fused_cupy_matmul.py \
  --junitxml "$out/junit-fused.xml" 2>&1 | tail -n 40 | tee "$out/pytest-fused.txt"
fused_status=${PIPESTATUS[0]}

# 3. the conformance matrix again, with the fused GPU kernels on
ARRAYQUANT_FUSED_GPU=1 ARRAYQUANT_TEST_BACKENDS=numpy,cupy step 60 python3 -m pytest "${pytest_args[@]}" \
  tests/test_conformance.py tests/test_roundup.py --junitxml "$out/junit-conformance-fused.xml" 2>&1 \
  | tail -n 30 | tee "$out/pytest-conformance-fused.txt"
conf_fused_status=${PIPESTATUS[0]}

# 4. the benchmark with the fused GPU kernels on (their rows beside the portable ones): arrayquant's
# cases on the GPU (CUDA-synchronised timings) beside the device's own copy bandwidth and the
# obvious CuPy forms, measured in the same run; CPU peers, calibrations and tracemalloc left out
ARRAYQUANT_FUSED_GPU=1 step 55 python3 -m arrayquant bench --backend cupy --size 8192 --repeat 3 --peers none \
  --no-calibration --no-memory --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
bench_status=${PIPESTATUS[0]}
{
  echo "portable conformance (numpy, cupy), exit $status: $(summary "$out/pytest.txt")"
  echo "fused GPU kernels, tests/test_fused_cupy.py and test_fused_cupy_matmul.py, exit $fused_status: $(summary "$out/pytest-fused.txt")"
  grep -E '^(FAILED|SKIPPED|ERROR)' "$out/pytest-fused.txt" | head -n 20
  echo "conformance with ARRAYQUANT_FUSED_GPU=1, exit $conf_fused_status: $(summary "$out/pytest-conformance-fused.txt")"
  if [ "$fused_status" -eq 0 ] && [ "$conf_fused_status" -eq 0 ] && ! grep -qE 'SKIPPED.*(CUDA device|need CuPy)' "$out/pytest-fused.txt"; then
    echo "fused GPU kernels: bit-exact on this device (cupy_kernels.VERIFIED and cupy_matmul.VERIFIED may be set)"
  else
    echo "fused GPU kernels: NOT proven on this device"
  fi
  echo "bench exit status: $bench_status"
  grep -E '^(cupy.copyto|q[0-9]s|nvfp4|mxfp|fused|e[0-9]m[0-9])' "$out/bench.txt" \
    | awk '{printf "%-28s %-10s %8s GB/s  %5s x copy\n", $1, $2, $3, $5}'
  echo "elapsed: ${SECONDS} s"
} > "$out/report.txt"
cat "$out/report.txt"
for s in "$fused_status" "$conf_fused_status" "$bench_status"; do
  [ "$status" -eq 0 ] && status=$s
done
exit "$status"
