"""What a run's rows say: the targets and their verdicts, the printed table and the Markdown tables.

The targets are informational (a MISS does not fail a run) and stated for NumPy on one core at
8192x8192 f32, judged on the median: throughput in GB/s, the ratio to copy and to the fastest peer,
the working set beyond input and output, and the time of the ``mse`` search against MinMax's.
:func:`targets` judges them, :func:`report` prints a run, :func:`markdown` renders its JSON document.
"""

from __future__ import annotations

import statistics
from typing import Any

from .cases import MATMUL_COLUMNS, matmul_side
from .harness import MIB, Result
from .jobs import FOUR_BIT, INT8_BLOCK_SCHEMES

__all__ = [
    "CALIBRATION_TARGET",
    "COPY_TARGETS",
    "COPY_TARGET_EXCEPTIONS",
    "PEER_TARGET",
    "SECTIONS",
    "TARGETS",
    "TARGET_EXTRA_MIB",
    "TARGET_SIZE",
    "gemv_table",
    "markdown",
    "report",
    "targets",
    "verdict",
]

# One-core NumPy throughput targets, 8192x8192 f32, judged on the median: (cases, op, GB/s)
TARGETS = (
    (INT8_BLOCK_SCHEMES, "quantize", 1.5),
    (INT8_BLOCK_SCHEMES, "dequantize", 3.0),
    (("nvfp4",), "quantize", 0.6),
    (FOUR_BIT, "dequantize", 2.0),
)
CALIBRATION_TARGET = 30.0  # x MinMax's time, for mse
# Fused-kernel targets (one thread), judged on the median against copy and the fastest peer
COPY_TARGETS = {"quantize": 0.25, "dequantize": 0.4}
COPY_TARGET_EXCEPTIONS = {("nvfp4", "quantize"): 0.2, ("mxfp8", "quantize"): 0.2}
PEER_TARGET = 1.0  # quantize rows: x the fastest peer for the same job
TARGET_SIZE = 8192
TARGET_EXTRA_MIB = 16.0  # working set beyond input and output (tighter than the 64 first asked of block cases)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def targets(results: list[Result]) -> list[dict[str, Any]]:
    """The targets, judged on this run's medians (and the working-set bound): one dict per target and row."""
    out: list[dict[str, Any]] = []
    for r in results:
        if r.kind == "calibration" and r.case.endswith(" mse") and r.vs_minmax is not None:
            out.append(
                {
                    "case": r.case,
                    "op": r.op,
                    "metric": "x MinMax time",
                    "value": r.vs_minmax,
                    "goal": CALIBRATION_TARGET,
                }
            )
        if r.kind != "arrayquant":
            continue
        goal = COPY_TARGET_EXCEPTIONS.get((r.case, r.op), COPY_TARGETS.get(r.op))
        if goal is not None:
            out.append({"case": r.case, "op": r.op, "metric": "x copy", "value": r.vs_copy, "goal": goal})
        if r.op == "quantize" and r.vs_peer is not None:
            out.append({"case": r.case, "op": r.op, "metric": "x peer", "value": r.vs_peer, "goal": PEER_TARGET})
        for cases, op, goal in TARGETS:
            if r.case in cases and r.op == op:
                out.append({"case": r.case, "op": op, "metric": "GB/s median", "value": r.gbps_median, "goal": goal})
        if r.extra_mib is not None:
            out.append(
                {"case": r.case, "op": r.op, "metric": "MiB extra", "value": r.extra_mib, "goal": TARGET_EXTRA_MIB}
            )
    for t in out:
        ok = t["value"] >= t["goal"] if _higher_is_better(t) else t["value"] <= t["goal"]
        t["verdict"] = verdict(ok)
    return out


def _higher_is_better(t: dict[str, Any]) -> bool:
    return t["metric"] in ("GB/s median", "x copy", "x peer")


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "" if v is None else format(v, spec)


