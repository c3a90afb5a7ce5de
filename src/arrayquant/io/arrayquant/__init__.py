"""arrayquant's own safetensors layout: quantized tensors stored exactly, with their scheme."""

__all__: list[str] = []
