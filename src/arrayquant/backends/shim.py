"""The backend shim: with the registry and ``dask_graph``, the only place that names an array library.

Each capability dispatches on ``array_api_compat.is_*`` checks and falls back to standard-only
code: reinterpreting bytes as uint32 words, device strings, host transfer, floating-point
warnings and writeability.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import array_api_compat as compat
import numpy as np

from ..errors import DeviceError, DTypeError
from .registry import get, namespace

__all__ = [
    "backend_name",
    "bytes_to_words",
    "convert",
    "device_name",
    "flushes_subnormals",
    "kernel_namespace",
    "named_dtype",
    "native_device",
    "quiet",
    "quietly",
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


_DEVICE_LIBRARIES = {"torch": "torch", "cupy": "cupy", "jaxlib": "jax", "jax": "jax"}
_DEVICE_LIBRARIES["array_api_strict"] = "array_api_strict"


def device_name(device: Any) -> str:
    """``"cpu"``, ``"cuda:N"`` (or array-api-strict's device name) for a device of any library.

    >>> device_name("CUDA:1"), device_name("cpu")
    ('cuda:1', 'cpu')
    """
    if isinstance(device, str):
        return device.strip().lower()
    library = _DEVICE_LIBRARIES.get(type(device).__module__.split(".")[0])
    if library == "torch":
        return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
    if library == "cupy":
        return f"cuda:{device.id}"
    if library == "jax":
        return "cpu" if device.platform == "cpu" else f"cuda:{device.id}"
    if library == "array_api_strict":
        name = str(device).split("'")[1]
        return "cpu" if name == "CPU_DEVICE" else name.lower()
    return str(device)


def native_device(backend: str, device: Any) -> Any:
    """Turn ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a device of any library) into ``backend``'s device.

    A device of ``backend``'s own library is returned as it is; one of another library is read
    by its name (``torch.device("cuda", 1)`` is ``"cuda:1"`` to CuPy).
    """
    backend = backend.strip().lower()
    if device is None:
        return None
    if not isinstance(device, str):
        if _DEVICE_LIBRARIES.get(type(device).__module__.split(".")[0]) == backend:
            return device
        shown, device = device, device_name(device)
    else:
        shown = device
    text = device.strip().lower()
    kind, _, index = text.partition(":")
    if index and not index.isdigit():
        msg = f"device {shown!r} is not understood; use 'cpu', 'cuda' or 'cuda:N'"
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
    msg = f"device {shown!r} is not available to backend {backend!r}; its devices are {list(devices)}"
    raise DeviceError(msg)


def to_host(x: Any) -> np.ndarray:
    """A NumPy copy (or view) of ``x`` on the host.

    Arrays already in host memory (NumPy, torch and JAX on the CPU, array-api-strict's default
    device) come as zero-copy views through DLPack, a JAX array's as a read-only one; device
    arrays are copied explicitly; dask arrays are computed. bfloat16/fp8 data arrive as
    ``ml_dtypes`` arrays.
    """
    if compat.is_numpy_array(x):
        return np.asarray(x)
    if compat.is_cupy_array(x):
        return x.get()
    if compat.is_dask_array(x):
        return np.asarray(x.compute())
    if compat.is_torch_array(x) and x.device.type != "cpu":
        return _import(_exportable(x.detach().cpu(), "torch")[0], "torch", "numpy", private=True)
    if compat.is_torch_array(x) or compat.is_jax_array(x):
        source = backend_name(x)
        exportable, source, private = _exportable(x, source)
        if _place(exportable) == "cpu":
            return _import(exportable, source, "numpy", private)
        return np.asarray(x)  # a JAX array on a GPU: jax copies it to the host
    if backend_name(x) == "array_api_strict":
        import array_api_strict

        return np.asarray(array_api_strict.asarray(x, device=array_api_strict.Device("CPU_DEVICE"))._array)
    return np.asarray(x)


# ---------------------------------------------------------------------------------------------
# Hand-off between libraries (DLPack)
# ---------------------------------------------------------------------------------------------

# the dtypes DLPack carries between every pair of libraries; narrower ones (bfloat16, fp8) cross
# as their bytes in uint8 and are reinterpreted on the other side
_DLPACK_DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
    + ["float16", "float32", "float64", "complex64", "complex128"]
)
_IMPORTERS = {"numpy": "numpy", "torch": "torch", "jax": "jax.numpy", "cupy": "cupy"}
_IMPORTERS["array_api_strict"] = "array_api_strict"
# what a failed DLPack import raises: the exporter (BufferError), the importer (RuntimeError,
# TypeError for a dtype it lacks; jax's runtime errors are RuntimeErrors too)
_CANNOT_CROSS = (BufferError, RuntimeError, TypeError)


def _dtype_name(dtype: Any) -> str:
    """``"bfloat16"`` for ``torch.bfloat16``, ``ml_dtypes.bfloat16``, ``jnp.bfloat16``, ..."""
    return str(dtype).rsplit(".", 1)[-1].replace("'>", "")


def _native_dtype(backend: str, name: str) -> Any:
    """``backend``'s dtype called ``name``, or None when the library has no such dtype."""
    if backend in ("numpy", "cupy"):
        if name in _DLPACK_DTYPES:
            return np.dtype(name)
        if backend == "cupy":
            return None
        try:
            import ml_dtypes
        except ImportError:
            return None
        found = getattr(ml_dtypes, name, None)
        return None if found is None else np.dtype(found)
    lib = importlib.import_module(_IMPORTERS[backend])
    found = getattr(lib, name, None)
    if backend == "jax" and found is not None:
        return np.dtype(found)
    if backend == "array_api_strict" and found is not None and name not in _DLPACK_DTYPES:
        return None
    return found


