#!/usr/bin/env bash
# The whole check: install the test extras, lint, type-check, run every test.
# Used by .ci/run; README's second command runs the same install and test suite.
set -uo pipefail
cd "$(dirname "$0")/.."

# the optional libraries whose tests must run: conftest.py turns a skip for one of their modules
# missing into a failure, so interop tests cannot vanish with CI green (groups: torch, jax, hf,
# gguf, burn, numba, onnx; ARRAYQUANT_REQUIRE=torch,jax before this script narrows it, empty drops it)
export ARRAYQUANT_REQUIRE=${ARRAYQUANT_REQUIRE-torch,jax,hf,gguf,burn,numba,onnx}
required() { case ",${ARRAYQUANT_REQUIRE// /}," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# an optional install that failed: the end of CI if its group is required, else a note
optional_failed() {
  if required "$1"; then
    echo "$2 not installable here, and ARRAYQUANT_REQUIRE names $1: failing" >&2
    exit 1
  fi
  echo "$2 not installable here: $3"
}

python -m pip install --quiet --disable-pip-version-check -e ".[test]" || exit 1
# torch is an optional backend; this machine kind ships its CPU wheel locally, so the suite
# covers it when that install succeeds (and skips its cases otherwise, unless it is required).
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" \
  || optional_failed torch "torch 2.13.0" "torch backend cases will skip"
# the real compressed-tensors and transformers check the model formats arrayquant writes; they
# depend on torch, so they are installed only once torch is (else pip would fetch a CUDA build)
if python -c "import torch" 2>/dev/null; then
  python -m pip install --quiet --disable-pip-version-check -e ".[hf]" \
    || optional_failed hf "compressed-tensors/transformers" "their interop cases will skip"
elif required hf; then
  echo "compressed-tensors/transformers need torch, and ARRAYQUANT_REQUIRE names hf: failing" >&2
  exit 1
fi
# jax (CPU) runs the suite through XLA, including the jax.jit conformance test
python -m pip install --quiet --disable-pip-version-check "jax==0.10.2" \
  || optional_failed jax "jax 0.10.2" "jax backend cases will skip"

ruff check . || exit 1
ruff format --check . || exit 1
mypy || exit 1

# the GGUF byte tests compare with ggml itself: its quantization sources, compiled from the pinned
# llama-cpp-python sdist (about a minute the first time, then cached); here a failed build fails CI
python tests/ggml_oracle.py || exit 1
# llama-quantize's mixes and a forward pass compare with llama.cpp itself: libllama from the same
# sdist (a portable release build, the library alone: a few minutes, then cached)
python -m tests.llama_oracle || exit 1
export ARRAYQUANT_REQUIRE_GGML_ORACLE=1

# --- API reference (docs/api/): the docs extra, and a Sphinx build of arrayquant.__all__'s
# docstrings with warnings as errors (ci/api-docs.sh, about 15 s); a warning fails CI ---------
bash ci/api-docs.sh || exit 1
# --- end of the API reference block ----------------------------------------------------------

python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
