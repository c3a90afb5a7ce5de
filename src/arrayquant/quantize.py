"""Public quantization entry points: calibrate, compute parameters, quantize.

Every function here runs the invariant layer first, then the portable kernels, on the input's
own namespace and device.
"""

from __future__ import annotations

import functools
from typing import Any

from array_api_compat import device as device_of

from .affinework import AffineSteps
from .backends import dask_graph, shim
from .blockwork import Steps, max_of
from .chunks import Sink, row_chunks
from .errors import ParamsError, SchemeError, ShapeError
from .invariants import (
    Plan,
    can_read,
    check_input,
    check_params,
    check_rounding,
    check_same_place,
    check_table,
    check_zero,
    is_real_float,
    namespace_of,
    plan_for,
)
from .invariants import (
    check_finite as check_data_finite,
)
from .invariants.importance import check_ggml_importance, check_importance
from .invariants.plan import CalSpec, check_calibration_spec, ggml_kind
from .kernels import (
    affine_params,
    block_scales,
    effective_scale,
    global_scale,
    normalise_scales,
    scales_from_absmax,
    scales_from_range,
    store_scales,
)
from .kernels import compute_range as _compute_range
from .kernels import (
    round_up_scales as _round_up,
)
from .kernels.search import element_weights, error_unit, row_errors, select
from .lazy import affine_range_lazy, quantize_affine_lazy, quantize_lazy, range_lazy
from .scheme import Calibration, QParams, QuantMode, QuantScheme, ScaleDtype
from .scheme.values import MSE, Percentile
from .storage import pack_codes, pack_unit, values_layout
from .tensor import QuantizedTensor

__all__ = ["compute_q_params", "compute_range", "quantize", "round_up_scales"]


def _scheme(scheme: QuantScheme | str) -> Plan:
    return plan_for(QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme)


def compute_range(
    x: Any,
    scheme: QuantScheme | str,
    calibration: Calibration | str | MSE | Percentile = "minmax",
    *,
    importance: Any = None,
) -> tuple[Any, Any]:
    """``(min, max)`` of ``x`` shaped as the scheme's scale grid, in f32.

    Parameters
    ----------
    x : array
        Real floating data of any Array API backend, at least 1-d, at most 32 axes.
    scheme : QuantScheme or str
        The scheme, or its text form (``"q4s:block32:f16"``, a preset such as ``"nvfp4"``).
    calibration : str, Calibration, MSE or Percentile
        ``"minmax"``: the min and max per block (or tensor). ``"absmean"``: ``(-g, g)`` with ``g``
        the mean of ``|x|``, summed by a fixed tree (one-level schemes only). ``"percentile"``,
        ``"mse"`` (one-level schemes only here: a two-level search keeps MinMax's global, which
        a range cannot carry) and their option forms: ``(-a, a)`` with ``a`` the chosen range, so
        that :func:`compute_q_params` and ``quantize(params=...)`` give the dynamic result. Affine
        schemes take ``"minmax"`` and ``"percentile"`` (its ``(lo, hi)``, with the same property).
    importance : array, optional
        Per-column error weights of a search (see :func:`quantize`).

    Returns
    -------
    (min, max) : tuple of arrays
        f32 arrays shaped as the scale grid (``(1,)`` per tensor), in ``x``'s namespace and device.

    Raises
    ------
    SchemeError
        An invalid scheme or calibration (``"absmean"`` with a two-level scheme).
    DTypeError
        ``x`` is not a real floating array.
    ShapeError
        ``x`` is 0-d, empty, of more than 32 axes, or of lower rank than the block.

    Examples
    --------
    >>> import numpy as np
    >>> lo, hi = compute_range(np.array([[1.0, -3.0, 2.0]]), "q8s:block2:f32")
    >>> lo.shape, hi.tolist()
    ((1, 2), [[1.0, 2.0]])
    """
    plan = _scheme(scheme)
    spec = check_calibration_spec(calibration, plan)
    xp, device = check_input(x, plan)
    shape = tuple(int(n) for n in x.shape)
    if spec.kind is Calibration.GGML:
        msg = (
            "compute_range cannot express calibration 'ggml': llama.cpp's codes do not follow from a range "
            "(Q8_0 rounds with the scale before it is stored, Q4_0 keeps the sign of the largest element); "
            "call quantize(x, scheme, calibration='ggml') instead"
        )
        raise SchemeError(msg)
    if plan.affine and spec.kind is Calibration.PERCENTILE:
        return _affine_percentile_range(x, plan, spec, importance, xp, device)
    if plan.affine and spec.kind is not Calibration.MINMAX:
        msg = (
            f"calibration {spec.kind.value!r} is not defined for the {plan.mode.value} scheme {plan.scheme}; "
            "affine schemes take the range 'minmax' or 'percentile' gives"
        )
        raise SchemeError(msg)
    if spec.kind in (Calibration.MINMAX, Calibration.ABSMEAN):
        if importance is not None:
            check_importance(importance, spec.kind, shape, xp, device)
        with shim.quiet(xp):
            return _compute_range(x, plan.block_dims(shape), spec.kind, xp=shim.kernel_namespace(xp))
    if spec.searches and plan.two_level:
        msg = (
            f"compute_range cannot express calibration {spec.kind.value!r} for the two-level scheme {plan.scheme}: "
            "its search keeps MinMax's global scale, which a range does not carry; call quantize(x, scheme, "
            f"calibration={spec.kind.value!r}) instead"
        )
        raise SchemeError(msg)
    with shim.quiet(xp):
        imp = check_importance(importance, spec.kind, shape, xp, device)
        kx = shim.kernel_namespace(xp)
        if dask_graph.handles(x):
            alpha = range_lazy(x, plan, spec, check_table(None, plan, xp, device), imp)
        else:
            alpha = _searched_range(x, plan, spec, imp, kx)
        return kx.negative(alpha), alpha


