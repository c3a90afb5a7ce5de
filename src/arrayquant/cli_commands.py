"""The checkpoint subcommands of ``arrayquant``: quantize, dequantize, inspect, compare, demo checkpoint.

Tensors are read one at a time straight from the file, at the offsets its header gives, into a
fresh buffer (no memory map: every page of a map that has been read counts against the process
until the map is closed, which for a whole checkpoint is the whole file), and written with
:func:`arrayquant.io.checkpoint.save_stream`, so memory stays near the largest tensor. Errors are
measured in row slabs of the dequantized tensor, never a full-size float64 copy. tqdm and
matplotlib are imported by the subcommands that use them, so ``arrayquant demo`` needs neither.
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import array_api_compat as compat
import numpy as np

from .backends import default, shim
from .chunks import Chunk, row_chunks
from .convert import asarray
from .dequantize import dequantize
from .errors import BackendUnavailableError, CorruptDataError, QuantizationError, ShapeError
from .invariants import plan_for
from .io.checkpoint import (
    _FORMAT_KEY,
    _PLAIN,
    _SIBLINGS,
    _TENSOR_KEY,
    FORMAT_VERSION,
    _load_quantized,
    _ml_dtype,
    save_stream,
)
from .quantize import quantize
from .scheme import QuantScheme
from .storage import fields_per_word
from .tensor import QuantizedTensor

__all__ = [
    "Checkpoint",
    "Entry",
    "ErrorStats",
    "compare_checkpoints",
    "dequantize_checkpoint",
    "inspect_checkpoint",
    "quantization_error",
    "quantize_checkpoint",
    "selected",
    "write_demo_checkpoint",
]

FLOAT_HEADERS = ("F64", "F32", "F16", "BF16")
_HEADER_LIMIT = 100 * 2**20  # safetensors' own limit on the JSON header
_SLAB = 1 << 18  # elements per error slab: a few MiB of float64 temporaries
_MiB = float(2**20)


def _missing(what: str) -> BackendUnavailableError:
    return BackendUnavailableError(f"this command needs {what}; pip install 'arrayquant[cli]'")


def _output_folder(path: str) -> None:
    """Refuse an output path whose folder is missing before any work (not later, naming a temporary file)."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(folder))


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        raise _missing("tqdm") from None
    return tqdm


