"""safetensors files: the bounded, validating reader and the streaming writer every safetensors format shares."""

__all__: list[str] = []
