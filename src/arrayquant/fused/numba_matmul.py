"""Quantized matrix products fused in Numba: ``y = x @ W.T`` from W's codes, never its float values.

``W`` is a 2-d ``(N, K)`` weight stored as a linear layer keeps it (blocks and packing along K),
``x`` a float32 ``(M, K)`` batch of activations. Two kernel families compute it:

* the **row kernels** of :mod:`.numba_simd` (x86 with AVX2 and FMA: :data:`SIMD`), reading each
  row's stored bytes (:func:`_rows`) for the weights they cover (:func:`_simd_field`);
* the **panel kernels** here, for the rest and for other CPUs: once per weight (and kept while the
  weight lives) the codes are laid out column by column, as onnxruntime and llama.cpp repack a
  weight before use (:func:`_panel`); then each task owns a chunk of output rows and walks K in
  runs that share one scale: per run, each column's codes are decoded to their levels and added,
  times ``x[m, k]``, to the chunk's partial sums, which the run's scale (zero point, offset) then
  folds into the output. The levels are read once per call and reused by every row of ``x``.

Both sum the same two ways (in different orders):

* ``"f32"`` (the default): levels and activations multiplied and summed in f32 (four columns per
  step, FMA where the CPU has it), each run's sum scaled in f32. The result differs from a float64
  product of the dequantized weight by the usual dot-product bound, ``|error| <= ~(K + 4) * 2^-24 *
  sum |w x|``, as a BLAS product of the dequantized weight does.
* ``"int8"``: the activations are first quantized per segment (``S`` = the weight's block, at most
  256, of one row of ``x``) to int8 with a symmetric absmax scale ``max|x| / 127`` (round half to
  even), the integer codes are multiplied and summed exactly in int32, and each segment's sum is
  scaled once: ``f32(sum) * sx * eff``; a zero point (or an offset) multiplies the segment's f32
  sum of ``x``. Packed signed 4-bit codes are kept as ``q + 8`` with the zero point raised by
  8 (their f32 decode is one conversion), so they too take that term. This is llama.cpp's and
  onnxruntime's accuracy-level-4 scheme; its error is the activations' rounding, about ``sx / 2``
  per element.

Chunks of rows run in parallel (``prange``); each output is computed by one thread in one fixed
order, so results do not depend on the thread count (nor, on either family, on the other rows of
``x``). :func:`remember` and :func:`shortcut` keep what ``ops.linalg.matmul``'s checks decided
per weight, so a repeated product goes straight to the row kernel.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

import numpy as np

from ..invariants import Plan
from ..kernels.minifloat import decode_table
from ..scheme import QuantMode, QuantValue
from . import available as fused_on
from . import numba_simd
from .coverage import weight_reason
from .numba_dequantize import as_bytes
from .numba_launch import launch, numba, parallel_and_serial
from .numba_simd import Field, available, chunk, kernels

__all__ = ["SUMS", "matmul_t", "remember", "shortcut", "shortcut_t", "supports"]

SUMS = ("f32", "int8")
_F32_MAX = float(np.finfo(np.float32).max)
_SEGMENT = 256  # the longest run of K that shares one activation scale on the int8 path

# How a panel field becomes its level (before the scale): one field per element or two nibbles per
# byte. Unsigned kinds are the affine modes' codes. E2M1 panels hold twice each value as an int8, and
# E4M3 / E5M2 panels each value's bfloat16 bits (every such value is a bfloat16): decoding either is
# one conversion, where computing the minifloat from its bits was 3x slower end to end.
_I8, _U8, _BF16, _E2M1, _I4, _U4 = range(6)
_NIBBLES = _I4
# what the level is scaled by: symmetric ``level * s``, zero point ``(level - z) * s``, offset ``level * d + m``
_SYM, _ZERO, _OFFSET = range(3)

if numba is not None:
    _inline = numba.njit(cache=True, nogil=True, inline="always")

    # The decoders work on uint8 fields and f32 only (no wider integers): Numba computes integer
    # arithmetic in int64, and an int64-to-f32 conversion has no vector instruction on x86.

    @_inline
    def _level(f, mode):
        """The f32 level of the uint8 field ``f`` (a nibble already cut to its four bits)."""
        if mode in (_I8, _E2M1):
            return np.float32(np.int8(f))
        if mode in (_U8, _U4):
            return np.float32(f)
        if mode == _I4:
            return np.float32(np.uint8(f ^ np.uint8(8))) - np.float32(8)
        return np.uint32(np.uint32(f) << np.uint32(16)).view(np.float32)  # _BF16

    @_inline
    def _ilevel(f, mode):
        """The integer level of field ``f``: the code, or twice an E2M1 value (0, 1, 2, 3, 4, 6, 8, 12 signed)."""
        return np.int32(_level(f, mode))

    @_inline
    def _levels(a, lev, mode, h):
        """The levels of one panel row's ``h`` bytes ``a`` into ``lev``: a byte each, or two nibbles (the
        low ones for the first ``h`` rows, the high ones for the next ``h``). ``h`` must be a compile-time
        constant: with a run-time one the loop does not vectorise (5x slower)."""
        if mode < _NIBBLES:
            for j in range(h):
                lev[j] = _level(a[j], mode)
        else:
            for j in range(h):
                v = a[j]
                lev[j] = _level(np.uint8(v & 15), mode)
                lev[h + j] = _level(np.uint8(v >> 4), mode)

    @_inline
    def _ilevels(a, lev, mode, h):
        """As :func:`_levels`, integer levels (E2M1 doubled)."""
        if mode < _NIBBLES:
            for j in range(h):
                lev[j] = _ilevel(a[j], mode)
        else:
            for j in range(h):
                v = a[j]
                lev[j] = _ilevel(np.uint8(v & 15), mode)
                lev[h + j] = _ilevel(np.uint8(v >> 4), mode)

    def _compile(mode: int, affine: int, integer: bool, width: int) -> tuple[Any, Any]:
        """The (parallel, serial) kernel for one decoder, affine kind, sum and chunk width; all are closure
        constants (constant trip counts let LLVM vectorise the loops without alias checks: 3x faster),
        so each is its own compilation (and cache entry), made on first use.

        The weight comes as a panel: ``panel[c, k]`` holds the codes of column ``k`` of W for the rows
        of chunk ``c`` (see :func:`_panel`). A task owns one chunk of ``width`` rows and walks K in runs
        of ``run`` (one scale per run): per run its ``width`` partial sums start at zero, each ``k`` adds
        ``level * x[m, k]`` to them (four ``k`` at a time), and the run's scale (and zero point or
        offset) folds them into the output. ``x`` is f32 (or int8 codes with per-run scales ``sx``).
        """
        wide = 1 if mode < _NIBBLES else 2
        dtype = np.int32 if integer else np.float32
        bw = width // wide  # panel bytes per chunk
        half = np.float32(0.5 if mode == _E2M1 else 1.0)  # doubled E2M1 levels: halving the sums is exact
        decode = _ilevels if integer else _levels

        def kernel(panel, eff, aux, x, sx, xsum, run, out):
            m_rows, k = x.shape
            n_rows = out.shape[1]
            for c in numba.prange(n_rows // width):
                r0 = c * width
                part = np.empty((m_rows, width), dtype)
                lev = np.empty((4, width), dtype)
                for q in range(k // run):
                    part[:] = 0
                    for k4 in range(q * run, q * run + run, 4):
                        for u in range(4):
                            decode(panel[c, k4 + u], lev[u], mode, bw)
                        l0 = lev[0]
                        l1 = lev[1]
                        l2 = lev[2]
                        l3 = lev[3]
                        for m in range(m_rows):
                            x0 = dtype(x[m, k4])
                            x1 = dtype(x[m, k4 + 1])
                            x2 = dtype(x[m, k4 + 2])
                            x3 = dtype(x[m, k4 + 3])
                            p = part[m]
                            for j in range(width):
                                p[j] += l0[j] * x0 + l1[j] * x1 + l2[j] * x2 + l3[j] * x3
                    s = eff[c, q]
                    z = aux[c, q]
                    for m in range(m_rows):
                        p = part[m]
                        o = out[m, r0 : r0 + width]
                        xs = xsum[m, q]
                        f = sx[m, q] * half
                        for j in range(width):
                            t = np.float32(p[j]) * f
                            if affine == _SYM:
                                y = t * s[j]
                            elif affine == _ZERO:
                                y = (t - z[j] * xs) * s[j]
                            else:
                                y = t * s[j] + z[j] * xs
                            o[j] = y if q == 0 else o[j] + y

        # the sums' order is fixed by the code (runs, then four k at a time, FMA where the CPU has it),
        # never by the thread count: each output belongs to one task
        return parallel_and_serial(kernel, fastmath={"contract"})

    _KERNELS: dict[tuple[int, int, bool, int], tuple[Any, Any]] = {}

    def _kernels(mode: int, affine: int, integer: bool, width: int) -> tuple[Any, Any]:
        key = (mode, affine, integer, width)
        if key not in _KERNELS:
            _KERNELS[key] = _compile(*key)
        return _KERNELS[key]


# twice the E2M1 value of each code 0..15: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives
_TWICE_E2M1 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def _packed(plan: Plan) -> bool:
    """Whether two 4-bit fields share each stored byte (else each has its own, as native storage keeps them)."""
    return plan.bits < 8 and plan.packed_axis(2) is not None


def _mode(plan: Plan) -> int:
    """The panel's decoder."""
    value = plan.value
    if value in (QuantValue.E4M3, QuantValue.E5M2):
        return _BF16
    if value is QuantValue.E2M1:
        return _E2M1
    signed = plan.qmin < 0
    if plan.bits != 4 or not _packed(plan):  # a byte per code in the panel
        return _I8 if signed else _U8
    return _I4 if signed else _U4