def named_dtype(x: Any, name: str) -> Any:
    """The dtype called ``name`` (``"float16"``, ``"bfloat16"``) in the library of array ``x``, or None."""
    backend = backend_name(x)
    if backend == "dask":
        backend = "numpy"  # dask arrays take NumPy dtypes
    if backend not in _IMPORTERS:
        return None
    try:
        return _native_dtype(backend, name)
    except (ImportError, TypeError):
        return None


def _target_dtype(backend: str, name: str) -> Any:
    """:func:`_native_dtype`, or :class:`DTypeError` where ``backend`` lacks the dtype."""
    dtype = _native_dtype(backend, name)
    if dtype is None:
        hint = " (pip install ml-dtypes gives NumPy the narrow float dtypes)" if backend == "numpy" else ""
        msg = f"an array of dtype {name} cannot move to backend {backend!r}, which has no {name} dtype{hint}; "
        msg += "convert it to float32 first"
        raise DTypeError(msg)
    return dtype


def _place(x: Any) -> str | None:
    """Where a DLPack exporter keeps ``x``: ``"cpu"``, ``"cuda:N"``, or None (elsewhere)."""
    kind, index = x.__dlpack_device__()
    if int(kind) == 1:  # kDLCPU
        return "cpu"
    if int(kind) in (2, 13):  # kDLCUDA, kDLCUDAManaged
        return f"cuda:{int(index)}"
    return None


def _exportable(x: Any, source: str) -> tuple[Any, str, bool]:
    """``x`` made safe to hand over by DLPack, the library it now belongs to, and whether it is
    now a private copy (one nobody else can see, so free to share).

    Gives ``(None, source, False)`` where DLPack must not be used: dask (no DLPack),
    array-api-strict off its default device (its DLPack export calls every device the CPU, which
    would cross ``device1`` silently), and unknown libraries. Strided or negative-stride views are
    made contiguous first (torch aborts the process on negative strides, jax refuses gaps); a
    read-only NumPy array is copied (DLPack cannot say read-only: torch would write into it).
    """
    if source == "array_api_strict":
        import array_api_strict

        if x.device != array_api_strict.Device("CPU_DEVICE"):
            return None, source, False
        x, source = np.from_dlpack(x), "numpy"  # a view of its NumPy array, strides and all
    if source in ("numpy", "cupy"):
        if not x.flags.c_contiguous or (source == "numpy" and not x.flags.writeable):
            return _clone(x, source), source, True
        return x, source, False
    if source == "torch":
        x = x.detach().resolve_conj().resolve_neg()
        if x.device.type not in ("cpu", "cuda"):
            return None, source, False
        return (x, source, False) if x.is_contiguous() else (x.contiguous(), source, True)
    if source == "jax":
        return (x, source, False) if len(x.devices()) == 1 else (None, source, False)  # sharded: gather
    return None, source, False


def _as_bytes(x: Any, source: str) -> Any:
    """The bytes of contiguous ``x`` as uint8 of shape ``(*x.shape, itemsize)``, in ``source``."""
    shape = tuple(x.shape)
    if source == "jax":
        import jax

        raw = jax.lax.bitcast_convert_type(x, np.uint8)
        return raw.reshape((*shape, 1)) if raw.ndim == len(shape) else raw
    if source == "torch":
        import torch

        return x.reshape(-1).view(torch.uint8).reshape((*shape, x.element_size()))
    lib = np if source == "numpy" else importlib.import_module("cupy")
    return x.reshape(-1).view(lib.uint8).reshape((*shape, x.dtype.itemsize))


