"""ONNX models: QDQ and MatMulNBits written and read, checked with onnxruntime and onnx's reference evaluator.

Oracles: onnxruntime runs every model (its ``DequantizeLinear`` and ``MatMulNBits`` kernels, and
its own quantizers for the models read back); onnx's ``ReferenceEvaluator`` runs them too and
dequantizes single nodes; the float models compared with are the same graphs with
``aq.dequantize``'s weights (checked bit for bit elsewhere).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.errors import SchemeError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

F32 = np.float32
EPS = 2.0**-24
RNG = np.random.default_rng(7)
D, T = 64, 5


def _model(nodes, inputs, outputs, weights, opset=17):
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.1).astype(F32)


def mlp():
    """MatMul (K, N) -> Relu -> Gemm with transB (N, K) and a bias."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "W2", "b2"], ["y"], transB=1),
    ]
    return _model(nodes, [("x", [None, D])], ["y"], {"W1": _w(D, 128), "W2": _w(32, 128), "b2": _w(32)})


def block():
    """One transformer layer: LayerNorm, single-head attention (q, k, v, o), residual, LayerNorm, MLP, residual."""
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "g1", "z1"], ["a"], axis=-1),
        n("MatMul", ["a", "Wq"], ["q"]),
        n("MatMul", ["a", "Wk"], ["k"]),
        n("MatMul", ["a", "Wv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s0"]),
        n("Mul", ["s0", "inv"], ["s"]),
        n("Softmax", ["s"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["c"]),
        n("MatMul", ["c", "Wo"], ["o"]),
        n("Add", ["x", "o"], ["x1"]),
        n("LayerNormalization", ["x1", "g2", "z2"], ["b"], axis=-1),
        n("MatMul", ["b", "Wu"], ["u"]),
        n("Relu", ["u"], ["ur"]),
        n("MatMul", ["ur", "Wd"], ["dn"]),
        n("Add", ["x1", "dn"], ["y"]),
    ]
    weights = {
        "g1": np.ones(D, F32),
        "z1": np.zeros(D, F32),
        "g2": np.ones(D, F32),
        "z2": np.zeros(D, F32),
        "inv": np.array(1 / np.sqrt(D), F32),
        "Wq": _w(D, D),
        "Wk": _w(D, D),
        "Wv": _w(D, D),
        "Wo": _w(D, D),
        "Wu": _w(D, 4 * D),
        "Wd": _w(4 * D, D),
    }
    return _model(nodes, [("x", [None, T, D])], ["y"], weights)


MODELS = {"mlp": (mlp, (3, D)), "block": (block, (2, T, D))}


def _run(path, x, *, optimized=True):
    options = ort.SessionOptions()
    if not optimized:
        # onnxruntime rewrites a blocked int DequantizeLinear + MatMul into MatMulNBits at accuracy
        # level 4 (int8 activations) by default; unoptimized, every node runs as the graph says
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _files(tmp_path, make, scheme, fmt="onnx", **options):
    src, q, f = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "f.onnx"
    onnx.save(make(), src)
    summary = aq.quantize_file(src, q, scheme, format=fmt, **options)
    aq.dequantize_file(q, f)
    return src, q, f, summary


QDQ_SCHEMES = [
    "q8s",
    "q8s:block64",
    "q4s:block32",
    "q4f:block16:f16",
    "q4f:block32:zero_point",
    "u4:block32:zero_point",
    "u8:block16:zero_point",
    "mxfp8",
    "e5m2:block32",
]


@pytest.mark.parametrize("which", MODELS)
@pytest.mark.parametrize("scheme", QDQ_SCHEMES)
def test_qdq_models_run_in_onnxruntime_exactly_as_the_dequantized_weights(tmp_path, which, scheme):
    make, shape = MODELS[which]
    src, q, f, summary = _files(tmp_path, make, scheme)
    weights = [t.name for t in make().graph.initializer if t.name.startswith("W")]
    assert sorted(summary.quantized) == sorted(weights)
    x = RNG.standard_normal(shape).astype(F32)
    got = _run(q, x, optimized=False)
    # onnxruntime's DequantizeLinear gives aq.dequantize's weights: the outputs are the same bits
    assert np.array_equal(got, _run(f, x, optimized=False))
    # optimized (its QDQ fusions), the same within int8 activations' error
    fast = _run(q, x)
    assert np.max(np.abs(fast - got)) <= 0.05 * np.max(np.abs(got))
    # and onnx's reference evaluator runs the QDQ model to the same values (its own kernels)
    ref = ReferenceEvaluator(str(q)).run(None, {"x": x})[0]
    np.testing.assert_allclose(ref, got, rtol=1e-5, atol=1e-5)
    # the model still says what it did before quantization, within the scheme's error
    plain = _run(src, x)
    assert np.max(np.abs(got - plain)) < 0.2 * np.max(np.abs(plain))


