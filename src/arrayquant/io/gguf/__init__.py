"""GGUF, llama.cpp's file format (llama.cpp, ollama, LM Studio): the entry module of the ``gguf`` format.

Read here, with every count and offset of the header checked before anything is allocated for
it; written through gguf-py; re-quantized tensor by tensor as llama-quantize does. gguf-py is
imported when a file is first read or written, so this package imports without it.

=====================  ==================================================================
module                 owns
=====================  ==================================================================
``ggml``               gguf-py (imported when used), GGML's sizes and llama.cpp's names
``metadata``           key/values: where each lies, decoded, :class:`GGUFArray`, typed
``container``          the bounded reader: header walk, limits, :func:`open_gguf`
``reader``             tensors as arrayquant holds them: :func:`load`, :func:`iter_tensors`
``writer``             the streaming writer and :func:`save`
``types``              the GGUF types that are arrayquant schemes, and their block codecs
``mixes``              llama-quantize's file types (Q4_K_M, ...): each tensor's type, :data:`MIXES`
``requantize``         :func:`quantize_file` (llama-quantize's rule) and :func:`dequantize_file`
=====================  ==================================================================
"""

from .container import MAGIC, MAX_ALIGNMENT, MAX_ARRAY_ITEMS, MAX_KEY_BYTES, MAX_KEY_VALUES, NAME, open_gguf, sniff
from .metadata import GGUFArray
from .mixes import MIXES
from .reader import iter_tensors, load, read_metadata, tensor_shapes
from .requantize import dequantize_file, quantize_file, quantized_already
from .writer import save

__all__ = [
    "MAGIC",
    "MAX_ALIGNMENT",
    "MAX_ARRAY_ITEMS",
    "MAX_KEY_BYTES",
    "MAX_KEY_VALUES",
    "MIXES",
    "NAME",
    "GGUFArray",
    "dequantize_file",
    "iter_tensors",
    "load",
    "open_gguf",
    "quantize_file",
    "quantized_already",
    "read_metadata",
    "save",
    "sniff",
    "tensor_shapes",
]
