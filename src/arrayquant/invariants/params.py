"""Parameters against the scheme: presence, counts, grid shapes and values."""

from __future__ import annotations

import math
import warnings
from typing import Any

import array_api_compat as compat

from ..errors import MissingGlobalScaleError, ParamsError, ShapeError, UnexpectedGlobalScaleError
from ..scheme import CODEBOOKS, F32_MAX, QParams, QuantMode, to_f32
from .data import can_read, check_same_place, is_real_float
from .plan import Plan

__all__ = ["CheckedParams", "check_params", "check_scale_values", "check_table", "check_zero", "check_zero_values"]

CheckedParams = tuple[Any, Any, Any]  # (scales f32 grid, global f32 (1,) or None, table f32 or None)


def _as_f32(value: Any, name: str, xp: Any, device: Any) -> Any:
    if compat.is_array_api_obj(value) and value.dtype == xp.float32:
        return xp.astype(value, xp.float32, copy=False)  # the common case: nothing to widen or range-check
    with warnings.catch_warnings():
        # a float64 beyond the f32 range becomes inf in the cast: reported below as a typed error
        warnings.simplefilter("ignore", RuntimeWarning)
        if compat.is_array_api_obj(value):
            if not is_real_float(xp, value.dtype):
                msg = f"{name} has dtype {value.dtype}; scales must be real floating values (they are used as f32)"
                raise ParamsError(msg)
            source = value
        else:
            try:
                source = xp.asarray(value, device=device)
            except (TypeError, ValueError, OverflowError) as exc:
                msg = f"{name} must be an array of floats, got {value!r:.200} ({exc})"
                raise ParamsError(msg) from None
        try:
            out = xp.astype(source, xp.float32)
        except (TypeError, ValueError) as exc:
            msg = f"{name} must be an array of floats, got {value!r:.200} ({exc})"
            raise ParamsError(msg) from None
    if can_read(source) and is_real_float(xp, source.dtype):
        src = xp.reshape(source, (-1,))
        over = xp.logical_and(xp.isfinite(src), xp.abs(src) > F32_MAX)
        if bool(xp.any(over)):
            i = int(xp.argmax(xp.astype(over, xp.uint8)))
            msg = (
                f"{name} has a value beyond the float32 range at flat index {i} ({float(src[i])}); scales are "
                f"used as f32, whose largest finite value is {F32_MAX:g}, so rescale the data or the scales"
            )
            raise ParamsError(msg)
    return out


def check_scale_values(arr: Any, name: str, xp: Any, *, signed: bool = False) -> None:
    """Refuse NaN, infinite or (unless ``signed``) negative scales (only on arrays that can be read now)."""
    if not can_read(arr):
        return
    flat = xp.reshape(arr, (-1,))
    if flat.shape[0] == 0:
        return
    # two reductions, no grid-sized temporaries (min and max propagate NaN); the masks only on failure
    low = -math.inf if signed else 0
    ok = xp.logical_and(xp.min(flat) > low if signed else xp.min(flat) >= low, xp.max(flat) < math.inf)
    if not can_read(ok) or bool(ok):  # unreadable: concrete scales used inside a jax.jit trace
        return
    bad = xp.logical_not(xp.isfinite(flat))
    if not signed:
        bad = xp.logical_or(bad, flat < 0)
    if bool(xp.any(bad)):
        i = int(xp.argmax(xp.astype(bad, xp.uint8)))
        count = int(xp.sum(xp.astype(bad, xp.int32), dtype=xp.int32))
        rule = "finite" if signed else "finite and >= 0"
        msg = (
            f"{name} has {count} invalid entr{'y' if count == 1 else 'ies'} (first at flat index {i}: "
            f"{float(flat[i])}); scales must be {rule}, so recompute them from clean data"
        )
        raise ParamsError(msg)


