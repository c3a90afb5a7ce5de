"""Burn's quantized-operation tests, replayed on arrayquant's operations (issue 14).

Where the vectors come from
---------------------------
``tests/data/burn_qops_vectors.json`` is a reviewed transcription of every ``#[test]`` in
tracel-ai/burn @ 2c06be351006851d42fdb6df16b976f4a82d9747, folder
``crates/burn-backend-tests/tests/tensor/float/quantization/ops/``: ``matmul.rs``, ``quantize.rs``
and ``extended/*.rs`` (``abs.rs``, ``add.rs``, ``aggregation.rs``, ``all.rs``, ``any.rs``,
``arg.rs``, ``cat.rs``, ``ceil.rs``, ``chunk.rs``, ``clamp.rs``, ``cos.rs``, ``cosh.rs``, ``div.rs``,
``erf.rs``, ``exp.rs``, ``expand.rs``, ``flip.rs``, ``floor.rs``, ``gather_scatter.rs``, ``log.rs``,
``log1p.rs``, ``map_comparison.rs``, ``mask.rs``, ``maxmin.rs``, ``mul.rs``, ``narrow.rs``,
``neg.rs``, ``permute.rs``, ``powf.rs``, ``powf_scalar.rs``, ``recip.rs``, ``remainder.rs``,
``repeat_dim.rs``, ``reshape.rs``, ``round.rs``, ``select.rs``, ``sin.rs``, ``sinh.rs``,
``slice.rs``, ``sort_argsort.rs``, ``split.rs``, ``sqrt.rs``, ``stack.rs``, ``sub.rs``, ``tan.rs``,
``tanh.rs``, ``ternary_matmul.rs``, ``topk.rs``, ``transpose.rs``). Each vector keeps its Burn file
and test name (the test id is ``<file stem>::<test name>``), its inputs, and a ``program``: the
test's statements in order, each Burn call kept verbatim (``burn``) next to its Python spelling
(``py``: the same method chain, ranges ``a..b`` written ``R(a, b)``), and every assertion.

How inputs are built
--------------------
Burn's ``QTensor::<D>::int8(x)`` is ``quantize_dynamic`` with the device's default scheme set to
``Q8S``: symmetric, per tensor, f32 scale, native i8 store, MinMax calibration, which is
arrayquant's ``"q8s:native"`` (``QuantScheme().with_value("q8s").with_store("native")``).
``int8_block`` adds ``per_block([16], F32)`` (``"q8s:block16:f32:native"``). Integer and boolean
tensors are plain arrays; ``quantize.rs``'s computed inputs (``arange(a..b) / d``) are built the
same way. Every input is put on the backend under test with its ``asarray``.

How Burn's calls map to arrayquant
----------------------------------
:class:`Burn` wraps a value and turns each Burn method into an ``arrayquant.ops`` call (the table
``_QUANTIZED``), or, when no operand is quantized (a float result of an inhibited op), into the
Array API float operation Burn's float tensor would run. Burn's arguments become the Array API's:
``dim`` -> ``axis``, ranges -> slices, ``select`` -> ``take``, ``gather`` -> ``take_along_axis``,
``swap_dims`` -> ``swapaxes``, ``transpose`` -> ``matrix_transpose``, ``expand`` ->
``broadcast_to`` (``-1`` keeps the dim), ``reshape`` (``0`` keeps the dim), ``mask_where(m, v)`` ->
``where(m, v, x)``, ``cat`` -> ``concat``, ``split(size)`` -> ``split`` with the explicit sizes,
``repeat_dim`` -> ``repeat_dim`` (a tile, not the Array API's per-element ``repeat``);
Burn keeps reduced dims (``sum_dim``, ``mean_dim``, ``max_dim``,
``argmax``, ``all_dim`` ... -> ``keepdims=True``) and returns full reductions as shape ``[1]``.
A quantized result is dequantized (``aq.dequantize``) before a float comparison, as Burn's
``.dequantize()`` does (which passes a float tensor through).

Tolerance rule (burn-std ``data/compare.rs``)
---------------------------------------------
An element passes when equal, both NaN, both infinite with one sign, or
``|x - y| < max(A, R * max(|x|, |y|))``; ``tolerance`` is ``[R, A]`` (``absolute(a)`` = ``[0, a]``,
``relative(r)`` = ``[r, 0]``, ``permissive()`` = ``[0.01, 0.01]``, ``default()`` =
``[0.005, 1e-5]``). Shapes must match; integer and boolean results are compared exactly.

Backends
--------
Every vector runs on NumPy. array-api-strict, torch, JAX and Dask each run a deterministic subset
by default: the first vector of every Burn file and of every Burn operation (so each file and each
operation runs at least once on each backend); ``-m slow`` runs all the others on them too.
Dask runs only the operations with a lazy form (not the data-dependent ``mask_select``,
``sort``/``argsort``/``topk``, ``gather``).

Excluded
--------
* The 24 ``#[should_panic]`` tests have no values: the ones whose operation is in the contract are
  error-path tests below (``test_burn_should_panic``), checking arrayquant's typed error.
* ``#[ignore]``d tests, listed with Burn's reason in the JSON's ``excluded`` section: matmul's
  ``test_matmul_vectors``, ``_2d``, ``_3d``, ``_broadcast_4d``, ``_broadcast`` (ignored without a
  reason), ``topk.rs``'s ``test_topk_1d`` and ``test_topk`` (likewise), ``map_comparison.rs``'s
  ``equal_elem``, ``not_equal_elem``, ``greater_elem``, ``lower_equal_elem`` ("quantization
  equality with float element is undefined": 2 does not survive Q8S at scale 5/127) and
  ``remainder.rs``'s ``basic_scalar`` and ``scalar_op`` ("remainder with float element is
  undefined"). Ignored vectors that hold under arrayquant are run too (``burn_ignored`` in the JSON).
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from array_api_compat import array_namespace

import arrayquant as aq
from arrayquant.backends.shim import to_host
from arrayquant.errors import ShapeError
from arrayquant.tensor import QuantizedTensor

DATA = json.loads((Path(__file__).parent / "data" / "burn_qops_vectors.json").read_text())
VECTORS = DATA["tests"]


# ------------------------------------------------------------------------------------------------
# Resolving contract functions
# ------------------------------------------------------------------------------------------------

_MODULES = tuple(
    f"arrayquant.ops.{name}"
    for name in (
        "manipulation",
        "indexing",
        "exact",
        "elementwise",
        "statistical",
        "searching",
        "sorting",
        "utility",
        "updates",
        "linalg",
    )
)


def op(*names: str) -> Any:
    """The first of ``names`` that an ``arrayquant.ops`` module defines; an AssertionError if none.

    The modules are imported here, so a missing module or function fails the vector (never skips).
    """
    for name in names:
        for module in _MODULES:
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError:
                continue
            fn = getattr(mod, name, None)
            if callable(fn):
                return fn
    msg = f"no arrayquant.ops module defines {' or '.join(names)} (looked in {', '.join(_MODULES)})"
    raise AssertionError(msg)


def is_q(v: Any) -> bool:
    return isinstance(v, QuantizedTensor)


def host(v: Any) -> np.ndarray:
    """A backend array (or Python scalar) as a NumPy array."""
    if is_q(v):
        v = aq.dequantize(v)
    if hasattr(v, "compute") and not hasattr(v, "__array_namespace_info__"):
        v = v.compute()
    if hasattr(v, "compute") and type(v).__module__.startswith("dask"):
        v = v.compute()
    return np.asarray(to_host(v)) if not isinstance(v, (int, float, bool)) else np.asarray(v)


class R:
    """Burn's range ``start..end`` (``..`` when both are None)."""

    def __init__(self, start: int | None, stop: int | None) -> None:
        self.slice = slice(start, stop)


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in v.shape)


