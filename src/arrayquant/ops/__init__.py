"""Operations on quantized tensors, named as in the Array API where it has the operation.

What each operation returns follows Burn's rules for quantized tensors:

* **layout operations** (``reshape``, ``permute_dims``, ``getitem``, ``concat``, ...; modules
  ``ops.manipulation`` and ``ops.indexing``) return a quantized tensor. Where the operation keeps
  whole blocks and the scales still apply, the stored codes and scales are moved and nothing is
  dequantized; elsewhere the data goes through floats and is quantized again with the input's
  scheme (Burn's fallback). ``is_exact`` (``ops.exact``, with the table of when) says which path a
  call takes.
* **arithmetic, reductions and scans** (``ops.elementwise``, ``ops.statistical``) compute on the
  dequantized values; ``propagation="inhibit"`` (the default, as in Burn) returns floats,
  ``"propagate"`` quantizes the result again with the input's scheme.
* **math functions, comparisons, searches and updates** (``ops.elementwise``, ``ops.searching``,
  ``ops.sorting``, ``ops.utility``, ``ops.updates``) return floats, booleans or indices; ``abs``,
  ``max``, ``min``, ``sort``, ``topk`` and ``mask_select`` always return quantized tensors (all but
  ``abs`` select the stored codes exactly for one scale per tensor; ``abs`` is requantized, as
  Burn's).
* **matmul** (``ops.linalg``) with either side quantized: dequantize and multiply, an exact
  integer path for integer schemes scaled per tensor or per row/column, and an add/subtract path
  for ternary (Q2S per tensor) weights.

>>> import numpy as np
>>> import arrayquant as aq
>>> x = np.arange(8 * 64, dtype=np.float32).reshape(8, 64) / 100
>>> qt = aq.quantize(x, "q8s:block32:f16")
>>> aq.ops.is_exact("getitem", qt, (slice(2, 4), slice(32, 64)))
True
>>> part = qt[2:4, 32:]
>>> bool((aq.dequantize(part) == aq.dequantize(qt)[2:4, 32:]).all())
True
"""

from ._common import PROPAGATIONS
from .elementwise import (
    abs,
    add,
    ceil,
    clip,
    cos,
    cosh,
    divide,
    equal,
    erf,
    exp,
    floor,
    greater,
    greater_equal,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    log1p,
    maximum,
    minimum,
    multiply,
    negative,
    not_equal,
    pow,
    reciprocal,
    remainder,
    round,
    sign,
    sin,
    sinh,
    sqrt,
    square,
    subtract,
    tan,
    tanh,
)
from .exact import is_exact
from .indexing import (
    chunk,
    getitem,
    mask_select,
    narrow,
    split,
    take,
    take_along_axis,
)
from .linalg import matmul, matmul_path
from .manipulation import (
    broadcast_to,
    concat,
    expand_dims,
    flip,
    matrix_transpose,
    permute_dims,
    repeat,
    repeat_dim,
    reshape,
    squeeze,
    stack,
    swapaxes,
)
from .searching import argmax, argmin, where
from .sorting import argsort, sort, topk
from .statistical import (
    cumulative_max,
    cumulative_min,
    cumulative_prod,
    cumulative_sum,
    max,
    mean,
    min,
    prod,
    sum,
)
from .updates import (
    index_add,
    mask_fill,
    scatter_add,
    slice_assign,
)
from .utility import all, any

__all__ = [
    "PROPAGATIONS",
    "abs",
    "add",
    "all",
    "any",
    "argmax",
    "argmin",
    "argsort",
    "broadcast_to",
    "ceil",
    "chunk",
    "clip",
    "concat",
    "cos",
    "cosh",
    "cumulative_max",
    "cumulative_min",
    "cumulative_prod",
    "cumulative_sum",
    "divide",
    "equal",
    "erf",
    "exp",
    "expand_dims",
    "flip",
    "floor",
    "getitem",
    "greater",
    "greater_equal",
    "index_add",
    "is_exact",
    "isinf",
    "isnan",
    "less",
    "less_equal",
    "log",
    "log1p",
    "mask_fill",
    "mask_select",
    "matmul",
    "matmul_path",
    "matrix_transpose",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "multiply",
    "narrow",
    "negative",
    "not_equal",
    "permute_dims",
    "pow",
    "prod",
    "reciprocal",
    "remainder",
    "repeat",
    "repeat_dim",
    "reshape",
    "round",
    "scatter_add",
    "sign",
    "sin",
    "sinh",
    "slice_assign",
    "sort",
    "split",
    "sqrt",
    "square",
    "squeeze",
    "stack",
    "subtract",
    "sum",
    "swapaxes",
    "take",
    "take_along_axis",
    "tan",
    "tanh",
    "topk",
    "where",
]
