"""The CuPy quantized matrix product (``arrayquant.fused.cupy_matmul``): the sequential f32 dot product, exactly.

The oracle is plain NumPy: ``aq.dequantize(w)`` (checked bit for bit elsewhere) and, for each
output, ``acc = f32(acc + f32(w * x))`` over K in order, which is what the kernel defines. Without
a GPU the very CUDA source runs compiled as C++ behind a stand-in ``cupy`` (``tests/cuda_on_host``);
with CuPy and a device (``ci/gpu-check.sh``, ``ARRAYQUANT_FUSED_GPU=1``) the real kernel does,
through ``x @ w.T``.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.fused import cupy_matmul as cm
from arrayquant.invariants import plan_for
from arrayquant.scheme import QuantScheme

from .cuda_on_host import compile_kernels, compiler

F32 = np.float32
SCHEMES = [
    "q8s",
    "q8s:block64",
    "q4s:block32",
    "q4f:block16:zero_point",
    "u4:block32:f16:offset",
    "q6_k",
    "q2_k",
    "u3:block8:zero_point",
    "nvfp4",
    "mxfp4",
    "mxfp8",
    "e5m2:block16",
    "q4s:block32:native",
]


def _sequential(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each output's f32 sum of ``w * x`` in K order, every step rounded (no FMA)."""
    acc = np.zeros((x.shape[0], w.shape[0]), F32)
    with np.errstate(all="ignore"):
        for j in range(x.shape[1]):
            acc = (acc + (w[None, :, j] * x[:, None, j]).astype(F32)).astype(F32)
    return acc


@pytest.fixture(scope="module")
def host_cupy(tmp_path_factory):
    if compiler() is None:
        pytest.skip("no C++ compiler to run the CUDA source on the CPU")
    kernels = compile_kernels({"aq_matmul_t": cm.SOURCE}, tmp_path_factory.mktemp("cuda_matmul"))
    return types.SimpleNamespace(
        ndarray=np.ndarray,
        float32=np.float32,
        uint8=np.uint8,
        asarray=np.asarray,
        ascontiguousarray=np.ascontiguousarray,
        broadcast_to=np.broadcast_to,
        minimum=np.minimum,
        zeros=np.zeros,
        empty=np.empty,
        abs=np.abs,
        max=lambda a: np.asarray(np.max(a)),
        RawKernel=lambda code, name, options: kernels[name],
    )


@pytest.fixture
def on_host(host_cupy, monkeypatch):
    monkeypatch.setattr(cm, "_cupy", lambda: host_cupy)
    cm._kernel.cache_clear()
    yield
    cm._kernel.cache_clear()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cuda_source_on_host_is_the_sequential_dot_product(scheme, on_host):
    rng = np.random.default_rng(1)
    w = aq.quantize(rng.standard_normal((24, 64)).astype(F32) * F32(0.1), scheme)
    x = rng.standard_normal((3, 64)).astype(F32)
    got = cm.matmul_t(x, w, plan_for(w.scheme))
    assert got is not None
    assert got.dtype == F32
    assert np.array_equal(got, _sequential(x, aq.dequantize(w)))


def test_cuda_source_on_host_per_tensor_two_level_and_odd_blocks(on_host):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 70)).astype(F32)
    for scheme in ("q8s", "nvfp4", "q4s:block32"):  # K = 70: a last block of 6
        w = aq.quantize(rng.standard_normal((5, 70)).astype(F32), scheme)
        assert np.array_equal(cm.matmul_t(x, w, plan_for(w.scheme)), _sequential(x, aq.dequantize(w))), scheme


def test_cuda_source_on_host_declines_what_the_reference_clips(on_host):
    x = np.full((4, 32), np.finfo(F32).max, F32)
    w = aq.quantize(x, "q8s:block32")
    assert cm.matmul_t(np.ones((1, 32), F32), w, plan_for(w.scheme)) is None
    assert (
        cm.matmul_t(np.ones((1, 32), np.float64), aq.quantize(np.ones((4, 32), F32), "q8s"), plan_for(w.scheme)) is None
    )


def test_levels_are_the_codes_values():
    assert cm.levels(plan_for(QuantScheme.parse("q8s")))[[0, 1, 127, 128, 255]].tolist() == [0, 1, 127, -128, -1]
    assert cm.levels(plan_for(QuantScheme.parse("u4:block32:zero_point")))[[0, 15, 255]].tolist() == [0, 15, 255]
    assert cm.levels(plan_for(QuantScheme.parse("nvfp4")))[:16].tolist() == [
        0,
        0.5,
        1,
        1.5,
        2,
        3,
        4,
        6,
        -0.0,
        -0.5,
        -1,
        -1.5,
        -2,
        -3,
        -4,
        -6,
    ]


@pytest.mark.parametrize(
    ("scheme", "shape", "reason"),
    [
        ("nf4", (4, 64), "lookup codebooks are not fused"),
        ("q8s:block2x16", (4, 64), "blocks spanning more than the last axis are not fused"),
        ("q8s", (2, 4, 64), "the fused product needs a 2-d weight (N, K), got shape (2, 4, 64)"),
        ("q8s:block32", (4, 64), ""),
    ],
)
def test_supports_reasons(scheme, shape, reason):
    assert cm.supports(plan_for(QuantScheme.parse(scheme)), shape) == reason


def test_cupy_arrays_take_the_reference_path_until_the_kernel_is_proven(monkeypatch):
    monkeypatch.delenv("ARRAYQUANT_FUSED_GPU", raising=False)
    assert not cm.VERIFIED
    assert aq.fused.gpu_why_not(cm.VERIFIED).startswith(("unverified", "turned off"))


def _device():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # cupy without a driver or device
        pytest.skip(f"the GPU kernel needs CuPy and a CUDA device: {exc}")
    return cp


@pytest.mark.parametrize("scheme", SCHEMES)
def test_on_the_gpu_through_the_operator(scheme, monkeypatch):
    cp = _device()
    monkeypatch.setenv("ARRAYQUANT_FUSED_GPU", "1")
    rng = np.random.default_rng(3)
    host = rng.standard_normal((48, 128)).astype(F32) * F32(0.1)
    x = rng.standard_normal((5, 128)).astype(F32)
    w = aq.quantize(cp.asarray(host), scheme)
    assert aq.ops.matmul_path(cp.asarray(x), w.T) == "fused"
    got = cp.asnumpy(cp.asarray(x) @ w.T)
    assert np.array_equal(got, _sequential(x, cp.asnumpy(aq.dequantize(w))))