def _keep(x: Any, shape: list[int]) -> tuple[int, ...]:
    """Burn's reshape: ``0`` keeps the input's dim at that position, ``-1`` is inferred."""
    src = _shape(x)
    return tuple(src[i] if n == 0 else n for i, n in enumerate(shape))


def _expand(x: Any, shape: list[int]) -> tuple[int, ...]:
    """Burn's expand: ``-1`` keeps the (right-aligned) input dim."""
    src = _shape(x)
    off = len(shape) - len(src)
    return tuple(src[i - off] if n == -1 else n for i, n in enumerate(shape))


def _split_sizes(x: Any, size: int, dim: int) -> list[int]:
    n = _shape(x)[dim]
    return [size] * (n // size) + ([n % size] if n % size else [])


def _one(v: Any) -> Any:
    """Burn returns a full reduction as a rank-1 tensor of one element."""
    if is_q(v):
        return op("reshape")(v, (1,))
    return array_namespace(v).reshape(v, (1,))


def _axes(x: Any, axes: list[int]) -> tuple[int, ...]:
    nd = len(_shape(x))
    return tuple(a % nd if a < 0 else a for a in axes)


def _first_k(idx: Any, k: int, dim: int) -> Any:
    key = tuple(slice(0, k) if i == dim else slice(None) for i in range(len(_shape(idx))))
    return idx[key]


# Burn method -> arrayquant call, for a receiver (and operands) that may be quantized.
_QUANTIZED: dict[str, Any] = {
    # arithmetic (Burn's operators and *_scalar forms)
    "add": lambda x, y: op("add")(x, y),
    "sub": lambda x, y: op("subtract")(x, y),
    "mul": lambda x, y: op("multiply")(x, y),
    "div": lambda x, y: op("divide")(x, y),
    "remainder": lambda x, y: op("remainder")(x, y),
    "remainder_scalar": lambda x, y: op("remainder")(x, y),
    "powf": lambda x, y: op("pow")(x, y),
    "powf_scalar": lambda x, y: op("pow")(x, y),
    "mul_scalar": lambda x, y: op("multiply")(x, y),
    "div_scalar": lambda x, y: op("divide")(x, y),
    # unary math
    "abs": lambda x: op("abs")(x),
    "neg": lambda x: op("negative")(x),
    "recip": lambda x: op("reciprocal")(x),
    "exp": lambda x: op("exp")(x),
    "log": lambda x: op("log")(x),
    "log1p": lambda x: op("log1p")(x),
    "sqrt": lambda x: op("sqrt")(x),
    "sin": lambda x: op("sin")(x),
    "cos": lambda x: op("cos")(x),
    "tan": lambda x: op("tan")(x),
    "sinh": lambda x: op("sinh")(x),
    "cosh": lambda x: op("cosh")(x),
    "tanh": lambda x: op("tanh")(x),
    "erf": lambda x: op("erf")(x),
    "round": lambda x: op("round")(x),
    "floor": lambda x: op("floor")(x),
    "ceil": lambda x: op("ceil")(x),
    "clamp": lambda x, lo, hi: op("clip")(x, lo, hi),
    "clamp_min": lambda x, lo: op("clip")(x, min=lo),
    "clamp_max": lambda x, hi: op("clip")(x, max=hi),
    # reductions: Burn keeps reduced dims, and full reductions have shape [1]
    "sum": lambda x: _one(op("sum")(x)),
    "mean": lambda x: _one(op("mean")(x)),
    "prod": lambda x: _one(op("prod")(x)),
    "all": lambda x: _one(op("all")(x)),
    "any": lambda x: _one(op("any")(x)),
    "sum_dim": lambda x, d: op("sum")(x, axis=d, keepdims=True),
    "mean_dim": lambda x, d: op("mean")(x, axis=d, keepdims=True),
    "prod_dim": lambda x, d: op("prod")(x, axis=d, keepdims=True),
    "all_dim": lambda x, d: op("all")(x, axis=d, keepdims=True),
    "any_dim": lambda x, d: op("any")(x, axis=d, keepdims=True),
    "max_dim": lambda x, d: op("max")(x, axis=d, keepdims=True),
    "min_dim": lambda x, d: op("min")(x, axis=d, keepdims=True),
    "argmax": lambda x, d: op("argmax")(x, axis=d, keepdims=True),
    "argmin": lambda x, d: op("argmin")(x, axis=d, keepdims=True),
    "max_dim_with_indices": lambda x, d: (
        op("max")(x, axis=d, keepdims=True),
        op("argmax")(x, axis=d, keepdims=True),
    ),
    "min_dim_with_indices": lambda x, d: (
        op("min")(x, axis=d, keepdims=True),
        op("argmin")(x, axis=d, keepdims=True),
    ),
    "max_pair": lambda x, y: op("maximum")(x, y),
    "min_pair": lambda x, y: op("minimum")(x, y),
    "sort": lambda x, d: op("sort")(x, axis=d),
    "sort_descending": lambda x, d: op("sort")(x, axis=d, descending=True),
    "argsort": lambda x, d: op("argsort")(x, axis=d),
    "sort_with_indices": lambda x, d: (op("sort")(x, axis=d), op("argsort")(x, axis=d)),
    "sort_descending_with_indices": lambda x, d: (
        op("sort")(x, axis=d, descending=True),
        op("argsort")(x, axis=d, descending=True),
    ),
    "topk": lambda x, k, d: op("topk")(x, k, axis=d),
    "topk_with_indices": lambda x, k, d: (
        op("topk")(x, k, axis=d),
        _first_k(op("argsort")(x, axis=d, descending=True), k, d),
    ),
    # comparisons
    "equal": lambda x, y: op("equal")(x, y),
    "not_equal": lambda x, y: op("not_equal")(x, y),
    "greater": lambda x, y: op("greater")(x, y),
    "greater_equal": lambda x, y: op("greater_equal")(x, y),
    "lower": lambda x, y: op("less")(x, y),
    "lower_equal": lambda x, y: op("less_equal")(x, y),
    "equal_elem": lambda x, y: op("equal")(x, y),
    "not_equal_elem": lambda x, y: op("not_equal")(x, y),
    "greater_elem": lambda x, y: op("greater")(x, y),
    "greater_equal_elem": lambda x, y: op("greater_equal")(x, y),
    "lower_elem": lambda x, y: op("less")(x, y),
    "lower_equal_elem": lambda x, y: op("less_equal")(x, y),
    # masks and indexed updates (Burn: x.mask_where(mask, value) = where(mask, value, x))
    "mask_where": lambda x, m, v: op("where")(m, v, x),
    "mask_fill": lambda x, m, v: op("mask_fill")(x, m, v),
    "mask_select": lambda x, m: op("mask_select")(x, m),
    "scatter": lambda x, d, idx, v, how: op("scatter_add")(x, idx, v, axis=d),
    "select_assign": lambda x, d, idx, v, how: op("index_add")(x, idx, v, axis=d),
    "slice_assign": lambda x, ranges, v: op("slice_assign")(x, tuple(r.slice for r in ranges), v),
    # layout
    "reshape": lambda x, s: op("reshape")(x, _keep(x, s)),
    "transpose": lambda x: op("matrix_transpose")(x),
    "swap_dims": lambda x, a, b: op("swapaxes")(x, a, b),
    "permute": lambda x, axes: op("permute_dims")(x, _axes(x, axes)),
    "flip": lambda x, axes: op("flip")(x, axis=tuple(axes)),
    "expand": lambda x, s: op("broadcast_to")(x, _expand(x, s)),
    "slice": lambda x, ranges: op("getitem")(x, tuple(r.slice for r in ranges)),
    "select": lambda x, d, idx: op("take")(x, idx, axis=d),
    "gather": lambda x, d, idx: op("take_along_axis")(x, idx, axis=d),
    "narrow": lambda x, d, start, length: op("narrow")(x, d, start, length),
    "chunk": lambda x, n, d: op("chunk")(x, n, axis=d),
    "split": lambda x, size, d: op("split")(x, _split_sizes(x, size, d), axis=d),
    # Burn drops the empty pieces of split_with_sizes
    "split_with_sizes": lambda x, sizes, d: op("split")(x, [s for s in sizes if s], axis=d),
    # Burn's repeat_dim tiles the whole tensor (the Array API's repeat repeats each element)
    "repeat_dim": lambda x, d, n: op("repeat_dim")(x, d, n),
    "matmul": lambda x, y: op("matmul")(x, y),
}


class Burn:
    """A Burn tensor stand-in: Burn's method names on a QuantizedTensor or a backend array."""

    def __init__(self, value: Any, xp: Any) -> None:
        self.v = value
        self.xp = xp

    # Burn's bookkeeping calls are identities here (no in-place reuse in arrayquant).
    def clone(self) -> Burn:
        return self

    def into_data(self) -> Burn:
        return self

    def to_data(self) -> Burn:
        return self

    def float(self) -> Burn:
        return self

    def dequantize(self) -> Burn:
        return Burn(aq.dequantize(self.v), self.xp) if is_q(self.v) else self

    def quantize_dynamic(self, scheme: str) -> Burn:
        return Burn(aq.quantize(self.v, scheme), self.xp)

    def quantize(self, scheme: str, scales: list[float]) -> Burn:
        params = aq.QParams(self.xp.asarray(np.asarray(scales, np.float32)))
        return Burn(aq.quantize(self.v, scheme, params), self.xp)

    def reload(self) -> Burn:
        """Burn's ``from_data(q.into_data())``: through Burn's byte layout and back (on NumPy)."""
        q = self.v
        return Burn(aq.from_bytes(aq.to_bytes(q), q.scheme, q.shape), self.xp)

    def block_scales(self) -> Burn:
        return Burn(self.v.scales, self.xp)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: Any) -> Any:
            return self._call(name, *args)

        return call

    def _call(self, name: str, *args: Any) -> Any:
        args = tuple(unwrap(a) for a in args)
        quantized = is_q(self.v) or any(is_q(a) for a in args)
        if quantized or name not in _FLOAT:
            out = _QUANTIZED[name](self.v, *args)
        else:
            out = _FLOAT[name](self.xp, self.v, *args)
        return wrap(out, self.xp)

    def __add__(self, o: Any) -> Any:
        return self._call("add", o)

    def __sub__(self, o: Any) -> Any:
        return self._call("sub", o)

    def __mul__(self, o: Any) -> Any:
        return self._call("mul", o)

    def __truediv__(self, o: Any) -> Any:
        return self._call("div", o)

    def __mod__(self, o: Any) -> Any:
        return self._call("remainder", o)


