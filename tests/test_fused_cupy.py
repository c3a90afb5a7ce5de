"""The fused CuPy kernels (``arrayquant.fused.cupy_kernels``) against the portable path, bit for bit.

Three layers:

* always: the module imports without CuPy, ``supports`` gives its reasons, the CUDA sources are
  well formed (no template placeholder left, one uniquely named kernel each, balanced);
* with a C++ compiler (no GPU needed): the very CUDA sources compiled as C++ (the intrinsics
  ``__fdiv_rn`` etc. as plain IEEE f32 operations, ``-ffp-contract=off``) and run one "thread" at a
  time behind a stand-in ``cupy`` over NumPy, so the wrappers and the kernels' steps are checked
  against the portable path on NumPy across the schemes;
* with CuPy and a CUDA device: the real kernels against the portable path on NumPy (bit for bit)
  and on CuPy with ``ARRAYQUANT_FUSED_GPU=0`` (codes exactly; scales after flushing subnormals,
  which CuPy's own kernels flush and these kernels keep).
"""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.fused import cupy_kernels as ck
from arrayquant.invariants import plan_for
from arrayquant.scheme import QuantScheme
from arrayquant.tensor import QuantizedTensor

from .cuda_on_host import compile_kernels, compiler

SCHEMES = [
    "q8s",
    "q8f:native",
    "q4s",
    "q4f:native",
    "q2s",
    "q2f",
    "q8s:block32:f16:native",
    "q4s:block32:f16",
    "q4f:block16:bf16",
    "q2s:block8:ue4m3",
    "q2f:block8:ue8m0:native",
    "q8f:block7:f32",
    "q8s:block4:ue4m3:tensor:f32:native",
    "q4s:block16:f16:tensor:f32",
    "q2s:block4:ue4m3:tensor:f32:native",
    "mxfp8",
    "mxfp4",
    "nvfp4",
    "e4m3",
    "e5m2:native",
    "e4m3:block32:f16:native",
    "e5m2:block32:bf16:native",
    "e4m3:block32:ue8m0:native:ocp",
    "e2m1:block32:ue8m0:packed_native:ocp",
    "e2m1:block16:ue4m3",
    "e4m3:block16:ue4m3:tensor:f32:native",
]
KINDS = ["normal", "heavy", "zeros", "ties", "tiny", "subnormal", "huge", "equal", "pow2", "top"]
SHAPES = [(70,), (3, 70), (2, 3, 33)]


