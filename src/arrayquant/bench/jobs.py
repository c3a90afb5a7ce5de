"""The jobs the benchmark times: arrayquant's schemes and presets, and the row names of the obvious forms.

Every other module of :mod:`arrayquant.bench` names its rows from these, so a peer, a target and a
ratio all agree on which arrayquant case they stand beside.
"""

from __future__ import annotations

__all__ = [
    "ALL_CASES",
    "AQ_SCHEMES",
    "BLOCK",
    "BLOCK_FORM",
    "FLOAT_BASELINE",
    "FLOAT_PRESETS",
    "FOUR_BIT",
    "INT8_BLOCK_SCHEMES",
    "INT8_TENSOR_SCHEMES",
    "TENSOR_FORM",
]

BLOCK = 32
AQ_SCHEMES = ("q8s:native", "q8s", "q8s:block32:f16:native", "q8s:block32:f16", "q4s:block32:f16")
INT8_TENSOR_SCHEMES = ("q8s:native", "q8s")
INT8_BLOCK_SCHEMES = ("q8s:block32:f16:native", "q8s:block32:f16")
FLOAT_PRESETS = ("nvfp4", "mxfp4", "mxfp8")
FOUR_BIT = ("q4s:block32:f16", "nvfp4", "mxfp4")
ALL_CASES = AQ_SCHEMES + FLOAT_PRESETS
FLOAT_BASELINE = "numpy+ml_dtypes "  # + preset: the case name of its NumPy + ml_dtypes form
TENSOR_FORM = " per-tensor"  # the obvious int8 forms, after the name of the library that runs them
BLOCK_FORM = " block32 f16"