# Float tensors (a float input, or the float result of an inhibited op) run Burn's float op.
_FLOAT: dict[str, Any] = {
    "add": lambda xp, x, y: x + y,
    "sub": lambda xp, x, y: x - y,
    "mul": lambda xp, x, y: x * y,
    "div": lambda xp, x, y: x / y,
    "mul_scalar": lambda xp, x, y: x * y,
    "div_scalar": lambda xp, x, y: x / y,
    "matmul": lambda xp, x, y: xp.matmul(x, y),
    "reshape": lambda xp, x, s: xp.reshape(x, _keep(x, s)),
    "permute": lambda xp, x, axes: xp.permute_dims(x, _axes(x, axes)),
    "transpose": lambda xp, x: xp.matrix_transpose(x),
}


def wrap(v: Any, xp: Any) -> Any:
    if isinstance(v, tuple):
        return tuple(wrap(e, xp) for e in v)
    if isinstance(v, list):
        return [wrap(e, xp) for e in v]
    return Burn(v, xp)


def unwrap(v: Any) -> Any:
    if isinstance(v, Burn):
        return v.v
    if isinstance(v, (list, tuple)) and any(isinstance(e, Burn) for e in v):
        return [unwrap(e) for e in v]
    return v


# ------------------------------------------------------------------------------------------------
# Building inputs, running programs, comparing
# ------------------------------------------------------------------------------------------------


