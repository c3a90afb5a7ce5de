"""The quantization scheme: value, store, mode and scale levels, with its text form."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import SchemeError
from .block import BlockSize, parse_extents
from .codebooks import CODEBOOKS
from .scales import ScaleDtype
from .store import QuantStore
from .values import QuantMode, QuantValue

__all__ = ["PRESETS", "SCALE_RULES", "QuantScheme"]

SCALE_RULES = ("round_up", "ocp")

_DEFAULT_STORE = QuantStore()  # Burn's default: PackedU32(0)


@dataclass(frozen=True)
class QuantScheme:
    """A quantization scheme, as in Burn: what is stored and how it is scaled.

    ``QuantScheme()`` is Burn's default (Q8F, PackedU32(0), symmetric, no level set, which
    resolves to one F32 scale per tensor). Builders return new schemes; setting the levels in
    either order gives the same scheme.

    >>> s = QuantScheme().with_value("q4s").per_block(32, "f16")
    >>> str(s)
    'q4s:block32:f16'
    >>> QuantScheme.parse(str(s)) == s
    True
    >>> s.scale_dtype, s.num_levels
    (<ScaleDtype.F16: 'f16'>, 1)
    >>> QuantScheme.nvfp4().is_two_level
    True

    Beyond Burn, the affine modes add a zero point (``x = s * (q - z)``) or an offset
    (``x = d * q + m``) per scale:

    >>> QuantScheme.parse("u4:block128:bf16:zero_point").with_mode("offset").spelled_out()
    'u4:block128:bf16:offset'
    """

    value: QuantValue = QuantValue.Q8F
    store: QuantStore = _DEFAULT_STORE
    mode: QuantMode = QuantMode.SYMMETRIC
    tensor: ScaleDtype | None = None
    block: tuple[BlockSize, ScaleDtype] | None = None
    scale_rule: str = "round_up"
    codebook: str | None = None

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "value", QuantValue.coerce(self.value))
        setattr_(self, "store", QuantStore.coerce(self.store))
        setattr_(self, "mode", QuantMode.coerce(self.mode))
        if self.tensor is not None:
            setattr_(self, "tensor", ScaleDtype.coerce(self.tensor))
        if self.codebook is not None:
            name = str(self.codebook).strip().lower()
            if name not in CODEBOOKS:
                msg = f"unknown codebook {self.codebook!r}; built-in codebooks: {', '.join(map(repr, CODEBOOKS))}"
                raise SchemeError(msg)
            setattr_(self, "codebook", name)
        if self.scale_rule not in SCALE_RULES:
            msg = f"unknown scale rule {self.scale_rule!r}; use one of {', '.join(map(repr, SCALE_RULES))}"
            raise SchemeError(msg)
        if self.block is not None:
            try:
                size, dtype = self.block
            except (TypeError, ValueError):
                msg = f"block level must be a (BlockSize, ScaleDtype) pair, got {self.block!r}"
                raise SchemeError(msg) from None
            setattr_(self, "block", (BlockSize(size), ScaleDtype.coerce(dtype)))

    # -- builders -----------------------------------------------------------------------------
    def with_value(self, value: QuantValue | str) -> QuantScheme:
        """The same scheme with another value kind."""
        return dataclasses.replace(self, value=QuantValue.coerce(value))

    def with_store(self, store: QuantStore | str) -> QuantScheme:
        """The same scheme with another store (``"native"``, ``"packed_u32:1"``, ...)."""
        return dataclasses.replace(self, store=QuantStore.coerce(store))

    def with_mode(self, mode: QuantMode | str) -> QuantScheme:
        """The same scheme with another mode (``"symmetric"``, ``"lookup"``, ``"zero_point"``, ``"offset"``)."""
        return dataclasses.replace(self, mode=QuantMode.coerce(mode))

    def with_scale_rule(self, rule: str) -> QuantScheme:
        """``"round_up"`` (default: the scale is at least ``max|x| / max``, nothing clips) or
        ``"ocp"``: OCP MX's shared exponent ``floor(log2 max|x|) - emax(element)``, which may clip
        a block's largest values to the element max (for interop with OCP MX producers).
        """
        return dataclasses.replace(self, scale_rule=str(rule).strip().lower())

    def with_codebook(self, name: str | None) -> QuantScheme:
        """Lookup mode with a built-in table (``"nf4"``), which then needs no ``table`` argument.

        ``None`` drops the codebook (the scheme stays in lookup mode and needs a table).

        >>> str(QuantScheme().with_value("q4f").per_block(32).with_codebook("nf4"))
        'q4f:block32:f32:lookup:nf4'
        """
        if name is None:
            return dataclasses.replace(self, codebook=None)
        return dataclasses.replace(self, mode=QuantMode.LOOKUP, codebook=name)

    def per_tensor(self, dtype: ScaleDtype | str = ScaleDtype.F32) -> QuantScheme:
        """Set the per-tensor level (with a block level too, the scheme becomes two-level)."""
        return dataclasses.replace(self, tensor=ScaleDtype.coerce(dtype))

    def per_block(self, size: int | Iterable[int] | BlockSize, dtype: ScaleDtype | str = ScaleDtype.F32) -> QuantScheme:
        """Set the per-block level: one scale of ``dtype`` per block of ``size``."""
        return dataclasses.replace(self, block=(BlockSize(size), ScaleDtype.coerce(dtype)))

    # -- presets ------------------------------------------------------------------------------
    @classmethod
    def nvfp4(cls) -> QuantScheme:
        """NVFP4: E2M1, block [16] UE4M3, per-tensor F32, PackedNative(0)."""
        return cls(
            QuantValue.E2M1,
            QuantStore.packed_native(0),
            QuantMode.SYMMETRIC,
            ScaleDtype.F32,
            (BlockSize(16), ScaleDtype.UE4M3),
        )

    @classmethod
    def mxfp8(cls) -> QuantScheme:
        """OCP MXFP8: E4M3, block [32] UE8M0, Native."""
        return cls(QuantValue.E4M3, QuantStore.native(), QuantMode.SYMMETRIC, None, (BlockSize(32), ScaleDtype.UE8M0))

    @classmethod
    def mxfp4(cls) -> QuantScheme:
        """OCP MXFP4: E2M1, block [32] UE8M0, PackedNative(0)."""
        return cls(
            QuantValue.E2M1, QuantStore.packed_native(0), QuantMode.SYMMETRIC, None, (BlockSize(32), ScaleDtype.UE8M0)
        )

    @classmethod
    def nf4(cls) -> QuantScheme:
        """NF4 as bitsandbytes uses it: 4-bit indices into the NF4 codebook, one F32 absmax scale per 64 values."""
        return cls(
            QuantValue.Q4F, QuantStore(), QuantMode.LOOKUP, None, (BlockSize(64), ScaleDtype.F32), codebook="nf4"
        )

    # -- level resolution ---------------------------------------------------------------------
    @property
    def tensor_scale(self) -> ScaleDtype | None:
        """The per-tensor scale dtype; F32 when no level is set, None for block-only."""
        if self.tensor is not None:
            return self.tensor
        return ScaleDtype.F32 if self.block is None else None

    @property
    def block_scale(self) -> ScaleDtype | None:
        """The block scale dtype, or None without a block level."""
        return None if self.block is None else self.block[1]

    @property
    def block_size(self) -> BlockSize | None:
        """The block extents, or None without a block level."""
        return None if self.block is None else self.block[0]

    @property
    def scale_dtype(self) -> ScaleDtype:
        """The innermost scale dtype: the one the stored scale grid uses."""
        if self.block is not None:
            return self.block[1]
        assert self.tensor_scale is not None
        return self.tensor_scale

    @property
    def is_two_level(self) -> bool:
        """Block scales relative to one per-tensor f32 scale."""
        return self.block is not None and self.tensor is not None

    @property
    def num_levels(self) -> int:
        """1, or 2 for a two-level scheme."""
        return 2 if self.is_two_level else 1

    # -- text form ----------------------------------------------------------------------------
    def __str__(self) -> str:
        return _text(self)

    def spelled_out(self) -> str:
        """The text form token by token, even for a preset (which ``str`` names).

        >>> QuantScheme.nvfp4().spelled_out()
        'e2m1:block16:ue4m3:tensor:f32:packed_native'
        """
        parts = [self.value.value]
        if self.block is not None:
            parts += [f"block{self.block[0]}", self.block[1].value]
        if self.tensor is not None:
            parts += ["tensor", self.tensor.value]
        if self.store != QuantStore():
            parts.append(str(self.store))
        if self.mode is not QuantMode.SYMMETRIC or self.codebook is not None:
            parts.append(self.mode.value)  # a codebook token alone would read back as lookup
        if self.scale_rule != "round_up":
            parts.append(self.scale_rule)
        if self.codebook is not None:
            parts.append(self.codebook)
        return ":".join(parts)

    def __repr__(self) -> str:
        return f"QuantScheme.parse({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> QuantScheme:
        """Parse the text form written by ``str(scheme)``, or a preset name.

        Tokens are ``:``-separated: the value first, then in any order ``block<N>[x<M>...]
        [:dtype]``, ``tensor[:dtype]``, a store (``native``, ``packed_u32[:dim]``,
        ``packed_native[:dim]``), a mode (``symmetric``, ``lookup``, ``zero_point``, ``offset``), a
        scale rule (``round_up``, ``ocp``) and a codebook (``nf4``, which implies ``lookup``). A
        missing dtype is f32.

        >>> QuantScheme.parse("q8s:block16:ue4m3:tensor:f32:native").is_two_level
        True
        >>> QuantScheme.parse("u4:block32:f16:offset").mode
        <QuantMode.OFFSET: 'offset'>
        """
        if not isinstance(text, str):
            msg = f"scheme text must be a str, got {type(text).__name__}"
            raise SchemeError(msg)
        raw = text.strip().lower()
        if raw in PRESETS:
            return PRESETS[raw]()
        tokens = raw.split(":")
        if not tokens or not tokens[0]:
            msg = f"empty scheme text {text!r}; start with a value such as 'q8s' or a preset"
            raise SchemeError(msg)
        if tokens[0] in PRESETS:
            msg = (
                f"preset {tokens[0]!r} takes no modifiers in {text[:200]!r}; spell the scheme out and change "
                f"what you need, starting from {PRESETS[tokens[0]]().spelled_out()!r}"
            )
            raise SchemeError(msg)
        try:
            fields: dict[str, Any] = {"value": QuantValue.coerce(tokens[0])}
        except SchemeError as exc:
            msg = f"{exc}; or a preset: {', '.join(map(repr, PRESETS))}"
            raise SchemeError(msg) from None
        i = 1
        dtypes = {d.value for d in ScaleDtype}

        def take_optional(pred: Any) -> str | None:
            nonlocal i
            if i < len(tokens) and pred(tokens[i]):
                i += 1
                return tokens[i - 1]
            return None

        def set_once(key: str, val: Any, token: str) -> None:
            if key in fields:
                msg = f"scheme text {text!r} sets the {key} twice (at {token!r})"
                raise SchemeError(msg)
            fields[key] = val

        while i < len(tokens):
            tok = tokens[i]
            i += 1
            if tok.startswith("block"):
                try:
                    dims = parse_extents(tok[5:], text)
                except SchemeError:
                    msg = (
                        f"bad block token {tok[:60]!r} in {text[:120]!r}; write e.g. 'block32' or 'block4x32' "
                        "(ASCII digits only)"
                    )
                    raise SchemeError(msg) from None
                dtype = take_optional(lambda t: t in dtypes) or "f32"
                set_once("block", (BlockSize(dims), ScaleDtype.coerce(dtype)), tok)
            elif tok == "tensor":
                dtype = take_optional(lambda t: t in dtypes) or "f32"
                set_once("tensor", ScaleDtype.coerce(dtype), tok)
            elif tok in ("native", "packed_u32", "packed_native"):
                dim = take_optional(lambda t: t.isascii() and t.isdigit())
                if dim is not None and len(dim) > 2:  # packed axes count from the last of at most 32
                    msg = f"store dim {dim[:60]!r} in {text[:120]!r} is too large; the dim is a small axis number"
                    raise SchemeError(msg)
                set_once("store", QuantStore(tok, int(dim) if dim else 0), tok)
            elif tok in _MODES:
                set_once("mode", QuantMode.coerce(tok), tok)
            elif tok in SCALE_RULES:
                set_once("scale_rule", tok, tok)
            elif tok in CODEBOOKS:
                set_once("codebook", tok, tok)
            else:
                msg = (
                    f"unknown token {tok!r} in scheme text {text!r}; expected block<N>[:dtype], "
                    "tensor[:dtype], native, packed_u32[:dim], packed_native[:dim], symmetric, lookup, zero_point, "
                    "offset, round_up, ocp "
                    f"or a codebook ({', '.join(CODEBOOKS)})"
                )
                raise SchemeError(msg)
        if "codebook" in fields:
            fields.setdefault("mode", QuantMode.LOOKUP)
        return cls(**fields)


PRESETS = {
    "nvfp4": QuantScheme.nvfp4,
    "mxfp8": QuantScheme.mxfp8,
    "mxfp4": QuantScheme.mxfp4,
    "nf4": QuantScheme.nf4,
    # GGUF type names whose blocks are exactly these schemes (arrayquant.io.gguf.types)
    "q8_0": lambda: QuantScheme.parse("q8f:block32:f16"),
    "q4_0": lambda: QuantScheme.parse("q4f:block32:f16"),
    "tq2_0": lambda: QuantScheme.parse("q2s:block256:f16"),
    "q4_1": lambda: QuantScheme.parse("u4:block32:f16:offset"),
    "q5_0": lambda: QuantScheme.parse("q5f:block32:f16"),
    "q5_1": lambda: QuantScheme.parse("u5:block32:f16:offset"),
    # the K-quants and IQ4: sub-block scales (and offsets) d * level, exact in f32 (arrayquant.fused.ggml_blocks)
    "q2_k": lambda: QuantScheme.parse("u2:block16:f32:offset"),
    "q3_k": lambda: QuantScheme.parse("q3f:block16:f32"),
    "q4_k": lambda: QuantScheme.parse("u4:block32:f32:offset"),
    "q5_k": lambda: QuantScheme.parse("u5:block32:f32:offset"),
    "q6_k": lambda: QuantScheme.parse("q6f:block16:f32"),
    "iq4_nl": lambda: QuantScheme.parse("q4f:block32:f16:lookup:iq4nl"),
    "iq4_xs": lambda: QuantScheme.parse("q4f:block32:f32:lookup:iq4nl"),
}


# accepted by parse, never printed: str() keeps the spelled-out form for these schemes
@functools.lru_cache(maxsize=512)
def _text(scheme: QuantScheme) -> str:
    """A scheme's text form: its preset's name where it is one, else :meth:`QuantScheme.spelled_out` (cached:
    naming a preset builds every preset, and messages and reprs ask often)."""
    for name, make in PRESETS.items():
        if name not in _ALIASES and make() == scheme:
            return name
    return scheme.spelled_out()


_ALIASES = frozenset(
    {"q8_0", "q4_0", "tq2_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"}
)
_MODES = tuple(m.value for m in QuantMode)
