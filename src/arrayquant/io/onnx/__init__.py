"""ONNX models: quantized weights as ``DequantizeLinear`` (QDQ) or ``com.microsoft.MatMulNBits``, read and written.

* :mod:`.model` reads a model file safely (a regular file, bounded size, no external data) and
  writes one atomically.
* :mod:`.qdq` turns a :class:`~arrayquant.QuantizedTensor` into a ``DequantizeLinear``'s
  initializers (codes, scale, zero point, ``axis``, ``block_size``) and back.
* :mod:`.nbits` does the same for onnxruntime's ``MatMulNBits`` (4 and 8 bits, blocked along K).
* :mod:`.format` is the format protocol (``aq.load``, ``aq.quantize_file``, ``arrayquant quantize``).
"""

__all__ = ["NAME"]

NAME = "onnx"
