"""Affine schemes beyond the conformance suite: static parameters, ONNX's own QuantizeLinear and
DequantizeLinear as the oracle, the byte and checkpoint layouts, and every refusal's type and text."""

from __future__ import annotations

import importlib.util

import ml_dtypes
import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import to_host

from . import oracle_affine
from .oracle_affine import Case

F32 = np.float32


def _data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(F32)
    x.reshape(-1)[: shape[-1]] = 0.0  # one all-zero row
    return x


# ---------------------------------------------------------------------------------------------
# static parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["u4:block16:f16:zero_point", "q8f:tensor:f32:zero_point", "u5:block8:bf16:offset"])
def test_static_params_from_compute_q_params_give_the_dynamic_result(xp, text: str) -> None:
    x = xp.asarray(_data((6, 48)))
    dynamic = aq.quantize(x, text)
    params = aq.compute_q_params(text, *aq.compute_range(x, text))
    static = aq.quantize(x, text, params)
    for part in ("values", "scales", "zero_point", "offset"):
        a, b = getattr(dynamic, part), getattr(static, part)
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(to_host(a), to_host(b))


def test_given_offsets_are_rounded_down_and_scales_up() -> None:
    x = np.linspace(-1, 1, 32, dtype=F32).reshape(1, 32)
    m = np.array([[-1.0001]], F32)
    d = np.array([[0.0667]], F32)
    qt = aq.quantize(x, "u4:block32:f16:offset", aq.QParams(scales=d, offset=m))
    assert qt.offset.tolist() == [[float(oracle_affine.round_down(m, "f16")[0, 0])]]
    assert float(qt.offset[0, 0]) <= -1.0001
    assert float(qt.scales[0, 0]) >= 0.0667
    assert float(np.float16(qt.scales[0, 0])) == float(qt.scales[0, 0])


def test_offsets_are_the_minimum_rounded_down_onto_narrow_grids() -> None:
    rng = np.random.default_rng(1)
    m = np.concatenate([rng.standard_normal(4000) * 100, [0.0, -0.0, 1e-8, -1e-8, 7e4, -7e4]]).astype(F32)
    for name, narrow in (("f16", np.float16), ("bf16", ml_dtypes.bfloat16)):
        qt = aq.quantize(m.reshape(1, -1), f"u8:block1:{name}:offset")  # one element per block: m is its value
        got = qt.offset.reshape(-1)
        np.testing.assert_array_equal(got, oracle_affine.round_down(m, name))
        top = float(ml_dtypes.finfo(narrow).max)
        inside = np.abs(m) <= top
        assert np.all(got.astype(narrow).astype(F32) == got)  # on the grid
        assert np.all(got[inside] <= m[inside])  # never above the value
        with np.errstate(over="ignore"):
            up = np.nextafter(got.astype(narrow), np.array(np.inf, narrow)).astype(F32)
        assert np.all(up[inside] > m[inside])  # and the largest such


# ---------------------------------------------------------------------------------------------
# ONNX QuantizeLinear / DequantizeLinear (onnx's reference evaluator) as the oracle
# ---------------------------------------------------------------------------------------------

_ONNX = importlib.util.find_spec("onnx") is not None
onnx_only = pytest.mark.skipif(not _ONNX, reason="onnx is not installed (pip install 'arrayquant[test]')")

# (arrayquant value, numpy dtype of ONNX's codes and zero points)
_ONNX_TYPES = {
    "u8": np.dtype(np.uint8),
    "q8f": np.dtype(np.int8),
    "u4": np.dtype(ml_dtypes.uint4),
    "q4f": np.dtype(ml_dtypes.int4),
}


