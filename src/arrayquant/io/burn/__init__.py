"""Burn's formats: the byte layout of one quantized tensor, and Burnpack files (``burnpack``)."""

from .bytes import decode_scales, encode_scales, from_bytes, to_bytes

__all__ = ["decode_scales", "encode_scales", "from_bytes", "to_bytes"]
