"""Every error path: the exception type and its message (argument, bad value, fix).

One test per ``raise`` in ``src/arrayquant`` and per case of the error table in docs/spec.md. Tests that
should behave the same on every backend take the ``xp`` fixture; the rest use plain NumPy.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
from typing import Any

import array_api_compat.numpy as np_xp
import numpy as np
import pytest

import arrayquant as aq
import arrayquant.errors as errors_module
from arrayquant.backends import registry
from arrayquant.backends.shim import to_host
from arrayquant.invariants import check_table, plan_for

S = aq.QuantScheme
Q8S = S().with_value("q8s")
TWO_LEVEL = S().per_block([16], "ue4m3").per_tensor("f32").with_value("q8s")


def f32(*values: float) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def is_dask(xp: Any) -> bool:
    return xp.backend.value == "dask"


def skip_lazy(xp: Any, why: str = "value checks run only on eager arrays (docs/spec.md)") -> None:
    if is_dask(xp):
        pytest.skip(why)


# ---------------------------------------------------------------------------------------------
# the hierarchy
# ---------------------------------------------------------------------------------------------

HIERARCHY = {
    "QuantizationError": (ValueError,),
    "SchemeError": ("QuantizationError",),
    "ParamsError": ("QuantizationError",),
    "MissingGlobalScaleError": ("ParamsError",),
    "UnexpectedGlobalScaleError": ("ParamsError",),
    "ShapeError": ("QuantizationError",),
    "PathError": ("ShapeError",),  # a subclass, for code that caught ShapeError for these before
    "NonFiniteInputError": ("QuantizationError",),
    "CorruptDataError": ("QuantizationError",),
    "DTypeError": ("QuantizationError", TypeError),
    "BackendUnavailableError": (ImportError,),
    "DeviceError": (ValueError,),
}


@pytest.mark.parametrize("name", sorted(HIERARCHY))
def test_error_importable_from_both_places(name: str) -> None:
    assert getattr(aq, name) is getattr(errors_module, name)
    assert name in aq.__all__
    assert name in errors_module.__all__


@pytest.mark.parametrize("name", sorted(HIERARCHY))
def test_error_hierarchy(name: str) -> None:
    cls = getattr(aq, name)
    for base in HIERARCHY[name]:
        base_cls = getattr(aq, base) if isinstance(base, str) else base
        assert issubclass(cls, base_cls), f"{name} must subclass {base_cls.__name__}"


@pytest.mark.parametrize("name", ["BackendUnavailableError", "DeviceError"])
def test_backend_and_device_errors_are_not_quantization_errors(name: str) -> None:
    assert not issubclass(getattr(aq, name), aq.QuantizationError)


def test_errors_module_lists_exactly_the_api_errors() -> None:
    assert set(errors_module.__all__) == set(HIERARCHY)


# ---------------------------------------------------------------------------------------------
# SchemeError: names
# ---------------------------------------------------------------------------------------------


def test_unknown_value_name() -> None:
    with pytest.raises(aq.SchemeError, match=r"unknown quantized value 'q9s'; use one of .*'q8s'"):
        S().with_value("q9s")


def test_unknown_value_in_constructor() -> None:
    with pytest.raises(aq.SchemeError, match=r"unknown quantized value 'int8'; use one of .*'q8f'"):
        S(value="int8")


def test_unknown_scale_dtype_name() -> None:
    with pytest.raises(aq.SchemeError, match=r"unknown scale dtype 'fp8'; use one of .*'ue4m3'"):
        S().per_block(32, "fp8")
    with pytest.raises(aq.SchemeError, match=r"unknown scale dtype 'f64'; use one of .*'f32'"):
        S().per_tensor("f64")
    with pytest.raises(aq.SchemeError, match=r"unknown scale dtype 'f8'; use one of .*'bf16'"):
        aq.ScaleDtype.coerce("f8")


def test_unknown_mode_name() -> None:
    with pytest.raises(aq.SchemeError, match=r"unknown quantization mode 'asym'; use one of 'symmetric', 'lookup'"):
        S().with_mode("asym")


def test_unknown_calibration_name() -> None:
    x = np.ones((1, 4), np.float32)
    with pytest.raises(aq.SchemeError, match=r"unknown calibration 'mean'; use one of 'minmax', 'absmean', 'mse'"):
        aq.quantize(x, Q8S, calibration="mean")


def test_unknown_store_name() -> None:
    with pytest.raises(aq.SchemeError, match=r"unknown store 'packed_u64'; use one of 'native', 'packed_u32'"):
        S().with_store("packed_u64")


def test_store_not_a_name() -> None:
    with pytest.raises(aq.SchemeError, match=r"store must be a QuantStore or a name such as 'packed_u32:1', got 3"):
        S().with_store(3)  # type: ignore[arg-type]


def test_store_dim_text_not_a_number() -> None:
    with pytest.raises(
        aq.SchemeError, match=r"store dim in 'packed_u32:x' must be a non-negative integer.*'packed_u32:1'"
    ):
        S().with_store("packed_u32:x")


@pytest.mark.parametrize("dim", [-1, 1.5, True])
def test_store_dim_invalid(dim: Any) -> None:
    with pytest.raises(aq.SchemeError, match=rf"store dim must be an integer >= 0 .*got {re.escape(repr(dim))}"):
        aq.QuantStore.packed_u32(dim)


def test_native_store_with_dim() -> None:
    with pytest.raises(aq.SchemeError, match=r"a native store has no packed axis, so dim must be 0, got 1"):
        aq.QuantStore("native", 1)


def test_unknown_preset_name() -> None:
    # The message should say that the name is neither a value nor a preset, and list the presets.
    with pytest.raises(aq.SchemeError, match=r"'nvfp8'.*nvfp4"):
        S.parse("nvfp8")


# ---------------------------------------------------------------------------------------------
# SchemeError: impossible combinations
# ---------------------------------------------------------------------------------------------


def test_packed_native_with_q8s(xp: Any) -> None:
    x = xp.asarray(np.ones((2, 8), np.float32))
    scheme = Q8S.with_store("packed_native")
    with pytest.raises(
        aq.SchemeError,
        match=r"scheme q8s:packed_native: packed_native packs fields narrower than a byte .* Q8S fields are a byte "
        r"each already; use with_store\('native'\)",
    ):
        aq.quantize(x, scheme)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "ue8m0"])
def test_two_level_with_wide_block_scales(dtype: str) -> None:
    scheme = Q8S.per_block([2], dtype).per_tensor("f32")
    name = dtype.upper()
    with pytest.raises(
        aq.SchemeError,
        match=rf"two-level scheme needs block scales of at most 65504 .*not {name} .*per_block\(size, 'ue4m3'\)",
    ):
        plan_for(scheme)
    with pytest.raises(aq.SchemeError, match=rf"not {name}"):
        aq.quantize(np.ones((1, 4), np.float32), scheme)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "ue4m3", "ue8m0"])
def test_two_level_with_non_f32_tensor_level(dtype: str) -> None:
    scheme = Q8S.per_block([2], "ue4m3").per_tensor(dtype)
    with pytest.raises(
        aq.SchemeError,
        match=rf"per-tensor level of a two-level scheme is stored as F32, not {dtype.upper()}; use per_tensor\('f32'\)",
    ):
        aq.quantize(np.ones((1, 4), np.float32), scheme)


@pytest.mark.parametrize("value", ["e4m3", "e5m2", "e2m1"])
def test_lookup_with_float_value(value: str) -> None:
    scheme = S().with_value(value).with_mode("lookup").with_store("native")
    with pytest.raises(
        aq.SchemeError,
        match=rf"scheme {value}:native:lookup: lookup mode .* needs an integer value, not {value.upper()}; "
        r"use e\.g\. with_value\('q4f'\)",
    ):
        plan_for(scheme)


def test_absmean_with_two_level(xp: Any) -> None:
    x = xp.asarray(np.ones((2, 32), np.float32))
    with pytest.raises(
        aq.SchemeError,
        match=r"calibration 'absmean' is not defined for the two-level scheme q8s:block16:ue4m3:tensor:f32; "
        r"use calibration='minmax'",
    ):
        aq.quantize(x, TWO_LEVEL, calibration="absmean")
    with pytest.raises(aq.SchemeError, match=r"calibration 'absmean' is not defined for the two-level scheme"):
        aq.compute_range(x, TWO_LEVEL, calibration="absmean")


def test_scheme_not_a_scheme() -> None:
    with pytest.raises(
        aq.SchemeError, match=r"scheme must be a QuantScheme \(or text for QuantScheme.parse\), got int"
    ):
        aq.quantize(np.ones(4, np.float32), 42)  # type: ignore[arg-type]


def test_block_level_not_a_pair() -> None:
    with pytest.raises(aq.SchemeError, match=r"block level must be a \(BlockSize, ScaleDtype\) pair, got 5"):
        S(block=5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# SchemeError: block sizes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [0, [4, -1], [0, 32], [2, 1.5]])
def test_block_extent_below_one(dims: Any) -> None:
    shown = re.escape(repr(list(dims) if isinstance(dims, list) else [dims]))
    with pytest.raises(
        aq.SchemeError, match=rf"block extents must be integers >= 1, got {shown}; use 1 for an unblocked"
    ):
        S().per_block(dims)


def test_block_more_than_five_extents() -> None:
    with pytest.raises(
        aq.SchemeError, match=r"block \[2, 2, 2, 2, 2, 2\] has 6 extents after dropping leading 1s; at most 5"
    ):
        aq.BlockSize((2, 2, 2, 2, 2, 2))
    # leading 1s do not count
    assert aq.BlockSize((1, 2, 2, 2, 2, 2)).dims == (2, 2, 2, 2, 2)


@pytest.mark.parametrize("dims", [2.5, True, None])
def test_block_not_int_or_sequence(dims: Any) -> None:
    with pytest.raises(aq.SchemeError, match=rf"block size must be an int or a sequence of ints, got {dims!r}"):
        aq.BlockSize(dims)


def test_block_empty() -> None:
    with pytest.raises(aq.SchemeError, match=r"block size needs at least one extent, e\.g\. BlockSize\(32\)"):
        aq.BlockSize(())


def test_block_is_immutable() -> None:
    with pytest.raises(AttributeError, match="BlockSize is immutable"):
        aq.BlockSize(32)._dims = (16,)  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# SchemeError: options and text form
# ---------------------------------------------------------------------------------------------


def test_unknown_rounding(xp: Any) -> None:
    x = xp.asarray(np.ones((1, 4), np.float32))
    with pytest.raises(aq.SchemeError, match=r"unknown rounding 'half_up'; use 'half_even' \(default\) or 'half_away'"):
        aq.quantize(x, Q8S, rounding="half_up")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("q8s:foo", r"unknown token 'foo' in scheme text 'q8s:foo'; expected block<N>\[:dtype\]"),
        ("q8s:block16:f16:zz", r"unknown token 'zz' in scheme text 'q8s:block16:f16:zz'; expected"),
        ("q8s:blockx", r"bad block token 'blockx' in 'q8s:blockx'; write e\.g\. 'block32' or 'block4x32'"),
        ("q8s:block", r"bad block token 'block' in 'q8s:block'; write e\.g\. 'block32'"),
        ("q8s:block0", r"block extents must be integers >= 1, got \[0\]"),
        ("", r"empty scheme text ''; start with a value such as 'q8s' or a preset"),
        (":block32", r"empty scheme text ':block32'; start with a value"),
        ("q9s", r"unknown quantized value 'q9s'; use one of"),
        ("q8s:block32:fp8", r"unknown token 'fp8' in scheme text 'q8s:block32:fp8'"),
    ],
)
def test_bad_scheme_text(text: str, pattern: str) -> None:
    with pytest.raises(aq.SchemeError, match=pattern):
        S.parse(text)


@pytest.mark.parametrize(
    ("text", "key", "token"),
    [
        ("q8s:block32:block16", "block", "block16"),
        ("q8s:native:packed_u32", "store", "packed_u32"),
        ("q8s:tensor:tensor:f16", "tensor", "tensor"),
        ("q4f:lookup:symmetric", "mode", "symmetric"),
    ],
)
def test_duplicated_scheme_tokens(text: str, key: str, token: str) -> None:
    with pytest.raises(aq.SchemeError, match=rf"scheme text '{text}' sets the {key} twice \(at '{token}'\)"):
        S.parse(text)


def test_scheme_text_not_a_str() -> None:
    with pytest.raises(aq.SchemeError, match=r"scheme text must be a str, got int"):
        S.parse(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("preset", ["nvfp4", "mxfp8", "mxfp4"])
def test_preset_with_modifiers(preset: str) -> None:
    text = f"{preset}:native"
    with pytest.raises(
        aq.SchemeError,
        match=rf"preset '{preset}' takes no modifiers in '{text}'; spell the scheme out .* starting from",
    ):
        S.parse(text)


# ---------------------------------------------------------------------------------------------
# SchemeError: kernels this version does not have
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# ParamsError
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "shown"), [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (-0.5, "-0.5")])
def test_invalid_scale_value(xp: Any, bad: float, shown: str) -> None:
    skip_lazy(xp)
    x = xp.asarray(np.ones((2, 8), np.float32))
    scales = xp.asarray(f32(0.1, 0.2, 0.3, bad).reshape(2, 2))
    with pytest.raises(
        aq.ParamsError,
        match=rf"params\.scales has 1 invalid entry \(first at flat index 3: {shown}\); "
        r"scales must be finite and >= 0, so recompute them",
    ):
        aq.quantize(x, Q8S.per_block(4, "f16"), aq.QParams(scales=scales))


def test_invalid_scale_values_counted(xp: Any) -> None:
    skip_lazy(xp)
    x = xp.asarray(np.ones((1, 8), np.float32))
    scales = xp.asarray(f32(0.1, np.nan, -1.0, 0.2).reshape(1, 4))
    with pytest.raises(aq.ParamsError, match=r"params\.scales has 2 invalid entries \(first at flat index 1: nan\)"):
        aq.quantize(x, Q8S.per_block(2), aq.QParams(scales=scales))


def test_invalid_global_scale_value(xp: Any) -> None:
    skip_lazy(xp)
    x = xp.asarray(np.ones((2, 32), np.float32))
    params = aq.QParams(scales=xp.asarray(np.ones((2, 2), np.float32)), global_scale=xp.asarray(f32(np.inf)))
    with pytest.raises(
        aq.ParamsError, match=r"params\.global_scale has 1 invalid entry \(first at flat index 0: inf\)"
    ):
        aq.quantize(x, TWO_LEVEL, params)


@pytest.mark.parametrize("scheme", [S.nvfp4(), S().with_value("e4m3").with_store("native"), S.mxfp4()])
def test_half_away_with_float_value(xp: Any, scheme: aq.QuantScheme) -> None:
    # check order: the rounding option is refused (ParamsError) before the missing float kernel
    # (SchemeError) is reported.
    x = xp.asarray(np.ones((2, 32), np.float32))
    value = scheme.value.name
    with pytest.raises(
        aq.ParamsError,
        match=rf"rounding='half_away' applies to integer values only; {value} codes always round to nearest even, "
        r"so drop the rounding argument",
    ) as info:
        aq.quantize(x, scheme, rounding="half_away")
    assert not isinstance(info.value, aq.SchemeError)


def test_table_without_lookup_mode(xp: Any) -> None:
    x = xp.asarray(np.ones((1, 4), np.float32))
    table = xp.asarray(np.arange(256, dtype=np.float32))
    msg = r"a table was given but scheme q8s is in symmetric mode; drop the table or use scheme\.with_mode\('lookup'\)"
    with pytest.raises(aq.ParamsError, match=msg):
        aq.quantize(x, Q8S, table=table)
    with pytest.raises(aq.ParamsError, match=msg):
        aq.quantize(x, Q8S, aq.QParams(scales=xp.asarray(f32(0.1)), table=table))


def test_lookup_without_table() -> None:
    # Unreachable through aq.quantize while lookup kernels are missing; the invariant itself:
    plan = plan_for(S().with_value("q4f").with_mode("lookup"))
    with pytest.raises(
        aq.ParamsError, match=r"scheme q4f:lookup is in lookup mode but no table was given; pass table=aq\.NF4"
    ):
        check_table(None, plan, np_xp, "cpu")


@pytest.mark.parametrize("params", [f32(0.1), {"scales": f32(0.1)}, (f32(0.1),)])
def test_params_not_qparams(params: Any) -> None:
    with pytest.raises(
        aq.ParamsError,
        match=rf"params must be an aq\.QParams \(or None for dynamic quantization\), got {type(params).__name__}",
    ):
        aq.quantize(np.ones(4, np.float32), Q8S, params=params)


def test_params_scales_none() -> None:
    with pytest.raises(aq.ParamsError, match=r"params\.scales is None; a q8s scheme needs scales shaped \(1,\)"):
        aq.quantize(np.ones(4, np.float32), Q8S, aq.QParams(scales=None))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_non_float_scales(xp: Any, dtype: Any) -> None:
    x = xp.asarray(np.ones(4, np.float32))
    scales = xp.asarray(np.ones(1, dtype))
    with pytest.raises(
        aq.ParamsError, match=r"params\.scales has dtype \S*(int32|int64|uint8|bool)\S*; scales must be real floating"
    ):
        aq.quantize(x, Q8S, aq.QParams(scales=scales))


def test_non_float_global_scale() -> None:
    params = aq.QParams(scales=np.ones((1, 2), np.float32), global_scale=np.ones(1, np.int64))
    with pytest.raises(aq.ParamsError, match=r"params\.global_scale has dtype int64; scales must be real floating"):
        aq.quantize(np.ones((1, 32), np.float32), TWO_LEVEL, params)


def test_scales_not_convertible() -> None:
    with pytest.raises(aq.ParamsError, match=r"params\.scales must be an array of floats, got 'abc'"):
        aq.quantize(np.ones(4, np.float32), Q8S, aq.QParams(scales="abc"))


def test_round_up_scales_non_float() -> None:
    with pytest.raises(aq.ParamsError, match=r"s has dtype int64; scales must be real floating values"):
        aq.round_up_scales(np.asarray([1, 2], np.int64), "f16")


def test_round_up_scales_negative(xp: Any) -> None:
    skip_lazy(xp)
    with pytest.raises(
        aq.ParamsError, match=r"s has a negative scale at flat index 1 \(-1\.0\); scales are magnitudes, pass abs\(s\)"
    ):
        aq.round_up_scales(xp.asarray(f32(1.0, -1.0)), "f16")


def test_scale_dtype_round_up_negative() -> None:
    with pytest.raises(aq.ParamsError, match=r"scale -1\.0 is negative; scales are magnitudes, so pass abs\(scale\)"):
        aq.ScaleDtype.F16.round_up(-1.0)


def test_dequantize_not_a_quantized_tensor() -> None:
    with pytest.raises(aq.ParamsError, match=r"qt must be an aq\.QuantizedTensor from aq\.quantize, got ndarray"):
        aq.dequantize(np.ones(4, np.float32))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# MissingGlobalScaleError / UnexpectedGlobalScaleError
# ---------------------------------------------------------------------------------------------


def test_missing_global_scale_exact_case(xp: Any) -> None:
    x = xp.asarray(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32))
    s = xp.asarray(np.ones((2, 2), np.float32))
    with pytest.raises(aq.MissingGlobalScaleError) as info:
        aq.quantize(
            x,
            aq.QuantScheme().per_block([16], "ue4m3").per_tensor("f32").with_value("q8s"),
            params=aq.QParams(scales=s),
        )
    message = str(info.value)
    assert "two-level scheme" in message
    assert "per-tensor scale" in message
    assert isinstance(info.value, aq.ParamsError)
    info.match(r"scheme q8s:block16:ue4m3:tensor:f32 is a two-level scheme")
    info.match(r"global_scale is None")
    info.match(r"QParams\(scales=block_scales, global_scale=g\)")


def test_unexpected_global_scale(xp: Any) -> None:
    x = xp.asarray(np.ones((2, 32), np.float32))
    params = aq.QParams(scales=xp.asarray(np.ones((2, 2), np.float32)), global_scale=xp.asarray(f32(1.0)))
    with pytest.raises(
        aq.UnexpectedGlobalScaleError,
        match=r"scheme q8s:block16:f16 has one scale level, but params carries a per-tensor scale \(global_scale\) "
        r".*drop global_scale, or make the scheme two-level",
    ):
        aq.quantize(x, Q8S.per_block(16, "f16"), params)


# ---------------------------------------------------------------------------------------------
# ShapeError
# ---------------------------------------------------------------------------------------------


def test_wrong_scale_grid_shape(xp: Any) -> None:
    x = xp.asarray(np.ones((2, 32), np.float32))
    params = aq.QParams(scales=xp.asarray(np.ones((2, 1), np.float32)))
    with pytest.raises(
        aq.ShapeError,
        match=r"params\.scales has shape \(2, 1\) but scheme q8s:block16:f16 on data of shape \(2, 32\) needs \(2, 2\) "
        r"\(one scale per block of 16\); recompute them with aq\.compute_q_params",
    ):
        aq.quantize(x, Q8S.per_block(16, "f16"), params)


def test_wrong_per_tensor_scale_shape(xp: Any) -> None:
    x = xp.asarray(np.ones((2, 32), np.float32))
    params = aq.QParams(scales=xp.asarray(np.ones((2,), np.float32)))
    with pytest.raises(
        aq.ShapeError,
        match=r"params\.scales has shape \(2,\) but scheme q8s on data of shape \(2, 32\) needs \(1,\) "
        r"\(one per-tensor scale\)",
    ):
        aq.quantize(x, Q8S, params)


def test_global_scale_with_two_elements(xp: Any) -> None:
    x = xp.asarray(np.ones((2, 32), np.float32))
    params = aq.QParams(scales=xp.asarray(np.ones((2, 2), np.float32)), global_scale=xp.asarray(f32(1.0, 2.0)))
    with pytest.raises(
        aq.ShapeError,
        match=r"params\.global_scale must hold exactly one element \(the per-tensor scale\), got shape \(2,\)",
    ):
        aq.quantize(x, TWO_LEVEL, params)


def test_block_of_higher_rank_than_data(xp: Any) -> None:
    x = xp.asarray(np.ones(8, np.float32))
    with pytest.raises(
        aq.ShapeError,
        match=r"block \[2, 4\] has 2 extents but the data has rank 1; use a block with at most as many extents",
    ):
        aq.quantize(x, Q8S.per_block([2, 4], "f16"))
    with pytest.raises(aq.ShapeError, match=r"block \[2, 4\] has 2 extents but the data has rank 1"):
        aq.BlockSize([2, 4]).to_dims(1)


def test_zero_d_input(xp: Any) -> None:
    x = xp.asarray(np.asarray(1.0, dtype=np.float32))
    with pytest.raises(
        aq.ShapeError, match=r"x is 0-d; quantize at least a 1-d array, e\.g\. xp\.reshape\(x, \(1,\)\)"
    ):
        aq.quantize(x, Q8S)


def test_empty_input(xp: Any) -> None:
    x = xp.asarray(np.ones((0, 4), np.float32))
    with pytest.raises(
        aq.ShapeError, match=r"x has shape \(0, 4\) with no elements; there is nothing to calibrate or quantize"
    ):
        aq.quantize(x, Q8S)


def test_unknown_shape_dask() -> None:
    da = pytest.importorskip("dask.array")
    x = da.from_array(f32(1.0, -2.0, 3.0, 4.0), chunks=2)
    x = x[x > 0]  # dask marks the unknown length as nan
    with pytest.raises(aq.ShapeError, match=r"x has an unknown shape .*compute_chunk_sizes\(\)"):
        aq.quantize(x, Q8S)


def test_packed_dim_not_below_rank(xp: Any) -> None:
    x = xp.asarray(np.ones(8, np.float32))
    with pytest.raises(
        aq.ShapeError,
        match=r"store packed_u32:1 packs axis rank-1-dim = -1, which does not exist for rank-1 data; use a dim below 1",
    ):
        aq.quantize(x, Q8S.with_store("packed_u32:1"))


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        (
            np.zeros((1, 2), np.uint32),
            r"values of dtype uint32 and shape \(1, 2\) do not fit scheme q8s for data of "
            r"shape \(1, 4\): expected uint32 \(1, 1\)",
        ),
        (
            np.zeros((1, 1), np.int32),
            r"values of dtype int32 and shape \(1, 1\) do not fit scheme q8s .*"
            r"expected uint32 \(1, 1\)",
        ),
    ],
)
def test_unpack_wrong_values(values: np.ndarray, pattern: str) -> None:
    with pytest.raises(aq.ShapeError, match=pattern):
        aq.unpack(values, "q8s", (1, 4))


def test_unpack_wrong_values_on_backends(xp: Any) -> None:
    values = xp.asarray(np.zeros((2, 3), np.int8))
    with pytest.raises(aq.ShapeError, match=r"values of dtype \S*int8 and shape \(2, 3\) do not fit scheme q8s:native"):
        aq.unpack(values, "q8s:native", (2, 4))


def test_unpack_shape_without_axes() -> None:
    # The message should show the bad shape, not only say what is wrong.
    with pytest.raises(aq.ShapeError, match=r"shape .*\(\).*at least one axis|shape must have at least one axis.*\(\)"):
        aq.unpack(np.zeros((1, 1), np.uint32), "q8s", ())


def test_pack_zero_d_codes() -> None:
    # The message should show the bad shape, not only say what is wrong.
    with pytest.raises(aq.ShapeError, match=r"codes .*at least one axis.*\(\)|codes .*\(\).*at least one axis"):
        aq.pack(np.zeros((), np.int8), "q8s")


def test_dequantize_values_that_do_not_fit() -> None:
    qt = aq.quantize(np.ones((2, 8), np.float32), "q4s")
    bad = dataclasses.replace(qt, values=np.zeros((2, 2), np.uint32))
    with pytest.raises(
        aq.ShapeError,
        match=r"values of dtype uint32 and shape \(2, 2\) do not fit scheme q4s for data of shape \(2, 8\): "
        r"expected uint32 \(2, 1\)",
    ):
        aq.dequantize(bad)


def test_compute_q_params_min_max_shape_mismatch(xp: Any) -> None:
    lo = xp.asarray(np.zeros((1, 2), np.float32))
    hi = xp.asarray(np.ones((1, 3), np.float32))
    with pytest.raises(
        aq.ShapeError, match=r"min has shape \(1, 2\) but max has \(1, 3\); pass both from compute_range"
    ):
        aq.compute_q_params("q8s:block2", lo, hi)


def test_lookup_table_of_wrong_shape() -> None:
    # Unreachable through aq.quantize while lookup kernels are missing; the invariant itself:
    plan = plan_for(S().with_value("q4f").with_mode("lookup"))
    with pytest.raises(aq.ShapeError, match=r"table has shape \(8,\); a 4-bit lookup needs exactly \(16,\) entries"):
        check_table(np.zeros(8, np.float32), plan, np_xp, "cpu")


# ---------------------------------------------------------------------------------------------
# NonFiniteInputError, and the unchecked rule
# ---------------------------------------------------------------------------------------------

NONFINITE_FIX = (
    r"quantization computes in float32, so clean or rescale the data "
    r"\(e\.g\. xp\.where\(xp\.isfinite\(x\), x, 0\)\) or pass check_finite=False"
)


def test_nan_input(xp: Any) -> None:
    skip_lazy(xp, "dask checks when computed: see test_nonfinite_dask")
    x = xp.asarray(f32(1, 2, np.nan, 4, 5, np.nan).reshape(3, 2))
    with pytest.raises(
        aq.NonFiniteInputError,
        match=rf"x has 2 non-finite element\(s\) \(first at index \(1, 0\): nan\); {NONFINITE_FIX}",
    ):
        aq.quantize(x, Q8S)


def test_inf_input(xp: Any) -> None:
    skip_lazy(xp, "dask checks when computed: see test_nonfinite_dask")
    x = xp.asarray(f32(1, -np.inf, 2, np.inf))
    with pytest.raises(
        aq.NonFiniteInputError,
        match=rf"x has 2 non-finite element\(s\) \(first at index \(1,\): -inf\); {NONFINITE_FIX}",
    ):
        aq.quantize(x, Q8S)


def test_nonfinite_input_per_block(xp: Any) -> None:
    skip_lazy(xp, "dask checks when computed: see test_nonfinite_dask")
    x = xp.asarray(f32(1, 2, 3, 4, 5, 6, 7, np.inf).reshape(2, 4))
    with pytest.raises(
        aq.NonFiniteInputError, match=r"x has 1 non-finite element\(s\) \(first at index \(1, 3\): inf\)"
    ):
        aq.quantize(x, Q8S.per_block(2, "f16"))


def test_nonfinite_input_static(xp: Any) -> None:
    skip_lazy(xp, "dask checks when computed: see test_nonfinite_dask")
    x = xp.asarray(f32(1, np.nan))
    with pytest.raises(aq.NonFiniteInputError, match=r"x has 1 non-finite element\(s\) \(first at index \(1,\): nan\)"):
        aq.quantize(x, Q8S, aq.QParams(scales=xp.asarray(f32(0.1))))


def test_nonfinite_dask() -> None:
    da = pytest.importorskip("dask.array")
    x = da.from_array(f32(1.0, 2.0, 3.0, 4.0, 5.0, np.inf, np.nan, 8.0), chunks=4)
    qt = aq.quantize(x, Q8S)  # lazy: nothing is read yet
    with pytest.raises(
        aq.NonFiniteInputError,
        match=r"x has 2 non-finite element\(s\) in its chunk starting at \(4,\), found when the dask graph ran "
        r"\(first at index \(5,\): inf\); .*check_finite=False",
    ):
        qt.values.compute()


NONFINITE = [1.0, np.inf, -np.inf, np.nan, -1.0, 0.5, 0.0, 2.0, float(np.copysign(np.nan, -1.0))]


@pytest.mark.parametrize(
    ("value", "codes"),
    [
        ("q8s", [2, 127, -127, 0, -2, 1, 0, 4, 0]),
        ("q8f", [2, 127, -128, 0, -2, 1, 0, 4, 0]),
        ("q4s", [2, 7, -7, 0, -2, 1, 0, 4, 0]),
        ("q4f", [2, 7, -8, 0, -2, 1, 0, 4, 0]),
        ("q2s", [1, 1, -1, 0, -1, 1, 0, 1, 0]),
        ("q2f", [1, 1, -2, 0, -2, 1, 0, 1, 0]),
    ],
)
@pytest.mark.parametrize("store", ["native", "packed_u32"])
def test_unchecked_static_codes_exact(xp: Any, value: str, codes: list[int], store: str) -> None:
    """check_finite=False: +-inf saturate to the range ends, NaN (either sign) gives code 0."""
    x = xp.asarray(np.asarray(NONFINITE, np.float32).reshape(1, -1))
    qt = aq.quantize(x, f"{value}:{store}", aq.QParams(scales=xp.asarray(f32(0.5))), check_finite=False)
    got = np.asarray(to_host(qt.codes()))
    assert got.dtype == np.int8
    assert got.tolist() == [codes]


@pytest.mark.parametrize("scheme", ["q8s", "q8s:block4:f16", "q4s:block2:f32:native"])
def test_unchecked_dynamic_saturates(scheme: str) -> None:
    """Dynamic quantization with check_finite=False: the same rule (docs/spec.md, non-finite input).

    +-inf must give the range ends and NaN code 0; the stored scales must stay finite (the
    non-finite elements must not poison the calibration of their block).
    """
    x = np.asarray(NONFINITE[:8], np.float32)
    qt = aq.quantize(x, scheme, check_finite=False)
    codes = np.asarray(qt.codes())
    a, b = aq.QuantScheme.parse(scheme).value.range
    assert codes[1] == b, f"+inf gave code {codes[1]}, not {b}"
    # With blocks of 2, -inf shares its block only with NaN: no finite value, so the block's
    # scale is 0 and the zero-scale rule (every code 0) takes precedence over saturation.
    expected_neg = 0 if "block2" in scheme else a
    assert codes[2] == expected_neg, f"-inf gave code {codes[2]}, not {expected_neg}"
    assert codes[3] == 0
    assert np.isfinite(np.asarray(qt.scales)).all(), f"stored scales {np.asarray(qt.scales)} are not finite"


# ---------------------------------------------------------------------------------------------
# DTypeError
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_non_float_input(xp: Any, dtype: Any) -> None:
    x = xp.asarray(np.ones(4, dtype))
    with pytest.raises(
        aq.DTypeError,
        match=r"x has dtype \S*(int32|int64|uint8|bool)\S*, but quantization needs a real floating array; "
        r"cast it first, e\.g\. xp\.astype\(x, xp\.float32\)",
    ) as info:
        aq.quantize(x, Q8S)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, aq.QuantizationError)
    with pytest.raises(aq.DTypeError, match=r"x has dtype \S*(int32|int64|uint8|bool)"):
        aq.compute_range(x, Q8S)


def test_complex_input() -> None:
    with pytest.raises(aq.DTypeError, match=r"x has dtype complex64, but quantization needs a real floating array"):
        aq.quantize(np.ones(4, np.complex64), Q8S)


@pytest.mark.parametrize("obj", [[1.0, 2.0], (1.0,), 3.0, "abc"])
def test_non_array_input(obj: Any) -> None:
    with pytest.raises(
        aq.DTypeError,
        match=rf"x must be an Array API array \(numpy, cupy, torch, jax, dask, array-api-strict\), "
        rf"got {type(obj).__name__}; convert it with aq\.asarray\(x\)",
    ) as info:
        aq.quantize(obj, Q8S)
    assert isinstance(info.value, TypeError)


def test_non_array_min_max() -> None:
    with pytest.raises(
        aq.DTypeError, match=r"min must be an Array API array .*got list; convert it with aq\.asarray\(min\)"
    ):
        aq.compute_q_params("q8s", [0.0], [1.0])


def test_dequantize_to_int_dtype(xp: Any) -> None:
    qt = aq.quantize(xp.asarray(np.ones((1, 4), np.float32)), Q8S)
    with pytest.raises(
        aq.DTypeError, match=r"dtype .*int32.* is not a real floating dtype of \S+; dequantize to e\.g\. xp\.float32"
    ) as info:
        aq.dequantize(qt, xp.int32)
    assert isinstance(info.value, TypeError)


def test_pack_wrong_code_dtype() -> None:
    with pytest.raises(
        aq.DTypeError, match=r"codes must be .*int8.* for Q8S, got int32; use QuantizedTensor\.codes\(\)"
    ):
        aq.pack(np.zeros((1, 4), np.int32), "q8s")


# ---------------------------------------------------------------------------------------------
# DeviceError
# ---------------------------------------------------------------------------------------------


def test_scales_on_another_device() -> None:
    xs = pytest.importorskip("array_api_strict")
    x = xs.asarray([[1.0, 2.0, 3.0, 4.0]])
    scales = xs.asarray([0.1], device=xs.Device("device1"))
    with pytest.raises(
        aq.DeviceError,
        match=r"params\.scales is on device array_api_strict\.Device\('device1'\) but the data is on "
        r"array_api_strict\.Device\('CPU_DEVICE'\); move it with aq\.asarray\(params\.scales, device=\.\.\.\)",
    ) as info:
        aq.quantize(x, Q8S, aq.QParams(scales=scales))
    assert isinstance(info.value, ValueError)


def test_global_scale_on_another_device() -> None:
    xs = pytest.importorskip("array_api_strict")
    x = xs.ones((1, 16))
    params = aq.QParams(scales=xs.ones((1, 1)), global_scale=xs.ones((1,), device=xs.Device("device1")))
    with pytest.raises(aq.DeviceError, match=r"global_scale is on device array_api_strict\.Device\('device1'\)"):
        aq.quantize(x, TWO_LEVEL, params)


def test_min_max_on_different_devices() -> None:
    xs = pytest.importorskip("array_api_strict")
    with pytest.raises(aq.DeviceError, match=r"max is on device array_api_strict\.Device\('device1'\)"):
        aq.compute_q_params("q8s", xs.asarray([0.0]), xs.asarray([1.0], device=xs.Device("device1")))


def test_scales_of_another_namespace() -> None:
    xs = pytest.importorskip("array_api_strict")
    x = xs.asarray([[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(
        aq.DeviceError,
        match=r"params\.scales is a numpy\.ndarray but the data lives in array_api_strict; move it there first, "
        r"e\.g\. aq\.asarray\(params\.scales, backend=\.\.\.\)",
    ):
        aq.quantize(x, Q8S, aq.QParams(scales=f32(0.1)))


def test_scales_of_another_namespace_on_backends(xp: Any) -> None:
    if xp.backend.value == "numpy":
        pytest.skip("numpy scales are of the data's own namespace here")
    x = xp.asarray(np.ones((1, 4), np.float32))
    with pytest.raises(
        aq.DeviceError, match=r"scales is a numpy\.ndarray but the data lives in \S+; move it there first"
    ):
        aq.quantize(x, Q8S, aq.QParams(scales=f32(0.1)))


@pytest.mark.parametrize(
    ("backend", "device", "pattern"),
    [
        ("numpy", "cuda:3", r"device 'cuda:3' is not available to backend 'numpy'; its devices are \['cpu'\]"),
        ("numpy", "gpu", r"device 'gpu' is not available to backend 'numpy'; its devices are \['cpu'\]"),
        ("numpy", "cuda:x", r"device 'cuda:x' is not understood; use 'cpu', 'cuda' or 'cuda:N'"),
        (
            "array_api_strict",
            "device7",
            r"device 'device7' is not available to backend 'array_api_strict'; "
            r"its devices are \['cpu', 'device1'",
        ),
    ],
)
def test_unknown_device_string(backend: str, device: str, pattern: str) -> None:
    if not aq.backends.probe(backend).usable:
        pytest.skip(f"{backend} is not usable here")
    with pytest.raises(aq.DeviceError, match=pattern):
        aq.asarray([1.0], backend=backend, device=device)


# ---------------------------------------------------------------------------------------------
# BackendUnavailableError
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_probe() -> Any:
    registry.probe.cache_clear()
    yield
    registry.probe.cache_clear()


def test_unknown_backend_name() -> None:
    with pytest.raises(
        aq.BackendUnavailableError,
        match=r"unknown backend 'mxnet'; known backends are numpy, cupy, torch, jax, dask, array_api_strict",
    ) as info:
        aq.backends.get("mxnet")
    assert isinstance(info.value, ImportError)
    with pytest.raises(aq.BackendUnavailableError, match=r"unknown backend 'mxnet'"):
        aq.asarray([1.0], backend="mxnet")


def test_backend_not_installed() -> None:
    missing = [info for info in aq.backends.available() if not info.installed]
    if not missing:
        pytest.skip("every known backend is installed here")
    info = missing[0]
    assert not info.usable
    assert info.reason.startswith(f"{info.name} is not installed; pip install")
    with pytest.raises(aq.BackendUnavailableError, match=rf"{info.name} is not installed; pip install \S+"):
        aq.backends.get(info.name)


def test_cupy_not_installed_hint(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real = registry._installed
    monkeypatch.setattr(registry, "_installed", lambda name: False if name == "cupy" else real(name))
    with pytest.raises(aq.BackendUnavailableError, match=r"cupy is not installed; pip install 'arrayquant\[gpu\]'"):
        aq.backends.get("cupy")


def _cupy_unusable(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    real_installed, real_devices = registry._installed, registry._devices

    def installed(name: str) -> bool:
        return True if name == "cupy" else real_installed(name)

    def devices(name: str) -> tuple[str, ...]:
        if name == "cupy":
            raise error
        return real_devices(name)

    monkeypatch.setattr(registry, "_installed", installed)
    monkeypatch.setattr(registry, "_devices", devices)


def test_cupy_installed_but_unusable(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    _cupy_unusable(monkeypatch, RuntimeError("no CUDA driver"))
    info = {b.name: b for b in aq.backends.available()}["cupy"]
    assert info.installed is True
    assert info.usable is False
    assert info.devices == ()
    assert info.reason == "cupy is installed but unusable: RuntimeError: no CUDA driver"
    with pytest.raises(
        aq.BackendUnavailableError, match=r"cupy is installed but unusable: RuntimeError: no CUDA driver"
    ):
        aq.backends.get("cupy")
    # without the env var, default() passes over the unusable GPU backend
    monkeypatch.delenv("ARRAYQUANT_BACKEND", raising=False)
    assert aq.backends.default().name == "numpy"


def test_cupy_reporting_no_gpu(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake cupy whose runtime reports zero devices: the registry's own "no GPU" path
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 0))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    real = registry._installed
    monkeypatch.setattr(registry, "_installed", lambda name: True if name == "cupy" else real(name))
    with pytest.raises(
        aq.BackendUnavailableError, match=r"cupy is installed but unusable: RuntimeError: CUDA reports no GPU"
    ):
        aq.backends.get("cupy")


def test_env_var_names_unusable_backend(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    _cupy_unusable(monkeypatch, RuntimeError("no CUDA driver"))
    monkeypatch.setenv("ARRAYQUANT_BACKEND", "cupy")
    with pytest.raises(
        aq.BackendUnavailableError,
        match=r"ARRAYQUANT_BACKEND='cupy' cannot be used: "
        r"cupy is installed but unusable: RuntimeError: no CUDA driver; unset it or install the backend",
    ):
        aq.backends.default()


def test_env_var_names_unknown_backend(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARRAYQUANT_BACKEND", "nope")
    with pytest.raises(
        aq.BackendUnavailableError,
        match=r"ARRAYQUANT_BACKEND='nope' cannot be used: unknown backend 'nope'; known backends are .*; unset it",
    ):
        aq.backends.default()


def test_env_var_used_by_asarray(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    _cupy_unusable(monkeypatch, RuntimeError("no CUDA driver"))
    monkeypatch.setenv("ARRAYQUANT_BACKEND", "cupy")
    with pytest.raises(aq.BackendUnavailableError, match=r"ARRAYQUANT_BACKEND='cupy' cannot be used"):
        aq.asarray([1.0, 2.0])


# ---------------------------------------------------------------------------------------------
# CorruptDataError and the byte-layout errors (aq.from_bytes; see test_public_api)
# ---------------------------------------------------------------------------------------------


def test_from_bytes_wrong_length() -> None:
    scheme = S.parse("q8s:block4:ue4m3:tensor:f32:native")
    assert aq.quantized_nbytes(scheme, (8,)) == 14
    with pytest.raises(aq.CorruptDataError, match=r"(?s)buf.*13.*14|buf.*14.*13"):
        aq.from_bytes(bytes(13), scheme, (8,))
    with pytest.raises(aq.CorruptDataError, match=r"(?s)buf.*15.*14|buf.*14.*15"):
        aq.from_bytes(bytes(15), scheme, (8,))


def test_from_bytes_missing_global_scale() -> None:
    scheme = S.parse("q8s:block4:ue4m3:tensor:f32:native")
    with pytest.raises(aq.MissingGlobalScaleError) as info:
        aq.from_bytes(bytes(10), scheme, (8,))
    assert "two-level scheme" in str(info.value)
    assert "per-tensor scale" in str(info.value)