def _data(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "heavy":  # Student t with 1.5 degrees of freedom: rare huge values
        return rng.standard_t(1.5, shape).astype(np.float32)
    if kind == "zeros":  # whole zero blocks and rows, and -0.0
        x = rng.standard_normal(shape).astype(np.float32)
        x[..., : shape[-1] // 2] = 0.0
        x.reshape(-1, shape[-1])[::2] = -0.0
        return x
    if kind == "ties":  # multiples of 1/8 up to 31.75: q8s's scale 0.25 makes x / s exact halves
        x = (rng.integers(-254, 255, shape) / 8).astype(np.float32)
        x.reshape(-1)[::16] = 31.75
        return x
    if kind == "tiny":
        return (rng.standard_normal(shape) * 1e-30).astype(np.float32)
    if kind == "subnormal":
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(1e-41)
        x.reshape(-1, shape[-1])[1::2] *= np.float32(1e5)
        return x
    if kind == "huge":  # near the top of f32
        return (rng.uniform(-1, 1, shape) * 3.4e38).astype(np.float32)
    if kind == "equal":  # all-equal blocks
        return np.full(shape, -2.5, dtype=np.float32)
    if kind == "pow2":  # block maxima exact powers of two (the OCP floor's exact case)
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        x.reshape(-1)[::8] = -4.0
        return x
    if kind == "top":  # the f32 maximum itself: two-level effective scales saturate
        x = (rng.uniform(-1, 1, shape) * 3.0e38).astype(np.float32)
        x.reshape(-1)[::5] = np.finfo(np.float32).max
        return x
    raise AssertionError(kind)


def _portable(x, scheme, monkeypatch, rounding="half_even"):
    with monkeypatch.context() as m:
        m.setenv("ARRAYQUANT_FUSED", "0")
        m.setenv("ARRAYQUANT_FUSED_GPU", "0")
        return aq.quantize(x, scheme, rounding=rounding)


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------------------------------------
# always


def test_module_imports_without_cupy_and_is_unverified():
    assert ck.VERIFIED is False
    assert "--fmad=false" in ck.OPTIONS
    assert "--ftz=false" in ck.OPTIONS
    assert "--prec-div=true" in ck.OPTIONS
    assert "ARRAYQUANT_FUSED_GPU=1" in (ck.__doc__ or "")


@pytest.mark.parametrize(
    ("scheme", "shape", "reason"),
    [
        ("q8s", (4, 8), ""),
        ("nvfp4", (2, 3, 40), ""),
        ("mxfp4", (64,), ""),
        ("e2m1:block32:ue8m0:packed_native:ocp", (2, 64), ""),
        ("q4f:block32:lookup", (2, 64), "lookup mode is not fused"),
        ("q2s:block4x8:f32:native", (8, 16), "blocks spanning more than the last axis are not fused"),
        ("q4s:block4:bf16:packed_u32:1", (4, 8), "packing along an axis other than the last is not fused"),
        ("q8s", (), "0-d data is not fused"),
    ],
)
def test_supports_reasons(scheme, shape, reason):
    assert ck.supports(plan_for(QuantScheme.parse(scheme)), shape) == reason


def test_block_clamped_to_a_unit_axis_is_covered():
    # a 4x8 block over data with one row is a 1x8 block: covered
    assert ck.supports(plan_for(QuantScheme.parse("q2s:block4x8:f32:native")), (1, 16)) == ""


def test_kernel_sources_are_well_formed():
    sources = ck.kernel_sources()
    assert sorted(sources) == sorted(
        ["aq_absmax", "aq_global", "aq_scales", "aq_encode_u8", "aq_encode_u32", "aq_decode_u8", "aq_decode_u32"]
    )
    for name, src in sources.items():
        assert "$" not in src, name  # every template placeholder filled
        assert ck.kernel_names(src) == [name], name  # one kernel, named as registered
        code = re.sub(r"//[^\n]*", "", src)  # comments quote half-open ranges: "[a, b)"
        assert code.count("{") == code.count("}"), name
        assert code.count("(") == code.count(")"), name
        for fn in ("aq_round_up", "aq_effective", "aq_int_code", "aq_minifloat"):
            assert len(re.findall(rf"__device__ \w+( \w+)? {fn}\(", src)) == 1, (name, fn)
        # no bare f32 operator between floats would be guarded by --fmad=false alone: the steps use
        # the correctly rounded intrinsics
        assert "__fmul_rn" in src
        assert "__fdiv_rn" in src


# ---------------------------------------------------------------------------------------------
# the CUDA sources as C++ on the CPU, behind a stand-in cupy


@pytest.fixture(scope="module")
def host_cupy(tmp_path_factory):
    if compiler() is None:
        pytest.skip("no C++ compiler to run the CUDA sources on the CPU")
    kernels = compile_kernels(ck.kernel_sources(), tmp_path_factory.mktemp("cuda_as_cpp"))

    fake = types.SimpleNamespace(
        ndarray=np.ndarray,
        float32=np.float32,
        empty=np.empty,
        zeros=np.zeros,
        ones=np.ones,
        asarray=np.asarray,
        ascontiguousarray=np.ascontiguousarray,
        asnumpy=np.asarray,
        max=lambda a: np.asarray(np.max(a)),
        RawKernel=lambda code, name, options: kernels[name],
    )
    return fake


@pytest.fixture
def on_host(host_cupy, monkeypatch):
    monkeypatch.setattr(ck, "_cupy", lambda: host_cupy)
    ck._kernel.cache_clear()
    yield
    ck._kernel.cache_clear()


def _check_quantize(x, scheme, rounding, got, monkeypatch):
    ref = _portable(x, scheme, monkeypatch, rounding)
    assert got is not None, scheme
    values, scales, glob = (np.asarray(a) if a is not None else None for a in got)
    want_v = np.asarray(ref.values)
    assert values.dtype == want_v.dtype, scheme
    assert values.shape == want_v.shape, scheme
    np.testing.assert_array_equal(values, want_v, err_msg=scheme)
    np.testing.assert_array_equal(_bits(scales), _bits(ref.scales), err_msg=scheme)
    assert scales.shape == tuple(ref.scales.shape)
    if ref.global_scale is None:
        assert glob is None
    else:
        np.testing.assert_array_equal(_bits(glob), _bits(ref.global_scale), err_msg=scheme)


def _check_dequantize(qt, got, monkeypatch):
    with monkeypatch.context() as m:  # the portable path's result, not a fused kernel's
        m.setenv("ARRAYQUANT_FUSED", "0")
        m.setenv("ARRAYQUANT_FUSED_GPU", "0")
        want = np.asarray(aq.dequantize(qt, "float32"))
    assert got is not None
    assert got.dtype == np.float32
    assert got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cuda_source_on_host_matches_portable(scheme, on_host, monkeypatch):
    plan = plan_for(QuantScheme.parse(scheme))
    for k, kind in enumerate(KINDS):
        shape = SHAPES[k % len(SHAPES)]
        x = _data(kind, shape, k)
        roundings = ("half_even", "half_away") if not plan.value.is_float else ("half_even",)
        for rounding in roundings:
            got = ck.quantize(x, plan, rounding)
            _check_quantize(x, scheme, rounding, got, monkeypatch)
        qt = _portable(x, scheme, monkeypatch)
        _check_dequantize(qt, ck.dequantize(qt.values, qt.scales, qt.global_scale, plan, shape), monkeypatch)


@pytest.mark.parametrize("scheme", ["q4s", "e4m3"])
def test_cuda_source_on_host_long_rows_per_tensor(scheme, on_host, monkeypatch):
    # rows longer than one pass-1 piece: the maximum sits in the second piece of the last row
    x = _data("normal", (2, 5000), 5)
    x[1, 4500] = -9.75
    plan = plan_for(QuantScheme.parse(scheme))
    _check_quantize(x, scheme, "half_even", ck.quantize(x, plan, "half_even"), monkeypatch)


def test_cuda_source_on_host_non_contiguous_and_nonfinite(on_host, monkeypatch):
    plan = plan_for(QuantScheme.parse("q4s:block16:f16"))
    x = _data("normal", (40, 66), 3)[::2, 1:]  # strided rows, odd row length (word padding)
    _check_quantize(x, "q4s:block16:f16", "half_even", ck.quantize(x, plan, "half_even"), monkeypatch)
    for bad in (np.nan, np.inf, -np.inf):
        y = _data("normal", (3, 70), 4)
        y[1, 5] = bad
        assert ck.quantize(y, plan, "half_even") is None
    assert ck.quantize(x.astype(np.float16), plan, "half_even") is None  # other dtypes: the portable path


@pytest.mark.parametrize("scheme", ["nvfp4", "q8s:block16:f16:tensor:f32:native", "e4m3:block32:ue8m0:native:ocp"])
def test_cuda_source_on_host_many_blocks(scheme, on_host, monkeypatch):
    # many blocks of varied range: the normalisation by the global and the scale round-up see
    # thousands of distinct values
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((48, 256)) * np.exp2(rng.integers(-30, 30, (48, 1)))).astype(np.float32)
    plan = plan_for(QuantScheme.parse(scheme))
    _check_quantize(x, scheme, "half_even", ck.quantize(x, plan, "half_even"), monkeypatch)


@pytest.mark.parametrize("scheme", ["e5m2:native", "e4m3:block8:f32:native", "mxfp8", "e2m1:block8:f16:native"])
def test_cuda_source_on_host_decodes_every_code(scheme, on_host, monkeypatch):
    # hand-built values: NaN and inf codes, stray high bits of native E2M1 bytes, scales large
    # enough that the portable path saturates at the f32 maximum
    plan = plan_for(QuantScheme.parse(scheme))
    shape = (4, 64)
    values = np.arange(256, dtype=np.uint8).reshape(shape)
    grid = plan.grid_shape(shape)
    scales = np.full(grid, 2.0**120 if plan.scale_dtype.name != "F16" else 4.0, dtype=np.float32)
    qt = QuantizedTensor(plan.scheme, shape, np.float32, values, scales, None, None)
    _check_dequantize(qt, ck.dequantize(values, scales, None, plan, shape), monkeypatch)


def test_cuda_source_on_host_declines_wrong_values(on_host):
    plan = plan_for(QuantScheme.parse("q4s"))
    assert ck.dequantize(np.zeros((3, 8), np.uint8), np.ones(1, np.float32), None, plan, (3, 8)) is None


# ---------------------------------------------------------------------------------------------
# a CUDA device


@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy", reason="the GPU kernels need CuPy and a CUDA device")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        pytest.skip(f"no usable CUDA device: {exc}")
    if count == 0:
        pytest.skip("no CUDA device")
    return cupy


def _ftz(a: np.ndarray) -> np.ndarray:
    """f32 bits with subnormals flushed to +0, as CuPy's own kernels (-ftz=true) produce them."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return np.where(np.abs(a) < np.float32(2.0**-126), np.float32(0.0), a).view(np.uint32)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_gpu_matches_portable(scheme, cp, monkeypatch):
    plan = plan_for(QuantScheme.parse(scheme))
    for k, kind in enumerate(KINDS):
        shape = SHAPES[k % len(SHAPES)]
        x = _data(kind, shape, k)
        xd = cp.asarray(x)
        roundings = ("half_even", "half_away") if not plan.value.is_float else ("half_even",)
        for rounding in roundings:
            got = ck.quantize(xd, plan, rounding)
            assert got is not None
            host = tuple(cp.asnumpy(a) if a is not None else None for a in got)
            _check_quantize(x, scheme, rounding, host, monkeypatch)  # NumPy's portable path: bit for bit
            tiny = np.abs(host[1]) < np.float32(2.0**-126)
            if kind != "subnormal" and not np.any(tiny & (host[1] != 0)):
                # CuPy's own kernels flush subnormal inputs and scales (2^-127, MX's zero-block scale),
                # which changes the codes of -0.0 there: compared with NumPy only
                ref = _portable(xd, scheme, monkeypatch, rounding)
                np.testing.assert_array_equal(host[0], cp.asnumpy(ref.values), err_msg=f"{scheme} {kind}")
                np.testing.assert_array_equal(_ftz(host[1]), _ftz(cp.asnumpy(ref.scales)), err_msg=scheme)
        qt = _portable(x, scheme, monkeypatch)
        vd, sd = cp.asarray(qt.values), cp.asarray(qt.scales)
        gd = None if qt.global_scale is None else cp.asarray(qt.global_scale)
        _check_dequantize(qt, cp.asnumpy(ck.dequantize(vd, sd, gd, plan, shape)), monkeypatch)


def test_gpu_declines_nonfinite_and_other_dtypes(cp):
    plan = plan_for(QuantScheme.parse("nvfp4"))
    x = _data("normal", (3, 64), 1)
    x[2, 7] = np.nan
    assert ck.quantize(cp.asarray(x), plan, "half_even") is None
    assert ck.quantize(cp.asarray(x, dtype=cp.float16), plan, "half_even") is None


def test_gpu_large_rows(cp, monkeypatch):
    # many threads and blocks: 1000 rows of 4096
    x = _data("heavy", (1000, 4096), 7)
    for scheme in ("q8s:block32:f16:native", "nvfp4", "mxfp8", "q4s"):
        plan = plan_for(QuantScheme.parse(scheme))
        got = ck.quantize(cp.asarray(x), plan, "half_even")
        host = tuple(cp.asnumpy(a) if a is not None else None for a in got)
        _check_quantize(x, scheme, "half_even", host, monkeypatch)
