"""MSE calibration search of minifloat schemes (E2M1, E4M3, E5M2), fused in one Numba pass per row.

The float counterpart of :mod:`.numba_search`: the same f32 operations in the same order as the
portable path (``kernels/search.py`` driven by ``blockwork.Steps``, ``kernels/minifloat.py``), so
codes, stored scales and the two-level global are identical bit for bit:

* per candidate the stored scale is ``round_up(alpha / (span / 2))`` (rule ``round_up``), the
  OCP power of two (rule ``ocp``: ``kernels/qparams.py``'s ``_ocp_scales``, then rounded up), or,
  two-level, ``round_up((alpha / (span / 2)) / g)`` under MinMax's global ``g`` with the effective
  scale ``min(g * stored, F32_MAX)``;
* codes ``encode(min(|x / eff|, max))`` with the sign of ``x``: E2M1 by the seven midpoint
  comparisons, E4M3/E5M2 by the binade count and ``t = a * 2^(mbits - emin - j)`` rounded half to
  even, ``n + j * 2^mbits`` (zero scale: code 0); ``deq = table[code] * eff``;
* the element error, its power, the weights, the block tree and the tie rule as in the integer
  kernel (``| |x| - |deq| |`` is the same bits as ``|x - deq|``: ``deq`` has ``x``'s sign and f32
  rounding is symmetric).
"""

from __future__ import annotations

import numpy as np

from ..invariants import Plan
from ..kernels.minifloat import FORMATS, decode_table
from ..scheme import F32_MAX, F32_TINY, QuantMode, QuantValue, ScaleDtype
from .numba_search import _LAUNCH, _LIMIT, _block_error, _round_up_tables, norm_tables, numba

__all__ = ["mse_float_codes_and_scales", "supports"]

