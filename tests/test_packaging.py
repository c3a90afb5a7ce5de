"""Packaging habits: one version source, ``arrayquant --version``, the PEP 561 marker shipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import arrayquant as aq
from arrayquant.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_version_has_one_source() -> None:
    project = _pyproject()
    assert "version" not in project["project"]  # no second copy to fall out of step
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "arrayquant._version.__version__"}
    assert isinstance(aq.__version__, str)
    assert aq.__version__.count(".") >= 2


def test_version_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"arrayquant {aq.__version__}\n"


def test_version_option_as_a_program() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "arrayquant", "--version"], capture_output=True, text=True, check=False, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"arrayquant {aq.__version__}\n"


def test_type_marker_ships() -> None:
    assert (Path(aq.__file__).parent / "py.typed").is_file()
    assert "py.typed" in _pyproject()["tool"]["setuptools"]["package-data"]["arrayquant"]
