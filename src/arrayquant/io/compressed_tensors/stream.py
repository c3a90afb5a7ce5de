"""One weight of a safetensors file quantized into compressed-tensors entries, a row slab at a time.

The model writer never holds a whole float weight: it reads a slab of rows, quantizes it, encodes
it with the format's codec and keeps only the encoded slab, which is several times smaller. The
entries are the same bits as quantizing the whole tensor and encoding it once, because:

- blocks never straddle a slab: slabs are whole block rows, so each block's scale is computed
  from the same values;
- a scale that depends on the whole tensor (one scale per tensor, or a two-level scheme's global
  scale) is computed first, over all slabs, with :func:`~arrayquant.compute_range` and
  :func:`~arrayquant.compute_q_params`, and each slab is then quantized with those parameters,
  as :func:`~arrayquant.quantize` does itself within one call.

The weights of a fused layer (q/k/v, gate/up; see :mod:`arrayquant.io.compressed_tensors.fused_shards`) share that
per-tensor level instead: :func:`tensor_level` gives each one's own, :func:`shared_level` the
group's, and ``quantize_entry(..., level=...)`` quantizes a weight beneath it, its block scales
computed as :func:`~arrayquant.quantize` computes them beneath a global of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...backends import shim
from ...blockwork import Steps
from ...errors import NonFiniteInputError, SchemeError, ShapeError
from ...invariants import check_finite as check_data_finite
from ...invariants import check_input, plan_for
from ...invariants.importance import check_importance
from ...invariants.plan import check_calibration_spec
from ...kernels import block_scales, normalise_scales
from ...quantize import compute_q_params, compute_range, quantize
from ...scheme import Calibration, QParams, QuantMode, QuantScheme
from ..safetensors.reader import SafetensorsFile
from .schemes import write_weight

__all__ = ["SLAB_BYTES", "fits_format", "quantize_entry", "shared_level", "tensor_level"]

SLAB_BYTES = 2 << 20  # float32 bytes per slab; the working set is a few times this, beside the output

# entries with one row per weight row (or block row); the others are written once per weight
_ROWS = ("weight_packed", "weight")
_ZERO = "weight_zero_point"
_SCALES = ("weight_scale", _ZERO)


def _slab_rows(scheme: QuantScheme, shape: tuple[int, ...], budget: int) -> int:
    """Rows per slab: about ``budget`` bytes of float32, a whole number of block rows."""
    dims = plan_for(scheme).block_dims(shape)
    step = dims[0] if len(dims) == len(shape) else 1  # a block shorter in rank lies within one row
    if scheme.mode is QuantMode.ZERO_POINT:  # zero points are packed down the rows: 32 rows fill whole words
        step = math.lcm(step, 32)
    row_bytes = 4 * int(np.prod(shape[1:], dtype=np.int64))
    return max(step, budget // max(row_bytes, 1) // step * step)


def _range(st: SafetensorsFile, name: str, scheme: QuantScheme, start: int, stop: int) -> tuple[Any, Any]:
    """``compute_range`` of rows ``start:stop``, refusing NaN and infinity as :func:`quantize` does."""
    lo, hi = compute_range(st.rows(name, start, stop), scheme)
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        msg = (
            f"{name!r} holds NaN or infinity in rows {start}:{min(stop, st.entries[name].shape[0])}; "
            "quantize finite weights only (replace or clip the bad values first)"
        )
        raise NonFiniteInputError(msg)
    return lo, hi


def _glob(st: SafetensorsFile, name: str, scheme: QuantScheme, rows: int, step: int) -> Any:
    """The whole tensor's parameter, from one pass: its per-tensor ``QParams``, or a two-level global."""
    ranges = [_range(st, name, scheme, r, r + step) for r in range(0, rows, step)]
    if scheme.block is None:  # one range for the tensor
        lows, highs = zip(*ranges, strict=True)
        return compute_q_params(scheme, np.min(lows).reshape(1), np.max(highs).reshape(1))
    # the global follows the largest block scale, and grows with it: the largest of the slabs' globals
    globs = (compute_q_params(scheme, lo, hi).global_scale for lo, hi in ranges)
    return max(globs, key=lambda g: float(g[0]))


