"""Quantized matrix products as decoding runs them: ``x @ W.T`` at batch 1 and 16, the weight read from memory.

Every row times ``y = x @ W.T`` for a ``GEMV_SIZE``-square weight after the last-level cache has
been overwritten (a 64 MiB buffer written between calls, not timed), so each call reads its weight
from memory as a decoder does once per token. The rows of one batch are timed in rounds, one call of
each per round, so a slow spell of a shared machine slows them all and their ratios stay fair.
Beside arrayquant's fused kernels, in the same run:
NumPy's f32 product (the baseline), onnxruntime's ``MatMulNBits`` (4-bit, block 32, accuracy levels
0 and 4, the weight packed by arrayquant's own MatMulNBits writer) and torch's
``_weight_int8pack_mm`` (int8 weight per row, bf16 activations) where installed. Each row's error is
its largest difference from the float64 product of the same (dequantized) weight, relative to the
largest output.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..dequantize import dequantize
from ..quantize import quantize
from .harness import Bench, Result, reason

__all__ = ["GEMV_BATCHES", "GEMV_SCHEMES", "GEMV_SIZE", "gemv_cases"]

GEMV_SIZE = 4096
GEMV_BATCHES = (1, 16)
# (scheme, the paths timed): per row int8, 4-bit per group (with and without zero points), the FP4 and FP8 presets
GEMV_SCHEMES = (
    ("q8s:block{n}", ("fused", "fused_int8")),
    ("q4s:block32", ("fused", "fused_int8")),
    ("u4:block32:zero_point", ("fused",)),
    ("nvfp4", ("fused", "fused_int8")),
    ("mxfp4", ("fused", "fused_int8")),
    ("mxfp8", ("fused",)),
)
_FLUSH_BYTES = 64 << 20  # twice this machine class's last-level cache


def _interleaved(fns: list[Callable[[], Any]], repeat: int, flush: np.ndarray) -> list[list[float]]:
    """Seconds of ``repeat`` rounds of calls, one call of each ``fns`` per round, each after the cache was
    overwritten: every row meets the same slow spells of a shared machine, so their ratios hold."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, got in zip(fns, times, strict=True):
            flush += 1
            t0 = time.perf_counter()
            fn()
            got.append(time.perf_counter() - t0)
    return times


def _stored_layout(qt: Any, xt: np.ndarray) -> Any:
    """``(w @ x.T).T``: the product written in the weight's stored layout."""
    from ..ops import linalg

    return linalg.matmul(qt, xt, path="fused").T


def _first(fn: Callable[[], Any]) -> Any:
    return fn()[0]


def _as_numpy(fn: Callable[[], Any]) -> Any:
    return fn().float().numpy()


def _error(y: Any, oracle: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(y, np.float64) - oracle)) / max(float(np.max(np.abs(oracle))), 1e-30))


def _ort_session(w: np.ndarray, level: int) -> Any:
    """onnxruntime running ``x @ W.T`` as one MatMulNBits node (4-bit, block 32, no zero points)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from ..io.onnx import nbits

    qt = quantize(w, "q4s:block32")
    tensors, attrs = nbits.encode(qt, "W")
    n, k = w.shape
    node = helper.make_node("MatMulNBits", ["x", *(t.name for t in tensors)], ["y"], domain="com.microsoft")
    node.attribute.extend(helper.make_attribute(a, v) for a, v in {**attrs, "accuracy_level": level}.items())
    graph = helper.make_graph(
        [node],
        "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        tensors,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess, qt


def gemv_cases(b: Bench, log: Callable[[str], None]) -> None:
    """The rows above, kind ``gemv``: ``vs_numpy`` is NumPy f32's median over the row's, ``check`` its error."""
    if b.backend != "numpy":
        b.unavailable["gemv"] = f"quantized matmul rows run with --backend numpy only, not {b.backend}"
        return
    from ..ops import linalg

    n = min(GEMV_SIZE, b.host.shape[0])
    rng = np.random.default_rng(5)
    w = rng.standard_normal((n, n), dtype=np.float32) * np.float32(0.05)
    flush = np.zeros(_FLUSH_BYTES // 8)

    pending: list[Result] = []
    calls: list[Callable[[], Any]] = []

    def row(case: str, fn: Callable[[], Any], oracle: np.ndarray, weight_mib: float) -> None:
        """Add a row: its first call (compilation) and error now, its times with the batch's other rows."""
        t0 = time.perf_counter()
        y = fn()
        r = Result(case, "gemv", "gemv", [], 0.0, 0.0, first_s=time.perf_counter() - t0)
        r.weight_mib = weight_mib
        r.check = f"{_error(y, oracle):.1e}"
        pending.append(r)
        calls.append(fn)

    for batch in GEMV_BATCHES:
        x = rng.standard_normal((batch, n), dtype=np.float32)
        x64 = x.astype(np.float64)
        pending.clear()
        calls.clear()
        row(
            f"numpy f32 x @ W.T  b{batch}",
            functools.partial(np.matmul, x, w.T),
            x64 @ w.T.astype(np.float64),
            w.nbytes / 2**20,
        )
        for template, paths in GEMV_SCHEMES:
            scheme = template.format(n=n)
            try:
                qt = quantize(w, scheme)
                oracle = x64 @ dequantize(qt).astype(np.float64).T
                mib = qt.nbytes / 2**20
                for path in paths:
                    fn = functools.partial(linalg.matmul, x, qt.T, path=path)
                    row(f"{scheme} {path} b{batch}", fn, oracle, mib)
                # the stored layout written the other way: (w @ x.T).T, the same kernel
                stored = functools.partial(_stored_layout, qt, np.ascontiguousarray(x.T))
                row(f"{scheme} (w @ x.T).T b{batch}", stored, oracle, mib)
            except Exception as exc:  # report, go on with the others
                b.unavailable[f"gemv {scheme} b{batch}"] = reason(exc)
            log(f"gemv {scheme} b{batch} done")
        for level in (0, 4):
            try:
                sess, q4 = _ort_session(w, level)
                oracle = x64 @ dequantize(q4).astype(np.float64).T
                fn = functools.partial(sess.run, None, {"x": x})
                row(
                    f"onnxruntime MatMulNBits q4/32 L{level} b{batch}",
                    functools.partial(_first, fn),
                    oracle,
                    q4.nbytes / 2**20,
                )
            except Exception as exc:
                b.unavailable[f"onnxruntime MatMulNBits L{level}"] = reason(exc)
        try:
            import torch

            torch.set_num_threads(1)
            scale = np.max(np.abs(w), axis=1) / 127
            w8 = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
            tw, ts = torch.from_numpy(w8), torch.from_numpy(scale.astype(np.float32)).to(torch.bfloat16)
            tx = torch.from_numpy(x).to(torch.bfloat16)
            oracle = x64 @ (w8.astype(np.float64) * ts.float().numpy().astype(np.float64)[:, None]).T
            fn = functools.partial(torch._weight_int8pack_mm, tx, tw, ts)
            row(
                f"torch int8pack_mm bf16 b{batch}",
                functools.partial(_as_numpy, fn),
                oracle,
                (w8.nbytes + 2 * n) / 2**20,
            )
        except Exception as exc:
            b.unavailable["torch _weight_int8pack_mm"] = reason(exc)
        log(f"gemv b{batch}: timing {len(calls)} rows, {b.repeat} rounds")
        for r, times in zip(pending, _interleaved(calls, b.repeat, flush), strict=True):
            r.times_s = times
            if r is not pending[0]:
                r.vs_numpy = statistics.median(pending[0].times_s) / statistics.median(times)
            b.results.append(r)
