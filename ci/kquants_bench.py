"""K-quant and IQ4 quantization speed against ggml's own quantizer, one thread each, in one run.

ggml is the test oracle (``tests/ggml_oracle.py``: ggml-base compiled from the pinned
llama-cpp-python sdist, a portable release build), called through ``ggml_quantize_chunk`` as
llama-quantize calls it; arrayquant is ``arrayquant.fused.ggml_kquants.quantize_rows`` with
``ARRAYQUANT_THREADS=1`` (its serial kernel). Both quantize the same f32 weight (default 4096 x
4096, the size of a 7B model's attention projection), with and without an importance matrix;
each figure is the best of ``--repeat`` runs, and the bytes are checked equal. The first call's
compile time (numba, cached on disk afterwards) is printed apart; ``--cold`` compiles into an empty
numba cache, so that figure is a fresh install's first call.

    python ci/kquants_bench.py [--rows 4096] [--cols 4096] [--repeat 3] [--cold] [--json out.json]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ["ARRAYQUANT_THREADS"] = "1"  # before arrayquant reads it
if "--cold" in sys.argv:  # before numba reads it
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="arrayquant-bench-numba-")
    atexit.register(shutil.rmtree, os.environ["NUMBA_CACHE_DIR"], True)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import ggml_oracle

from arrayquant.fused import ggml_kquants

TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]


def _best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="compile the kernels into an empty numba cache")
    p.add_argument("--json", help="also write the rows as JSON")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    x = (rng.standard_t(5, (a.rows, a.cols)) * 0.02).astype(np.float32)
    imatrix = rng.uniform(0.05, 4.0, a.cols).astype(np.float32)
    t0 = time.perf_counter()
    ggml_kquants.quantize_rows(x[:1, :256], "Q4_K")  # compiles (or loads from numba's cache) every kernel
    first = time.perf_counter() - t0
    gb = x.nbytes / 1e9
    print(f"f32 weight {a.rows} x {a.cols} ({x.nbytes / 2**20:.0f} MiB), one thread each, best of {a.repeat}")
    print(f"first call (compile or load the numba kernels): {first:.1f} s")
    head = ("type", "imatrix", "ggml s", "ggml GB/s", "ours s", "ours GB/s", "ours/ggml")
    print(f"{head[0]:8s} {head[1]:8s} {head[2]:>8s} {head[3]:>10s} {head[4]:>8s} {head[5]:>10s} {head[6]:>10s}")
    rows = []
    for type_name in TYPES:
        for weighted in (False, True):
            qw = imatrix if weighted else None
            want = ggml_oracle.quantize(x, type_name, qw)
            got = ggml_kquants.quantize_rows(x, type_name, qw)
            if not np.array_equal(got, want):
                print(f"{type_name}: bytes differ from ggml's", file=sys.stderr)
                return 1
            t_ggml = _best(lambda t=type_name, q=qw: ggml_oracle.quantize(x, t, q), a.repeat)
            t_ours = _best(lambda t=type_name, q=qw: ggml_kquants.quantize_rows(x, t, q), a.repeat)
            row = {"type": type_name, "imatrix": weighted, "ggml_s": t_ggml, "ours_s": t_ours}
            rows.append(row)
            print(
                f"{type_name:8s} {'yes' if weighted else 'no':8s} {t_ggml:8.3f} {gb / t_ggml:10.3f} {t_ours:8.3f} "
                f"{gb / t_ours:10.3f} {t_ours / t_ggml:10.2f}"
            )
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": a.rows, "cols": a.cols, "first_call_s": first, "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