# ---------------------------------------------------------------------------------------------
# reading a safetensors file tensor by tensor
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file: header dtype (``"F32"``), shape and absolute byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def nbytes(self) -> int:
        return self.stop - self.start

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Checkpoint:
    """A safetensors file opened for reading one tensor at a time; its header validated on open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = self.path.open("rb")
        try:
            self.entries, self.metadata = self._header()
            self.described = {k[len(_TENSOR_KEY) :]: v for k, v in self.metadata.items() if k.startswith(_TENSOR_KEY)}
            self._check_arrayquant()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._file.close()

    def _header(self) -> tuple[dict[str, Entry], dict[str, str]]:
        size = self.path.stat().st_size
        head = self._file.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0 or n > min(size - 8, _HEADER_LIMIT):
            msg = f"{self.path} ({size} bytes) does not start with a safetensors header; is it a .safetensors file?"
            raise CorruptDataError(msg)
        try:
            header = json.loads(self._file.read(n))
        except (UnicodeDecodeError, ValueError) as exc:
            msg = f"{self.path} has an unreadable safetensors header: {exc}"
            raise CorruptDataError(msg) from None
        if not isinstance(header, dict):
            msg = f"{self.path}: the safetensors header is not a JSON object"
            raise CorruptDataError(msg)
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            msg = f"{self.path}: the metadata must map strings to strings"
            raise CorruptDataError(msg)
        base, data_len = 8 + n, size - 8 - n
        entries = [self._entry(name, info, base, data_len) for name, info in header.items()]
        return {e.name: e for e in sorted(entries, key=lambda e: e.start)}, meta

    def _entry(self, name: str, info: Any, base: int, data_len: int) -> Entry:
        try:
            dtype = str(info["dtype"]).upper()
            shape = tuple(int(s) for s in info["shape"])
            start, stop = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"{self.path}: entry {name!r} has an unreadable header {info!r} ({exc})"
            raise CorruptDataError(msg) from None
        if dtype not in _PLAIN:
            msg = f"{self.path}: entry {name!r} has dtype {dtype}, expected one of {', '.join(_PLAIN)}"
            raise CorruptDataError(msg)
        need = math.prod(shape) * np.dtype(_PLAIN[dtype][0]).itemsize
        if min(shape, default=0) < 0 or not 0 <= start <= stop <= data_len or stop - start != need:
            msg = (
                f"{self.path}: entry {name!r} ({dtype}, shape {list(shape)}) has data offsets [{start}, {stop}] "
                f"but needs {need} bytes within the {data_len}-byte data section; the file is truncated or corrupt"
            )
            raise CorruptDataError(msg)
        return Entry(name, dtype, shape, base + start, base + stop)

    def _check_arrayquant(self) -> None:
        version = self.metadata.get(_FORMAT_KEY)
        if version is None and self.described:
            msg = (
                f"{self.path} describes quantized tensors but names no {_FORMAT_KEY}; it was not written by arrayquant"
            )
            raise CorruptDataError(msg)
        if version is not None and version != FORMAT_VERSION:
            msg = f"{self.path} has checkpoint format {version!r}; this arrayquant reads {FORMAT_VERSION!r}, upgrade it"
            raise CorruptDataError(msg)
        self.siblings = {n + s for n in self.described for s in _SIBLINGS}
        stray = [k for k in self.entries if k.endswith(_SIBLINGS) and k not in self.siblings]
        if stray:
            msg = f"{self.path} has entries {sorted(stray)} that belong to no quantized tensor in its metadata"
            raise CorruptDataError(msg)

    @property
    def tensors(self) -> list[Entry]:
        """The entries that are tensors of their own (not the ``.scales`` and other parts of one)."""
        return [e for e in self.entries.values() if e.name not in self.siblings]

    @property
    def user_metadata(self) -> dict[str, str]:
        """The metadata entries that are not arrayquant's own (carried over to a written file)."""
        return {k: v for k, v in self.metadata.items() if not k.startswith("arrayquant.")}

    def raw(self, name: str) -> np.ndarray:
        """The entry's data in its raw little-endian dtype (``uint16`` for BF16), shaped."""
        e = self.entries[name]
        buf = np.empty(e.nbytes, np.uint8)
        self._file.seek(e.start)
        if self._file.readinto(buf.data) != e.nbytes:
            msg = f"{self.path}: entry {name!r} is cut short; the file is truncated"
            raise CorruptDataError(msg)
        return buf.view(_PLAIN[e.dtype][0]).reshape(e.shape)

    def array(self, name: str) -> np.ndarray:
        """The entry as a NumPy array of its own dtype (BF16 and F8 through ml_dtypes), no copy."""
        return self.raw(name).view(self.array_dtype(name))

    def array_dtype(self, name: str) -> np.dtype[Any]:
        """The NumPy dtype :meth:`array` gives the entry, without reading it."""
        kind = self.entries[name].dtype
        if kind == "BF16" or kind.startswith("F8"):
            return np.dtype(_ml_dtype(_PLAIN[kind][1]))
        return np.dtype(np.bool_ if kind == "BOOL" else _PLAIN[kind][0])

    def quantized(self, name: str) -> QuantizedTensor:
        """The quantized tensor ``name`` on NumPy, validated as :func:`arrayquant.load` does."""
        parts = {
            k: {"dtype": self.entries[k].dtype, "shape": list(self.entries[k].shape), "data": self.raw(k).data}
            for k in (name, *(name + s for s in _SIBLINGS))
            if k in self.entries
        }
        scheme, shape, dtype, values, scales, glob, table = _load_quantized(name, self.described[name], parts)
        return QuantizedTensor(scheme, shape, getattr(np, dtype, np.float32), values, scales, glob, table)

    def stored_dtype(self, name: str) -> str:
        """The original dtype name of a quantized tensor, from the metadata."""
        return str(json.loads(self.described[name]).get("dtype", "float32"))


