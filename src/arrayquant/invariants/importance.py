"""The ``importance=`` argument: per-column error weights of a search calibration."""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from ..errors import DTypeError, ParamsError, ShapeError
from ..scheme import Calibration
from .data import can_read, check_same_place, is_real_float, namespace_of
from .plan import SEARCHES

__all__ = ["check_ggml_importance", "check_importance"]


def check_importance(importance: Any, calibration: Calibration, shape: tuple[int, ...], xp: Any, device: Any) -> Any:
    """Validate ``importance`` for data of ``shape``; return it as f32 scaled to a maximum of 1 (or None).

    It must be a 1-D real floating array of length ``shape[-1]`` in the data's namespace and on its
    device, finite and non-negative (checked where it can be read now), and only goes with a search
    calibration (``mse``, ``4over6``). Scaling by the maximum changes no choice and keeps the
    weighted sums finite; all zeros weigh every candidate equally (MinMax's choice).

    Raises
    ------
    ParamsError
        With a calibration that does not use it; negative, NaN or infinite entries.
    DTypeError
        Not an array, or not real floating.
    ShapeError
        Not 1-D of length ``shape[-1]``.
    DeviceError
        In another namespace or on another device than the data.
    """
    if importance is None:
        return None
    if calibration not in SEARCHES:
        msg = (
            f"importance weights the error of a search; calibration {calibration.value!r} does not use them: "
            "use calibration='mse' or '4over6', or drop importance"
        )
        raise ParamsError(msg)
    _check_float_here(importance, xp, device, "e.g. mean squared activations")
    if importance.ndim != 1 or int(importance.shape[0]) != shape[-1]:
        msg = (
            f"importance has shape {tuple(importance.shape)}; it must be 1-D with one weight per input column "
            f"of the data's last axis, shape ({shape[-1]},)"
        )
        raise ShapeError(msg)
    v = _finite_non_negative(xp.astype(importance, xp.float32), xp, "index")
    top = xp.max(v)
    dev = compat.device(v)
    one = xp.asarray(1.0, dtype=xp.float32, device=dev)
    return xp.divide(v, xp.where(top > 0, top, one))


def check_ggml_importance(importance: Any, shape: tuple[int, ...], xp: Any, device: Any) -> Any:
    """Validate llama.cpp's importance matrix for data of ``shape``: returned as f32, unscaled.

    ggml's searches weigh each column by ``quant_weights`` as given (a constant factor moves their
    f32 rounding), so the values pass unchanged. One weight per column of the last axis, for every
    row (shape ``(cols,)``), or for data stacked as ``(..., rows, cols)`` one vector per matrix
    (``(..., 1, cols)`` or ``(..., cols)``), as llama-quantize gives each expert of a 3-D tensor its
    own; finite and non-negative.

    Raises
    ------
    DTypeError
        Not an array, or not real floating.
    ShapeError
        None of the shapes above.
    ParamsError
        A negative, NaN or infinite entry.
    DeviceError
        In another namespace or on another device than the data.
    """
    _check_float_here(importance, xp, device, "llama.cpp's imatrix values")
    got = tuple(int(n) for n in importance.shape)
    cols = shape[-1] if shape else 0
    stacked = len(shape) >= 3 and got in ((*shape[:-2], 1, cols), (*shape[:-2], cols))
    if got != (cols,) and not stacked:
        per = f" or one per matrix, {(*shape[:-2], cols)}" if len(shape) >= 3 else ""
        msg = (
            f"importance has shape {got}; llama.cpp's importance matrix is one weight per column of the data's "
            f"last axis, shape ({cols},){per}"
        )
        raise ShapeError(msg)
    return _finite_non_negative(xp.astype(importance, xp.float32), xp, "flat index")


def _check_float_here(importance: Any, xp: Any, device: Any, what: str) -> None:
    """A real floating array in the data's namespace, on its device (``what``: the values it should hold)."""
    ixp = namespace_of(importance, "importance")
    if not is_real_float(ixp, importance.dtype):
        msg = f"importance has dtype {importance.dtype}; it must be real floating ({what})"
        raise DTypeError(msg)
    check_same_place(xp, device, importance=importance)


def _finite_non_negative(v: Any, xp: Any, where: str) -> Any:
    """``v`` (f32), refused at its first NaN, infinite or negative entry where it can be read now."""
    if can_read(v):
        flat = xp.reshape(v, (-1,))
        bad = xp.logical_not(xp.isfinite(flat)) | (flat < 0)
        if bool(xp.any(bad)):
            i = int(xp.argmax(xp.astype(bad, xp.uint8)))
            msg = f"importance has {float(flat[i])} at {where} {i}; weights must be finite and non-negative"
            raise ParamsError(msg)
    return v
