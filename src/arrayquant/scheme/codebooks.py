"""Named codebooks for LOOKUP mode."""

from __future__ import annotations

from .scales import to_f32

__all__ = ["CODEBOOKS", "IQ4NL", "NF4"]

#: NormalFloat4 (QLoRA, Dettmers et al. 2023): quantiles of N(0, 1) scaled to [-1, 1], as f32.
NF4: tuple[float, ...] = tuple(
    to_f32(v)
    for v in (
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    )
)

#: llama.cpp's ``kvalues_iq4nl`` (ggml-common.h): the 16 values of GGUF's IQ4_NL and IQ4_XS, indexed
#: by the 4-bit field (the value is the table entry times the block's scale; no normalisation).
IQ4NL: tuple[float, ...] = tuple(
    float(v) for v in (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
)

# Built-in tables a scheme can name (``QuantScheme.codebook``), so that it needs no table argument
# and its text form, checkpoints and Burn byte buffers say which table decodes it.
CODEBOOKS: dict[str, tuple[float, ...]] = {"nf4": NF4, "iq4nl": IQ4NL}
