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
from arrayquant import ops
from arrayquant.errors import ShapeError
from arrayquant.invariants.data import MAX_ELEMENTS, MAX_RANK

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
        lambda: ops.repeat(aq.quantize(np.ones(2**23, np.float32), "q8s:native"), 2**40, axis=0),
        r"the result of repeat\(qt, 1099511627776, axis=0\) " + elements((2**63,)) + LIMIT + "; use fewer repeats",
    ),
    # NumPy: OverflowError (a count beyond int64)
    "repeat 2**64": (
        lambda: ops.repeat(small(), 2**64, axis=1),
        r"repeat\(qt, 18446744073709551616, axis=1\) " + elements((4, 64 * 2**64)) + LIMIT,
    ),
    # NumPy: MemoryError for the list of 2**62 references
    "repeat_dim 2**62": (
        lambda: ops.repeat_dim(small(), 0, 2**62),
        r"the result of repeat_dim\(qt, 0, 4611686018427387904\) "
        + elements((2**64, 64))
        + LIMIT
        + "; use fewer times",
    ),
    # NumPy: "iterator is too large"
    "broadcast_to 2**62": (
        lambda: ops.broadcast_to(small(), (2**62, 4, 64)),
        r"the result of broadcast_to " + elements((2**62, 4, 64)) + LIMIT + "; broadcast to a smaller shape",
    ),
    "broadcast_to 2**62 blocked": (
        lambda: ops.broadcast_to(blocked(), (2**62, 4, 64)),
        r"the result of broadcast_to " + elements((2**62, 4, 64)) + LIMIT,
    ),
    # NumPy: "Maximum allowed dimension exceeded"
    "broadcast_to 2**64": (
        lambda: ops.broadcast_to(small(), (2**64, 4, 64)),
        elements((2**64, 4, 64)) + LIMIT,
    ),
    # NumPy: MemoryError, 8 EiB
    "take": (
        lambda: ops.take(huge((2**50, 2**12)), np.zeros(2**13, np.int64), axis=1),
        r"the result of take " + elements((2**50, 2**13)) + LIMIT + "; take fewer indices",
    ),
    # the indices broadcast against the tensor off the axis (NumPy: MemoryError)
    "take_along_axis": (
        lambda: ops.take_along_axis(huge((2**50, 2**12)), np.zeros((1, 2**13), np.int64), axis=1),
        r"the result of take_along_axis " + elements((2**50, 2**13)) + LIMIT + "; take fewer indices",
    ),
    # NumPy: MemoryError or ValueError joining three views of 2**61 elements
    "concat of huge tensors": (
        lambda: ops.concat([huge(), huge(), huge()]),
        r"the result of concat " + elements((3 * 2**61,)) + LIMIT + "; join fewer or smaller tensors",
    ),
    "stack of huge tensors": (
        lambda: ops.stack([huge(), huge(), huge()]),
        r"the result of stack " + elements((3, 2**61)) + LIMIT + "; join fewer or smaller tensors",
    ),
    "repeat of a huge tensor": (
        lambda: ops.repeat(huge(), 3),
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
        ops.repeat(small(), 2**62)


def test_is_exact_refuses_what_the_operation_refuses() -> None:
    with pytest.raises(ShapeError, match=r"the result of repeat_dim\(qt, 1, 4611686018427387904\) \["):
        ops.is_exact("repeat_dim", small(), 1, 2**62)
    with pytest.raises(ShapeError, match=r"the result of broadcast_to \[4611686018427387904, 4, 64\]"):
        ops.is_exact("broadcast_to", small(), (2**62, 4, 64))


# within the element limit but beyond any memory (each 2**47 bytes or more: past the address space)
UNALLOCATABLE: dict[str, tuple[Callable[[], Any], str]] = {
    "repeat": (lambda: ops.repeat(small(), 2**40, axis=0), r"the result of repeat\(qt, 1099511627776, axis=0\)"),
    "repeat_dim": (lambda: ops.repeat_dim(small(), 0, 2**40), r"the result of repeat_dim\(qt, 0, 1099511627776\)"),
    "broadcast_to": (
        lambda: ops.broadcast_to(small(), (2**40, 4, 64)),
        r"the result of broadcast_to\(qt, \(1099511627776, 4, 64\)\)",
    ),
    "repeat, requantized": (
        lambda: ops.repeat(blocked(), 2**40, axis=1),  # a blocked axis: through the floats
        r"the result of repeat\(qt, 1099511627776, axis=1\)",
    ),
    "concat": (lambda: ops.concat([huge((2**46,))] * 2), r"the result of concat"),
    "stack": (lambda: ops.stack([huge((2**46,))] * 2), r"the result of stack"),
}


@pytest.mark.parametrize("case", list(UNALLOCATABLE))
def test_results_beyond_memory_are_typed(case: str) -> None:
    """The audit's ``repeat(qt, 2**40, axis=0)`` of a (4, 64) tensor: 2**48 elements, under the element limit."""
    call, message = UNALLOCATABLE[case]
    with pytest.raises(ShapeError, match=message + r" could not be allocated \(.+\); ask for a smaller result"):
        call()


def test_is_exact_allocates_nothing() -> None:
    assert ops.is_exact("repeat", small(), 2**40, 0) is True
    assert ops.is_exact("broadcast_to", blocked(), (2**40, 4, 64)) is True


RANKS: dict[str, tuple[Callable[[], Any], str]] = {
    "broadcast_to": (
        lambda: ops.broadcast_to(small(), (1,) * 38 + (4, 64)),
        rf"the result of broadcast_to has 40 axes; quantized tensors have at most {MAX_RANK}",
    ),
    "expand_dims": (
        lambda: ops.expand_dims(aq.quantize(np.ones((1,) * MAX_RANK, np.float32), "q8s"), 0),
        rf"the result of expand_dims has 33 axes; quantized tensors have at most {MAX_RANK}",
    ),
    "stack": (
        lambda: ops.stack([aq.quantize(np.ones((1,) * MAX_RANK, np.float32), "q8s")] * 2),
        r"the result of stack has 33 axes",
    ),
    "getitem": (
        lambda: ops.getitem(aq.quantize(np.ones((1,) * MAX_RANK, np.float32), "q8s"), None),
        r"qt\[None\] has 33 axes",
    ),
    # NumPy: "maximum supported dimension for an ndarray is currently 64, found 70"
    "reshape": (
        lambda: ops.reshape(small(), (1,) * 69 + (256,)),
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
    (lambda n: ops.repeat(small(), n, axis=0), "repeats"),
    (lambda n: ops.repeat_dim(small(), 0, n), "times"),
    (lambda n: ops.broadcast_to(small(), (n, 4, 64)), "shape entry"),
    (lambda n: ops.chunk(small(), n), "chunks"),
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
        ops.repeat(small(), count, axis=0)
    with pytest.raises(ShapeError, match=rf"times must be >= 1, got {count}"):
        ops.repeat_dim(small(), 0, count)
    with pytest.raises(ShapeError, match=r"new axis 0 needs an extent >= 1"):
        ops.broadcast_to(small(), (count, 4, 64))


def test_numpy_integer_counts_still_work() -> None:
    qt = small()
    assert ops.repeat(qt, np.int64(2), axis=0).shape == (8, 64)
    assert ops.repeat_dim(qt, 1, np.uint8(3)).shape == (4, 192)
    assert ops.broadcast_to(qt, (np.int32(2), 4, 64)).shape == (2, 4, 64)


def test_repeat_dim_builds_no_list_of_copies() -> None:
    """``repeat_dim`` tiles in one call: it used to build a list of ``times`` references (8 bytes each)."""
    qt = aq.quantize(np.array([1.0], np.float32), "q8s:native")
    times = 2**21
    ops.repeat_dim(qt, 0, 2)  # imports and caches
    tracemalloc.start()
    try:
        out = ops.repeat_dim(qt, 0, times)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.shape == (times,)
    np.testing.assert_array_equal(np.asarray(out.codes()), np.full(times, 127, np.int8))
    assert peak < 6 * times, peak  # a few int8 copies of the result; the list alone took 8 bytes a time


# -- arithmetic, reductions, indexed updates and matmul with hostile arguments ------------------
# A fuzz run over ``arrayquant.ops`` found these answered with raw exceptions, NumPy warnings or a
# silently different result; each case names what it raised before. Accepted variants are checked
# against NumPy on the dequantized values.
from arrayquant.errors import DTypeError, ParamsError  # noqa: E402
from arrayquant.ops import _common  # noqa: E402

HOSTILE_SCHEMES = ["q8s:block32:f32:native", "nvfp4", "mxfp8", "q4f", "q8s:native"]


def fuzzed(scheme: str = "q8s:block32:f32:native") -> aq.QuantizedTensor:
    return aq.quantize(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), scheme)


def floats_of(qt: aq.QuantizedTensor) -> np.ndarray:
    return np.asarray(aq.dequantize(qt))


KEEPDIMS_OPS = ["sum", "mean", "prod", "max", "min", "any", "all", "argmax", "argmin"]


# before: TypeError ('str' object cannot be interpreted as an integer) in _reduce / _extreme / any / all,
# ValueError (truth value of an array) in _extreme / argmax; "yes", None, 2.5 and 1 were taken by
# truthiness in argmax and argmin (and 1 everywhere), a keepdims the caller never asked for
@pytest.mark.parametrize("keepdims", ["yes", None, 2.5, 1, [True], np.array([True, False])])
@pytest.mark.parametrize("op", KEEPDIMS_OPS)
def test_reductions_refuse_keepdims_that_is_not_a_bool(op: str, keepdims: Any) -> None:
    with pytest.raises(ParamsError, match=rf"keepdims must be True or False, got {re.escape(repr(keepdims))}"):
        getattr(ops, op)(fuzzed(), axis=1, keepdims=keepdims)


FLAGS: list[tuple[Callable[[aq.QuantizedTensor, Any], Any], str]] = [
    (lambda qt, v: ops.sort(qt, descending=v), "descending"),
    (lambda qt, v: ops.sort(qt, stable=v), "stable"),
    (lambda qt, v: ops.argsort(qt, descending=v), "descending"),
    (lambda qt, v: ops.argsort(qt, stable=v), "stable"),
    (lambda qt, v: ops.topk(qt, 2, largest=v), "largest"),
    (lambda qt, v: ops.cumulative_sum(qt, axis=1, include_initial=v), "include_initial"),
    (lambda qt, v: ops.cumulative_prod(qt, axis=1, include_initial=v), "include_initial"),
]


# before: "no" sorted descending and kept the initial zero (truthiness), np.array([1, 2]) raised
# NumPy's ValueError (truth value of an array is ambiguous)
@pytest.mark.parametrize("value", ["no", np.array([1, 2]), 0.5])
@pytest.mark.parametrize("case", range(len(FLAGS)))
def test_flags_that_are_not_bools_are_refused(case: int, value: Any) -> None:
    call, name = FLAGS[case]
    with pytest.raises(ParamsError, match=rf"{name} must be True or False, got "):
        call(fuzzed(), value)


def test_numpy_bools_still_count_as_flags() -> None:
    qt = fuzzed()
    f = floats_of(qt)
    np.testing.assert_array_equal(ops.sum(qt, axis=1, keepdims=np.True_), np.sum(f, axis=1, keepdims=True))
    np.testing.assert_array_equal(ops.argsort(qt, descending=np.False_), np.argsort(f, axis=-1, kind="stable"))
    with pytest.raises(ParamsError, match="keepdims must be True or False"):
        ops.sum(qt, axis=1, keepdims=1)


ONE_AXIS: dict[str, Callable[[aq.QuantizedTensor, Any], Any]] = {
    "sort": lambda qt, a: ops.sort(qt, axis=a),
    "argsort": lambda qt, a: ops.argsort(qt, axis=a),
    "topk": lambda qt, a: ops.topk(qt, 2, axis=a),
    "scatter_add": lambda qt, a: ops.scatter_add(qt, np.zeros((4, 64), np.int64), np.ones((4, 64), np.float32), axis=a),
    "index_add": lambda qt, a: ops.index_add(qt, np.zeros(4, np.int64), np.ones((4, 64), np.float32), axis=a),
}


# before: AssertionError in _one_axis (and a TypeError under python -O)
@pytest.mark.parametrize("op", list(ONE_AXIS))
def test_one_axis_operations_refuse_axis_none(op: str) -> None:
    with pytest.raises(ShapeError, match=r"axis must be an int, got None"):
        ONE_AXIS[op](fuzzed(), None)


AXIS_REDUCTIONS = ["sum", "mean", "prod", "max", "min", "any", "all"]


def reference(op: str, f: np.ndarray, axis: Any) -> np.ndarray:
    return {"max": np.max, "min": np.min}.get(op, getattr(np, op))(f, axis=axis)


# before: ShapeError "axis must be an int or a tuple of ints, got np.int64(1)", though layout's
# operations and NumPy take NumPy ints as axes
@pytest.mark.parametrize("scheme", HOSTILE_SCHEMES)
@pytest.mark.parametrize("op", AXIS_REDUCTIONS)
def test_reductions_take_numpy_integer_axes_as_numpy_does(op: str, scheme: str) -> None:
    qt = fuzzed(scheme)
    f = floats_of(qt)
    for axis, same in [(np.int64(1), 1), (np.array(-1), -1), ((np.int32(0), 1), (0, 1)), ((np.uint8(1),), (1,))]:
        got = getattr(ops, op)(qt, axis=axis)
        want = getattr(ops, op)(qt, axis=same)
        if isinstance(got, aq.QuantizedTensor):  # max/min: the selected codes, requantized for blocks
            assert got.shape == want.shape
            np.testing.assert_array_equal(floats_of(got), floats_of(want))
            if scheme == "q8s:native":  # one scale per tensor: the very values NumPy selects
                np.testing.assert_array_equal(floats_of(got), np.reshape(reference(op, f, same), got.shape))
        else:
            np.testing.assert_array_equal(got, want)
            np.testing.assert_allclose(got, reference(op, f, same), rtol=1e-5, atol=1e-5)


def test_scans_sorts_and_arg_reductions_take_numpy_integer_axes() -> None:
    qt = fuzzed("q8s:native")
    f = floats_of(qt)
    np.testing.assert_array_equal(ops.argmax(qt, axis=np.int64(1)), np.argmax(f, axis=1))
    np.testing.assert_array_equal(ops.argmin(qt, axis=np.int32(-2)), np.argmin(f, axis=0))
    np.testing.assert_array_equal(ops.argsort(qt, axis=np.int64(0)), np.argsort(f, axis=0, kind="stable"))
    np.testing.assert_array_equal(floats_of(ops.sort(qt, axis=np.int64(0))), np.sort(f, axis=0))
    np.testing.assert_allclose(ops.cumulative_sum(qt, axis=np.intp(1)), np.cumsum(f, axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ops.cumulative_max(qt, axis=np.int64(1)), np.maximum.accumulate(f, axis=1))
    top = ops.topk(qt, np.int64(3), axis=np.int64(1))  # before: ShapeError "k must be an int ... got np.int64(3)"
    np.testing.assert_array_equal(floats_of(top), -np.sort(-f, axis=1)[:, :3])
    idx, v = np.array([1, 1, 0]), np.ones((3, 64), np.float32)
    want = f.copy()
    np.add.at(want, idx, v)
    np.testing.assert_allclose(ops.index_add(qt, idx, v, axis=np.int64(0)), want, rtol=1e-6)  # values summed first
    # bools are no axes, NumPy's or Python's (True would silently be axis 1)
    for axis in (True, np.True_, (0, np.False_)):
        with pytest.raises(ShapeError, match="axis must be an int or a tuple of ints"):
            ops.sum(qt, axis=axis)


def test_axis_messages_name_the_entry_and_the_fix() -> None:
    qt = fuzzed()
    with pytest.raises(ShapeError, match=r"got \(0, None\) \(entry None is not an integer\)"):
        ops.max(qt, axis=(0, None))
    with pytest.raises(ShapeError, match=r"got \[0, None\]; pass a tuple such as \(0, 1\)"):
        ops.sum(qt, axis=[0, None])
    with pytest.raises(ShapeError, match=r"axis 1180591620717411303424 is out of range for a 2-d tensor; use an axis"):
        ops.mean(qt, axis=(0, 2**70))


ODD_OPERANDS: dict[str, Any] = {
    "strings": np.array(["a"] * 64),  # before: UFuncTypeError
    "datetimes": np.array(["2020-01-01"] * 64, "datetime64[D]"),  # before: UFuncTypeError
    "complex": np.ones(64, np.complex64),  # before: a complex "float" result (add) or TypeError (less)
    "objects": np.array([1.0] * 64, dtype=object),  # before: an object array result, ZeroDivisionError
}
ODD_CALLS: dict[str, Callable[[aq.QuantizedTensor, Any], Any]] = {
    "add": lambda qt, v: ops.add(qt, v),
    "divide": lambda qt, v: ops.divide(v, qt),
    "less": lambda qt, v: ops.less(qt, v),
    "maximum": lambda qt, v: ops.maximum(qt, v),
    "clip": lambda qt, v: ops.clip(qt, min=v),
    "where": lambda qt, v: ops.where(np.ones((4, 64), bool), qt, v),  # before: strings came back as '<U32'
}


@pytest.mark.parametrize("call", list(ODD_CALLS))
@pytest.mark.parametrize("kind", list(ODD_OPERANDS))
def test_operands_of_no_real_dtype_are_typed(kind: str, call: str) -> None:
    operand = ODD_OPERANDS[kind]
    with pytest.raises(
        DTypeError, match=rf"has dtype {re.escape(str(operand.dtype))}; operands must hold real numbers"
    ):
        ODD_CALLS[call](fuzzed(), operand)


def test_scalars_past_the_float_range() -> None:
    qt = fuzzed()
    f = floats_of(qt)
    # before: NumPy's "overflow encountered in cast" RuntimeWarning; the value is +inf, as in NumPy
    np.testing.assert_array_equal(ops.add(qt, 1e300), f + np.float32(np.inf))
    np.testing.assert_array_equal(ops.mask_fill(qt, f > 0, -1e300), np.where(f > 0, -np.inf, f).astype(np.float32))
    np.testing.assert_array_equal(ops.clip(qt, max=1e300), f)
    # before: OverflowError (int too large to convert to float)
    for call in (
        lambda: ops.add(qt, 2**1100),
        lambda: ops.clip(qt, max=-(2**1100)),
        lambda: ops.mask_fill(qt, f > 0, 2**1100),
    ):
        with pytest.raises(DTypeError, match=r"a scalar int of 1101 bits is beyond the range of every float dtype"):
            call()


# the operand is a zero-stride view: the tests allocate almost nothing
BROADCASTS: dict[str, tuple[Callable[[], Any], str]] = {
    # before: ValueError "iterator is too large"
    "add past the limit": (
        lambda: ops.add(fuzzed(), np.broadcast_to(np.float32(1), (2**60, 1, 1))),
        r"the broadcast result " + elements((2**60, 4, 64)) + LIMIT + "; broadcast against a smaller operand",
    ),
    "where past the limit": (
        lambda: ops.where(
            np.broadcast_to(np.True_, (2**31, 1, 1, 1)), fuzzed(), np.broadcast_to(np.float32(0), (1, 2**31, 1, 1))
        ),
        r"the broadcast result " + elements((2**31, 2**31, 4, 64)) + LIMIT,
    ),
    # before: MemoryError (1 PiB), each 2**47 bytes or more: past the address space
    "multiply beyond memory": (
        lambda: ops.multiply(np.broadcast_to(np.float32(1), (2**40, 4, 64)), fuzzed()),
        r"the broadcast result could not be allocated \(.+\); ask for a smaller result",
    ),
    "greater beyond memory": (
        lambda: ops.greater(fuzzed(), np.broadcast_to(np.float32(1), (2**45, 1, 64))),
        r"the broadcast result could not be allocated",
    ),
    "clip beyond memory": (
        lambda: ops.clip(fuzzed(), min=np.broadcast_to(np.float32(0), (2**40, 4, 64))),
        r"the broadcast result could not be allocated",
    ),
    "where beyond memory": (
        lambda: ops.where(np.ones((4, 64), bool), fuzzed(), np.broadcast_to(np.float32(0), (2**40, 4, 64))),
        r"the broadcast result could not be allocated",
    ),
    "floats of a huge tensor": (
        lambda: ops.exp(huge((2**46,))),
        re.escape(f"the float values of a tensor of shape {[2**46]} could not be allocated"),
    ),
    "sum of a huge tensor": (lambda: ops.sum(huge((2**46,))), r"the float values of a tensor of shape"),
    "max of a huge tensor": (lambda: ops.max(huge((2**46,))), r"the float values of a tensor of shape"),
}


@pytest.mark.parametrize("case", list(BROADCASTS))
def test_results_sized_by_an_operand_are_refused_typed(case: str) -> None:
    call, message = BROADCASTS[case]
    with pytest.raises(ShapeError, match=message):
        call()


def huge_indices(shape: tuple[int, ...], dtype: Any = np.int64) -> np.ndarray:
    return np.broadcast_to(dtype(0), shape)


# before: MemoryError from the range check's mask over all the indices (2**44 bools); now the
# converted copy (2**47 bytes, past the address space) is refused before anything reads them
INDEXED: dict[str, tuple[Callable[[], Any], str]] = {
    "take": (
        lambda: ops.take(fuzzed(), huge_indices((2**44,)), axis=1),
        re.escape(f"take with indices of shape {[2**44]} could not be allocated ("),
    ),
    "take_along_axis": (
        lambda: ops.take_along_axis(fuzzed("q8s:native"), huge_indices((4, 2**44)), axis=1),
        re.escape(f"take_along_axis with indices of shape {[4, 2**44]} could not be allocated ("),
    ),
    "scatter_add": (
        lambda: ops.scatter_add(fuzzed(), huge_indices((4, 2**44)), np.broadcast_to(np.float32(1), (4, 2**44)), axis=1),
        r"scatter_add with indices of shape \[4, 17592186044416\] could not be allocated",
    ),
    "index_add": (
        lambda: ops.index_add(fuzzed(), huge_indices((2**44,)), np.broadcast_to(np.float32(1), (4, 2**44)), axis=1),
        r"index_add with indices of shape \[17592186044416\] could not be allocated",
    ),
    # more indices than any array can hold (int8, so the view itself exists): refused unread
    "take past the limit": (
        lambda: ops.take(fuzzed(), huge_indices((2**62 + 1,), np.int8), axis=1),
        r"take indices " + elements((2**62 + 1,)) + LIMIT + "; pass fewer indices",
    ),
}


@pytest.mark.parametrize("case", list(INDEXED))
def test_huge_index_arrays_are_refused_before_they_are_read(case: str) -> None:
    call, message = INDEXED[case]
    with pytest.raises(ShapeError, match=message):
        call()


def test_positions_builds_no_mask_over_the_indices() -> None:
    """The range check reads the indices with two reductions; the old mask took three index-sized arrays."""
    qt = fuzzed()
    n = 2**20
    idx = np.arange(n, dtype=np.int64) % 64
    ops.take(qt, idx[:8], axis=1)  # imports and caches
    tracemalloc.start()
    try:
        out = _common.positions(qt, idx, 64, "take")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, idx)
    assert peak < 10 * n, peak  # the one int64 copy (8 bytes an index); the masks added 3 bytes and more
    negative = idx - 64
    tracemalloc.start()
    try:
        out = _common.positions(qt, negative, 64, "take")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, idx)
    assert peak < 18 * n, peak  # the copy and its remainder; the old where added a mask and a sum
    np.testing.assert_array_equal(_common.positions(qt, np.array([-1, 0, -64]), 64, "take"), [63, 0, 0])
    with pytest.raises(ShapeError, match=r"take indices must lie in \[-64, 64\) for an axis of length 64"):
        _common.positions(qt, np.array([0, 64]), 64, "take")


def test_one_hot_sums_beyond_memory_are_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``scatter_add``/``index_add`` compare every value with every position; that mask's refusal is typed."""
    from arrayquant.ops import updates

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("Unable to allocate 1.00 PiB")

    monkeypatch.setattr(updates, "_one_hot_sum", refuse)
    qt = fuzzed()
    with pytest.raises(
        ShapeError, match=r"index_add's one-hot comparison \[4, 2, 64\] could not be allocated \(Unable"
    ):
        ops.index_add(qt, np.array([0, 1]), np.ones((4, 2), np.float32), axis=1)
    with pytest.raises(ShapeError, match=r"scatter_add's one-hot comparison \[4, 64, 4\] could not be allocated"):
        ops.scatter_add(qt, np.zeros((4, 64), np.int64), np.ones((4, 64), np.float32), axis=0)


# before: TypeError "slice indices must be integers or None or have an __index__ method"; NumPy
# ints were refused although layout's getitem takes them
def test_slice_assign_keys() -> None:
    qt = fuzzed()
    f = floats_of(qt)
    for key in [(slice(0, 1.5),), (slice("a", None),), (slice(None, None, 0.5),), (slice(True, None),)]:
        with pytest.raises(ShapeError, match=r"slice_assign slice .+ needs integer \(or None\) start, stop and step"):
            ops.slice_assign(qt, key, np.ones((1, 64), np.float32))
    for key in [(np.int64(1),), (np.int64(2), slice(np.int32(0), np.int64(4))), (slice(-(2**70), 2**70, np.int8(2)),)]:
        region = f[key]
        values = np.full(region.shape, 7.0, np.float32)
        want = f.copy()
        want[key] = values
        np.testing.assert_array_equal(ops.slice_assign(qt, key, values), want)


MATMUL_HUGE: dict[str, tuple[Callable[[], Any], str]] = {
    # before: MemoryError (128 TiB) in the reference path
    "reference": (
        lambda: ops.matmul(np.broadcast_to(np.float32(1), (2**40, 4, 64)), W()),
        re.escape(f"the result of matmul {[2**40, 4, 8]} could not be allocated ("),
    ),
    # before: MemoryError (1 PiB) in the fused ternary kernel
    "ternary": (
        lambda: ops.matmul(np.broadcast_to(np.float32(1), (2**40, 4, 64)), TERNARY(), path="ternary"),
        re.escape(f"the result of matmul {[2**40, 4, 8]} could not be allocated ("),
    ),
    # before: MemoryError (1 PiB) in the integer path's code matmul
    "int8": (
        lambda: ops.matmul(huge((2**40, 4, 64)), W(), path="int8"),
        re.escape(f"the result of matmul {[2**40, 4, 8]} could not be allocated ("),
    ),
    "float batch": (
        lambda: ops.matmul(fuzzed("q8s:native"), np.broadcast_to(np.float32(1), (2**40, 64, 8))),
        r"the result of matmul \[1099511627776, 4, 8\] could not be allocated",
    ),
    # before: MemoryError dequantizing b; the product would have 2**68 elements
    "past the limit": (
        lambda: ops.matmul(np.broadcast_to(np.float32(1), (2**31, 1, 4, 64)), huge((1, 2**32, 64, 8))),
        r"the result of matmul " + elements((2**31, 2**32, 4, 8)) + LIMIT + "; multiply fewer or smaller batches",
    ),
}


def W() -> aq.QuantizedTensor:
    return aq.quantize(np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32), "q8s:native")


def TERNARY() -> aq.QuantizedTensor:
    codes = np.random.default_rng(2).choice([-1.0, 0.0, 1.0], (64, 8)).astype(np.float32)
    return aq.quantize(codes, "q2s:native")


@pytest.mark.parametrize("case", list(MATMUL_HUGE))
def test_matmul_results_past_memory_or_the_limit_are_typed(case: str) -> None:
    call, message = MATMUL_HUGE[case]
    with pytest.raises(ShapeError, match=message):
        call()
    assert aq.ops.matmul_path(np.broadcast_to(np.float32(1), (2**40, 4, 64)), W()) == "reference"  # allocates nothing


def test_matmul_of_non_finite_or_huge_activations_is_quiet_and_as_numpy() -> None:
    """Before: NumPy's RuntimeWarnings (invalid value / overflow encountered in matmul) from the reference path."""
    w = W()
    for x in (np.full((4, 64), 3e38, np.float32), np.where(np.eye(4, 64) > 0, np.inf, 0).astype(np.float32)):
        with np.errstate(all="ignore"):
            want = np.matmul(x, floats_of(w))
        np.testing.assert_array_equal(ops.matmul(x, w), want)
        np.testing.assert_array_equal(ops.matmul(x, w, path="reference"), want)
