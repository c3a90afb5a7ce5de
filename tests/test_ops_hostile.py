"""Layout operations asked for absurd sizes or counts end in typed errors, never in a crash.

The limits are the ones :func:`aq.quantize` enforces on its input (``invariants.data``): at most
``MAX_RANK`` axes and ``MAX_ELEMENTS`` elements, checked before anything is allocated. A result
within them can still be beyond any memory (``repeat(qt, 2**40)`` of a small tensor); the
backend's refusal of that allocation is a ShapeError too. Before these checks such calls raised
MemoryError, ValueError or OverflowError, and ``repeat`` of a flattened tensor past the limit
crashed the interpreter (an int64 overflow inside ``np.repeat``). Huge inputs are built from
zero-stride views, so the tests allocate almost nothing.
"""

from __future__ import annotations

import dataclasses
import re
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import ShapeError
from arrayquant.invariants.data import MAX_ELEMENTS, MAX_RANK
from arrayquant.ops import layout

LIMIT = re.escape(f"more than the {MAX_ELEMENTS} any array can hold")


def small() -> aq.QuantizedTensor:
    return aq.quantize(np.linspace(-1, 1, 256, dtype=np.float32).reshape(4, 64), "q8s")


def blocked() -> aq.QuantizedTensor:
    return aq.quantize(np.linspace(-1, 1, 256, dtype=np.float32).reshape(4, 64), "q8s:block32:f16")


def huge(shape: tuple[int, ...] = (2**61,)) -> aq.QuantizedTensor:
    """A per-tensor q8s:native tensor of ``shape`` whose codes are one zero-stride int8."""
    qt = aq.quantize(np.ones(4, np.float32), "q8s:native")
    return dataclasses.replace(qt, shape=shape, values=np.broadcast_to(np.int8(1), shape))


def elements(shape: tuple[int, ...]) -> str:
    return re.escape(f"{list(shape)} has {int(np.prod(shape, dtype=object))} elements, ")


GROWING: dict[str, tuple[Callable[[], Any], str]] = {
    # the audit's call: 2**23 elements repeated 2**40 times (NumPy: "negative dimensions are not allowed")
    "repeat 2**40 along an axis": (
        lambda: layout.repeat(aq.quantize(np.ones(2**23, np.float32), "q8s:native"), 2**40, axis=0),
        r"the result of repeat\(qt, 1099511627776, axis=0\) " + elements((2**63,)) + LIMIT + "; use fewer repeats",
    ),
    # NumPy: OverflowError (a count beyond int64)
    "repeat 2**64": (
        lambda: layout.repeat(small(), 2**64, axis=1),
        r"repeat\(qt, 18446744073709551616, axis=1\) " + elements((4, 64 * 2**64)) + LIMIT,
    ),
    # NumPy: MemoryError for the list of 2**62 references
    "repeat_dim 2**62": (
        lambda: layout.repeat_dim(small(), 0, 2**62),
        r"the result of repeat_dim\(qt, 0, 4611686018427387904\) "
        + elements((2**64, 64))
        + LIMIT
        + "; use fewer times",
    ),
    # NumPy: "iterator is too large"
    "broadcast_to 2**62": (
        lambda: layout.broadcast_to(small(), (2**62, 4, 64)),
        r"the result of broadcast_to " + elements((2**62, 4, 64)) + LIMIT + "; broadcast to a smaller shape",
    ),
    "broadcast_to 2**62 blocked": (
        lambda: layout.broadcast_to(blocked(), (2**62, 4, 64)),
        r"the result of broadcast_to " + elements((2**62, 4, 64)) + LIMIT,
    ),
    # NumPy: "Maximum allowed dimension exceeded"
    "broadcast_to 2**64": (
        lambda: layout.broadcast_to(small(), (2**64, 4, 64)),
        elements((2**64, 4, 64)) + LIMIT,
    ),
    # NumPy: MemoryError, 8 EiB
    "take": (
        lambda: layout.take(huge((2**50, 2**12)), np.zeros(2**13, np.int64), axis=1),
        r"the result of take " + elements((2**50, 2**13)) + LIMIT + "; take fewer indices",
    ),
    # the indices broadcast against the tensor off the axis (NumPy: MemoryError)
    "take_along_axis": (
        lambda: layout.take_along_axis(huge((2**50, 2**12)), np.zeros((1, 2**13), np.int64), axis=1),
        r"the result of take_along_axis " + elements((2**50, 2**13)) + LIMIT + "; take fewer indices",
    ),
    # NumPy: MemoryError or ValueError joining three views of 2**61 elements
    "concat of huge tensors": (
        lambda: layout.concat([huge(), huge(), huge()]),
        r"the result of concat " + elements((3 * 2**61,)) + LIMIT + "; join fewer or smaller tensors",
    ),
    "stack of huge tensors": (
        lambda: layout.stack([huge(), huge(), huge()]),
        r"the result of stack " + elements((3, 2**61)) + LIMIT + "; join fewer or smaller tensors",
    ),
    "repeat of a huge tensor": (
        lambda: layout.repeat(huge(), 3),
        r"repeat\(qt, 3, axis=None\) " + elements((3 * 2**61,)) + LIMIT,
    ),
}


