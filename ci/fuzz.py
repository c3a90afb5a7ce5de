#!/usr/bin/env python
"""The opt-in fuzz run: every reader of untrusted input, in memory-capped workers.

    python ci/fuzz.py --cases 200000 --seed 1 [--workers 2] [--targets load,cli,nvfp4,bytes]
    python ci/fuzz.py --targets folder,gguf-meta,ops --cases 3000 --workers 1
    python ci/fuzz.py --replay bytes:1000000042          # one case again, with its traceback
    python ci/fuzz.py --replay bytes:1000000042 --repro  # ... as stand-alone Python

Prints the count of every outcome class (loaded-correct, each library error type, and the
failures: a non-library exception, a leaked warning, a case over 5 s, the memory cap, a worker
crash, an inconsistent result, a CLI that exits other than 0/1, a model folder case that touched
a file outside its OUT or read a tensor from outside its folder) and one line per distinct
failure with the command that replays it. Exits 1 when any case failed. The cases and the
harness are in tests/fuzz_targets.py; tests/test_fuzz.py runs a bounded number of them in CI.
A replay runs in this process, without the address-space cap (file sizes are capped, as in the
workers), so a case that failed as ``memory`` may take the machine's memory when replayed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fuzz_targets as ft


def _replay(spec: str, repro: bool) -> int:
    target, _, seed = spec.partition(":")
    case = ft.make_case(target, int(seed))
    if repro:
        print(ft.reproducer(case))
        return 0
    ft._cap_file_size()  # as in the workers: a folder linking /dev/zero must not fill the disk
    ns = ft.warm_up()
    print(f"case {target}:{seed} ({case.kind})")
    with tempfile.TemporaryDirectory() as tmp:
        res = ft.classify(case, Path(tmp), ns)
        print(f"outcome: {res.outcome} after {res.seconds:.3f} s at {res.stage or '-'}")
        if res.detail:
            print(f"detail: {res.detail}")
        if res.failed and not res.outcome.endswith(("slow", "memory")):
            try:  # again without the harness, for the traceback
                ft.execute(case, Path(tmp), ns)
            except BaseException:
                traceback.print_exc()
    return 1 if res.failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=20000, help="number of cases (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="run seed; case seeds derive from it (default: %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default: %(default)s)")
    p.add_argument("--targets", default=",".join(ft.TARGETS), help="comma-separated (default: %(default)s)")
    p.add_argument(
        "--cap-mib", type=int, default=ft.DEFAULT_CAP >> 20, help="address space per worker above its start-up size"
    )
    p.add_argument("--examples", type=int, default=1, help="replay lines per distinct failure (default: 1)")
    p.add_argument("--progress", type=int, default=10000, help="print counts every N cases (0: never)")
    p.add_argument("--replay", metavar="TARGET:SEED", help="run one case in this process and show what happened")
    p.add_argument("--repro", action="store_true", help="with --replay: print stand-alone Python for the case")
    args = p.parse_args(argv)
    if args.replay:
        return _replay(args.replay, args.repro)
    targets = [t for t in args.targets.split(",") if t]
    unknown = sorted(set(targets) - set(ft.TARGETS))
    if unknown:
        p.error(f"unknown targets {unknown}; choose from {', '.join(ft.TARGETS)}")
    tally = ft.Tally()
    start = time.monotonic()
    with ft.Harness(workers=args.workers, cap=args.cap_mib << 20) as h:
        for res in h.run(ft.plan(args.cases, args.seed, targets)):
            tally.add(res)
            if args.progress and tally.total % args.progress == 0:
                rate = tally.total / (time.monotonic() - start)
                print(f"... {tally.total} cases, {tally.failed} failures, {rate:.0f} cases/s", flush=True)
        info = h.info
    print(f"workers: {args.workers}, start-up VM {info.get('vm', 0) >> 20} MiB, cap +{args.cap_mib} MiB")
    print(f"seed {args.seed}, {time.monotonic() - start:.0f} s")
    print(tally.report(args.examples))
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
