"""Reading and writing quantized tensors: Burn's byte layout, and files in every format (see ``formats``)."""

from .burn import decode_scales, encode_scales, from_bytes, to_bytes
from .checkpoint import FORMAT_VERSION
from .compressed_tensors import read_nvfp4, write_nvfp4
from .formats import load, save

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