@pytest.mark.parametrize("scheme", ["q4s:block32", "u4:block32:zero_point", "mxfp8", "q8s:block64"])
def test_each_dequantize_node_is_the_scheme_exactly(tmp_path, scheme):
    src, q, _, _ = _files(tmp_path, mlp, scheme)
    model = onnx.load(q)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    loaded = aq.load(q, backend="numpy")
    float_w = {t.name: numpy_helper.to_array(t) for t in onnx.load(src).graph.initializer}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        name = node.output[0]
        one = helper.make_graph(
            [node],
            "dq",
            [],
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)],
            [numpy_helper.from_array(inits[i], i) for i in node.input if i],
        )
        dq = ReferenceEvaluator(helper.make_model(one, opset_imports=model.opset_import)).run(None, {})[0]
        assert np.array_equal(dq, aq.dequantize(loaded[name]))  # onnx's DequantizeLinear, bit for bit
        # the weight is quantized as a linear layer's: along K, as aq.quantize does it
        w = float_w[name]
        want = aq.dequantize(aq.quantize(w.T, scheme)).T if name == "W1" else aq.dequantize(aq.quantize(w, scheme))
        assert np.array_equal(dq, want)


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4"])
def test_fp4_qdq_models_run_in_the_reference_evaluator(tmp_path, scheme):
    # onnxruntime 1.32 has no CPU DequantizeLinear for FLOAT4E2M1 (opset 23); onnx's evaluator does
    _, q, f, _ = _files(tmp_path, mlp, scheme)
    assert max(op.version for op in onnx.load(q).opset_import if op.domain == "") == 23
    x = RNG.standard_normal((3, D)).astype(F32)
    got = ReferenceEvaluator(str(q)).run(None, {"x": x})[0]
    assert np.array_equal(got, ReferenceEvaluator(str(f)).run(None, {"x": x})[0])
    with pytest.raises(Exception, match="DequantizeLinear"):
        ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])


def _one_matmul(k=D, n=48):
    return _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [("x", [None, k])], ["y"], {"W": _w(k, n)})


NBITS_SCHEMES = [
    "q4s:block32",
    "q4f:block16",
    "u4:block32:zero_point",
    "q4f:block64:zero_point",
    "q8s:block32",
    "u8:block16:zero_point",
]


@pytest.mark.parametrize("scheme", NBITS_SCHEMES)
def test_matmulnbits_layout_is_onnxruntimes(tmp_path, scheme):
    _, q, f, summary = _files(tmp_path, _one_matmul, scheme, fmt="matmulnbits")
    assert summary.quantized == ["W"]
    assert [n.op_type for n in onnx.load(q).graph.node] == ["MatMulNBits"]
    w = aq.dequantize(aq.load(q, backend="numpy")["W"])  # (N, K)
    # the identity picks each weight alone: onnxruntime's kernel reproduces it exactly
    eye = np.eye(D, dtype=F32)
    assert np.array_equal(_run(q, eye), w.T)
    # and a product is the float model's to f32 accumulation
    x = RNG.standard_normal((7, D)).astype(F32)
    bound = (D + 4) * EPS * (np.abs(x) @ np.abs(w.T)) + 1e-30
    assert np.all(np.abs(_run(q, x) - _run(f, x)) <= 2 * bound)


def test_matmulnbits_accuracy_level_four_quantizes_the_activations(tmp_path):
    _, q, f, _ = _files(tmp_path, _one_matmul, "q4s:block32", fmt="matmulnbits", accuracy_level=4)
    node = onnx.load(q).graph.node[0]
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "accuracy_level")) == 4
    x = RNG.standard_normal((4, D)).astype(F32)
    got, want = _run(q, x), _run(f, x)
    assert not np.array_equal(got, want)
    assert np.max(np.abs(got - want)) < 0.02 * np.max(np.abs(want))


