"""What a requantize or dequantize run did, in every format: :class:`QuantizeSummary`, :class:`DequantizeSummary`."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DequantizeSummary", "QuantizeSummary"]


@dataclass
class QuantizeSummary:
    """What :func:`arrayquant.quantize_file` did: the tensors quantized, and every other one with why.

    The same record comes back from every format, so a caller reads ``quantized`` and ``left_out``
    without knowing which format it wrote; the fields a format has no use for stay empty.

    Examples
    --------
    >>> s = QuantizeSummary("gguf", "q4_0", stored_as="Q4_0", quantized=["blk.0.attn_q.weight"])
    >>> (s.format, s.stored_as, len(s.quantized), s.left_out)
    ('gguf', 'Q4_0', 1, {})
    """

    format: str  # the file format written: "arrayquant", "compressed-tensors", "gguf", "burnpack"
    scheme: str  # the scheme asked for, as text
    # what the format calls it: a GGUF type ("Q4_0"), a compressed-tensors format
    # ("nvfp4-pack-quantized"); the scheme text where the format stores schemes as they are
    stored_as: str = ""
    quantized: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)  # name -> why it was not quantized
    # tensors the type cannot hold, written in the format's fallback type instead (GGUF) -> that type
    fallback: dict[str, str] = field(default_factory=dict)
    # where the types differ from tensor to tensor (a llama-quantize mix such as Q4_K_M): each written
    # tensor -> its type (GGUF types; F16 and the other float types included)
    types: dict[str, str] = field(default_factory=dict)
    # the engine's fused layer (``...self_attn.qkv_proj``) -> its quantized modules sharing one
    # per-tensor level (compressed-tensors folders)
    fused_groups: dict[str, list[str]] = field(default_factory=dict)
    # what a reader of the output should know: loaders known to misread it, say
    warnings: list[str] = field(default_factory=list)
    # model folders: the other files copied, the float weights of other formats not copied, the
    # entries refused (not regular files) with why, and the weight shards written
    copied_files: list[str] = field(default_factory=list)
    skipped_files: list[str] = field(default_factory=list)
    refused_files: dict[str, str] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)
    # tensors whose NaN and infinities were set to 0 before quantizing (nonfinite="zero") -> how many
    zeroed: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.stored_as:
            self.stored_as = self.scheme


@dataclass
class DequantizeSummary:
    """What :func:`arrayquant.dequantize_file` did: the tensors turned back into floats, and the rest.

    >>> s = DequantizeSummary("gguf", "float32", dequantized=["w"], copied=["b"])
    >>> (s.format, len(s.dequantized), len(s.copied))
    ('gguf', 1, 1)
    """

    format: str  # the file format written
    dtype: str  # the float dtype asked for ("" where each tensor goes back to its original dtype)
    dequantized: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)  # tensors written as stored
    # entries not written, with why (a model folder's activation and KV-cache scales)
    dropped: list[str] = field(default_factory=list)
