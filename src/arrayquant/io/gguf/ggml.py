"""gguf-py, imported when first used, and the GGML conventions every part of a GGUF file follows.

gguf-py (llama.cpp's Python package) holds GGML's type table (block and byte sizes, ``LlamaFileType``)
and the writer; it is imported by :func:`gguf_py` only, so that :mod:`arrayquant.io.gguf` imports
without it. The rest are llama.cpp's rules that the reader, the writer and the re-quantizer share:
a tensor's rank as ggml counts it, and the name of an NVFP4 weight's per-tensor scale tensor.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import BackendUnavailableError

__all__ = ["MAX_DIMS", "block_sizes", "file_type", "ggml_rank", "gguf_py", "row_bytes", "scale_name", "type_nbytes"]

MAX_DIMS = 4  # GGML_MAX_DIMS


def gguf_py() -> Any:
    """The ``gguf`` package, or a :class:`~arrayquant.errors.BackendUnavailableError` saying how to install it."""
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - gguf is a test dependency
        msg = "GGUF files need the gguf package (gguf-py, from llama.cpp); pip install gguf"
        raise BackendUnavailableError(msg) from e
    return gguf


def block_sizes(type_name: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGUF type."""
    g = gguf_py()
    return g.GGML_QUANT_SIZES[g.GGMLQuantizationType[type_name]]


def row_bytes(type_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The byte shape gguf-py gives a tensor: rows of whole blocks."""
    block, size = block_sizes(type_name)
    return (*shape[:-1], shape[-1] // block * size)


def type_nbytes(type_name: str, shape: tuple[int, ...]) -> int:
    """The bytes of a tensor of ``shape`` stored as ``type_name``."""
    block, size = block_sizes(type_name)
    return math.prod(shape) // block * size


def file_type(type_name: str) -> int | None:
    """The ``general.file_type`` (``LlamaFileType``) of a file mostly of ``type_name``, or None where it has none."""
    lft = gguf_py().LlamaFileType
    # llama-quantize's names "Q3_K", "Q4_K", "Q5_K" are its _M mixes (tools/quantize/quantize.cpp)
    special = {
        "F32": "ALL_F32",
        "MXFP4": "MOSTLY_MXFP4_MOE",
        "Q3_K": "MOSTLY_Q3_K_M",
        "Q4_K": "MOSTLY_Q4_K_M",
        "Q5_K": "MOSTLY_Q5_K_M",
    }
    member = getattr(lft, special.get(type_name, f"MOSTLY_{type_name}"), None)
    return None if member is None else int(member)


def ggml_rank(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: the rank without GGML's trailing (NumPy's leading) extents of 1."""
    rank = len(shape)
    while rank > 1 and shape[len(shape) - rank] == 1:
        rank -= 1
    return max(rank, 1)


def scale_name(name: str) -> str:
    """The F32 tensor that holds an NVFP4 weight's per-tensor scale, named as llama.cpp names it.

    llama.cpp's converter (``conversion/base.py``, ``_repack_nvfp4``) writes ModelOpt's
    ``weight_scale_2`` as ``name.replace(".weight", ".scale")`` (``blk.0.attn_q.weight`` ->
    ``blk.0.attn_q.scale``), shape ``{1}``, and its graph multiplies the matmul by it
    (``ggml_mul`` in ``build_lora_mm``). A name without the ``.weight`` suffix gets ``.scale`` added.

    >>> scale_name("blk.0.attn_q.weight"), scale_name("w")
    ('blk.0.attn_q.scale', 'w.scale')
    """
    return name[: -len(".weight")] + ".scale" if name.endswith(".weight") else name + ".scale"
