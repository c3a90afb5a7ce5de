"""The scheme model: pure Python descriptions of a quantization, no arrays."""

from .block import MAX_BLOCK_DIMS, BlockSize
from .codebooks import CODEBOOKS, NF4
from .qparams import QParams
from .scales import F32_MAX, F32_TINY, ScaleDtype, to_f32
from .scheme import PRESETS, SCALE_RULES, QuantScheme
from .store import QuantStore
from .values import Calibration, QuantMode, QuantValue

__all__ = [
    "CODEBOOKS",
    "F32_MAX",
    "F32_TINY",
    "MAX_BLOCK_DIMS",
    "NF4",
    "PRESETS",
    "SCALE_RULES",
    "BlockSize",
    "Calibration",
    "QParams",
    "QuantMode",
    "QuantScheme",
    "QuantStore",
    "QuantValue",
    "ScaleDtype",
    "to_f32",
]
