"""``arrayquant backends``: the array backends, whether they are usable and their devices, and the fused kernels."""

from __future__ import annotations

import argparse

from ..backends import available

__all__ = ["run"]


def run(_: argparse.Namespace) -> int:
    """``arrayquant backends``."""
    print(f"{'backend':<18} {'installed':<10} {'usable':<7} devices / reason")
    for info in available():
        detail = ", ".join(info.devices) if info.usable else info.reason
        print(f"{info.name:<18} {info.installed!s:<10} {info.usable!s:<7} {detail}")
    from ..fused.registry import describe

    print(f"\n{'fused kernels':<18} state")
    for kernels, state in describe():
        print(f"{kernels:<18} {state}")
    return 0
