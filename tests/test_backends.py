"""The backend registry and shim on the libraries actually installed here."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends import registry, shim


def test_real_cupy_without_a_driver_is_installed_but_unusable() -> None:
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("cupy is not installed here; tests/test_errors.py simulates this case")
    import cupy

    if cupy.cuda.is_available():
        pytest.skip("a GPU is usable here; this checks the driverless case")
    registry.probe.cache_clear()
    info = registry.probe("cupy")
    assert (info.installed, info.usable, info.devices) == (True, False, ())
    assert info.reason.startswith("cupy is installed but unusable: ")
    with pytest.raises(aq.BackendUnavailableError, match="cupy is installed but unusable"):
        aq.backends.get("cupy")
    assert aq.backends.default().name == "numpy"


def test_numpy_is_always_usable() -> None:
    info = aq.backends.get("numpy")
    assert info.usable
    assert info.devices == ("cpu",)


@pytest.mark.parametrize("name", ["array_api_strict", "dask", "torch", "jax"])
def test_asarray_round_trips_through_every_installed_backend(name: str) -> None:
    if not registry.probe(name).usable:
        pytest.skip(f"{name} is not usable here: {registry.probe(name).reason}")
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    arr = aq.asarray(host, backend=name)
    assert shim.backend_name(arr) == name
    np.testing.assert_array_equal(shim.to_host(arr), host)
    words = np.array([[0xFFFFFFFF, 1, 0x80000000]], np.uint32)
    np.testing.assert_array_equal(shim.to_host(aq.asarray(words, backend=name)), words)


def test_quantized_tensor_moves_between_backends_bit_for_bit() -> None:
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    qt = aq.quantize(x, "q4s:block16:ue4m3:tensor:f32")
    for name in ("array_api_strict", "dask", "torch", "jax"):
        if not registry.probe(name).usable:
            continue
        moved = qt.to_backend(name)
        assert shim.backend_name(moved.values) == name
        assert aq.to_bytes(moved) == aq.to_bytes(qt)
        np.testing.assert_array_equal(shim.to_host(aq.dequantize(moved)), aq.dequantize(qt))


def test_to_device_on_array_api_strict() -> None:
    strict = pytest.importorskip("array_api_strict")
    x = aq.asarray(np.ones((4, 32), np.float32), backend="array_api_strict")
    qt = aq.quantize(x, "q8s:block32:f16").to_device("device1")
    assert qt.device == strict.Device("device1")
    assert aq.dequantize(qt).device == strict.Device("device1")
