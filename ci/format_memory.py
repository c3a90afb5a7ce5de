"""Peak memory of re-quantizing large GGUF and Burnpack files: ``python ci/format_memory.py``.

Writes, in a temporary folder, a GGUF file of about ``--gib`` GiB of f16 weights (with gguf-py,
as llama.cpp's converters do), and a safetensors and a Burnpack file of about the same size in
f32, then runs each
command below in a fresh subprocess and prints its peak RSS (``VmHWM``, Linux) beside the same
command on a file of one small tensor (the baseline: interpreter, libraries, code), the largest
tensor, and the bound: 1.5 times the largest tensor plus its quantized output, above the
baseline. Asserts nothing: the figures depend on the machine.

- ``arrayquant quantize model-f16.gguf model-q8_0.gguf --scheme q8_0``
- ``arrayquant quantize model.safetensors model.bpk --scheme q4s:block32:f16``
- ``arrayquant quantize model.bpk model-q8.bpk --scheme q8s`` (an f32 Burnpack file)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_PROBE = """
import sys
from arrayquant.cli import main
code = main(sys.argv[1:])
status = open("/proc/self/status").read()
print(code, next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))  # KiB
"""
MIB = 2**20


def _shapes(gib: float, rows: int, cols: int, itemsize: int) -> list[tuple[str, tuple[int, int]]]:
    count = max(1, round(gib * 2**30 / (rows * cols * itemsize)))
    return [(f"blk.{i}.ffn_up.weight", (rows, cols)) for i in range(count)]


def _gguf(path: Path, shapes: list[tuple[str, tuple[int, int]]]) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("memory")
    rng = np.random.default_rng(0)
    for name, shape in shapes:  # declared first, then written one at a time
        writer.add_tensor_info(name, shape, np.dtype(np.float16), int(np.prod(shape)) * 2)
    writer.add_tensor_info("output_norm.weight", (shape[1],), np.dtype(np.float32), shape[1] * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, shape in shapes:
        writer.write_tensor_data((rng.standard_normal(shape, np.float32) * 0.02).astype(np.float16))
    writer.write_tensor_data(np.ones(shape[1], np.float32))
    writer.close()


def _safetensors(path: Path, shapes: list[tuple[str, tuple[int, int]]]) -> None:
    from arrayquant.io.arrayquant.checkpoint import save_stream

    rng = np.random.default_rng(0)
    save_stream(path, ((name, rng.standard_normal(shape, np.float32) * 0.02) for name, shape in shapes))


def _burnpack(path: Path, shapes: list[tuple[str, tuple[int, int]]]) -> None:
    from arrayquant.io.burn.burnpack import save_stream

    rng = np.random.default_rng(0)
    save_stream(path, ((name, rng.standard_normal(shape, np.float32) * 0.02) for name, shape in shapes))


def _run(*argv: str) -> tuple[float, float]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv, "--quiet"], check=True, capture_output=True, text=True)
    code, kib = out.stdout.split()[-2:]
    if code != "0":
        raise SystemExit(f"arrayquant {' '.join(argv)} exited {code}: {out.stderr}")
    return int(kib) / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        t = Path(tmp)
        small = [("blk.0.ffn_up.weight", (64, 256))]
        print(f"{'command':<58} {'peak MiB':>9} {'above base':>10} {'bound':>6} {'s':>6}")
        for make, suffix, itemsize, out, scheme, out_per_value in (
            (_gguf, "gguf", 2, "q8_0.gguf", "q8_0", 34 / 32),
            (_safetensors, "safetensors", 4, "q4.bpk", "q4s:block32:f16", 18 / 32),
            (_burnpack, "bpk", 4, "q8.bpk", "q8s", 1.0),
        ):
            shapes = _shapes(args.gib, args.rows, args.cols, itemsize)
            big, tiny = t / f"model.{suffix}", t / f"tiny.{suffix}"
            make(big, shapes)
            make(tiny, small)
            largest = args.rows * args.cols * itemsize / MIB
            base, _ = _run("quantize", str(tiny), str(t / f"tiny-{out}"), "--scheme", scheme)
            peak, secs = _run("quantize", str(big), str(t / out), "--scheme", scheme)
            bound = 1.5 * largest + args.rows * args.cols * out_per_value / MIB
            name = f"quantize {big.name} ({big.stat().st_size / 2**30:.2f} GiB) -> {out}"
            print(f"{name:<58} {peak:9.0f} {peak - base:10.0f} {bound:6.0f} {secs:6.1f}")


if __name__ == "__main__":
    main()
