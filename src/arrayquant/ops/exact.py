"""Which path a layout operation takes: the table of when each is exact, and :func:`is_exact`.

The layout operations (``ops.manipulation``, ``ops.indexing``) take the **exact path** where
they can: codes and scale grid moved by the same operation, nothing dequantized; elsewhere Burn's
fallback, through the floats and quantized again with the input's scheme. Each operation is
planned first; :func:`is_exact` reads the same plan the operation runs.

"Blocked axis" below means an axis whose block extent (the scheme's block right-aligned to the
rank, ``b``) is above 1; "per tensor" means a scheme without a block level.

==========================  ===================================================  ===========
op                          exact when                                           otherwise
==========================  ===================================================  ===========
permute_dims, swapaxes,     always: codes and grid permuted, the block dims      --
matrix_transpose            permuted (Burn's ``permute_block_dims``) and the
                            packed axis moved with its data (Burn's cubecl
                            rule: the store dim becomes ``rank-1-new_pos``)
reshape                     per tensor; 1-d blocks when the last dim is          requantize
                            unchanged or old and new last dims are multiples of
                            ``b``; N-d blocks when the trailing dims the block
                            covers are unchanged
getitem, narrow, chunk,     per tensor; else on every blocked axis a step-1      requantize
split                       slice from a multiple of ``b`` to a multiple of
                            ``b`` or the axis end (ints, steps != 1 and negative
                            steps on unblocked axes), and the block still lines
                            up with the same axes after ``None``/int indices
flip                        per tensor; unblocked axes; a blocked axis whose     requantize
                            length is a multiple of ``min(b, length)``
take (Burn select)          per tensor; an unblocked axis                        requantize
take_along_axis (gather)    per tensor                                           requantize
repeat (Array API)          per tensor; an unblocked axis                        requantize
repeat_dim (Burn, tiles)    per tensor; an unblocked axis, or a length that is   requantize
                            a multiple of ``b``
broadcast_to (Burn expand)  always: the grid is broadcast with the codes         --
expand_dims, squeeze        per tensor; else when the block still lines up with  requantize
                            the same axes (axes added or removed left of it)
concat, stack               all inputs share scheme, global scale and table,     requantize
                            and per tensor identical scales, with blocks every   with the
                            input but the last a multiple of ``b`` long on the   first's
                            axis (``stack``: as ``expand_dims`` too)              scheme
==========================  ===================================================  ===========

A packed store follows its axis: where the packed axis moves (permute, ``None``/int indices,
``expand_dims``, ``squeeze``) the store's dim is rewritten so the same data stays packed; where
it disappears or the new rank has no such axis (an int index on it, a reshape to fewer axes) it
packs the last axis (dim 0). Every layout here is supported by :func:`~arrayquant.pack`.
A result with no axes, or with an empty axis, is a :class:`~arrayquant.ShapeError` (a
``QuantizedTensor`` has at least one element on every axis), and so is one past the limits
:func:`~arrayquant.quantize` enforces (more than 32 axes or ``2**62`` elements: a count, a target
shape or many inputs asking for too much), refused before anything is allocated; a result
within them that an eager backend cannot allocate (``repeat(qt, 2**40)``) is one too. Dask arrays
work wherever the backend has the operation lazily; ``take_along_axis`` on Dask raises
:class:`~arrayquant.BackendUnavailableError`. Comparing scales for ``concat``/``stack`` of
per-tensor inputs reads them (a Dask input is computed for that one value).

>>> import numpy as np
>>> import arrayquant as aq
>>> x = np.arange(-32, 32, dtype=np.float32).reshape(2, 32)
>>> qt = aq.quantize(x, "q8s:block16:f16")
>>> aq.ops.matrix_transpose(qt).scheme.block_size
BlockSize((16, 1))
>>> is_exact("getitem", qt, (slice(None), slice(0, 16))), is_exact("getitem", qt, (0, slice(0, 8)))
(True, False)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..errors import SchemeError, ShapeError
from . import indexing, manipulation
from ._plans import Move, check_qt

__all__ = ["is_exact"]

_PLANS: dict[str, Callable[..., Move]] = {**manipulation.PLANS, **indexing.PLANS}
_OTHERS: dict[str, Callable[..., bool]] = {**manipulation.EXACT_CHECKS, **indexing.EXACT_CHECKS}


def is_exact(name: str, qt: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether ``name(qt, *args, **kwargs)`` takes the exact path (codes moved, nothing requantized).

    Parameters
    ----------
    name : str
        A layout operation of ``arrayquant.ops`` (``"getitem"``, ``"reshape"``, ``"concat"``, ...).
    qt : QuantizedTensor or sequence of QuantizedTensor
        Its first argument (the list of tensors for ``concat`` and ``stack``).
    *args, **kwargs
        Its other arguments.

    Returns
    -------
    bool
        True on the exact path, False where the call would requantize.

    Raises
    ------
    SchemeError
        An unknown operation name.
    ShapeError, DTypeError
        Arguments the operation itself would reject.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.ones((4, 64), np.float32), "q4s:block32:f16")
    >>> is_exact("narrow", qt, 1, 32, 32), is_exact("narrow", qt, 1, 16, 32), is_exact("take", qt, [0], 1)
    (True, False, False)
    """
    if name not in _PLANS and name not in _OTHERS:
        msg = f"unknown layout operation {name!r}; use one of {', '.join(sorted([*_PLANS, *_OTHERS]))}"
        raise SchemeError(msg)
    plan = _OTHERS[name] if name in _OTHERS else lambda q, *a, **k: _PLANS[name](check_qt(q), *a, **k).exact
    try:
        inspect.signature(plan if name in _OTHERS else _PLANS[name]).bind(qt, *args, **kwargs)
    except TypeError as e:
        msg = f"is_exact({name!r}, ...) got arguments {name} does not take: {e}"
        raise ShapeError(msg) from None
    return bool(plan(qt, *args, **kwargs))