_VALUES = (QuantValue.E2M1, QuantValue.E4M3, QuantValue.E5M2)
# E2M1 midpoints (kernels/minifloat.py's _E2M1_STEPS) and whether the comparison includes them
_E2M1_THR = np.asarray([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
_E2M1_INCL = np.asarray([0, 1, 0, 1, 0, 1, 0], dtype=np.int32)


if numba is not None:
    from .numba_search import _round_up

    _njit = numba.njit(cache=True, nogil=True)

    @_njit
    def _magnitude(a, e2m1, thr, incl, bthr, bscale, step):
        """The magnitude code of ``a = min(|y|, max)`` (``kernels/minifloat.py``'s encode)."""
        if e2m1:
            c = 0
            for k in range(7):
                if incl[k] != 0:
                    c += 1 if a >= thr[k] else 0
                else:
                    c += 1 if a > thr[k] else 0
            return c
        j = 0
        for k in range(bthr.shape[0]):
            j += 1 if a >= bthr[k] else 0
        t = a * bscale[j]
        magic = np.float32(12582912.0)  # 1.5 * 2^23: t <= 2^(mbits + 1), rounded half to even
        n = (t + magic) - magic
        return int(n) + j * step

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _search(
        x,
        b,
        factors,
        half_span,
        glob,
        two_level,
        ocp,
        ocp_mul,
        sd,
        u8,
        e2m1,
        fmax,
        thr,
        incl,
        bthr,
        bscale,
        step,
        dtab,
        sign_shift,
        mode,
        mant,
        ptab,
        w,
        has_w,
        codes,
        scales,
        bad,
    ):
        rows, cols = x.shape
        nb = (cols + b - 1) // b
        width = 1
        while width < b:
            width *= 2
        zero = np.float32(0.0)
        half = np.float32(0.5)
        inf = np.float32(np.inf)
        fmax32 = np.float32(F32_MAX)
        limit = np.float32(_LIMIT)
        nf = factors.shape[0]
        for r in numba.prange(rows):
            buf = np.zeros(width, dtype=np.float32)
            bits = buf.view(np.uint32)
            for g in range(nb):
                c0 = g * b
                n = min(b, cols - c0)
                amax = zero
                for t in range(n):
                    a = abs(x[r, c0 + t])
                    if not a < inf:  # NaN or inf: the caller falls back to the checked portable path
                        bad[r] = True
                    amax = max(amax, a)
                unit = _round_up(amax, u8[0], u8[1], u8[2], u8[3], u8[4], u8[5])
                down = np.float32(1.0) / unit  # a power of two: times it is the same bits as / unit
                best_err = zero
                best_s = zero
                best_eff = zero
                prev_s = zero
                for i in range(nf):
                    f = factors[i]
                    alpha = amax if f == np.float32(1.0) else amax * f
                    if ocp:
                        up = _round_up(alpha, u8[0], u8[1], u8[2], u8[3], u8[4], u8[5])
                        fl = up if up == alpha else up * half
                        s = _round_up(fl * ocp_mul, sd[0], sd[1], sd[2], sd[3], sd[4], sd[5])
                    elif two_level:
                        s = _round_up((alpha / half_span) / glob, sd[0], sd[1], sd[2], sd[3], sd[4], sd[5])
                    else:
                        s = _round_up(alpha / half_span, sd[0], sd[1], sd[2], sd[3], sd[4], sd[5])
                    if i > 0 and s == prev_s:
                        continue  # the same stored scale gives the same error: never strictly smaller
                    prev_s = s
                    eff = min(glob * s, fmax32) if two_level else s
                    div = inf if eff == zero else eff
                    for t in range(n):
                        ax = abs(x[r, c0 + t])
                        a = min(ax / div, fmax)
                        d = dtab[_magnitude(a, e2m1, thr, incl, bthr, bscale, step)] * eff
                        buf[t] = min(abs(ax - d) * down, limit)
                    err = _block_error(buf, bits, n, mode, mant, ptab, w, c0, has_w)
                    if i == 0 or err < best_err:
                        best_err = err
                        best_s = s
                        best_eff = eff
                scales[r, g] = best_s
                div = inf if best_eff == zero else best_eff
                for t in range(n):
                    xv = x[r, c0 + t]
                    if best_eff == zero:
                        codes[r, c0 + t] = np.uint8(0)
                        continue
                    m = _magnitude(min(abs(xv) / div, fmax), e2m1, thr, incl, bthr, bscale, step)
                    # the sign of x / eff is x's (eff > 0), -0.0 included
                    neg = 1 if np.float32(np.copysign(np.float32(1.0), xv)) < zero else 0
                    codes[r, c0 + t] = np.uint8(m | (neg << sign_shift))


def supports(plan: Plan, shape: tuple[int, ...]) -> bool:
    """Whether :func:`mse_float_codes_and_scales` covers data of ``shape`` under ``plan``.

    E2M1, E4M3 and E5M2 values in symmetric mode with 1-D blocks along the last axis: one level
    with round-up or OCP scales of any dtype, or two levels (round-up block scales under a global).
    """
    scheme = plan.scheme
    if numba is None or plan.value not in _VALUES or scheme.mode is not QuantMode.SYMMETRIC:
        return False
    if scheme.scale_rule not in ("round_up", "ocp") or (plan.two_level and scheme.scale_rule != "round_up"):
        return False
    if not shape:
        return False
    dims = plan.block_dims(shape)
    return bool(dims) and all(d == 1 for d in dims[:-1])


def _global(x2: np.ndarray, plan: Plan) -> np.float32 | None:
    """MinMax's two-level global (``kernels/qparams.py``'s ``global_scale``), or None for non-finite data.

    The largest block scale is ``max|x| / (span / 2)``: division by a positive constant is monotone.
    """
    f32 = np.float32
    amax = f32(np.max(np.abs(x2)))
    if not np.isfinite(amax):
        return None
    s_max = f32(amax / f32(plan.value.span / 2))
    return f32(max(f32(s_max / f32(plan.scale_dtype.max)), f32(F32_TINY)))


def mse_float_codes_and_scales(
    x: np.ndarray,
    plan: Plan,
    factors: tuple[float, ...],
    norm: float,
    importance: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """uint8 codes, stored f32 scales and the two-level global of an MSE search, or None.

    Parameters
    ----------
    x : numpy.ndarray
        float32 or float16 data, at least 1-d.
    plan : Plan
        The validated scheme (see :func:`supports`).
    factors : tuple of float
        The candidates as f32 multipliers of ``max|x|`` (``CalSpec.factors``), in order of preference.
    norm : float
        The error exponent ``p`` (``CalSpec.norm``).
    importance : numpy.ndarray, optional
        The f32 per-column weights as the invariant layer returns them (scaled to a maximum of 1).

    Returns
    -------
    (codes, scales, global) or None
        Codes as the portable encoder writes them (sign in the field's top bit, ``x``'s shape),
        scales on the scale grid, and the ``(1,)`` f32 global of a two-level scheme (else None).
        None where the kernel does not apply or the data holds NaN or infinity: the caller then
        runs the portable path, which reports it.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float16):
        return None
    shape = tuple(int(n) for n in x.shape)
    if not supports(plan, shape):
        return None
    b = plan.block_dims(shape)[-1]
    x2 = np.ascontiguousarray(x.reshape(-1, shape[-1]), dtype=np.float32)
    rows, cols = x2.shape
    nb = -(-cols // b)
    two_level = bool(plan.two_level)
    glob = np.float32(1.0)
    if two_level:
        g = _global(x2, plan)
        if g is None:
            return None
        glob = g
    fmt = FORMATS[plan.value]
    e2m1 = plan.value is QuantValue.E2M1
    bthr = np.asarray([2.0**e for e in range(fmt.emin + 1, fmt.emax + 1)], dtype=np.float32)
    bscale = np.asarray([2.0 ** (fmt.mbits - fmt.emin - k) for k in range(fmt.emax - fmt.emin + 1)], np.float32)
    # magnitudes only (the positive half of the table): codes below the sign bit
    dtab = np.asarray(decode_table(plan.value)[: fmt.sign_bit], dtype=np.float32)
    mode, mant, ptab = norm_tables(norm)
    has_w = importance is not None
    w = np.ascontiguousarray(importance, dtype=np.float32) if has_w else np.ones(1, np.float32)
    codes = np.empty((rows, cols), dtype=np.uint8)
    scales = np.empty((rows, nb), dtype=np.float32)
    bad = np.zeros(rows, dtype=np.bool_)
    with _LAUNCH:
        _search(
            x2,
            b,
            np.asarray(factors, dtype=np.float32),
            np.float32(plan.value.span / 2),
            glob,
            two_level,
            plan.scheme.scale_rule == "ocp",
            np.float32(2.0**-fmt.emax),
            _round_up_tables(plan.scale_dtype),
            _round_up_tables(ScaleDtype.UE8M0),
            e2m1,
            np.float32(fmt.max),
            _E2M1_THR,
            _E2M1_INCL,
            bthr,
            bscale,
            1 << fmt.mbits,
            dtab,
            fmt.bits - 1,
            mode,
            mant,
            ptab,
            w,
            has_w,
            codes,
            scales,
            bad,
        )
    if bad.any():
        return None
    g_out = np.reshape(glob, (1,)).astype(np.float32) if two_level else None
    return codes.reshape(shape), scales.reshape((*shape[:-1], nb)), g_out
