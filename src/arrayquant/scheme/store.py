"""How quantized fields are laid out in storage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SchemeError

__all__ = ["QuantStore"]

_KINDS = ("native", "packed_u32", "packed_native")


@dataclass(frozen=True)
class QuantStore:
    """Storage of the fields: ``native``, ``packed_u32`` or ``packed_native`` along ``dim``.

    ``dim`` counts from the innermost axis: the packed axis of a rank-``r`` tensor is
    ``r - 1 - dim``.

    >>> QuantStore.parse("packed_u32:1")
    QuantStore(kind='packed_u32', dim=1)
    >>> str(QuantStore.packed_u32())
    'packed_u32'
    """

    kind: str = "packed_u32"
    dim: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            msg = f"unknown store {self.kind!r}; use one of {', '.join(map(repr, _KINDS))}"
            raise SchemeError(msg)
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 0:
            msg = f"store dim must be an integer >= 0 (0 packs the innermost axis), got {self.dim!r}"
            raise SchemeError(msg)
        if self.kind == "native" and self.dim != 0:
            msg = f"a native store has no packed axis, so dim must be 0, got {self.dim!r}"
            raise SchemeError(msg)

    @classmethod
    def native(cls) -> QuantStore:
        """One storage element per value."""
        return cls("native", 0)

    @classmethod
    def packed_u32(cls, dim: int = 0) -> QuantStore:
        """``32 / bits`` fields per little-endian uint32 word along axis ``rank - 1 - dim``."""
        return cls("packed_u32", dim)

    @classmethod
    def packed_native(cls, dim: int = 0) -> QuantStore:
        """Two E2M1 codes per uint8 (element ``2k`` in the low nibble)."""
        return cls("packed_native", dim)

    @property
    def is_packed(self) -> bool:
        """True unless the store is native."""
        return self.kind != "native"

    @classmethod
    def coerce(cls, value: Any) -> QuantStore:
        """Accept a store or its text form (``"native"``, ``"packed_u32:1"``)."""
        if isinstance(value, QuantStore):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        msg = f"store must be a QuantStore or a name such as 'packed_u32:1', got {value!r}"
        raise SchemeError(msg)

    @classmethod
    def parse(cls, text: str) -> QuantStore:
        """Parse ``"native"``, ``"packed_u32"``, ``"packed_u32:1"``, ``"packed_native:0"``."""
        kind, _, dim = text.strip().lower().partition(":")
        if dim and not dim.isdigit():
            msg = f"store dim in {text!r} must be a non-negative integer, as in 'packed_u32:1'"
            raise SchemeError(msg)
        return cls(kind, int(dim) if dim else 0)

    def __str__(self) -> str:
        return self.kind if self.dim == 0 else f"{self.kind}:{self.dim}"
