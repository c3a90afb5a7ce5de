"""One safetensors file in compressed-tensors' layout, its ``quantization_config`` in its metadata.

A compressed-tensors model folder describes its weights in ``config.json``; a single file has no
such neighbour, so :func:`save_compressed_tensors` stores the same ``quantization_config`` (as
JSON) under the ``quantization_config`` key of the file's metadata, beside ``format: pt``, which
transformers requires of the safetensors files it loads. :func:`file_quantization_config` reads it
back. Each quantized tensor ``<module>.weight`` becomes the entries compressed-tensors writes for
that module (``<module>.weight_packed``, ``<module>.weight_scale``, ...; see
:mod:`arrayquant.io.compressed_tensors.schemes`); plain arrays are written as they are. Modules whose schemes map
to different formats or weight arguments each get a config group naming them exactly.

The file is written by arrayquant's own layout writer
(:func:`arrayquant.io.arrayquant.checkpoint.save_stream`), its name rules and format key
included: a file without quantized tensors has no ``quantization_config``, so it is read back as
an arrayquant file, and must be one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import CorruptDataError, SchemeError, ShapeError
from ...tensor import QuantizedTensor, dtype_name
from ..arrayquant.checkpoint import save_stream
from ..safetensors.reader import SafetensorsFile
from .config import modules_quantization_config
from .schemes import weight_format, write_weight

__all__ = ["CONFIG_KEY", "file_quantization_config", "save_compressed_tensors"]

CONFIG_KEY = "quantization_config"  # the file-metadata key holding the config, as config.json names it
_WEIGHT = ".weight"


def _module_of(name: str) -> str:
    if not isinstance(name, str) or not name.endswith(_WEIGHT) or name == _WEIGHT:
        msg = (
            f"quantized tensor {name!r} is not named '<module>.weight'; compressed-tensors stores quantized "
            "weights of modules only: name it '<module>.weight', or save it with format='arrayquant'"
        )
        raise ShapeError(msg)
    return name[: -len(_WEIGHT)]


def _plan(tensors: Mapping[str, Any]) -> tuple[dict[str, tuple[str, dict[str, Any]]], list[str]]:
    """Each quantized module's (format, weight arguments), and the 2-d float weights left as they are.

    Done before any data is written, so a tensor that cannot be stored leaves the target untouched.
    """
    formats: dict[str, tuple[str, dict[str, Any]]] = {}
    ignore = []
    for name, item in tensors.items():
        if isinstance(item, QuantizedTensor):
            module = _module_of(name)
            try:
                formats[module] = weight_format(item.scheme, item.shape)
            except SchemeError as exc:
                msg = f"quantized tensor {name!r}: {exc}; in aq.save that is format='arrayquant'"
                raise SchemeError(msg) from None
        elif (
            isinstance(name, str)
            and name.endswith(_WEIGHT)
            and len(getattr(item, "shape", ())) == 2
            and dtype_name(getattr(item, "dtype", "")).startswith(("float", "bfloat"))
        ):
            # a Linear-shaped weight kept in float: listed, so a loader does not quantize it
            ignore.append(name[: -len(_WEIGHT)])
    return formats, sorted(ignore)


def save_compressed_tensors(path: str | os.PathLike[str], tensors: Mapping[str, Any]) -> None:
    """Write quantized weights and plain arrays to one safetensors file in compressed-tensors' layout.

    The file is written tensor by tensor to a temporary name renamed into place, so a failure
    leaves ``path`` as it was. Its metadata holds ``format: pt`` and, when any tensor is quantized,
    the ``quantization_config`` (JSON) that ``config.json`` would hold in a model folder: one group
    targeting ``Linear`` when every quantized weight has the same format and weight arguments,
    else one group per kind naming its modules (``re:^<module>$``). Plain 2-d float ``.weight``
    arrays are listed in its ``ignore``.

    Parameters
    ----------
    path : str or path-like
        The output ``.safetensors`` file.
    tensors : mapping of str to QuantizedTensor or array
        Quantized weights, each named ``<module>.weight`` with a scheme that has a
        compressed-tensors format, and plain arrays of any backend (bfloat16 and fp8 through
        ml_dtypes).

    Raises
    ------
    ShapeError
        A quantized tensor not named ``<module>.weight``, a shape its format cannot hold, or two
        entries of the same name (a plain ``m.weight_scale`` beside a quantized ``m.weight``).
    SchemeError
        A scheme with no compressed-tensors format; the message lists those that have one.
    DTypeError
        An array of a dtype safetensors cannot hold.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> qt = aq.quantize(np.ones((4, 32), np.float32), "nvfp4")
    >>> save_compressed_tensors(path, {"fc.weight": qt, "fc.bias": np.zeros(4, np.float32)})
    >>> file_quantization_config(path)["format"]
    'nvfp4-pack-quantized'
    """
    formats, ignore = _plan(tensors)
    metadata = {"format": "pt"}  # transformers refuses safetensors files without it
    if formats:
        metadata[CONFIG_KEY] = json.dumps(modules_quantization_config(formats, ignore), separators=(",", ":"))

    def items() -> Iterator[tuple[str, Any]]:
        for name, item in tensors.items():
            if isinstance(item, QuantizedTensor):
                # one tensor's entries at a time: save_stream writes them before asking for the next
                yield from write_weight(item, _module_of(name)).items()
            else:
                yield name, item

    save_stream(path, items(), metadata=metadata)


def file_quantization_config(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``quantization_config`` stored in a safetensors file's metadata, or None if it has none.

    Raises
    ------
    CorruptDataError
        The stored value is not JSON or not a JSON object, or the file is not a safetensors file.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "plain.safetensors")
    >>> save_compressed_tensors(path, {"w": np.ones(3, np.float32)})
    >>> file_quantization_config(path) is None
    True
    """
    with SafetensorsFile(path) as st:
        text = st.metadata.get(CONFIG_KEY)
    if text is None:
        return None
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:
        msg = f"{path}: the metadata's {CONFIG_KEY} is not JSON ({exc})"
        raise CorruptDataError(msg) from None
    if not isinstance(config, dict):
        msg = f"{path}: the metadata's {CONFIG_KEY} is a JSON {type(config).__name__}, not an object"
        raise CorruptDataError(msg)
    return config
