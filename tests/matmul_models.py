"""Plain NumPy models of the fused matrix products, shared by their tests: the f32 error bound and
the int8-activation path's definition, both in float64 from ``aq.dequantize`` and ``codes()``."""

from __future__ import annotations

import numpy as np

import arrayquant as aq
from arrayquant.invariants import plan_for

F32 = np.float32
EPS = 2.0**-24


def weight(scheme: str, n: int = 48, k: int = 64, seed: int = 0) -> aq.QuantizedTensor:
    """A random ``(n, k)`` weight quantized with ``scheme``."""
    rng = np.random.default_rng(seed)
    return aq.quantize(rng.standard_normal((n, k)).astype(F32) * F32(0.1), scheme)


def bound(x: np.ndarray, wd: np.ndarray) -> np.ndarray:
    """The f32 dot-product error bound: (K + 4) ulps of the sum of |products|, plus the smallest normal."""
    k = x.shape[-1]
    return (k + 4) * EPS * (np.abs(x.astype(np.float64)) @ np.abs(wd).T) + 2.0**-126


def int8_model(x: np.ndarray, w: aq.QuantizedTensor, run: int) -> np.ndarray:
    """The int8-activation path by its definition, in float64: per run of K, x rounded to int8 at
    ``max|x| / 127`` (f32 scale) multiplies the codes times their scale; a zero point or offset
    multiplies the run's exact sum of x. Packed signed 4-bit codes count from 0 (``q + 8``), their
    zero point raised by 8 (0 + 8 when symmetric)."""
    m, k = x.shape
    xs = x.reshape(m, k // run, run)
    sx = (np.max(np.abs(xs), axis=2) / F32(127)).astype(F32)
    inv = np.divide(F32(1), sx, out=np.zeros_like(sx), where=sx > 0)
    xq = np.clip(np.rint(xs * inv[:, :, None]), -127, 127)
    xd = (xq * sx[:, :, None].astype(np.float64)).reshape(m, k)
    plan = plan_for(w.scheme)
    nibbles = plan.bits == 4 and plan.qmin < 0 and not plan.value.is_float and plan.packed_axis(2) is not None
    if w.zero_point is None and w.offset is None and not nibbles:
        return xd @ aq.dequantize(w).astype(np.float64).T
    n = w.shape[0]

    def expand(g: np.ndarray) -> np.ndarray:  # per tensor, row or block, to one value per weight
        a = np.asarray(g, np.float64)
        a = np.full((n, 1), a.reshape(-1)[0]) if a.size == 1 else a.reshape(n, -1)
        return np.repeat(a, k // a.shape[1], axis=1)

    q = np.asarray(w.codes(), np.float64)
    s = expand(w.scales)
    if nibbles:
        z = expand(w.zero_point) if w.zero_point is not None else np.zeros_like(s)
        return xd @ ((q + 8) * s).T - x.astype(np.float64) @ ((z + 8) * s).T
    if w.zero_point is not None:
        return xd @ (q * s).T - x.astype(np.float64) @ (expand(w.zero_point) * s).T
    return xd @ (q * s).T + x.astype(np.float64) @ expand(w.offset).T


def permute(x: np.ndarray) -> np.ndarray:
    """``x`` (M, K) as the row kernels' nibble rows read it: in each chunk of 64, the even places of
    its first and then its second half, then their odd places."""
    m, k = x.shape
    return np.ascontiguousarray(x.reshape(m, k // 64, 2, 16, 2).transpose(0, 1, 4, 2, 3)).reshape(m, k)
