"""Scheme validity: turn a scheme into a cached, array-free plan the kernels trust."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import ParamsError, SchemeError, ShapeError
from ..scheme import CODEBOOKS, BlockSize, Calibration, QuantMode, QuantScheme, QuantValue, ScaleDtype

__all__ = [
    "TWO_LEVEL_BLOCK_MAX",
    "Plan",
    "check_calibration",
    "check_rounding",
    "plan_for",
]

TWO_LEVEL_BLOCK_MAX = 65504.0
ROUNDINGS = ("half_even", "half_away")


@dataclass(frozen=True)
class Plan:
    """What the kernels need to know about a valid scheme, resolved once."""

    scheme: QuantScheme
    value: QuantValue
    bits: int
    qmin: int
    qmax: int
    block: BlockSize | None
    scale_dtype: ScaleDtype  # innermost: the dtype of the stored grid
    two_level: bool

    @property
    def store_kind(self) -> str:
        return self.scheme.store.kind

    def block_dims(self, shape: int | tuple[int, ...]) -> tuple[int, ...]:
        """Block extents for data of ``shape`` (``()`` for a per-tensor scheme).

        Each extent is clamped to the data's extent on its axis: a block longer than its axis
        covers the axis whole, as the clamped block does (the grid has extent 1 there either way,
        and the scales and codes are the same bits), so padding never exceeds one partial block
        per axis whatever the scheme says. Given only a rank, the extents are the scheme's own.
        """
        if self.block is None:
            return ()
        if isinstance(shape, int):
            return self.block.to_dims(shape)
        dims = self.block.to_dims(len(shape))
        return tuple(min(b, max(n, 1)) for b, n in zip(dims, shape, strict=True))

    def grid_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The scale grid for data of ``shape``: ``(1,)`` per tensor, else one per block."""
        return (1,) if self.block is None else self.block.num_blocks(shape)

    def packed_axis(self, rank: int) -> int | None:
        """The axis the store packs along, or None for a native store."""
        store = self.scheme.store
        if not store.is_packed:
            return None
        if store.dim >= rank:
            msg = (
                f"store {store} packs axis rank-1-dim = {rank - 1 - store.dim}, which does not exist "
                f"for rank-{rank} data; use a dim below {rank}"
            )
            raise ShapeError(msg)
        return rank - 1 - store.dim


def plan_for(scheme: QuantScheme) -> Plan:
    """Validate ``scheme`` (array-free, cached) and resolve it into a :class:`Plan`.

    >>> plan_for(QuantScheme().with_value("q4s").per_block(32, "f16")).qmax
    7
    """
    if not isinstance(scheme, QuantScheme):  # before the cache: a list would not even hash
        msg = f"scheme must be a QuantScheme (or text for QuantScheme.parse), got {type(scheme).__name__}"
        raise SchemeError(msg)
    return _plan(scheme)


@functools.lru_cache(maxsize=256)
def _plan(scheme: QuantScheme) -> Plan:
    value = scheme.value
    if scheme.store.kind == "packed_native" and value is not QuantValue.E2M1:
        msg = (
            f"scheme {scheme}: packed_native stores two 4-bit codes per byte and only fits E2M1, "
            f"not {value.name}; use with_store('packed_u32') or with_store('native')"
        )
        raise SchemeError(msg)
    if scheme.is_two_level:
        block_dtype = scheme.block_scale
        assert block_dtype is not None
        if block_dtype.max > TWO_LEVEL_BLOCK_MAX:
            msg = (
                f"scheme {scheme}: a two-level scheme needs block scales of at most {TWO_LEVEL_BLOCK_MAX:g} "
                f"(F16 or UE4M3), not {block_dtype.name} (max {block_dtype.max:g}); use "
                "per_block(size, 'ue4m3') or per_block(size, 'f16'), or drop per_tensor()"
            )
            raise SchemeError(msg)
        if scheme.tensor is not ScaleDtype.F32:
            msg = (
                f"scheme {scheme}: the per-tensor level of a two-level scheme is stored as F32, "
                f"not {scheme.tensor.name if scheme.tensor else None}; use per_tensor('f32')"
            )
            raise SchemeError(msg)
    if scheme.mode is QuantMode.LOOKUP and value.is_float:
        msg = (
            f"scheme {scheme}: lookup mode indexes a table with an unsigned integer field, "
            f"so it needs an integer value, not {value.name}; use e.g. with_value('q4f')"
        )
        raise SchemeError(msg)
    if scheme.codebook is not None:
        entries = len(CODEBOOKS[scheme.codebook])
        if scheme.mode is not QuantMode.LOOKUP or 1 << value.bits != entries:
            msg = (
                f"scheme {scheme}: codebook {scheme.codebook!r} has {entries} entries and needs lookup mode "
                f"with a {entries.bit_length() - 1}-bit value, not {scheme.mode.value} {value.name}; "
                f"start from the preset {scheme.codebook!r}"
            )
            raise SchemeError(msg)
    if scheme.scale_rule == "ocp" and (
        not value.is_float or scheme.block_scale is not ScaleDtype.UE8M0 or scheme.is_two_level
    ):
        msg = (
            f"scheme {scheme}: the OCP shared-exponent rule needs a float value with one level of UE8M0 "
            "block scales (as in MXFP8/MXFP4); use QuantScheme.mxfp8().with_scale_rule('ocp') or drop the rule"
        )
        raise SchemeError(msg)
    a, b = value.range
    return Plan(
        scheme=scheme,
        value=value,
        bits=value.bits,
        qmin=int(a),
        qmax=int(b),
        block=scheme.block_size,
        scale_dtype=scheme.scale_dtype,
        two_level=scheme.is_two_level,
    )


def check_rounding(rounding: str, plan: Plan) -> str:
    """Validate the ``rounding`` option against the plan."""
    if rounding not in ROUNDINGS:
        msg = f"unknown rounding {rounding!r}; use 'half_even' (default) or 'half_away' (Burn's CPU backends)"
        raise SchemeError(msg)
    if rounding == "half_away" and plan.value.is_float:
        msg = (
            f"rounding='half_away' applies to integer values only; {plan.value.name} codes always round "
            "to nearest even, so drop the rounding argument"
        )
        raise ParamsError(msg)
    return rounding


def check_calibration(calibration: Calibration | str, plan: Plan) -> Calibration:
    """Validate the calibration against the plan (AbsMean has no two-level form)."""
    cal = Calibration.coerce(calibration)
    if cal is Calibration.ABSMEAN and plan.two_level:
        msg = (
            f"calibration 'absmean' is not defined for the two-level scheme {plan.scheme}; "
            "use calibration='minmax' or a one-level scheme"
        )
        raise SchemeError(msg)
    return cal
