"""``aq.asarray``: data onto a backend and device of the user's choice."""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from .backends import default, shim

__all__ = ["asarray"]


def asarray(obj: Any, *, backend: str | None = None, device: Any = None) -> Any:
    """``obj`` as an array of ``backend`` (default: ``aq.backends.default()``) on ``device``.

    An array already of that backend stays where it is unless ``device`` is given. Arrays of
    another library cross by DLPack: without a copy on the same device where both libraries may
    share memory, by one explicit copy between the host and a GPU (see the guide, "Devices and
    hand-off between libraries").

    Parameters
    ----------
    obj : array or array-like
        An array of any supported library, or Python/NumPy data.
    backend : {"numpy", "cupy", "torch", "jax", "dask", "array_api_strict"}, optional
        The target library; default: ``obj``'s own library, or ``aq.backends.default()`` for
        plain data.
    device : str or device, optional
        ``"cpu"``, ``"cuda:1"`` or a library's own device object.

    Returns
    -------
    array
        The data in ``backend`` on ``device``, bit for bit (bfloat16 and fp8 included).

    Raises
    ------
    BackendUnavailableError
        The backend is not installed or cannot run here (CuPy without a GPU).
    DeviceError
        A device the backend does not have.
    DTypeError
        A dtype the target library lacks.

    Examples
    --------
    >>> import arrayquant as aq
    >>> aq.asarray([1.0, 2.0], backend="numpy").tolist()
    [1.0, 2.0]
    """
    if backend is None:
        backend = shim.backend_name(obj) if compat.is_array_api_obj(obj) else default().name
    return shim.convert(obj, backend, device)
