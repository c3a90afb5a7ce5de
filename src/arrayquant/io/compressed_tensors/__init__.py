"""compressed-tensors, the quantized-model format of vLLM, SGLang and transformers."""

from .nvfp4 import read_nvfp4, write_nvfp4

__all__ = ["read_nvfp4", "write_nvfp4"]
