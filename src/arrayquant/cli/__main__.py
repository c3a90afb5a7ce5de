"""``python -m arrayquant.cli``: the ``arrayquant`` command, as ``python -m arrayquant``."""

from __future__ import annotations

import sys

from . import main

__all__: list[str] = []  # run as a program, nothing to import

if __name__ == "__main__":
    sys.exit(main())
