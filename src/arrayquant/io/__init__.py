"""Reading and writing quantized tensors: Burn's byte layout."""

from .burn import decode_scales, encode_scales, from_bytes, to_bytes

__all__ = ["decode_scales", "encode_scales", "from_bytes", "to_bytes"]