def _searched_range(x: Any, plan: Plan, spec: CalSpec, imp: Any, xp: Any) -> Any:
    """The percentile or searched range of ``x`` per block (or tensor), as :func:`quantize` finds it."""
    shape = tuple(int(n) for n in x.shape)
    dims = plan.block_dims(shape)
    chunks = row_chunks(shape, dims[0] if dims else 1, None, (1, 1), shim.slab_friendly(x))
    steps = Steps(plan, shape, spec.kind, spec=spec)
    tab = check_table(None, plan, xp, device_of(x))
    if not dims:
        if spec.kind is Calibration.PERCENTILE:
            return steps.tensor_percentile([x[c.rows, ...] for c in chunks], xp=xp)
        amax = max_of([steps.alpha(x[c.rows, ...], xp=xp) for c in chunks], xp=xp)
        return _search_tensor(x, chunks, steps, amax, tab, imp, xp)
    sink = Sink(len(chunks), plan.grid_shape(shape), xp.float32, xp, device_of(x))
    for c in chunks:
        xc = x[c.rows, ...]
        alpha = steps.alpha(xc, xp=xp)
        if steps.searches:
            alpha = steps.search(xc, alpha, tab, None, _columns(imp, c, xc), xp=xp)
        sink.put(c.grid, alpha)
    return sink.result


def compute_q_params(scheme: QuantScheme | str, min: Any, max: Any, *, table: Any = None) -> QParams:  # noqa: A002
    """Unrounded scales from a range; for a two-level scheme, normalised block scales and the global.

    Parameters
    ----------
    scheme : QuantScheme or str
        The scheme, or its text form (``"q4s:block32:f16"``, a preset such as ``"nvfp4"``).
    min, max : arrays
        The range, shaped as the scale grid, as :func:`compute_range` gives it.
    table : array, optional
        The lookup table of a lookup scheme (its scale is ``max|x| / max|table|``); a scheme
        with a codebook (``"nf4"``) brings its own.

    Returns
    -------
    QParams
        ``scales`` (f32, unrounded), ``global_scale`` (``(1,)`` f32 for a two-level scheme, else
        None) and ``table``. :func:`quantize` rounds the scales up onto the scale dtype. An affine
        scheme gives its stored scales with ``zero_point`` (in the codes' dtype) or ``offset``
        (f32): the zero point is computed from the stored scale.

    Raises
    ------
    SchemeError, ParamsError, ShapeError, DeviceError
        An invalid scheme, a missing or misshapen table, ``min`` and ``max`` of different shapes,
        namespaces or devices.

    Examples
    --------
    >>> import numpy as np
    >>> p = compute_q_params("q8s", np.array([-1.27]), np.array([0.5]))
    >>> round(float(p.scales[0]), 6)
    0.01
    >>> p = compute_q_params("u8:zero_point", np.array([-1.0]), np.array([3.0]))
    >>> p.scales.tolist(), p.zero_point.tolist()
    ([0.01568627543747425], [64])
    """
    plan = _scheme(scheme)
    xp = namespace_of(min, "min")
    check_same_place(xp, device_of(min), max=max)
    if tuple(min.shape) != tuple(max.shape):
        msg = f"min has shape {tuple(min.shape)} but max has {tuple(max.shape)}; pass both from compute_range"
        raise ShapeError(msg)
    with shim.quiet(xp):
        tab = check_table(table, plan, xp, device_of(min))
        kx = shim.kernel_namespace(xp)
        lo, hi = xp.astype(min, xp.float32), xp.astype(max, xp.float32)
        if plan.affine:
            s, zero = affine_params(lo, hi, plan, xp=kx)
            if plan.mode is QuantMode.OFFSET:
                return QParams(scales=s, offset=zero)
            return QParams(scales=s, zero_point=xp.astype(zero, getattr(xp, plan.code_dtype)))
        s, g = scales_from_range(lo, hi, plan, xp=kx, table=tab)
    return QParams(scales=s, global_scale=g, table=tab)


