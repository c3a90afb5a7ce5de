#!/usr/bin/env bash
# The whole check: install the test extras, lint, type-check, run every test.
# Used by .ci/run; README's second command runs the same install and test suite.
set -uo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e ".[test]" || exit 1
# torch is an optional backend; this machine kind ships its CPU wheel locally, so the suite
# covers it when that install succeeds and skips its cases otherwise.
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" \
  || echo "torch 2.13.0 not installable here: torch backend cases will skip"
# the real compressed-tensors and transformers check the model formats arrayquant writes; they
# depend on torch, so they are installed only once torch is (else pip would fetch a CUDA build)
if python -c "import torch" 2>/dev/null; then
  python -m pip install --quiet --disable-pip-version-check -e ".[hf]" \
    || echo "compressed-tensors/transformers not installable here: their interop cases will skip"
fi
# jax (CPU) runs the suite through XLA, including the jax.jit conformance test
python -m pip install --quiet --disable-pip-version-check "jax==0.10.2" \
  || echo "jax 0.10.2 not installable here: jax backend cases will skip"

ruff check . || exit 1
ruff format --check . || exit 1
mypy || exit 1

# the GGUF byte tests compare with ggml itself: its quantization sources, compiled from the pinned
# llama-cpp-python sdist (about a minute the first time, then cached); here a failed build fails CI
python tests/ggml_oracle.py || exit 1
export ARRAYQUANT_REQUIRE_GGML_ORACLE=1

python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
