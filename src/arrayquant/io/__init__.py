"""Reading and writing quantized tensors: Burn's byte layout, safetensors checkpoints, compressed-tensors NVFP4."""

from .burn import decode_scales, encode_scales, from_bytes, to_bytes
from .checkpoint import FORMAT_VERSION, load, save
from .compressed_tensors import read_nvfp4, write_nvfp4

__all__ = [
    "FORMAT_VERSION",
    "decode_scales",
    "encode_scales",
    "from_bytes",
    "load",
    "read_nvfp4",
    "save",
    "to_bytes",
    "write_nvfp4",
]