def check_params(
    params: Any, plan: Plan, shape: tuple[int, ...], xp: Any, device: Any, table: Any = None, what: str = "params"
) -> CheckedParams:
    """Validate parameters for data of ``shape``; return them as f32 arrays.

    ``what`` names their holder in messages: ``params`` for static quantization, ``qt`` for the
    stored scales of a quantized tensor about to be dequantized or written.
    """
    if not isinstance(params, QParams):
        msg = f"{what} must be an aq.QParams (or None for dynamic quantization), got {type(params).__name__}"
        raise ParamsError(msg)
    scheme = plan.scheme
    if params.scales is None:
        msg = f"{what}.scales is None; a {scheme} scheme needs scales shaped {plan.grid_shape(shape)}"
        raise ParamsError(msg)
    check_same_place(
        xp,
        device,
        **{f"{what}.scales": params.scales, f"{what}.global_scale": params.global_scale, f"{what}.table": params.table},
    )
    if plan.two_level and params.global_scale is None:
        msg = (
            f"scheme {scheme} is a two-level scheme (block scales of {plan.scale_dtype.name} times one "
            f"f32 per-tensor scale) but {what} has no per-tensor scale (global_scale is None); pass "
            "QParams(scales=block_scales, global_scale=g) with g of shape (1,), or compute both with "
            "aq.compute_q_params(scheme, *aq.compute_range(x, scheme))"
        )
        raise MissingGlobalScaleError(msg)
    if not plan.two_level and params.global_scale is not None:
        msg = (
            f"scheme {scheme} has one scale level, but {what} carries a per-tensor scale "
            "(global_scale) that it would ignore; drop global_scale, or make the scheme two-level "
            "with .per_block(size, 'ue4m3').per_tensor('f32')"
        )
        raise UnexpectedGlobalScaleError(msg)
    scales = _as_f32(params.scales, f"{what}.scales", xp, device)
    grid = plan.grid_shape(shape)
    if tuple(scales.shape) != grid:
        level = "one per-tensor scale" if plan.block is None else f"one scale per block of {plan.block}"
        msg = (
            f"{what}.scales has shape {tuple(scales.shape)} but scheme {scheme} on data of shape "
            f"{shape} needs {grid} ({level}); recompute them with aq.compute_q_params"
        )
        raise ShapeError(msg)
    # stored scales of integer codes may carry a sign (ggml's Q4_0); computed or given ones may not
    check_scale_values(scales, f"{what}.scales", xp, signed=what == "qt" and plan.signed_scales)
    glob = None
    if params.global_scale is not None:
        glob = _as_f32(params.global_scale, f"{what}.global_scale", xp, device)
        if math.prod(glob.shape) != 1:
            msg = (
                f"{what}.global_scale must hold exactly one element (the per-tensor scale), "
                f"got shape {tuple(glob.shape)}"
            )
            raise ShapeError(msg)
        glob = xp.reshape(glob, (1,))
        check_scale_values(glob, f"{what}.global_scale", xp)
    tab = check_table(table if table is not None else params.table, plan, xp, device)
    _check_zero_presence(params, plan, what)
    return scales, glob, tab


def _check_zero_presence(params: QParams, plan: Plan, what: str) -> None:
    """Each affine mode needs its own second parameter, and no scheme takes the other one."""
    mode = plan.mode
    for field, owner in (("zero_point", QuantMode.ZERO_POINT), ("offset", QuantMode.OFFSET)):
        given = getattr(params, field) is not None
        if mode is owner and not given:
            formula = "x = s * (q - z)" if owner is QuantMode.ZERO_POINT else "x = d * q + m"
            msg = (
                f"scheme {plan.scheme} is in {mode.value} mode ({formula}) but {what}.{field} is None; pass "
                f"QParams(scales=..., {field}=...) shaped as the scales, or let aq.quantize calibrate both"
            )
            raise ParamsError(msg)
        if mode is not owner and given:
            fix = f"make the scheme .with_mode('{owner.value}')" if not plan.value.is_float else "drop it"
            msg = f"{what}.{field} was given but scheme {plan.scheme} is in {mode.value} mode; drop {field}, or {fix}"
            raise ParamsError(msg)


