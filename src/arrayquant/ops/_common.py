"""What every operation on quantized tensors shares: propagation, the float view, requantization.

Burn decides per operation whether a quantized input stays quantized. Operations that go through
floats compute on the dequantized values; where Burn requantizes at all, ``propagation`` chooses:
``"inhibit"`` (Burn's default) returns the float result, ``"propagate"`` quantizes it again with the
input's scheme (the left operand's for two operands), its scales found afresh by MinMax.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from ..dequantize import dequantize
from ..errors import SchemeError
from ..invariants.data import check_same_place
from ..quantize import quantize
from ..tensor import QuantizedTensor

__all__ = ["PROPAGATIONS", "check_propagation", "floats", "operand", "requantize", "same_place"]

PROPAGATIONS = ("inhibit", "propagate")


def check_propagation(propagation: object) -> str:
    """``propagation`` as one of :data:`PROPAGATIONS`, else a :class:`SchemeError` saying which exist."""
    if isinstance(propagation, str) and propagation in PROPAGATIONS:
        return propagation
    msg = (
        f"propagation must be 'inhibit' (return floats, Burn's default) or 'propagate' (quantize the "
        f"result again with the input's scheme), got {propagation!r}"
    )
    raise SchemeError(msg)


def floats(qt: QuantizedTensor) -> Any:
    """The float array ``qt`` stands for, in its own dtype, namespace and device."""
    return dequantize(qt)


def operand(v: Any) -> Any:
    """A float view of an operand: a quantized tensor dequantized; arrays and Python scalars as they are."""
    return floats(v) if isinstance(v, QuantizedTensor) else v


def requantize(y: Any, like: QuantizedTensor) -> QuantizedTensor:
    """``y`` quantized with ``like``'s scheme (and table), its scales found by MinMax, as Burn does."""
    return quantize(y, like.scheme, table=like.table)


def same_place(**operands: Any) -> None:
    """Every array or quantized operand must share one namespace and device (a typed DeviceError if not)."""
    arrays = {k: (v.values if isinstance(v, QuantizedTensor) else v) for k, v in operands.items()}
    first = next((a for a in arrays.values() if a is not None and compat.is_array_api_obj(a)), None)
    if first is None:
        return
    check_same_place(compat.array_namespace(first), compat.device(first), **arrays)