# ---------------------------------------------------------------------------------------------
# errors of a quantized tensor, measured in row slabs
# ---------------------------------------------------------------------------------------------

_HIST_EDGES = np.linspace(-12.0, 2.0, 141)  # log10 |error| bins, 0.1 decade each


@dataclass
class ErrorStats:
    """Running sums over the slabs of one or more tensors; a histogram of log10 |error| when asked."""

    signal: float = 0.0
    noise: float = 0.0
    max_err: float = 0.0
    count: int = 0
    hist: np.ndarray | None = None
    tiny: int = 0  # errors below the first bin, exact ones included

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1)
        err = np.array(y, np.float64).reshape(-1)  # a copy, whatever y is: the error is made in place
        np.subtract(err, x, out=err)
        self.signal += float(np.dot(x, x))
        self.noise += float(np.dot(err, err))
        self.count += err.size
        if err.size:
            np.abs(err, out=err)
            self.max_err = max(self.max_err, float(err.max()))
            if self.hist is not None:
                small = err < 10.0 ** _HIST_EDGES[0]
                self.tiny += int(np.count_nonzero(small))
                logs = np.log10(err[~small])
                self.hist += np.histogram(np.minimum(logs, _HIST_EDGES[-1]), _HIST_EDGES)[0]

    def merge(self, other: ErrorStats) -> None:
        self.count += other.count
        self.max_err = max(self.max_err, other.max_err)
        if self.hist is not None and other.hist is not None:
            self.hist += other.hist
            self.tiny += other.tiny

    @property
    def sqnr(self) -> float:
        """``10 log10(signal / noise)`` in dB; inf for an exact copy."""
        if self.noise == 0:
            return math.inf
        return -math.inf if self.signal == 0 else 10 * math.log10(self.signal / self.noise)


def _slabs(qt: QuantizedTensor) -> Iterator[Chunk]:
    """Row slabs of about ``_SLAB`` elements aligned to whole blocks and words, as dequantize uses."""
    plan = plan_for(qt.scheme)
    rank = len(qt.shape)
    dims = plan.block_dims(rank)
    chunks = row_chunks(qt.shape, dims[0] if dims else 1, plan.packed_axis(rank), fields_per_word(plan), True)
    row = math.prod(qt.shape[1:])
    group: list[Chunk] = []
    for c in chunks:
        group.append(c)
        if (c.rows.stop - group[0].rows.start) * row >= _SLAB or c is chunks[-1]:
            first = group[0]
            yield Chunk(
                slice(first.rows.start, c.rows.stop),
                slice(first.grid.start, c.grid.stop),
                slice(first.stored.start, c.stored.stop),
            )
            group = []


def quantization_error(x: Any, qt: QuantizedTensor, stats: ErrorStats) -> ErrorStats:
    """Add the error of ``qt`` against the original ``x`` (any backend) to ``stats``, slab by slab."""
    xp = compat.array_namespace(qt.values)
    per_tensor = not plan_for(qt.scheme).block_dims(len(qt.shape))
    for s in _slabs(qt):
        rows = s.rows.stop - s.rows.start
        part = QuantizedTensor(
            qt.scheme,
            (rows, *qt.shape[1:]),
            qt.dtype,
            qt.values[s.stored, ...],
            qt.scales if per_tensor else qt.scales[s.grid, ...],
            qt.global_scale,
            qt.table,
        )
        stats.add(shim.to_host(x[s.rows, ...]), shim.to_host(dequantize(part, xp.float32)))
    return stats