def check_zero(params: QParams, plan: Plan, shape: tuple[int, ...], xp: Any, device: Any, what: str = "params") -> Any:
    """The zero points (integers as f32) or offsets (f32) of an affine scheme, checked; None otherwise.

    Zero points must be integers in the value's range; offsets finite floats. Both are shaped as
    the scale grid. Call after :func:`check_params`, which checked their presence.
    """
    mode = plan.mode
    if not mode.is_affine:
        return None
    field = "zero_point" if mode is QuantMode.ZERO_POINT else "offset"
    raw = getattr(params, field)
    name = f"{what}.{field}"
    check_same_place(xp, device, **{name: raw})
    if mode is QuantMode.ZERO_POINT:
        out = _as_zero_points(raw, name, plan, xp, device)
    else:
        out = _as_f32(raw, name, xp, device)
        check_scale_values(out, name, xp, signed=True)
    grid = plan.grid_shape(shape)
    if tuple(out.shape) != grid:
        msg = (
            f"{name} has shape {tuple(out.shape)} but scheme {plan.scheme} on data of shape {shape} has scales "
            f"shaped {grid}; give one {field.replace('_', ' ')} per scale"
        )
        raise ShapeError(msg)
    return out


def _as_zero_points(raw: Any, name: str, plan: Plan, xp: Any, device: Any) -> Any:
    """Integer zero points in ``[qmin, qmax]`` as f32 (exact: they are small integers)."""
    if compat.is_array_api_obj(raw):
        arr = raw
    else:
        try:
            arr = xp.asarray(raw, device=device)
        except (TypeError, ValueError, OverflowError) as exc:
            msg = f"{name} must be an array of integers, got {raw!r:.200} ({exc})"
            raise ParamsError(msg) from None
    if not xp.isdtype(arr.dtype, "integral"):
        msg = (
            f"{name} has dtype {arr.dtype}; zero points are integers in the code range "
            f"{plan.qmin}..{plan.qmax} of {plan.value.name} (e.g. uint8 or int8)"
        )
        raise ParamsError(msg)
    check_zero_values(arr, name, plan, xp)
    return xp.astype(arr, xp.float32)


def check_zero_values(arr: Any, name: str, plan: Plan, xp: Any) -> None:
    """Refuse zero points outside the codes' range ``[qmin, qmax]`` (arrays that can be read now)."""
    if not can_read(arr):
        return
    flat = xp.reshape(arr, (-1,))
    if flat.shape[0]:
        bad = xp.logical_or(flat < plan.qmin, flat > plan.qmax)
        if bool(xp.any(bad)):
            i = int(xp.argmax(xp.astype(bad, xp.uint8)))
            msg = (
                f"{name} has {int(flat[i])} at flat index {i}; {plan.value.name} zero points lie in "
                f"{plan.qmin}..{plan.qmax}, the codes' own range"
            )
            raise ParamsError(msg)


def check_table(table: Any, plan: Plan, xp: Any, device: Any) -> Any:
    """A LOOKUP table must be present with exactly ``2**bits`` entries; absent otherwise."""
    lookup = plan.scheme.mode is QuantMode.LOOKUP
    codebook = plan.scheme.codebook
    if table is None and codebook is not None:
        return xp.asarray(CODEBOOKS[codebook], dtype=xp.float32, device=device)
    if table is None:
        if lookup:
            msg = f"scheme {plan.scheme} is in lookup mode but no table was given; pass table=aq.NF4 or your codebook"
            raise ParamsError(msg)
        return None
    if not lookup:
        msg = (
            f"a table was given but scheme {plan.scheme} is in symmetric mode; drop the table or "
            "use scheme.with_mode('lookup')"
        )
        raise ParamsError(msg)
    check_same_place(xp, device, table=table)
    tab = _as_f32(table, "table", xp, device)
    want = 1 << plan.bits
    if tuple(tab.shape) != (want,):
        msg = f"table has shape {tuple(tab.shape)}; a {plan.bits}-bit lookup needs exactly ({want},) entries"
        raise ShapeError(msg)
    if codebook is not None and can_read(tab):
        named = [float(to_f32(v)) for v in CODEBOOKS[codebook]]
        if [float(v) for v in tab] != named:
            msg = (
                f"the table given differs from codebook {codebook!r} that scheme {plan.scheme} names; "
                "drop the table argument, or drop the codebook from the scheme to use your own table"
            )
            raise ParamsError(msg)
    return tab
