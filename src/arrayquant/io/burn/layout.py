"""Burnpack's layout: its constants, Burn's limits, its DType and Scalar tables, as Burn defines them.

Verified against Burn's source at tracel-ai/burn commit ``2c06be351006851d42fdb6df16b976f4a82d9747``
(2026-08-21, burn 0.22.0-pre.2):

- ``crates/burn-pack/src/base.rs``: the constants, ``Header``, ``Metadata``, ``TensorDescriptor``
  and ``Scalar``; ``crates/burn-pack/src/reader.rs`` (the limits it enforces) and
  ``crates/burn-pack/src/writer.rs`` (the layout it writes);
- ``crates/burn-std/src/tensor/dtype.rs``: ``DType`` and ``BoolStore``;
- ``crates/burn-std/src/tensor/quantization.rs``: a quantized tensor's bytes
  (``QuantizedBytes::new``, ``quantized_data_len``: values, block scales, f32 per-tensor scale,
  dense), which is :func:`arrayquant.to_bytes`;
- the ``QuantScheme`` serde of ``cubecl-common``, at the tracel-ai/cubecl revision Burn pins there,
  ``48348968468e433235be3db6e7c344c34bc446c0``: ``crates/cubecl-common/src/quant/scheme.rs``
  (see :mod:`arrayquant.io.burn.schemes`).

Layout. A 10-byte little-endian header: magic ``u32 0x4255524E`` (``b"NRUB"`` on disk),
version ``u16 1``, ``metadata_size u32``; then ``metadata_size`` bytes of CBOR metadata (serde's
encoding, as ``ciborium`` writes it)::

    {"tensors": {name: {"dtype": DType, "shape": [u64, ...], "data_offsets": [start, end],
                        "param_id": u64 (left out when absent)}},
     "metadata": {str: str} (left out when empty), "scalars": {str: Scalar} (left out when empty)}

with ``tensors`` sorted by name (a Rust ``BTreeMap``: by UTF-8 bytes); then zeros up to the next
multiple of 256, where the data section starts. Each tensor's ``[start, end)`` is relative to the
data section, ``start`` a multiple of 256; the data is written in the writer's order, padded with
zeros, and the file ends at the last tensor's end. A ``DType`` is a string (``"F32"``, ``"BF16"``,
``"I64"``, ``"U8"``, ``"Flex32"``, ...) or a one-entry map: ``{"Bool": "Native" | "U8" | "U32"}``,
``{"QFloat": QuantScheme}``. A ``Scalar`` is ``{"Int": i64}``, ``{"UInt": u64}``,
``{"Float": f64}`` or ``{"Bool": bool}``. The metadata is written with ciborium's choices
(``ciborium/src/ser/mod.rs``, ``ciborium-ll/src/hdr.rs``): structs as definite-length maps in
field order, unit variants as text, newtype variants as one-entry maps, ``None`` as null, each
integer and float in its narrowest encoding.
"""

from __future__ import annotations

import struct
from typing import Any

from ...errors import CorruptDataError
from .. import _dtypes

__all__ = [
    "ALIGNMENT",
    "BOOL_STORES",
    "BURN_COMMIT",
    "CHUNK",
    "FLOATS",
    "HEADER",
    "HEADER_SIZE",
    "I64",
    "MAGIC",
    "MAX_CBOR_DEPTH",
    "MAX_ENTRIES",
    "MAX_FILE_SIZE",
    "MAX_ITEM_SIZE",
    "MAX_METADATA_SIZE",
    "MAX_TENSOR_COUNT",
    "MAX_TENSOR_SIZE",
    "NAME",
    "PLAIN",
    "U64",
    "VERSION",
    "check_scalar",
    "is_int",
    "short",
]

NAME = "burnpack"
BURN_COMMIT = "2c06be351006851d42fdb6df16b976f4a82d9747"  # the Burn source this package follows
MAGIC = 0x4255524E
VERSION = 1
HEADER_SIZE = 10
ALIGNMENT = 256
MAX_METADATA_SIZE = 100 * 1024 * 1024
MAX_TENSOR_SIZE = 10 * 1024**3
MAX_TENSOR_COUNT = 100_000
MAX_CBOR_DEPTH = 128
MAX_FILE_SIZE = 100 * 1024**3
# beyond Burn's limits: decoded, these would cost memory out of proportion to the file
MAX_ITEM_SIZE = 64 * 1024  # one descriptor, scalar or unknown key's value, in bytes of CBOR
MAX_ENTRIES = MAX_TENSOR_COUNT  # entries of 'metadata' and of 'scalars' each (Burn sets no limit on them)
U64 = 1 << 64
I64 = 1 << 63
HEADER = struct.Struct("<IHI")  # magic, version, metadata_size
CHUNK = 1 << 20  # bytes copied at a time

# Burn DType (string form) -> (little-endian NumPy dtype, the array's dtype name)
PLAIN = {k: (d.numpy, d.name) for k, d in _dtypes.BURN.items()}
BOOL_STORES = {"Native": "u1", "U8": "u1", "U32": "<u4"}  # a {"Bool": store}'s raw NumPy dtype
FLOATS = _dtypes.BURN_FLOATS


def is_int(x: Any) -> bool:
    """Whether ``x`` is an int and not a bool (CBOR integers decode to int)."""
    return isinstance(x, int) and not isinstance(x, bool)


def short(obj: Any) -> str:
    """``repr(obj)`` cut to 80 characters, for error messages about what a file holds."""
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


def check_scalar(name: str, obj: Any, where: str) -> tuple[str, Any]:
    """``(kind, value)`` of a Burn ``Scalar``'s CBOR (``{"Int": i64}``, ...), or a CorruptDataError.

    >>> check_scalar("lr", {"Float": 0.5}, "m.bpk")
    ('Float', 0.5)
    """
    if isinstance(obj, dict) and len(obj) == 1:
        ((kind, value),) = obj.items()
        ok = {
            "Int": lambda v: is_int(v) and -I64 <= v < I64,
            "UInt": lambda v: is_int(v) and 0 <= v < U64,
            "Float": lambda v: isinstance(v, float),
            "Bool": lambda v: isinstance(v, bool),
        }
        if kind in ok and ok[kind](value):
            return kind, value
    msg = f"{where}: scalar {name!r} is {short(obj)}, not {{'Int'|'UInt'|'Float'|'Bool': value}}"
    raise CorruptDataError(msg)
