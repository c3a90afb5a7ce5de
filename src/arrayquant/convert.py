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

    >>> import arrayquant as aq
    >>> aq.asarray([1.0, 2.0], backend="array_api_strict", device="device1").device
    array_api_strict.Device('device1')
    """
    if backend is None:
        backend = shim.backend_name(obj) if compat.is_array_api_obj(obj) else default().name
    return shim.convert(obj, backend, device)
