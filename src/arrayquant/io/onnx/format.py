"""The ONNX format's protocol: models whose weights are ``DequantizeLinear`` (QDQ) or ``MatMulNBits`` initializers.

Read (``aq.load``, ``arrayquant inspect``): every ``DequantizeLinear`` whose data, scale and zero
point are initializers is one :class:`~arrayquant.QuantizedTensor`, named by the node's output (the
name the float weight had), and every ``MatMulNBits`` weight one ``(N, K)`` tensor named by its ``B``
initializer less the ``_Q4`` / ``_Q8`` suffix; the other initializers are arrays.

Written (``aq.quantize_file(model.onnx, out.onnx, scheme)``, ``arrayquant quantize``): each float32
weight that is the second input of a ``MatMul`` (``(K, N)``) or a ``Gemm`` (either layout) is
quantized along K, as a linear layer's weight, and replaced by ``DequantizeLinear`` initializers
whose output keeps the weight's name, so the graph is otherwise untouched; with
``format="matmulnbits"`` each ``MatMul`` becomes one ``MatMulNBits`` node. The default opset is
raised to 21 (23 for FP4) where lower, and ``com.microsoft`` is imported for ``MatMulNBits``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...backends import shim
from ...backends.registry import default
from ...errors import CorruptDataError, ParamsError, PathError, SchemeError
from ...quantize import quantize
from ...scheme import QuantScheme
from ...tensor import QuantizedTensor
from .._calibration import search_arguments
from .._select import Selection
from ..summary import DequantizeSummary, QuantizeSummary
from . import NAME, nbits, qdq
from .model import read_model, sniff, write_model

__all__ = [
    "NAME",
    "dequantize_file",
    "iter_tensors",
    "load",
    "quantize_file",
    "save",
    "sniff",
    "tensor_shapes",
]

_MS = "com.microsoft"


def _arrays(model: Any) -> dict[str, np.ndarray]:
    """Every initializer as an array; one whose data does not fit its type and dims is a CorruptDataError."""
    from onnx import numpy_helper

    out = {}
    for t in model.graph.initializer:
        try:
            out[t.name] = numpy_helper.to_array(t)
        except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:  # onnx's, on damaged tensors
            msg = f"initializer {t.name[:200]!r} does not hold what its type and dims say: {str(exc)[:200]}"
            raise CorruptDataError(msg) from None
    return out


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# DequantizeLinear data of these types (biases quantizers write as int32) has no arrayquant scheme:
# read as the float values the node computes, in f32
_WIDE = (np.dtype(np.int32), np.dtype(np.int16), np.dtype(np.uint16))


def _wide(x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, axis: int, where: str) -> np.ndarray:
    """``(x - zero) * scale`` in f32 for a per-tensor or per-axis node (as DequantizeLinear computes it)."""
    shape = [1] * x.ndim
    if x.ndim == 0 or (scale.size > 1 and scale.shape != (x.shape[axis % x.ndim],)):
        msg = f"{where}: a scale of shape {scale.shape} for data of shape {x.shape} (axis {axis})"
        raise SchemeError(msg)
    if zero is not None and zero.size != scale.size:
        msg = f"{where}: zero point shape {zero.shape} differs from the scale's {scale.shape}"
        raise SchemeError(msg)
    if scale.size > 1:
        shape[axis % x.ndim] = -1
    z = 0 if zero is None else zero.astype(np.int64).reshape(shape)
    return ((x.astype(np.int64) - z).astype(np.float32) * scale.astype(np.float32).reshape(shape)).astype(np.float32)


def _quantized(model: Any, arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], set[str]]:
    """The quantized weights of ``model`` by name (wide-integer ones as f32 arrays), and the initializers used."""
    out: dict[str, Any] = {}
    used: set[str] = set()
    for i, node in enumerate(model.graph.node):
        where = f"node {i} ({node.op_type[:100]} {(node.name or (node.output[0] if node.output else ''))[:200]!r})"
        try:
            _read_node(node, where, arrays, out, used)
        except (SchemeError, CorruptDataError, ParamsError):
            raise
        except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:  # a damaged attribute or array
            msg = f"{where} is not a node arrayquant can read: {type(exc).__name__}: {str(exc)[:200]}"
            raise CorruptDataError(msg) from None
    return out, used


def _read_node(node: Any, where: str, arrays: Mapping[str, np.ndarray], out: dict[str, Any], used: set[str]) -> None:
    """Add the weight one DequantizeLinear or MatMulNBits node stands for (other nodes add nothing)."""
    inputs = list(node.input)
    if not node.output or not inputs:
        return
    if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
        if not (inputs[0] in arrays and len(inputs) > 1 and inputs[1] in arrays):
            return  # activations, or data from another node
        zero = arrays.get(inputs[2]) if len(inputs) > 2 and inputs[2] else None
        attrs = _attrs(node)
        axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
        x, scale = arrays[inputs[0]], arrays[inputs[1]]
        if x.dtype in _WIDE and block == 0:
            out[node.output[0]] = _wide(x, scale, zero, axis, where)
        else:
            out[node.output[0]] = qdq.decode(x, scale, zero, axis, block, where)
        used.update(n for n in inputs if n)
    elif node.op_type == "MatMulNBits" and node.domain == _MS:
        if not (len(inputs) > 2 and inputs[1] in arrays and inputs[2] in arrays):
            return
        zero = arrays.get(inputs[3]) if len(inputs) > 3 and inputs[3] else None
        if len(inputs) > 4 and any(inputs[4:]):
            msg = f"{where}: MatMulNBits with g_idx or bias inputs is not read"
            raise SchemeError(msg)
        attrs = _attrs(node)
        name = inputs[1].removesuffix(f"_Q{attrs.get('bits', 4)}")
        out[name] = nbits.decode(arrays[inputs[1]], arrays[inputs[2]], zero, attrs, where)
        used.update(n for n in inputs[1:] if n)


def load(path: Path, *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
    """Every weight of an ONNX model: quantized ones as QuantizedTensors, other initializers as arrays."""
    target = backend or default().name
    out: dict[str, Any] = {}
    for name, tensor, _ in iter_tensors(path):
        out[name] = (
            tensor.to_backend(target, device)
            if isinstance(tensor, QuantizedTensor)
            else shim.convert(np.ascontiguousarray(tensor), target, device)
        )
    return out


def iter_tensors(path: Path) -> Iterator[tuple[str, Any, str]]:
    """``(name, tensor, note)`` for every weight, on the host (NumPy)."""
    model = read_model(path)
    arrays = _arrays(model)
    quantized, used = _quantized(model, arrays)
    for name, qt in quantized.items():
        yield (
            name,
            qt,
            "" if isinstance(qt, QuantizedTensor) else "a wide-integer DequantizeLinear, read as its f32 values",
        )
    for name, arr in arrays.items():
        if name not in used and name not in quantized and arr.dtype.kind in "biufc":  # not strings
            yield name, arr, ""


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each weight's shape (quantized ones as they dequantize)."""
    return {name: tuple(int(d) for d in t.shape) for name, t, _ in iter_tensors(path)}


