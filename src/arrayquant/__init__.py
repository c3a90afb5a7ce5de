"""arrayquant: Burn's tensor quantization, bit for bit, on any Array API backend.

>>> import numpy as np
>>> import arrayquant as aq
>>> x = np.array([[0.1, -0.2, 0.3, 0.4]], dtype=np.float32)
>>> qt = aq.quantize(x, aq.QuantScheme().with_value("q8s").per_block([2], "f16"))
>>> qt.scales.shape
(1, 2)
>>> float(np.max(np.abs(aq.dequantize(qt) - x))) < 2e-3
True
"""

from . import backends, errors, io, ops
from ._version import __version__
from .convert import asarray
from .dequantize import dequantize
from .errors import (
    BackendUnavailableError,
    CorruptDataError,
    DeviceError,
    DTypeError,
    MissingGlobalScaleError,
    NonFiniteInputError,
    ParamsError,
    PathError,
    QuantizationError,
    SchemeError,
    ShapeError,
    UnexpectedGlobalScaleError,
)
from .fused import fused_kernels
from .gptq import GPTQResult, gptq_quantize, gptq_solve
from .io import DequantizeSummary, QuantizeSummary, dequantize_file, from_bytes, load, quantize_file, save, to_bytes
from .io.compressed_tensors.requantize import quantize_model
from .metrics import ErrorMeter, ErrorReport, error_report, sqnr
from .ops import matmul
from .quantize import compute_q_params, compute_range, quantize, round_up_scales
from .scheme import (
    NF4,
    BlockSize,
    Calibration,
    QParams,
    QuantMode,
    QuantScheme,
    QuantStore,
    QuantValue,
    ScaleDtype,
)
from .scheme.values import MSE, Percentile
from .storage import pack, quantized_nbytes, unpack
from .tensor import QuantizedTensor

ModelSummary = QuantizeSummary  # what quantize_model returned before every format shared one summary


def __dir__() -> list[str]:
    # the public names only: the internal modules stay importable but out of tab completion
    return sorted(__all__)


__all__ = [
    "MSE",
    "NF4",
    "BackendUnavailableError",
    "BlockSize",
    "Calibration",
    "CorruptDataError",
    "DTypeError",
    "DequantizeSummary",
    "DeviceError",
    "ErrorMeter",
    "ErrorReport",
    "GPTQResult",
    "MissingGlobalScaleError",
    "ModelSummary",
    "NonFiniteInputError",
    "ParamsError",
    "PathError",
    "Percentile",
    "QParams",
    "QuantMode",
    "QuantScheme",
    "QuantStore",
    "QuantValue",
    "QuantizationError",
    "QuantizeSummary",
    "QuantizedTensor",
    "ScaleDtype",
    "SchemeError",
    "ShapeError",
    "UnexpectedGlobalScaleError",
    "__version__",
    "asarray",
    "backends",
    "compute_q_params",
    "compute_range",
    "dequantize",
    "dequantize_file",
    "error_report",
    "errors",
    "from_bytes",
    "fused_kernels",
    "gptq_quantize",
    "gptq_solve",
    "io",
    "load",
    "matmul",
    "ops",
    "pack",
    "quantize",
    "quantize_file",
    "quantize_model",
    "quantized_nbytes",
    "round_up_scales",
    "save",
    "sqnr",
    "to_bytes",
    "unpack",
]
