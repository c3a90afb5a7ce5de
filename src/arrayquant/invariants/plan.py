"""Scheme validity: turn a scheme into a cached, array-free plan the kernels trust."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Any

from ..errors import ParamsError, SchemeError, ShapeError
from ..scheme import CODEBOOKS, BlockSize, Calibration, QuantMode, QuantScheme, QuantValue, ScaleDtype
from ..scheme.values import MSE, Percentile

__all__ = [
    "SEARCHES",
    "TWO_LEVEL_BLOCK_MAX",
    "CalSpec",
    "Plan",
    "check_calibration",
    "check_calibration_spec",
    "check_rounding",
    "ggml_kind",
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

    @property
    def mode(self) -> QuantMode:
        return self.scheme.mode

    @property
    def affine(self) -> bool:
        """Whether each scale has a zero point (ZERO_POINT) or an offset (OFFSET) beside it."""
        return self.scheme.mode.is_affine

    @property
    def code_dtype(self) -> str:
        """The dtype name of unpacked codes: int8 for signed integers, uint8 for unsigned and minifloats."""
        return "uint8" if self.value.is_float or self.value.is_unsigned else "int8"

    @property
    def signed_scales(self) -> bool:
        """Whether stored scales may be negative: integer codes (or table indices) under one level of
        F32/F16/BF16.

        ``code * scale`` reads the same either way; ggml's Q4_0, Q3_K and Q6_K (and any Q8_0 or TQ
        block a writer chose to flip) store ``d < 0``, so tensors read from GGUF keep that sign. A
        table that is not symmetric (IQ4_NL's) has no other way to a block's mirror image.
        Calibrations never compute one except ``"ggml"``.
        """
        return (
            not self.value.is_float
            and self.scheme.mode in (QuantMode.SYMMETRIC, QuantMode.LOOKUP)
            and not self.two_level
            and self.scale_dtype in (ScaleDtype.F32, ScaleDtype.F16, ScaleDtype.BF16)
        )

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
    if scheme.store.kind == "packed_native" and value.bits == 8:
        msg = (
            f"scheme {scheme}: packed_native packs fields narrower than a byte into bytes, and {value.name} "
            "fields are a byte each already; use with_store('native')"
        )
        raise SchemeError(msg)
    _check_mode(scheme)
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


def _check_mode(scheme: QuantScheme) -> None:
    """The affine modes and unsigned values: what each needs of the rest of the scheme."""
    value, mode = scheme.value, scheme.mode
    if value.is_unsigned and mode is QuantMode.LOOKUP:
        msg = (
            f"scheme {scheme}: lookup mode takes its table index from the signed value of the same width; "
            f"use q{value.bits}f instead of {value.name}"
        )
        raise SchemeError(msg)
    if value.is_unsigned and not mode.is_affine:
        msg = (
            f"scheme {scheme}: {value.name} codes are unsigned, so {mode.value} mode could not give a negative "
            f"number; add ':zero_point' (x = s * (q - z)) or ':offset' (x = d * q + m), or use the signed "
            f"value q{value.bits}f"
        )
        raise SchemeError(msg)
    if not mode.is_affine:
        return
    if value.is_float:
        msg = (
            f"scheme {scheme}: {mode.value} mode needs integer codes, not the minifloat {value.name}; use e.g. "
            "'u4' or 'q4f', or drop the mode"
        )
        raise SchemeError(msg)
    if scheme.is_two_level:
        msg = (
            f"scheme {scheme}: {mode.value} mode has one level of scales (each with its "
            f"{'zero point' if mode is QuantMode.ZERO_POINT else 'offset'}); drop tensor:f32 or the block level"
        )
        raise SchemeError(msg)
    if mode is QuantMode.OFFSET:
        if not value.is_unsigned:
            msg = (
                f"scheme {scheme}: offset mode (x = d * q + m) counts codes up from the offset, so it needs an "
                f"unsigned value such as u{value.bits}, not {value.name}"
            )
            raise SchemeError(msg)
        if scheme.scale_dtype not in (ScaleDtype.F32, ScaleDtype.F16, ScaleDtype.BF16):
            msg = (
                f"scheme {scheme}: offset mode stores its offsets in the scale dtype, and offsets may be negative; "
                f"use f32, f16 or bf16 scales, not {scheme.scale_dtype.name}"
            )
            raise SchemeError(msg)


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


# (value, block, scale dtype) of the one-level schemes that are GGUF block types -> the type whose
# ggml reference quantizer calibration="ggml" runs (TQ1_0's is TQ2_0's: the same codes and scales).
# The unsigned values are offset-mode schemes (x = d * q + m); the others symmetric.
_GGML_KINDS = {
    (QuantValue.Q8F, 32, ScaleDtype.F16): "Q8_0",
    (QuantValue.Q4F, 32, ScaleDtype.F16): "Q4_0",
    (QuantValue.Q5F, 32, ScaleDtype.F16): "Q5_0",
    (QuantValue.U4, 32, ScaleDtype.F16): "Q4_1",
    (QuantValue.U5, 32, ScaleDtype.F16): "Q5_1",
    (QuantValue.Q2S, 256, ScaleDtype.F16): "TQ2_0",
    (QuantValue.E2M1, 32, ScaleDtype.UE8M0): "MXFP4",
    (QuantValue.E2M1, 16, ScaleDtype.UE4M3): "NVFP4",
    # the K-quants: f32 sub-block scales (and offsets) that are an f16 d times small integers
    (QuantValue.U2, 16, ScaleDtype.F32): "Q2_K",
    (QuantValue.Q3F, 16, ScaleDtype.F32): "Q3_K",
    (QuantValue.U4, 32, ScaleDtype.F32): "Q4_K",
    (QuantValue.U5, 32, ScaleDtype.F32): "Q5_K",
    (QuantValue.Q6F, 16, ScaleDtype.F32): "Q6_K",
}
# lookup schemes over llama.cpp's kvalues_iq4nl table (the "iq4nl" codebook)
_GGML_TABLES = {(QuantValue.Q4F, 32, ScaleDtype.F16): "IQ4_NL", (QuantValue.Q4F, 32, ScaleDtype.F32): "IQ4_XS"}


def ggml_kind(plan: Plan) -> str | None:
    """The GGUF type whose ggml quantizer gives ``plan``'s codes and scales, or None."""
    if plan.two_level or plan.block is None or len(plan.block.dims) != 1:
        return None
    key = (plan.value, plan.block.dims[0], plan.scale_dtype)
    if plan.scheme.mode is QuantMode.LOOKUP:
        return _GGML_TABLES.get(key) if plan.scheme.codebook == "iq4nl" else None
    want = QuantMode.OFFSET if plan.value.is_unsigned else QuantMode.SYMMETRIC
    if plan.scheme.mode is not want:
        return None
    return _GGML_KINDS.get(key)


def check_calibration(calibration: Any, plan: Plan) -> Calibration:
    """Validate the calibration against the plan; its kind (see :func:`check_calibration_spec`)."""
    return check_calibration_spec(calibration, plan).kind


SEARCHES = (Calibration.MSE, Calibration.FOUR_OVER_SIX)
_FOUR_OVER_SIX_FACTORS = (1.0, 1.5)  # block max to 6 (MinMax, preferred on ties), then to 4: alpha * 6/4


def _f32(v: float) -> float:
    """``v`` rounded to the nearest f32, as a Python float (exact in every backend's f32)."""
    out: float = struct.unpack("f", struct.pack("f", v))[0]
    return out


@dataclass(frozen=True)
class CalSpec:
    """A validated calibration with its options resolved.

    ``factors``: the search candidates as f32 multipliers of ``max|x|``, in order of preference
    (a later candidate wins only with a strictly smaller error). ``norm``: the error exponent.
    ``q``: the percentile, as an exact fraction ``q_num / q_den`` of 100.
    """

    kind: Calibration
    factors: tuple[float, ...] = ()
    norm: float = 2.0
    q_num: int = 0
    q_den: int = 1

    @property
    def searches(self) -> bool:
        return self.kind in SEARCHES


def _parse_options(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    opts: dict[str, str] = {}
    if rest.strip():
        for i, part in enumerate(rest.split(",")):
            key, eq, val = part.partition("=")
            if not eq:
                key, val = ("q" if i == 0 else ""), part
            opts[key.strip().lower()] = val.strip()
    return name.strip().lower(), opts


def _bad_option(text: str, why: str) -> SchemeError:
    return SchemeError(
        f"calibration {text!r}: {why}; write e.g. 'mse', 'mse:grid=50,max_shrink=0.3,norm=2', "
        "'percentile', 'percentile:99.5' or '4over6'"
    )


def _from_text(text: str) -> Calibration | MSE | Percentile:
    name, opts = _parse_options(text)
    if not opts:
        if ":" in text:
            raise _bad_option(text, "nothing follows ':'")
        return Calibration.coerce(name)
    cal = Calibration.coerce(name)
    allowed = {Calibration.MSE: {"grid", "max_shrink", "norm"}, Calibration.PERCENTILE: {"q"}}.get(cal)
    if allowed is None:
        raise _bad_option(text, f"{cal.value!r} takes no options")
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise _bad_option(text, f"unknown option {unknown[0]!r} ({cal.value} takes {', '.join(sorted(allowed))})")
    try:
        if cal is Calibration.MSE:
            d = MSE()
            return MSE(
                grid=int(opts.get("grid", d.grid)),
                max_shrink=float(opts.get("max_shrink", d.max_shrink)),
                norm=float(opts.get("norm", d.norm)),
            )
        return Percentile(q=float(opts["q"]))
    except ValueError:
        raise _bad_option(text, "an option value is not a number") from None


def _mse_spec(opt: MSE) -> CalSpec:
    grid, shrink, norm = opt.grid, opt.max_shrink, opt.norm
    if isinstance(grid, bool) or not isinstance(grid, int) or not 1 <= grid <= 10000:
        msg = f"MSE grid must be an int in 1..10000 (candidate clip ratios 1 - i/grid), got {grid!r}"
        raise ParamsError(msg)
    if isinstance(shrink, bool) or not isinstance(shrink, int | float) or not 0 < shrink < 1:
        msg = f"MSE max_shrink must be a number in (0, 1) (the largest clip is 1 - max_shrink), got {shrink!r}"
        raise ParamsError(msg)
    count = int(shrink * grid)
    if count < 1:
        msg = f"MSE max_shrink={shrink} with grid={grid} leaves no candidate (int(max_shrink * grid) = 0); raise either"
        raise ParamsError(msg)
    if isinstance(norm, bool) or not isinstance(norm, int | float) or not (math.isfinite(norm) and 0 < norm <= 16):
        msg = f"MSE norm must be a number in (0, 16] (the error exponent p of sum |x - q(x)|^p), got {norm!r}"
        raise ParamsError(msg)
    factors = tuple(_f32(1 - i / grid) for i in range(count))
    return CalSpec(Calibration.MSE, factors, float(norm))


def _percentile_spec(opt: Percentile) -> CalSpec:
    q = opt.q
    if isinstance(q, bool) or not isinstance(q, int | float) or not (math.isfinite(q) and 0 < q <= 100):
        msg = f"Percentile q must be a number in (0, 100], got {q!r}"
        raise ParamsError(msg)
    from fractions import Fraction

    # the shortest decimal form, so that 99.9 means 999/10 exactly
    frac = Fraction(repr(float(q))).limit_denominator(10**9) / 100
    return CalSpec(Calibration.PERCENTILE, q_num=frac.numerator, q_den=frac.denominator)


def check_calibration_spec(calibration: Any, plan: Plan) -> CalSpec:
    """Validate a calibration (enum, name, text with options, :class:`MSE` or :class:`Percentile`).

    Raises :class:`SchemeError` for unknown names, malformed text and calibrations the scheme
    has no form of; :class:`ParamsError` for out-of-range options.
    """
    if isinstance(calibration, str) and ":" in calibration:
        calibration = _from_text(calibration)
    if isinstance(calibration, MSE):
        spec = _mse_spec(calibration)
    elif isinstance(calibration, Percentile):
        spec = _percentile_spec(calibration)
    else:
        cal = Calibration.coerce(calibration)
        if cal is Calibration.MSE:
            spec = _mse_spec(MSE())
        elif cal is Calibration.PERCENTILE:
            spec = _percentile_spec(Percentile())
        elif cal is Calibration.FOUR_OVER_SIX:
            spec = CalSpec(cal, _FOUR_OVER_SIX_FACTORS, 2.0)
        else:
            spec = CalSpec(cal)
    kind = spec.kind
    if kind is Calibration.GGML and ggml_kind(plan) is None:
        maps = "; ".join(
            [
                f"{v.value}:block{b}:{d.name.lower()}{':offset' if v.is_unsigned else ''} ({t})"
                for (v, b, d), t in _GGML_KINDS.items()
            ]
            + [f"{v.value}:block{b}:{d.name.lower()}:lookup:iq4nl ({t})" for (v, b, d), t in _GGML_TABLES.items()]
        )
        msg = (
            f"calibration 'ggml' is llama.cpp's quantizer for the GGUF block types, and {plan.scheme} is none of "
            f"them; it is defined for {maps} (any store). Use calibration='minmax' for other schemes"
        )
        raise SchemeError(msg)
    if kind is Calibration.ABSMEAN and plan.two_level:
        msg = (
            f"calibration 'absmean' is not defined for the two-level scheme {plan.scheme}; "
            "use calibration='minmax' or a one-level scheme"
        )
        raise SchemeError(msg)
    if kind is Calibration.FOUR_OVER_SIX and not (
        plan.value is QuantValue.E2M1 and plan.block is not None and plan.scale_dtype is ScaleDtype.UE4M3
    ):
        msg = (
            f"calibration '4over6' needs E2M1 values with UE4M3 block scales (as NVFP4), not {plan.scheme}; "
            "use scheme 'nvfp4' or calibration='mse'"
        )
        raise SchemeError(msg)
    return spec
