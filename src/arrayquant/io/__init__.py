"""Reading and writing quantized tensors: Burn's byte layout and safetensors checkpoints."""

from .burn import decode_scales, encode_scales, from_bytes, to_bytes
from .checkpoint import FORMAT_VERSION, load, save

__all__ = ["FORMAT_VERSION", "decode_scales", "encode_scales", "from_bytes", "load", "save", "to_bytes"]