@pytest.mark.parametrize("case", list(GROWING))
def test_results_past_the_element_limit_are_refused(case: str) -> None:
    call, message = GROWING[case]
    with pytest.raises(ShapeError, match=message):
        call()


def test_repeat_of_the_flattened_tensor_past_the_limit_is_refused() -> None:
    """``np.repeat`` of a flattened tensor with 2**62 repeats overflowed int64 and crashed the process."""
    with pytest.raises(ShapeError, match=r"repeat\(qt, 4611686018427387904, axis=None\) " + elements((2**70,))):
        layout.repeat(small(), 2**62)


def test_is_exact_refuses_what_the_operation_refuses() -> None:
    with pytest.raises(ShapeError, match=r"the result of repeat_dim\(qt, 1, 4611686018427387904\) \["):
        layout.is_exact("repeat_dim", small(), 1, 2**62)
    with pytest.raises(ShapeError, match=r"the result of broadcast_to \[4611686018427387904, 4, 64\]"):
        layout.is_exact("broadcast_to", small(), (2**62, 4, 64))


# within the element limit but beyond any memory (each 2**47 bytes or more: past the address space)
UNALLOCATABLE: dict[str, tuple[Callable[[], Any], str]] = {
    "repeat": (lambda: layout.repeat(small(), 2**40, axis=0), r"the result of repeat\(qt, 1099511627776, axis=0\)"),
    "repeat_dim": (lambda: layout.repeat_dim(small(), 0, 2**40), r"the result of repeat_dim\(qt, 0, 1099511627776\)"),
    "broadcast_to": (
        lambda: layout.broadcast_to(small(), (2**40, 4, 64)),
        r"the result of broadcast_to\(qt, \(1099511627776, 4, 64\)\)",
    ),
    "repeat, requantized": (
        lambda: layout.repeat(blocked(), 2**40, axis=1),  # a blocked axis: through the floats
        r"the result of repeat\(qt, 1099511627776, axis=1\)",
    ),
    "concat": (lambda: layout.concat([huge((2**46,))] * 2), r"the result of concat"),
    "stack": (lambda: layout.stack([huge((2**46,))] * 2), r"the result of stack"),
}


@pytest.mark.parametrize("case", list(UNALLOCATABLE))
def test_results_beyond_memory_are_typed(case: str) -> None:
    """The audit's ``repeat(qt, 2**40, axis=0)`` of a (4, 64) tensor: 2**48 elements, under the element limit."""
    call, message = UNALLOCATABLE[case]
    with pytest.raises(ShapeError, match=message + r" could not be allocated \(.+\); ask for a smaller result"):
        call()


def test_is_exact_allocates_nothing() -> None:
    assert layout.is_exact("repeat", small(), 2**40, 0) is True
    assert layout.is_exact("broadcast_to", blocked(), (2**40, 4, 64)) is True


