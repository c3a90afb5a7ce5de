"""Throughput of arrayquant beside memory copy, the obvious NumPy forms and the peers users would pick.

``arrayquant bench`` (or ``python ci/bench.py``) prints one table: GB/s of f32 input (input bytes
over seconds, 1 GB = 1e9 bytes), median and best of ``--repeat`` timed runs after one warm-up, for
arrayquant's quantize and dequantize of int8 per tensor (``q8s``), int8 per block of 32 with F16
scales (``q8s:block32:f16``, native and packed), int4 per block of 32 (``q4s:block32:f16``), NVFP4,
MXFP4 and MXFP8. Beside them, in the same run:

- the copy of the same bytes on the same device (``numpy.copyto``, or the device's own copy): the
  memory-bandwidth limit;
- the obvious NumPy forms (int8 per tensor and per block; per-block minifloats through ml_dtypes);
- the peers that are installed (``--peers``): gguf's Q8_0/Q4_0/MXFP4 quantizers, torch eager and
  ``torch.compile`` forms of int8 per tensor, int8 block 32, fp4 (E2M1) and fp8 (E4M3) block 32,
  bitsandbytes' blockwise 8-bit and fp4/nf4, and arrayquant's own kernels under ``jax.jit`` (what XLA
  fusion gives). A peer that is missing or fails is reported as unavailable, with the reason.

Everything runs on one core: ``OMP_NUM_THREADS=1`` (and the BLAS variables), ``torch.set_num_threads(1)``
and XLA's Eigen thread pool off. Each arrayquant case is compared with copy, with the obvious NumPy
form, and with the fastest peer that does the same job (``PEER_MAP`` says which). The targets are
informational: the exit status is 0 whether they pass or not, and 1 only when an output differs
from its reference.

The package is host-side: it imports NumPy; ml_dtypes, gguf, torch, bitsandbytes, jax and cupy are
imported inside the functions that use them. Its modules, each importing only those above it:
:mod:`~arrayquant.bench.jobs` (the cases and the row names of their obvious forms),
:mod:`~arrayquant.bench.harness` (rows, timing, memory, syncs, digests, the machine),
:mod:`~arrayquant.bench.peers` (the obvious forms and the peers), :mod:`~arrayquant.bench.cases`
(one run and its ratios), :mod:`~arrayquant.bench.reporting` (targets, the table, Markdown) and
:mod:`~arrayquant.bench.cli` (the options and a run from them); :func:`main` is ``ci/bench.py``.
"""

from __future__ import annotations

import argparse

from .cases import run
from .cli import add_arguments, run_from_args
from .harness import (
    Bench,
    Pair,
    Result,
    digest,
    extra_mib,
    machine,
    make_sync,
    one_thread,
    pinned,
    qt_bytes,
    reason,
    timed,
    versions,
)
from .peers import (
    PEER_MAP,
    PEERS,
    FloatForm,
    f16_round_up,
    np_dequantize_block,
    np_dequantize_float,
    np_dequantize_tensor,
    np_quantize_block,
    np_quantize_float,
    np_quantize_tensor,
    torch_forms,
    ue4m3_round_up,
)
from .reporting import markdown, report, targets, verdict

__all__ = [
    "PEERS",
    "PEER_MAP",
    "Bench",
    "FloatForm",
    "Pair",
    "Result",
    "add_arguments",
    "digest",
    "extra_mib",
    "f16_round_up",
    "machine",
    "main",
    "make_sync",
    "markdown",
    "np_dequantize_block",
    "np_dequantize_float",
    "np_dequantize_tensor",
    "np_quantize_block",
    "np_quantize_float",
    "np_quantize_tensor",
    "one_thread",
    "pinned",
    "qt_bytes",
    "reason",
    "report",
    "run",
    "run_from_args",
    "targets",
    "timed",
    "torch_forms",
    "ue4m3_round_up",
    "verdict",
    "versions",
]


def main(argv: list[str] | None = None) -> int:
    """``python ci/bench.py [options]``: the same as ``arrayquant bench``."""
    parser = argparse.ArgumentParser(prog="bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv), parser)
