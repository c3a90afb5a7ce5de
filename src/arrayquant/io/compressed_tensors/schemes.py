"""Which arrayquant schemes map onto which compressed-tensors weight formats, and their codecs.

Each format module answers three questions: the format name and weight arguments of a scheme it
maps (``weight_args``), the safetensors entries of a tensor (``write``), and the tensor back from
entries (``read``). This registry asks them in turn, so the model-folder code names no format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from ...errors import SchemeError
from ...scheme import QuantScheme
from ...tensor import QuantizedTensor
from . import floats as ct_float
from . import ints as ct_int
from .nvfp4 import read_nvfp4, write_nvfp4

__all__ = ["BF16_FORMATS", "MAPPED", "read_weight", "weight_format", "write_weight"]


class _Codec(Protocol):
    FORMATS: tuple[str, ...]

    def weight_args(
        self, scheme: QuantScheme, shape: tuple[int, ...] | None = None
    ) -> tuple[str, dict[str, Any]] | None: ...

    def write(self, qt: QuantizedTensor, name: str) -> dict[str, np.ndarray]: ...

    def read(
        self,
        entries: Mapping[str, np.ndarray],
        name: str,
        fmt: str,
        args: Mapping[str, Any],
        *,
        backend: str | None = None,
        device: Any = None,
    ) -> QuantizedTensor: ...


NVFP4_FORMAT = "nvfp4-pack-quantized"
# compressed-tensors' NVFP4A16 preset, as its QuantizationArgs.model_dump writes it
NVFP4_ARGS = {
    "num_bits": 4,
    "type": "float",
    "symmetric": True,
    "group_size": 16,
    "strategy": "tensor_group",
    "dynamic": False,
    "scale_dtype": "torch.float8_e4m3fn",
}


class _NVFP4:
    """The NVFP4 codec of ``io/compressed_tensors.py`` behind the registry's interface."""

    FORMATS = (NVFP4_FORMAT,)

    def weight_args(
        self, scheme: QuantScheme, shape: tuple[int, ...] | None = None
    ) -> tuple[str, dict[str, Any]] | None:
        return (NVFP4_FORMAT, dict(NVFP4_ARGS)) if scheme == QuantScheme.nvfp4() else None

    def write(self, qt: QuantizedTensor, name: str) -> dict[str, np.ndarray]:
        return write_nvfp4(qt, name)

    def read(
        self,
        entries: Mapping[str, np.ndarray],
        name: str,
        fmt: str,
        args: Mapping[str, Any],
        *,
        backend: str | None = None,
        device: Any = None,
    ) -> QuantizedTensor:
        return read_nvfp4(entries, name, backend=backend, device=device)


_INT_MAPPED = (
    "integers of 2 to 8 bits (q2f ... q8f, q2s ... q8s), symmetric or with zero points, and u1 ... u8 with zero "
    "points, with one f32/f16/bf16 scale per tensor, per row or per group -> pack-quantized"
)
# what the codecs can hold, for the error that lists it
MAPPED = ("nvfp4 -> nvfp4-pack-quantized", *ct_float.MAPPED, _INT_MAPPED)
_CODECS: tuple[_Codec, ...] = (_NVFP4(), ct_float, ct_int)  # type: ignore[assignment]
# Formats whose weights compressed-tensors (0.20.1) decompresses into bfloat16 whatever the model's dtype:
# compressors/nvfp4/helpers.py unpack_fp4_from_uint8 (NVFP4, and MXFP4 through its subclass) unpacks into
# its default dtype=torch.bfloat16, and compressors/mx_utils.py decompress_mx_scale returns bfloat16 scales,
# in which the MXFP8 weight is then dequantized (forward.dequantize: dtype = scale.dtype). The other formats
# dequantize in the dtype of the scale parameter compressed-tensors creates, the model's own dtype
# (quantization/lifecycle/initialize.py initialize_qparams: scale_dtype = observed_dtype).
BF16_FORMATS = frozenset({NVFP4_FORMAT, ct_float.MXFP8, ct_float.MXFP4})


def weight_format(scheme: QuantScheme, shape: tuple[int, ...] | None = None) -> tuple[str, dict[str, Any]]:
    """The compressed-tensors format and weight arguments of ``scheme``, or a :class:`SchemeError`.

    With the weight's ``shape``, a block spanning its whole last axis is written as the
    ``channel`` strategy (one scale per row) rather than a group of that size.

    >>> weight_format(QuantScheme.nvfp4())[0]
    'nvfp4-pack-quantized'
    """
    for codec in _CODECS:
        found = codec.weight_args(scheme, shape=shape)
        if found is not None:
            return found
    msg = (
        f"scheme {scheme} has no compressed-tensors format; the schemes that map are: "
        + "; ".join(MAPPED)
        + ". Use arrayquant's own checkpoint layout for the others (arrayquant quantize on a .safetensors file, "
        "--format arrayquant)"
    )
    raise SchemeError(msg)


def write_weight(qt: QuantizedTensor, module: str) -> dict[str, np.ndarray]:
    """The compressed-tensors entries of the weight of ``module`` (``"<module>.weight_packed"``, ...)."""
    for codec in _CODECS:
        if codec.weight_args(qt.scheme, shape=qt.shape) is not None:
            return codec.write(qt, module)
    weight_format(qt.scheme)  # raises the SchemeError that lists what maps
    raise AssertionError(qt.scheme)


def read_weight(
    entries: Mapping[str, np.ndarray],
    module: str,
    fmt: str,
    args: Mapping[str, Any],
    *,
    backend: str | None = None,
    device: Any = None,
) -> QuantizedTensor:
    """The weight of ``module`` from compressed-tensors entries of format ``fmt`` with ``args``."""
    for codec in _CODECS:
        if fmt in codec.FORMATS:
            return codec.read(entries, module, fmt, args, backend=backend, device=device)
    known = sorted(f for codec in _CODECS for f in codec.FORMATS)
    msg = f"weight {module!r} has compressed-tensors format {fmt!r}; arrayquant reads {', '.join(known)}"
    raise SchemeError(msg)
