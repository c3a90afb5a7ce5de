"""Burnpack (``.bpk``), Burn's own model file: the ``burnpack`` format's entry for :mod:`arrayquant.io.formats`.

The format protocol's functions, and the names a Burnpack user reaches for, in one place; each
lives in the module that owns it:

- :mod:`~arrayquant.io.burn.layout`: the header, Burn's limits, DTypes and Scalars (and the Burn
  source all of this follows);
- :mod:`~arrayquant.io.burn.schemes`: a QFloat dtype's ``QuantScheme`` (:func:`encode_scheme`,
  :func:`decode_scheme`);
- :mod:`~arrayquant.io.burn.cbor`: the metadata's CBOR, walked within bounds;
- :mod:`~arrayquant.io.burn.reader`: :class:`BurnpackFile`, :func:`read_burnpack`, :func:`load`,
  :func:`iter_tensors`, :func:`tensor_shapes`, :func:`sniff`;
- :mod:`~arrayquant.io.burn.writer`: :func:`save`, :func:`save_stream`;
- :mod:`~arrayquant.io.burn.requantize`: :func:`quantize_file`, :func:`dequantize_file`,
  :func:`quantized_already`.

A quantized tensor's bytes are Burn's ``QuantizedBytes`` (:mod:`arrayquant.io.burn.bytes`).
cbor2 is imported when a file is first read or written, so importing this module needs none.
"""

from __future__ import annotations

from .layout import ALIGNMENT, BURN_COMMIT, MAGIC, NAME, VERSION
from .reader import Burnpack, BurnpackEntry, BurnpackFile, iter_tensors, load, read_burnpack, sniff, tensor_shapes
from .requantize import dequantize_file, quantize_file, quantized_already
from .schemes import decode_scheme, encode_scheme
from .writer import save, save_stream

__all__ = [
    "ALIGNMENT",
    "BURN_COMMIT",
    "MAGIC",
    "NAME",
    "VERSION",
    "Burnpack",
    "BurnpackEntry",
    "BurnpackFile",
    "decode_scheme",
    "dequantize_file",
    "encode_scheme",
    "iter_tensors",
    "load",
    "quantize_file",
    "quantized_already",
    "read_burnpack",
    "save",
    "save_stream",
    "sniff",
    "tensor_shapes",
]