def _slab_params(st: SafetensorsFile, name: str, start: int, stop: int, scheme: QuantScheme, whole: Any) -> Any:
    """The parameters of one slab: none (all its own), the tensor's, or block scales under the global."""
    if whole is None or isinstance(whole, QParams):
        return whole
    plan, xp = plan_for(scheme), shim.kernel_namespace(np)
    lo, hi = _range(st, name, scheme, start, stop)
    raw = block_scales(np.maximum(np.abs(lo), np.abs(hi)), plan, xp=xp)
    return QParams(scales=normalise_scales(raw, whole, xp=xp), global_scale=whole)


def _is_minmax(calibration: Any) -> bool:
    return calibration is Calibration.MINMAX or (isinstance(calibration, str) and calibration.lower() == "minmax")


def quantize_entry(
    st: SafetensorsFile,
    name: str,
    scheme: QuantScheme,
    module: str,
    *,
    slab_bytes: int = SLAB_BYTES,
    calibration: Any = "minmax",
    importance: Any = None,
    level: Any = None,
) -> dict[str, np.ndarray]:
    """The compressed-tensors entries of the 2-d weight ``name`` of ``st``, quantized slab by slab.

    Equal, bit for bit, to ``write_weight(quantize(st.array(name), scheme, calibration=...,
    importance=...), module)``; raises as they do (a shape the format cannot hold, non-finite
    values, ...). A search calibration on a per-tensor or two-level scheme looks at the whole
    tensor at once, so that case reads it whole.

    ``level`` (from :func:`shared_level`) replaces the weight's own per-tensor level: a
    per-tensor scheme's values are quantized with its scale, a two-level scheme's block scales are
    computed (by ``calibration``) beneath its global, as :func:`~arrayquant.quantize` computes
    them beneath the weight's own; given the weight's own level, the entries are the same bits as
    without.
    """
    shape = st.entries[name].shape
    rows = shape[0]
    step = _slab_rows(scheme, shape, slab_bytes)
    extra: dict[str, Any] = {"calibration": calibration}
    if importance is not None:
        extra["importance"] = importance
    minmax = _is_minmax(calibration)
    if level is not None:
        if isinstance(level, QParams) or minmax:  # the level, and block scales from each slab's own range
            return _by_slabs(st, name, scheme, module, step, level)
        x = st.array(name)  # a two-level search or percentile: the weight whole, as without a level
        alpha = _block_ranges(x, scheme, level, calibration, importance)
        xp = shim.kernel_namespace(np)
        scales = normalise_scales(block_scales(alpha, plan_for(scheme), xp=xp), level, xp=xp)
        return write_weight(quantize(x, scheme, QParams(scales=scales, global_scale=level)), module)
    if rows <= step or (not minmax and (scheme.block is None or scheme.is_two_level)):  # the plain path
        return write_weight(quantize(st.array(name), scheme, **extra), module)
    whole = None if scheme.block is not None and not scheme.is_two_level else _glob(st, name, scheme, rows, step)
    return _by_slabs(st, name, scheme, module, step, whole, extra)