def _qdq(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int | None, block: int | None):
    """ONNX's codes and values for ``x``: QuantizeLinear then DequantizeLinear, opset 21."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    attrs = {} if axis is None else {"axis": axis}
    if block:
        attrs["block_size"] = block
    qtype = helper.np_dtype_to_tensor_dtype(zp.dtype)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [
            helper.make_tensor_value_info("q", qtype, list(x.shape)),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape)),
        ],
        initializer=[numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    q, y = ReferenceEvaluator(model).run(None, {"x": x})
    return q, y


@onnx_only
@pytest.mark.parametrize("value", list(_ONNX_TYPES))
@pytest.mark.parametrize("layout", ["tensor", "axis0", "block32"])
def test_zero_points_match_onnx_reference(xp, value: str, layout: str) -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 80)) * 2).astype(F32)
    x[0, :6] = [0.5, 1.5, -2.5, 0.0, -0.0, 100.0]  # ties (for scale 1) and a saturating value
    _, qmin, qmax = oracle_affine.value_range(value)
    zdtype = _ONNX_TYPES[value]
    if layout == "tensor":
        scale, zp, axis, block, text = np.array([0.25], F32), [qmin + (qmax - qmin) // 3], None, None, "tensor:f32"
        grid = (1,)
    elif layout == "axis0":
        scale, axis, block, text = np.array([1.0, 0.05, 0.5, 0.125], F32), 0, None, "block1x80:f32"
        zp, grid = [qmin, qmax, (qmin + qmax) // 2, qmin + 1], (4, 1)
    else:
        scale = rng.uniform(0.05, 0.5, (4, 3)).astype(F32)
        scale[0, 0] = 1.0
        zp = rng.integers(qmin, qmax + 1, (4, 3)).tolist()
        axis, block, text, grid = 1, 32, "block32:f32", (4, 3)
    zero = np.array(zp, np.int64).reshape(scale.shape)
    onnx_q, onnx_y = _qdq(x, scale, zero.astype(zdtype), axis, block)
    scheme = f"{value}:{text}:zero_point:native"
    ours_dtype = np.uint8 if value.startswith("u") else np.int8
    params = aq.QParams(
        scales=xp.asarray(scale.reshape(grid)), zero_point=xp.asarray(zero.reshape(grid).astype(ours_dtype))
    )
    qt = aq.quantize(xp.asarray(x), scheme, params)
    np.testing.assert_array_equal(to_host(qt.codes()).astype(np.int64), onnx_q.astype(np.int64))
    np.testing.assert_array_equal(to_host(aq.dequantize(qt)), onnx_y)


# ---------------------------------------------------------------------------------------------
# byte layout and checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["u4:block16:f16:zero_point", "q3s:block8:bf16:zero_point:packed_native", "u5:block32:f16:offset"]
)
def test_bytes_round_trip(text: str) -> None:
    x = _data((3, 64))
    qt = aq.quantize(x, text)
    raw = aq.to_bytes(qt)
    assert len(raw) == aq.quantized_nbytes(text, x.shape)
    back = aq.from_bytes(raw, text, x.shape, backend="numpy")
    np.testing.assert_array_equal(aq.dequantize(back), aq.dequantize(qt))
    assert aq.to_bytes(back) == raw


def test_bytes_put_zero_points_after_the_scales() -> None:
    x = np.array([[-1.0, 0.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]], F32)
    qt = aq.quantize(x, "u8:block4:f32:zero_point:native")
    raw = aq.to_bytes(qt)
    # 8 codes, 2 f32 scales (4/255, 4/255), then the zero points 64 and 0 (an all-positive row)
    assert raw[8:16] == np.array([4 / 255, 4 / 255], "<f4").tobytes()
    assert raw[16:] == bytes([64, 0])


def test_corrupt_zero_point_bytes_are_refused() -> None:
    x = _data((2, 32))
    raw = bytearray(aq.to_bytes(aq.quantize(x, "u4:block32:f16:zero_point")))
    raw[-1] = 0x20  # 32: no u4 zero point
    with pytest.raises(
        aq.CorruptDataError, match=r"stored zero point 32 at index 1 lies outside the U4 code range 0\.\.15"
    ):
        aq.from_bytes(bytes(raw), "u4:block32:f16:zero_point", (2, 32))
    native = bytearray(aq.to_bytes(aq.quantize(x, "u4:block32:f16:zero_point:native")))
    native[3] = 0x10
    with pytest.raises(aq.CorruptDataError, match=r"16 at flat index 3 is not a U4 code \(0\.\.15\)"):
        aq.from_bytes(bytes(native), "u4:block32:f16:zero_point:native", (2, 32))
    with pytest.raises(aq.CorruptDataError, match=r"zero points 2x1 = 2"):
        aq.from_bytes(bytes(raw[:-1]), "u4:block32:f16:zero_point", (2, 32))


def test_checkpoint_round_trip_and_missing_zero_point(tmp_path) -> None:
    pytest.importorskip("safetensors")
    x = _data((4, 64))
    tensors = {"a": aq.quantize(x, "u4:block32:bf16:zero_point"), "b": aq.quantize(x, "u5:block16:f16:offset")}
    path = tmp_path / "w.safetensors"
    aq.save(path, tensors)
    back = aq.load(path)
    for k, qt in tensors.items():
        np.testing.assert_array_equal(aq.dequantize(back[k]), aq.dequantize(qt))
    from safetensors.numpy import load_file, save_file

    raw = load_file(path)
    import json

    from safetensors import safe_open

    with safe_open(path, "np") as f:
        meta = f.metadata()
    del raw["a.zero_point"]
    save_file(raw, tmp_path / "cut.safetensors", metadata=meta)
    with pytest.raises(
        aq.CorruptDataError, match=r"tensor 'a' has scheme .*zero_point mode\) and no a\.zero_point entry"
    ):
        aq.load(tmp_path / "cut.safetensors")
    assert json.loads(meta["arrayquant.tensor.a"])["scheme"] == "u4:block32:bf16:zero_point"


# ---------------------------------------------------------------------------------------------
# refusals: each with its type and message
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("u4:block32", r"U4 codes are unsigned, so symmetric mode could not give a negative number; add ':zero_point'"),
        ("u4:lookup", r"lookup mode takes its table index from the signed value of the same width; use q4f"),
        ("e4m3:zero_point", r"zero_point mode needs integer codes, not the minifloat E4M3"),
        ("u4:block16:ue4m3:tensor:f32:zero_point", r"zero_point mode has one level of scales .*drop tensor:f32"),
        ("q4f:block32:f16:offset", r"offset mode \(x = d \* q \+ m\) .*needs an unsigned value such as u4, not Q4F"),
        ("u4:block32:ue8m0:offset", r"offset mode stores its offsets in the scale dtype.*not UE8M0"),
        ("u8:zero_point:packed_native", r"U8 fields are a byte each already; use with_store\('native'\)"),
    ],
)
def test_impossible_schemes(text: str, pattern: str) -> None:
    with pytest.raises(aq.SchemeError, match=pattern):
        aq.quantize(np.ones((2, 32), F32), text)


def test_params_refusals() -> None:
    x = np.ones((2, 32), F32)
    s = np.full((2, 1), 0.1, F32)
    zp_scheme, off_scheme = "u4:block32:f32:zero_point", "u4:block32:f32:offset"
    u8, i8 = np.uint8, np.int8
    cases = [
        (zp_scheme, aq.QParams(scales=s), r"zero_point mode \(x = s \* \(q - z\)\) but params\.zero_point is None"),
        (off_scheme, aq.QParams(scales=s), r"offset mode \(x = d \* q \+ m\) but params\.offset is None"),
        ("q4f:block32", aq.QParams(scales=s, zero_point=np.zeros((2, 1), i8)), r"zero_point was given .*symmetric"),
        (zp_scheme, aq.QParams(scales=s, zero_point=np.zeros((2, 1), u8), offset=s), r"offset was given .*zero_point"),
        (
            zp_scheme,
            aq.QParams(scales=s, zero_point=np.zeros((2, 1), F32)),
            r"has dtype float32; zero points are integers",
        ),
        (zp_scheme, aq.QParams(scales=s, zero_point=np.array([[3], [16]])), r"has 16 at flat index 1; U4 zero points"),
        (off_scheme, aq.QParams(scales=s, offset=np.array([[0.0], [np.nan]], F32)), r"offset has 1 invalid entry"),
    ]
    for text, params, pattern in cases:
        with pytest.raises(aq.ParamsError, match=pattern):
            aq.quantize(x, text, params)
    with pytest.raises(
        aq.ShapeError, match=r"params\.zero_point has shape \(2,\) but scheme .* has scales shaped \(2, 1\)"
    ):
        aq.quantize(x, zp_scheme, aq.QParams(scales=s, zero_point=np.zeros(2, np.uint8)))


def test_calibration_refusals() -> None:
    x = np.ones((2, 32), F32)
    with pytest.raises(aq.SchemeError, match=r"calibration 'absmean' is not defined for the zero_point scheme"):
        aq.quantize(x, "u4:block32:zero_point", calibration="absmean")
    with pytest.raises(aq.SchemeError, match=r"calibration 'absmean' is not defined for the offset scheme"):
        aq.compute_range(x, "u4:block32:offset", "absmean")
    with pytest.raises(aq.SchemeError, match=r"calibration 'mse' is not defined for the offset scheme .* 'minmax'"):
        aq.compute_range(x, "u4:block32:offset", "mse")
    with pytest.raises(aq.ParamsError, match=r"importance weights a calibration search; static params need none"):
        aq.quantize(
            x, "u4:block32:zero_point", aq.QParams(np.ones((2, 1), F32), zero_point=[[0], [0]]), importance=x[0]
        )
    with pytest.raises(
        aq.ParamsError, match=r"importance weights the error of a search; calibration 'minmax' does not"
    ):
        aq.quantize(x, "u4:block32:zero_point", importance=x[0])


def test_nonfinite_input() -> None:
    x = _data((2, 32))
    x[1, 5] = np.nan
    with pytest.raises(aq.NonFiniteInputError):
        aq.quantize(x, "u4:block32:f16:zero_point")
    x[1, 6] = np.inf
    case = Case("u4", "zero_point", (32,), "f16")
    qt = aq.quantize(x, case.text, check_finite=False)
    codes = qt.codes()
    assert int(codes[1, 5]) == int(qt.zero_point[1, 0])  # NaN: the code of 0
    assert int(codes[1, 6]) == 15  # inf saturates
    finite = x.copy()
    finite[1, 5:7] = 0.0
    lo = min(float(np.min(np.where(np.isfinite(x[1]), x[1], np.inf))), 0.0)
    assert float(qt.scales[1, 0]) >= (float(np.nanmax(np.where(np.isfinite(x[1]), x[1], -np.inf))) - lo) / 15


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("u4:block32:f16:zero_point", r"zero_point mode, and Burn's QuantScheme has no zero points or offsets"),
        ("q5f:block32:f16", r"has Q5F values, which Burn's QuantValue does not have"),
        ("q4s:block32:f16:packed_native", r"packs Q4S fields into bytes, which Burn's PackedNative does for E2M1 only"),
    ],
)
def test_burnpack_refuses_what_burn_cannot_hold(text: str, pattern: str) -> None:
    from arrayquant.io.burn.schemes import encode_scheme

    with pytest.raises(aq.SchemeError, match=pattern):
        encode_scheme(text)


# ---------------------------------------------------------------------------------------------
# the text form
# ---------------------------------------------------------------------------------------------


def test_text_form_round_trips_every_value_and_mode() -> None:
    for value in aq.QuantValue:
        for mode in aq.QuantMode:
            scheme = aq.QuantScheme(value=value, mode=mode, block=(aq.BlockSize(32), aq.ScaleDtype.F16))
            text = scheme.spelled_out()
            assert aq.QuantScheme.parse(text) == scheme
            assert text.startswith(value.value + ":block32:f16")
            assert text.endswith("" if mode is aq.QuantMode.SYMMETRIC else mode.value)


def test_gguf_block_names_are_aliases() -> None:
    assert aq.QuantScheme.parse("q4_1") == aq.QuantScheme.parse("u4:block32:f16:offset")
    assert aq.QuantScheme.parse("Q5_1").spelled_out() == "u5:block32:f16:offset"
    assert str(aq.QuantScheme.parse("q5_0")) == "q5f:block32:f16"


# ---------------------------------------------------------------------------------------------
# operations: layout moves carry the zero points and offsets with the scales
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["u4:block1x16:f16:zero_point", "u5:block4x8:bf16:offset:packed_native", "u3:zero_point"]
)
def test_layout_operations_move_the_second_grid(text: str) -> None:
    x = _data((8, 64), seed=9)
    qt = aq.quantize(x, text)
    ref = aq.dequantize(qt)
    zero = qt.zero_point if qt.zero_point is not None else qt.offset
    moves = [
        ("transpose", qt.T, lambda a: a.T),
        ("rows", qt[:4], lambda a: a[: max(a.shape[0] // 2, 1)] if a.shape[0] > 1 else a),
        ("concat", aq.ops.concat([qt, qt]), lambda a: np.concatenate([a, a]) if a.size > 1 else a),
        ("flip", aq.ops.flip(qt, axis=0), lambda a: a[::-1]),
    ]
    for name, got, move in moves:
        # exact moves: codes, scales and the zero points or offsets moved, nothing requantized
        whole = {"concat": lambda a: np.concatenate([a, a]), "rows": lambda a: a[:4]}.get(name, move)
        np.testing.assert_array_equal(got.codes(), whole(qt.codes()), err_msg=name)
        np.testing.assert_array_equal(aq.dequantize(got), whole(ref), err_msg=name)
        got_zero = got.zero_point if got.zero_point is not None else got.offset
        np.testing.assert_array_equal(got_zero, move(zero), err_msg=name)
        np.testing.assert_array_equal(got.scales, move(qt.scales), err_msg=name)


def test_matmul_runs_the_reference_path() -> None:
    x = _data((8, 64), seed=10)
    w = _data((64, 16), seed=11)
    qt = aq.quantize(x, "u4:block1x32:f16:zero_point")
    np.testing.assert_array_equal(aq.ops.matmul(qt, w), aq.dequantize(qt) @ w)
    with pytest.raises(aq.SchemeError, match=r"a is in zero_point mode: its values are not its codes times a scale"):
        aq.ops.matmul(qt, aq.quantize(w, "q8s"), path="int8")
