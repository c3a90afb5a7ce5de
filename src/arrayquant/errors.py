"""The error types of arrayquant.

Every invalid scheme, parameter or input ends in one of these, never in a crash deep inside a
kernel. All but the backend errors derive from :class:`QuantizationError`, itself a
``ValueError``, so ``except ValueError`` keeps working for callers that do not know this library.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "CorruptDataError",
    "DTypeError",
    "DeviceError",
    "MissingGlobalScaleError",
    "NonFiniteInputError",
    "ParamsError",
    "PathError",
    "QuantizationError",
    "SchemeError",
    "ShapeError",
    "UnexpectedGlobalScaleError",
]


class QuantizationError(ValueError):
    """Base of every arrayquant error about schemes, parameters and data."""


class SchemeError(QuantizationError):
    """An impossible or unknown scheme, or an unknown option name."""


class ParamsError(QuantizationError):
    """Quantization parameters that do not fit the scheme or the data."""


class MissingGlobalScaleError(ParamsError):
    """A two-level scheme arrived without its per-tensor scale."""


class UnexpectedGlobalScaleError(ParamsError):
    """A per-tensor scale was given to a one-level scheme."""


class ShapeError(QuantizationError):
    """Data, scale-grid, block or value shapes that disagree."""


class PathError(ShapeError):
    """An input or output path the operation cannot use, whatever the data in it.

    A source that is not a model folder (or is missing), a source that is quantized already, a
    destination that exists and is not an empty folder, or one that lies inside the source.
    It derives from :class:`ShapeError`, which these problems raised before it existed, so code
    that catches ``ShapeError`` for them keeps working; catch ``PathError`` to tell them apart
    from shapes that disagree.
    """


class NonFiniteInputError(QuantizationError):
    """NaN or infinity in the input while ``check_finite`` is on."""


class CorruptDataError(QuantizationError):
    """Bytes or a checkpoint that cannot be what they claim to be."""


class DTypeError(QuantizationError, TypeError):
    """Input that is not a real floating-point array."""


class BackendUnavailableError(ImportError):
    """An array backend that is not installed or cannot be used here."""


class DeviceError(ValueError):
    """Arrays on different devices, or a device that does not exist."""
