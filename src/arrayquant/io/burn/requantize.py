"""A Burnpack file into another, tensor by tensor: :func:`quantize_file` and :func:`dequantize_file`.

Both keep everything they do not convert as it is stored (dtype, shape, bytes), with the source's
param ids, metadata and scalars, in the source's order, holding one tensor at a time. Which
tensors :func:`quantize_file` quantizes is Burnpack's eligibility rule (:func:`why_not`: a float
tensor that is not a scalar and not quantized already) and then the caller's
:class:`~arrayquant.io._select.Selection`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ...scheme import QuantScheme
from .._calibration import search_arguments
from .._select import Selection
from ..safetensors.reader import ml_dtype
from ..summary import DequantizeSummary, QuantizeSummary
from .layout import FLOATS, NAME
from .reader import BurnpackEntry, BurnpackFile
from .schemes import encode_scheme
from .writer import Stored, save_stream

__all__ = ["dequantize_file", "quantize_file", "quantized_already", "why_not"]


def why_not(entry: BurnpackEntry, selection: Selection) -> str | None:
    """Why :func:`quantize_file` leaves ``entry`` as stored, or None to quantize it.

    >>> from arrayquant.io.burn.reader import BurnpackEntry
    >>> e = BurnpackEntry("fc.weight", "F32", (8, 8), 256, 512, None, None)
    >>> why_not(e, Selection()) is None, why_not(e._replace(dtype="I64"), Selection())
    (True, 'not a float tensor (I64)')
    """
    if entry.scheme is not None:
        return f"quantized already ({entry.scheme})"
    if entry.kind not in FLOATS:
        return f"not a float tensor ({entry.kind})"
    if not entry.shape:
        return "a scalar"
    return selection.why_not(entry.name, entry.shape)


def quantized_already(
    src: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> dict[str, str]:
    """The tensors :func:`quantize_file` would quantize were they float that are quantized in another
    scheme than ``scheme`` already, with their scheme's text (read from the header alone)."""
    target = QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme
    selection = Selection(include, exclude)
    with BurnpackFile(src) as f:
        return {
            e.name: str(e.scheme)
            for e in f.entries
            if e.scheme is not None
            and e.scheme != target
            and why_not(e._replace(dtype="F32", scheme=None), selection) is None
        }


def quantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    calibration: Any = "minmax",
    importance: Mapping[str, Any] | None = None,
) -> QuantizeSummary:
    """Re-quantize a Burnpack file into another, tensor by tensor, keeping everything else.

    By default the 2-d float weights are quantized (not norms or biases); ``include`` globs
    replace that choice, ``exclude`` globs narrow it. Every other tensor is copied as stored
    (dtype, shape, bytes), and the param ids, metadata and scalars are kept; the data keeps the
    source's order.

    Parameters
    ----------
    src, dst : path
        The ``.bpk`` to read and the one to write (they may be the same file).
    scheme : QuantScheme or str
        A scheme Burn's ``QuantScheme`` holds (see :func:`~arrayquant.io.burn.schemes.encode_scheme`).
    include, exclude : sequence of str
        Globs on tensor names.
    progress : callable, optional
        Called with each tensor's name as it is written.
    calibration, importance : optional
        How each weight's scales are searched (see :func:`arrayquant.quantize`); ``importance``
        maps tensor names to their importance vectors.

    Returns
    -------
    QuantizeSummary
        ``format="burnpack"``, ``scheme`` and ``stored_as`` the scheme's text.

    Raises
    ------
    SchemeError
        A scheme Burnpack cannot hold, refused before anything is read.
    CorruptDataError
        A source that is not a valid Burnpack file.
    NonFiniteInputError
        A weight with NaN or infinite values (naming it).
    """
    from ...errors import NonFiniteInputError
    from ...quantize import quantize

    s = QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme
    encode_scheme(s)  # refuse what Burn cannot hold before any work
    summary = QuantizeSummary(NAME, str(s))
    selection = Selection(include, exclude)
    with BurnpackFile(src) as f:

        def items() -> Iterator[tuple[str, Any]]:
            for e in f.entries:
                why = why_not(e, selection)
                if why is None:
                    host, _ = f.tensor(e.name)
                    try:
                        # f16/bf16 are computed in f32 by quantize, a slab at a time
                        qt = quantize(host, s, **search_arguments(calibration, importance, e.name))
                    except NonFiniteInputError as exc:
                        raise NonFiniteInputError(f"tensor {e.name!r} of {src}: {exc}") from None
                    del host
                    summary.quantized.append(e.name)
                    yield e.name, qt
                    del qt  # only one quantized tensor alive at a time
                else:
                    summary.left_out[e.name] = why
                    yield e.name, Stored(f, e)
                if progress is not None:
                    progress(e.name)

        save_stream(dst, items(), param_ids=f.param_ids, metadata=f.metadata, scalars=f.scalars)
    return summary


def dequantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    dtype: Any = None,
    names: Collection[str] | None = None,
) -> DequantizeSummary:
    """A Burnpack file into another with its QFloat tensors (those in ``names``; all with None) as floats.

    Each is dequantized to ``dtype`` (a NumPy dtype or its name, ``"bfloat16"`` too; default
    float32: Burnpack does not record a tensor's dtype before quantizing), one at a time; every
    other tensor, param id, metadata entry and scalar is kept as stored.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> from arrayquant.io.burn.writer import save
    >>> folder = tempfile.mkdtemp()
    >>> src, dst = os.path.join(folder, "q.bpk"), os.path.join(folder, "f.bpk")
    >>> save(src, {"w": aq.quantize(np.ones((2, 32), np.float32), "q8s"), "b": np.zeros(2, np.float32)})
    >>> s = dequantize_file(src, dst, dtype="float16")
    >>> (s.format, s.dtype, s.dequantized, s.copied)
    ('burnpack', 'float16', ['w'], ['b'])
    """
    from ...dequantize import dequantize

    if dtype is None:
        dtype = np.float32
    elif isinstance(dtype, str) and dtype == "bfloat16":  # NumPy knows it only through ml_dtypes
        dtype = ml_dtype(dtype)
    out = np.dtype(dtype)
    summary = DequantizeSummary(NAME, out.name)
    with BurnpackFile(src) as f:

        def items() -> Iterator[tuple[str, Any]]:
            for e in f.entries:
                if e.scheme is not None and (names is None or e.name in names):
                    qt, _ = f.tensor(e.name)
                    summary.dequantized.append(e.name)
                    yield e.name, dequantize(qt, out)
                    del qt
                else:
                    summary.copied.append(e.name)
                    yield e.name, Stored(f, e)  # copied as stored

        save_stream(dst, items(), param_ids=f.param_ids, metadata=f.metadata, scalars=f.scalars)
    return summary