def make_input(spec: dict[str, Any], xp: Any) -> Burn:
    kind, data = spec["kind"], spec["data"]
    if kind == "arange":
        host_data = (np.arange(data["start"], data["stop"], dtype=np.float32) / np.float32(data["div"])).reshape(
            data["shape"]
        )
    elif kind == "int":
        host_data = np.asarray(data, dtype=np.int64)
    elif kind == "bool":
        host_data = np.asarray(data, dtype=bool)
    else:
        host_data = np.asarray(data, dtype=np.float32)
    arr = xp.asarray(host_data)
    if "scheme" in spec:
        return Burn(aq.quantize(arr, spec["scheme"]), xp)
    return Burn(arr, xp)


def expected_array(value: Any) -> np.ndarray:
    def conv(e: Any) -> Any:
        if isinstance(e, list):
            return [conv(i) for i in e]
        if e == "NaN":
            return math.nan
        if e == "inf":
            return math.inf
        if e == "-inf":
            return -math.inf
        return e

    return np.asarray(conv(value))


def assert_approx(actual: np.ndarray, expected: np.ndarray, tol: list[float], where: str) -> None:
    """Burn's ``assert_approx_eq``: shapes equal; per element equal, both NaN, same inf, or close."""
    rel, absolute = tol
    assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != Burn's {expected.shape}"
    x = actual.astype(np.float64)
    y = expected.astype(np.float64)
    with np.errstate(invalid="ignore"):
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        bound = np.maximum(absolute, rel * np.maximum(np.abs(x), np.abs(y)))
        close = np.abs(x - y) < bound
    ok = same | (np.isfinite(x) & np.isfinite(y) & close)
    assert ok.all(), f"{where}: {actual.tolist()} vs Burn's {expected.tolist()} (tolerance R={rel}, A={absolute})"