def round_up_scales(s: Any, scale_dtype: ScaleDtype | str) -> Any:
    """Scales as stored: each rounded up to ``scale_dtype``'s grid (f32 result).

    Parameters
    ----------
    s : array
        Non-negative real floating scales.
    scale_dtype : ScaleDtype or {"f32", "f16", "bf16", "ue4m3", "ue8m0"}
        The storage dtype. Each scale becomes the smallest value of that dtype not below it;
        scales beyond the dtype's maximum saturate at it.

    Returns
    -------
    array
        f32 scales of the same shape, namespace and device.

    Raises
    ------
    ParamsError
        Scales that are not real floating values, or a negative scale.
    SchemeError
        An unknown scale dtype.

    Examples
    --------
    >>> import numpy as np
    >>> round_up_scales(np.array([1.0012, 0.3]), "f16").tolist()
    [1.001953125, 0.300048828125]
    """
    dtype = ScaleDtype.coerce(scale_dtype)
    xp = namespace_of(s, "s")
    if not is_real_float(xp, s.dtype):
        msg = f"s has dtype {s.dtype}; scales must be real floating values"
        raise ParamsError(msg)
    s32 = xp.astype(s, xp.float32)
    if can_read(s32):
        flat = xp.reshape(s32, (-1,))
        neg = flat < 0
        if bool(xp.any(neg)):
            i = int(xp.argmax(xp.astype(neg, xp.uint8)))
            msg = f"s has a negative scale at flat index {i} ({float(flat[i])}); scales are magnitudes, pass abs(s)"
            raise ParamsError(msg)
    with shim.quiet(xp):
        return _round_up(s32, dtype, xp=xp)


