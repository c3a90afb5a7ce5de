"""Atomic publish: the one rule every writer of :mod:`arrayquant.io` uses to put a file or folder in place.

A file is written to a hidden temporary beside the target (``.<name>.<random>.tmp``), flushed and
fsynced, renamed over the target with :func:`os.replace`, and then the containing folder is fsynced
so that the rename itself survives a crash. A folder is built in a hidden temporary folder
(``.<name>.<random>.partial``) that is renamed into place the same way. On any error, a
:class:`KeyboardInterrupt` included, the temporary is removed and the target is left as it was.

Permissions: a published file gets the mode ``open(path, "w")`` would give it (``0o666`` less the
umask, or what a default ACL of the folder says), a folder the mode of ``os.mkdir``. The umask is
never read or changed: :func:`os.umask` can only be read by setting it, which is process-global and
races with every thread creating files meanwhile. Instead the kernel applies it, as it does to any
new file: the temporary file is created with ``os.open(..., 0o666)``, and the temporary folder with
``os.mkdir(..., 0o777)``, whose mode is recorded and restored after the folder is built private
(``0o700``, as :func:`tempfile.mkdtemp` makes it). This is also right where ``/proc`` is missing
(macOS, containers without it) and where a default ACL, not the umask, decides the mode.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["building", "publish", "publishing", "sync", "sync_folder"]

_TRIES = 100  # names tried before giving up, as tempfile does with TMP_MAX
_FLAGS = (
    os.O_RDWR
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def _hidden(target: Path, suffix: str) -> Path:
    return target.parent / f".{target.name}.{secrets.token_hex(4)}{suffix}"


def _create_file(target: Path) -> tuple[int, Path]:
    """A new hidden file beside ``target``, open for writing, with the mode the umask gives a new file."""
    for _ in range(_TRIES):
        tmp = _hidden(target, ".tmp")
        try:
            return os.open(tmp, _FLAGS, 0o666), tmp
        except FileExistsError:
            continue
    msg = f"no unused temporary name beside {target}"
    raise FileExistsError(msg)


def _create_folder(target: Path) -> Path:
    """A new hidden folder beside ``target``, with the mode the umask gives a new folder."""
    for _ in range(_TRIES):
        tmp = _hidden(target, ".partial")
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            continue
        return tmp
    msg = f"no unused temporary name beside {target}"
    raise FileExistsError(msg)


def sync(f: BinaryIO) -> None:
    """Flush ``f`` and fsync it: its data is on the disk once this returns."""
    f.flush()
    os.fsync(f.fileno())


def sync_folder(folder: Path) -> None:
    """Fsync a folder, so that a rename into it survives a crash (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except (PermissionError, IsADirectoryError):  # Windows opens no folder
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def publishing(target: Path) -> Iterator[tuple[BinaryIO, Path]]:
    """A new hidden temporary file beside ``target``, open for writing, that replaces it when the block ends.

    The block writes through the file object, or by the path (another handle on the same file:
    :func:`sync` here syncs all its data either way). At the end the file is flushed, fsynced and
    closed, renamed over ``target``, and the folder is fsynced; on any error (``KeyboardInterrupt``
    too) the temporary is removed and ``target`` is left as it was.
    """
    fd, tmp = _create_file(target)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, tmp
            sync(f)
        os.replace(tmp, target)
        sync_folder(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def publish(target: Path, write: Callable[[BinaryIO, Path], None]) -> None:
    """Write a file atomically: ``write(file, its path)`` fills a temporary that then replaces ``target``."""
    with publishing(target) as (f, tmp):
        write(f, tmp)


@contextlib.contextmanager
def building(target: Path) -> Iterator[Path]:
    """A new hidden folder beside ``target`` that becomes it when the block ends, or is removed on failure.

    The folder is private (``0o700``) while it is built and gets a new folder's mode at the end.
    ``target`` may exist as an empty folder, which is replaced.
    """
    tmp = _create_folder(target)
    try:
        mode = stat.S_IMODE(tmp.stat().st_mode)  # what the kernel gave it under the umask (or a default ACL)
        tmp.chmod(0o700)
        yield tmp
        tmp.chmod(mode)
        if target.is_dir():
            target.rmdir()  # fails unless empty
        os.replace(tmp, target)
        sync_folder(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