def save(path: Path, tensors: Mapping[str, Any], **options: Any) -> None:
    """ONNX files are models, not tensor collections: refused with the way to write one."""
    msg = (
        "aq.save does not write ONNX files: an ONNX file is a model, not a set of tensors; quantize a model "
        "with aq.quantize_file('model.onnx', 'out.onnx', scheme) (or arrayquant quantize)"
    )
    raise SchemeError(msg)


def _raise_opset(model: Any, version: int) -> None:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, version)
            return
    model.opset_import.add(domain="", version=version)


def _targets(model: Any, arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[str, bool]]:
    """Weights a linear layer multiplies by: name -> (op, whether it is stored (K, N) and needs transposing)."""
    out: dict[str, tuple[str, bool]] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or len(node.input) < 2 or node.input[1] not in arrays:
            continue
        if node.op_type == "MatMul":
            out.setdefault(node.input[1], ("MatMul", True))
        elif node.op_type == "Gemm":
            out.setdefault(node.input[1], ("Gemm", not int(_attrs(node).get("transB", 0))))
    return out


def quantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    calibration: Any = "minmax",
    importance: Mapping[str, Any] | None = None,
    accuracy_level: int = 0,
    out_format: str = NAME,
) -> QuantizeSummary:
    """Quantize the linear layers' weights of an ONNX model into a new model (QDQ, or MatMulNBits).

    ``accuracy_level`` goes to each MatMulNBits node (onnxruntime: 0 computes in f32, 4 quantizes
    the activations to int8). Everything that is not a float32 2-d ``MatMul`` / ``Gemm`` weight is
    kept as stored; ``left_out`` says why each other float initializer was not quantized.
    """
    from onnx import helper

    if Path(src).resolve() == Path(dst).resolve():
        msg = f"OUT {dst} is IN; write the quantized model to a new file"
        raise PathError(msg)
    parsed = QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme
    nbits_out = out_format == "matmulnbits"
    model = read_model(src)
    arrays = _arrays(model)
    targets = _targets(model, arrays)
    selection = Selection(include, exclude)
    summary = QuantizeSummary(out_format, str(parsed), stored_as="MatMulNBits" if nbits_out else "QDQ")
    replaced: dict[str, list[Any]] = {}
    nodes: list[Any] = []
    opset = 0
    for name, arr in arrays.items():
        if arr.dtype.kind != "f":
            continue
        why = None
        if name not in targets:
            why = "not a MatMul or Gemm weight"
        elif arr.dtype != np.float32:
            why = f"{arr.dtype} weights are kept (float32 ones are quantized)"
        elif arr.ndim != 2:
            why = f"a {arr.ndim}-d weight"
        elif nbits_out and targets[name][0] != "MatMul":
            why = "a Gemm weight (MatMulNBits replaces MatMul nodes)"
        else:
            why = selection.why_not(name, arr.shape)
        if why is not None:
            summary.left_out[name] = why
            continue
        transpose = targets[name][1]
        weight = np.ascontiguousarray(arr.T if transpose else arr)  # (N, K): blocks along K
        qt = quantize(weight, parsed, **search_arguments(calibration, importance, name))
        if nbits_out:
            tensors, attrs = nbits.encode(qt, name)
            replaced[name] = [tensors, attrs]
        else:
            tensors, attrs = qdq.encode(qt, name, transpose=transpose)
            inputs = [t.name for t in tensors]
            node = helper.make_node("DequantizeLinear", inputs, [name], name=f"{name}_DequantizeLinear")
            node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
            nodes.append(node)
            replaced[name] = [tensors, attrs]
            opset = max(opset, qdq.opset_for(qt))
        summary.quantized.append(name)
        if progress is not None:
            progress(name)
    graph = model.graph
    kept = [t for t in graph.initializer if t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for tensors, _ in replaced.values():
        graph.initializer.extend(tensors)
    if nbits_out:
        new_nodes = []
        for node in graph.node:
            if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and node.input[1] in replaced:
                tensors, attrs = replaced[node.input[1]]
                new_nodes.append(
                    helper.make_node(
                        "MatMulNBits",
                        [node.input[0], *(t.name for t in tensors)],
                        list(node.output),
                        name=node.name or f"{node.input[1]}_MatMulNBits",
                        domain=_MS,
                        accuracy_level=int(accuracy_level),
                        K=attrs["K"],
                        N=attrs["N"],
                        bits=attrs["bits"],
                        block_size=attrs["block_size"],
                    )
                )
            else:
                new_nodes.append(node)
        del graph.node[:]
        graph.node.extend(new_nodes)
        if replaced and not any(op.domain == _MS for op in model.opset_import):
            model.opset_import.add(domain=_MS, version=1)
    else:
        rest = list(graph.node)
        del graph.node[:]
        graph.node.extend([*nodes, *rest])  # the weights first: every consumer comes after them
        if opset:
            _raise_opset(model, opset)
    write_model(dst, model)
    return summary


def dequantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    names: Sequence[str] | None = None,
    out_format: str = NAME,
) -> DequantizeSummary:
    """The model with its QDQ weights back as float initializers (MatMulNBits nodes as MatMul)."""
    from onnx import helper, numpy_helper

    from ...dequantize import dequantize

    if Path(src).resolve() == Path(dst).resolve():
        msg = f"OUT {dst} is IN; write the float model to a new file"
        raise PathError(msg)
    target = np.dtype(dtype or "float32")
    model = read_model(src)
    arrays = _arrays(model)
    quantized, _ = _quantized(model, arrays)
    wanted = set(quantized) if names is None else set(names) & set(quantized)
    summary = DequantizeSummary(out_format, target.name)
    graph = model.graph
    floats: dict[str, Any] = {}
    new_nodes = []
    dropped: set[str] = set()
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in wanted:
            qt = quantized[node.output[0]]
            values = dequantize(qt) if isinstance(qt, QuantizedTensor) else qt
            floats[node.output[0]] = numpy_helper.from_array(np.asarray(values).astype(target), node.output[0])
            dropped.update(n for n in node.input if n)
            continue
        if node.op_type == "MatMulNBits" and node.domain == _MS:
            name = node.input[1].removesuffix(f"_Q{_attrs(node).get('bits', 4)}")
            if name in wanted:
                w = np.asarray(dequantize(quantized[name])).astype(target)
                floats[name] = numpy_helper.from_array(np.ascontiguousarray(w.T), name)
                dropped.update(n for n in node.input[1:] if n)
                new_nodes.append(helper.make_node("MatMul", [node.input[0], name], list(node.output), name=node.name))
                continue
        new_nodes.append(node)
    still = {n for node in new_nodes for n in node.input}
    kept = [t for t in graph.initializer if t.name not in dropped or t.name in still]
    del graph.initializer[:]
    graph.initializer.extend([*kept, *floats.values()])
    del graph.node[:]
    graph.node.extend(new_nodes)
    summary.dequantized = sorted(floats)
    summary.copied = [t.name for t in kept]
    write_model(dst, model)
    return summary
