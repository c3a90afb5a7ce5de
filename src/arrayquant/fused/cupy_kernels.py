"""Fused CuPy (CUDA) kernels of MinMax quantize and of dequantize: the Numba kernels' steps on a GPU.

**Off by default, unverified.** ``VERIFIED`` stays False until ``ci/gpu-check.sh`` has run
``tests/test_fused_cupy.py`` and the conformance suite with them on a GPU and found them equal bit
for bit; until then the portable path serves CuPy arrays unless ``ARRAYQUANT_FUSED_GPU=1``.

The same f32 operations in the same order as the portable path (``kernels/qparams.py``,
``roundup.py``, ``integer.py``, ``floating.py``, ``minifloat.py``, packing by ``storage.py``) and
as the Numba kernels (``numba_search_kernels._grid_up``, ``_code`` and ``_magnitude``):

* pass 1 (``aq_absmax``): per block (or row, per tensor) ``max|x|``, flagging NaN/inf (then the
  caller runs the portable path, which reports where); per tensor the row maxima are reduced by
  ``cupy.max`` (a maximum is exact in any order); two-level: ``aq_global`` forms the global;
* ``aq_scales``: the scale rule (``alpha / (span / 2)``, OCP, or normalised by the global) and the
  table round-up onto the scale dtype (the tables of ``roundup.pow2_tables`` passed as arguments);
* pass 2 (``aq_encode_*``): one thread per stored word (or byte): the effective scale, the code of
  each field and the packed word, written once; ``aq_decode_*`` the reverse.

Each f32 step is one correctly rounded intrinsic (``__fdiv_rn``, ``__fmul_rn``, ``__fadd_rn``,
``__fsub_rn``: IEEE round to nearest, never contracted into an FMA), and the sources are compiled
with ``--fmad=false --ftz=false --prec-div=true`` as a second guard. Subnormals are kept, as NumPy
keeps them; CuPy's own kernels (the portable path on CuPy) flush them (``-ftz=true``), so on
subnormal scales this module agrees with NumPy, not with the portable path on CuPy.

CuPy is imported inside the functions: this module imports without it.
"""

from __future__ import annotations

import functools
import importlib
import re
import string
from typing import Any

import numpy as np

from ..invariants import Plan
from ..kernels.minifloat import E2M1_STEPS, FORMATS, decode_table
from ..kernels.roundup import pow2_tables
from ..scheme import F32_MAX, F32_TINY, QuantValue, ScaleDtype
from ..storage import values_layout
from .coverage import layout_reason

__all__ = ["OPTIONS", "VERIFIED", "dequantize", "kernel_names", "kernel_sources", "quantize", "supports"]

VERIFIED = False  # set True only after ci/gpu-check.sh has passed with ARRAYQUANT_FUSED_GPU=1 on a GPU

# why: NVRTC contracts a*b+c into an FMA by default (one rounding instead of two); the portable
# path rounds every step. Division and subnormals are IEEE by default; said anyway.
OPTIONS = ("--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")

_THREADS = 256
_PIECE = 4096  # per tensor: elements of a row one pass-1 thread reduces
_FLOATS = (QuantValue.E2M1, QuantValue.E4M3, QuantValue.E5M2)