def run_program(vector: dict[str, Any], xp: Any) -> int:
    """Run ``vector``'s program on ``xp``; the number of checks made."""
    env: dict[str, Any] = {"R": R, "abs": abs}
    ops_env: dict[str, Any] = {
        "cat": lambda ts, d: wrap(op("concat")([unwrap(t) for t in ts], axis=d), xp),
        "stack": lambda ts, d: wrap(op("stack")([unwrap(t) for t in ts], axis=d), xp),
        "rel_error": lambda t, scheme: _rel_error(unwrap(t), scheme),
    }
    n = 0
    for step in vector["program"]:
        scope = {**ops_env, **env}
        if "input" in step:
            env[step["let"]] = make_input(vector["inputs"][step["input"]], xp)
        elif "let" in step:
            value = eval(step["py"], {"__builtins__": {}}, scope)
            targets = step["let"].split(",")
            if len(targets) > 1:
                for t, v in zip(targets, value, strict=True):
                    env[t] = v
            else:
                env[step["let"]] = value
        else:
            check(step, scope, vector["id"])
            n += 1
    return n


def _rel_error(x: Any, scheme: str) -> float:
    """``sum|x - dequantize(quantize(x))| / sum|x|`` (Burn's ``error`` closure), on the host."""
    ref = host(x).astype(np.float64)
    deq = host(aq.dequantize(aq.quantize(x, scheme))).astype(np.float64)
    return float(np.abs(ref - deq).sum() / np.abs(ref).sum())


