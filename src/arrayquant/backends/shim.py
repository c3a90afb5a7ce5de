"""The backend shim: the only place, with the registry, that names an array library.

Each capability dispatches on ``array_api_compat.is_*`` checks and falls back to standard-only
code: reinterpreting bytes as uint32 words, device strings, host transfer, floating-point
warnings, writeability, and the lazy finiteness guard of dask.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import array_api_compat as compat
import numpy as np

from ..errors import DeviceError, NonFiniteInputError
from .registry import get, namespace

__all__ = [
    "backend_name",
    "bytes_to_words",
    "convert",
    "flushes_subnormals",
    "guard_finite",
    "kernel_namespace",
    "native_device",
    "quiet",
    "slab_friendly",
    "to_host",
    "words_to_bytes",
    "writeable",
]


def backend_name(x: Any) -> str:
    """The registry name of the library ``x`` belongs to."""
    for name, test in (
        ("numpy", compat.is_numpy_array),
        ("cupy", compat.is_cupy_array),
        ("torch", compat.is_torch_array),
        ("jax", compat.is_jax_array),
        ("dask", compat.is_dask_array),
    ):
        if test(x):
            return name
    if compat.is_array_api_strict_namespace(compat.array_namespace(x)):
        return "array_api_strict"
    return type(x).__module__.split(".")[0]


def native_device(backend: str, device: Any) -> Any:
    """Turn ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a native device) into ``backend``'s device."""
    if device is None or not isinstance(device, str):
        return device
    backend = backend.strip().lower()
    text = device.strip().lower()
    kind, _, index = text.partition(":")
    if index and not index.isdigit():
        msg = f"device {device!r} is not understood; use 'cpu', 'cuda' or 'cuda:N'"
        raise DeviceError(msg)
    ordinal = int(index) if index else 0
    devices = get(backend).devices
    if backend == "array_api_strict":
        import array_api_strict

        if text in devices:
            return array_api_strict.Device("CPU_DEVICE" if text == "cpu" else text)
    elif kind == "cpu" and "cpu" in devices and not index:
        if backend == "torch":
            import torch

            return torch.device("cpu")
        if backend == "jax":
            import jax

            return jax.devices("cpu")[0]
        return "cpu"
    elif kind == "cuda" and f"cuda:{ordinal}" in devices:
        if backend == "cupy":
            import cupy

            return cupy.cuda.Device(ordinal)
        if backend == "torch":
            import torch

            return torch.device(f"cuda:{ordinal}")
        if backend == "jax":
            import jax

            return next(d for d in jax.devices() if d.platform == "gpu" and d.id == ordinal)
    msg = f"device {device!r} is not available to backend {backend!r}; its devices are {list(devices)}"
    raise DeviceError(msg)


def to_host(x: Any) -> np.ndarray:
    """A NumPy copy (or view) of ``x`` on the host."""
    if compat.is_numpy_array(x):
        return x
    if compat.is_cupy_array(x):
        return x.get()
    if compat.is_torch_array(x):
        return x.detach().cpu().numpy()
    if compat.is_dask_array(x):
        return np.asarray(x.compute())
    if backend_name(x) == "array_api_strict":
        import array_api_strict

        return np.asarray(array_api_strict.asarray(x, device=array_api_strict.Device("CPU_DEVICE"))._array)
    return np.asarray(x)


def convert(obj: Any, backend: str, device: Any = None) -> Any:
    """``obj`` (an array of any backend, or nested Python data) as a ``backend`` array on ``device``."""
    backend = str(backend).strip().lower()
    xp = namespace(backend)
    dev = native_device(backend, device)
    if compat.is_array_api_obj(obj) and backend_name(obj) == backend:
        return obj if dev is None else compat.to_device(obj, dev)
    host = to_host(obj) if compat.is_array_api_obj(obj) else np.asarray(obj)
    if backend == "dask":
        import dask.array as da

        return da.from_array(host, chunks="auto")
    if backend == "torch" and host.dtype == np.uint32:
        import torch

        t = torch.from_numpy(host.view(np.int32).copy()).view(torch.uint32)
        return t if dev is None else t.to(dev)
    return xp.asarray(host, device=dev) if dev is not None else xp.asarray(host)


def flushes_subnormals(xp: Any) -> bool:
    """Whether ``xp`` flushes f32 subnormal results to zero (XLA on CPU, CUDA with ``-ftz``).

    On such backends the smallest UE8M0 scale, 2^-127, reads back as 0; its stored code is the
    same (0x00) because encoding clamps the exponent.
    """
    return bool(compat.is_jax_namespace(xp) or compat.is_cupy_namespace(xp))


def writeable(x: Any) -> bool:
    """Whether results can be written into slices of arrays like ``x`` (eager, mutable)."""
    return compat.is_writeable_array(x) and not compat.is_lazy_array(x)


def slab_friendly(x: Any) -> bool:
    """Whether row slabs pay for ``x``: an eager array in host memory.

    Slabs keep temporaries in CPU caches and bound the working set; the outputs they are written
    into are new arrays, so a read-only input (a memory map, a loaded checkpoint) qualifies too. On
    a GPU slabs would only multiply kernel launches and synchronisations, and lazy or immutable
    arrays (dask, jax) fuse the work themselves.
    """
    if compat.is_numpy_array(x):
        return True
    if compat.is_torch_array(x):
        return bool(x.device.type == "cpu")
    return backend_name(x) == "array_api_strict"


