#!/usr/bin/env bash
# The long exhaustive sweeps (tests marked slow, which the default run and ci/test.sh deselect):
# every minifloat code, the round-up rule over every value, the fused kernels' exhaustive checks,
# the longer fuzz runs. Expects the test extras installed (ci/test.sh does that); extra arguments
# go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."

python -m pytest -m slow "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no slow tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
