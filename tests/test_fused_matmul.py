"""The fused quantized matrix products (``x @ w.T``, ``w @ x``): against float64 products of the dequantized weight.

The oracle for the default path is NumPy's float64 product of ``aq.dequantize(w)`` (itself checked
bit for bit against independent oracles elsewhere), within the f32 dot-product bound the kernel
documents. The int8-activation path is checked against a plain NumPy model of its definition: the
activations rounded per run to int8 with an absmax scale, the integer sums exact, each run scaled once.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import SchemeError
from arrayquant.invariants import plan_for
from arrayquant.ops import linalg

from .matmul_models import EPS
from .matmul_models import bound as _bound
from .matmul_models import int8_model as _int8_model
from .matmul_models import weight as _weight

pytest.importorskip("numba")

F32 = np.float32

SCHEMES = [
    "q8s",  # one scale per tensor
    "q8s:block64",  # per row (the whole K)
    "q8f:block32:f16",  # Q8_0
    "q4s:block32",
    "q4f:block64:f16",
    "q4s:block32:native",  # one code per byte
    "u4:block32:f16:offset",  # Q4_1
    "q4f:block32:zero_point",
    "u8:block16:zero_point",
    "q4_k",
    "q6_k",  # 6-bit fields crossing bytes: a byte per code in the panel
    "q2_k",  # 2-bit offsets
    "q5_1",
    "nvfp4",  # two-level, blocks of 16
    "mxfp4",
    "mxfp8",
    "e5m2:block32",
    "e2m1:block32:native",
]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("rows", [1, 5, 32])
def test_fused_product_is_the_dequantized_product_to_f32_rounding(scheme: str, rows: int) -> None:
    w = _weight(scheme)
    x = np.random.default_rng(rows).standard_normal((rows, w.shape[1])).astype(F32)
    assert linalg.matmul_path(x, w.T) == "fused"
    wd = aq.dequantize(w).astype(np.float64)
    got = x @ w.T
    assert got.dtype == F32
    assert got.shape == (rows, w.shape[0])
    err = np.abs(got.astype(np.float64) - x.astype(np.float64) @ wd.T)
    assert np.all(err <= _bound(x, wd))


@pytest.mark.parametrize(
    ("scheme", "run"),
    [
        ("q8s:block64", 64),
        ("q4s:block32", 32),
        ("q4f:block32:zero_point", 32),
        ("u4:block32:f16:offset", 32),
        ("nvfp4", 16),
        ("mxfp4", 32),
        ("q6_k", 16),
        ("u5:block32:f16:offset", 32),
    ],
)
def test_int8_activations_follow_their_definition(scheme: str, run: int) -> None:
    w = _weight(scheme)
    x = np.random.default_rng(3).standard_normal((4, w.shape[1])).astype(F32)
    got = aq.matmul(x, w.T, path="fused_int8").astype(np.float64)
    want = _int8_model(x, w, run)
    # the integer sums are exact; what is left is f32 rounding of a few scale products per run
    scale = np.abs(x.astype(np.float64)) @ np.abs(aq.dequantize(w).astype(np.float64)).T
    assert np.all(np.abs(got - want) <= 64 * EPS * scale + 1e-30)
    # and it is an approximation: the activations' rounding shows
    assert not np.array_equal(got, (x.astype(np.float64) @ aq.dequantize(w).astype(np.float64).T))


def test_int8_path_refuses_e4m3_levels() -> None:
    w = _weight("mxfp8")
    with pytest.raises(SchemeError, match=r"path='fused_int8' does not apply: e4m3 levels are not small integers"):
        aq.matmul(np.ones((1, 64), F32), w.T, path="fused_int8")


def test_every_spelling_reaches_the_same_kernel() -> None:
    w = _weight("q4s:block32", n=32, k=64)
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(F32)
    y = x @ w.T
    assert np.array_equal(aq.matmul(x, w.T, path="fused"), y)
    assert linalg.matmul_path(w, x.T) == "fused"
    assert np.array_equal((w @ x.T).T, y)
    assert np.array_equal(w @ x[1], y[1])
    assert np.array_equal(x[1] @ w.T, y[1])
    batched = np.stack([x, x[::-1]])
    assert np.array_equal((batched @ w.T)[1], y[::-1])


def test_the_transpose_is_a_view_never_built_by_the_product() -> None:
    w = _weight("q4s:block32")
    t = w.T
    assert t.T is w
    assert t.mT is w
    assert t.shape == (64, 48)
    _ = np.ones((2, 64), F32) @ t
    assert "_materialized" not in t.__dict__  # the product read w as stored
    # read as a tensor, it is the real transpose
    assert np.array_equal(aq.dequantize(t), aq.dequantize(w).T)
    assert str(t.scheme) == str(aq.ops.matrix_transpose(w).scheme)
    assert "shape=(64, 48)" in repr(t)
    copy = pickle.loads(pickle.dumps(t))
    assert type(copy) is aq.QuantizedTensor
    assert np.array_equal(aq.dequantize(copy), aq.dequantize(w).T)


def test_results_do_not_depend_on_the_thread_count() -> None:
    w = _weight("mxfp4", n=64, k=128)
    x = np.random.default_rng(2).standard_normal((7, 128)).astype(F32)
    with aq.fused_kernels(threads=1):
        one = x @ w.T
    with aq.fused_kernels(threads=2):
        two = x @ w.T
    assert np.array_equal(one, two)


def test_auto_takes_the_reference_past_the_batch_limit_and_where_the_kernel_cannot_go() -> None:
    w = _weight("q4s:block32")
    assert linalg.matmul_path(np.ones((linalg.FUSED_ROWS + 1, 64), F32), w.T) == "reference"
    assert linalg.matmul_path(np.ones((2, 64), np.float64), w.T) == "reference"
    odd = _weight("q4s:block32", n=40)
    assert linalg.matmul_path(np.ones((2, 64), F32), odd.T) == "reference"
    # forced, the reason is given
    with pytest.raises(SchemeError, match=r"path='fused' does not apply: N \(40\), K \(64\) and the block along K"):
        aq.matmul(np.ones((2, 64), F32), odd.T, path="fused")
    with pytest.raises(SchemeError, match=r"path='fused' does not apply: it multiplies float32 activations"):
        aq.matmul(np.ones((2, 64)), w.T, path="fused")
    with pytest.raises(SchemeError, match=r"path='fused' does not apply: it needs a float array times a 2-d weight"):
        aq.matmul(np.ones((2, 48), F32), w, path="fused")
    with pytest.raises(SchemeError, match=r"path='fused' does not apply: lookup codebooks are not fused"):
        aq.matmul(np.ones((2, 64), F32), _weight("nf4").T, path="fused")
    with pytest.raises(SchemeError, match=r"path='fused' does not apply: blocks spanning more than the last axis"):
        aq.matmul(np.ones((2, 64), F32), _weight("q8s:block2x16").T, path="fused")
    with aq.fused_kernels(False), pytest.raises(SchemeError, match=r"the fused CPU kernels are off \(turned off by"):
        aq.matmul(np.ones((2, 64), F32), w.T, path="fused")


def test_scales_near_the_f32_maximum_fall_back_to_the_clipping_reference() -> None:
    x = np.full((16, 32), np.finfo(F32).max, F32)
    x[:, 1] = -x[:, 1]
    w = aq.quantize(x, "q8s:block32")
    ones = np.ones((1, 32), F32) * F32(1e-30)
    from arrayquant.fused import numba_matmul

    assert numba_matmul.matmul_t(ones, w, plan_for(w.scheme)) is None  # 127 x the scale passes the f32 maximum
    got = aq.matmul(ones, w.T, path="fused")
    assert np.array_equal(got, aq.matmul(ones, w.T, path="reference"))
    assert np.all(np.isfinite(got))


def test_nan_codes_and_activations_propagate_as_in_the_reference() -> None:
    w = _weight("mxfp8", n=16, k=32)
    values = np.array(w.values)
    values[3, 5] = 0x7F  # E4M3 NaN
    bad = aq.QuantizedTensor(w.scheme, w.shape, w.dtype, values, w.scales)
    y = np.ones((1, 32), F32) @ bad.T
    assert np.isnan(y[0, 3])
    assert np.all(np.isfinite(np.delete(y[0], 3)))
    x = np.ones((2, 32), F32)
    x[1, 0] = np.nan
    y = x @ w.T
    assert np.all(np.isnan(y[1]))
    assert np.all(np.isfinite(y[0]))


def test_the_kernel_declines_what_it_does_not_cover() -> None:
    from arrayquant.fused import numba_matmul

    w = _weight("q4s:block32")
    plan = plan_for(w.scheme)
    assert numba_matmul.matmul_t(np.ones((1, 64), np.float64), w, plan) is None
    assert numba_matmul.matmul_t(np.ones((1, 32), F32), w, plan) is None
    assert (
        numba_matmul.supports(plan, (48, 64, 1)) == "the fused product needs a 2-d weight (N, K), got shape (48, 64, 1)"
    )


def test_without_numba_the_product_takes_the_reference() -> None:
    # the kernel modules import without numba and say why they do not apply
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['numba'] = None\n"
        "import numpy as np, arrayquant as aq\n"
        "from arrayquant.fused import numba_matmul, numba_simd\n"
        "from arrayquant.invariants import plan_for\n"
        "w = aq.quantize(np.eye(64, dtype=np.float32)[:16], 'q4s:block32')\n"
        "x = np.arange(64, dtype=np.float32).reshape(1, 64)\n"
        "assert aq.ops.matmul_path(x, w.T) == 'reference'\n"
        "assert not numba_simd.available()\n"
        "print(numba_matmul.supports(plan_for(w.scheme), (16, 64)))\n"
        "print((x @ w.T)[0, :4].tolist(), (w @ x.T)[:4, 0].tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "numba is not installed (pip install 'arrayquant[fast]')",
        "[0.0, 1.0, 2.0, 3.0] [0.0, 1.0, 2.0, 3.0]",
    ]


def test_row_kernel_variants_pack_into_one_literal() -> None:
    from arrayquant.fused.numba_simd import Field, _pack, _unpack

    for variant in [
        (Field(True, True, True, 0), True, 16, None, 4),
        (Field(True, False, False, 0x88), True, 32, -8.0, 1),
        (Field(False, False, True, 0), False, 0, 0.0, 2),
        (Field(False, False, False, 0x80), False, 64, None, 15),
    ]:
        assert _unpack(_pack(*variant)) == variant
    with pytest.raises(ValueError, match=r"no such row kernel: aux 0.5, span 32, mb 1"):
        _pack(Field(True, False, False, 0), False, 32, 0.5, 1)
    with pytest.raises(ValueError, match=r"no such row kernel: aux None, span 256, mb 1"):
        _pack(Field(True, False, False, 0), False, 256, None, 1)


@pytest.mark.parametrize("scheme", ["mxfp8", "q4s:block32", "q8s:block32", "q4s:block48"])
def test_read_only_activations(scheme: str) -> None:
    # the kernels read x and never write it, so a read-only x (a memory map, a frozen buffer) is fine
    w = _weight(scheme, n=32, k=96)
    x = np.random.default_rng(8).standard_normal((3, 96)).astype(F32)
    want = aq.matmul(x.copy(), w.T, path="fused")
    x.flags.writeable = False
    assert np.array_equal(aq.matmul(x, w.T, path="fused"), want)
    assert np.array_equal(aq.matmul(x, w.T, path="fused"), want)  # the kept decision's way too
    if scheme != "mxfp8":
        assert np.array_equal(aq.matmul(x, w.T, path="fused_int8"), aq.matmul(x.copy(), w.T, path="fused_int8"))