def check(step: dict[str, Any], scope: dict[str, Any], vid: str) -> None:
    kind = step["check"]
    where = f"{vid}: {step['burn'][:120]}"
    if kind == "assert":
        assert eval(step["py"], {"__builtins__": {}}, scope), where
        return
    actual = eval(step["actual"], {"__builtins__": {}}, scope)
    value = unwrap(actual)
    if kind == "float":
        if "expected_py" in step:
            expected = host(unwrap(eval(step["expected_py"], {"__builtins__": {}}, scope)))
        else:
            expected = expected_array(step["expected"])
        assert_approx(host(value), expected, step["tolerance"], where)
    elif kind == "float_list":
        pieces = list(value)
        assert len(pieces) == len(step["expected"]), f"{where}: {len(pieces)} pieces"
        for i, (piece, exp) in enumerate(zip(pieces, step["expected"], strict=True)):
            assert_approx(host(unwrap(piece)), expected_array(exp), step["tolerance"], f"{where} [{i}]")
    elif kind in ("int", "bool"):
        assert not is_q(value), f"{where}: Burn returns a plain {kind} tensor, got a QuantizedTensor"
        got = host(value)
        exp = np.asarray(step["expected"])
        assert got.shape == exp.shape, f"{where}: shape {got.shape} != Burn's {exp.shape}"
        if kind == "int":
            assert np.issubdtype(got.dtype, np.integer), f"{where}: dtype {got.dtype} is not an integer"
        else:
            assert got.dtype == np.bool_, f"{where}: dtype {got.dtype} is not bool"
        np.testing.assert_array_equal(got, exp, err_msg=where)
    elif kind == "len":
        assert len(value) == step["expected"], where
    elif kind == "shape":
        assert tuple(_shape(value)) == tuple(step["expected"]), f"{where}: shape {_shape(value)}"
    elif kind == "is_quantized":
        assert is_q(value), f"{where}: Burn keeps this result quantized (DType::QFloat)"
    elif kind == "is_float":
        assert not is_q(value), f"{where}: Burn's default (Inhibit) returns floats"
        assert np.issubdtype(host(value).dtype, np.floating), where
    elif kind == "same_quantized":
        ref = unwrap(eval(step["expected_py"], {"__builtins__": {}}, scope))
        assert is_q(value), f"{where}: expected the quantized tensor itself"
        assert value.scheme == ref.scheme, where
        assert tuple(value.shape) == tuple(ref.shape), where
        np.testing.assert_array_equal(host(value.codes()), host(ref.codes()), err_msg=where)
        np.testing.assert_array_equal(host(value.scales), host(ref.scales), err_msg=where)
    elif kind == "stored":
        assert is_q(value), where
        np.testing.assert_array_equal(host(value.codes()), np.asarray(step["expected_codes"]), err_msg=where)
        np.testing.assert_array_equal(
            host(value.scales).reshape(-1), np.asarray(step["expected_scales"], np.float32), err_msg=where
        )
    else:  # pragma: no cover - the data file only holds the kinds above
        raise AssertionError(f"{where}: unknown check kind {kind!r}")


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_burn_vector_numpy(vector: dict[str, Any], np_xp: Any) -> None:
    assert run_program(vector, np_xp) > 0