@contextlib.contextmanager
def quiet(xp: Any) -> Iterator[None]:
    """Silence floating-point warnings (inf/inf, 0*inf) that the kernels handle on purpose."""
    if compat.is_numpy_namespace(xp) or compat.is_dask_namespace(xp) or compat.is_array_api_strict_namespace(xp):
        with np.errstate(all="ignore"):
            yield
    else:
        yield


def _check_chunk(block: np.ndarray) -> np.ndarray:
    if not np.isfinite(block).all():
        count = int(np.size(block) - np.count_nonzero(np.isfinite(block)))
        msg = (
            f"x has {count} non-finite element(s) in one chunk (found when the dask graph ran); "
            "clean the data or quantize with check_finite=False"
        )
        raise NonFiniteInputError(msg)
    return block


def guard_finite(x: Any) -> Any:
    """For lazy dask input: the same array, raising when computed if it holds NaN/inf."""
    if compat.is_dask_array(x):
        lazy: Any = x
        return lazy.map_blocks(_check_chunk, dtype=x.dtype)
    return x


class _ExactDivision:
    """A namespace whose ``divide`` is IEEE division on XLA.

    XLA rewrites ``a / broadcast(b)`` into ``a * broadcast(1 / b)``, which is off by one ulp for
    a large share of inputs and so changes scales and codes. Materialising both operands behind an
    optimisation barrier keeps a true division; everything else is the backend's own namespace.
    """

    def __init__(self, xp: Any) -> None:
        self._xp = xp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._xp, name)

    def divide(self, x1: Any, x2: Any) -> Any:
        import jax

        xp = self._xp
        shape = tuple(np.broadcast_shapes(tuple(x1.shape), tuple(x2.shape)))
        a = jax.lax.optimization_barrier(xp.broadcast_to(x1, shape))
        b = jax.lax.optimization_barrier(xp.broadcast_to(x2, shape))
        return xp.divide(a, b)


def kernel_namespace(xp: Any) -> Any:
    """The namespace kernels should use for ``xp``: itself, or a corrected one (see above)."""
    if compat.is_jax_namespace(xp):
        return _ExactDivision(xp)
    return xp


def _move_last(x: Any, axis: int, xp: Any) -> Any:
    perm = (*tuple(i for i in range(x.ndim) if i != axis), axis)
    return xp.permute_dims(x, perm)


def _move_back(x: Any, axis: int, xp: Any) -> Any:
    last = x.ndim - 1
    perm = (*tuple(range(axis)), last, *tuple(range(axis, last)))
    return xp.permute_dims(x, perm)


def _viewer(x: Any) -> Any:
    """A function reinterpreting the last axis of a contiguous copy as another dtype, if any."""
    if compat.is_numpy_array(x) or compat.is_cupy_array(x):
        lib = np if compat.is_numpy_array(x) else importlib.import_module("cupy")
        return lambda a, name: lib.ascontiguousarray(a).view(getattr(lib, name))
    if compat.is_torch_array(x):
        import torch

        def view(a: Any, name: str) -> Any:
            # torch calls size-1 axes contiguous whatever their strides, and its view checks them
            c_strides: list[int] = []
            step = 1
            for n in reversed(a.shape):
                c_strides.insert(0, step)
                step *= n
            if tuple(a.stride()) != tuple(c_strides):
                a = torch.empty(tuple(a.shape), dtype=a.dtype, device=a.device).copy_(a)
            return a.view(getattr(torch, name))

        return view
    return None


def bytes_to_words(b: Any, axis: int, *, xp: Any) -> Any:
    """Reinterpret groups of four bytes along ``axis`` as little-endian uint32 words."""
    last = _move_last(b, axis, xp)
    view = _viewer(b)
    if view is not None:
        return _move_back(view(last, "uint32"), axis, xp)
    # standard-only fallback: shifts on uint32
    dev = compat.device(b)
    shape = tuple(last.shape)
    quads = xp.reshape(xp.astype(last, xp.uint32), (*shape[:-1], shape[-1] // 4, 4))
    words = quads[..., 0]
    for k in range(1, 4):
        shift = xp.asarray(8 * k, dtype=xp.uint32, device=dev)
        words = xp.bitwise_or(words, xp.bitwise_left_shift(quads[..., k], shift))
    return _move_back(words, axis, xp)


def words_to_bytes(w: Any, axis: int, *, xp: Any) -> Any:
    """Inverse of :func:`bytes_to_words`: uint32 words to four uint8 bytes each along ``axis``."""
    last = _move_last(w, axis, xp)
    shape = tuple(last.shape)
    view = _viewer(w)
    if view is not None:
        raw = view(last, "uint8")
    else:
        dev = compat.device(w)
        mask = xp.asarray(255, dtype=xp.uint32, device=dev)
        parts = []
        for k in range(4):
            shifted = xp.bitwise_right_shift(last, xp.asarray(8 * k, dtype=xp.uint32, device=dev))
            parts.append(xp.astype(xp.bitwise_and(shifted, mask), xp.uint8))
        raw = xp.stack(parts, axis=-1)
    return _move_back(xp.reshape(raw, (*shape[:-1], shape[-1] * 4)), axis, xp)