RANKS: dict[str, tuple[Callable[[], Any], str]] = {
    "broadcast_to": (
        lambda: layout.broadcast_to(small(), (1,) * 38 + (4, 64)),
        rf"the result of broadcast_to has 40 axes; quantized tensors have at most {MAX_RANK}",
    ),
    "expand_dims": (
        lambda: layout.expand_dims(aq.quantize(np.ones((1,) * MAX_RANK, np.float32), "q8s"), 0),
        rf"the result of expand_dims has 33 axes; quantized tensors have at most {MAX_RANK}",
    ),
    "stack": (
        lambda: layout.stack([aq.quantize(np.ones((1,) * MAX_RANK, np.float32), "q8s")] * 2),
        r"the result of stack has 33 axes",
    ),
    "getitem": (
        lambda: layout.getitem(aq.quantize(np.ones((1,) * MAX_RANK, np.float32), "q8s"), None),
        r"qt\[None\] has 33 axes",
    ),
    # NumPy: "maximum supported dimension for an ndarray is currently 64, found 70"
    "reshape": (
        lambda: layout.reshape(small(), (1,) * 69 + (256,)),
        r"the result of reshape has 70 axes; .*; reshape to fewer axes",
    ),
}


@pytest.mark.parametrize("case", list(RANKS))
def test_results_past_the_rank_limit_are_refused(case: str) -> None:
    """Such a tensor could not be dequantized (``dequantize`` checks the same limit): refuse it when made."""
    call, message = RANKS[case]
    with pytest.raises(ShapeError, match=message):
        call()


COUNTS: list[tuple[Callable[[Any], Any], str]] = [
    (lambda n: layout.repeat(small(), n, axis=0), "repeats"),
    (lambda n: layout.repeat_dim(small(), 0, n), "times"),
    (lambda n: layout.broadcast_to(small(), (n, 4, 64)), "shape entry"),
    (lambda n: layout.chunk(small(), n), "chunks"),
]


@pytest.mark.parametrize("count", [1.5, 2.0, np.float64(2.0), True, "2", None, [2], np.array([2, 2])])
@pytest.mark.parametrize("op", range(len(COUNTS)))
def test_counts_that_are_not_integers_are_typed(op: int, count: Any) -> None:
    call, what = COUNTS[op]
    with pytest.raises(ShapeError, match=rf"{what} must be an integer, got "):
        call(count)


@pytest.mark.parametrize("count", [0, -1, -(2**70)])
def test_counts_below_one_are_typed(count: int) -> None:
    with pytest.raises(ShapeError, match=rf"repeats must be >= 1, got {count}"):
        layout.repeat(small(), count, axis=0)
    with pytest.raises(ShapeError, match=rf"times must be >= 1, got {count}"):
        layout.repeat_dim(small(), 0, count)
    with pytest.raises(ShapeError, match=r"new axis 0 needs an extent >= 1"):
        layout.broadcast_to(small(), (count, 4, 64))


def test_numpy_integer_counts_still_work() -> None:
    qt = small()
    assert layout.repeat(qt, np.int64(2), axis=0).shape == (8, 64)
    assert layout.repeat_dim(qt, 1, np.uint8(3)).shape == (4, 192)
    assert layout.broadcast_to(qt, (np.int32(2), 4, 64)).shape == (2, 4, 64)


def test_repeat_dim_builds_no_list_of_copies() -> None:
    """``repeat_dim`` tiles in one call: it used to build a list of ``times`` references (8 bytes each)."""
    qt = aq.quantize(np.array([1.0], np.float32), "q8s:native")
    times = 2**21
    layout.repeat_dim(qt, 0, 2)  # imports and caches
    tracemalloc.start()
    try:
        out = layout.repeat_dim(qt, 0, times)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.shape == (times,)
    np.testing.assert_array_equal(np.asarray(out.codes()), np.full(times, 127, np.int8))
    assert peak < 6 * times, peak  # a few int8 copies of the result; the list alone took 8 bytes a time