def _from_bytes(raw: Any, dtype: Any, backend: str) -> Any:
    """Inverse of :func:`_as_bytes` on ``backend``: uint8 ``(*shape, itemsize)`` as ``dtype``."""
    shape = tuple(raw.shape)[:-1]
    if backend == "jax":
        import jax

        if raw.shape[-1] == 1:
            raw = raw.reshape(shape)
        return jax.lax.bitcast_convert_type(raw, dtype)
    if backend == "array_api_strict":
        import array_api_strict

        host = np.from_dlpack(raw).reshape(-1).view(np.dtype(_dtype_name(dtype))).reshape(shape)
        return array_api_strict.asarray(host)
    return raw.reshape(-1).view(dtype).reshape(shape)


def _clone(y: Any, backend: str) -> Any:
    """A copy of ``y`` that owns its memory, in ``backend``."""
    if backend == "torch":
        return y.clone()
    if backend == "jax":
        import jax.numpy as jnp

        return jnp.array(y, copy=True)
    if backend == "array_api_strict":
        import array_api_strict

        return array_api_strict.asarray(y, copy=True)
    if backend == "cupy":
        with y.device:  # CuPy copies onto the current device, not the array's
            return y.copy(order="C")
    return y.copy(order="C")


def _import(x: Any, source: str, backend: str, private: bool = False) -> Any:
    """Exportable ``x`` as a ``backend`` array on the same device, through DLPack.

    Memory is shared where both sides may share it: never into JAX (its arrays are immutable, so
    must not alias memory anyone can write) and never from JAX into a library that writes in place
    (NumPy gets a read-only view). A dtype DLPack cannot carry crosses as uint8 bytes.
    """
    name = _dtype_name(x.dtype)
    dtype = _target_dtype(backend, name)
    lib = importlib.import_module(_IMPORTERS[backend])
    must_copy = not private and (backend == "jax" or (source == "jax" and backend != "numpy"))
    y = None
    if name in _DLPACK_DTYPES:
        with contextlib.suppress(*_CANNOT_CROSS):
            y = lib.from_dlpack(x)
    if y is None:
        y = _from_bytes(lib.from_dlpack(_as_bytes(x, source)), dtype, backend)
    return _clone(y, backend) if must_copy else y


def convert(obj: Any, backend: str, device: Any = None) -> Any:
    """``obj`` (an array of any backend, or nested Python data) as a ``backend`` array on ``device``.

    Arrays cross between NumPy, torch, JAX, CuPy and array-api-strict by DLPack: on the same
    device without a copy where both libraries allow sharing, between the host and a GPU by one
    explicit copy, never through the host when both sides are on the same GPU. Without ``device``
    the data stays on its device when ``backend`` can hold it there, else it lands on the host.
    Dask has no DLPack: its arrays are computed, and new dask arrays are made from host data.
    """
    backend = str(backend).strip().lower()
    xp = namespace(backend)
    dev = native_device(backend, device)
    if not compat.is_array_api_obj(obj) or isinstance(obj, np.generic):
        x, source, private = np.asarray(obj), "numpy", True  # Python data, NumPy scalars
    elif (source := backend_name(obj)) == backend:
        return obj if dev is None else compat.to_device(obj, dev)
    else:
        x, source, private = _exportable(obj, source)
    if x is None or backend == "dask":
        x, source, private = _exportable(to_host(x if x is not None else obj), "numpy")
    if backend == "dask":
        import dask.array as da

        return da.from_array(x, chunks="auto")
    place = _place(x)
    if place not in get(backend).devices:
        if place == "cpu":  # into a library without a host device (CuPy): one explicit copy
            _target_dtype(backend, _dtype_name(x.dtype))
            return xp.asarray(_import(x, source, "numpy", private), device=dev)
        x, source, _ = _exportable(to_host(x), "numpy")  # off the device, explicitly
        place, private = "cpu", True
    # a move between the host and a GPU copies anyway, so the import need not
    crossing = dev is not None and device_name(dev).startswith("cuda") != str(place).startswith("cuda")
    y = _import(x, source, backend, private or crossing)
    return y if dev is None else compat.to_device(y, dev)


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


def quietly(fn: Any, *arrays: Any) -> Any:
    """``fn(xp, *arrays)`` for an elementwise ``fn``, without NumPy's floating-point warnings.

    Dask runs NumPy only when the result is computed, outside any ``errstate`` set here, so there
    ``fn`` runs block by block under ``errstate`` (still lazy; ``fn`` must be elementwise).
    """
    xp = compat.array_namespace(*arrays)
    if compat.is_dask_namespace(xp):
        import dask.array as da

        host = compat.array_namespace(np.empty(0))

        def block(*blocks: Any) -> Any:
            with np.errstate(all="ignore"):
                return fn(host, *blocks)

        return da.map_blocks(block, *arrays)
    with quiet(xp):
        return fn(xp, *arrays)


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
