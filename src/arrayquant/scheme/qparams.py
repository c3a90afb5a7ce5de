"""Quantization parameters: the scales (and table) a quantizer divides by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["QParams"]


@dataclass(frozen=True)
class QParams:
    """Scales (and zero points or offsets) for static quantization, shaped as the scheme's scale grid.

    ``scales`` is ``(1,)`` for a per-tensor scheme, else one entry per block along every axis
    (same rank as the data). ``global_scale`` is the ``(1,)`` per-tensor f32 scale of a two-level
    scheme and must be absent otherwise. ``table`` is the ``2**bits``-entry codebook of LOOKUP
    mode. Scales may be unrounded: quantization stores them rounded up.

    ``zero_point`` (ZERO_POINT mode) holds one integer per scale, in the value's own range
    (``x = s * (q - z)``); ``offset`` (OFFSET mode) one float per scale (``x = d * q + m``), stored
    rounded down onto the scale dtype. Each is required by its mode and refused by the others.
    """

    scales: Any
    global_scale: Any = None
    table: Any = None
    zero_point: Any = None
    offset: Any = None