# device functions shared by the kernels; each line names the portable step it mirrors
_DEVICE = r"""
#define AQ_INF __int_as_float(0x7f800000)
#define AQ_F32_MAX 3.4028234663852886e38f

// roundup.py round_up_scales of one f32 scale (numba_search_kernels._grid_up)
// t = [max, floor, is-f32 | thr(n) | up_a(n+1) | up_b(n+1) | inv_a(n+1) | inv_b(n+1)] of roundup.pow2_tables
__device__ float aq_round_up(float s, const float* t, int n) {
    if (t[2] != 0.0f) return __fadd_rn(s, 0.0f);                // F32: s + 0.0 (-0.0 -> +0.0)
    const float* thr = t + 3;
    const float* up_a = thr + n;
    const float* up_b = up_a + (n + 1);
    const float* inv_a = up_b + (n + 1);
    const float* inv_b = inv_a + (n + 1);
    float gmax = t[0];
    float a = s < gmax ? s : gmax;                                // xp.minimum(s, g.max)
    int lo = 0;                                                   // j = searchsorted(thr, a, side="right")
    int hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (thr[mid] <= a) lo = mid + 1; else hi = mid;
    }
    float m = ceilf(__fmul_rn(__fmul_rn(a, up_a[lo]), up_b[lo]));  // ceil((a * up_a[j]) * up_b[j])
    float r = __fmul_rn(__fmul_rn(m, inv_a[lo]), inv_b[lo]);       // (n * inv_a[j]) * inv_b[j]
    r = r < gmax ? r : gmax;                                      // xp.minimum(r, g.max)
    if (t[1] > 0.0f) r = r > t[1] ? r : t[1];                     // xp.maximum(r, g.floor)
    return __fadd_rn(r, 0.0f);                                    // r + 0.0 (-0.0 -> +0.0)
}

// qparams.py effective_scale (numba_search_kernels._scale: min(glob * s, F32_MAX))
__device__ float aq_effective(float s, const float* glob, int two_level) {
    if (!two_level) return s;
    float e = __fmul_rn(glob[0], s);                              // glob * stored
    return e < AQ_F32_MAX ? e : AQ_F32_MAX;                       // xp.minimum(eff, F32_MAX)
}

// integer.py quantize_int of one x (numba_search_kernels._code): clip(round(x / eff), qmin, qmax)
__device__ int aq_int_code(float x, float eff, float qmin, float qmax, int half_even) {
    float div = eff == 0.0f ? AQ_INF : eff;                       // safe_divisor: zero scale -> inf
    float y = __fdiv_rn(x, div);                                  // xp.divide(x, eff)
    float r;
    if (half_even) {
        r = rintf(y);                                             // xp.round: ties to even
    } else {
        float t = truncf(y);                                      // _round_half_away: xp.trunc(y)
        bool tie = fabsf(__fsub_rn(y, t)) == 0.5f;                // |y - t| == 0.5
        r = tie ? __fadd_rn(t, copysignf(1.0f, y)) : rintf(y);    // t + sign(y), else round(y)
    }
    r = r < qmin ? qmin : (r > qmax ? qmax : r);                  // xp.clip(r, qmin, qmax)
    return (int)r;                                                // xp.astype(r, int8)
}

// minifloat.py encode of one f32 y (numba_search_kernels._magnitude, then the sign)
__device__ unsigned int aq_minifloat(float y, int e2m1, const float* thr, const int* incl, const float* bthr, int nbthr,
                                     const float* bscale, float fmax, int step, int nan_code, int sign_shift) {
    bool nan = isnan(y);                                          // xp.isnan(y)
    float a = fabsf(y);                                           // xp.abs(y)
    a = a < fmax ? a : fmax;                                      // xp.minimum(|y|, fmt.max)
    if (nan) a = 0.0f;                                            // where(nan, 0, a)
    unsigned int mag = 0u;
    if (e2m1) {
        for (int k = 0; k < 7; ++k)                               // _magnitude_code_e2m1: seven midpoints
            mag += incl[k] ? (a >= thr[k] ? 1u : 0u) : (a > thr[k] ? 1u : 0u);
    } else {
        int j = 0;
        for (int k = 0; k < nbthr; ++k) j += a >= bthr[k] ? 1 : 0; // _magnitude_code_binade: binade j
        float t = __fmul_rn(a, bscale[j]);                        // t = a * 2^(mbits - emin - j)
        mag = (unsigned int)rintf(t) + (unsigned int)(j * step);  // round(t) + j * 2^mbits
    }
    unsigned int sign = signbit(y) ? 1u : 0u;                     // xp.signbit(y)
    if (nan_code < 0) {
        if (nan) sign = 0u;                                       // E2M1: NaN encodes as +0
    } else if (nan) {
        mag = (unsigned int)nan_code;                             // E4M3/E5M2: the NaN code, y's sign
    }
    return mag | (sign << sign_shift);                            // mag | sign << (bits - 1)
}
"""

_ABSMAX = r"""
// pass 1, blockwork.Steps.alpha -> kernels absmax: max|x| per block of b along each row
extern "C" __global__ void aq_absmax(const float* x, long long rows, long long cols, long long b, long long nb,
                                     float* amax, int* bad) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * nb) return;
    long long r = i / nb;
    long long c0 = (i % nb) * b;
    long long n = cols - c0 < b ? cols - c0 : b;                  // a partial last block: zero padding adds nothing
    const float* xr = x + r * cols + c0;
    float m = 0.0f;
    for (long long t = 0; t < n; ++t) {
        float a = fabsf(xr[t]);                                   // xp.abs(x)
        if (!(a < AQ_INF)) atomicOr(bad, 1);                      // NaN/inf: the portable path reports it
        m = a > m ? a : m;                                        // xp.max (exact in any order)
    }
    amax[i] = m;
}
"""