def quantize(
    x: Any,
    scheme: QuantScheme | str,
    params: QParams | None = None,
    *,
    calibration: Calibration | str | MSE | Percentile = "minmax",
    importance: Any = None,
    table: Any = None,
    rounding: str = "half_even",
    check_finite: bool = True,
) -> QuantizedTensor:
    """Quantize ``x`` with ``scheme``: dynamically (``params=None``) or with given parameters.

    Parameters
    ----------
    x : array
        Real floating data of any Array API backend (NumPy, CuPy, torch, JAX, Dask,
        array-api-strict), at least 1-d and at most 32 axes. The result lives in the same
        namespace and on the same device; a Dask input gives a lazy result.
    scheme : QuantScheme or str
        The scheme, or its text form (``"q4s:block32:f16"``, a preset such as ``"nvfp4"``).
    params : QParams, optional
        Static parameters (scales shaped as the scale grid, and the global scale of a two-level
        scheme). None calibrates them from ``x``.
    calibration : str, Calibration, MSE or Percentile
        How dynamic quantization finds each block's range: ``"minmax"`` (default), ``"absmean"``,
        the searches ``"mse"`` (text options ``"mse:grid=50,max_shrink=0.3,norm=2"`` or
        :class:`MSE`) and ``"4over6"`` (NVFP4-like schemes), or ``"percentile"``
        (``"percentile:99.5"`` or :class:`Percentile`). A search keeps, per block (per tensor for
        a per-tensor scheme), the candidate whose stored scale gives the smallest error; under a
        two-level scheme the global is MinMax's and the block scales are searched beneath it.
    importance : array, optional
        Search calibrations only: one non-negative weight per column of ``x``'s last axis (e.g.
        the mean squared activation of each input feature); the search minimises the weighted error.
    table : array, optional
        The ``2**bits`` entries of a lookup scheme's table (e.g. ``aq.NF4``); schemes that name
        a codebook (``"nf4"``) need none.
    rounding : {"half_even", "half_away"}
        Integer values only: ties to even (default, as Burn's GPU kernels), or away from zero
        (as Burn's CPU backends, Rust's ``f32::round``).
    check_finite : bool
        True (default) refuses NaN and infinities with :class:`NonFiniteInputError`. False
        calibrates on the finite values, saturates infinities to the range ends, and gives NaN
        code 0 (integer values, E2M1) or the NaN code (E4M3/E5M2).

    Returns
    -------
    QuantizedTensor
        Stored values, stored (rounded-up) scales as f32, the global scale of a two-level scheme.

    Raises
    ------
    SchemeError
        An invalid scheme, calibration or rounding name.
    ParamsError
        Parameters or a table that do not fit the scheme (MissingGlobalScaleError,
        UnexpectedGlobalScaleError), scales that are negative, non-finite or beyond f32.
    ShapeError
        ``x`` 0-d, empty or of more than 32 axes; a block or packed axis the data lacks; a scale
        grid of the wrong shape.
    DTypeError
        ``x`` is not a real floating array.
    NonFiniteInputError
        NaN or infinity in ``x`` while ``check_finite`` is on.
    DeviceError
        Parameters in another namespace or on another device than ``x``.

    Examples
    --------
    >>> import numpy as np
    >>> qt = quantize(np.array([[0.5, -1.0, 0.25, 2.0]]), "q8s:block2:f16:native")
    >>> qt.codes().tolist(), qt.scales.tolist()
    ([[63, -127, 16, 127]], [[0.00788116455078125, 0.0157623291015625]])
    """
    plan = _scheme(scheme)
    rounding = check_rounding(rounding, plan)
    spec = check_calibration_spec(calibration, plan)
    xp, device = check_input(x, plan)
    shape = tuple(int(n) for n in x.shape)
    if spec.kind is Calibration.GGML:
        return _quantize_ggml(x, plan, params, importance, table, xp, device)
    imp = None
    if importance is not None:
        if params is not None:
            msg = "importance weights a calibration search; static params need none: drop importance or params"
            raise ParamsError(msg)
        with shim.quiet(xp):
            imp = check_importance(importance, spec.kind, shape, xp, device)
    if plan.affine:
        return _quantize_affine(x, plan, params, spec, imp, table, rounding, check_finite, xp, device)
    readable = can_read(x)
    given = None
    if params is not None:
        given = check_params(params, plan, shape, xp, device, table)
        tab = given[2]
        if check_finite and readable:
            with shim.quiet(xp):  # float64 beyond the f32 range overflows on purpose here
                check_data_finite(x, xp)
    else:
        tab = check_table(table, plan, xp, device)
    if dask_graph.handles(x):
        with shim.quiet(xp):
            return quantize_lazy(x, plan, given, tab, spec, rounding, check_finite, imp)
    with shim.quiet(xp):
        kx = shim.kernel_namespace(xp)
        return _quantize(x, plan, given, tab, spec, rounding, check_finite, readable, kx, device, imp)


def _quantize_ggml(
    x: Any, plan: Plan, params: Any, importance: Any, table: Any, xp: Any, device: Any
) -> QuantizedTensor:
    """``calibration="ggml"``: llama.cpp's quantizer, on the host in f32 as ggml runs it.

    The reference quantizers (``quantize_row_*_ref``), or with ``importance`` llama.cpp's
    importance-matrix searches (``quant_weights``) for the types that have one.
    """
    kind = ggml_kind(plan)
    assert kind is not None  # check_calibration_spec refused the others
    from .fused import ggml_kquants, ggml_reference  # host NumPy and Numba, as the other fused kernels

    weighs = kind in ggml_kquants.TYPES  # ggml's quantizer for the type has an importance-weighted search
    named = (("params", params), ("importance", None if weighs else importance), ("table", table))
    extra = [n for n, v in named if v is not None]
    if extra:
        why = "its own scales from the data, as llama-quantize does"
        if "importance" in extra:
            why += f" (its {kind} quantizer takes no importance matrix)"
        msg = (
            f"calibration 'ggml' computes {why}; drop {', '.join(extra)}, or use calibration='mse' to weight "
            "a search by importance"
        )
        raise ParamsError(msg)
    if dask_graph.handles(x):
        msg = "calibration 'ggml' runs eagerly on the host; pass x.compute() (or a NumPy array) instead of a Dask array"
        raise SchemeError(msg)
    shape = tuple(int(n) for n in x.shape)
    sizes = {**ggml_reference.KINDS, **ggml_reference.OFFSET_KINDS}
    per = sizes[kind][1] if kind in sizes else ggml_kquants.TYPES[kind][0]
    if shape[-1] % per:
        msg = (
            f"calibration 'ggml' quantizes whole blocks of {per} along the last axis, as ggml does, but x has "
            f"{shape[-1]} there; pad the rows, or use calibration='minmax', which pads a partial block"
        )
        raise ShapeError(msg)
    name = shim.backend_name(x)
    kx = shim.kernel_namespace(xp)
    move = lambda a: shim.convert(a, name, device)
    if importance is not None or kind not in sizes:  # the K-quants and IQ4, and ggml's imatrix searches
        imatrix = None if importance is None else check_ggml_importance(importance, shape, xp, device)
        codes, scales, offsets = ggml_kquants.quantize_host(x, kind, imatrix)
        grid = plan.grid_shape(shape)
        extra_grids = {} if offsets is None else {"offset": move(offsets.reshape(grid))}
        values = pack_codes(move(codes), plan, xp=kx)
        return QuantizedTensor(plan.scheme, shape, x.dtype, values, move(scales.reshape(grid)), **extra_grids)
    if kind in ggml_reference.OFFSET_KINDS:  # Q4_1, Q5_1: x = d * q + m
        codes, d, m = ggml_reference.quantize_offset_host(x, kind)
        return QuantizedTensor(
            plan.scheme, shape, x.dtype, pack_codes(move(codes), plan, xp=kx), move(d), offset=move(m)
        )
    codes, scales = ggml_reference.quantize_host(x, kind)  # on the host in f32, as llama.cpp runs it
    values = pack_codes(move(codes), plan, xp=kx)
    return QuantizedTensor(plan.scheme, shape, x.dtype, values, move(scales), None, None)


