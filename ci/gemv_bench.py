"""The quantized matrix product rows of ``arrayquant bench`` alone: ``x @ W.T`` at batch 1 and 16, weight from memory.

One pinned core, one thread everywhere (arrayquant's fused kernels, BLAS, onnxruntime, torch), the
4096 x 4096 weight read from memory on every call (the cache overwritten between calls); NumPy f32,
onnxruntime's MatMulNBits (accuracy levels 0 and 4) and torch's int8 kernel measured in the same run.
``--cold`` compiles the kernels into an empty numba cache, so ``first s`` is a fresh install's first call.

    python ci/gemv_bench.py [--size 4096] [--repeat 20] [--cold] [--json out.json]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "ARRAYQUANT_THREADS"):
    os.environ[var] = "1"  # before numpy, numba and arrayquant read them
if "--cold" in sys.argv:
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="arrayquant-gemv-numba-")
    atexit.register(shutil.rmtree, os.environ["NUMBA_CACHE_DIR"], True)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

from arrayquant.bench.gemv import gemv_cases  # noqa: E402
from arrayquant.bench.harness import Bench, pinned  # noqa: E402
from arrayquant.bench.reporting import gemv_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--cold", action="store_true", help="compile into an empty numba cache")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    host = np.zeros((args.size, 32), np.float32)
    b = Bench(host, host, "numpy", args.repeat, lambda _: None, memory=False)
    with pinned(1) as cpus:
        gemv_cases(b, lambda s: print(s, file=sys.stderr))
    info = {"cpus": cpus, "loadavg": list(os.getloadavg())}
    print("\n".join(gemv_table(b.results)))
    for name, why in b.unavailable.items():
        print(f"unavailable: {name}: {why}")
    print(f"pinned to {cpus}; loadavg {info['loadavg']}")
    if args.json:
        args.json.write_text(json.dumps({"info": info, "results": [asdict(r) for r in b.results]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
