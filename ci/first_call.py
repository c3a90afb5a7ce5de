"""First-call cost of the fused kernels: compiling them, and loading them from Numba's cache.

``python ci/first_call.py`` runs each case in a fresh interpreter twice: once with an empty cache
folder (``NUMBA_CACHE_DIR`` pointed at a new temporary folder: the compile), then again with that
folder filled (the cached first call every later process sees), and prints the seconds of the
first ``quantize`` and ``dequantize`` call, beside the second call of the same process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CASES = ("q8s:block32:f16", "q8s", "q4s:block32:f16", "nvfp4", "mxfp4", "mxfp8")

_PROBE = """
import json, sys, time
import numpy as np
import arrayquant as aq
x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
out = {}
for op in ("quantize", "dequantize"):
    t = []
    for _ in range(2):
        start = time.perf_counter()
        if op == "quantize":
            qt = aq.quantize(x, sys.argv[1])
        else:
            aq.dequantize(qt)
        t.append(time.perf_counter() - start)
    out[op] = t
print(json.dumps(out))
"""


def probe(scheme: str, cache: str) -> dict[str, list[float]]:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    proc = subprocess.run([sys.executable, "-c", _PROBE, scheme], env=env, capture_output=True, text=True, check=True)
    result: dict[str, list[float]] = json.loads(proc.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    rows = {}
    print(f"{'case':<18} {'op':<10} {'compile s':>9} {'cached s':>9} {'2nd call s':>10}")
    for scheme in CASES:
        with tempfile.TemporaryDirectory() as cache:
            cold = probe(scheme, cache)
            warm = probe(scheme, cache)
        for op in ("quantize", "dequantize"):
            rows[f"{scheme} {op}"] = {"compile_s": cold[op][0], "cached_s": warm[op][0], "second_s": warm[op][1]}
            print(f"{scheme:<18} {op:<10} {cold[op][0]:9.2f} {warm[op][0]:9.2f} {warm[op][1]:10.4f}")
    worst = max(r["cached_s"] for r in rows.values())
    print(f"\nslowest cached first call: {worst:.2f} s [{'PASS' if worst < 2.0 else 'MISS'} < 2 s]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