_NOT_LAZY = ("mask_select", "sort", "argsort", "topk", "gather")


def _sample() -> list[dict[str, Any]]:
    """The first vector of each Burn file and of each Burn operation, in file order."""
    seen: set[str] = set()
    picked = []
    for v in VECTORS:
        if v["file"] not in seen or v["op"] not in seen:
            picked.append(v)
        seen.update((v["file"], v["op"]))
    return picked


SAMPLE = _sample()


# Dask runs only the operations with a lazy form (not those with a data-dependent shape or order)
BACKEND_CASES = [
    (v, b)
    for b in ("array_api_strict", "torch", "jax", "dask")
    for v in SAMPLE
    if not (b == "dask" and any(w in v["op"] for w in _NOT_LAZY))
]


@pytest.mark.parametrize(("vector", "backend"), BACKEND_CASES, ids=[f"{b}-{v['id']}" for v, b in BACKEND_CASES])
def test_burn_vector_backend(vector: dict[str, Any], backend: str) -> None:
    import conftest  # the root conftest: its XP wrapper puts host data on each backend

    pytest.importorskip(backend)
    xp = conftest._make(conftest.Backend(backend))
    assert run_program(vector, xp) > 0


# the rest of the vectors on every backend: opt-in (-m slow), run once and reported
REST_CASES = [
    (v, b)
    for b in ("array_api_strict", "torch", "jax", "dask")
    for v in VECTORS
    if v not in SAMPLE and not (b == "dask" and any(w in v["op"] for w in _NOT_LAZY))
]


@pytest.mark.slow
@pytest.mark.parametrize(("vector", "backend"), REST_CASES, ids=[f"{b}-{v['id']}" for v, b in REST_CASES])
def test_burn_vector_every_backend(vector: dict[str, Any], backend: str) -> None:
    test_burn_vector_backend(vector, backend)


def test_empty_mask_select_is_a_typed_error() -> None:
    # Burn's should_support_mask_select_ops_empty_mask expects a quantized tensor of shape [0];
    # a QuantizedTensor is never empty, so arrayquant says so instead
    (entry,) = [e for e in DATA["excluded"] if e["id"].endswith("mask_select_ops_empty_mask")]
    data, mask = (np.asarray(i["data"]) for i in entry["vector"]["inputs"])
    qt = aq.quantize(data.astype(np.float32), entry["vector"]["inputs"][0]["scheme"])
    with pytest.raises(aq.ShapeError, match="empty"):
        aq.ops.mask_select(qt, mask.astype(bool))


def test_vector_file_is_burns() -> None:
    # The data names its source, and every Burn test is accounted for exactly once.
    src = DATA["source"]
    assert src["repository"] == "tracel-ai/burn"
    assert src["commit"] == "2c06be351006851d42fdb6df16b976f4a82d9747"
    ids = [v["id"] for v in VECTORS] + [e["id"] for e in DATA["excluded"]] + [p["id"] for p in DATA["should_panic"]]
    assert len(ids) == len(set(ids)) == 232


def test_tolerance_rule_matches_burn() -> None:
    # Strict '<', NaN == NaN, same-sign inf only, and max(A, R * max(|x|, |y|)).
    assert_approx(np.array([1.0, np.nan, np.inf]), np.array([1.05, np.nan, np.inf]), [0.0, 0.1], "ok")
    with pytest.raises(AssertionError):
        assert_approx(np.array([1.1]), np.array([1.0]), [0.0, 0.1], "edge")  # |d| == A fails
    with pytest.raises(AssertionError):
        assert_approx(np.array([np.inf]), np.array([-np.inf]), [0.5, 0.5], "inf")
    assert_approx(np.array([100.0]), np.array([101.0]), [0.02, 0.0], "relative")
    with pytest.raises(AssertionError):
        assert_approx(np.array([[1.0]]), np.array([1.0]), [1.0, 1.0], "shape")


