"""The first lines the ``arrayquant`` command runs, before the package is imported.

Importing NumPy and arrayquant takes a moment; Ctrl-C in it would otherwise end the command
with a traceback and death by SIGINT. Until the command line takes over (it handles Ctrl-C
itself, removing temporary files), an interrupt exits with status 130 and one line, as later.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _interrupted(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write("arrayquant: interrupted\n")
    sys.stderr.flush()
    os._exit(130)  # nothing has been written yet: there is nothing to clean up


def main() -> None:
    """Run ``arrayquant``: exit 130 on Ctrl-C while loading, then :func:`arrayquant.cli.main`."""
    previous = signal.signal(signal.SIGINT, _interrupted)
    from arrayquant.cli import main as run

    signal.signal(signal.SIGINT, previous)
    sys.exit(run())
