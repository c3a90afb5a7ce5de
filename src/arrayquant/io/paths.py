"""Which files a model folder may make arrayquant read, and how they are opened and copied.

A folder from a stranger is hostile: its index names the shards, and those names must never
reach a file outside the folder, nor a FIFO that never opens or a device that never ends. The
rules, applied at every entry point (``aq.load``, ``inspect``, ``dequantize``, ``quantize``):

- a shard name is a bare file name of the folder (no folder part, no ``..``, no NUL, valid
  UTF-8) that is, after following links, a regular file inside the folder, or for a folder of
  the Hugging Face cache (``snapshots/<revision>``) inside that model's ``blobs`` folder, where
  the cache keeps the files its snapshots link to;
- files are opened without blocking and read only when they are regular files;
- files copied beside the weights are copied only when they are regular files after following
  links (a link to a regular file anywhere is copied by content), each bounded by the size it
  had when the copy started; folders are walked without following a link back into a folder
  already being copied, or out of the model's folder (where OUT itself may be being written).

Output paths are built only from names that passed these checks.
"""

from __future__ import annotations

import errno
import json
import os
import reprlib
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import CorruptDataError

__all__ = ["JSON_LIMIT", "copy_folder", "file_kind", "open_regular", "read_json", "shard_name"]

JSON_LIMIT = 64 * 2**20  # a config or index larger than this is not a model's (real ones are kilobytes)
_COPY_CHUNK = 1 << 20
_short = reprlib.Repr()
_short.maxstring, _short.maxother = 80, 80


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (for messages)."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading, only if it is (after links) a regular file.

    The open never blocks: a FIFO is opened non-blocking, seen for what it is and refused,
    rather than waiting forever for a writer.

    Raises
    ------
    CorruptDataError
        A FIFO, a device or a socket.
    IsADirectoryError
        A folder.
    OSError
        A missing file or one that cannot be opened, as ``open`` raises it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            msg = f"{path} is {file_kind(mode)}, not a regular file; arrayquant reads only regular files"
            raise CorruptDataError(msg)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json(path: Path, what: str, limit: int = JSON_LIMIT) -> Any:
    """The JSON in ``path`` (UTF-8), read only if it is a regular file of at most ``limit`` bytes.

    Raises
    ------
    CorruptDataError
        Not JSON, nested too deep for Python to parse, larger than ``limit``, not a regular file, or
        not readable (a folder, a dangling link, a link loop).
    """
    try:
        with open_regular(path) as f:
            data = f.read(limit + 1)
    except OSError as exc:  # a folder, a dangling link, a link loop: the model's file is broken
        msg = f"{path} cannot be read as {what}: {exc.strerror or exc}"
        raise CorruptDataError(msg) from None
    if len(data) > limit:
        msg = f"{path} is larger than {limit >> 20} MiB, too large for {what}; it is not a model's"
        raise CorruptDataError(msg)
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        msg = f"{path} is not JSON arrayquant can read ({what}): it is nested too deep"
        raise CorruptDataError(msg) from None
    except (UnicodeDecodeError, ValueError) as exc:
        msg = f"{path} is not JSON ({what}): {_short.repr(str(exc))}"
        raise CorruptDataError(msg) from None


def _roots(folder: Path) -> tuple[Path, ...]:
    """Where the files of ``folder`` may lie after following links: in it, or in the HF cache's blobs."""
    real = folder.resolve()
    roots = [real]
    blobs = real.parent.parent / "blobs"
    if real.parent.name == "snapshots" and blobs.is_dir():
        roots.append(blobs)
    return tuple(roots)


def shard_name(folder: Path, name: object, index: Path) -> str:
    """``name`` from the index ``index`` of ``folder``, checked to be a regular file of the folder.

    Raises
    ------
    CorruptDataError
        A name that is not a bare file name of the folder (absolute, with a folder part or
        ``..``, NUL, invalid UTF-8), or that is missing, a link loop, a folder, a FIFO, a device,
        or a link to a file outside the folder.
    """
    where = f"{index} names the shard {_short.repr(name)}"
    if not isinstance(name, str) or not name:
        raise CorruptDataError(f"{where}, which is not a file name")
    if "\x00" in name or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise CorruptDataError(f"{where}, which holds a NUL or an invalid character; a shard name is a file name")
    if name in (".", "..") or "/" in name or "\\" in name or os.sep in name:
        msg = f"{where}; a shard is named by a file name in the model's folder, without folders, '..' or a root"
        raise CorruptDataError(msg)
    path = folder / name
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:  # missing, a dangling link, a link loop
        raise CorruptDataError(f"{where}, which cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise CorruptDataError(f"{where}, which is {file_kind(mode)}, not a .safetensors file")
    real = path.resolve()
    if not any(real.is_relative_to(root) for root in _roots(folder)):
        msg = f"{where}, a link to a file outside the folder; arrayquant reads only the folder's own files"
        raise CorruptDataError(msg)
    return name


def _copy_file(src: Path, dst: Path) -> None:
    """Copy a regular file's bytes (at most the size it had when opened) and its mode and times."""
    with open_regular(src) as f:
        info = os.fstat(f.fileno())
        left = info.st_size
        with open(dst, "xb") as out:
            while left > 0:
                data = f.read(min(_COPY_CHUNK, left))
                if not data:
                    break
                out.write(data)
                left -= len(data)
    os.chmod(dst, stat.S_IMODE(info.st_mode))
    os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))


def copy_folder(
    source: Path, target: Path, leave_out: Callable[[Path], bool], names: list[str] | None = None
) -> tuple[list[str], list[str], dict[str, str]]:
    """Copy the regular files of ``source`` into ``target`` (which exists), recreating its folders.

    ``names`` limits the top level to those entries (default: all). ``leave_out`` tells which files
    are not copied. Returns the top-level names copied, the paths (relative to ``source``) left out
    by ``leave_out``, and the paths not copied because they are not regular files, with why.
    """
    copied: list[str] = []
    left: list[str] = []
    refused: dict[str, str] = {}
    active: set[tuple[int, int]] = set()  # the folders being copied, against links that loop

    def walk(folder: Path, into: Path, entries: list[str]) -> None:
        for entry in entries:
            src, rel = folder / entry, (folder / entry).relative_to(source)
            try:
                info = os.stat(src)
            except OSError as exc:  # a dangling link or a link loop
                refused[str(rel)] = exc.strerror or str(exc)
                continue
            if stat.S_ISDIR(info.st_mode):
                key = (info.st_dev, info.st_ino)
                if key in active:
                    refused[str(rel)] = "a link back to a folder that contains it"
                    continue
                if not src.resolve().is_relative_to(inside):  # it could hold OUT itself, being written
                    refused[str(rel)] = "a link to a folder outside the model's folder"
                    continue
                active.add(key)
                (into / entry).mkdir()
                walk(src, into / entry, sorted(os.listdir(src)))
                active.discard(key)
            elif not stat.S_ISREG(info.st_mode):
                refused[str(rel)] = f"{file_kind(info.st_mode)}, not a regular file"
                continue
            elif leave_out(rel):
                left.append(str(rel))
                continue
            else:
                _copy_file(src, into / entry)
            if folder == source:
                copied.append(entry)

    top, inside = os.stat(source), source.resolve()
    active.add((top.st_dev, top.st_ino))
    walk(source, target, sorted(os.listdir(source)) if names is None else names)
    return copied, left, refused
