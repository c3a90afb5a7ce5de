"""How each tensor of a requantize run is quantized: the calibration keywords of :func:`arrayquant.quantize`.

A format that re-quantizes a file tensor by tensor (GGUF, Burnpack) passes the run's calibration
to every tensor, and the importance vector (:mod:`arrayquant.io.importance`) of the tensors that
have one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["search_arguments"]


def search_arguments(calibration: Any, importance: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """``quantize``'s calibration keywords for tensor ``name``: its importance vector where it has one.

    >>> search_arguments("mse", {"w": [1.0]}, "w"), search_arguments("mse", {"w": [1.0]}, "b")
    ({'calibration': 'mse', 'importance': [1.0]}, {'calibration': 'mse'})
    """
    out: dict[str, Any] = {"calibration": calibration}
    if importance is not None and name in importance:
        out["importance"] = importance[name]
    return out
