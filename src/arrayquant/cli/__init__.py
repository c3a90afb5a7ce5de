"""The ``arrayquant`` command: ``demo`` (the main job), ``backends``, ``bench``, and the file tools.

``quantize``, ``dequantize``, ``inspect`` and ``compare`` work on safetensors files, Hugging Face
model folders, GGUF and Burnpack files (an OUT named ``.safetensors``, ``.gguf`` or ``.bpk`` is
written in that format, or refused). Each command is a module that parses nothing, calls the
library and prints: :mod:`~arrayquant.cli.demo`, :mod:`~arrayquant.cli.backends`,
:mod:`~arrayquant.cli.quantize`, :mod:`~arrayquant.cli.dequantize`, :mod:`~arrayquant.cli.inspect`,
:mod:`~arrayquant.cli.compare` (``bench`` is :mod:`arrayquant.bench`'s). :mod:`~arrayquant.cli.parser`
holds the options, :mod:`~arrayquant.cli.targets` which format a command writes,
:mod:`~arrayquant.cli.common` what the commands share and :mod:`~arrayquant.cli.stats` the errors
they report. tqdm and matplotlib are imported by the commands that use them, so ``demo`` and
``backends`` run on NumPy and array-api-compat alone. :func:`main` runs a command line and turns
every failure into one line on stderr and an exit status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType

from ..errors import BackendUnavailableError, DeviceError, QuantizationError
from .common import CommandError, cli_message, shown
from .demo import DEMO_SCHEMES, demo_data
from .parser import build_parser

__all__ = ["DEMO_SCHEMES", "cli_message", "demo_data", "main"]


class _Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C, so temporary files are removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _: FrameType | None) -> None:
    for s in _STOP_SIGNALS:  # one is enough: let the cleanup run undisturbed
        signal.signal(s, signal.SIG_IGN)
    raise _Stopped(signum)


_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception while a command runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _stop) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _fail(text: str) -> int:
    # one line, printable: a library message may name a path or tensor with any characters in it
    print(shown(f"arrayquant: error: {text}".replace("\n", " ")), file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    0 ok, 1 an error (one line on stderr; ``--debug`` shows the traceback instead), 2 a usage
    error, 130 Ctrl-C, 128 + the signal number for SIGTERM and SIGHUP. Temporary files are
    removed in every case.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "schemes", "unset") is None:
        args.schemes = list(DEMO_SCHEMES)
    try:
        with _stop_on_signals():
            return int(args.func(args))
    except BrokenPipeError:  # output piped into a pager or `head` that closed early
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter's final flush quiet
        return 0
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("arrayquant: interrupted", file=sys.stderr)
        return 130
    except _Stopped as exc:
        if args.debug:
            raise
        print(f"arrayquant: stopped by {signal.Signals(exc.signum).name}", file=sys.stderr)
        return 128 + exc.signum
    except (QuantizationError, BackendUnavailableError, DeviceError) as exc:
        if args.debug:
            raise
        return _fail(f"{type(exc).__name__}: {cli_message(str(exc))}")
    except CommandError as exc:
        if args.debug:
            raise
        return _fail(str(exc))
    except MemoryError as exc:
        if args.debug:
            raise
        return _fail(f"out of memory ({exc or 'MemoryError'}); use a smaller input or a machine with more memory")
    except OSError as exc:  # a missing input, an unwritable output folder, a full disk
        if args.debug:
            raise
        where = f": {shown(str(exc.filename))}" if exc.filename else ""
        return _fail(f"{exc.strerror or exc}{where}")
