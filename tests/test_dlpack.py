"""Hand-off between array libraries: DLPack, zero-copy where allowed, bytes where a dtype cannot cross.

Every pair among NumPy, torch, JAX and array-api-strict is checked bit for bit on the host; the
CuPy cases run only where a GPU is usable (``ci/gpu-check.sh``) and skip with the reason here.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends import registry, shim

HOST_LIBRARIES = ("numpy", "torch", "jax", "array_api_strict")
PAIRS = [(a, b) for a in HOST_LIBRARIES for b in HOST_LIBRARIES if a != b]
# what a quantized tensor holds: codes, packed words, scales; and float data
DTYPES = ("int8", "uint8", "uint32", "float32")


def usable(name: str) -> None:
    info = registry.probe(name)
    if not info.usable:
        pytest.skip(f"{name} is not usable here: {info.reason}")


def raw(dtype: Any, shape: tuple[int, ...] = (5, 12), seed: int = 0) -> np.ndarray:
    """Random bit patterns as ``dtype``: NaN payloads, subnormals and -0.0 included for floats."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (*shape[:-1], shape[-1] * dt.itemsize), dtype=np.uint8).view(dt)


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any host transfer inside the shim fail loudly."""

    def refuse(x: Any) -> np.ndarray:
        raise AssertionError(f"to_host called for a {type(x).__module__}.{type(x).__name__}")

    monkeypatch.setattr(shim, "to_host", refuse)


# ---------------------------------------------------------------------------------------------
# bit-identical hand-off between every pair of host libraries
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_pairs_arrive_bit_identical(source: str, target: str, dtype: str) -> None:
    usable(source)
    usable(target)
    host = raw(dtype)
    moved = aq.asarray(aq.asarray(host, backend=source), backend=target)
    assert shim.backend_name(moved) == target
    same_bits(shim.to_host(moved), host)


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_pairs_do_not_go_through_the_host(source: str, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    usable(source)
    usable(target)
    host = raw("uint32", (3, 8))
    x = aq.asarray(host, backend=source)
    no_host(monkeypatch)
    moved = aq.asarray(x, backend=target)
    monkeypatch.undo()
    same_bits(shim.to_host(moved), host)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
@pytest.mark.parametrize(
    ("source", "target"),
    [("torch", "numpy"), ("numpy", "torch"), ("jax", "numpy"), ("numpy", "jax"), ("torch", "jax"), ("jax", "torch")],
)
def test_narrow_floats_cross_as_bytes(source: str, target: str, dtype: str) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    usable(source)
    usable(target)
    host = raw(getattr(ml_dtypes, dtype, None) or dtype, (4, 6))
    moved = aq.asarray(aq.asarray(host, backend=source), backend=target)
    assert shim.backend_name(moved) == target
    assert str(moved.dtype).rsplit(".", 1)[-1] == dtype
    same_bits(shim.to_host(moved), host)


def test_torch_bfloat16_reaches_numpy_by_bytes_not_through_a_numpy_cast(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    t = torch.tensor([[1.0, -2.5, 3.0e38, 1.0e-40]], dtype=torch.bfloat16)
    no_host(monkeypatch)
    host = aq.asarray(t, backend="numpy")
    assert host.dtype.name == "bfloat16"
    assert host.view(np.uint16).tolist() == t.view(torch.int16).numpy().view(np.uint16).tolist()


# ---------------------------------------------------------------------------------------------
# sharing: zero-copy where both sides may share, copies where sharing would be unsafe
# ---------------------------------------------------------------------------------------------


def test_numpy_to_torch_on_cpu_shares_memory() -> None:
    usable("torch")
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = aq.asarray(host, backend="torch")
    assert t.data_ptr() == host.ctypes.data
    assert np.shares_memory(t.numpy(), host)
    back = aq.asarray(t, backend="numpy")
    assert np.shares_memory(back, host)


def test_numpy_to_array_api_strict_shares_memory() -> None:
    usable("array_api_strict")
    host = np.arange(6, dtype=np.int8)
    s = aq.asarray(host, backend="array_api_strict")
    assert np.shares_memory(np.from_dlpack(s), host)


def aligned(n: int) -> np.ndarray:
    """``arange(n)`` as float32 at a 64-byte boundary, where jax would alias an imported buffer."""
    buf = np.zeros(n + 16, np.float32)
    start = (-buf.ctypes.data % 64) // 4
    out = buf[start : start + n]
    out[...] = np.arange(n, dtype=np.float32)
    assert out.ctypes.data % 64 == 0
    return out


def test_jax_never_aliases_memory_others_can_write() -> None:
    torch = pytest.importorskip("torch")
    usable("jax")
    host = aligned(64)
    j = aq.asarray(host, backend="jax")
    host[0] = 100.0
    assert float(j[0]) == 0.0
    t = torch.arange(64, dtype=torch.float32)  # torch's allocator aligns to 64 bytes
    k = aq.asarray(t, backend="jax")
    t[1] = 100.0
    assert float(k[1]) == 1.0


def test_torch_from_jax_is_a_copy_numpy_from_jax_a_read_only_view() -> None:
    usable("jax")
    usable("torch")
    j = aq.asarray(np.arange(8, dtype=np.float32), backend="jax")
    t = aq.asarray(j, backend="torch")
    t[0] = -5.0  # would write into the immutable jax buffer if torch aliased it
    assert float(j[0]) == 0.0
    view = aq.asarray(j, backend="numpy")
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1.0


def test_read_only_numpy_is_copied_before_torch_can_write_into_it() -> None:
    usable("torch")
    host = np.arange(6, dtype=np.float32)
    host.flags.writeable = False
    t = aq.asarray(host, backend="torch")
    assert t.data_ptr() != host.ctypes.data
    t[0] = 42.0
    assert host[0] == 0.0


def test_read_only_numpy_reaches_jax() -> None:
    usable("jax")
    host = np.arange(6, dtype=np.uint32)
    host.flags.writeable = False
    same_bits(shim.to_host(aq.asarray(host, backend="jax")), np.arange(6, dtype=np.uint32))


@pytest.mark.parametrize("target", ["torch", "jax", "array_api_strict"])
def test_strided_and_reversed_views_arrive_in_order(target: str) -> None:
    # torch aborts the whole process on a negative-stride DLPack tensor; jax refuses gaps
    usable(target)
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    for view in (base[:, ::-1], base[::2, 1::3], base.T, base[::-1, ::-2]):
        moved = aq.asarray(view, backend=target)
        same_bits(shim.to_host(moved), np.ascontiguousarray(view))


def test_reversed_array_api_strict_view_reaches_torch() -> None:
    xs = pytest.importorskip("array_api_strict")
    usable("torch")
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    flipped = xs.flip(xs.asarray(base), axis=1)
    same_bits(aq.asarray(flipped, backend="torch").numpy(), base[:, ::-1].copy())


@pytest.mark.parametrize("target", ["numpy", "jax"])
def test_torch_views_and_grad_tensors_cross(target: str) -> None:
    torch = pytest.importorskip("torch")
    usable(target)
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for view in (t.T, t[:, 1:3], t[:, :1].expand(3, 5), t.clone().requires_grad_(True)):
        want = view.detach().contiguous().numpy()
        same_bits(shim.to_host(aq.asarray(view, backend=target)), want)


def test_numpy_scalars_and_python_data() -> None:
    usable("torch")
    usable("jax")
    assert float(aq.asarray(np.float32(2.5), backend="torch")) == 2.5
    assert aq.asarray(np.float32(2.5), backend="numpy").shape == ()
    assert aq.asarray([[1, 2]], backend="jax").shape == (1, 2)


# ---------------------------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------------------------


def test_array_api_strict_device1_is_crossed_explicitly(monkeypatch: pytest.MonkeyPatch) -> None:
    xs = pytest.importorskip("array_api_strict")
    usable("torch")
    x = aq.asarray(np.arange(4, dtype=np.float32), backend="array_api_strict", device="device1")
    assert x.device == xs.Device("device1")
    calls: list[str] = []
    real = shim.to_host
    monkeypatch.setattr(shim, "to_host", lambda a: calls.append(shim.backend_name(a)) or real(a))
    t = aq.asarray(x, backend="torch")
    assert calls == ["array_api_strict"]  # its DLPack export would call device1 the CPU
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    back = aq.asarray(t, backend="array_api_strict", device="device1")
    assert back.device == xs.Device("device1")


def test_devices_of_other_libraries_are_read_by_name() -> None:
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    xs = pytest.importorskip("array_api_strict")
    usable("jax")
    assert shim.device_name(torch.device("cpu")) == "cpu"
    assert shim.device_name(torch.device("cuda", 1)) == "cuda:1"
    assert shim.device_name(jax.devices("cpu")[0]) == "cpu"
    assert shim.device_name(xs.Device("device1")) == "device1"
    assert shim.device_name(xs.Device()) == "cpu"
    moved = aq.asarray(np.ones(3, np.float32), backend="jax", device=torch.device("cpu"))
    assert moved.device == jax.devices("cpu")[0]
    t = aq.asarray(moved, backend="torch", device=moved.device)
    assert t.device == torch.device("cpu")


def test_a_device_the_target_cannot_hold_is_left_through_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # a GPU array going to a library without that GPU (CuPy to NumPy, or to a CPU-only JAX) is
    # copied off the device once, explicitly; simulated here by a torch tensor claiming cuda:7
    torch = pytest.importorskip("torch")
    usable("jax")
    real_place, real_host = shim._place, shim.to_host
    monkeypatch.setattr(shim, "_place", lambda a: "cuda:7" if shim.backend_name(a) == "torch" else real_place(a))
    seen: list[str] = []
    monkeypatch.setattr(shim, "to_host", lambda a: seen.append(shim.backend_name(a)) or real_host(a))
    t = torch.arange(6, dtype=torch.int32).view(torch.uint32)
    moved = aq.asarray(t, backend="jax")
    assert seen == ["torch"]
    assert shim.backend_name(moved) == "jax"
    monkeypatch.undo()
    same_bits(shim.to_host(moved), np.arange(6, dtype=np.uint32))


def test_unusable_cupy_is_named_when_asked_for_a_gpu() -> None:
    info = registry.probe("cupy")
    if info.usable:
        pytest.skip("a GPU is usable here")
    with pytest.raises(aq.BackendUnavailableError, match=r"^cupy is (not installed|installed but unusable)"):
        aq.asarray(np.ones(2, np.float32), backend="cupy", device="cuda:1")


def test_jax_lists_its_host_device() -> None:
    usable("jax")
    assert registry.probe("jax").devices[0] == "cpu"


def test_quantized_tensor_to_device_by_another_librarys_device() -> None:
    torch = pytest.importorskip("torch")
    usable("jax")
    qt = aq.quantize(aq.asarray(raw("float32", (4, 32)) * 0 + 1, backend="jax"), "q8s:block32:f16")
    moved = qt.to_backend("torch", device=qt.device)
    assert moved.device == torch.device("cpu")
    assert aq.to_bytes(moved) == aq.to_bytes(qt)


# ---------------------------------------------------------------------------------------------
# QuantizedTensor.to_backend: bit for bit, through DLPack
# ---------------------------------------------------------------------------------------------

SCHEMES = ["q8s", "q8s:block32:f16:native", "q4s:block32:f16", "q2s:block16:bf16", "nvfp4", "mxfp8", "mxfp4"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_tensor_round_trips_bit_for_bit(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    qt = aq.quantize(x, scheme)
    want = aq.to_bytes(qt)
    path = [n for n in ("torch", "jax", "array_api_strict", "torch", "numpy") if registry.probe(n).usable]
    if len(path) < 2:
        pytest.skip("needs torch, jax or array-api-strict")
    no_host(monkeypatch)
    moved = qt
    for name in path:
        moved = moved.to_backend(name)
        assert shim.backend_name(moved.values) == name
        assert shim.backend_name(moved.scales) == name
    monkeypatch.undo()
    assert aq.to_bytes(moved) == want
    np.testing.assert_array_equal(aq.dequantize(moved), aq.dequantize(qt))


def test_quantized_tensor_values_share_memory_with_numpy() -> None:
    usable("torch")
    qt = aq.quantize(np.ones((4, 32), np.float32), "q4s:block32:f32")
    moved = qt.to_backend("torch")
    assert moved.values.dtype == __import__("torch").uint32
    assert moved.values.data_ptr() == qt.values.ctypes.data


@pytest.mark.parametrize("name", ["torch", "jax", "array_api_strict"])
def test_quantize_and_dequantize_stay_off_the_host(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    usable(name)
    x = aq.asarray(np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32), backend=name)
    no_host(monkeypatch)
    for scheme in ("q8s:block32:f16", "q4s:block32:f16", "nvfp4"):
        y = aq.dequantize(aq.quantize(x, scheme))
        assert shim.backend_name(y) == name


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_the_target_lacks(dtype: str) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    usable("array_api_strict")
    host = np.zeros(3, getattr(ml_dtypes, dtype, None) or dtype)
    with pytest.raises(
        aq.DTypeError,
        match=rf"an array of dtype {dtype} cannot move to backend 'array_api_strict', which has no {dtype} dtype; "
        r"convert it to float32 first",
    ) as info:
        aq.asarray(host, backend="array_api_strict")
    assert isinstance(info.value, TypeError)


def test_narrow_dtype_into_numpy_without_ml_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    import sys

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # as if not installed
    with pytest.raises(
        aq.DTypeError,
        match=r"an array of dtype bfloat16 cannot move to backend 'numpy', which has no bfloat16 dtype "
        r"\(pip install ml-dtypes gives NumPy the narrow float dtypes\); convert it to float32 first",
    ):
        aq.asarray(torch.zeros(2, dtype=torch.bfloat16), backend="numpy")


@pytest.mark.parametrize(
    ("backend", "device", "pattern"),
    [
        ("torch", "cuda:0", r"device 'cuda:0' is not available to backend 'torch'; its devices are \['cpu'\]"),
        ("jax", "cuda:3", r"device 'cuda:3' is not available to backend 'jax'; its devices are \['cpu'\]"),
        ("jax", "cuda:one", r"device 'cuda:one' is not understood; use 'cpu', 'cuda' or 'cuda:N'"),
        ("array_api_strict", "cuda", r"device 'cuda' is not available to backend 'array_api_strict'; its devices"),
    ],
)
def test_device_not_available_on_this_machine(backend: str, device: str, pattern: str) -> None:
    usable(backend)
    if any(d.startswith("cuda") for d in registry.probe(backend).devices):
        pytest.skip(f"{backend} has a GPU here")
    with pytest.raises(aq.DeviceError, match=pattern) as info:
        aq.asarray(np.ones(2, np.float32), backend=backend, device=device)
    assert isinstance(info.value, ValueError)


def test_foreign_native_device_not_available() -> None:
    torch = pytest.importorskip("torch")
    usable("jax")
    with pytest.raises(
        aq.DeviceError,
        match=r"device device\(type='meta'\) is not available to backend 'jax'; its devices are \['cpu'",
    ):
        aq.asarray(np.ones(2, np.float32), backend="jax", device=torch.device("meta"))
    numpy_pattern = r"device device\(type='cuda', index=2\) is not available to backend 'numpy'"
    with pytest.raises(aq.DeviceError, match=numpy_pattern):
        aq.asarray([1.0], backend="numpy", device=torch.device("cuda", 2))


# ---------------------------------------------------------------------------------------------
# CuPy (run where a GPU is usable: ci/gpu-check.sh)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def cupy() -> Any:
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("cupy is not installed")
    import cupy

    if not cupy.cuda.is_available() or not registry.probe("cupy").usable:
        pytest.skip("no usable GPU")
    return cupy


@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_from_and_to_the_host_bit_identical(cupy: Any, dtype: str) -> None:
    host = raw(dtype)
    g = aq.asarray(host, backend="cupy", device="cuda:0")
    assert isinstance(g, cupy.ndarray)
    assert g.device.id == 0
    same_bits(cupy.asnumpy(g), host)
    same_bits(aq.asarray(g, backend="numpy"), host)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("other", ["torch", "jax"])
def test_cupy_gpu_hand_off_stays_on_the_gpu(cupy: Any, other: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    usable(other)
    if "cuda:0" not in registry.probe(other).devices:
        pytest.skip(f"{other} has no GPU here")
    host = raw(dtype)
    g = aq.asarray(host, backend="cupy")
    no_host(monkeypatch)
    there = aq.asarray(g, backend=other)
    back = aq.asarray(there, backend="cupy")
    monkeypatch.undo()
    assert shim.device_name(there.device) == "cuda:0"
    if other == "torch":
        assert there.data_ptr() == g.data.ptr  # same GPU, shared memory
    same_bits(cupy.asnumpy(back), host)


def test_cupy_quantize_and_dequantize_stay_on_the_device(cupy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    x = aq.asarray(np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32), backend="cupy")
    no_host(monkeypatch)
    for scheme in ("q8s:block32:f16", "q4s:block32:f16", "nvfp4", "mxfp8"):
        qt = aq.quantize(x, scheme)
        assert qt.values.device == x.device
        assert qt.scales.device == x.device
        y = aq.dequantize(qt)
        assert isinstance(y, cupy.ndarray)
        assert y.device == x.device


def test_cupy_quantized_tensor_round_trips(cupy: Any) -> None:
    x = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
    qt = aq.quantize(x, "nvfp4")
    moved = qt.to_backend("cupy")
    assert isinstance(moved.values, cupy.ndarray)
    assert aq.to_bytes(moved) == aq.to_bytes(qt)
    assert aq.to_bytes(moved.to_backend("numpy")) == aq.to_bytes(qt)


def test_cupy_second_gpu(cupy: Any) -> None:
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    host = raw("float32")
    g = aq.asarray(host, backend="cupy", device="cuda:1")
    assert g.device.id == 1
    qt = aq.quantize(g, "q8s:block32:f16")
    assert qt.values.device.id == 1
    assert aq.dequantize(qt).device.id == 1
    moved = qt.to_device("cuda:0")
    assert moved.values.device.id == 0
    assert aq.to_bytes(moved) == aq.to_bytes(qt)


def test_cupy_cpu_device_is_refused(cupy: Any) -> None:
    pattern = r"device 'cpu' is not available to backend 'cupy'; its devices are \['cuda:0'"
    with pytest.raises(aq.DeviceError, match=pattern):
        aq.asarray([1.0], backend="cupy", device="cpu")


def test_cupy_has_no_bfloat16(cupy: Any) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(
        aq.DTypeError, match=r"an array of dtype bfloat16 cannot move to backend 'cupy', which has no bfloat16 dtype"
    ):
        aq.asarray(np.zeros(4, ml_dtypes.bfloat16), backend="cupy")
