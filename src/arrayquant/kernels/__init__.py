"""Kernels written once against the Array API: every function takes ``xp`` and trusts its plan."""

from .blocks import as_blocks, block_reduce, from_blocks, grid_as_blocks, pad_to_blocks
from .calibrate import absmax, compute_range
from .floating import dequantize_float, quantize_float
from .integer import dequantize_int, quantize_int, safe_divisor
from .lookup import dequantize_lookup, quantize_lookup
from .packing import pack_fields, padded_length, unpack_fields
from .qparams import (
    block_scales,
    effective_scale,
    global_scale,
    normalise_scales,
    scales_from_absmax,
    scales_from_range,
    store_scales,
)
from .roundup import round_up_scales

__all__ = [
    "absmax",
    "as_blocks",
    "block_reduce",
    "block_scales",
    "compute_range",
    "dequantize_float",
    "dequantize_int",
    "dequantize_lookup",
    "effective_scale",
    "from_blocks",
    "global_scale",
    "grid_as_blocks",
    "normalise_scales",
    "pack_fields",
    "pad_to_blocks",
    "padded_length",
    "quantize_float",
    "quantize_int",
    "quantize_lookup",
    "round_up_scales",
    "safe_divisor",
    "scales_from_absmax",
    "scales_from_range",
    "store_scales",
    "unpack_fields",
]