# ------------------------------------------------------------------------------------------------
# Burn's #[should_panic] tests as typed-error tests
# ------------------------------------------------------------------------------------------------


def _q(data: Any) -> QuantizedTensor:
    return aq.quantize(np.asarray(data, dtype=np.float32), "q8s:native")


_PANICS = {
    # matmul.rs should_panic_when_inner_dimensions_are_not_equal: [2,3] @ [2,2]
    "matmul::should_panic_when_inner_dimensions_are_not_equal": lambda: op("matmul")(
        _q([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), _q([[1.0, 2.0], [3.0, 4.0]])
    ),
    # cat.rs: [1,3] with [1,2] along 0; cat along axis 3 of 2-d tensors
    "cat::should_panic_when_dimensions_are_not_the_same": lambda: op("concat")(
        [_q([[1.0, 2.0, 3.0]]), _q([[4.0, 5.0]])], axis=0
    ),
    "cat::should_panic_when_cat_exceeds_dimension": lambda: op("concat")(
        [_q([[1.0, 2.0, 3.0]]), _q([[4.0, 5.0, 6.0]])], axis=3
    ),
    "chunk::test_invalid_dim": lambda: op("chunk")(_q([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), 6, axis=1),
    "expand::should_fail_expand_incompatible_shapes": lambda: op("broadcast_to")(_q([1.0, 2.0, 3.0]), (2, 2)),
    "flip::flip_duplicated_axes": lambda: op("flip")(_q(np.arange(24.0).reshape(2, 3, 4)), axis=(0, 0, 1)),
    "flip::flip_out_of_bound_axis": lambda: op("flip")(_q(np.arange(24.0).reshape(2, 3, 4)), axis=(3, 0, 1)),
    "narrow::test_narrow_invalid_dim": lambda: op("narrow")(_q(np.arange(9.0).reshape(3, 3)), 2, 0, 2),
    "narrow::test_narrow_invalid_start": lambda: op("narrow")(_q(np.arange(9.0).reshape(3, 3)), 0, 3, 2),
    "narrow::test_narrow_invalid_zero_length": lambda: op("narrow")(_q(np.arange(9.0).reshape(3, 3)), 0, 1, 0),
    "narrow::test_narrow_invalid_length": lambda: op("narrow")(_q(np.arange(9.0).reshape(3, 3)), 0, 0, 4),
    "permute::edge_repeated_axes": lambda: op("permute_dims")(_q(np.arange(24.0).reshape(2, 3, 4)), (0, 0, 1)),
    "permute::edge_out_of_bound_axis": lambda: op("permute_dims")(_q(np.arange(24.0).reshape(2, 3, 4)), (3, 0, 1)),
    "reshape::multiple_neg_ones": lambda: op("reshape")(_q([0.0, 1.0, 2.0, 3.0]), (-1, -1)),
    "reshape::neg_value": lambda: op("reshape")(_q([0.0, 1.0, 2.0, 3.0]), (-2, -1)),
    "select::should_select_panic_invalid_dimension": lambda: op("take")(
        _q([0.0, 1.0, 2.0]), np.asarray([1, 1, 0], dtype=np.int64), axis=10
    ),
    "slice::should_panic_when_slice_with_too_many_dimensions": lambda: op("getitem")(
        _q([0.0, 1.0, 2.0]), (slice(0, 1), slice(0, 1))
    ),
    "split::test_split_with_sizes_invalid_sum": lambda: op("split")(
        _q([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), [2, 2, 1], axis=0
    ),
    "split::test_split_invalid_dim": lambda: op("split")(_q([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), [1], axis=2),
    "stack::should_panic_when_dimensions_are_not_the_same": lambda: op("stack")(
        [_q([[1.0, 2.0, 3.0]]), _q([[4.0, 5.0]])], axis=0
    ),
    "stack::should_panic_when_stack_exceeds_dimension": lambda: op("stack")(
        [_q([[1.0, 2.0, 3.0]]), _q([[4.0, 5.0, 6.0]])], axis=4
    ),
}


@pytest.mark.parametrize("vid", sorted(_PANICS))
def test_burn_should_panic(vid: str) -> None:
    # Burn panics; arrayquant raises its typed ShapeError, saying what is wrong.
    assert vid in {p["id"] for p in DATA["should_panic"]}
    with pytest.raises(ShapeError, match=r"\w"):
        _PANICS[vid]()
