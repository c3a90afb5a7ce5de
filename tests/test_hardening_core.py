"""The core's promises under hostile or extreme input: bounded padding, rank limits, scheme text,
the top binade of f32, quiet parameter checks, and the API edges users meet first."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
import tracemalloc
import warnings
import zlib

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import to_host

from . import oracle
from .oracle import Case

F32_MAX = float(np.finfo(np.float32).max)


# -- 1. block extents beyond the data are clamped ----------------------------------------------


@pytest.mark.parametrize(
    ("huge", "clamped"),
    [
        ("q8s:block536870912:f32:native", (4,)),
        ("q8s:block1099511627776", (4,)),
        ("q4s:block9x1000:f16", (3, 5)),
        ("e4m3:block2x1000000:ue8m0", (2, 5)),
        ("e2m1:block16x4096:ue4m3:tensor:f32:packed_native", (3, 5)),
    ],
)
def test_block_longer_than_its_axis_gives_the_clamped_blocks_bits(xp, huge: str, clamped: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    shape = (1, 4) if clamped == (4,) else (3, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    qt = aq.quantize(xp.asarray(x), huge)
    scheme = aq.QuantScheme.parse(huge)
    assert scheme.block_size is not None
    case = Case(
        scheme.value.value,
        clamped,
        scheme.block_scale.value if scheme.block_scale else "f32",
        scheme.is_two_level,
        scheme.store.kind,
        scheme.store.dim,
    )
    codes, stored, glob = oracle.quantize(x, case)  # the oracle walks the clamped blocks
    np.testing.assert_array_equal(to_host(qt.codes()), codes)
    np.testing.assert_array_equal(to_host(qt.scales), stored)
    assert qt.scales.shape == tuple(-(-n // b) for n, b in zip(shape, (1,) * (2 - len(clamped)) + clamped, strict=True))
    if glob is not None:
        np.testing.assert_array_equal(to_host(qt.global_scale), glob)
    np.testing.assert_array_equal(to_host(aq.dequantize(qt)), oracle.dequantize(codes, stored, glob, case))


def test_huge_block_allocates_about_the_data_size() -> None:
    x = np.ones((1, 4), np.float32)
    tracemalloc.start()
    try:
        qt = aq.quantize(x, "q8s:block1099511627776")
        aq.dequantize(qt)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # was a 4 TiB padding request


def _rewrite_metadata(path: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in every metadata string of a safetensors file, keeping it valid."""
    raw = pathlib.Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    meta = header["__metadata__"]
    for k, v in meta.items():
        meta[k] = v.replace(old, new)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    pathlib.Path(path).write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])


