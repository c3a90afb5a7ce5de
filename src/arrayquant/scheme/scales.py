"""Scale dtypes and their round-up storage rule on Python floats.

A scale is stored rounded *up* onto its dtype's grid, so dividing by the stored value never
pushes a value past the range. The array version of the rule lives in
``arrayquant.kernels.roundup``; this scalar one is exact because Python floats carry every f32
value and power-of-two scaling is exact.
"""

from __future__ import annotations

import enum
import math
import struct
from typing import Any, NamedTuple

from ..errors import ParamsError
from .values import coerce_enum

__all__ = ["F32_MAX", "F32_TINY", "ScaleDtype", "to_f32"]

F32_MAX = 3.4028234663852886e38
F32_TINY = 1.1754943508222875e-38  # smallest normal f32, the floor of a two-level global scale


def to_f32(x: float) -> float:
    """Round a Python float to the nearest f32 value (overflow gives a signed infinity)."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


class _Grid(NamedTuple):
    nbytes: int
    max: float
    mbits: int  # fraction bits
    emin: int  # exponent of the smallest normal binade
    emax: int  # exponent of the largest binade
    floor: float  # smallest storable value for 0 (0.0, or 2^-127 for UE8M0)


class ScaleDtype(enum.Enum):
    """The dtype a scale is stored in: F32, F16, BF16, UE4M3 or UE8M0."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    UE4M3 = "ue4m3"
    UE8M0 = "ue8m0"

    @property
    def grid(self) -> _Grid:
        """The parameters of this dtype's value grid."""
        return _GRIDS[self]

    @property
    def max(self) -> float:
        """Largest storable scale; larger ones saturate to it."""
        return self.grid.max

    @property
    def nbytes(self) -> int:
        """Bytes per stored scale."""
        return self.grid.nbytes

    @classmethod
    def coerce(cls, value: Any) -> ScaleDtype:
        """Accept a member or its name (``"f16"``, ``"UE4M3"``)."""
        result: ScaleDtype = coerce_enum(cls, value, "scale dtype")
        return result

    def round_up(self, scale: float) -> float:
        """The stored value of ``scale``: the smallest grid value not below it.

        >>> ScaleDtype.F16.round_up(1.0012)
        1.001953125
        >>> ScaleDtype.UE4M3.round_up(0.3), ScaleDtype.UE4M3.round_up(500.0)
        (0.3125, 448.0)
        >>> ScaleDtype.UE8M0.round_up(0.0) == 2.0**-127
        True
        """
        a = to_f32(float(scale))
        if math.isnan(a):
            return a
        if a < 0:
            msg = f"scale {scale!r} is negative; scales are magnitudes, so pass abs(scale) or recompute the parameters"
            raise ParamsError(msg)
        if self is ScaleDtype.F32:
            return a + 0.0  # -0.0 -> 0.0
        g = self.grid
        if a >= g.max:
            return g.max
        if a == 0:
            return g.floor
        exponent = max(math.frexp(a)[1] - 1, g.emin)
        step = math.ldexp(1.0, exponent - g.mbits)
        return max(min(math.ceil(a / step) * step, g.max), g.floor)


_GRIDS = {
    ScaleDtype.F32: _Grid(4, F32_MAX, 23, -126, 127, 0.0),
    ScaleDtype.F16: _Grid(2, 65504.0, 10, -14, 15, 0.0),
    ScaleDtype.BF16: _Grid(2, float.fromhex("0x1.fep127"), 7, -126, 127, 0.0),
    ScaleDtype.UE4M3: _Grid(1, 448.0, 3, -6, 8, 0.0),
    ScaleDtype.UE8M0: _Grid(1, 2.0**127, 0, -127, 127, 2.0**-127),
}