def _quantize_affine(
    x: Any,
    plan: Plan,
    params: Any,
    spec: CalSpec,
    imp: Any,
    table: Any,
    rounding: str,
    check_requested: bool,
    xp: Any,
    device: Any,
) -> QuantizedTensor:
    """Zero-point and offset schemes: MinMax over each block's ``(min, max)``, its MSE search, the
    percentile range, or given parameters."""
    if spec.kind not in (Calibration.MINMAX, Calibration.MSE, Calibration.PERCENTILE):
        msg = (
            f"calibration {spec.kind.value!r} is not defined for the {plan.mode.value} scheme {plan.scheme}; "
            "affine schemes calibrate with 'minmax' (their range is the block's min and max), its 'mse' search "
            "or 'percentile', or take static params=QParams(scales=..., zero_point=... or offset=...)"
        )
        raise SchemeError(msg)
    shape = tuple(int(n) for n in x.shape)
    check_table(table, plan, xp, device)
    readable = can_read(x)
    given = None
    if params is not None:
        scales_in, _, _ = check_params(params, plan, shape, xp, device)
        given = (scales_in, check_zero(params, plan, shape, xp, device))
        if check_requested and readable:
            with shim.quiet(xp):
                check_data_finite(x, xp)
    # the CalSpec of a search or a percentile (None: MinMax, or given parameters)
    cal = spec if (spec.searches or spec.kind is Calibration.PERCENTILE) and given is None else None
    scrub = not (check_requested and readable)
    if dask_graph.handles(x):
        with shim.quiet(xp):
            return quantize_affine_lazy(x, plan, given, rounding, check_requested, cal, imp)
    with shim.quiet(xp):
        kx = shim.kernel_namespace(xp)
        return _quantize_affine_eager(x, plan, given, rounding, scrub, kx, device, cal, imp)


def _affine_percentile_range(
    x: Any, plan: Plan, spec: CalSpec, importance: Any, xp: Any, device: Any
) -> tuple[Any, Any]:
    """``compute_range`` of an affine scheme under the percentile: the ``(lo, hi)`` :func:`quantize` calibrates on.

    Not checked for finiteness, as the symmetric ranges: NaN or infinities give a non-finite range.
    """
    shape = tuple(int(n) for n in x.shape)
    with shim.quiet(xp):
        check_importance(importance, spec.kind, shape, xp, device)  # refuses any: the percentile weighs nothing
        if dask_graph.handles(x):
            return affine_range_lazy(x, plan, spec)
        kx = shim.kernel_namespace(xp)
        steps = AffineSteps(plan, shape, spec=spec)
        dims = plan.block_dims(shape)
        chunks = row_chunks(shape, dims[0] if dims else 1, None, (1, 1), shim.slab_friendly(x))
        if not dims:
            return steps.tensor_percentile([x[c.rows, ...] for c in chunks], xp=kx)
        grid = plan.grid_shape(shape)
        lows, highs = (Sink(len(chunks), grid, kx.float32, kx, device) for _ in range(2))
        for c in chunks:
            lo, hi = steps.range(x[c.rows, ...], xp=kx)
            lows.put(c.grid, lo)
            highs.put(c.grid, hi)
        return lows.result, highs.result


