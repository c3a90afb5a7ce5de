"""arrayquant: Burn's tensor quantization, bit for bit, on any Array API backend.

>>> import arrayquant as aq
>>> import array_api_strict as xp
>>> x = xp.asarray([[0.1, -0.2, 0.3, 0.4]], dtype=xp.float32)
>>> qt = aq.quantize(x, aq.QuantScheme().with_value("q8s").per_block([2], "f16"))
>>> qt.scales.shape
(1, 2)
>>> float(xp.max(xp.abs(aq.dequantize(qt) - x))) < 2e-3
True
"""

from . import backends, errors
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
    QuantizationError,
    SchemeError,
    ShapeError,
    UnexpectedGlobalScaleError,
)
from .io import from_bytes, load, save, to_bytes
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
from .storage import pack, quantized_nbytes, unpack
from .tensor import QuantizedTensor

__version__ = "0.1.0"

__all__ = [
    "NF4",
    "BackendUnavailableError",
    "BlockSize",
    "Calibration",
    "CorruptDataError",
    "DTypeError",
    "DeviceError",
    "MissingGlobalScaleError",
    "NonFiniteInputError",
    "ParamsError",
    "QParams",
    "QuantMode",
    "QuantScheme",
    "QuantStore",
    "QuantValue",
    "QuantizationError",
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
    "errors",
    "from_bytes",
    "load",
    "pack",
    "quantize",
    "quantized_nbytes",
    "round_up_scales",
    "save",
    "to_bytes",
    "unpack",
]