def _block(plan: Plan, shape: tuple[int, int]) -> int:
    dims = plan.block_dims(shape)
    return dims[-1] if dims else shape[1]


def supports(plan: Plan, shape: tuple[int, ...], sums: str = "f32") -> str:
    """Why :func:`matmul_t` does not cover a weight of ``shape`` under ``plan``; ``""`` when it does.

    Parameters
    ----------
    plan : Plan
        The weight's validated scheme.
    shape : tuple of int
        The weight's shape, ``(N, K)``.
    sums : {"f32", "int8"}
        How the products are summed (see the module docstring).

    Returns
    -------
    str
        ``""`` when covered, else a short reason.
    """
    if numba is None:
        return "numba is not installed (pip install 'arrayquant[fast]')"
    return _supports(plan, tuple(int(v) for v in shape), sums)


@functools.lru_cache(maxsize=256)
def _supports(plan: Plan, shape: tuple[int, ...], sums: str) -> str:
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI machine
        return "big-endian machines are not fused"
    why = weight_reason(plan, tuple(shape))
    if why:
        return why
    if sums == "int8" and plan.value.is_float and plan.value is not QuantValue.E2M1:
        return f"{plan.value.value} levels are not small integers: the int8 sums cover integer codes and E2M1"
    axis = plan.packed_axis(2)
    if axis is not None and axis != 1:
        return "packing along an axis other than the last is not fused"
    n, k = shape
    b = _block(plan, (n, k))
    if n % 16 or k % 16 or b % 16 or k % b:
        return f"N ({n}), K ({k}) and the block along K ({b}) must be multiples of 16, and K of the block"
    if b > _SEGMENT and b % _SEGMENT:
        return f"a block of {b} longer than {_SEGMENT} must be a multiple of it"
    return ""


