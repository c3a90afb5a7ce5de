"""llama.cpp's K-quant and IQ4 quantizers (ggml-quants.c), step for step in Numba: GGUF's bytes, bit for bit.

``llama-quantize`` writes every block through ``ggml_quantize_chunk``, which calls scalar C loops
on the host in f32: ``quantize_row_q4_K_ref`` and friends without an importance matrix,
``quantize_row_q4_K_impl`` and friends with one (``quant_weights``). Their bytes depend on the
order of every f32 operation (running sums, the searches ``make_qx_quants``, ``make_q3_quants``,
``make_qkx2_quants``, ``make_qkx3_quants``, ``make_qp_quants``), so each function here repeats its
C twin in the same order, in f32, with no ``fastmath`` (which would reorder and contract them):

- ``Q2_K``, ``Q3_K``, ``Q4_K``, ``Q5_K``, ``Q6_K``: the reference quantizers and the imatrix ones;
- ``IQ4_NL``, ``IQ4_XS``: ``quantize_iq4_nl`` / ``quantize_iq4_xs`` (the ``ntry = 7`` search that
  ``ggml_quantize_chunk`` runs, with or without an imatrix);
- ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1`` with an imatrix (``quantize_row_q4_0_impl`` ...): the
  searches llama-quantize runs for them when it has an importance matrix (without one they are
  :mod:`arrayquant.fused.ggml_reference`'s).

Where the C converts, so does the port: a float ``nearest_int`` result stored into ``uint8_t`` or
``int8_t`` keeps its low byte (``& 0xFF``), ``nearest_int`` itself reads the bits of
``x + 12582912.0f`` (so its value past ``|x| > 4194303``, where an assert is compiled out, is that
of the C too: NaN gives 0), and ``GGML_FP32_TO_FP16`` rounds to nearest even. A result does not
depend on the C compiler's choices as long as it does not contract ``a * b + c`` into one fused
multiply-add: the oracle in the tests is ggml compiled for the baseline x86-64 (no FMA), as
llama.cpp's portable builds are (``GGML_NATIVE=OFF``).

Each row of a tensor is independent; rows run in parallel (``prange``), each row's work fixed, so
the bytes do not depend on the thread count. The importance matrix of a tensor is one weight per
column (``quant_weights`` of ``n_per_row``), the same for every row.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backends import shim
from ..errors import BackendUnavailableError, ShapeError
from ..invariants import check_finite
from . import ggml_blocks
from .numba_launch import launch, numba, parallel_and_serial

__all__ = ["IMATRIX_ONLY", "TYPES", "quantize_host", "quantize_host_bytes", "quantize_rows"]

QK_K = 256
# the types ported here for their imatrix search alone (their reference quantizer is ggml_reference's)
_LEGACY_SIZES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24)}
IMATRIX_ONLY = frozenset(_LEGACY_SIZES)
# GGUF type -> (elements per block, bytes per block, kernel number): the numbers _row dispatches on,
# in this order (Q2_K ... Q6_K, IQ4_NL, IQ4_XS, then Q4_0 ... Q5_1)
TYPES: dict[str, tuple[int, int, int]] = {
    name: (*sizes, kind) for kind, (name, sizes) in enumerate({**ggml_blocks.KTYPES, **_LEGACY_SIZES}.items())
}
KVALUES_IQ4NL = ggml_blocks.KVALUES_IQ4NL.astype(np.int8)

_KERNELS: tuple[Any, Any] | None = None

if numba is not None:
    import llvmlite.ir
    import numba.extending

    f32 = np.float32
    # error_model="numpy": x / 0.0 is infinity (or NaN) as in C, not a ZeroDivisionError
    njit = numba.njit(cache=True, nogil=True, error_model="numpy")
    eps = f32(1e-15)  # GROUP_MAX_EPS
    magic = f32(12582912.0)

    @numba.extending.intrinsic
    def _bits(typingctx, f):
        """The bits of an f32 as an int32 (C's ``memcpy(&i, &f, 4)``); f32 only, so a stray f64 fails to compile."""
        if f != numba.types.float32:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], llvmlite.ir.IntType(32))

        return numba.types.int32(numba.types.float32), codegen

    @njit
    def nearest_int(fval):
        """ggml's ``nearest_int``: the low mantissa bits of ``fval + 12582912.0f``, read as the C reads them
        (so past ``|fval| > 4194303``, where its assert is compiled out, the value is the C's too)."""
        return np.int64(_bits(fval + magic) & 0x007FFFFF) - 0x00400000

    @njit
    def f16_round(f):
        """``GGML_FP32_TO_FP16`` (nearest even): the f16 bits and the value ``GGML_FP16_TO_FP32`` gives back."""
        a = abs(float(f))
        sign = 0x8000 if math.copysign(1.0, float(f)) < 0 else 0
        if a != a:
            return sign | 0x7E00, f32(np.nan)
        if a >= 65520.0:
            return sign | 0x7C00, f32(math.copysign(np.inf, float(f)))
        if a < 6.103515625e-05:  # 2**-14: a subnormal (or zero) f16
            q = np.rint(a * 16777216.0)
            return sign | int(q), f32(math.copysign(q / 16777216.0, float(f)))
        mant, ex = math.frexp(a)
        e = ex - 1
        q = np.rint((mant * 2.0 - 1.0) * 1024.0)
        if q == 1024.0:
            e += 1
            q = 0.0
        value = (1.0 + q / 1024.0) * 2.0**e
        return sign | ((e + 15) << 10) | int(q), f32(math.copysign(value, float(f)))

    @njit
    def put_f16(out, o, f):
        """Store ``GGML_FP32_TO_FP16(f)`` little-endian at ``out[o:o + 2]``; the f32 value it holds."""
        bits, value = f16_round(f)
        out[o] = bits & 0xFF
        out[o + 1] = (bits >> 8) & 0xFF
        return value

    @njit
    def _signed_max(n, x, xo):
        """The first value of largest magnitude among ``x[xo:xo + n]``, and that magnitude."""
        mx = f32(0.0)
        amax = f32(0.0)
        for i in range(n):
            ax = abs(x[xo + i])
            if ax > amax:
                amax = ax
                mx = x[xo + i]
        return mx, amax

    @njit
    def _signed_sums(n, nmax, x, xo, iscale, qw, qo, has_qw, L, Lo, shift, store):
        """Levels ``nearest_int(iscale * x)`` in ``[-nmax, nmax)`` (kept in ``L`` plus ``shift`` where
        ``store``) and their sums ``w x l`` and ``w l l``, ``w`` the imatrix weight or ``x * x``."""
        sumlx = f32(0.0)
        suml2 = f32(0.0)
        for i in range(n):
            xi = x[xo + i]
            lv = max(-nmax, min(nmax - 1, nearest_int(iscale * xi)))
            if store:
                L[Lo + i] = lv + shift
            w = qw[qo + i] if has_qw else xi * xi
            fl = f32(lv)
            sumlx += w * xi * fl
            suml2 += w * fl * fl
        return sumlx, suml2

    @njit
    def make_qx_quants(n, nmax, x, xo, L, Lo, qw, qo, has_qw):
        """``make_qx_quants(n, nmax, x, L, 1, qw)``: every call ported here passes ``rmse_type = 1``."""
        mx, amax = _signed_max(n, x, xo)
        if amax < eps:
            for i in range(n):
                L[Lo + i] = 0
            return f32(0.0)
        iscale = f32(-nmax) / mx
        sumlx, suml2 = _signed_sums(n, nmax, x, xo, iscale, qw, qo, has_qw, L, Lo, nmax, True)
        scale = sumlx / suml2 if suml2 != f32(0.0) else f32(0.0)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(f32(nmax) + f32(0.1) * f32(step)) / mx
            sumlx, suml2 = _signed_sums(n, nmax, x, xo, iscale, qw, qo, has_qw, L, Lo, nmax, False)
            if suml2 > f32(0.0) and sumlx * sumlx > best * suml2:
                for i in range(n):
                    L[Lo + i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[xo + i])))
                scale = sumlx / suml2
                best = scale * sumlx
        return scale

    @njit
    def make_q3_quants(n, nmax, x, xo, L, Lo):
        """``make_q3_quants(n, nmax, x, L, true)``."""
        mx, amax = _signed_max(n, x, xo)
        if amax < eps:
            for i in range(n):
                L[Lo + i] = 0
            return f32(0.0)
        iscale = f32(-nmax) / mx
        sumlx, suml2 = _signed_sums(n, nmax, x, xo, iscale, x, 0, False, L, Lo, 0, True)
        for _ in range(5):
            changed = 0
            for i in range(n):
                xi = x[xo + i]
                w = xi * xi
                li = f32(L[Lo + i])
                slx = sumlx - w * xi * li
                if slx > f32(0.0):
                    sl2 = suml2 - w * li * li
                    new_l = nearest_int(xi * sl2 / slx)
                    new_l = max(-nmax, min(nmax - 1, new_l))
                    if new_l != L[Lo + i]:
                        fn = f32(new_l)
                        slx += w * xi * fn
                        sl2 += w * fn * fn
                        if sl2 > f32(0.0) and slx * slx * suml2 > sumlx * sumlx * sl2:
                            L[Lo + i] = new_l
                            sumlx = slx
                            suml2 = sl2
                            changed += 1
            if changed == 0:
                break
        for i in range(n):
            L[Lo + i] += nmax
        return sumlx / suml2 if suml2 > f32(0.0) else f32(0.0)

    @njit
    def _error(n, scale, mn, x, xo, w, wo, L, Lo, use_mad):
        """The weighted absolute (``use_mad``) or squared error of levels ``L`` at ``scale`` and ``mn``."""
        err = f32(0.0)
        if use_mad:
            for i in range(n):
                err += w[wo + i] * abs(scale * f32(L[Lo + i]) + mn - x[xo + i])
        else:
            for i in range(n):
                diff = scale * f32(L[Lo + i]) + mn - x[xo + i]
                err += w[wo + i] * (diff * diff)
        return err

    @njit
    def make_qkx(n, nmax, x, xo, w, wo, L, Lo, Laux, rmin, rdelta, nstep, use_mad, strict):
        """``make_qkx2_quants`` (``strict``: ``max == min`` is flat) or ``make_qkx3_quants`` with
        weights (``max <= min``): the scale and ``the_min``."""
        mn = x[xo]
        mx = x[xo]
        sum_w = w[wo]
        sum_x = sum_w * x[xo]
        for i in range(1, n):
            xi = x[xo + i]
            if xi < mn:
                mn = xi
            if xi > mx:
                mx = xi
            wi = w[wo + i]
            sum_w += wi
            sum_x += wi * xi
        if mn > f32(0.0):
            mn = f32(0.0)
        flat = mx == mn if strict else mx <= mn
        if flat:
            for i in range(n):
                L[Lo + i] = 0
            return f32(0.0), -mn
        iscale = f32(nmax) / (mx - mn)
        scale = f32(1.0) / iscale
        for i in range(n):
            L[Lo + i] = max(0, min(nmax, nearest_int(iscale * (x[xo + i] - mn))))
        best_error = _error(n, scale, mn, x, xo, w, wo, L, Lo, use_mad)
        if nstep < 1:
            return scale, -mn
        for step in range(nstep + 1):
            iscale = (rmin + rdelta * f32(step) + f32(nmax)) / (mx - mn)
            sum_l = f32(0.0)
            sum_l2 = f32(0.0)
            sum_xl = f32(0.0)
            for i in range(n):
                xi = x[xo + i]
                lv = nearest_int(iscale * (xi - mn))
                lv = max(0, min(nmax, lv))
                Laux[i] = lv
                wi = w[wo + i]
                fl = f32(lv)
                sum_l += wi * fl
                sum_l2 += wi * fl * fl
                sum_xl += wi * fl * xi
            big_d = sum_w * sum_l2 - sum_l * sum_l
            if big_d > f32(0.0):
                this_scale = (sum_w * sum_xl - sum_x * sum_l) / big_d
                this_min = (sum_l2 * sum_x - sum_l * sum_xl) / big_d
                if this_min > f32(0.0):
                    this_min = f32(0.0)
                    this_scale = sum_xl / sum_l2
                cur_error = _error(n, this_scale, this_min, x, xo, w, wo, Laux, 0, use_mad)
                if cur_error < best_error:
                    for i in range(n):
                        L[Lo + i] = Laux[i]
                    best_error = cur_error
                    scale = this_scale
                    mn = this_min
        return scale, -mn

    @njit
    def make_qp_quants(n, nmax, x, L, qw):
        """``make_qp_quants``: non-negative levels for the sub-block scales or mins (stored as ``uint8_t``)."""
        mx = f32(0.0)
        for i in range(n):
            mx = max(mx, x[i])
        if mx < eps:
            for i in range(n):
                L[i] = 0
            return f32(0.0)
        iscale = f32(nmax) / mx
        for i in range(n):
            L[i] = nearest_int(iscale * x[i]) & 0xFF
        scale = f32(1.0) / iscale
        best_mse = f32(0.0)
        for i in range(n):
            diff = x[i] - scale * f32(L[i])
            best_mse += qw[i] * diff * diff
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (f32(0.1) * f32(step) + f32(nmax)) / mx
            scale_is = f32(1.0) / iscale_is
            mse = f32(0.0)
            for i in range(n):
                lv = min(nmax, nearest_int(iscale_is * x[i]))
                diff = x[i] - scale_is * f32(lv)
                mse += qw[i] * diff * diff
            if mse < best_mse:
                best_mse = mse
                iscale = iscale_is
        sumlx = f32(0.0)
        suml2 = f32(0.0)
        for i in range(n):
            lv = min(nmax, nearest_int(iscale * x[i]))
            L[i] = lv & 0xFF
            fl = f32(lv)
            sumlx += qw[i] * x[i] * fl
            suml2 += qw[i] * fl * fl
        for _ in range(5):
            changed = 0
            for i in range(n):
                w = qw[i]
                li = f32(L[i])
                slx = sumlx - w * x[i] * li
                sl2 = suml2 - w * li * li
                if slx > f32(0.0) and sl2 > f32(0.0):
                    new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                    if new_l != L[i]:
                        fn = f32(new_l)
                        slx += w * x[i] * fn
                        sl2 += w * fn * fn
                        if slx * slx * suml2 > sumlx * sumlx * sl2:
                            L[i] = new_l & 0xFF
                            sumlx = slx
                            suml2 = sl2
                            changed += 1
            if changed == 0:
                break
        return sumlx / suml2 if suml2 > f32(0.0) else f32(0.0)

    @njit
    def best_index(values, x):
        """``best_index_int8(16, values, x)``."""
        if x <= f32(values[0]):
            return 0
        if x >= f32(values[15]):
            return 15
        ml = 0
        mu = 15
        while mu - ml > 1:
            mav = (ml + mu) // 2
            if x < f32(values[mav]):
                mu = mav
            else:
                ml = mav
        return mu - 1 if x - f32(values[mu - 1]) < f32(values[mu]) - x else mu

    @njit
    def pack_2bit(L, out, o):
        """``qs[j/4 + l] = L[j + l] | L[j + l + 32] << 2 | ...`` over the 256 levels of a super-block."""
        for j in range(0, QK_K, 128):
            for lv in range(32):
                out[o + j // 4 + lv] = (
                    L[j + lv] | (L[j + lv + 32] << 2) | (L[j + lv + 64] << 4) | (L[j + lv + 96] << 6)
                ) & 0xFF

    @njit
    def scale_min_k4(j, out, so):
        """``get_scale_min_k4``: the 6-bit scale and min of sub-block ``j`` from the 12 scale bytes at ``so``."""
        if j < 4:
            return np.int64(out[so + j]) & 63, np.int64(out[so + j + 4]) & 63
        d = (np.int64(out[so + j + 4]) & 0xF) | ((np.int64(out[so + j - 4]) >> 6) << 4)
        m = (np.int64(out[so + j + 4]) >> 4) | ((np.int64(out[so + j]) >> 6) << 4)
        return d, m

    @njit
    def put_scales_k4(ls, lm, out, so):
        """The 6-bit scales and mins of 8 sub-blocks into 12 bytes, as the C packs them."""
        for j in range(8):
            a = ls[j] & 0xFF
            b = lm[j] & 0xFF
            if j < 4:
                out[so + j] = a
                out[so + j + 4] = b
            else:
                out[so + j + 4] = ((a & 0xF) | ((b & 0xF) << 4)) & 0xFF
                out[so + j - 4] = (np.int64(out[so + j - 4]) | ((a >> 4) << 6)) & 0xFF
                out[so + j] = (np.int64(out[so + j]) | ((b >> 4) << 6)) & 0xFF

    # -- Q2_K ------------------------------------------------------------------------------------
    @njit
    def q2_k(x, xo, qw, qo, has_qw, out, o, L, Laux, w, scales, mins, sw, Ls, Lm):
        for j in range(16):
            scales[j] = f32(0.0)
        if not has_qw:  # quantize_row_q2_K_ref
            max_scale = f32(0.0)
            max_min = f32(0.0)
            for j in range(16):
                for lv in range(16):
                    w[lv] = abs(x[xo + 16 * j + lv])
                s, m = make_qkx(16, 3, x, xo + 16 * j, w, 0, L, 16 * j, Laux, f32(-0.5), f32(0.1), 15, True, True)
                scales[j] = s
                mins[j] = m
                if s > max_scale:
                    max_scale = s
                if m > max_min:
                    max_min = m
            if max_scale > f32(0.0):
                iscale = f32(15.0) / max_scale
                for j in range(16):
                    out[o + j] = nearest_int(iscale * scales[j]) & 0xFF
                dv = put_f16(out, o + 80, max_scale / f32(15.0))
            else:
                for j in range(16):
                    out[o + j] = 0
                dv = put_f16(out, o + 80, f32(0.0))
            if max_min > f32(0.0):
                iscale = f32(15.0) / max_min
                for j in range(16):
                    out[o + j] = (np.int64(out[o + j]) | (nearest_int(iscale * mins[j]) << 4)) & 0xFF
                mv = put_f16(out, o + 82, max_min / f32(15.0))
            else:
                mv = put_f16(out, o + 82, f32(0.0))
        else:  # quantize_row_q2_K_impl
            sumx2 = f32(0.0)
            for j in range(QK_K):
                sumx2 += x[xo + j] * x[xo + j]
            sigma2 = sumx2 / f32(QK_K)
            for j in range(16):
                sw[j] = f32(0.0)
                for lv in range(16):
                    xv = x[xo + 16 * j + lv]
                    w[lv] = qw[qo + 16 * j + lv] * np.sqrt(sigma2 + xv * xv)
                for lv in range(16):
                    sw[j] += w[lv]
                s, m = make_qkx(16, 3, x, xo + 16 * j, w, 0, L, 16 * j, Laux, f32(-0.9), f32(0.05), 36, False, False)
                scales[j] = s
                mins[j] = m
            dm = make_qp_quants(16, 15, scales, Ls, sw)
            mm = make_qp_quants(16, 15, mins, Lm, sw)
            dv = put_f16(out, o + 80, dm)
            mv = put_f16(out, o + 82, mm)
            for j in range(16):
                out[o + j] = (Ls[j] | (Lm[j] << 4)) & 0xFF
        for j in range(16):
            d = dv * f32(np.int64(out[o + j]) & 0xF)
            if d == f32(0.0):
                continue
            dm = mv * f32(np.int64(out[o + j]) >> 4)
            for ii in range(16):
                lv = nearest_int((x[xo + 16 * j + ii] + dm) / d)
                L[16 * j + ii] = max(0, min(3, lv))
        pack_2bit(L, out, o + 16)

    # -- Q3_K ------------------------------------------------------------------------------------
    @njit
    def q3_sc(out, o, j):
        """The signed 6-bit scale of sub-block ``j`` from the 12 scale bytes at ``o``."""
        sc = np.int64(out[o + j]) & 0xF if j < 8 else np.int64(out[o + j - 8]) >> 4
        return (sc | (((np.int64(out[o + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32

    @njit
    def q3_k(x, xo, qw, qo, has_qw, out, o, L, w, scales, sw, Ls):
        so = o + 96
        for j in range(12):
            out[so + j] = 0
        if not has_qw:  # quantize_row_q3_K_ref
            max_scale = f32(0.0)
            amax = f32(0.0)
            for j in range(16):
                scales[j] = make_q3_quants(16, 4, x, xo + 16 * j, L, 16 * j)
                s = abs(scales[j])
                if s > amax:
                    amax = s
                    max_scale = scales[j]
            if max_scale != f32(0.0):
                iscale = f32(-32.0) / max_scale
                for j in range(16):
                    lv = nearest_int(iscale * scales[j])
                    lv = (lv + 128) % 256 - 128  # int8_t l = nearest_int(...)
                    lv = max(-32, min(31, lv)) + 32
                    Ls[j] = lv
                dv = put_f16(out, o + 108, f32(1.0) / iscale)
            else:
                for j in range(16):
                    Ls[j] = -1
                dv = put_f16(out, o + 108, f32(0.0))
        else:  # quantize_row_q3_K_impl
            sumx2 = f32(0.0)
            for j in range(QK_K):
                sumx2 += x[xo + j] * x[xo + j]
            sigma2 = f32(2.0) * sumx2 / f32(QK_K)
            for j in range(16):
                for lv in range(16):
                    xv = x[xo + 16 * j + lv]
                    w[lv] = qw[qo + 16 * j + lv] * np.sqrt(sigma2 + xv * xv)
                sumw = f32(0.0)
                for lv in range(16):
                    sumw += w[lv]
                sw[j] = sumw
                scales[j] = make_qx_quants(16, 4, x, xo + 16 * j, L, 16 * j, w, 0, True)
            d_block = make_qx_quants(16, 32, scales, 0, Ls, 0, sw, 0, True)
            dv = put_f16(out, o + 108, d_block)
        if Ls[0] >= 0:  # the scales were set (the reference leaves them 0 for an all-zero super-block)
            for j in range(16):
                lv = Ls[j]
                if j < 8:
                    out[so + j] = lv & 0xF
                else:
                    out[so + j - 8] = (np.int64(out[so + j - 8]) | ((lv & 0xF) << 4)) & 0xFF
                lv >>= 4
                out[so + j % 4 + 8] = (np.int64(out[so + j % 4 + 8]) | (lv << (2 * (j // 4)))) & 0xFF
        for j in range(16):
            d = dv * f32(q3_sc(out, so, j))
            if d == f32(0.0):
                continue
            for ii in range(16):
                lv = nearest_int(x[xo + 16 * j + ii] / d)
                L[16 * j + ii] = max(-4, min(3, lv)) + 4
        for j in range(32):
            out[o + j] = 0
        m = 0
        hm = 1
        for j in range(QK_K):
            if L[j] > 3:
                out[o + m] = (np.int64(out[o + m]) | hm) & 0xFF
                L[j] -= 4
            m += 1
            if m == 32:
                m = 0
                hm <<= 1
        pack_2bit(L, out, o + 32)

    # -- Q4_K and Q5_K ---------------------------------------------------------------------------
    @njit
    def q45_k(x, xo, qw, qo, has_qw, out, o, nmax, L, Laux, w, scales, mins, sw, Ls, Lm):
        five = nmax == 31
        if not has_qw:  # quantize_row_q4_K_ref / quantize_row_q5_K_ref
            max_scale = f32(0.0)
            max_min = f32(0.0)
            for j in range(8):
                sum_x2 = f32(0.0)
                for lv in range(32):
                    sum_x2 += x[xo + 32 * j + lv] * x[xo + 32 * j + lv]
                av_x = np.sqrt(sum_x2 / f32(32.0))
                for lv in range(32):
                    w[lv] = av_x + abs(x[xo + 32 * j + lv])
                rmin = f32(-0.5) if five else f32(-1.0)
                nstep = 15 if five else 20
                s, m = make_qkx(32, nmax, x, xo + 32 * j, w, 0, L, 32 * j, Laux, rmin, f32(0.1), nstep, False, True)
                scales[j] = s
                mins[j] = m
                if s > max_scale:
                    max_scale = s
                if m > max_min:
                    max_min = m
            inv_scale = f32(63.0) / max_scale if max_scale > f32(0.0) else f32(0.0)
            inv_min = f32(63.0) / max_min if max_min > f32(0.0) else f32(0.0)
            for j in range(8):
                Ls[j] = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
                Lm[j] = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
            dv = put_f16(out, o, max_scale / f32(63.0))
            mv = put_f16(out, o + 2, max_min / f32(63.0))
        else:  # quantize_row_q4_K_impl / quantize_row_q5_K_impl
            sum_x2 = f32(0.0)
            for lv in range(QK_K):
                sum_x2 += x[xo + lv] * x[xo + lv]
            sigma2 = f32(2.0) * sum_x2 / f32(QK_K)
            for j in range(8):
                for lv in range(32):
                    xv = x[xo + 32 * j + lv]
                    w[lv] = qw[qo + 32 * j + lv] * np.sqrt(sigma2 + xv * xv)
                sumw = f32(0.0)
                for lv in range(32):
                    sumw += w[lv]
                sw[j] = sumw
                s, m = make_qkx(32, nmax, x, xo + 32 * j, w, 0, L, 32 * j, Laux, f32(-0.9), f32(0.05), 36, False, False)
                scales[j] = s
                mins[j] = m
            d_block = make_qp_quants(8, 63, scales, Ls, sw)
            m_block = make_qp_quants(8, 63, mins, Lm, sw)
            if five:
                for j in range(8):
                    Ls[j] = min(63, Ls[j])
                    Lm[j] = min(63, Lm[j])
            dv = put_f16(out, o, d_block)
            mv = put_f16(out, o + 2, m_block)
        put_scales_k4(Ls, Lm, out, o + 4)
        for j in range(8):
            sc, mlev = scale_min_k4(j, out, o + 4)
            d = dv * f32(sc)
            if d == f32(0.0):
                continue
            dm = mv * f32(mlev)
            for ii in range(32):
                lv = nearest_int((x[xo + 32 * j + ii] + dm) / d)
                L[32 * j + ii] = max(0, min(nmax, lv))
        if not five:
            q = o + 16
            for j in range(0, QK_K, 64):
                for lv in range(32):
                    out[q + lv] = (L[j + lv] | (L[j + lv + 32] << 4)) & 0xFF
                q += 32
            return
        qh = o + 16
        ql = o + 48
        for j in range(32):
            out[qh + j] = 0
        m1 = 1
        m2 = 2
        for n in range(0, QK_K, 64):
            for j in range(32):
                l1 = L[n + j]
                if l1 > 15:
                    l1 -= 16
                    out[qh + j] = (np.int64(out[qh + j]) | m1) & 0xFF
                l2 = L[n + j + 32]
                if l2 > 15:
                    l2 -= 16
                    out[qh + j] = (np.int64(out[qh + j]) | m2) & 0xFF
                out[ql + j] = (l1 | (l2 << 4)) & 0xFF
            m1 <<= 2
            m2 <<= 2
            ql += 32

    # -- Q6_K ------------------------------------------------------------------------------------
    @njit
    def q6_k(x, xo, qw, qo, has_qw, out, o, L, scales):
        max_scale = f32(0.0)
        max_abs_scale = f32(0.0)
        for ib in range(16):
            scale = make_qx_quants(16, 32, x, xo + 16 * ib, L, 16 * ib, qw, qo + 16 * ib, has_qw)
            scales[ib] = scale
            a = abs(scale)
            if a > max_abs_scale:
                max_abs_scale = a
                max_scale = scale
        if max_abs_scale < eps:
            for j in range(210):
                out[o + j] = 0
            return
        iscale = f32(-128.0) / max_scale
        dv = put_f16(out, o + 208, f32(1.0) / iscale)
        for ib in range(16):
            out[o + 192 + ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF
        for j in range(16):
            sc = np.int64(out[o + 192 + j])
            sc = sc - 256 if sc > 127 else sc
            d = dv * f32(sc)
            if d == f32(0.0):
                continue
            for ii in range(16):
                lv = nearest_int(x[xo + 16 * j + ii] / d)
                L[16 * j + ii] = max(-32, min(31, lv)) + 32
        ql = o
        qh = o + 128
        for j in range(0, QK_K, 128):
            for lv in range(32):
                q1 = L[j + lv] & 0xF
                q2 = L[j + lv + 32] & 0xF
                q3 = L[j + lv + 64] & 0xF
                q4 = L[j + lv + 96] & 0xF
                out[ql + lv] = q1 | (q3 << 4)
                out[ql + lv + 32] = q2 | (q4 << 4)
                h = (L[j + lv] >> 4) | ((L[j + lv + 32] >> 4) << 2) | ((L[j + lv + 64] >> 4) << 4)
                out[qh + lv] = (h | ((L[j + lv + 96] >> 4) << 6)) & 0xFF
            ql += 64
            qh += 32

    # -- IQ4_NL and IQ4_XS -----------------------------------------------------------------------
    @njit
    def iq4(x, xo, qw, qo, has_qw, out, o, super_size, L, w, scales, values):
        """``quantize_row_iq4_nl_impl`` with ``ntry = 7`` (as ``quantize_iq4_nl`` / ``quantize_iq4_xs`` call it)."""
        ntry = 7
        nb = super_size // 32
        sigma2 = f32(0.0)
        for j in range(super_size):
            sigma2 += x[xo + j] * x[xo + j]
        sigma2 *= f32(2.0) / f32(super_size)
        q4 = o + (2 if nb == 1 else 8)
        for j in range(super_size // 2):
            out[q4 + j] = 0
        out[o] = 0
        out[o + 1] = 0
        max_scale = f32(0.0)
        amax_scale = f32(0.0)
        v0 = f32(values[0])
        for ib in range(nb):
            xb = xo + 32 * ib
            for j in range(32):
                xv = x[xb + j]
                w[j] = qw[qo + 32 * ib + j] * np.sqrt(sigma2 + xv * xv) if has_qw else xv * xv
            amax = f32(0.0)
            mx = f32(0.0)
            for j in range(32):
                ax = abs(x[xb + j])
                if ax > amax:
                    amax = ax
                    mx = x[xb + j]
            if amax < eps:
                scales[ib] = f32(0.0)
                continue
            d = -mx / v0
            id_ = f32(1.0) / d
            sumqx = f32(0.0)
            sumq2 = f32(0.0)
            for j in range(32):
                al = id_ * x[xb + j]
                lv = best_index(values, al)
                L[32 * ib + j] = lv
                q = f32(values[lv])
                sumqx += w[j] * q * x[xb + j]
                sumq2 += w[j] * q * q
            d = sumqx / sumq2 if sumq2 > f32(0.0) else f32(0.0)
            best = d * sumqx
            for itry in range(-ntry, ntry + 1):
                id_ = f32(itry + values[0]) / mx
                sumqx = f32(0.0)
                sumq2 = f32(0.0)
                for j in range(32):
                    al = id_ * x[xb + j]
                    q = f32(values[best_index(values, al)])
                    sumqx += w[j] * q * x[xb + j]
                    sumq2 += w[j] * q * q
                if sumq2 > f32(0.0) and sumqx * sumqx > best * sumq2:
                    d = sumqx / sumq2
                    best = d * sumqx
            scales[ib] = d
            abs_d = abs(d)
            if abs_d > amax_scale:
                amax_scale = abs_d
                max_scale = d
        if nb > 1:
            out[o + 2] = 0
            out[o + 3] = 0
            for j in range(nb // 2):
                out[o + 4 + j] = 0
            d = -max_scale / f32(32.0)
            put_f16(out, o, d)
            id_ = f32(1.0) / d if d != f32(0.0) else f32(0.0)
            scales_h = 0
            for ib in range(nb):
                lv = nearest_int(id_ * scales[ib])
                lv = max(-32, min(31, lv))
                dl = d * f32(lv)
                idl = f32(1.0) / dl if dl != f32(0.0) else f32(0.0)
                for j in range(32):
                    L[32 * ib + j] = best_index(values, idl * x[xo + 32 * ib + j])
                lv += 32
                l_l = lv & 0xF
                l_h = lv >> 4
                if ib % 2 == 0:
                    out[o + 4 + ib // 2] = l_l
                else:
                    out[o + 4 + ib // 2] = (np.int64(out[o + 4 + ib // 2]) | (l_l << 4)) & 0xFF
                scales_h |= l_h << (2 * (ib % 8))
            out[o + 2] = scales_h & 0xFF
            out[o + 3] = (scales_h >> 8) & 0xFF
        else:
            put_f16(out, o, scales[0])
            id_ = f32(1.0) / scales[0] if scales[0] != f32(0.0) else f32(0.0)
            for j in range(super_size):
                L[j] = best_index(values, id_ * x[xo + j])
        for i in range(super_size // 32):
            for j in range(16):
                out[q4 + 16 * i + j] = (L[32 * i + j] | (L[32 * i + 16 + j] << 4)) & 0xFF

    # -- Q4_0, Q4_1, Q5_0, Q5_1 with an imatrix ---------------------------------------------------
    @njit
    def legacy(x, xo, qw, qo, out, o, kind, sigma2, L, Laux, w):
        """``quantize_row_q4_0_impl`` ... ``quantize_row_q5_1_impl`` for one block of 32 (``sigma2`` of the row)."""
        for j in range(32):
            xv = x[xo + j]
            w[j] = qw[qo + j] * np.sqrt(sigma2 + xv * xv)
        if kind == 7 or kind == 9:  # Q4_0, Q5_0: make_qx_quants
            nmax = 8 if kind == 7 else 16
            d = make_qx_quants(32, nmax, x, xo, L, 0, w, 0, True)
            put_f16(out, o, d)
            qs = o + 2 if kind == 7 else o + 6
        else:  # Q4_1, Q5_1: make_qkx3_quants
            nmax = 15 if kind == 8 else 31
            d, mn = make_qkx(32, nmax, x, xo, w, 0, L, 0, Laux, f32(-0.9), f32(0.05), 36, False, False)
            put_f16(out, o, d)
            put_f16(out, o + 2, -mn)
            qs = o + 4 if kind == 8 else o + 8
        for j in range(16):
            out[qs + j] = ((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4)) & 0xFF
        if kind == 9 or kind == 10:  # the fifth bits, element j at bit j of a little-endian uint32
            qh = 0
            for j in range(16):
                qh |= ((L[j] & 0x10) >> 4) << j
                qh |= ((L[j + 16] & 0x10) >> 4) << (j + 16)
            h = o + 2 if kind == 9 else o + 4
            for b in range(4):
                out[h + b] = (qh >> (8 * b)) & 0xFF

    @njit
    def _row(x, r, qw, has_qw, kind, out, L, Laux, w, scales, mins, sw, Ls, Lm, values):
        """One row: every block of it, in order."""
        cols = x.shape[1]
        xo = r * cols
        xr = x.reshape(-1)
        orow = out[r]
        if kind <= 4 or kind == 6:
            nsb = cols // QK_K
            size = orow.shape[0] // nsb
            for i in range(nsb):
                o = i * size
                bx = xo + i * QK_K
                qo = i * QK_K
                if kind == 0:
                    q2_k(xr, bx, qw, qo, has_qw, orow, o, L, Laux, w, scales, mins, sw, Ls, Lm)
                elif kind == 1:
                    q3_k(xr, bx, qw, qo, has_qw, orow, o, L, w, scales, sw, Ls)
                elif kind == 2:
                    q45_k(xr, bx, qw, qo, has_qw, orow, o, 15, L, Laux, w, scales, mins, sw, Ls, Lm)
                elif kind == 3:
                    q45_k(xr, bx, qw, qo, has_qw, orow, o, 31, L, Laux, w, scales, mins, sw, Ls, Lm)
                elif kind == 4:
                    q6_k(xr, bx, qw, qo, has_qw, orow, o, L, scales)
                else:
                    iq4(xr, bx, qw, qo, has_qw, orow, o, QK_K, L, w, scales, values)
            return
        nb = cols // 32
        size = orow.shape[0] // nb
        if kind == 5:
            for i in range(nb):
                iq4(xr, xo + 32 * i, qw, 32 * i, has_qw, orow, i * size, 32, L, w, scales, values)
            return
        sum_x2 = f32(0.0)  # Q4_0 ... Q5_1 with an imatrix: sigma2 over the whole row
        for j in range(cols):
            sum_x2 += xr[xo + j] * xr[xo + j]
        sigma2 = sum_x2 / f32(cols)
        for i in range(nb):
            legacy(xr, xo + 32 * i, qw, 32 * i, orow, i * size, kind, sigma2, L, Laux, w)

    def _rows(x, qw, has_qw, kind, out):
        """Every row of ``x`` (f32, C-contiguous) into ``out`` (uint8, one row of blocks per row)."""
        values = KVALUES_IQ4NL.copy()
        for r in numba.prange(x.shape[0]):
            L = np.zeros(QK_K, np.int32)
            Laux = np.zeros(32, np.int32)
            w = np.zeros(32, np.float32)
            scales = np.zeros(16, np.float32)
            mins = np.zeros(16, np.float32)
            sw = np.zeros(16, np.float32)
            Ls = np.zeros(16, np.int32)
            Lm = np.zeros(16, np.int32)
            _row(x, r, qw, has_qw, kind, out, L, Laux, w, scales, mins, sw, Ls, Lm, values)

    _KERNELS = parallel_and_serial(_rows, error_model="numpy")


def _kernels() -> tuple[Any, Any]:
    if _KERNELS is None:
        msg = (
            "llama.cpp's K-quant and IQ4 quantizers (and its imatrix searches) run as compiled kernels, which "
            "need numba: pip install numba (or arrayquant[fast])"
        )
        raise BackendUnavailableError(msg)
    return _KERNELS


def quantize_rows(x: np.ndarray, type_name: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """``ggml_quantize_chunk(type, x, ..., imatrix)``: the GGUF blocks of each row of ``x``, as uint8.

    Parameters
    ----------
    x : numpy.ndarray
        float32 rows ``(rows, cols)``; ``cols`` a whole number of the type's blocks. Finite values
        (callers check: llama.cpp's quantizers have no meaning for NaN).
    type_name : str
        One of :data:`TYPES`; the four legacy types only with an ``imatrix``.
    imatrix : numpy.ndarray, optional
        float32 ``(cols,)``: llama.cpp's importance of each column (``quant_weights``).

    Returns
    -------
    numpy.ndarray
        uint8 ``(rows, cols // block * bytes)``: the bytes ggml writes.

    Raises
    ------
    BackendUnavailableError
        numba is not installed.
    ShapeError
        Rows that are not whole blocks, or an imatrix of another length.
    """
    block, size, kind = TYPES[type_name]
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % block:
        msg = f"{type_name} quantizes rows of whole blocks of {block}; got shape {x.shape}"
        raise ShapeError(msg)
    if imatrix is None and type_name in IMATRIX_ONLY:
        msg = f"{type_name} without an imatrix is ggml_reference's quantizer; this port is its imatrix search"
        raise ShapeError(msg)
    if imatrix is not None:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if qw.shape[0] != x.shape[1]:
            msg = f"an imatrix has one weight per column: {x.shape[1]} here, got {qw.shape[0]}"
            raise ShapeError(msg)
    else:
        qw = np.zeros(1, np.float32)
    out = np.zeros((x.shape[0], x.shape[1] // block * size), np.uint8)
    if x.size:
        launch(_kernels(), x.size * 64, x, qw, imatrix is not None, kind, out)
    return out


def quantize_host_bytes(x: Any, type_name: str, imatrix: Any = None) -> np.ndarray:
    """The GGUF bytes of any backend's rows ``(..., cols)`` (f32 on the host, checked finite), as ggml writes
    them: uint8 ``(rows, bytes per row)``, with ``imatrix`` one weight per column or None."""
    with np.errstate(over="ignore"):
        host = np.asarray(shim.to_host(x)).astype(np.float32)
    check_finite(host, np)
    qw = None if imatrix is None else np.asarray(shim.to_host(imatrix), np.float32).reshape(-1)
    return quantize_rows(host.reshape(-1, host.shape[-1]), type_name, qw)


def quantize_host(x: Any, type_name: str, imatrix: np.ndarray | None = None) -> tuple[Any, Any, Any]:
    """Codes, f32 scales and offsets (or None) of any backend's floats (and imatrix), as ggml quantizes them.

    ``x`` is taken to f32 on the host and refused if not finite (ggml's C has no defined result
    there); its last axis holds whole blocks. ``imatrix`` is one weight per column (a vector) for
    every row, or one vector per matrix of a stacked ``(..., rows, cols)`` ``x`` (shape
    ``(..., 1, cols)`` or ``(..., cols)``), as llama-quantize gives each expert its own.
    Returned arrays are shaped ``(*x.shape[:-1], values)`` and ``(*x.shape[:-1], sub-blocks)``.
    """
    with np.errstate(over="ignore"):
        host = np.asarray(shim.to_host(x)).astype(np.float32)
    check_finite(host, np)
    shape = host.shape
    cols = shape[-1]
    block, size, _ = TYPES[type_name]
    mats = [host.reshape(-1, cols)]
    imats: list[np.ndarray | None] = [None]
    if imatrix is not None:
        w = np.asarray(shim.to_host(imatrix), np.float32)
        if w.ndim > 1 and host.ndim > 2:  # one vector per matrix of a stacked x
            lead = shape[:-2]
            w = w.reshape(*lead, cols)
            mats = list(host.reshape(-1, shape[-2], cols))
            imats = list(w.reshape(-1, cols))
        else:
            imats = [w.reshape(cols)]
    raw = np.concatenate([quantize_rows(m, type_name, q) for m, q in zip(mats, imats, strict=True)], axis=0)
    codes, scales, offsets = ggml_blocks.decode(type_name, raw.reshape(-1, size))
    lead = shape[:-1]
    per = cols // block
    out_codes = codes.reshape(*lead, cols)
    out_scales = scales.reshape(*lead, per * scales.shape[1])
    out_offsets = None if offsets is None else offsets.reshape(*lead, per * offsets.shape[1])
    return out_codes, out_scales, out_offsets
