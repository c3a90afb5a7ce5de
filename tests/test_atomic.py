"""The one publish rule of :mod:`arrayquant.io._atomic`: a temporary beside the target, fsync, rename, fsync."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from arrayquant.io import _atomic


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch ``os.fsync`` to note what each call syncs: ``"file"`` or ``"folder"`` (then sync it anyway)."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def _no_umask(monkeypatch: pytest.MonkeyPatch) -> None:
    def umask(_: int) -> int:
        raise AssertionError("os.umask changes the umask of every thread; it must not be called")

    monkeypatch.setattr(os, "umask", umask)


def test_a_file_is_fsynced_then_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_fsyncs(monkeypatch)
    target = tmp_path / "out.bin"
    _atomic.publish(target, lambda f, _: f.write(b"new"))
    assert seen == ["file", "folder"]
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_writes_by_path_are_synced_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that opens the file by its path itself (gguf-py) is published by the same rule."""
    seen = _record_fsyncs(monkeypatch)
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with _atomic.publishing(target) as (_, tmp):
        assert tmp.parent == tmp_path
        assert tmp.name.startswith(".out.bin.")
        assert tmp.name.endswith(".tmp")
        with open(tmp, "wb") as g:
            g.write(b"new")
        assert target.read_bytes() == b"old"  # nothing is in place before the end
    assert target.read_bytes() == b"new"
    assert seen == ["file", "folder"]


def test_a_folder_is_renamed_then_its_parent_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_fsyncs(monkeypatch)
    target = tmp_path / "model"
    with _atomic.building(target) as out:
        assert out.parent == tmp_path
        assert out.name.startswith(".model.")
        assert out.name.endswith(".partial")
        assert stat.S_IMODE(out.stat().st_mode) == 0o700  # private while it is built
        (out / "a.txt").write_text("a")
    assert seen == ["folder"]
    assert (target / "a.txt").read_text() == "a"
    assert os.listdir(tmp_path) == ["model"]


def test_an_empty_folder_is_replaced_a_full_one_is_not(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    with _atomic.building(target) as out:
        (out / "a.txt").write_text("a")
    assert os.listdir(target) == ["a.txt"]
    with pytest.raises(OSError, match="not empty"), _atomic.building(target) as out:
        (out / "b.txt").write_text("b")
    assert os.listdir(target) == ["a.txt"]
    assert os.listdir(tmp_path) == ["model"]


def test_the_umask_is_never_touched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_umask(monkeypatch)
    _atomic.publish(tmp_path / "f.bin", lambda f, _: f.write(b"x"))
    with _atomic.building(tmp_path / "d") as out:
        (out / "x").write_text("x")
    assert sorted(os.listdir(tmp_path)) == ["d", "f.bin"]


def test_the_writers_never_touch_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """safetensors, GGUF, Burnpack and model folders all publish without ``os.umask``."""
    import numpy as np

    import arrayquant as aq
    from arrayquant.io.arrayquant.checkpoint import save_stream
    from arrayquant.io.burn import burnpack
    from arrayquant.io.compressed_tensors import requantize as ct_model

    _no_umask(monkeypatch)
    x = np.ones((8, 64), np.float32)
    save_stream(tmp_path / "w.safetensors", iter([("model.layers.0.mlp.up_proj.weight", x)]), metadata={"format": "pt"})
    aq.save(tmp_path / "w.gguf", {"w": x})
    burnpack.save(tmp_path / "w.bpk", {"w": x})
    src = tmp_path / "m"
    src.mkdir()
    (tmp_path / "w.safetensors").rename(src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    ct_model.quantize_model(src, tmp_path / "q", "mxfp8")
    assert sorted(os.listdir(tmp_path)) == ["m", "q", "w.bpk", "w.gguf"]


class _Boom(Exception):
    pass


@pytest.mark.parametrize("error", [_Boom, KeyboardInterrupt])
@pytest.mark.parametrize("at", ["write", "fsync"])
def test_an_error_leaves_no_temporary(
    error: type[BaseException], at: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def write(f: BinaryIO, _: Path) -> None:
        f.write(b"half")
        if at == "write":
            raise error

    if at == "fsync":

        def fsync(_: int) -> None:
            raise error

        monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(error):
        _atomic.publish(target, write)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["out.bin"]
    assert target.read_bytes() == b"old"


@pytest.mark.parametrize("error", [_Boom, KeyboardInterrupt])
def test_a_failed_folder_leaves_no_temporary(error: type[BaseException], tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()

    def build() -> None:
        with _atomic.building(tmp_path / "model") as out:
            (out / "sub").mkdir()
            (out / "sub" / "a.txt").write_text("a")
            raise error

    with pytest.raises(error):
        build()
    assert os.listdir(tmp_path) == ["keep"]


def _modes(umask: int, folder: Path) -> Any:
    """The modes a file and a folder are published with, in a fresh interpreter under ``umask``."""
    code = f"""
        import json, os, stat
        from pathlib import Path
        os.umask({umask:#o})
        from arrayquant.io import _atomic
        folder = Path({str(folder)!r})
        _atomic.publish(folder / "f.bin", lambda f, _: f.write(b"x"))
        with _atomic.building(folder / "d") as out:
            (out / "x").write_text("x")
        mode = lambda p: stat.S_IMODE(p.stat().st_mode)
        print(json.dumps([mode(folder / "f.bin"), mode(folder / "d")]))
    """
    src = str(Path(_atomic.__file__).parents[2])  # this checkout, not whichever one is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
@pytest.mark.parametrize(("umask", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_modes_follow_the_umask(umask: int, file_mode: int, folder_mode: int, tmp_path: Path) -> None:
    assert _modes(umask, tmp_path) == [file_mode, folder_mode]