def _quantize_affine_eager(
    x: Any, plan: Plan, given: Any, rounding: str, scrub: bool, xp: Any, device: Any, spec: Any, imp: Any
) -> QuantizedTensor:
    shape = tuple(int(n) for n in x.shape)
    dims = plan.block_dims(shape)
    chunks = row_chunks(
        shape, dims[0] if dims else 1, plan.packed_axis(len(shape)), pack_unit(plan), shim.slab_friendly(x)
    )
    steps = AffineSteps(plan, shape, rounding, scrub, spec if given is None else None)
    if not scrub and steps.spec is None:  # the fused kernels calibrate by MinMax only
        hit = _fused_affine(x, plan, None if given is None else steps.stored(*given, xp=xp), rounding, shape)
        if hit is not None:  # else (not covered, or NaN/inf to report) the portable path below runs
            return _affine_tensor(plan, shape, x.dtype, *hit)

    def verify(lo: Any, hi: Any) -> None:
        # a non-finite range means non-finite data: find and report it before storing anything
        if not scrub and not bool(xp.all(xp.logical_and(xp.isfinite(lo), xp.isfinite(hi)))):
            check_data_finite(x, xp)

    whole = None  # (scales, zero) for the whole tensor: given, or per-tensor MinMax
    if given is not None:
        whole = steps.stored(*given, xp=xp)
    elif not dims and steps.percentile:
        lo, hi = steps.tensor_percentile([x[c.rows, ...] for c in chunks], xp=xp)  # counting passes over slabs
        verify(lo, hi)
        whole = steps.params(lo, hi, xp=xp)
    elif not dims:
        parts = [steps.range(x[c.rows, ...], xp=xp) for c in chunks]
        lo = functools.reduce(xp.minimum, [p[0] for p in parts])
        hi = max_of([p[1] for p in parts], xp=xp)
        verify(lo, hi)
        if steps.searches:
            lo, hi = _search_tensor_affine(x, chunks, steps, lo, hi, imp, xp)
        whole = steps.params(lo, hi, xp=xp)
    grid = plan.grid_shape(shape)
    vshape, vdtype = values_layout(plan, shape)
    values = Sink(len(chunks), vshape, getattr(xp, vdtype), xp, device)
    scales = Sink(len(chunks), grid, xp.float32, xp, device)
    zeros = Sink(len(chunks), grid, xp.float32, xp, device)
    for c in chunks:
        xc = x[c.rows, ...]
        if whole is None:
            lo, hi = steps.range(xc, xp=xp)
            verify(lo, hi)
            if steps.searches:
                lo, hi = steps.search(xc, lo, hi, _columns(imp, c, xc), xp=xp)
            s_c, z_c = steps.params(lo, hi, xp=xp)
            scales.put(c.grid, s_c)
            zeros.put(c.grid, z_c)
        elif dims:
            s_c, z_c = whole[0][c.grid, ...], whole[1][c.grid, ...]
        else:
            s_c, z_c = whole
        values.put(c.stored, steps.values(xc, s_c, z_c, xp=xp))
    s_all, z_all = whole if whole is not None else (scales.result, zeros.result)
    return _affine_tensor(plan, shape, x.dtype, values.result, s_all, steps.as_stored_zero(z_all, xp=xp))


def _search_tensor_affine(
    x: Any, chunks: list[Any], steps: AffineSteps, lo: Any, hi: Any, imp: Any, xp: Any
) -> tuple[Any, Any]:
    """Per-tensor MSE search of an affine scheme: the candidate ``(f * lo, f * hi)`` of least total error."""
    spec = steps.spec
    dev = device_of(lo)
    unit = error_unit(xp.maximum(xp.abs(lo), xp.abs(hi)), xp=xp)
    errors, factors = [], []
    for f in spec.factors:
        fa = xp.asarray([f], dtype=xp.float32, device=dev)
        lo_f, hi_f = xp.multiply(lo, fa), xp.multiply(hi, fa)
        rows = []
        for c in chunks:
            xf = steps.finite(x[c.rows, ...], xp=xp)
            w = element_weights(tuple(xf.shape), _columns(imp, c, xf), xp=xp, device=device_of(xf))
            rows.append(row_errors(xf, steps.roundtrip(xf, lo_f, hi_f, xp=xp), unit, w, spec.norm, xp=xp))
        errors.append(xp.concat(rows) if len(rows) > 1 else rows[0])
        factors.append(fa)
    f_best = select(errors, factors, xp=xp)
    return xp.multiply(lo, f_best), xp.multiply(hi, f_best)