_GLOBAL = r"""
// qparams.py global_scale from the largest block scale max(alpha) / (span / 2) (division is monotone)
extern "C" __global__ void aq_global(const float* top, float half_span, float block_max, float tiny, float* glob) {
    if (blockIdx.x * blockDim.x + threadIdx.x != 0) return;
    float s_max = __fdiv_rn(top[0], half_span);                   // block_scales: alpha / ((b - a) / 2)
    float g = __fdiv_rn(s_max, block_max);                        // s_max / scale_dtype.max
    glob[0] = g > tiny ? g : tiny;                                // xp.maximum(g, F32_TINY)
}
"""

_SCALES = r"""
// qparams.py scales_from_absmax then store_scales: the stored scale of each block
extern "C" __global__ void aq_scales(const float* amax, long long n, int rule, float half_span, const float* glob,
                                     float ocp_mul, const float* sd, int nsd, const float* u8, int nu8, float* stored) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float alpha = amax[i];
    float s;
    if (rule == 1) {                                              // _ocp_scales
        float up = aq_round_up(alpha, u8, nu8);                   // round_up_scales(alpha, UE8M0)
        float fl = up == alpha ? up : __fmul_rn(up, 0.5f);        // where(up == alpha, up, up * 0.5)
        s = __fmul_rn(fl, ocp_mul);                               // floor * 2^-emax
    } else {
        s = __fdiv_rn(alpha, half_span);                          // block_scales: alpha / ((b - a) / 2)
        if (rule == 2) s = __fdiv_rn(s, glob[0]);                 // normalise_scales: s / g
    }
    stored[i] = aq_round_up(s, sd, nsd);                          // store_scales: round up onto the dtype
}
"""

_ENCODE = string.Template(r"""
// pass 2, blockwork.Steps.values: codes (integer.py / floating.py) packed as storage.pack_codes, one word a thread
extern "C" __global__ void aq_encode_$name(const float* x, long long rows, long long cols, long long b, long long nb,
        int per_tensor, const float* stored, const float* glob, int two_level, int per_word, int bits,
        long long nwords, unsigned int mask, int is_float, float qmin, float qmax, int half_even, const float* thr,
        const int* incl, const float* bthr, int nbthr, const float* bscale, float fmax, int step, int nan_code,
        int sign_shift, $out_t* out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * nwords) return;
    long long r = i / nwords;
    long long w = i % nwords;
    unsigned int word = 0u;
    for (int k = 0; k < per_word; ++k) {
        long long c = w * per_word + k;
        if (c >= cols) break;                                     // pack_fields: the line's zero padding
        float xv = x[r * cols + c];
        float s = stored[per_tensor ? 0 : r * nb + c / b];
        float eff = aq_effective(s, glob, two_level);             // effective_scale
        unsigned int field;
        if (is_float) {                                           // quantize_float: zero scale -> code +0
            field = eff == 0.0f ? 0u : aq_minifloat(__fdiv_rn(xv, eff), is_float == 2, thr, incl, bthr, nbthr,
                                                    bscale, fmax, step, nan_code, sign_shift);
        } else {
            field = (unsigned int)aq_int_code(xv, eff, qmin, qmax, half_even);
        }
        word |= (field & mask) << (k * bits);                     // field k in bits [k*bits, (k+1)*bits)
    }
    out[i] = ($out_t)word;
}
""")

_DECODE = string.Template(r"""
// dequantize.py via blockwork.Steps.decode: unpack (storage.unpack_values), decode, times eff, saturate
extern "C" __global__ void aq_decode_$name(const $in_t* v, long long rows, long long cols, long long b, long long nb,
        int per_tensor, const float* stored, const float* glob, int two_level, int per_word, int bits,
        long long nwords, unsigned int mask, unsigned int half, int is_float, const float* dtab, unsigned int dmask,
        int clip, float* y) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    long long r = i / cols;
    long long c = i % cols;
    unsigned int word = (unsigned int)v[r * nwords + c / per_word];
    unsigned int f = (word >> ((c % per_word) * bits)) & mask;   // unpack_fields: field k of the word
    float eff = aq_effective(stored[per_tensor ? 0 : r * nb + c / b], glob, two_level);
    float d;
    if (is_float) {
        d = __fmul_rn(dtab[f & dmask], eff);                      // dequantize_float: decode(code) * eff
    } else {
        int q = (int)(f ^ half) - (int)half;                      // sign-extend: (f ^ 2^(bits-1)) - 2^(bits-1)
        d = __fmul_rn((float)q, eff);                             // dequantize_int: float(code) * eff
    }
    if (clip) d = d < -AQ_F32_MAX ? -AQ_F32_MAX : (d > AQ_F32_MAX ? AQ_F32_MAX : d);  // xp.clip; NaN stays
    y[i] = d;
}
""")