def _grids(qt: Any, plan: Plan, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The effective scales ``(N, G)`` f32 and the zero points or offsets beside them (zeros when symmetric)."""
    scales = qt.scales
    if not isinstance(scales, np.ndarray):
        return None
    stored = np.asarray(scales, dtype=np.float32).reshape(n, -1) if scales.size != 1 else None
    if stored is None:
        stored = np.full((n, 1), np.float32(scales.reshape(-1)[0]), dtype=np.float32)
    if plan.two_level:
        g = qt.global_scale
        if not isinstance(g, np.ndarray):
            return None
        with np.errstate(over="ignore"):  # as effective_scale: an inf product saturates
            stored = np.minimum(np.float32(g.reshape(-1)[0]) * stored, np.float32(_F32_MAX)).astype(np.float32)
    eff = np.ascontiguousarray(stored, dtype=np.float32)
    second = qt.zero_point if qt.zero_point is not None else qt.offset
    if second is None:
        aux = np.zeros(eff.shape, np.float32)
    elif not isinstance(second, np.ndarray):
        return None
    else:
        aux = np.asarray(second, dtype=np.float32).reshape(eff.shape)
    return eff, np.ascontiguousarray(aux)


def _may_overflow(plan: Plan, eff: np.ndarray, aux: np.ndarray) -> bool:
    """Whether some weight can dequantize past the f32 maximum (then the reference path clips; we do not)."""
    top = float(np.max(np.abs(eff))) if eff.size else 0.0
    if plan.value.is_float:
        from ..kernels.minifloat import FORMATS

        span = float(FORMATS[plan.value].max)
    elif plan.scheme.mode is QuantMode.OFFSET:
        return top * plan.qmax + float(np.max(np.abs(aux))) > _F32_MAX * (1 - 2.0**-20)
    elif plan.scheme.mode is QuantMode.ZERO_POINT:
        span = float(plan.qmax - plan.qmin)
    else:
        span = float(max(-plan.qmin, plan.qmax))
    return not np.isfinite(top) or top * span > _F32_MAX * (1 - 2.0**-20)


def _prepare(x: np.ndarray, run: int, integer: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(xs, sx, xsum)`` for the panel kernels: ``x``'s int8 codes per run and their scales (int8
    sums), else ``x`` itself and ones; and the per-run f32 sums of ``x`` (see
    :func:`.numba_simd.activations`)."""
    m, k = x.shape
    # f32 sums: nothing is written to xs (x, read-only perhaps, is the kernel's input as it is)
    xs = np.empty((m, k), np.int8) if integer else np.empty((1, 1), np.float32)
    sx = np.empty((m, k // run), np.float32) if integer else np.ones((m, k // run), np.float32)
    xsum = np.empty((m, k // run), np.float32)
    numba_simd.activations(x, run, integer, False, False, np.float32(1), xs, sx, xsum)
    return (xs if integer else x), sx, xsum


def _width(n: int) -> int:
    """Rows per task: 512 where it divides N (a task's partial sums stay in L1), else 16."""
    return 512 if n % 512 == 0 else 16  # two widths: each is its own compilation (seconds)


# the panels built so far, one per weight while it lives (the weight is immutable, so they stay right)
_PANELS: weakref.WeakKeyDictionary[Any, tuple[np.ndarray, np.ndarray, np.ndarray, int, int]] = (
    weakref.WeakKeyDictionary()
)


def _panel(qt: Any, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int] | None:
    """The weight as the kernel reads it, built once per weight: its codes column by column, the scales per run.

    ``panel[c, k]`` holds column ``k``'s codes for the ``width`` rows of chunk ``c``: a byte each (an
    int8 of twice the value for E2M1, a uint16 of the value's bfloat16 bits for E4M3 / E5M2), or for
    4-bit integer fields byte ``j`` holding row ``j``'s code in its low nibble and row
    ``j + width / 2``'s in its high one; each chunk is one contiguous run of memory, read front to back by its task (a
    stride between columns instead defeats the prefetcher). ``eff`` and ``aux`` are ``(N / width,
    K / run, width)``: each run's effective scale and zero point or offset (zeros when symmetric).
    The same bytes as the stored values, reordered as onnxruntime and llama.cpp repack a weight
    once before multiplying with it.
    """
    if qt in _PANELS:
        return _PANELS[qt]
    n, k = (int(v) for v in qt.shape)
    if not isinstance(qt.values, np.ndarray):
        return None
    whole = plan.value.is_float or plan.bits in (4, 8)  # else the panel takes the unpacked codes
    raw = as_bytes(qt.values, plan, (n, k)) if whole else np.empty((n, 0), np.uint8)
    grids = _grids(qt, plan, n)
    if raw is None or grids is None:
        return None
    eff, aux = grids
    if _may_overflow(plan, eff, aux):
        return None
    b = _block(plan, (n, k))
    run = min(b, _SEGMENT)
    width = _width(n)
    if plan.value is QuantValue.E2M1:
        nibbles = np.stack((raw & 15, raw >> 4), axis=-1).reshape(n, k) if _packed(plan) else raw[:, :k] & 15
        panel = _TWICE_E2M1[nibbles].view(np.uint8)
    elif _mode(plan) == _BF16:
        table = np.asarray(decode_table(plan.value), np.float32).view(np.uint32)
        panel = (table >> 16).astype(np.uint16)[raw[:, :k]]  # exact: the low 16 bits are all zero
    elif plan.bits not in (4, 8):  # 1..7-bit fields (Q2_K, Q3_K, Q5_0, Q6_K ...): a byte per code
        panel = np.asarray(qt.codes()).view(np.uint8)
    elif _mode(plan) < _NIBBLES:
        panel = raw[:, :k]
    else:
        codes = np.stack((raw & 15, raw >> 4), axis=-1).reshape(n, k)
        if _mode(plan) == _I4:
            # signed 4-bit codes kept as unsigned ones, q + 8, with 8 added to the zero point: the f32
            # decode of an unsigned nibble is one conversion (the signed one is 25% slower end to end)
            codes ^= 8
            aux = aux + np.float32(8)
        halves = codes.reshape(n // width, 2, width // 2, k)
        panel = halves[:, 0] | (halves[:, 1] << 4)  # (chunks, width / 2, K)
    # (chunks, rows of a chunk, K) -> (chunks, K, rows of a chunk): each chunk column by column
    panel = np.ascontiguousarray(panel.reshape(n // width, -1, k).transpose(0, 2, 1))

    def per_run(g: np.ndarray) -> np.ndarray:
        runs = np.repeat(np.asarray(g, np.float32), b // run, axis=1)  # (N, K / run)
        return np.ascontiguousarray(runs.reshape(n // width, width, -1).transpose(0, 2, 1))

    built = (panel, per_run(eff), per_run(aux), run, width)
    _PANELS[qt] = built
    return built


def matmul_t(x: np.ndarray, qt: Any, plan: Plan, sums: str = "f32") -> np.ndarray | None:
    """``x @ W.T`` for a float32 ``(M, K)`` ``x`` and a quantized ``(N, K)`` weight ``qt``, or None.

    Parameters
    ----------
    x : numpy.ndarray
        float32 activations ``(M, K)``.
    qt : QuantizedTensor
        The weight ``(N, K)``, NumPy arrays (see :func:`supports`).
    plan : Plan
        ``qt``'s validated scheme.
    sums : {"f32", "int8"}
        How the products are summed (see the module docstring).

    Returns
    -------
    numpy.ndarray or None
        float32 ``(M, N)``; None where the kernel does not apply (:func:`supports`, arrays not NumPy
        arrays of the stored layout, or scales whose products could pass the f32 maximum).

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> from arrayquant.invariants import plan_for
    >>> w = aq.quantize(np.eye(16, dtype=np.float32), "q8s:block16")
    >>> x = np.arange(16, dtype=np.float32).reshape(1, 16)
    >>> matmul_t(x, w, plan_for(w.scheme))[0, :4].tolist()
    [0.0, 1.0, 2.0, 3.0]
    """
    n, k = (int(v) for v in qt.shape)
    if supports(plan, (n, k), sums) or x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != k:
        return None
    x = np.ascontiguousarray(x)
    if SIMD and _simd_field(plan, sums, (n, k)) is not None:
        rows = _rows(qt, plan)
        if rows is not None:
            return _simd_product(x, rows, plan, sums)
    built = _panel(qt, plan)
    if built is None:
        return None
    panel, eff, aux, run, width = built
    mode = _mode(plan)
    affine = _affine(plan)
    if mode == _I4:  # stored unsigned in the panel, the zero point raised by 8 (see _panel)
        mode, affine = _U4, _ZERO
    m = x.shape[0]
    xs, sx, xsum = _prepare(x, run, sums == "int8")
    out = np.empty((m, n), np.float32)
    launch(_kernels(mode, affine, sums == "int8", width), n * k, panel, eff, aux, xs, sx, xsum, run, out)
    return out


def _affine(plan: Plan) -> int:
    return {QuantMode.ZERO_POINT: _ZERO, QuantMode.OFFSET: _OFFSET}.get(plan.scheme.mode, _SYM)


# Whether the row kernels of :mod:`.numba_simd` serve the weights they cover (x86 with AVX2 and FMA);
# else, and for what they leave (E4M3 / E5M2 levels, K or runs that do not fit their 32-byte steps,
# 8-bit unsigned codes with int8 sums), the panel kernels above.
SIMD = available()


def _simd_field(plan: Plan, sums: str, shape: tuple[int, int]) -> tuple[Field, int] | None:
    """The row kernel's field for ``plan`` and the bias it adds to each code (the affine term takes it off),
    or None where the row kernels do not apply."""
    k = shape[1]
    if plan.value in (QuantValue.E4M3, QuantValue.E5M2):
        return None
    signed = plan.qmin < 0
    if plan.value is QuantValue.E2M1:
        field, bias = Field(nibbles=True, table=True, signed=True, flip=0), 0
    elif plan.bits == 4 and _packed(plan):
        if signed and sums == "int8":  # as q + 8, the zero point raised by 8 (the int8 path's definition)
            field, bias = Field(nibbles=True, table=False, signed=False, flip=0x88), 8
        else:
            field, bias = Field(nibbles=True, table=False, signed=signed, flip=0x88 if signed else 0), 0
    elif sums == "int8" and plan.qmax > 127:  # the unsigned-by-signed byte multiply could saturate
        return None
    else:
        field, bias = Field(nibbles=False, table=False, signed=signed, flip=0), 0
    step, run = chunk(field.nibbles), min(_block(plan, shape), _SEGMENT)
    if k % step or (run % step and step % run):
        return None
    return field, bias


class _Rows:
    """A weight as the row kernels read it: its bytes row by row, scales per run, and per sum kind the
    kernel and affine terms (``calls``: once a product ran, later ones reuse them)."""

    def __init__(self, data: np.ndarray, eff: np.ndarray, second: np.ndarray | None, run: int, affine: int) -> None:
        self.data, self.eff, self.second, self.run, self.affine = data, eff, second, run, affine
        self.calls: dict[str, tuple[tuple[Any, Any], np.ndarray]] = {}
        self.decided: dict[str, str] = {}  # what the checks of a product decided: {path: sums} (remember)

    def aux(self, bias: int) -> np.ndarray:
        """Per run, what multiplies the run's sum of x: ``-(z + bias) * s`` or ``offset - bias * s``."""
        e, z, f32 = self.eff, self.second, np.float32
        assert z is not None
        a = -(z + f32(bias)) * e if self.affine == _ZERO else z - f32(bias) * e
        return np.ascontiguousarray(a, dtype=np.float32)

    def call(self, plan: Plan, sums: str) -> tuple[tuple[Any, Any], np.ndarray]:
        """The kernel pair and its ``aux`` operand for ``sums`` (see :func:`.numba_simd.kernels`)."""
        if sums not in self.calls:
            got = _simd_field(plan, sums, (self.data.shape[0], self.eff.shape[1] * self.run))
            assert got is not None
            field, bias = got
            span = self.run if self.run <= chunk(field.nibbles) else 0
            if self.affine == _SYM:  # -bias * s: the kernel takes it from the scales (no array to read)
                kernel, aux = kernels(field, sums == "int8", span, float(-bias) if bias else None), None
            else:
                aux = self.aux(bias)
                kernel = kernels(field, sums == "int8", span, 0.0)
            self.calls[sums] = (kernel, _NONE if aux is None else aux)
        return self.calls[sums]

    def product(self, x: np.ndarray, sums: str, out: np.ndarray) -> np.ndarray:
        """``x @ W.T`` into ``out`` by the kernel :meth:`call` made for ``sums``."""
        kernel, aux = self.calls[sums]
        launch(kernel, out.shape[1] * x.shape[1], self.data, self.eff, aux, x, out)
        return out


# the row layouts built so far, one per weight while it lives (as _PANELS)
_ROWS: weakref.WeakKeyDictionary[Any, _Rows] = weakref.WeakKeyDictionary()


def _rows(qt: Any, plan: Plan) -> _Rows | None:
    """The weight's stored bytes as rows (no copy where they are C-contiguous), or None.

    Packed 4-bit fields keep their bytes (E2M1 codes stored a byte each are packed two to a byte);
    8-bit codes keep theirs; other widths take a byte per code from ``qt.codes()``.
    """
    if qt in _ROWS:
        return _ROWS[qt]
    n, k = (int(v) for v in qt.shape)
    if not isinstance(qt.values, np.ndarray):
        return None
    grids = _grids(qt, plan, n)
    if grids is None or _may_overflow(plan, *grids):
        return None
    eff, second = grids
    if plan.bits == 8 or (plan.bits == 4 and (_packed(plan) or plan.value is QuantValue.E2M1)):
        raw = as_bytes(qt.values, plan, (n, k))
        if raw is None:
            return None
        if plan.bits == 8:
            data = raw[:, :k]
        elif _packed(plan):
            data = raw
        else:  # E2M1 codes a byte each: two to a byte, the first in the low nibble
            data = (raw[:, 0:k:2] & 15) | ((raw[:, 1:k:2] & 15) << 4)
    else:
        data = np.asarray(qt.codes()).view(np.uint8)
    b = _block(plan, (n, k))
    run = min(b, _SEGMENT)
    per_run = lambda g: np.ascontiguousarray(np.repeat(g, b // run, axis=1), dtype=np.float32)
    affine = _affine(plan)
    built = _Rows(np.ascontiguousarray(data), per_run(eff), per_run(second) if affine != _SYM else None, run, affine)
    _ROWS[qt] = built
    return built


_NONE = np.zeros((1, 1), np.float32)  # the operand a kernel variant does not read


def _simd_product(x: np.ndarray, rows: _Rows, plan: Plan, sums: str) -> np.ndarray:
    """``x @ W.T`` by the row kernels (see :mod:`.numba_simd`); ``x`` C-contiguous."""
    rows.call(plan, sums)
    return rows.product(x, sums, np.empty((x.shape[0], rows.data.shape[0]), np.float32))


def remember(qt: Any, path: str, sums: str) -> None:
    """Note that ``matmul(x, qt.T, path=path)`` with a float32 NumPy ``x`` took the row kernels summing
    ``sums``: later products with the same weight and path skip the checks (:func:`shortcut`)."""
    rows = _ROWS.get(qt)
    if rows is not None and sums in rows.calls:
        rows.decided[path] = sums


def shortcut(x: Any, qt: Any, path: str, rows_limit: int) -> np.ndarray | None:
    """``x @ qt.T`` by the row kernels when an earlier product with ``qt`` and ``path`` took them
    (:func:`remember`) and ``x`` is again a C-contiguous float32 NumPy matrix (at most ``rows_limit``
    rows for ``path="auto"``), else None (the caller then runs every check). A product of a small
    matrix costs less than the checks (a tenth of a millisecond with the cache cold), so the decision
    is kept: the weight is immutable, and what else it rests on is checked again here."""
    rows = _ROWS.get(qt)
    sums = rows.decided.get(path) if rows is not None else None
    if (
        sums is None
        or not SIMD
        or type(x) is not np.ndarray
        or x.dtype != np.float32
        or x.ndim != 2
        or x.shape[1] != qt.shape[1]
        or not x.flags.c_contiguous
        or (path == "auto" and x.shape[0] > rows_limit)
        or not fused_on()
    ):
        return None
    assert rows is not None
    try:
        out = np.empty((x.shape[0], rows.data.shape[0]), np.float32)
    except MemoryError:  # the checked path says so as a ShapeError
        return None
    return rows.product(x, sums, out)


def shortcut_t(xt: Any, qt: Any, path: str, rows_limit: int) -> np.ndarray | None:
    """``qt @ xt`` for a 2-d float32 NumPy ``xt`` ``(K, M)`` as :func:`shortcut` does ``xt.T @ qt.T``
    (the result is its transpose), else None."""
    if type(xt) is not np.ndarray or xt.ndim != 2:
        return None
    y = shortcut(np.ascontiguousarray(xt.T), qt, path, rows_limit)
    return None if y is None else y.T
