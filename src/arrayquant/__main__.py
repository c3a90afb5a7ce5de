"""``python -m arrayquant``: the ``arrayquant`` command."""

from __future__ import annotations

import sys

from .cli import main

__all__: list[str] = []  # run as a program, nothing to import

if __name__ == "__main__":
    sys.exit(main())