# (kernel name, template or source, substitutions): every kernel this module compiles
_KERNELS: dict[str, tuple[Any, dict[str, str]]] = {
    "aq_absmax": (_ABSMAX, {}),
    "aq_global": (_GLOBAL, {}),
    "aq_scales": (_SCALES, {}),
    "aq_encode_u8": (_ENCODE, {"name": "u8", "out_t": "unsigned char"}),
    "aq_encode_u32": (_ENCODE, {"name": "u32", "out_t": "unsigned int"}),
    "aq_decode_u8": (_DECODE, {"name": "u8", "in_t": "unsigned char"}),
    "aq_decode_u32": (_DECODE, {"name": "u32", "in_t": "unsigned int"}),
}


def kernel_sources() -> dict[str, str]:
    """The full CUDA source (device functions and kernel) of every kernel, by kernel name.

    Returns
    -------
    dict of str to str
        What :mod:`cupy` compiles with :data:`OPTIONS`; the key is the ``extern "C"`` name.

    Raises
    ------
    KeyError
        A template placeholder without a value (a broken template).
    """
    out = {}
    for name, (template, subs) in _KERNELS.items():
        body = template.substitute(subs) if isinstance(template, string.Template) else template
        out[name] = _DEVICE + body
    return out


def _cupy() -> Any:
    return importlib.import_module("cupy")


@functools.cache  # why: one compilation per kernel and process (CuPy also caches the binary on disk)
def _kernel(name: str) -> Any:
    return _cupy().RawKernel(kernel_sources()[name], name, options=OPTIONS)


