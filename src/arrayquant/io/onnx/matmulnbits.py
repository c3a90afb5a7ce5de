"""The ``matmulnbits`` output format: an ONNX model whose linear layers are ``com.microsoft.MatMulNBits``.

Not a file kind of its own (its files are ONNX models, recognised as ``onnx``): only a name for
``format=`` / ``--format``, routed to :func:`arrayquant.io.onnx.format.quantize_file`.
"""

from __future__ import annotations

from pathlib import Path

from .format import dequantize_file, iter_tensors, load, quantize_file, save, tensor_shapes

__all__ = ["dequantize_file", "iter_tensors", "load", "quantize_file", "save", "sniff", "tensor_shapes"]

NAME = "matmulnbits"


def sniff(path: Path) -> bool:
    """Never: ONNX files are recognised as the ``onnx`` format."""
    return False
