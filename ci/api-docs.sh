#!/usr/bin/env bash
# The API reference (docs/api/): install the docs extra, then build it from the docstrings of
# arrayquant.__all__ with Sphinx, every warning an error. Offline but for the pip install.
# The sources are copied to a temporary folder, so the build writes nothing into the checkout;
# ARRAYQUANT_API_DOCS_OUT=<dir> keeps the HTML there (else it is removed with the rest).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e ".[docs]"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -R docs/api "$tmp/src"
rm -rf "$tmp/src/generated" "$tmp/src/_build"  # pages a hand build left behind
out=${ARRAYQUANT_API_DOCS_OUT:-$tmp/html}
python -m sphinx -W --keep-going -q -b html "$tmp/src" "$out"
if [ -n "${ARRAYQUANT_API_DOCS_OUT:-}" ]; then echo "API reference built: $out/index.html"; else echo "API reference builds"; fi