def test_hostile_block_size_in_a_checkpoint_stays_within_memory_bound(tmp_path) -> None:
    # the audit's 311-byte file: a [1, 4] tensor whose metadata claims blocks of 2^29 elements
    path = str(tmp_path / "huge-block.safetensors")
    aq.save(path, {"w": aq.quantize(np.arange(1, 5, dtype=np.float32).reshape(1, 4), "q8s:block4:f32:native")})
    _rewrite_metadata(path, "q8s:block4:f32:native", "q8s:block536870912:f32:native")
    size = pathlib.Path(path).stat().st_size
    script = textwrap.dedent(
        f"""
        import numpy as np, arrayquant as aq
        def peak():  # VmHWM starts afresh at exec; ru_maxrss would carry the parent's peak
            line = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
            return int(line.split()[1]) * 1024
        # libraries the dequantization loads (numba and its kernels, ~130 MB) are not the file's doing
        aq.dequantize(aq.quantize(np.ones((1, 4), np.float32), "q8s:block4:f32:native"))
        before = peak()
        t = aq.load({path!r})
        y = aq.dequantize(t["w"])
        print(str(t["w"].scheme), peak() - before, y.tolist())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    scheme, grown, values = out.stdout.split(" ", 2)
    assert scheme == "q8s:block536870912:f32:native"
    # the bound: under twice the file plus 64 MiB (it was 4.65 GB)
    assert int(grown) < 2 * size + 64 * 2**20, out.stdout
    expected = np.arange(1, 5, dtype=np.float32)
    s = np.float32(4.0) / np.float32(127.0)
    np.testing.assert_array_equal(np.array(json.loads(values), np.float32)[0], np.round(expected / s) * s)


def test_block_rule_is_seen_by_lazy_and_eager_alike() -> None:
    da = pytest.importorskip("dask.array")
    x = np.random.default_rng(3).standard_normal((6, 10)).astype(np.float32)
    eager = aq.quantize(x, "q8s:block4x4096:f16:native")
    lazy = aq.quantize(da.from_array(x, chunks=(4, 5)), "q8s:block4x4096:f16:native")
    np.testing.assert_array_equal(np.asarray(lazy.values.compute()), eager.values)
    np.testing.assert_array_equal(np.asarray(lazy.scales.compute()), eager.scales)
    np.testing.assert_array_equal(np.asarray(aq.dequantize(lazy).compute()), aq.dequantize(eager))


# -- 3. ranks beyond what block kernels can view ---------------------------------------------


def test_rank_beyond_limit_is_a_shape_error_for_quantize() -> None:
    x = np.ones((1,) * 33, np.float32)
    with pytest.raises(aq.ShapeError, match=r"x has 33 axes; quantized tensors have at most 32"):
        aq.quantize(x, "q8s:block2")


def test_rank_32_still_quantizes_with_blocks() -> None:
    x = np.arange(4, dtype=np.float32).reshape((1,) * 31 + (4,))
    qt = aq.quantize(x, "q8s:block2:native")
    assert qt.scales.shape == (1,) * 31 + (2,)
    np.testing.assert_array_equal(qt.codes().reshape(-1), [0, 127, 85, 127])


@pytest.mark.parametrize("rank", [33, 65, 70])
def test_rank_beyond_limit_from_bytes(rank: int) -> None:
    with pytest.raises(aq.ShapeError, match=rf"shape has {rank} axes; quantized tensors have at most 32"):
        aq.from_bytes(b"\0" * 8, "q8s", (1,) * rank)


def test_rank_beyond_limit_on_dequantize_of_a_built_tensor() -> None:
    qt = aq.QuantizedTensor(
        aq.QuantScheme.parse("q8s:native"),
        (1,) * 40,
        np.float32,
        np.zeros((1,) * 40, np.int8),
        np.ones((1,), np.float32),
    )
    with pytest.raises(aq.ShapeError, match=r"qt.shape has 40 axes"):
        aq.dequantize(qt)


def test_element_count_beyond_any_array_is_a_shape_error() -> None:
    with pytest.raises(aq.ShapeError, match=r"more than the 4611686018427387904 any array can hold"):
        aq.quantized_nbytes("q8s", (2**40, 2**40))


# -- 6. scheme text: every failure is a SchemeError -------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("q4s:packed_u32:²", r"unknown token '²'"),
        ("q8s:block²", r"bad block token 'block²'"),
        ("q8s:block1_0", r"bad block token 'block1_0'.*ASCII digits only"),
        ("q8s:block" + "9" * 5000, r"bad block token 'block9{55}' in"),
        ("q8s:packed_u32:" + "1" * 5000, r"store dim '1{60}' .* is too large"),
        ("nvfp4:native", r"preset 'nvfp4' takes no modifiers.*'e2m1:block16:ue4m3:tensor:f32:packed_native'"),
    ],
)
def test_scheme_text_failures_are_scheme_errors(text: str, message: str) -> None:
    with pytest.raises(aq.SchemeError, match=message):
        aq.QuantScheme.parse(text)


def test_per_block_reads_text_extents() -> None:
    assert aq.QuantScheme().per_block("32", "f16") == aq.QuantScheme().per_block(32, "f16")
    assert aq.QuantScheme().per_block("4x32").block_size == aq.BlockSize((4, 32))
    with pytest.raises(aq.SchemeError, match=r"bad block extents '3 2'"):
        aq.QuantScheme().per_block("3 2")


# -- 7. every finite f32 input, even the top binade --------------------------------------------

TOP_LEVELS = [
    (None, "f32", False),
    ((4,), "f32", False),
    ((4,), "bf16", False),
    ((4,), "ue4m3", True),
    ((2, 4), "f16", True),
]
TOP_CASES = [
    Case(value, block, scale, two) for value in (*oracle.VALUES, *oracle.FLOATS) for block, scale, two in TOP_LEVELS
] + [Case(value, (4,), "ue8m0") for value in oracle.FLOATS]


def _top_binade(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mags = np.float32(2.0**127) * (1 + rng.random((4, 8))).astype(np.float32)  # [2^127, 2^128)
    x = np.where(rng.random((4, 8)) < 0.5, -mags, mags).astype(np.float32)
    x = np.where(np.isinf(x), np.float32(F32_MAX), x)
    x[0, :2] = [F32_MAX, -F32_MAX]
    x[1, 3] = 1.0  # a small value beside huge ones
    return x


@pytest.mark.parametrize("case", TOP_CASES, ids=lambda c: c.text)
def test_top_binade_quantizes_to_finite_scales_that_round_trip(case: Case, tmp_path) -> None:
    x = _top_binade(zlib.crc32(case.text.encode()) % 1000)
    qt = aq.quantize(x, case.text)
    codes, stored, glob = oracle.quantize(x, case)
    np.testing.assert_array_equal(qt.codes(), codes)
    np.testing.assert_array_equal(qt.scales, stored)
    assert np.isfinite(qt.scales).all()
    if glob is not None:
        np.testing.assert_array_equal(qt.global_scale, glob)
        assert np.isfinite(qt.global_scale).all()
    y = aq.dequantize(qt)
    assert np.isfinite(y).all()
    np.testing.assert_array_equal(y, oracle.dequantize(codes, stored, glob, case))
    back = aq.from_bytes(aq.to_bytes(qt), case.text, x.shape)
    np.testing.assert_array_equal(aq.dequantize(back), y)
    path = str(tmp_path / "top.safetensors")
    aq.save(path, {"t": qt})
    np.testing.assert_array_equal(aq.dequantize(aq.load(path)["t"]), y)


def test_f32_max_dequantizes_to_f32_max_not_inf() -> None:
    # MXFP8: 448 * 2^120 passes the f32 maximum; the value saturates instead
    x = np.array([F32_MAX, -F32_MAX] + [1.0] * 30, np.float32)
    for scheme in ("mxfp8", "mxfp4", "q8s", "q8f", "nvfp4"):
        y = aq.dequantize(aq.quantize(x, scheme))
        assert y[0] == np.float32(F32_MAX) or scheme == "q8f", (scheme, y[:2])
        assert y[1] == -np.float32(F32_MAX), (scheme, y[:2])


def test_top_binade_nf4_and_lookup() -> None:
    x = _top_binade(5)
    qt = aq.quantize(x, "q4f:block4:lookup", table=aq.NF4)
    table = np.asarray(aq.NF4, np.float32)
    case = Case("q4f", (4,), "f32")
    codes, stored, _ = oracle.quantize(x, case, table=table)
    np.testing.assert_array_equal(qt.codes(), codes)
    y = aq.dequantize(qt)
    assert np.isfinite(qt.scales).all()
    assert np.isfinite(y).all()
    np.testing.assert_array_equal(y, oracle.dequantize(codes, stored, None, case, table=table))


# -- 8. parameters beyond f32: a typed error and no warning ------------------------------------


@pytest.mark.parametrize("scales", [np.array([1e300]), [1e300], np.array([1.0, -1e39])])
def test_scales_beyond_f32_are_a_params_error_without_warning(scales) -> None:
    n = np.asarray(scales).size
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(aq.ParamsError, match=r"params.scales has a value beyond the float32 range at flat index"):
            aq.quantize(np.ones(4 * n, np.float32), "q8s" if n == 1 else "q8s:block4", aq.QParams(scales=scales))


def test_global_scale_beyond_f32_is_a_params_error() -> None:
    params = aq.QParams(scales=np.ones((1, 1), np.float32), global_scale=np.array([1e40]))
    with pytest.raises(aq.ParamsError, match=r"params.global_scale has a value beyond the float32 range"):
        aq.quantize(np.ones((1, 16), np.float32), "nvfp4", params)


def test_unreadable_scales_text_is_a_params_error() -> None:
    with pytest.raises(aq.ParamsError, match=r"params.scales must be an array of floats, got 'abc'"):
        aq.quantize(np.ones(4, np.float32), "q8s", aq.QParams(scales="abc"))


# -- 15. the nf4 preset -------------------------------------------------------------------------


def test_nf4_preset_is_bitsandbytes_block_64_with_its_table() -> None:
    scheme = aq.QuantScheme.parse("nf4")
    assert scheme == aq.QuantScheme.nf4()
    assert str(scheme) == "nf4"
    assert scheme.spelled_out() == "q4f:block64:f32:lookup:nf4"
    assert aq.QuantScheme.parse(scheme.spelled_out()) == scheme
    x = np.random.default_rng(0).standard_normal((3, 130)).astype(np.float32)
    qt = aq.quantize(x, "nf4")
    table = np.asarray(aq.NF4, np.float32)
    case = Case("q4f", (64,), "f32")
    codes, stored, _ = oracle.quantize(x, case, table=table)
    np.testing.assert_array_equal(qt.codes(), codes)
    np.testing.assert_array_equal(qt.scales, stored)
    np.testing.assert_array_equal(aq.dequantize(qt), oracle.dequantize(codes, stored, None, case, table=table))


def test_nf4_preset_round_trips_through_bytes_and_checkpoints(tmp_path) -> None:
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    qt = aq.quantize(x, "nf4")
    back = aq.from_bytes(aq.to_bytes(qt), "nf4", x.shape)  # the codebook names its table
    np.testing.assert_array_equal(aq.dequantize(back), aq.dequantize(qt))
    path = str(tmp_path / "nf4.safetensors")
    aq.save(path, {"w": qt})
    loaded = aq.load(path)["w"]
    assert loaded.scheme == aq.QuantScheme.nf4()
    np.testing.assert_array_equal(aq.dequantize(loaded), aq.dequantize(qt))


def test_codebook_errors() -> None:
    with pytest.raises(aq.SchemeError, match=r"codebook 'nf4' has 16 entries and needs lookup mode with a 4-bit"):
        aq.quantize(np.ones(4, np.float32), "q8s:nf4")
    with pytest.raises(aq.SchemeError, match=r"unknown codebook 'nf5'; built-in codebooks: 'nf4'"):
        aq.QuantScheme().with_value("q4f").with_codebook("nf5")
    with pytest.raises(aq.ParamsError, match=r"the table given differs from codebook 'nf4'"):
        aq.quantize(np.ones(64, np.float32), "nf4", table=np.linspace(-1, 1, 16, dtype=np.float32))
    symmetric = aq.QuantScheme.nf4().with_mode("symmetric")
    assert str(symmetric) == "q4f:block64:f32:symmetric:nf4"  # reads back as itself, not as lookup
    assert aq.QuantScheme.parse(str(symmetric)) == symmetric


# -- 17. API edges --------------------------------------------------------------------------------


def test_unpack_takes_an_int_shape() -> None:
    codes = np.array([1, -2, 3, -4, 5, -6, 7, 0], np.int8)
    values = aq.pack(codes, "q4s")
    np.testing.assert_array_equal(aq.unpack(values, "q4s", 8), codes)
    assert aq.quantized_nbytes("q4s", 8) == aq.quantized_nbytes("q4s", (8,))


def test_numpy_conversion_of_a_quantized_tensor_says_what_to_do() -> None:
    qt = aq.quantize(np.ones(4, np.float32), "q8s")
    with pytest.raises(TypeError, match=r"call aq.dequantize\(qt\) for the float array"):
        np.asarray(qt)


@pytest.mark.parametrize(
    ("name", "expected"), [("float16", "float16"), ("float64", "float64"), (" Float32", "float32")]
)
def test_dequantize_takes_dtype_names(xp, name: str, expected: str) -> None:
    qt = aq.quantize(xp.asarray(np.array([[0.5, -1.0, 0.25, 2.0]], np.float32)), "q8s")
    if xp.backend.value == "jax" and expected == "float64":
        pytest.skip("jax without x64 has no float64 arrays")
    if xp.backend.library == "array_api_strict" and expected == "float16":
        pytest.skip("array_api_strict has no float16")
    y = aq.dequantize(qt, name)
    assert str(y.dtype).endswith(expected)
    np.testing.assert_array_equal(to_host(y), to_host(aq.dequantize(qt)).astype(expected))


def test_dequantize_refuses_unknown_dtype_names() -> None:
    qt = aq.quantize(np.ones(4, np.float32), "q8s")
    with pytest.raises(aq.DTypeError, match=r"dtype 'float8' is not a dtype of .*use 'float32', 'float16'"):
        aq.dequantize(qt, "float8")


def test_dir_lists_public_names_only() -> None:
    names = dir(aq)
    assert "quantize" in names
    assert "QuantScheme" in names
    for internal in ("kernels", "invariants", "blockwork", "chunks", "lazy", "storage", "cli"):
        assert internal not in names


# -- 19. what unchecked NaN becomes, as the error says -------------------------------------------


def test_nonfinite_message_names_the_nan_code_of_fp8() -> None:
    x = np.array([1.0, np.nan], np.float32)
    with pytest.raises(aq.NonFiniteInputError, match=r"NaN becomes code 0 \(integer values, E2M1\) or the NaN code"):
        aq.quantize(x, "e4m3")
    codes = aq.quantize(x, "e4m3:native", check_finite=False).codes()
    assert int(codes[1]) == int(np.array([np.nan], np.float32).astype(oracle.FLOATS["e4m3"][1]).view(np.uint8)[0])


def test_absmean_of_the_top_binade_stays_finite() -> None:
    # the fixed tree's sum passes the f32 maximum; the mean it stands for does not
    x = np.array([[3e38, 3e38, 1e38, 2e38]], np.float32)
    _, hi = aq.compute_range(x, "q8s", calibration="absmean")
    assert hi[0] == np.float32(np.mean(x.astype(np.float64)))
    for scheme in ("q8s", "q8s:block2", "e4m3:block4x2:f32"):
        qt = aq.quantize(np.full((4, 4), 1e38, np.float32), scheme, calibration="absmean")
        assert np.isfinite(qt.scales).all()
        np.testing.assert_allclose(aq.dequantize(qt), 1e38, rtol=2**-3)


def test_absmean_keeps_the_plain_trees_bits_below_overflow() -> None:
    # five values: the tree pads to eight and sums ((a+e)+c)+(b+d); computed here by hand in f32
    x = np.array([[0.1, 0.7, 0.3, 0.9, 0.5]], np.float32)
    f = np.float32
    total = (f(x[0, 0] + x[0, 4]) + x[0, 2]) + f(x[0, 1] + x[0, 3])
    _, hi = aq.compute_range(x, "q8s", calibration="absmean")
    assert hi[0] == np.float32(total / np.float32(5))


def test_lookup_at_rank_32() -> None:
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape((1,) * 31 + (64,))
    qt = aq.quantize(x, "nf4")
    table = np.asarray(aq.NF4, np.float32)
    codes, stored, _ = oracle.quantize(x.reshape(1, 64), Case("q4f", (64,), "f32"), table=table)
    np.testing.assert_array_equal(qt.codes().reshape(1, 64), codes)
    np.testing.assert_array_equal(qt.scales.reshape(1, 1), stored)


@pytest.mark.parametrize("scheme", ["q8f", "mxfp4", "mxfp8", "q4f:block2:f16"])
def test_float16_data_near_its_maximum_dequantizes_finite(xp, scheme: str) -> None:
    if xp.backend.library == "array_api_strict":
        pytest.skip("array_api_strict has no float16")
    x = np.array([[-65504, 60000, 62144, 1.0]], np.float16)
    y = to_host(aq.dequantize(aq.quantize(xp.asarray(x), scheme)))
    assert y.dtype == np.float16
    assert np.isfinite(y).all(), y
    # the f32 values, saturated at float16's maximum, then rounded to float16
    f32 = to_host(aq.dequantize(aq.quantize(xp.asarray(x), scheme), "float32"))
    np.testing.assert_array_equal(y, np.clip(f32, -65504, 65504).astype(np.float16))
