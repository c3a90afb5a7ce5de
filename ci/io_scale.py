"""How checkpoint I/O scales with the number of tensors: ``python ci/io_scale.py``.

Prints measured figures, asserts nothing (timings are machine-dependent; the tests check
correctness at scale instead):

- ``save_stream`` of N one-element f32 tensors, for each N given (``--counts``);
- ``arrayquant dequantize IN OUT`` on N tiny quantized tensors and on N tiny plain ones, run as
  a subprocess (so the time includes start-up, as a user sees it);
- peak RSS of ``aq.load`` of a file with ``--zero-entries`` zero-size entries (default one
  million), in a fresh subprocess (its ``VmHWM``; Linux), beside the peak RSS of a subprocess that only imports.

Growth that is linear in N shows as a roughly constant time per tensor across the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import arrayquant as aq
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import arrayquant as aq

import numpy as np

from arrayquant.io.arrayquant.checkpoint import save_stream

_RSS_PROBE = """
import sys
import arrayquant as aq
if sys.argv[1] != "-":
    out = aq.load(sys.argv[1], backend="numpy")
    assert len(out) == int(sys.argv[2]), len(out)
# VmHWM starts afresh at exec; ru_maxrss would include the parent's size at fork
status = open("/proc/self/status").read()
print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))  # KiB
"""


def _tiny_items(n: int, quantized: bool) -> list[tuple[str, object]]:
    one = np.ones(1, np.float32)
    qt = aq.quantize(one, "q8s:native") if quantized else None
    return [(f"t{i}", qt if quantized else one) for i in range(n)]


def _zero_entry_file(path: Path, n: int) -> None:
    """A safetensors file of ``n`` zero-size F32 entries, its header written directly."""
    header = {f"z{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(n)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text)


def _peak_rss_mib(args: list[str]) -> float:
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, *args], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[-1]) / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="*", default=[4000, 8000, 16000], help="tensor counts to time")
    parser.add_argument("--zero-entries", type=int, default=1_000_000, help="zero-size entries for the RSS probe")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for n in args.counts:
            for quantized in (False, True):
                src, dst = folder / "in.safetensors", folder / "out.safetensors"
                items = _tiny_items(n, quantized)
                start = time.perf_counter()
                save_stream(src, items)
                saved = time.perf_counter() - start
                start = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "arrayquant", "dequantize", str(src), str(dst)],
                    check=True,
                    capture_output=True,
                )
                cli = time.perf_counter() - start
                kind = "quantized q8s:native" if quantized else "plain f32"
                print(
                    f"{n:>7} {kind:<20} save_stream {saved:6.2f} s ({saved / n * 1e6:6.1f} us/tensor)   "
                    f"arrayquant dequantize {cli:6.2f} s"
                )
        if args.zero_entries:
            path = folder / "zero.safetensors"
            _zero_entry_file(path, args.zero_entries)
            size = path.stat().st_size / 2**20
            base = _peak_rss_mib(["-"])
            start = time.perf_counter()
            peak = _peak_rss_mib([str(path), str(args.zero_entries)])
            took = time.perf_counter() - start
            print(
                f"aq.load of {args.zero_entries:,} zero-size entries ({size:.1f} MiB file): peak RSS {peak:.0f} MiB "
                f"(imports alone {base:.0f} MiB), {took:.1f} s"
            )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
