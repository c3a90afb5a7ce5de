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
    """The quantized value kind: its bit width, range and whether it is a minifloat."""

    Q8F = "q8f"
    Q4F = "q4f"
    Q2F = "q2f"
    Q8S = "q8s"
    Q4S = "q4s"
    Q2S = "q2s"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    E2M1 = "e2m1"

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


class QuantMode(enum.Enum):
    """How a stored field maps back to a number."""

    SYMMETRIC = "symmetric"
    LOOKUP = "lookup"

    @classmethod
    def coerce(cls, value: Any) -> QuantMode:
        """Accept a member or its name (``"symmetric"``, ``"lookup"``)."""
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
