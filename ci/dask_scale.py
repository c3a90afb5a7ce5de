"""Dask at scale: cluster throughput beside single-process NumPy, and an out-of-core quantization.

``python ci/dask_scale.py throughput`` quantizes the same float32 matrix (8192 x 8192 and 16384 x
16384 by default, 8 chunks of whole rows) with single-process NumPy (one core), with dask's threaded
scheduler, and on a ``dask.distributed`` LocalCluster (two single-threaded worker processes on
loopback, data already on the workers, results kept there as a pipeline would), and prints GB/s of
f32 input (median of ``--repeat`` runs) and each dask figure as a ratio to NumPy. Every result is
compared bit for bit with NumPy's. It also times a graph of one trivial task per chunk on the
cluster: the fixed cost of a round trip through the scheduler, which no chunk kernel can remove.

``python ci/dask_scale.py out-of-core --gib 40`` quantizes a lazily generated float32 array of that
size (normal values, generated chunk by chunk, never whole in memory) straight into a safetensors
checkpoint with ``aq.save`` on the threaded scheduler, then reports wall time, throughput, the
process's peak RSS (``getrusage``) and the file size, and checks sampled row slabs of the file
against eager NumPy quantization of the same regenerated rows.

Both print JSON with ``--json PATH``. Figures are measurements of this machine, not assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np

import arrayquant as aq
from arrayquant import fused
from arrayquant.invariants import plan_for
from arrayquant.io.safetensors.reader import read_header

GB = 1e9
GIB = 1 << 30


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # ru_maxrss is KiB on Linux


def median_seconds(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# dask.distributed starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also freezes glibc's
# mmap threshold at 128 KiB: every slab temporary then costs fresh page faults (measured 4-5x
# slower per chunk). These settings keep slab-sized blocks on the heap and still return chunk-sized
# ones (mmap'd) and anything beyond 16 MiB of free heap top to the system.
TUNED_WORKER_ENV = {"MALLOC_TRIM_THRESHOLD_": 16 << 20, "MALLOC_MMAP_THRESHOLD_": 4 << 20}


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    return {"runs": [throughput_at(n, args) for n in args.size]}


def throughput_at(n: int, args: argparse.Namespace) -> dict[str, Any]:
    rows = max(1, n // 8)  # 8 chunks of whole rows
    x = da.random.default_rng(0).standard_normal((n, n), dtype=np.float32, chunks=(rows, n))
    host = x.compute()
    gb = host.nbytes / GB
    results: dict[str, Any] = {"size": n, "chunks": [rows, n], "tuned_worker_env": TUNED_WORKER_ENV, "schemes": {}}
    local = da.from_array(host, chunks=(rows, n))  # hashed once, here, not in the timed runs
    for text in args.schemes:
        eager = aq.quantize(host, text)
        with aq.fused_kernels(threads=1):  # the baseline is one core's work
            t_np = median_seconds(lambda t=text: aq.quantize(host, t), args.repeat)

        def threaded(t: str = text) -> Any:
            qt = aq.quantize(local, t)
            with dask.config.set(scheduler="threads", num_workers=2):
                return dask.compute(qt.values, qt.scales)

        values, scales = threaded()
        assert np.array_equal(values, eager.values), text
        assert np.array_equal(scales, eager.scales), text
        results["schemes"][text] = {"numpy_gbps": gb / t_np, "threads_gbps": gb / median_seconds(threaded, args.repeat)}
    for label, env in (("default", {}), ("tuned", TUNED_WORKER_ENV)):
        timed = on_cluster(x, args, env, {t: aq.quantize(host, t) for t in args.schemes})
        results[f"cluster_{label}_trivial_graph_ms"] = timed.pop("") * 1e3
        for text, seconds in timed.items():
            results["schemes"][text][f"cluster_{label}_gbps"] = gb / seconds
    print(
        f"{n} x {n} float32 ({gb:.2f} GB, chunks of {rows} rows): one trivial task per chunk on the cluster "
        f"takes {results['cluster_default_trivial_graph_ms']:.0f} ms (dask's env), "
        f"{results['cluster_tuned_trivial_graph_ms']:.0f} ms (tuned)"
    )
    for text, row in results["schemes"].items():
        np_rate = row["numpy_gbps"]
        print(
            f"{text:<18} numpy (1 core) {np_rate:5.2f} GB/s | threads (2) {row['threads_gbps']:5.2f} GB/s "
            f"= {row['threads_gbps'] / np_rate:.2f} x | LocalCluster (2 workers), dask's worker env "
            f"{row['cluster_default_gbps']:5.2f} GB/s = {row['cluster_default_gbps'] / np_rate:.2f} x, tuned malloc "
            f"{row['cluster_tuned_gbps']:5.2f} GB/s = {row['cluster_tuned_gbps'] / np_rate:.2f} x "
            f"[dask's env: {'PASS' if row['cluster_default_gbps'] >= 0.7 * np_rate else 'MISS'} >= 0.70; "
            f"fused kernels {'on' if fused.available() else 'off: ' + fused.why_not()}]"
        )
    return results


def on_cluster(x: Any, args: argparse.Namespace, env: dict[str, int], eager: dict[str, Any]) -> dict[str, float]:
    """Median seconds per scheme to quantize ``x`` (already on two local workers), results left there.

    Under the key ``""``: the median seconds of a graph of one trivial task per chunk.
    """
    from distributed import Client, LocalCluster, wait

    config = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in env.items()}
    out = {}
    saved = dict(os.environ)  # local nannies write their worker environment into this process's
    with (
        dask.config.set(config),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        on_workers = client.persist(x)
        wait(on_workers)
        times = []
        for i in range(args.repeat + 1):
            fresh = on_workers.map_blocks(lambda b: b, name=f"input-trivial-{i}")
            start = time.perf_counter()
            done = client.persist(fresh.map_blocks(lambda b: b[:, :1].copy(), chunks=(fresh.chunks[0], (1,))))
            wait(done)
            times.append(time.perf_counter() - start)
            del done
        out[""] = statistics.median(times[1:])
        for text in args.schemes:
            times = []
            for i in range(args.repeat + 1):  # the first run warms the workers up
                # a fresh input name per run (an identity task per chunk): the graph's keys are
                # deterministic, and the cluster would otherwise hand back the last run's results
                fresh = on_workers.map_blocks(lambda b: b, name=f"input-{text}-{i}")
                start = time.perf_counter()
                qt = aq.quantize(fresh, text)
                done = client.persist([qt.values, qt.scales])  # results stay on the workers
                wait(done)
                times.append(time.perf_counter() - start)
                if i == 0:
                    values, scales = (np.asarray(a) for a in client.compute(done, sync=True))
                    assert np.array_equal(values, eager[text].values), text
                    assert np.array_equal(scales, eager[text].scales), text
                del done
            out[text] = statistics.median(times[1:])
    os.environ.clear()
    os.environ.update(saved)
    return out


def out_of_core(args: argparse.Namespace) -> dict[str, Any]:
    cols = args.cols
    rows = int(args.gib * GIB) // (4 * cols)
    chunk_rows = max(1, (args.chunk_mib << 20) // (4 * cols))
    shape = (rows, cols)
    rng = da.random.default_rng(args.seed)
    x = rng.standard_normal(shape, dtype=np.float32, chunks=(chunk_rows, cols))
    folder = Path(args.out or tempfile.mkdtemp(prefix="aq-out-of-core-"))
    path = folder / "out_of_core.safetensors"
    print(
        f"input: {shape} float32 = {x.nbytes / GIB:.1f} GiB in {x.npartitions} chunks of {chunk_rows} rows "
        f"({chunk_rows * cols * 4 / (1 << 20):.0f} MiB), generated lazily; scheme {args.scheme}; output {path}"
    )
    start = time.perf_counter()
    with dask.config.set(scheduler="threads", num_workers=args.workers):
        aq.save(path, {"w": aq.quantize(x, args.scheme)})
    seconds = time.perf_counter() - start
    rss = peak_rss_gib()
    size = path.stat().st_size
    checked = verify(path, x, args.scheme, chunk_rows, args.samples)
    result = {
        "shape": list(shape),
        "input_gib": x.nbytes / GIB,
        "scheme": args.scheme,
        "chunk_rows": chunk_rows,
        "workers": args.workers,
        "seconds": seconds,
        "gbps": x.nbytes / GB / seconds,
        "peak_rss_gib": rss,
        "file_gib": size / GIB,
        "verified_slabs": checked,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
    }
    print(
        f"wrote {size / GIB:.2f} GiB in {seconds:.1f} s ({result['gbps']:.2f} GB/s of f32 input); "
        f"peak RSS {rss:.2f} GiB [{'PASS' if rss < 4 else 'MISS'} < 4 GiB]; {checked} sampled slabs match NumPy"
    )
    if not args.keep:
        path.unlink()
    return result


def verify(path: Path, x: Any, scheme: str, chunk_rows: int, samples: int) -> int:
    """Compare sampled row slabs of the file with eager quantization of the same regenerated rows.

    Only one-level schemes that pack along the last axis: their rows quantize independently.
    """
    plan = plan_for(aq.QuantScheme.parse(scheme))
    if plan.two_level or plan.block is None or plan.packed_axis(2) == 0:
        print(f"not verified slab by slab: {scheme} has a per-tensor scale or packs along axis 0")
        return 0
    block_rows = plan.block_dims(2)[0]
    with path.open("rb") as f:
        header_len, header = read_header(f, path, path.stat().st_size)
    base = 8 + header_len
    n_rows = x.shape[0]
    picks = sorted({0, n_rows - 1, *np.random.default_rng(1).integers(0, n_rows, samples).tolist()})
    checked = 0
    with path.open("rb") as f:
        for r in picks:
            r0 = (r // chunk_rows) * chunk_rows
            r1 = min(r0 + chunk_rows, n_rows)
            eager = aq.quantize(np.asarray(x[r0:r1].compute()), scheme)
            want = aq.to_bytes(eager)
            v_bytes = eager.values.nbytes
            f.seek(base + header["w"]["data_offsets"][0] + r0 * (v_bytes // eager.values.shape[0]))
            got = f.read(v_bytes)
            s_bytes = len(want) - v_bytes
            f.seek(
                base + header["w.scales"]["data_offsets"][0] + (r0 // block_rows) * (s_bytes // eager.scales.shape[0])
            )
            got += f.read(s_bytes)
            assert got == want, f"rows {r0}:{r1} differ from eager NumPy"
            checked += 1
    return checked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throughput", help="NumPy vs threaded dask vs a two-worker LocalCluster")
    t.add_argument("--size", type=int, nargs="+", default=[8192, 16384], help="matrix sides (n x n)")
    t.add_argument("--repeat", type=int, default=3)
    t.add_argument("--schemes", nargs="+", default=["q8s:block32:f16", "q4s:block32:f16", "nvfp4"])
    o = sub.add_parser("out-of-core", help="quantize a lazily generated array larger than memory to disk")
    o.add_argument("--gib", type=float, default=40.0)
    o.add_argument("--cols", type=int, default=16384)
    o.add_argument("--chunk-mib", type=int, default=64)
    o.add_argument("--workers", type=int, default=2)
    o.add_argument("--scheme", default="q8s:block32:f16:native")
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--samples", type=int, default=4)
    o.add_argument("--out", help="folder for the checkpoint (default: a new temporary folder)")
    o.add_argument("--keep", action="store_true", help="keep the checkpoint")
    for p in (t, o):
        p.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    result = throughput(args) if args.command == "throughput" else out_of_core(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
