"""What every ``arrayquant`` command shares: its error, safe printing, checks made before any work,
the progress bar, tables, and library messages in command-line spelling."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendUnavailableError, QuantizationError, ShapeError
from ..invariants import plan_for
from ..quantize import quantize
from ..scheme import QuantScheme

__all__ = [
    "CommandError",
    "MiB",
    "check_calibration",
    "check_scheme",
    "cli_message",
    "missing",
    "natural_order",
    "not_the_input",
    "output_folder",
    "progress_bar",
    "shown",
    "table",
]

MiB = float(2**20)


class CommandError(Exception):
    """A command line that cannot be carried out as given (the CLI prints it and exits 1)."""


def missing(what: str) -> BackendUnavailableError:
    """The error for a command whose optional library is not installed."""
    return BackendUnavailableError(f"this command needs {what}; pip install 'arrayquant[cli]'")


def shown(text: str) -> str:
    """``text`` safe to print: characters that are not printable (a lone surrogate, a control
    character, a terminal escape) written as Python escapes, the rest as it is."""
    if text.isprintable():
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    return "".join(
        c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def output_folder(path: str) -> None:
    """Refuse an output path whose folder is missing, or that is a folder, before any work (not
    later, naming a temporary file)."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(folder))
    if Path(path).is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)


def not_the_input(src: str, dst: str) -> None:
    """Refuse to write OUT over IN: the same path, or the same file through a link."""
    try:
        same = os.path.samefile(src, dst)
    except OSError:  # OUT does not exist yet (or IN is missing: reading it reports that)
        same = False
    if same:
        msg = (
            f"OUT {shown(dst)} is the same file as IN {shown(src)}; writing it would replace the input, "
            "so name a new OUT"
        )
        raise CommandError(msg)


def check_scheme(text: str) -> QuantScheme:
    """Parse ``--scheme`` and check it, codebook included, before any work or output."""
    scheme = QuantScheme.parse(text)
    plan_for(scheme)
    # a lookup scheme's table is resolved by quantize: try it on one value; a ShapeError (a
    # packed axis that rank-2 data lacks) is decided per tensor, by its rank
    with contextlib.suppress(ShapeError):
        quantize(np.zeros((1, 1), np.float32), scheme)
    return scheme


def check_calibration(scheme: QuantScheme, text: str | None, weighted: bool = False) -> dict[str, Any]:
    """Check ``--calibration`` (and that ``--importance`` fits it) on one value before any work.

    Returns the keyword arguments for :func:`~arrayquant.quantize`: empty for the default
    (MinMax), so the call is the plain one. The library's own checks decide, so the CLI accepts
    exactly what ``quantize(..., calibration=text)`` accepts.
    """
    if text is None:
        if weighted:
            msg = "--importance weights a search: give it with --calibration mse or --calibration 4over6"
            raise CommandError(msg)
        return {}
    options: dict[str, Any] = {"calibration": text}
    probe: dict[str, Any] = {"importance": np.ones(1, np.float32)} if weighted else {}
    # a ShapeError (a packed axis rank-2 data lacks) is decided per tensor, as in check_scheme
    with contextlib.suppress(ShapeError):
        quantize(np.zeros((1, 1), np.float32), scheme, **options, **probe)
    return options


def natural_order(names: Iterable[str]) -> list[str]:
    """Names in natural order (``layers.2`` before ``layers.10``): one order for every command."""
    key = lambda n: [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", n)]
    return sorted(names, key=key)


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        raise missing("tqdm") from None
    return tqdm


@contextlib.contextmanager
def progress_bar(quiet: bool, sizes: Mapping[str, int] | None = None) -> Iterator[Callable[[str], None]]:
    """A callback counting tensors on a progress bar that appears with the first tensor; given the
    ``sizes`` of the tensors in bytes, the bar counts bytes out of their total.

    A refusal raised before any tensor is read (a path in use, a folder that is no model)
    leaves stderr with its one error line, no empty bar before it.
    """
    tqdm = None if quiet else _tqdm()
    bars: list[Any] = []

    def step(name: str) -> None:
        if tqdm is None:
            return
        if not bars:
            how = (
                {"unit": " tensors"}
                if sizes is None
                else {"total": sum(sizes.values()), "unit": "B", "unit_scale": True, "unit_divisor": 1024}
            )
            bars.append(tqdm(desc="quantize", file=sys.stderr, dynamic_ncols=True, **how))
        bars[0].set_postfix_str(shown(name), refresh=False)
        bars[0].update(1 if sizes is None else sizes.get(name, 0))

    try:
        yield step
    finally:
        for bar in bars:
            bar.close()


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """The lines of a table with a rule under ``header``; the columns in ``right`` aligned right."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    fmt = lambda r: "  ".join(
        c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
    )
    return [fmt(r).rstrip() for r in (header, ["-" * w for w in widths], *rows)]


# Python-API advice in library messages, and what to type on the command line instead
_CLI_SPELLING: tuple[tuple[str, Callable[[re.Match[str]], str]], ...] = (
    (r"build on QuantScheme\.(\w+)\(\)", lambda m: f"spell it out instead: {_spelled(m[1])}"),
    (r"QuantScheme\.(\w+)\(\)\.with_scale_rule\('(\w+)'\)", lambda m: f"{_spelled(m[1])}:{m[2]}"),
    (r"with_store\('(\w+)'\)", lambda m: f":{m[1]} in the scheme text"),
    (r"scheme\.with_mode\('(\w+)'\)", lambda m: f":{m[1]} in the scheme text"),
    (r"per_block\(size, '(\w+)'\)", lambda m: f"block<N>:{m[1]}"),
    (r"drop per_tensor\(\)", lambda m: "drop tensor:f32"),
    (r"per_tensor\('(\w+)'\)", lambda m: f"tensor:{m[1]}"),
    (r"e\.g\. with_value\('(\w+)'\)", lambda m: f"e.g. {m[1]}:block64:f32:lookup:nf4"),
    (r"with_value\('(\w+)'\)", lambda m: f"the value {m[1]}"),
    (
        r"pass table=aq\.NF4 or your codebook",
        lambda m: "use --scheme nf4, or end the scheme text with :nf4 (e.g. q4f:block64:f32:lookup:nf4)",
    ),
    (r" \(or the \w+ enum\)", lambda m: ""),
    (r"pass check_finite=False", lambda m: "rerun with --nonfinite saturate"),
    (r"pass nonfinite='(\w+)'", lambda m: f"rerun with --nonfinite {m[1]}"),
    (r"nonfinite='(\w+)'", lambda m: f"--nonfinite {m[1]}"),
)


def _spelled(preset: str) -> str:
    try:
        return QuantScheme.parse(preset).spelled_out()
    except QuantizationError:
        return preset


def cli_message(text: str) -> str:
    """A library error message with its Python-API advice given in command-line spelling."""
    for pattern, spelling in _CLI_SPELLING:
        text = re.sub(pattern, spelling, text)
    return text
