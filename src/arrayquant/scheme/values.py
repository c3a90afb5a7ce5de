"""Value kinds, modes and calibrations: the enums of the scheme model."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ..errors import SchemeError

__all__ = ["MSE", "Calibration", "Percentile", "QuantMode", "QuantValue", "coerce_enum"]


def coerce_enum(cls: Any, value: Any, what: str) -> Any:
    """Return ``value`` as a member of ``cls``, accepting members and case-insensitive names.

    Raises :class:`SchemeError` naming ``what``, the bad value and the accepted names.
    """
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        for member in cls:
            if key in (member.value, member.name.lower()):
                return member
    names = ", ".join(repr(m.value) for m in cls)
    msg = f"unknown {what} {value!r}; use one of {names} (or the {cls.__name__} enum)"
    raise SchemeError(msg)


class QuantValue(enum.Enum):
    """The quantized value kind: its bit width, range and whether it is a minifloat.

    Burn's kinds are Q8F/Q4F/Q2F (full two's complement range, ``-2^(b-1) .. 2^(b-1) - 1``),
    Q8S/Q4S/Q2S (symmetric, ``-(2^(b-1) - 1) .. 2^(b-1) - 1``) and the minifloats. arrayquant adds
    the other signed widths (Q7F ... Q3F, Q7S ... Q3S) and unsigned codes ``U1 .. U8``
    (``0 .. 2^b - 1``), which need a zero point or an offset to stand for negative numbers.

    >>> QuantValue.Q5F.range, QuantValue.U4.range, QuantValue.U4.is_unsigned
    ((-16, 15), (0, 15), True)
    """

    Q8F = "q8f"
    Q4F = "q4f"
    Q2F = "q2f"
    Q8S = "q8s"
    Q4S = "q4s"
    Q2S = "q2s"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    E2M1 = "e2m1"
    Q7F = "q7f"
    Q6F = "q6f"
    Q5F = "q5f"
    Q3F = "q3f"
    Q7S = "q7s"
    Q6S = "q6s"
    Q5S = "q5s"
    Q3S = "q3s"
    U8 = "u8"
    U7 = "u7"
    U6 = "u6"
    U5 = "u5"
    U4 = "u4"
    U3 = "u3"
    U2 = "u2"
    U1 = "u1"

    @property
    def bits(self) -> int:
        """Width of one stored field."""
        return _VALUE_INFO[self][0]

    @property
    def range(self) -> tuple[float, float]:
        """The representable range ``(a, b)``; integer values give ints."""
        a, b = _VALUE_INFO[self][1]
        return (a, b)

    @property
    def is_float(self) -> bool:
        """True for the minifloat values E4M3, E5M2 and E2M1."""
        return self in (QuantValue.E4M3, QuantValue.E5M2, QuantValue.E2M1)

    @property
    def is_unsigned(self) -> bool:
        """True for the unsigned integer codes ``U1 .. U8``."""
        return self.value.startswith("u")

    @property
    def is_burn(self) -> bool:
        """True for the value kinds Burn itself has (Q8/Q4/Q2 F and S, E4M3, E5M2, E2M1)."""
        return self in _BURN_VALUES

    @property
    def span(self) -> float:
        """``b - a``, the divisor of the scale formula ``s = 2 * alpha / (b - a)``."""
        a, b = self.range
        return float(b - a)

    @classmethod
    def coerce(cls, value: Any) -> QuantValue:
        """Accept a member or its name (``"q8s"``, ``"Q8S"``)."""
        result: QuantValue = coerce_enum(cls, value, "quantized value")
        return result


_VALUE_INFO: dict[QuantValue, tuple[int, tuple[Any, Any]]] = {
    QuantValue.Q8F: (8, (-128, 127)),
    QuantValue.Q4F: (4, (-8, 7)),
    QuantValue.Q2F: (2, (-2, 1)),
    QuantValue.Q8S: (8, (-127, 127)),
    QuantValue.Q4S: (4, (-7, 7)),
    QuantValue.Q2S: (2, (-1, 1)),
    QuantValue.E4M3: (8, (-448.0, 448.0)),
    QuantValue.E5M2: (8, (-57344.0, 57344.0)),
    QuantValue.E2M1: (4, (-6.0, 6.0)),
}
_BURN_VALUES = frozenset(_VALUE_INFO)
for _b in (7, 6, 5, 3):
    _VALUE_INFO[QuantValue(f"q{_b}f")] = (_b, (-(1 << (_b - 1)), (1 << (_b - 1)) - 1))
    _VALUE_INFO[QuantValue(f"q{_b}s")] = (_b, (-((1 << (_b - 1)) - 1), (1 << (_b - 1)) - 1))
for _b in range(1, 9):
    _VALUE_INFO[QuantValue(f"u{_b}")] = (_b, (0, (1 << _b) - 1))


class QuantMode(enum.Enum):
    """How a stored field maps back to a number.

    ``SYMMETRIC``: ``x = s * q`` (Burn's). ``LOOKUP``: ``x = s * table[q]``. ``ZERO_POINT``:
    ``x = s * (q - z)`` with an integer zero point ``z`` per scale, as ONNX, compressed-tensors and
    AWQ store it. ``OFFSET``: ``x = d * q + m`` with a float offset ``m`` per scale, as ggml's
    Q4_1/Q5_1 and HQQ store it. The last two are arrayquant's affine modes, beyond Burn.
    """

    SYMMETRIC = "symmetric"
    LOOKUP = "lookup"
    ZERO_POINT = "zero_point"
    OFFSET = "offset"

    @property
    def is_affine(self) -> bool:
        """True for the modes with a second parameter per scale (zero point or offset)."""
        return self in (QuantMode.ZERO_POINT, QuantMode.OFFSET)

    @classmethod
    def coerce(cls, value: Any) -> QuantMode:
        """Accept a member or its name (``"symmetric"``, ``"lookup"``, ``"zero_point"``, ``"offset"``)."""
        result: QuantMode = coerce_enum(cls, value, "quantization mode")
        return result


class Calibration(enum.Enum):
    """How dynamic quantization finds the range of the data.

    ``MINMAX`` and ``ABSMEAN`` take it from the data directly; ``MSE`` searches clip ratios for the
    smallest error, ``PERCENTILE`` clips at a percentile of ``|x|`` and ``FOUR_OVER_SIX`` maps each
    NVFP4 block's maximum to 6 or to 4, whichever errs less (see :class:`MSE`, :class:`Percentile`).
    ``GGML`` is llama.cpp's reference quantizer for the schemes that are GGUF block types, giving
    llama-quantize's codes and scales exactly (its Q4_0 scales may be negative).
    """

    MINMAX = "minmax"
    ABSMEAN = "absmean"
    MSE = "mse"
    PERCENTILE = "percentile"
    FOUR_OVER_SIX = "4over6"
    GGML = "ggml"

    @classmethod
    def coerce(cls, value: Any) -> Calibration:
        """Accept a member or its name (``"minmax"``, ``"mse"``, ``"4over6"``, ``"ggml"``, ...)."""
        result: Calibration = coerce_enum(cls, value, "calibration")
        return result


@dataclass(frozen=True)
class MSE:
    """The ``mse`` search: per block, the clip ratio whose stored scale gives the smallest error.

    Candidates are ``alpha_i = p_i * max|x|`` with ``p_i = 1 - i / grid`` for
    ``i = 0 .. int(max_shrink * grid) - 1`` (llm-compressor's observer defaults); each block keeps
    the candidate minimising ``sum w * |x - deq(q(x))|^norm``, ties going to the larger scale.
    Text form: ``"mse"`` or ``"mse:grid=50,max_shrink=0.3,norm=2"``.
    """

    grid: int = 100
    max_shrink: float = 0.2
    norm: float = 2.4

    @property
    def calibration(self) -> Calibration:
        return Calibration.MSE


@dataclass(frozen=True)
class Percentile:
    """The ``percentile`` calibration: clip each block (or tensor) at the ``q``-th percentile of ``|x|``.

    Nearest rank: with ``n`` elements, the ``ceil(q / 100 * n)``-th smallest ``|x|``. Text form:
    ``"percentile"`` (q = 99.9) or ``"percentile:99.5"``.
    """

    q: float = 99.9

    @property
    def calibration(self) -> Calibration:
        return Calibration.PERCENTILE
