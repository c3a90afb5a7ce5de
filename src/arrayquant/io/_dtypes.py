"""The plain (unquantized) dtypes of every file format: one row per dtype, one column per spelling.

Each reader and writer of :mod:`arrayquant.io` looks its dtype names up here instead of keeping
its own table. A spelling is ``None`` where the format has no such dtype (or, for GGUF and Burn,
spells it in another way: Burn's bool is ``{"Bool": store}``, not a string).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "BURN",
    "BURN_FLOATS",
    "FLOAT_NAMES",
    "GGUF",
    "GGUF_FLOATS",
    "SAFETENSORS",
    "SAFETENSORS_FLOATS",
    "TABLE",
    "DType",
]


class DType(NamedTuple):
    """One plain dtype and its names in each format."""

    safetensors: str | None  # the header's dtype, "F32"
    gguf: str | None  # the GGMLQuantizationType name of a plain tensor type, "F32"
    burn: str | None  # Burn's DType in string form (Burnpack), "F32"
    numpy: str  # the little-endian NumPy dtype of the raw data ("<u2" for bfloat16)
    name: str  # the array's dtype name, "bfloat16"
    itemsize: int
    is_float: bool  # a float of 16 bits or more: what a tensor to be quantized is stored as (not the F8 codes)

    @property
    def native(self) -> bool:
        """NumPy holds the values themselves as ``numpy`` (not bfloat16, bool or the float8 codes)."""
        return np.dtype(self.numpy).name == self.name


TABLE: tuple[DType, ...] = (
    DType("F64", "F64", "F64", "<f8", "float64", 8, True),
    DType("F32", "F32", "F32", "<f4", "float32", 4, True),
    DType(None, None, "Flex32", "<f4", "float32", 4, True),
    DType("F16", "F16", "F16", "<f2", "float16", 2, True),
    DType("BF16", "BF16", "BF16", "<u2", "bfloat16", 2, True),
    DType("I64", "I64", "I64", "<i8", "int64", 8, False),
    DType("I32", "I32", "I32", "<i4", "int32", 4, False),
    DType("I16", "I16", "I16", "<i2", "int16", 2, False),
    DType("I8", "I8", "I8", "i1", "int8", 1, False),
    DType(None, None, "U64", "<u8", "uint64", 8, False),
    DType("U32", None, "U32", "<u4", "uint32", 4, False),
    DType("U16", None, "U16", "<u2", "uint16", 2, False),
    DType("U8", None, "U8", "u1", "uint8", 1, False),
    DType("BOOL", None, None, "u1", "bool", 1, False),
    DType("F8_E4M3", None, None, "u1", "float8_e4m3fn", 1, False),
    DType("F8_E5M2", None, None, "u1", "float8_e5m2", 1, False),
    DType("F8_E8M0", None, None, "u1", "float8_e8m0fnu", 1, False),
)

# each format's spelling -> its row, in the table's order (which error messages list)
SAFETENSORS = {d.safetensors: d for d in TABLE if d.safetensors is not None}
GGUF = {d.gguf: d for d in TABLE if d.gguf is not None}
BURN = {d.burn: d for d in TABLE if d.burn is not None}
# the float dtypes each format's quantizers take as input
SAFETENSORS_FLOATS = tuple(k for k, d in SAFETENSORS.items() if d.is_float)
GGUF_FLOATS = tuple(k for k, d in GGUF.items() if d.is_float)
BURN_FLOATS = tuple(k for k, d in BURN.items() if d.is_float)
FLOAT_NAMES = tuple(dict.fromkeys(d.name for d in TABLE if d.is_float))  # float64, float32, ...