def _by_slabs(
    st: SafetensorsFile,
    name: str,
    scheme: QuantScheme,
    module: str,
    step: int,
    whole: Any,
    extra: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """The entries of ``name`` quantized ``step`` rows at a time under the tensor's parameter ``whole``."""
    shape = st.entries[name].shape
    rows = shape[0]
    dims = plan_for(scheme).block_dims(shape)
    block_rows = dims[0] if len(dims) == len(shape) else 1
    out: dict[str, np.ndarray] = {}
    for start in range(0, rows, step):
        params = _slab_params(st, name, start, start + step, scheme, whole)
        slab = st.rows(name, start, start + step)
        # blocks lie within a slab: a search per block sees the same values as on the whole tensor
        entries = write_weight(quantize(slab, scheme, params, **({} if params is not None else extra or {})), module)
        del slab
        for key, arr in entries.items():
            part = key.rpartition(".")[2]
            if part == "weight_shape":
                out[key] = np.asarray(shape, dtype=arr.dtype)
            elif part in _ROWS or (part in _SCALES and scheme.block is not None):
                per = 1 if part in _ROWS else block_rows  # data rows per row of the entry
                first, total = start // per, -(-rows // per)
                if part == _ZERO and arr.dtype == np.int32:  # grid rows packed into bit-stream words
                    bits = scheme.value.bits
                    first, total = first * bits // 32, -(-total * bits // 32)
                if key not in out:  # filled in place: the output is never held twice
                    out[key] = np.empty((total, *arr.shape[1:]), arr.dtype)
                out[key][first : first + arr.shape[0]] = arr
            else:
                out.setdefault(key, arr)  # a whole-tensor value, the same in every slab
    return out


def _block_ranges(x: Any, scheme: QuantScheme, glob: Any, calibration: Any, importance: Any) -> Any:
    """The calibrated range per block of a two-level ``x`` beneath the global ``glob``.

    A percentile is the block's own (the global only divides it); a search (``"mse"``,
    ``"4over6"``) weighs each candidate by the error of its stored scale beneath ``glob``, the
    steps :func:`~arrayquant.quantize` takes beneath the global it computes itself.
    """
    plan = plan_for(scheme)
    spec = check_calibration_spec(calibration, plan)
    if not spec.searches:
        return compute_range(x, scheme, calibration, importance=importance)[1]
    xp, device = check_input(x, plan)
    shape = tuple(int(n) for n in x.shape)
    with shim.quiet(xp):
        imp = check_importance(importance, spec.kind, shape, xp, device)
        kx = shim.kernel_namespace(xp)
        steps = Steps(plan, shape, spec.kind, spec=spec)
        return steps.search(x, steps.alpha(x, xp=kx), None, glob, imp, xp=kx)


def tensor_level(
    st: SafetensorsFile,
    name: str,
    scheme: QuantScheme,
    *,
    slab_bytes: int = SLAB_BYTES,
    calibration: Any = "minmax",
    importance: Any = None,
) -> Any:
    """The per-tensor level :func:`quantize_entry` gives the 2-d weight ``name`` of ``st`` on its own.

    The :class:`~arrayquant.QParams` of a per-tensor scheme (its unrounded scale, from the
    calibrated range), or the ``(1,)`` global of a two-level scheme (from the block scales; a
    search keeps MinMax's, as :func:`~arrayquant.quantize` does); None for a scheme without a
    per-tensor level. MinMax reads the weight a slab at a time, the other calibrations whole.

    Raises
    ------
    NonFiniteInputError
        NaN or infinity in the weight, as :func:`quantize_entry` would.
    """
    if scheme.block is not None and not scheme.is_two_level:
        return None
    shape = st.entries[name].shape
    step = _slab_rows(scheme, shape, slab_bytes)
    searches = not _is_minmax(calibration) and check_calibration_spec(calibration, plan_for(scheme)).searches
    if _is_minmax(calibration) or (scheme.is_two_level and searches):
        return _glob(st, name, scheme, shape[0], step)
    x = st.array(name)
    xp, _ = check_input(x, plan_for(scheme))
    with shim.quiet(xp):
        check_data_finite(x, xp, repr(name))
    lo, hi = compute_range(x, scheme, calibration, importance=importance)
    params = compute_q_params(scheme, lo, hi)
    return params if scheme.block is None else params.global_scale


def fits_format(scheme: QuantScheme, shape: tuple[int, ...]) -> bool:
    """Whether a weight of ``shape`` can be written in ``scheme``'s compressed-tensors format.

    Tried on one block row of ones with the weight's columns: the formats' limits are on the
    columns (a group or a packing that must divide them) and the rank, not on the number of rows.
    """
    if len(shape) != 2 or min(shape) < 1:
        return False
    dims = plan_for(scheme).block_dims(shape)
    rows = min(shape[0], dims[0] if len(dims) == len(shape) else 1)
    try:
        write_weight(quantize(np.ones((rows, shape[1]), np.float32), scheme), "probe")
    except (ShapeError, SchemeError):
        return False
    return True


def shared_level(levels: Sequence[Any]) -> Any:
    """The level a group of weights shares: the largest of their :func:`tensor_level` values.

    Scales and globals grow with the range they come from, so this is the level of the group's
    largest range (for MinMax, its largest ``|x|``), as llm-compressor computes a fused group's
    global from the largest ``|x|`` of its members.
    """

    def size(level: Any) -> float:
        return float(np.asarray(level.scales if isinstance(level, QParams) else level).reshape(-1)[0])

    return max(levels, key=size)
