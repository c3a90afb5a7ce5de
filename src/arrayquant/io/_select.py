"""Which tensors a requantize run quantizes: the one rule every format applies.

A format first says which of its tensors *can* be quantized (a float tensor not quantized
already, a GGUF weight llama-quantize would quantize, a ``Linear`` weight of a model folder);
:meth:`Selection.why_not` then applies what the caller asked: ``include`` globs replace the
default choice (a 2-d weight that is not a norm or a bias), ``exclude`` globs narrow it, and a
size floor leaves small tensors alone.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Selection", "default_weight", "is_bias"]


def is_bias(name: str) -> bool:
    """Whether the last component of ``name`` is a bias (``attn.bias``, ``fc.c_bias``)."""
    return name.rsplit(".", 1)[-1].lower().endswith("bias")


def default_weight(name: str, shape: Sequence[int]) -> str | None:
    """Why the default choice leaves ``name`` alone, or None: a 2-d weight, not a norm or a bias.

    >>> default_weight("model.layers.0.mlp.up_proj.weight", (64, 32)) is None
    True
    >>> default_weight("model.norm.weight", (64, 32))
    'a norm or a bias'
    """
    if len(shape) != 2:
        return f"rank {len(shape)} (only 2-d weights by default)"
    if "norm" in name.lower() or is_bias(name):
        return "a norm or a bias"
    return None


@dataclass(frozen=True)
class Selection:
    """What the caller asked: ``include`` / ``exclude`` globs on names and a size floor.

    >>> s = Selection(exclude=("*.mlp.*",))
    >>> s.why_not("layers.0.mlp.up.weight", (8, 8))
    'named by exclude'
    >>> s.why_not("layers.0.attn.q.weight", (8, 8)) is None
    True
    """

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    min_size: int = 0

    def named(self, name: str) -> bool:
        """Whether the globs keep ``name``: named by ``include`` (or no ``include``), not by ``exclude``."""
        if self.include and not any(fnmatch.fnmatchcase(name, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.exclude)

    def why_not(self, name: str, shape: Sequence[int], *, default: bool = True) -> str | None:
        """Why ``name`` is not quantized, or None to quantize it.

        ``default=False`` skips the default choice for formats whose own rule already made it
        (GGUF's llama-quantize rule, a model folder's ``Linear`` weights): only the globs and
        the size floor apply then.
        """
        if self.include:
            if not any(fnmatch.fnmatchcase(name, g) for g in self.include):
                return "not named by include"
        elif default and (why := default_weight(name, shape)) is not None:
            return why
        if any(fnmatch.fnmatchcase(name, g) for g in self.exclude):
            return "named by exclude"
        size = 1
        for n in shape:
            size *= int(n)
        if size < self.min_size:
            return f"{size} values, fewer than the size floor of {self.min_size}"
        return None
