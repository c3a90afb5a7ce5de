"""Files in every format arrayquant reads and writes, and Burn's byte layout of one tensor.

The functions here work on any format (found from a file's content, see :func:`detect`):
:func:`~arrayquant.load` and :func:`~arrayquant.save` for tensors in memory, :func:`~arrayquant.quantize_file` and
:func:`~arrayquant.dequantize_file` for whole files and model folders a tensor at a time (also
``aq.quantize_file`` / ``aq.dequantize_file``), :func:`iter_tensors` and :func:`tensor_shapes`
to look inside. Each format is a package below (``gguf``, ``burn``, ``compressed_tensors``,
``onnx``, ``arrayquant``, with ``safetensors`` under two of them) for what only it has.

>>> import arrayquant as aq
>>> [f.name for f in aq.io.FORMATS]
['gguf', 'burnpack', 'compressed-tensors', 'onnx', 'matmulnbits', 'arrayquant']
"""

from .arrayquant.layout import FORMAT_VERSION
from .burn.burnpack import read_burnpack
from .burn.bytes import decode_scales, encode_scales, from_bytes, to_bytes
from .compressed_tensors.model import dequantize_model
from .compressed_tensors.nvfp4 import read_nvfp4, write_nvfp4
from .formats import FORMATS, Format, dequantize_file, detect, iter_tensors, load, quantize_file, save, tensor_shapes
from .importance import load_importance
from .summary import DequantizeSummary, QuantizeSummary

__all__ = [
    "FORMATS",
    "FORMAT_VERSION",
    "DequantizeSummary",
    "Format",
    "QuantizeSummary",
    "decode_scales",
    "dequantize_file",
    "dequantize_model",
    "detect",
    "encode_scales",
    "from_bytes",
    "iter_tensors",
    "load",
    "load_importance",
    "quantize_file",
    "read_burnpack",
    "read_nvfp4",
    "save",
    "tensor_shapes",
    "to_bytes",
    "write_nvfp4",
]
