"""Throughput of arrayquant beside copy, the obvious NumPy forms and the peers: ``arrayquant bench``.

Run ``python ci/bench.py`` (``--help`` for options); the work is in :mod:`arrayquant.bench`, so a
user measures the same thing on their own machine or GPU with ``arrayquant bench`` or
``python -m arrayquant bench``. Threads are limited to one before NumPy is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"  # one core; OPENBLAS_CORETYPE is left as the environment sets it

try:
    from arrayquant.bench import main
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from arrayquant.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