def test_models_from_onnxruntimes_matmulnbits_quantizer_read_back_exactly(tmp_path):
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    for symmetric in (True, False):
        quantizer = MatMulNBitsQuantizer(_one_matmul(), block_size=32, is_symmetric=symmetric, bits=4)
        quantizer.process()
        path = tmp_path / f"ort-{symmetric}.onnx"
        onnx.save(quantizer.model.model, path)
        (qt,) = (v for v in aq.load(path, backend="numpy").values() if isinstance(v, aq.QuantizedTensor))
        # its symmetric scales carry a sign (scale = the signed absmax over -8): those blocks come back
        # mirrored, codes and zero points complemented, with the same values
        scales = numpy_helper.to_array(next(t for t in quantizer.model.model.graph.initializer if "scales" in t.name))
        assert np.any(scales < 0) == symmetric
        assert str(qt.scheme) == "u4:block32:f32:native:zero_point"
        assert np.all(np.asarray(qt.scales) >= 0)
        assert np.array_equal(_run(path, np.eye(D, dtype=F32)), aq.dequantize(qt).T)


def test_qdq_models_from_onnxruntimes_static_quantizer_read_back_exactly(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": RNG.standard_normal((2, D)).astype(F32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    src, out = tmp_path / "m.onnx", tmp_path / "s.onnx"
    onnx.save(mlp(), src)
    for per_channel, weight_type in ((True, QuantType.QInt8), (False, QuantType.QUInt8)):
        quantize_static(
            src,
            out,
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            weight_type=weight_type,
            activation_type=QuantType.QUInt8,
        )
        model = onnx.load(out)
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        loaded = aq.load(out, backend="numpy")
        weights = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
        assert len(weights) >= 2
        for node in weights:
            x, s = inits[node.input[0]], inits[node.input[1]]
            z = inits[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros((), x.dtype)
            axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
            qt = loaded[node.output[0]]
            shape = [1] * x.ndim
            if s.ndim == 1 and s.size > 1:
                shape[axis] = -1
            want = ((x.astype(np.int64) - z.reshape(shape).astype(np.int64)).astype(F32) * s.reshape(shape)).astype(F32)
            if x.dtype == np.int32:  # the bias: no scheme holds int32 codes, read as its values
                assert np.array_equal(qt, want)
                continue
            assert np.array_equal(np.asarray(qt.codes()), x)
            assert np.array_equal(aq.dequantize(qt), want)


def test_the_cli_writes_both_forms(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(mlp(), src)
    assert main(["quantize", str(src), str(tmp_path / "a.onnx"), "--scheme", "q4s:block32", "--quiet"]) == 0
    assert "quantized 2 weights as QDQ (q4s:block32:f32)" in capsys.readouterr().out
    out = tmp_path / "b.onnx"
    assert main(["quantize", str(src), str(out), "--scheme", "q4s:block32", "--format", "matmulnbits", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "quantized 1 weights as MatMulNBits" in text
    assert "left as it was: W2 (a Gemm weight (MatMulNBits replaces MatMul nodes))" in text
    assert aq.io.formats.detect(out) == "onnx"
    assert (
        main(["quantize", str(src), str(tmp_path / "c.safetensors"), "--scheme", "q8s", "--format", "arrayquant"]) != 0
    )
    assert "is an ONNX model: quantize writes ONNX from it (--format onnx or matmulnbits)" in capsys.readouterr().err
    st = tmp_path / "w.safetensors"
    aq.save(st, {"w": np.ones((4, 64), F32)})
    assert main(["quantize", str(st), str(tmp_path / "d.onnx"), "--scheme", "q8s", "--format", "onnx"]) != 0
    assert "--format onnx writes ONNX models, from an ONNX model IN" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("scheme", "fmt", "message"),
    [
        ("u4:block32:offset", "onnx", r"offset mode \(x = d \* q \+ m\) has no DequantizeLinear form"),
        ("nf4", "onnx", r"a lookup codebook has no DequantizeLinear form"),
        ("q2s:block32", "onnx", r"2-bit codes have no ONNX type \(4 and 8 bits do\)"),
        ("nvfp4", "matmulnbits", r"MatMulNBits holds 4-bit and 8-bit integer codes"),
        ("q4s:block48", "matmulnbits", r"a power of two, at least 16, dividing K \(64\); got 48"),
        ("q8s", "matmulnbits", r"MatMulNBits needs one scale per block along K"),
    ],
)
def test_schemes_without_an_onnx_form_are_refused(tmp_path, scheme, fmt, message):
    src = tmp_path / "m.onnx"
    onnx.save(_one_matmul(), src)
    with pytest.raises(SchemeError, match=message):
        aq.quantize_file(src, tmp_path / "q.onnx", scheme, format=fmt)
    assert not (tmp_path / "q.onnx").exists()


def test_hostile_files_are_refused(tmp_path):
    model = _one_matmul()
    ext = tmp_path / "ext.onnx"
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="../../etc/passwd")  # a path named inside the file: never opened
    ext.write_bytes(model.SerializeToString())
    with pytest.raises(SchemeError, match=r"keeps 1 tensor\(s\) in external data files \(e.g. 'W'\)"):
        aq.load(ext)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08" + b"\xff" * 64)
    with pytest.raises(aq.CorruptDataError, match=r"is not an ONNX model"):
        aq.load(bad)
    with pytest.raises(SchemeError, match=r"aq.save does not write ONNX files"):
        aq.save(tmp_path / "x.onnx", {"w": np.ones((2, 2), F32)})
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    with pytest.raises(aq.PathError, match=r"OUT .* is IN"):
        aq.quantize_file(src, src, "q8s")


def _nbits_node(b, scales, zero=None, **attrs):
    weights = {"B": b, "S": scales}
    inputs = ["x", "B", "S"]
    if zero is not None:
        weights["Z"] = zero
        inputs.append("Z")
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node],
        "n",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


@pytest.mark.parametrize(
    ("b", "scales", "zero", "attrs", "message"),
    [
        (
            np.zeros((4, 1, 16), np.uint8),
            np.ones(4, F32),
            None,
            {"K": 32, "N": 4, "bits": 3, "block_size": 32},
            r"bits=3, block_size=32 is not read",
        ),
        (
            np.zeros((4, 1, 8), np.uint8),
            np.ones(4, F32),
            None,
            {"K": 32, "N": 4, "bits": 4, "block_size": 32},
            r"B must be uint8 of 4 x 1 x 16 bytes",
        ),
        (
            np.zeros((4, 1, 16), np.uint8),
            np.ones(3, F32),
            None,
            {"K": 32, "N": 4, "bits": 4, "block_size": 32},
            r"scales must be 4 float32 or float16 values",
        ),
        (
            np.zeros((4, 1, 16), np.uint8),
            np.ones(4, F32),
            np.zeros(1, np.uint8),
            {"K": 32, "N": 4, "bits": 4, "block_size": 32},
            r"zero_points must hold 4 bytes, got 1",
        ),
        (
            np.zeros((4, 1, 16), np.uint8),
            np.ones(4, F32),
            None,
            {"K": 32, "N": 4, "bits": 4},
            r"MatMulNBits without its block_size attribute",
        ),
    ],
)
def test_malformed_matmulnbits_nodes_are_refused(tmp_path, b, scales, zero, attrs, message):
    path = tmp_path / "n.onnx"
    onnx.save(_nbits_node(b, scales, zero, **attrs), path)
    with pytest.raises(SchemeError, match=message):
        aq.load(path)


def test_without_onnx_installed_the_error_says_what_to_install(tmp_path, monkeypatch):
    src = tmp_path / "m.onnx"
    onnx.save(_one_matmul(), src)
    assert aq.io.formats.detect(src) == "onnx"  # recognising the file needs no package
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(
        aq.BackendUnavailableError, match=r"the onnx format needs onnx \(pip install 'arrayquant\[onnx\]'\)"
    ):
        aq.load(src)


def _dq_model(x, scale, zero=None, **attrs):
    weights = {"X": x, "S": scale}
    inputs = ["X", "S"]
    if zero is not None:
        weights["Z"] = zero
        inputs.append("Z")
    node = helper.make_node("DequantizeLinear", inputs, ["W"], **attrs)
    graph = helper.make_graph(
        [node],
        "dq",
        [],
        [helper.make_tensor_value_info("W", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


_I8 = np.zeros((4, 32), np.int8)


@pytest.mark.parametrize(
    ("x", "scale", "zero", "attrs", "message"),
    [
        (np.zeros((), np.int8), np.ones((), F32), None, {}, r"a 0-d quantized initializer is not read as a tensor"),
        (_I8, np.ones((), np.float64), None, {}, r"scale of type float64 \(float32, float16 and bfloat16 are read\)"),
        (_I8, np.ones(32, F32), None, {"axis": 2}, r"axis 2 is outside the data's 2 axes"),
        (_I8, np.ones(4, F32), None, {"axis": 1}, r"a per-axis scale must have shape \(32,\), got \(4,\)"),
        (
            _I8,
            np.ones((4, 2), F32),
            None,
            {"axis": 1, "block_size": 8},
            r"a scale blocked by 8 along axis 1 must have shape \(4, 4\), got \(4, 2\)",
        ),
        (
            _I8,
            np.ones(32, F32),
            np.zeros(4, np.int8),
            {"axis": 1},
            r"zero point shape \(4,\) differs from the scale's \(32,\)",
        ),
        (
            _I8,
            np.ones(32, F32),
            np.zeros(32, np.uint8),
            {"axis": 1},
            r"zero point type uint8 differs from the codes' int8",
        ),
        (
            np.zeros((4, 32), np.int16),
            np.ones((4, 4), F32),
            None,
            {"axis": 1, "block_size": 8},
            r"DequantizeLinear codes of type int16 are not read",
        ),
    ],
)
def test_malformed_dequantize_nodes_are_refused(tmp_path, x, scale, zero, attrs, message):
    path = tmp_path / "dq.onnx"
    onnx.save(_dq_model(x, scale, zero, **attrs), path)
    with pytest.raises(SchemeError, match=message):
        aq.load(path)


def test_a_float8_zero_point_other_than_zero_is_refused(tmp_path):
    ml = pytest.importorskip("ml_dtypes")
    x = np.zeros((4, 32), ml.float8_e4m3fn)
    path = tmp_path / "dq.onnx"
    onnx.save(_dq_model(x, np.ones((), F32), np.ones((), ml.float8_e4m3fn)), path)
    with pytest.raises(SchemeError, match=r"a float8 / float4 zero point other than 0 is not read"):
        aq.load(path)


def test_wide_integer_data_is_read_as_its_values(tmp_path):
    x = np.arange(-64, 64, dtype=np.int32).reshape(4, 32)
    path = tmp_path / "dq.onnx"
    onnx.save(_dq_model(x, np.array([0.5, 1, 2, 4], F32), np.array([1, 0, 0, 0], np.int32), axis=0), path)
    ((name, value, note),) = aq.io.formats.iter_tensors(path)
    assert name == "W"
    assert note == "a wide-integer DequantizeLinear, read as its f32 values"
    want = (x - np.array([[1], [0], [0], [0]])).astype(F32) * np.array([[0.5], [1], [2], [4]], F32)
    assert np.array_equal(value, want)


def test_malformed_matmulnbits_zero_points_and_k_are_refused(tmp_path):
    attrs = {"K": 40, "N": 4, "bits": 4, "block_size": 16}
    path = tmp_path / "n.onnx"
    onnx.save(_nbits_node(np.zeros((4, 3, 8), np.uint8), np.ones(12, F32), None, **attrs), path)
    with pytest.raises(SchemeError, match=r"K \(40\) not a multiple of block_size \(16\) is not read"):
        aq.load(path)
    attrs = {"K": 32, "N": 4, "bits": 4, "block_size": 16}
    onnx.save(_nbits_node(np.zeros((4, 2, 8), np.uint8), np.ones(8, F32), np.ones(8, F32), **attrs), path)
    with pytest.raises(SchemeError, match=r"zero points of type float32 are not read \(uint8 ones are\)"):
        aq.load(path)


def test_weights_whose_blocks_span_rows_are_refused(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_one_matmul(), src)
    with pytest.raises(SchemeError, match=r"has blocks spanning rows; DequantizeLinear blocks run along one axis"):
        aq.quantize_file(src, tmp_path / "q.onnx", "q8s:block2x16")


@pytest.mark.parametrize("kind", ["int8", "uint4", "int4", "e4m3"])
def test_negative_scales_read_as_mirrored_blocks_with_the_same_values(tmp_path, kind):
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(9)
    dtype = {"int8": np.int8, "uint4": ml.uint4, "int4": ml.int4, "e4m3": ml.float8_e4m3fn}[kind]
    if kind == "e4m3":
        x = rng.standard_normal((4, 32)).astype(dtype)
        zero = None
    else:
        lo, hi = (-128, 127) if kind == "int8" else ((0, 15) if kind == "uint4" else (-8, 7))
        x = rng.integers(lo, hi + 1, (4, 32)).astype(dtype)
        zero = rng.integers(lo, hi + 1, (4, 2)).astype(dtype)
    scale = np.array([[0.5, -0.25], [-1.0, 2.0], [-0.0, 0.125], [1.5, -3.0]], F32)
    model = _dq_model(x, scale, zero, axis=1, block_size=16)
    path = tmp_path / "neg.onnx"
    onnx.save(model, path)
    want = ReferenceEvaluator(model).run(None, {})[0]  # onnx's own DequantizeLinear
    qt = aq.load(path, backend="numpy")["W"]
    assert np.all(np.asarray(qt.scales) >= 0)
    assert not np.any(np.signbit(np.asarray(qt.scales)))
    assert np.array_equal(aq.dequantize(qt), want)