def _fused_affine(x: Any, plan: Plan, stored: Any, rounding: str, shape: tuple[int, ...]) -> Any:
    """``(values, scales, zero)`` from a fused (Numba) affine kernel, or None (tests/test_fused_affine.py)."""
    from .fused import registry

    kernel = registry.affine_quantize_kernel(x, plan, shape)
    return None if kernel is None else kernel(x, plan, stored, rounding)


def _affine_tensor(plan: Plan, shape: tuple[int, ...], dtype: Any, values: Any, s: Any, zero: Any) -> QuantizedTensor:
    if plan.mode is QuantMode.ZERO_POINT:
        return QuantizedTensor(plan.scheme, shape, dtype, values, s, zero_point=zero)
    return QuantizedTensor(plan.scheme, shape, dtype, values, s, offset=zero)


def _search_tensor(x: Any, chunks: list[Any], steps: Steps, amax: Any, tab: Any, imp: Any, xp: Any) -> Any:
    """Per-tensor search: the candidate ``alpha`` whose stored scale gives the smallest total error.

    Row errors are kept per candidate (a vector of rows), the data re-read once per candidate, so
    memory stays one slab; totals sum the rows by a fixed tree whatever the slabs were.
    """
    spec = steps.spec
    unit = _round_up(amax, ScaleDtype.UE8M0, xp=xp)
    errors, alphas = [], []
    for f in spec.factors:
        alpha = xp.multiply(amax, xp.asarray(f, dtype=xp.float32, device=device_of(amax)))
        alphas.append(alpha)
        eff = steps.scale_of(alpha, None, tab, xp=xp)
        rows = []
        for c in chunks:
            xf = steps.finite(x[c.rows, ...], xp=xp)
            w = element_weights(tuple(xf.shape), _columns(imp, c, xf), xp=xp, device=device_of(xf))
            rows.append(row_errors(xf, steps.roundtrip(xf, eff, tab, xp=xp), unit, w, spec.norm, xp=xp))
        errors.append(xp.concat(rows) if len(rows) > 1 else rows[0])
    return select(errors, alphas, xp=xp)


def _fused_mse(x: Any, plan: Plan, spec: CalSpec, imp: Any, rounding: str) -> tuple[Any, Any, Any] | None:
    """Codes, stored scales and global (None for one level) of an MSE search from a fused (Numba) kernel, or None.

    The kernels repeat the portable search's f32 steps in the same order, so the bits are the same
    (tests/test_fused_search.py, tests/test_fused_float_search.py, tests/test_fused_tensor_search.py,
    tests/test_fused_block2d_search.py compare them); ``ARRAYQUANT_FUSED=0`` turns them off.
    """
    from .fused import registry

    kernel = registry.mse_kernel(x, plan, tuple(int(n) for n in x.shape))
    return None if kernel is None else kernel(x, plan, spec.factors, spec.norm, imp, rounding)


def _fused_minmax(
    x: Any, plan: Plan, given: Any, rounding: str, shape: tuple[int, ...], xp: Any
) -> tuple[Any, Any, Any] | None:
    """Values, stored scales and global from a fused kernel (MinMax, or given scales), or None.

    The kernels take the portable path's f32 steps in the same order (tests/test_fused_quantize.py
    compares them bit for bit); None where none applies or the data holds NaN/inf.
    """
    from .fused import registry

    if given is None:
        kernel = registry.quantize_kernel(x, plan, shape)
        return None if kernel is None else kernel(x, plan, rounding)
    encode = registry.encode_kernel(x, plan, shape)
    if encode is None:
        return None
    scales_in, glob, _ = given
    stored = store_scales(scales_in, plan, xp=xp)
    values = encode(x, plan, stored, glob, rounding)
    return None if values is None else (values, stored, glob)


def _columns(imp: Any, c: Any, xc: Any) -> Any:
    """The importance weights of a row slab: all of them, unless the rows are the columns (1-D data)."""
    if imp is None or xc.ndim > 1:
        return imp
    return imp[c.rows]