def gemv_table(results: list[Result]) -> list[str]:
    """The quantized-product rows (kind ``gemv``) as text lines, with a blank line and a heading; [] without any."""
    gemv = [r for r in results if r.kind == "gemv"]
    if not gemv:
        return []
    head = [
        "",
        "-- quantized x @ W.T, the weight read from memory (cache overwritten before each call); one thread",
        "   (x NumPy = NumPy f32's time / ours at the same batch; err = max |y - float64 product| / max |y|)",
        f"{'case':<44} {'median ms':>9} {'best ms':>8} {'x NumPy':>7} {'weight MiB':>10} {'err':>8} {'first s':>7}",
    ]
    return head + [
        f"{r.case:<44} {1e3 * statistics.median(r.times_s):9.2f} {1e3 * min(r.times_s):8.2f} "
        f"{_fmt(r.vs_numpy):>7} {_fmt(r.weight_mib, '.1f'):>10} {r.check:>8} {r.first_s:7.2f}"
        for r in gemv
    ]


SECTIONS = (
    ("copy", "bandwidth limit"),
    ("numpy", "the obvious NumPy forms (float presets: NumPy + ml_dtypes casts)"),
    ("arrayquant", "arrayquant (eager; fused kernels where they apply)"),
    ("portable", "arrayquant on its portable Array API kernels (check = equal to the fused result)"),
    ("peer", "peers (each beside the arrayquant cases in PEER_MAP)"),
    ("jit", "arrayquant under jax.jit (XLA fusion; check = equal to arrayquant on NumPy)"),
)


def report(info: dict[str, Any], size: int, repeat: int, results: list[Result], unavailable: dict[str, str]) -> str:
    mib = size * size * 4 / MIB
    head = [
        f"input: {size}x{size} float32 ({mib:.0f} MiB), N(0,1)*0.05; median and best of {repeat} runs after a warm-up",
        f"backend {info['backend']}, device {info['device']}; {info['threads']}",
    ]
    cols = (
        f"{'case':<30} {'op':<10} {'median':>7} {'best':>7} {'x copy':>6} {'x numpy':>7} "
        f"{'x peer':>6}  {'best peer':<30} {'MiB+':>6} {'first s':>7} {'check':<7}"
    )
    rows = []
    for kind, title in SECTIONS:
        section = [r for r in results if r.kind == kind]
        if not section:
            continue
        rows += ["", f"-- {title}", cols, "-" * len(cols)]
        for r in section:
            rows.append(
                f"{r.case:<30} {r.op:<10} {r.gbps_median:7.2f} {r.gbps_best:7.2f} {r.vs_copy:6.2f} "
                f"{_fmt(r.vs_numpy):>7} {_fmt(r.vs_peer):>6}  {r.best_peer or '':<30} {_fmt(r.extra_mib, '.1f'):>6} "
                f"{r.first_s:7.2f} {r.check:<7}"
            )
    cal = [r for r in results if r.kind == "calibration"]
    if cal:
        rows += ["", "-- search calibrations (x MinMax = time relative to the same scheme's MinMax quantize above)"]
        rows += [f"{'case':<30} {'op':<10} {'median':>7} {'best':>7} {'x MinMax':>8} {'MiB+':>6} {'check':<7}"]
        rows += [
            f"{r.case:<30} {r.op:<10} {r.gbps_median:7.2f} {r.gbps_best:7.2f} {_fmt(r.vs_minmax, '.1f'):>8} "
            f"{_fmt(r.extra_mib, '.1f'):>6} {r.check:<7}"
            for r in cal
        ]
    mm = [r for r in results if r.kind in ("matmul", "matmul-numpy")]
    if mm:
        side = matmul_side(size)
        f32_mib = side * side * 4 / MIB
        rows += [
            "",
            f"-- matmul: {side}x{side} weight, {side}x{MATMUL_COLUMNS} f32 input "
            f"(x NumPy = NumPy's time / ours; weight MiB vs {f32_mib:.0f} MiB f32)",
            f"{'case':<34} {'median ms':>9} {'best ms':>8} {'x NumPy':>7} {'weight MiB':>10} {'check':<7}",
        ]
        rows += [
            f"{r.case:<34} {1e3 * statistics.median(r.times_s):9.1f} {1e3 * min(r.times_s):8.1f} "
            f"{_fmt(r.vs_numpy):>7} {_fmt(r.weight_mib, '.1f'):>10} {r.check:<7}"
            for r in mm
        ]
    rows += gemv_table(results)
    jit = _jit_gain(results)
    if jit:
        rows += ["", "-- what XLA fusion gives: jax.jit(arrayquant) / arrayquant eager on this backend, medians"]
        rows += jit
    if unavailable:
        rows += ["", "-- unavailable"]
        rows += [f"{name:<30} {why}" for name, why in unavailable.items()]
    notes = [
        "",
        "GB/s of f32 input (1e9 bytes/s). Ratios use medians: 'x copy' against the copy above, 'x numpy' against",
        "the obvious NumPy form (block cases, q4s included, against the int8 block32 form; float presets against",
        "their NumPy + ml_dtypes form, whose 4-bit codes stay one per byte), 'x peer' against the fastest peer for",
        "the same job (named). MiB+ = tracemalloc peak beyond the output (NumPy only); first s = the warm-up call",
        "(compile time for torch.compile and jax.jit).",
    ]
    judged = targets(results)
    stated = size == TARGET_SIZE and info["backend"] == "numpy"
    tline = "targets (informational; stated for NumPy, one core, 8192x8192; judged on the median)"
    tline += ":" if stated else f" - this run is {size}x{size} on {info['backend']}, so only indicative:"
    lines = [
        f"{t['case']:<24} {t['op']:<10} {t['value']:6.2f} {t['metric']:<11} {_target_op(t)} {t['goal']:<5g} "
        f"{t['verdict']}"
        for t in judged
    ]
    return "\n".join([*head, *rows, *notes, "", tline, *lines])


