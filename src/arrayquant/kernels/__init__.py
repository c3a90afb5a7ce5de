"""Kernels written once against the Array API: every function takes ``xp`` and trusts its plan."""

from .affine import affine_decode, affine_encode, affine_params, affine_range
from .blocks import as_blocks, block_reduce, from_blocks, grid_as_blocks, pad_to_blocks
from .calibrate import absmax, compute_range
from .floating import dequantize_float, quantize_float
from .integer import dequantize_int, quantize_int, safe_divisor
from .lookup import dequantize_lookup, quantize_lookup
from .packing import pack_fields, pack_unit, packed_length, unpack_fields
from .qparams import (
    block_scales,
    effective_scale,
    global_scale,
    normalise_scales,
    scales_from_absmax,
    scales_from_range,
    store_scales,
)
from .roundup import round_down_signed, round_up_scales

__all__ = [
    "absmax",
    "affine_decode",
    "affine_encode",
    "affine_params",
    "affine_range",
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
    "pack_unit",
    "packed_length",
    "pad_to_blocks",
    "quantize_float",
    "quantize_int",
    "quantize_lookup",
    "round_down_signed",
    "round_up_scales",
    "safe_divisor",
    "scales_from_absmax",
    "scales_from_range",
    "store_scales",
    "unpack_fields",
]
