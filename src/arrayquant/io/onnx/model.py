"""Reading an ONNX model from a stranger's file, and writing one atomically.

A model is read only from a regular file no larger than :data:`SIZE_LIMIT` (protobuf's own 2 GiB
ceiling), and only its own bytes: a tensor stored as external data would make the reader open
another path named inside the file, so such models are refused with a message instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from ...errors import BackendUnavailableError, CorruptDataError, SchemeError
from .._atomic import publish
from ..paths import open_regular

__all__ = ["SIZE_LIMIT", "read_model", "sniff", "write_model"]

SIZE_LIMIT = (1 << 31) - 1  # a protobuf message is at most 2 GiB


def _onnx() -> Any:
    """The ``onnx`` package (and ``ml_dtypes``, which its 4-bit and float8 tensors need), or a
    BackendUnavailableError saying what to install. Imported only when a model is read or written:
    recognising a ``.onnx`` file needs neither."""
    try:
        import ml_dtypes  # noqa: F401
        import onnx
    except ImportError as exc:
        msg = f"the onnx format needs {exc.name or 'onnx'} (pip install 'arrayquant[onnx]')"
        raise BackendUnavailableError(msg) from None
    return onnx


def sniff(path: Path) -> bool:
    """A regular file named ``*.onnx`` whose first byte opens a ModelProto field (``ir_version``, tag 0x08)."""
    if path.is_dir() or path.suffix.lower() != ".onnx":
        return False
    with open_regular(path) as f:
        return f.read(1) == b"\x08"


def read_model(path: str | os.PathLike[str]) -> Any:
    """The ``onnx.ModelProto`` in ``path``.

    Raises
    ------
    CorruptDataError
        The file is larger than protobuf allows or is not an ONNX model.
    SchemeError
        The model keeps tensors in external data files (not read: their paths come from the file).
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > SIZE_LIMIT:
            msg = f"{path} has {size} bytes, more than an ONNX protobuf can hold ({SIZE_LIMIT})"
            raise CorruptDataError(msg)
        data = f.read(size + 1)
    onnx = _onnx()
    try:
        model = onnx.ModelProto.FromString(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        msg = f"{path} is not an ONNX model: {exc}"
        raise CorruptDataError(msg) from None
    if not model.HasField("graph"):
        msg = f"{path} is not an ONNX model: it has no graph"
        raise CorruptDataError(msg)
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        msg = (
            f"{path} keeps {len(external)} tensor(s) in external data files (e.g. {external[0]!r}); arrayquant reads "
            "only the model file itself: save the model with its tensors inside (onnx.save(model, path, "
            "save_as_external_data=False)) first"
        )
        raise SchemeError(msg)
    return model


def write_model(path: str | os.PathLike[str], model: Any) -> None:
    """Write ``model`` to ``path`` atomically (a temporary beside it, renamed over it)."""
    data = model.SerializeToString()

    def write(f: BinaryIO, _tmp: Path) -> None:
        f.write(data)

    publish(Path(path), write)
