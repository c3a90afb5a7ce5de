"""Quantized row dot products written as LLVM vector code, for x86 CPUs with AVX2 and FMA.

``y[m, n] = sum_k x[m, k] * W[n, k]`` read straight from W's stored bytes, row by row, as
onnxruntime's and llama.cpp's hand-written AVX2 kernels do; Numba's auto-vectoriser does not find
these instruction sequences (nibble splits, table shuffles, byte multiply-adds), so each step is
spelled out here as LLVM vector operations (:func:`_dot`, behind the intrinsic :func:`_row_dot`).
A row is walked in chunks of 32 bytes (64 nibbles or 32 codes, :func:`chunk`); a chunk's levels
are decoded once and used for up to four rows of ``x``; each run (the weight's block along K, at
most 256 long) is summed apart and scaled once, several runs of one chunk together by a vector of
their scales:

* ``f32`` sums: levels converted to f32 and multiplied by ``x`` with FMA in 16 lanes; the run's
  lane sums times the run's scale go into 16-lane accumulators (even and odd groups apart),
  reduced in a fixed tree at the end. The result obeys the usual dot-product bound (the order
  differs from a sequential loop).
* ``int8`` sums: ``x`` comes as int8 codes per run; byte products are summed exactly in int32
  (``pmaddubsw`` then ``pmaddwd``, signed levels through the sign trick), and each run's integer
  lane sums are scaled by ``eff * sx``.

A second term carries zero points and offsets: ``sum_r aux[r] * xsum[m, r]``, with ``aux`` the
weight's per-run ``-(z + bias) * s`` or ``offset - bias * s`` (see :mod:`.numba_matmul`), or
``-bias * s`` taken from the scales themselves.

Nibble rows hold two fields per byte, the low nibble first; the kernel splits a chunk's 32 bytes
into their 32 low then 32 high nibbles, so ``x`` comes permuted to match (:func:`activations`).
Each output is computed by one task in one fixed order, the same for every block of rows: results
depend neither on the thread count nor on the other rows of ``x``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .numba_launch import numba, parallel_and_serial

__all__ = ["Field", "available", "chunk", "kernels"]  # and activations, with numba

_BYTES = 32  # bytes of W per step of the kernels: 32 codes, or 64 nibbles
_TASK = 16  # rows of W per parallel task


class Field(NamedTuple):
    """How a stored byte becomes levels (compile-time constants of a kernel).

    nibbles: two 4-bit fields per byte (else one field per byte); table: nibbles are E2M1 codes,
    looked up as twice their value (signed); signed: the byte (or looked-up value) is an int8
    level, else an unsigned one (signed plain nibbles must come flipped: their ``q + 8`` less 8);
    flip: a mask XORed into each byte first (0x88 turns signed nibbles into ``q + 8``).
    """

    nibbles: bool
    table: bool
    signed: bool
    flip: int


def available() -> bool:
    """Whether the kernels can run here: numba, and a compile target with AVX2 and FMA (the host's
    features, or those ``NUMBA_CPU_FEATURES`` names)."""
    if numba is None:
        return False
    features = numba.config.CPU_FEATURES
    if features is not None:  # NUMBA_CPU_FEATURES: numba compiles for these (else for the host's)
        return {"+avx2", "+fma"} <= set(str(features).split(","))
    try:
        import llvmlite.binding as llvm

        host = llvm.get_host_cpu_features()
        return bool(host["avx2"]) and bool(host["fma"])
    except Exception:  # pragma: no cover - llvmlite without the query, or not an x86 host
        return False


def chunk(nibbles: bool) -> int:
    """Weights per step of the kernels (32 bytes of W): K must be a multiple of it, and each run of
    K a multiple or a divisor of it (at least 16)."""
    return 2 * _BYTES if nibbles else _BYTES


def _pack(field: Field, integer: bool, span: int, aux: float | None, mb: int) -> int:
    """A kernel variant as one integer (see :func:`_unpack`)."""
    kind, factor = (0, 0) if aux is None else (1, 0) if aux == 0 else (2, int(aux))
    if float(factor) != (aux or 0) or not (-128 <= factor < 128 and 0 <= span < 256 and 0 < mb < 16):
        raise ValueError(f"no such row kernel: aux {aux}, span {span}, mb {mb}")
    bits = (field.nibbles, field.table, field.signed, integer)
    flags = sum(int(v) << i for i, v in enumerate(bits))
    return flags | field.flip << 4 | span << 12 | kind << 20 | (factor + 128) << 22 | mb << 30


def _unpack(code: int) -> tuple[Field, bool, int, float | None, int]:
    """The ``(field, integer, span, aux, mb)`` that :func:`_pack` made ``code`` of."""
    nibbles, table, signed, integer = (bool(code >> i & 1) for i in range(4))
    kind, factor = code >> 20 & 3, (code >> 22 & 255) - 128
    aux = None if kind == 0 else 0.0 if kind == 1 else float(factor)
    return Field(nibbles, table, signed, code >> 4 & 255), integer, code >> 12 & 255, aux, code >> 30 & 15


# twice each E2M1 value for codes 0..15, as the byte table of a shuffle: 0, 1, 2, 3, 4, 6, 8, 12 and negatives
_TWICE_E2M1 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]

if numba is not None:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()

    def _v(t: Any, n: int) -> Any:
        return ir.VectorType(t, n)

    def _const(t: Any, values: list[Any]) -> Any:
        return ir.Constant(_v(t, len(values)), values)

    class _Emit:
        """Small helpers over one function's builder: typed loads, intrinsics, splats, reductions."""

        def __init__(self, context: Any, builder: Any, sig: Any, args: Any) -> None:
            self.b = builder
            self.ptr = [
                context.make_array(t)(context, builder, a).data if isinstance(t, types.Array) else None
                for t, a in zip(sig.args, args, strict=True)
            ]

        def fn(self, name: str, ret: Any, *params: Any) -> Any:
            return cgutils.get_or_insert_function(self.b.module, ir.FunctionType(ret, list(params)), name)

        def load(self, base: Any, offset: Any, vty: Any = None) -> Any:
            p = self.b.gep(base, [offset])
            if vty is None:
                return self.b.load(p)
            return self.b.load(self.b.bitcast(p, vty.as_pointer()), align=1)

        def pattern(self, scalars: list[Any], lanes: list[int]) -> Any:
            """A vector whose lane ``i`` is ``scalars[lanes[i]]``."""
            b = self.b
            vec = ir.Constant(_v(_F32, len(scalars)), ir.Undefined)
            for i, s in enumerate(scalars):
                vec = b.insert_element(vec, s, ir.Constant(_I32, i))
            return b.shuffle_vector(vec, vec, _const(_I32, lanes))

        def halves(self, v: Any) -> Any:
            """The sum of a vector's two halves, lane by lane."""
            n = v.type.count // 2
            b = self.b
            return b.fadd(
                b.shuffle_vector(v, v, _const(_I32, list(range(n)))),
                b.shuffle_vector(v, v, _const(_I32, list(range(n, 2 * n)))),
            )

        def total(self, v: Any) -> Any:
            """The sum of a vector's lanes in a fixed pairwise tree."""
            while v.type.count > 1:
                v = self.halves(v)
            return self.b.extract_element(v, ir.Constant(_I32, 0))

    def _dot(field: Field, integer: bool, span: int, aux: float | None, mb: int) -> Any:
        """The code generator of :func:`_row_dot` for one variant: ``mb`` outputs, rows ``m0 .. m0 + mb``
        of ``x`` times one row of W.

        Arguments (flat C arrays and offsets): ``w, woff`` the row's bytes; ``x, xoff, k`` the first
        x row and the row length; ``eff, aux, soff`` the row's per-run scales and affine terms;
        ``sx, xsum, roff, runs`` the x rows' per-run scales (int8 sums) and sums (affine term),
        ``runs`` per row; ``out, ooff, ostride`` where the ``mb`` results go. ``span``: the run
        length where it is at most a chunk (16, 32 or, for nibbles, 64: the chunk's runs are scaled
        together), else 0 (runs of several chunks, ``k // runs`` long: a loop over their chunks).
        ``aux``: None (no affine term), 0 (``aux`` holds it per run), or a factor of ``eff`` (a
        symmetric weight's ``-bias``: no second array to read).
        """
        weights = 2 * _BYTES if field.nibbles else _BYTES  # per chunk
        per_chunk = weights // span if span else 1  # runs
        half = 0.5 if field.table else 1.0  # E2M1 tables hold twice the value: halving the sums is exact
        f16, i8x32, i32x8 = _v(_F32, 16), _v(_I8, 32), _v(_I32, 8)
        # even and odd groups in two accumulators: one would chain every group's FMA (1.4x slower for
        # one row of x); kept for every mb, so a row's sums do not depend on the rows beside it
        slots = 2

        def runs_of(first: list[int]) -> list[int]:
            """The run, counted from the chunk's first, of each lane whose weights start at ``first``."""
            return [f // span if span else 0 for f in first]

        # which weights each lane of a partial sum holds (see the module docstring)
        if integer:  # int32 lanes of pmaddwd: 4 bytes each, of both nibble halves for nibble rows
            lanes = [runs_of([(8 if field.nibbles else 4) * j for j in range(8)])]
        elif field.nibbles:  # f32 lanes: low and high nibble of byte i of each half chunk
            lanes = [runs_of([2 * i for i in range(16)]), runs_of([32 + 2 * i for i in range(16)])]
        else:
            lanes = [runs_of(list(range(16))), runs_of([16 + i for i in range(16)])]

        def codegen(context, builder, signature, args):
            e = _Emit(context, builder, signature, args)
            b = builder
            _, woff, _, xoff, k, _, _, soff, _, _, roff, runs, _, ooff, ostride = args
            wp, xp, ep, ap, sxp, xsp, op = (e.ptr[i] for i in (0, 2, 5, 6, 8, 9, 12))
            it = woff.type

            def c(v: int) -> Any:
                return ir.Constant(it, v)

            fma16 = e.fn("llvm.fma.v16f32", f16, f16, f16, f16)
            fma8 = e.fn("llvm.fma.v8f32", _v(_F32, 8), _v(_F32, 8), _v(_F32, 8), _v(_F32, 8))
            shuf = e.fn("llvm.x86.avx2.pshuf.b", i8x32, i8x32, i8x32)
            maddubs = e.fn("llvm.x86.avx2.pmadd.ub.sw", _v(_I16, 16), i8x32, i8x32)
            maddwd = e.fn("llvm.x86.avx2.pmadd.wd", i32x8, _v(_I16, 16), _v(_I16, 16))
            psign = e.fn("llvm.x86.avx2.psign.b", i8x32, i8x32, i8x32)
            ones16 = _const(_I16, [1] * 16)

            part_t = i32x8 if integer else f16
            acc_t = _v(_F32, 8) if integer else f16
            zero_part = ir.Constant(part_t, [0 if integer else 0.0] * part_t.count)
            zero_acc = ir.Constant(acc_t, [0.0] * acc_t.count)
            parts = [[cgutils.alloca_once(b, part_t) for _ in lanes] for _ in range(mb)]
            acc = [[cgutils.alloca_once_value(b, zero_acc) for _ in range(slots)] for _ in range(mb)]
            table = _const(_I8, _TWICE_E2M1 * 2)  # the shuffle looks up each 16-byte half in its own copy

            def splat8(v: int) -> Any:
                return _const(_I8, [v] * 32)

            def levels(ch: Any) -> list[Any]:
                """A chunk's levels as 32-byte vectors: the low then the high nibbles, or the bytes."""
                raw = e.load(wp, b.add(woff, b.mul(ch, c(_BYTES))), i8x32)
                if field.flip:
                    raw = b.xor(raw, splat8(field.flip))
                if not field.nibbles:
                    return [raw]
                got = [b.and_(raw, splat8(15)), b.lshr(raw, splat8(4))]
                if field.table:
                    return [b.call(shuf, [table, v]) for v in got]
                if field.signed:  # flipped signed nibbles are q + 8
                    return [b.sub(v, splat8(8)) for v in got]
                return got

            def half_of(v: Any, i: int) -> Any:
                """Bytes ``16 i .. 16 i + 15`` of a 32-byte vector, as f32."""
                h = b.shuffle_vector(v, v, _const(_I32, list(range(16 * i, 16 * i + 16))))
                return b.sitofp(h, f16) if field.signed else b.uitofp(h, f16)

            def chunk(ch: Any) -> None:
                """Add chunk ``ch``'s products with each x row to the rows' partial sums."""
                lv = levels(ch)
                if integer:
                    wu = [b.call(psign, [v, v]) if field.signed else v for v in lv]
                else:
                    fl = [[half_of(v, i) for i in range(2)] for v in lv]
                for m in range(mb):
                    at = b.add(b.add(xoff, b.mul(c(m), k)), b.mul(ch, c(weights)))
                    if integer:
                        total = b.load(parts[m][0])
                        for i, v in enumerate(lv):
                            xv = e.load(xp, b.add(at, c(_BYTES * i)), i8x32)
                            if field.signed:  # |w| * (x with w's sign): the unsigned-by-signed multiply
                                xv = b.call(psign, [xv, v])
                            total = b.add(total, b.call(maddwd, [b.call(maddubs, [wu[i], xv]), ones16]))
                        b.store(total, parts[m][0])
                        continue
                    for h in range(2):  # partial h: the h-th 16 bytes of each level vector
                        p = b.load(parts[m][h])
                        for i, f in enumerate(fl):
                            p = b.call(fma16, [f[h], e.load(xp, b.add(at, c(32 * i + 16 * h)), f16), p])
                        b.store(p, parts[m][h])

            def group(g: Any, slot: int) -> None:
                """Sum group ``g`` (a chunk, or a run of several) and add it, scaled, to accumulator ``slot``."""
                for m in range(mb):
                    for p in parts[m]:
                        b.store(zero_part, p)
                if span:
                    chunk(g)
                else:
                    per_group = b.udiv(b.udiv(k, runs), c(weights))
                    with cgutils.for_range(b, per_group) as cl:
                        chunk(b.add(b.mul(g, per_group), cl.index))
                r0 = b.mul(g, c(per_chunk))
                nrun = _v(_F32, per_chunk)
                s = e.load(ep, b.add(soff, r0), nrun)
                if half != 1.0 and not integer:  # int8 sums: activations() halved sx already
                    s = b.fmul(s, ir.Constant(nrun, [half] * per_chunk))
                for m in range(mb):
                    a = acc[m][slot]
                    sm = s
                    if integer:
                        sm = b.fmul(s, e.load(sxp, b.add(b.add(roff, b.mul(c(m), runs)), r0), nrun))
                    total = b.load(a)
                    for p, ln in zip(parts[m], lanes, strict=True):
                        vec = b.sitofp(b.load(p), acc_t) if integer else b.load(p)
                        fma = fma8 if integer else fma16
                        total = b.call(fma, [vec, b.shuffle_vector(sm, sm, _const(_I32, ln)), total])
                    b.store(total, a)

            groups = b.udiv(k, c(weights)) if span else runs
            with cgutils.for_range(b, b.udiv(groups, c(2))) as gl:
                group(b.mul(gl.index, c(2)), 0)
                group(b.add(b.mul(gl.index, c(2)), c(1)), 1)
            with cgutils.if_unlikely(b, b.trunc(groups, ir.IntType(1))):
                group(b.sub(groups, c(1)), 0)

            for m in range(mb):
                total = b.load(acc[m][0])
                for a in acc[m][1:]:
                    total = b.fadd(total, b.load(a))
                y = e.total(total)
                if aux is not None:  # sum_r aux[r] * xsum[m, r]: eight runs at a time, then one by one
                    zp, zf = (ap, None) if aux == 0 else (ep, aux)
                    xr = b.add(roff, b.mul(c(m), runs))
                    z8 = cgutils.alloca_once_value(b, ir.Constant(_v(_F32, 8), [0.0] * 8))
                    with cgutils.for_range(b, b.udiv(runs, c(8))) as zl:
                        r = b.mul(zl.index, c(8))
                        za = e.load(zp, b.add(soff, r), _v(_F32, 8))
                        zx = e.load(xsp, b.add(xr, r), _v(_F32, 8))
                        b.store(b.call(fma8, [za, zx, b.load(z8)]), z8)
                    z1 = cgutils.alloca_once_value(b, e.total(b.load(z8)))
                    if zf is not None:  # exact: the factor is a power of two (-8)
                        b.store(b.fmul(b.load(z1), ir.Constant(_F32, zf)), z1)
                    with cgutils.for_range(b, b.urem(runs, c(8))) as zl:
                        r = b.add(b.mul(b.udiv(runs, c(8)), c(8)), zl.index)
                        za = e.load(zp, b.add(soff, r))
                        if zf is not None:
                            za = b.fmul(za, ir.Constant(_F32, zf))
                        b.store(b.fadd(b.load(z1), b.fmul(za, e.load(xsp, b.add(xr, r)))), z1)
                    y = b.fadd(y, b.load(z1))
                b.store(y, b.gep(op, [b.add(ooff, b.mul(c(m), ostride))]))
            return context.get_dummy_value()

        return codegen

    @intrinsic
    def _row_dot(typingctx, variant, w, woff, x, xoff, k, eff, aux_, soff, sx, xsum, roff, runs, out, ooff, ostride):
        """One row of W times ``mb`` rows of x (see :func:`_dot`); ``variant`` a compile-time :func:`_pack`
        code, so a kernel's closure holds plain numbers (numba's disk cache keys a closure by its values)."""
        if not isinstance(variant, types.IntegerLiteral):
            return None
        gen = _dot(*_unpack(variant.literal_value))
        arrays = (w, woff, x, xoff, k, eff, aux_, soff, sx, xsum, roff, runs, out, ooff, ostride)

        def codegen(context, builder, signature, args):  # the variant is in the generated code, not an operand
            return gen(context, builder, types.none(*arrays), args[1:])

        return types.none(variant, *arrays), codegen

    row_dot: Any = _row_dot  # called without the typing context numba passes itself

    def _compile(field: Field, integer: bool, span: int, aux: float | None) -> tuple[Any, Any]:
        """The (parallel, serial) driver for one kind of row: tasks of 16 rows of W, x in blocks of rows."""
        mb = 4 if integer else 2  # rows of x per decoded chunk: the most whose sums fit the registers
        half = 0.5 if field.table else 1.0
        many, one = _pack(field, integer, span, aux, mb), _pack(field, integer, span, aux, 1)

        def kernel(w, eff, aux_, x, out):
            m_rows, k = x.shape
            n = out.shape[1]
            rb = w.shape[1]
            runs = eff.shape[1]
            sx = np.ones((m_rows, runs), np.float32)
            xsum = np.empty((m_rows, runs), np.float32)
            xs = np.empty((m_rows, k), np.int8 if integer else np.float32)
            activations(x, k // runs, integer, field.nibbles, True, np.float32(half), xs, sx, xsum)
            wf, ef, af, xf = w.reshape(-1), eff.reshape(-1), aux_.reshape(-1), xs.reshape(-1)
            sf, zf, of = sx.reshape(-1), xsum.reshape(-1), out.reshape(-1)
            for t in numba.prange(n // _TASK):
                for i in range(t * _TASK, (t + 1) * _TASK):
                    m0 = 0
                    while m0 + mb <= m_rows:  # blocks of mb rows of x, then one by one (literal variants)
                        row_dot(
                            many,
                            wf,
                            i * rb,
                            xf,
                            m0 * k,
                            k,
                            ef,
                            af,
                            i * runs,
                            sf,
                            zf,
                            m0 * runs,
                            runs,
                            of,
                            m0 * n + i,
                            n,
                        )
                        m0 += mb
                    while m0 < m_rows:
                        row_dot(
                            one, wf, i * rb, xf, m0 * k, k, ef, af, i * runs, sf, zf, m0 * runs, runs, of, m0 * n + i, n
                        )
                        m0 += 1

        return parallel_and_serial(kernel)

    _KERNELS: dict[tuple[Field, bool, int, float | None], tuple[Any, Any]] = {}

    @numba.njit(cache=True, nogil=True)
    def activations(x, run, integer, nibbles, copy, half, xs, sx, xsum):
        """Per run of each row of ``x``: its f32 sum into ``xsum``, and for int8 sums the scale
        ``sx = max|x| / 127`` (NaN if the run holds one) times ``half`` into ``sx`` (0.5 for doubled
        E2M1 levels); then the row into ``xs`` as int8 codes ``clip(rint(x * (1 / sx)), -127, 127)``
        (zero where ``sx`` is not positive), or for f32 sums as it is where ``copy`` or ``nibbles``
        (else ``xs`` is not written: ``x`` itself may be read-only); for nibble rows in each chunk of
        64 the even places of its two halves, then their odd places."""
        m_rows, k = x.shape
        f0, one, lim = np.float32(0), np.float32(1), np.float32(127)
        for m in range(m_rows):
            for r in range(k // run):
                top, tot = f0, f0
                for j in range(r * run, r * run + run):
                    v = x[m, j]
                    tot += v
                    a = abs(v)
                    if top == top and not a <= top:  # NaN sticks, as numpy's max
                        top = a
                xsum[m, r] = tot
                inv = one
                if integer:
                    sc = top / lim
                    sx[m, r] = sc * half
                    inv = one / sc if sc > f0 else f0  # positive and finite: every x * inv is finite
                if not (integer or nibbles or copy):
                    continue
                for j in range(r * run, r * run + run):
                    # place j of its chunk of 64 (two halves of 32): the even places of each half first, then the odd
                    to = (j & ~63) + (j & 1) * 32 + ((j >> 5) & 1) * 16 + ((j & 31) >> 1) if nibbles else j
                    if integer:
                        xs[m, to] = np.int8(min(max(np.rint(x[m, j] * inv), -lim), lim)) if inv > f0 else 0
                    else:
                        xs[m, to] = x[m, j]


def kernels(field: Field, integer: bool, span: int, aux: float | None) -> tuple[Any, Any]:
    """The (parallel, serial) kernel for one kind of row, compiled on first use.

    Called as ``kernel(w, eff, aux, x, out)``: ``w`` (N, bytes) uint8 rows, ``eff`` and ``aux``
    (N, R) f32 per run (``aux`` read only if the ``aux`` argument is 0), ``x`` (M, K) C-contiguous f32 (prepared
    inside by :func:`activations`), ``out`` (M, N) f32. ``span``: as :func:`_dot`'s.
    """
    key = (field, integer, span, aux)
    if key not in _KERNELS:
        _KERNELS[key] = _compile(*key)
    return _KERNELS[key]