def _target_op(t: dict[str, Any]) -> str:
    return ">=" if _higher_is_better(t) else "<="


def _jit_gain(results: list[Result]) -> list[str]:
    index = {(r.case, r.op): r for r in results if r.kind == "arrayquant"}
    out = []
    for r in results:
        if r.kind == "jit":
            eager = index.get((r.case.removeprefix("jax.jit "), r.op))
            if eager is not None:
                out.append(f"{r.case:<30} {r.op:<10} {r.gbps_median / eager.gbps_median:6.2f}x")
    return out


def markdown(doc: dict[str, Any]) -> str:
    """The tables of a run's JSON document as Markdown (what ``--markdown`` writes; docs use it)."""
    m, rows = doc["machine"], doc["results"]
    by = {(r["case"], r["op"]): r for r in rows}
    vers = ", ".join(f"{k} {v}" for k, v in doc["versions"].items() if v)
    load = lambda key: " ".join(f"{v:.2f}" for v in m.get(key) or [])
    out = [
        f"Input {doc['size']}x{doc['size']} float32, median and best of {doc['repeat']} runs after a warm-up; "
        f"{m.get('threads', 'one thread')}. Machine: {m['cpu']}, {m['cpu_count']} cores, {m['platform']}; "
        f"Python {m['python']}, "
        f"NumPy {m['numpy']}; backend {m['backend']} ({m['device']}{', ' + m['gpu'] if m.get('gpu') else ''}). "
        f"Load average {load('loadavg')} at the start, {load('loadavg_end')} at the end. Versions: {vers}.",
        "",
        "| case | op | median GB/s | best GB/s | x copy | x NumPy | best peer | peer GB/s | x peer | check |",
        "|---|---|--:|--:|--:|--:|---|--:|--:|---|",
    ]
    num = lambda v, spec=".2f": "" if v is None else format(v, spec)
    for r in rows:
        if r["kind"] != "arrayquant":
            continue
        peer = by.get((r["best_peer"], r["op"])) if r["best_peer"] else None
        out.append(
            f"| `{r['case']}` | {r['op']} | {r['gbps_median']:.2f} | {r['gbps_best']:.2f} | {r['vs_copy']:.3f} | "
            f"{num(r['vs_numpy'])} | {r['best_peer'] or ''} | {num(peer and peer['gbps_median'])} | "
            f"{num(r['vs_peer'])} | {r['check']} |"
        )
    out += [
        "",
        "| reference or peer | op | median GB/s | best GB/s | x copy | first call s | beside |",
        "|---|---|--:|--:|--:|--:|---|",
    ]
    beside: dict[str, list[str]] = {}
    for case, peers in doc["peer_map"].items():
        for p in peers:
            beside.setdefault(p, []).append(case)
    for r in rows:
        if r["kind"] in ("copy", "numpy", "peer"):
            near = beside.get(r["case"]) or (["all"] if r["kind"] == "copy" else [])
            out.append(
                f"| {r['case']} | {r['op']} | {r['gbps_median']:.2f} | {r['gbps_best']:.2f} | {r['vs_copy']:.3f} | "
                f"{r['first_s']:.2f} | {', '.join(f'`{c}`' for c in near)} |"
            )
    portable = [r for r in rows if r["kind"] == "portable"]
    if portable:
        out += ["", "| portable kernels | op | median GB/s | x copy | fused x faster | check (= fused) |"]
        out += ["|---|---|--:|--:|--:|---|"]
        for r in portable:
            fused_row = by.get((r["case"].removesuffix(" portable"), r["op"]))
            gain = num(fused_row and fused_row["gbps_median"] / r["gbps_median"])
            out.append(
                f"| `{r['case']}` | {r['op']} | {r['gbps_median']:.2f} | {r['vs_copy']:.3f} | {gain} | {r['check']} |"
            )
    cal = [r for r in rows if r["kind"] == "calibration"]
    if cal:
        out += [
            "",
            "| calibration | op | median GB/s | x MinMax time | MiB extra | check |",
            "|---|---|--:|--:|--:|---|",
        ]
        out += [
            f"| `{r['case']}` | {r['op']} | {r['gbps_median']:.2f} | {num(r['vs_minmax'], '.1f')} | "
            f"{num(r['extra_mib'], '.1f')} | {r['check']} |"
            for r in cal
        ]
    mm = [r for r in rows if r["kind"] in ("matmul", "matmul-numpy")]
    if mm:
        side = matmul_side(doc["size"])
        out += ["", f"{side}x{side} weight times a {side}x{MATMUL_COLUMNS} f32 input (x NumPy = NumPy's time / ours):"]
        out += ["", "| matmul | median ms | x NumPy | weight MiB | check |", "|---|--:|--:|--:|---|"]
        out += [
            f"| `{r['case']}` | {1e3 * statistics.median(r['times_s']):.1f} | {num(r['vs_numpy'])} | "
            f"{num(r.get('weight_mib'), '.1f')} | {r['check']} |"
            for r in mm
        ]
    jit = [r for r in rows if r["kind"] == "jit"]
    if jit:
        eager_on = "NumPy" if m["backend"] == "numpy" else m["backend"]
        out += ["", f"| jax.jit of arrayquant | op | median GB/s | x eager {eager_on} | first call s | check |"]
        out += ["|---|---|--:|--:|--:|---|"]
        for r in jit:
            eager = by.get((r["case"].removeprefix("jax.jit "), r["op"]))
            ratio = num(eager and r["gbps_median"] / eager["gbps_median"])
            out.append(
                f"| `{r['case']}` | {r['op']} | {r['gbps_median']:.2f} | {ratio} | {r['first_s']:.2f} | {r['check']} |"
            )
    if doc["unavailable"]:
        out += ["", "Unavailable in this run:", ""]
        out += [f"- {name}: {why}" for name, why in doc["unavailable"].items()]
    out += ["", "| target | op | measured | goal | verdict |", "|---|---|--:|--:|---|"]
    for t in doc["targets"]:
        sign = _target_op(t)
        out.append(
            f"| `{t['case']}` | {t['op']} | {t['value']:.2f} {t['metric']} | {sign} {t['goal']:g} | {t['verdict']} |"
        )
    return "\n".join(out) + "\n"