def _plain_error(x: np.ndarray, y: np.ndarray, stats: ErrorStats) -> ErrorStats:
    x2, y2 = x.reshape(x.shape[0] if x.ndim else 1, -1), y.reshape(y.shape[0] if y.ndim else 1, -1)
    step = max(1, _SLAB // max(x2.shape[1], 1))
    for r in range(0, x2.shape[0], step):
        stats.add(x2[r : r + step], y2[r : r + step])
    return stats


def _fmt_db(v: float) -> str:
    return "inf" if v == math.inf else "-inf" if v == -math.inf else f"{v:.2f}"


def _sqnr_summary(rows: Sequence[tuple[str, ErrorStats]]) -> str:
    if not rows:
        return "SQNR: n/a (no quantized tensor)"
    finite = [s.sqnr for _, s in rows if math.isfinite(s.sqnr)]
    mean = sum(finite) / len(finite) if finite else math.inf
    worst_name, worst = min(rows, key=lambda r: r[1].sqnr)
    return f"SQNR: mean {_fmt_db(mean)} dB, worst {_fmt_db(worst.sqnr)} dB ({worst_name})"


# ---------------------------------------------------------------------------------------------
# the subcommands
# ---------------------------------------------------------------------------------------------


def _is_bias(name: str) -> bool:
    return name.rsplit(".", 1)[-1].lower().endswith("bias")


def selected(e: Entry, include: Sequence[str], exclude: Sequence[str], min_size: int) -> bool:
    """Whether ``quantize`` quantizes ``e``: a floating tensor of rank >= 1 that ``include`` names
    (by default: a 2-D weight, not a norm or a bias), that no ``exclude`` glob names, with at least
    ``min_size`` elements."""
    if e.dtype not in FLOAT_HEADERS or not e.shape:
        return False
    if include:
        wanted = any(fnmatch.fnmatchcase(e.name, g) for g in include)
    else:
        wanted = len(e.shape) == 2 and "norm" not in e.name.lower() and not _is_bias(e.name)
    return wanted and not any(fnmatch.fnmatchcase(e.name, g) for g in exclude) and e.size >= min_size


def quantize_checkpoint(
    src: str,
    dst: str,
    scheme_text: str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    min_size: int = 0,
    backend: str | None = None,
    device: Any = None,
    quiet: bool = False,
) -> int:
    """``arrayquant quantize``: quantize the selected tensors of ``src`` into ``dst``, one at a time."""
    scheme = QuantScheme.parse(scheme_text)
    plan_for(scheme)  # refuse an impossible scheme before any work
    tqdm = _tqdm()
    _output_folder(dst)
    name = backend or default().name
    results: list[tuple[str, ErrorStats]] = []
    with Checkpoint(src) as ck:
        if ck.described:
            msg = (
                f"{src} already holds {len(ck.described)} quantized tensors (e.g. {next(iter(ck.described))!r}); "
                "quantize the original checkpoint, or `arrayquant dequantize` this one first"
            )
            raise QuantizationError(msg)
        chosen = {e.name for e in ck.tensors if selected(e, include, exclude, min_size)}
        with tqdm(
            total=sum(e.nbytes for e in ck.tensors),
            desc="quantize",
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            disable=quiet,
            dynamic_ncols=True,
        ) as bar:

            def items() -> Iterator[tuple[str, Any]]:
                for e in ck.tensors:
                    bar.set_postfix_str(e.name, refresh=False)
                    if e.name in chosen:
                        host = ck.array(e.name)
                        if e.dtype == "BF16" and name not in ("numpy", "jax"):  # no bfloat16 there: exact in f32
                            host = host.astype(np.float32)
                        x = asarray(host, backend=name, device=device)
                        del host
                        qt = quantize(x, scheme)
                        if e.dtype == "BF16":  # the original dtype, whichever backend quantized it
                            qt = dataclasses.replace(qt, dtype=ck.array_dtype(e.name))
                        results.append((e.name, quantization_error(x, qt, ErrorStats())))
                        del x  # only the quantized tensor is alive while it is written
                        yield e.name, qt
                        del qt
                    else:
                        yield e.name, ck.array(e.name)
                    bar.update(e.nbytes)

            save_stream(dst, items(), metadata=ck.user_metadata)
    before, after = Path(src).stat().st_size, Path(dst).stat().st_size
    print(
        f"quantized {len(results)} of {len(ck.tensors)} tensors with {scheme} ({len(ck.tensors) - len(results)} copied)"
    )
    print(f"size: {before / _MiB:.1f} MiB -> {after / _MiB:.1f} MiB ({before / max(after, 1):.2f}x smaller)")
    print(_sqnr_summary(results))
    if not results:
        print("warning: no tensor matched; the output is a copy of the input", file=sys.stderr)
    print(f"wrote {dst}")
    return 0


_OUT_DTYPES = ("float32", "float16", "bfloat16")


def _np_dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        return np.dtype(_ml_dtype("bfloat16"))
    return np.dtype(name if name in ("float64", "float32", "float16") else "float32")


def dequantize_checkpoint(src: str, dst: str, dtype: str | None = None) -> int:
    """``arrayquant dequantize``: every quantized tensor back to floats (``dtype``, default its original)."""
    counts = {"quantized": 0}
    _output_folder(dst)
    with Checkpoint(src) as ck:

        def items() -> Iterator[tuple[str, Any]]:
            for e in ck.tensors:
                if e.name in ck.described:
                    qt = ck.quantized(e.name)
                    counts["quantized"] += 1
                    yield e.name, dequantize(qt, _np_dtype(dtype or ck.stored_dtype(e.name)))
                else:
                    yield e.name, ck.array(e.name)

        save_stream(dst, items(), metadata=ck.user_metadata)
    what = dtype or "their original dtypes"
    size = Path(dst).stat().st_size / _MiB
    print(f"dequantized {counts['quantized']} of {len(ck.tensors)} tensors to {what}; wrote {dst} ({size:.1f} MiB)")
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    fmt = lambda r: "  ".join(
        c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
    )
    return [fmt(r).rstrip() for r in (header, ["-" * w for w in widths], *rows)]


def inspect_checkpoint(path: str) -> int:
    """``arrayquant inspect``: a row per tensor with its shape, scheme or dtype, bytes and scale range."""
    rows = []
    total = quantized = 0
    with Checkpoint(path) as ck:
        for e in ck.tensors:
            if e.name in ck.described:
                qt = ck.quantized(e.name)
                nbytes = sum(
                    ck.entries[k].nbytes for k in (e.name, *(e.name + s for s in _SIBLINGS)) if k in ck.entries
                )
                scales = np.asarray(qt.scales)
                span = f"{float(scales.min()):.3e}..{float(scales.max()):.3e}"
                if qt.global_scale is not None:
                    span += f" x {float(np.asarray(qt.global_scale)[0]):.3e}"
                rows.append([e.name, "x".join(map(str, qt.shape)), str(qt.scheme), f"{nbytes:,}", span])
                quantized += 1
            else:
                nbytes = e.nbytes
                rows.append([e.name, "x".join(map(str, e.shape)) or "()", _PLAIN[e.dtype][1], f"{nbytes:,}", "-"])
            total += nbytes
    print("\n".join(_table(["name", "shape", "scheme / dtype", "bytes", "scales min..max"], rows, {3})))
    print(f"\n{len(rows)} tensors, {quantized} quantized, {total / _MiB:.2f} MiB of tensor data")
    return 0


def _plot(path: str, stats: ErrorStats, tensors: int) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise _missing("matplotlib") from None
    assert stats.hist is not None
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas: no display, no global pyplot state
    ax = fig.add_subplot()
    ax.stairs(stats.hist, 10.0**_HIST_EDGES, fill=True, alpha=0.7)
    ax.set_xscale("log")
    seen = np.flatnonzero(stats.hist)
    if seen.size:  # the occupied decades, with one to spare on each side
        ax.set_xlim(10.0 ** (_HIST_EDGES[seen[0]] - 1), 10.0 ** (_HIST_EDGES[seen[-1] + 1] + 1))
    ax.set_xlabel("|dequantized - original|")
    ax.set_ylabel("values")
    below = f", {stats.tiny:,} below 1e-12 (exact included)" if stats.tiny else ""
    ax.set_title(f"Quantization error of {stats.count:,} values in {tensors} tensors{below}")
    fig.savefig(path, dpi=100)


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    step = 1 << 20
    return a.size == b.size and all(np.array_equal(a[i : i + step], b[i : i + step]) for i in range(0, a.size, step))


def compare_checkpoints(original: str, quantized: str, plot: str | None = None) -> int:
    """``arrayquant compare``: SQNR and maximum error of every tensor of ``quantized`` against ``original``."""
    new_stats: Callable[[], ErrorStats] = lambda: ErrorStats(
        hist=np.zeros(len(_HIST_EDGES) - 1, np.int64) if plot else None
    )
    total = new_stats()
    rows, measured = [], []
    with Checkpoint(original) as orig, Checkpoint(quantized) as ck:
        for e in ck.tensors:
            if e.name not in orig.entries:
                rows.append([e.name, "-", "-", "-", "only in QUANTIZED"])
                continue
            ref = orig.entries[e.name]
            if e.name in ck.described:
                qt = ck.quantized(e.name)
                if tuple(qt.shape) != ref.shape:
                    msg = f"tensor {e.name!r} is {list(qt.shape)} in {quantized} but {list(ref.shape)} in {original}"
                    raise ShapeError(msg)
                stats, kind = quantization_error(orig.array(e.name), qt, new_stats()), str(qt.scheme)
            elif e.dtype == ref.dtype and e.shape == ref.shape and _same_bytes(ck.raw(e.name), orig.raw(e.name)):
                rows.append([e.name, _PLAIN[e.dtype][1], "inf", "0", "identical"])
                continue
            elif e.dtype in FLOAT_HEADERS and ref.dtype in FLOAT_HEADERS and e.shape == ref.shape:
                stats, kind = _plain_error(orig.array(e.name), ck.array(e.name), new_stats()), _PLAIN[e.dtype][1]
            else:
                rows.append([e.name, _PLAIN[e.dtype][1], "-", "-", "differs"])
                continue
            measured.append((e.name, stats))
            total.merge(stats)
            rows.append([e.name, kind, _fmt_db(stats.sqnr), f"{stats.max_err:.3e}", ""])
        missing = [n.name for n in orig.tensors if n.name not in ck.entries and n.name not in ck.described]
    rows += [[n, "-", "-", "-", "missing from QUANTIZED"] for n in missing]
    print("\n".join(_table(["name", "scheme / dtype", "SQNR dB", "max |err|", "note"], rows, {2, 3})))
    print()
    print(_sqnr_summary(measured) + (f", max |err| {total.max_err:.3e}" if measured else ""))
    if plot:
        _plot(plot, total, len(measured))
        print(f"wrote {plot}")
    return 0


def write_demo_checkpoint(path: str, data: Callable[..., np.ndarray]) -> int:
    """A small f32 model checkpoint: two layers of 2-D weights, with 1-D norms and biases."""
    _output_folder(path)
    hidden, mlp, seed = 256, 512, 0

    def vector(n: int, base: float) -> np.ndarray:
        nonlocal seed
        seed += 1
        return (base + data(1, n, seed)[0]).astype(np.float32)

    def matrix(rows: int, cols: int) -> np.ndarray:
        nonlocal seed
        seed += 1
        return data(rows, cols, seed)

    def layers() -> Iterator[tuple[str, np.ndarray]]:
        yield "embed_tokens.weight", matrix(512, hidden)
        for i in range(2):
            p = f"layers.{i}."
            yield p + "input_norm.weight", vector(hidden, 1.0)
            for proj in ("q", "k", "v", "o"):
                yield f"{p}attn.{proj}_proj.weight", matrix(hidden, hidden)
            yield p + "attn.o_proj.bias", vector(hidden, 0.0)
            yield p + "post_attn_norm.weight", vector(hidden, 1.0)
            yield p + "mlp.up_proj.weight", matrix(mlp, hidden)
            yield p + "mlp.up_proj.bias", vector(mlp, 0.0)
            yield p + "mlp.down_proj.weight", matrix(hidden, mlp)
        yield "norm.weight", vector(hidden, 1.0)

    tensors = dict(layers())  # a few MiB
    save_stream(path, tensors.items(), metadata={"source": "arrayquant demo --write-checkpoint"})
    size = Path(path).stat().st_size / _MiB
    print(f"wrote {path}: {len(tensors)} float32 tensors ({size:.1f} MiB)")
    return 0
