"""Byte regions of a file: whole buffers, and C-order arrays written chunk by chunk."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ChunkTarget", "write_all"]


def write_all(fd: int, data: Any, offset: int) -> None:
    """Write every byte of ``data`` at ``offset``: one ``pwrite`` stops short at 2 GiB on Linux."""
    view = memoryview(data).cast("B")
    while len(view):
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


class ChunkTarget:
    """Where ``dask.array.store`` writes one array: its C-order region of a file, chunk by chunk.

    Each chunk is encoded to bytes and written with positioned writes, so chunks land in any
    order, from threads or from worker processes, and nothing of the array is held beyond the
    chunk in hand. ``start`` is the region's first byte, ``itemsize`` the bytes per element.
    """

    def __init__(
        self, path: str, start: int, shape: tuple[int, ...], itemsize: int, encode: Callable[[Any], bytes]
    ) -> None:
        self.path, self.start, self.shape, self.itemsize, self.encode = path, start, shape, itemsize, encode

    def __setitem__(self, index: tuple[slice, ...], block: Any) -> None:
        data = memoryview(self.encode(block)).cast("B")
        if not len(data):
            return
        shape = self.shape
        starts = [s.start or 0 for s in index]
        bshape = tuple(int(n) for n in block.shape)
        k = len(shape)
        while k > 1 and bshape[k - 1] == shape[k - 1]:
            k -= 1  # trailing axes the chunk spans entirely are contiguous with the axis before
        run = math.prod(bshape[k - 1 :]) * self.itemsize
        strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
        fd = os.open(self.path, os.O_WRONLY)
        try:
            for n, outer in enumerate(np.ndindex(*bshape[: k - 1])):
                flat = sum((starts[i] + outer[i]) * strides[i] for i in range(len(outer)))
                flat += sum(starts[i] * strides[i] for i in range(len(outer), len(shape)))
                write_all(fd, data[n * run : (n + 1) * run], self.start + flat * self.itemsize)
        finally:
            os.close(fd)
