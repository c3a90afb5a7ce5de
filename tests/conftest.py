"""Fixtures shared by the command-line tests (the backend fixtures live in the root conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The demo's synthetic f32 checkpoint, written by the CLI itself."""
    from arrayquant.cli import main

    path = tmp_path / "model.safetensors"
    assert main(["demo", "--write-checkpoint", str(path)]) == 0
    capsys.readouterr()
    return path
