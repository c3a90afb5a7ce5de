"""The benchmark's command line: its options, and one run from them to the table, JSON and Markdown.

:func:`add_arguments` adds the options to a parser (``arrayquant bench`` and ``ci/bench.py`` share
them); :func:`run_from_args` limits threads, pins the process, runs, prints and writes. The exit
status is 0 whatever the speed, 1 when an output differs from its reference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .. import fused
from .cases import run
from .harness import one_thread, pinned, versions
from .jobs import BLOCK
from .peers import PEER_MAP, PEERS
from .reporting import TARGET_SIZE, markdown, report, targets

__all__ = ["BACKENDS", "add_arguments", "peer_list", "run_from_args"]

BACKENDS = ("numpy", "cupy", "torch", "jax")


def peer_list(text: str) -> tuple[str, ...]:
    """The ``--peers`` value: ``all``, ``none`` or a comma-separated list of :data:`~.peers.PEERS` names."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return tuple(PEERS)
    if names == ["none"]:
        return ()
    bad = [n for n in names if n not in PEERS]
    if bad or not names:
        msg = f"unknown peer {', '.join(bad) or text!r}; choose from all, none, {', '.join(PEERS)}"
        raise argparse.ArgumentTypeError(msg)
    return tuple(names)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options, shared by ``arrayquant bench`` and ``ci/bench.py``."""
    parser.add_argument("--size", type=int, default=TARGET_SIZE, help="side of the square f32 input (multiple of 32)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case, after one warm-up")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results and the machine as JSON")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="also write the tables as Markdown")
    parser.add_argument("--backend", choices=BACKENDS, default="numpy", help="array backend of the input")
    parser.add_argument("--device", help="device such as cpu, cuda, cuda:1 (default: the backend's)")
    parser.add_argument(
        "--peers",
        type=peer_list,
        default=tuple(PEERS),
        metavar="LIST",
        help=f"comma-separated peers to time when installed: all (default), none, or of {', '.join(PEERS)}",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc working-set runs")
    parser.add_argument(
        "--no-calibration", action="store_true", help="skip the search calibration rows (mse, 4over6, percentile)"
    )
    parser.add_argument(
        "--no-portable", action="store_true", help="skip the rows of the portable kernels beside the fused ones"
    )
    parser.add_argument(
        "--no-matmul", action="store_true", help="skip the matmul rows (4096x4096 quantized weight x 4096x64 input)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads (and pinned CPUs) of arrayquant's fused kernels; libraries and peers keep one thread",
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin the process to one CPU (threads are still limited to one)"
    )


def run_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """One run from parsed ``args`` (bad values are usage errors of ``parser``); returns the exit status."""
    if args.size <= 0 or args.size % BLOCK:
        parser.error(f"--size must be a positive multiple of {BLOCK}, got {args.size}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    one_thread()
    say = lambda text: print(f"  [{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)
    memory = False if args.no_memory else None
    if "jax" in sys.modules and not args.no_pin:
        say("jax was imported before the benchmark pinned its CPU: XLA's thread pool may use more cores")
    n = args.threads
    pin = pinned(n) if not args.no_pin else contextlib.nullcontext(None)
    with pin as cpus, fused.fused_kernels(threads=n):
        info, results, unavailable = run(
            args.size,
            args.repeat,
            backend=args.backend,
            device=args.device,
            peers=args.peers,
            memory=memory,
            calibrations=not args.no_calibration,
            portable=not args.no_portable,
            log=say,
            matmul=not args.no_matmul,
        )
    where = f"process pinned to CPU {', '.join(map(str, cpus))}, " if cpus else "process not pinned, "
    cores = "one core" if n == 1 else f"{n} cores"
    info["threads"] = (
        f"{cores}: {where}fused kernels {n} thread{'s' if n > 1 else ''}, "
        "OMP/BLAS threads 1, torch.set_num_threads(1), XLA Eigen pool off"
    )
    info["fused_threads"] = n
    vers = versions()
    print("\n".join(f"{k}: {v}" for k, v in info.items()))
    print("versions: " + ", ".join(f"{k} {v or '-'}" for k, v in vers.items()) + "\n")
    print(report(info, args.size, args.repeat, results, unavailable))
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    print(f"\nloadavg at end: {info['loadavg_end']}")
    if args.json is not None or args.markdown is not None:
        doc = {
            "machine": info,
            "versions": vers,
            "size": args.size,
            "repeat": args.repeat,
            "results": [asdict(r) for r in results],
            "unavailable": unavailable,
            "targets": targets(results),
            "peer_map": PEER_MAP,
        }
        if args.json is not None:
            args.json.write_text(json.dumps(doc, indent=1) + "\n")
        if args.markdown is not None:
            args.markdown.write_text(markdown(doc))
    differs = [f"{r.case} {r.op}" for r in results if r.check == "differs"]
    if differs:
        print(f"\noutputs that differ from their reference: {', '.join(differs)}", file=sys.stderr)
        return 1
    return 0