def _quantize(
    x: Any,
    plan: Plan,
    given: Any,
    tab: Any,
    spec: CalSpec,
    rounding: str,
    check_requested: bool,
    readable: bool,
    xp: Any,
    device: Any,
    imp: Any = None,
) -> QuantizedTensor:
    shape = tuple(int(n) for n in x.shape)
    dims = plan.block_dims(shape)
    chunked = shim.slab_friendly(x)
    chunks = row_chunks(shape, dims[0] if dims else 1, plan.packed_axis(len(shape)), pack_unit(plan), chunked)
    # input not verified finite (check off, or unreadable now): scrub NaN, calibrate on finite values
    cal = spec.kind
    steps = Steps(plan, shape, cal, rounding, scrub=not (check_requested and readable), spec=spec)
    grid = plan.grid_shape(shape)
    f32 = xp.float32
    if given is None and spec.kind is Calibration.MSE and not steps.scrub:
        hit = _fused_mse(x, plan, spec, imp, rounding)
        if hit is not None:  # else (not covered, or NaN/inf to report) the portable path below runs
            codes, stored_f, glob_f = hit
            return QuantizedTensor(plan.scheme, shape, x.dtype, pack_codes(codes, plan, xp=xp), stored_f, glob_f, tab)

    if cal is Calibration.MINMAX and not steps.scrub and tab is None:
        hit = _fused_minmax(x, plan, given, rounding, shape, xp)
        if hit is not None:  # else (not covered, or NaN/inf to report) the portable path below runs
            return QuantizedTensor(plan.scheme, shape, x.dtype, *hit, tab)

    def verify(alpha: Any) -> None:
        # a non-finite range means non-finite data: find and report it before storing anything
        if not steps.scrub and not bool(xp.all(xp.isfinite(alpha))):
            check_data_finite(x, xp)

    glob = None
    stored = None
    raw = None  # two-level: unnormalised block scales, normalised slab by slab below
    fused = given is None and dims and not plan.two_level
    if given is not None:
        scales_in, glob, _ = given
        stored = store_scales(scales_in, plan, xp=xp)
    elif dims and plan.two_level:
        # the global needs every block scale first; only the raw grid is kept whole, so the
        # working set is one grid plus a slab, not the several grid-sized temporaries of one pass
        sink = Sink(len(chunks), grid, f32, xp, device)
        for c in chunks:
            alpha_c = steps.alpha(x[c.rows, ...], xp=xp)
            verify(alpha_c)
            sink.put(c.grid, block_scales(alpha_c, plan, xp=xp, table=tab))
        raw = sink.result
        glob = global_scale(xp.reshape(xp.max(raw), (1,)), plan, xp=xp)
    elif not fused:
        if cal is Calibration.ABSMEAN:
            alpha = steps.alpha(x, xp=xp)  # one fixed summation tree over the whole tensor
        elif cal is Calibration.PERCENTILE:
            alpha = steps.tensor_percentile([x[c.rows, ...] for c in chunks], xp=xp)  # counting passes over slabs
        else:
            alpha = max_of([steps.alpha(x[c.rows, ...], xp=xp) for c in chunks], xp=xp)
        verify(alpha)
        if steps.searches:
            alpha = _search_tensor(x, chunks, steps, alpha, tab, imp, xp)
        s, glob = scales_from_absmax(alpha, plan, xp=xp, table=tab)
        stored = store_scales(s, plan, xp=xp)

    vshape, vdtype = values_layout(plan, shape)
    values = Sink(len(chunks), vshape, getattr(xp, vdtype), xp, device)
    scales = Sink(len(chunks), grid, f32, xp, device)
    for c in chunks:
        xc = x[c.rows, ...]
        if fused:
            alpha_c = steps.alpha(xc, xp=xp)
            verify(alpha_c)
            if steps.searches:
                alpha_c = steps.search(xc, alpha_c, tab, None, _columns(imp, c, xc), xp=xp)
            stored_c = store_scales(scales_from_absmax(alpha_c, plan, xp=xp, table=tab)[0], plan, xp=xp)
            scales.put(c.grid, stored_c)
        elif raw is not None and steps.searches:
            # the global stays MinMax's; each block's scale is searched beneath it
            alpha_c = steps.search(xc, steps.alpha(xc, xp=xp), tab, glob, _columns(imp, c, xc), xp=xp)
            stored_c = store_scales(
                normalise_scales(block_scales(alpha_c, plan, xp=xp, table=tab), glob, xp=xp), plan, xp=xp
            )
            scales.put(c.grid, stored_c)
        elif raw is not None:
            stored_c = store_scales(normalise_scales(raw[c.grid, ...], glob, xp=xp), plan, xp=xp)
            scales.put(c.grid, stored_c)
        else:
            assert stored is not None
            stored_c = stored[c.grid, ...] if dims else stored
        eff = effective_scale(stored_c, glob, plan, xp=xp)
        values.put(c.stored, steps.values(xc, eff, tab, xp=xp))
    if stored is None:
        stored = scales.result
    return QuantizedTensor(plan.scheme, shape, x.dtype, values.result, stored, glob, tab)