def _launch(name: str, n: int, *args: Any) -> None:
    blocks = max(-(-n // _THREADS), 1)
    _kernel(name)((blocks,), (_THREADS,), args)


@functools.cache
def _round_up_table(dtype: ScaleDtype) -> tuple[np.ndarray, int]:
    """``[max, floor, is-f32 | thresholds | up_a | up_b | inv_a | inv_b]`` of ``roundup.pow2_tables``, and n."""
    g = dtype.grid
    lim = [g.max, g.floor, 1.0 if dtype is ScaleDtype.F32 else 0.0]
    if dtype is ScaleDtype.F32:
        return np.asarray(lim, dtype=np.float32), 0
    thr, up_a, up_b, inv_a, inv_b = pow2_tables(dtype)
    return np.asarray([*lim, *thr, *up_a, *up_b, *inv_a, *inv_b], dtype=np.float32), len(thr)


def _minifloat_args(value: QuantValue) -> tuple[Any, ...]:
    """``(thr, incl, bthr, nbthr, bscale, fmax, step, nan_code, sign_shift)`` of ``minifloat.encode``."""
    cp = _cupy()
    f32 = np.float32
    thr = cp.asarray([t for t, _ in E2M1_STEPS], dtype=f32)
    incl = cp.asarray([1 if inclusive else 0 for _, inclusive in E2M1_STEPS], dtype=np.int32)
    if value not in FORMATS:  # integer values: the arguments are not read
        one = cp.zeros(1, dtype=f32)
        return thr, incl, one, np.int32(0), one, f32(0), np.int32(0), np.int32(-1), np.int32(0)
    fmt = FORMATS[value]
    bthr = [2.0**e for e in range(fmt.emin + 1, fmt.emax + 1)]
    bscale = [2.0 ** (fmt.mbits - fmt.emin - k) for k in range(fmt.emax - fmt.emin + 1)]
    return (
        thr,
        incl,
        cp.asarray(bthr, dtype=f32),
        np.int32(len(bthr)),
        cp.asarray(bscale, dtype=f32),
        f32(fmt.max),
        np.int32(1 << fmt.mbits),
        np.int32(-1 if fmt.nan_code is None else fmt.nan_code),
        np.int32(fmt.bits - 1),
    )


def supports(plan: Plan, shape: tuple[int, ...]) -> str:
    """Why these kernels do not cover data of ``shape`` under ``plan``, or ``""`` when they do.

    Parameters
    ----------
    plan : Plan
        The validated scheme.
    shape : tuple of int
        The data's shape.

    Returns
    -------
    str
        ``""`` for symmetric integer or E2M1/E4M3/E5M2 values per tensor or in 1-D blocks along
        the last axis, round-up or OCP scales, one or two levels, any store packed along the last
        axis; else a short reason.
    """
    scheme = plan.scheme
    if plan.value.is_float and plan.value not in _FLOATS:  # pragma: no cover - every float value is listed
        return f"{plan.value.name} values are not fused"
    if scheme.scale_rule not in ("round_up", "ocp"):
        return f"scale rule {scheme.scale_rule!r} is not fused"
    return layout_reason(plan, shape)


def _layout(plan: Plan, shape: tuple[int, ...]) -> tuple[int, int, int, int, int, int]:
    """``(rows, cols, b, nb, per_word, nwords)`` of data of ``shape`` seen as rows of its last axis."""
    cols = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    dims = plan.block_dims(shape)
    b = dims[-1] if dims else cols
    nb = -(-cols // b)
    vshape, vdtype = values_layout(plan, shape)
    per_word = 1 if plan.packed_axis(len(shape)) is None else (32 if vdtype == "uint32" else 8) // plan.bits
    return rows, cols, b, nb, per_word, vshape[-1]


def quantize(x: Any, plan: Plan, rounding: str) -> tuple[Any, Any, Any] | None:
    """Stored values, stored f32 scales and the two-level global of MinMax quantization, or None.

    Parameters
    ----------
    x : cupy.ndarray
        float32 data, at least 1-d, any strides.
    plan : Plan
        The validated scheme (see :func:`supports`).
    rounding : {"half_even", "half_away"}
        The integer rounding.

    Returns
    -------
    (values, scales, global) or None
        Values in the stored form and layout of ``storage.values_layout``, scales shaped as the
        scale grid, the ``(1,)`` f32 global of a two-level scheme (else None). None for other
        dtypes or schemes not covered, and for data holding NaN or infinity (the caller then runs
        the portable path, which reports where).
    """
    cp = _cupy()
    if not isinstance(x, cp.ndarray) or x.dtype != cp.float32 or x.ndim == 0:
        return None
    shape = tuple(int(n) for n in x.shape)
    if supports(plan, shape):
        return None
    f32, i64 = np.float32, np.int64
    rows, cols, b, nb, per_word, nwords = _layout(plan, shape)
    per_tensor = not plan.block_dims(shape)
    x2 = cp.ascontiguousarray(x).reshape(rows, cols)
    # per tensor, pass 1 takes maxima of row pieces (a maximum is exact in any grouping)
    b_a = min(cols, _PIECE) if per_tensor else b
    nb_a = -(-cols // b_a)
    amax = cp.empty(rows * nb_a, dtype=f32)
    bad = cp.zeros(1, dtype=np.int32)
    _launch("aq_absmax", rows * nb_a, x2, i64(rows), i64(cols), i64(b_a), i64(nb_a), amax, bad)
    if per_tensor:
        amax = cp.max(amax).reshape(1)  # the row maxima's maximum: exact in any order
    if int(bad[0]):
        return None
    half_span = f32(plan.value.span / 2)
    glob = None
    if plan.two_level:
        glob = cp.empty(1, dtype=f32)
        top = cp.max(amax).reshape(1)
        _launch("aq_global", 1, top, half_span, f32(plan.scale_dtype.max), f32(F32_TINY), glob)
    ocp = plan.scheme.scale_rule == "ocp"
    rule = 1 if ocp else (2 if plan.two_level else 0)
    ocp_mul = f32(2.0 ** -FORMATS[plan.value].emax) if ocp else f32(1.0)
    sd, nsd = _round_up_table(plan.scale_dtype)
    u8, nu8 = _round_up_table(ScaleDtype.UE8M0)
    n_grid = int(amax.shape[0])
    stored = cp.empty(n_grid, dtype=f32)
    g_arg = glob if glob is not None else cp.ones(1, dtype=f32)
    sd_d, u8_d = cp.asarray(sd), cp.asarray(u8)
    _launch(
        "aq_scales", n_grid, amax, i64(n_grid), np.int32(rule), half_span, g_arg, ocp_mul,
        sd_d, np.int32(nsd), u8_d, np.int32(nu8), stored,
    )  # fmt: skip
    vshape, vdtype = values_layout(plan, shape)
    packed = plan.packed_axis(len(shape)) is not None
    wide = vdtype == "uint32"
    out = cp.empty(rows * nwords, dtype=np.uint32 if wide else np.uint8)
    mask = (1 << plan.bits) - 1 if packed else 0xFF
    is_float = 0 if not plan.value.is_float else (2 if plan.value is QuantValue.E2M1 else 1)
    _launch(
        "aq_encode_u32" if wide else "aq_encode_u8", rows * nwords,
        x2, i64(rows), i64(cols), i64(b), i64(nb), np.int32(per_tensor), stored, g_arg,
        np.int32(plan.two_level), np.int32(per_word), np.int32(plan.bits), i64(nwords), np.uint32(mask),
        np.int32(is_float), f32(plan.qmin), f32(plan.qmax), np.int32(rounding == "half_even"),
        *_minifloat_args(plan.value), out,
    )  # fmt: skip
    values = out.reshape(vshape)
    if vdtype == "int8":
        values = values.view(np.int8)
    return values, stored.reshape(plan.grid_shape(shape)), glob


def dequantize(values: Any, scales: Any, glob: Any, plan: Plan, shape: tuple[int, ...]) -> Any:
    """f32 data of ``shape`` from stored values, stored scales and the global, or None.

    Parameters
    ----------
    values : cupy.ndarray
        Stored values as :func:`quantize` (or the portable path) writes them.
    scales : cupy.ndarray
        Stored f32 scales, shaped as the scale grid.
    glob : cupy.ndarray or None
        The ``(1,)`` f32 global of a two-level scheme.
    plan : Plan
        The validated scheme (see :func:`supports`).
    shape : tuple of int
        The data's shape.

    Returns
    -------
    cupy.ndarray or None
        ``eff * decode(code)`` in f32, saturated at the f32 maximum where the portable path
        saturates; None where the scheme or the arrays are not covered.
    """
    cp = _cupy()
    shape = tuple(int(n) for n in shape)
    if not isinstance(values, cp.ndarray) or supports(plan, shape):
        return None
    vshape, vdtype = values_layout(plan, shape)
    if str(values.dtype) != vdtype or tuple(values.shape) != vshape or scales.dtype != cp.float32:
        return None
    if plan.two_level and (glob is None or glob.dtype != cp.float32):
        return None
    f32, i64 = np.float32, np.int64
    rows, cols, b, nb, per_word, nwords = _layout(plan, shape)
    packed = plan.packed_axis(len(shape)) is not None
    wide = vdtype == "uint32"
    v = cp.ascontiguousarray(values).reshape(-1)
    if not wide:
        v = v.view(np.uint8)
    s = cp.ascontiguousarray(scales, dtype=f32).reshape(-1)
    g_arg = cp.ascontiguousarray(glob, dtype=f32).reshape(1) if plan.two_level else cp.ones(1, dtype=f32)
    field_bits = plan.bits if packed else 8
    mask = (1 << field_bits) - 1
    half = 1 << (field_bits - 1)
    if plan.value.is_float:
        fmt = FORMATS[plan.value]
        dtab = cp.asarray(decode_table(plan.value), dtype=f32)
        dmask, top = (1 << fmt.bits) - 1, fmt.max
    else:
        dtab, dmask, top = cp.zeros(1, dtype=f32), 0, float(max(-plan.qmin, plan.qmax))
    # blockwork.Steps._may_overflow: the largest effective scale (monotone in the stored one) times
    # the largest code; the same test in the same f32 values
    eff_max = f32(float(cp.max(s)))
    if plan.two_level:
        eff_max = min(f32(f32(float(g_arg[0])) * eff_max), f32(F32_MAX))
    clip = float(eff_max) * top > F32_MAX * (1 - 2.0**-20)
    y = cp.empty(rows * cols, dtype=f32)
    _launch(
        "aq_decode_u32" if wide else "aq_decode_u8", rows * cols,
        v, i64(rows), i64(cols), i64(b), i64(nb), np.int32(not plan.block_dims(shape)), s, g_arg,
        np.int32(plan.two_level), np.int32(per_word), np.int32(field_bits), i64(nwords), np.uint32(mask),
        np.uint32(half), np.int32(plan.value.is_float), dtab, np.uint32(dmask), np.int32(clip), y,
    )  # fmt: skip
    return y.reshape(shape)


def kernel_names(source: str) -> list[str]:
    """The ``extern "C" __global__`` kernel names defined in a CUDA ``source``."""
    return re.findall(r'extern "C" __global__ void (\w+)\(', source)
