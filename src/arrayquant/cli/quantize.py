"""``arrayquant quantize``: the float weights of a safetensors file, model folder, GGUF or Burnpack file
quantized into the format asked for, through the library's ``quantize_file``.

The command checks what it is given before any work or output (the scheme, the calibration and
the importance file, OUT's folder, OUT not being IN), calls the library with a progress bar, and
prints what the summary says: the tensors quantized and left out, the sizes, and the mean and
worst SQNR of the quantized tensors with a warning for those below
:data:`~arrayquant.cli.stats.QUALITY_FLOOR_DB`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PathError, SchemeError
from ..io.formats import dequantize_file, detect, format_module, quantize_file, tensor_shapes
from ..io.importance import check_importance, load_importance
from ..io.safetensors.reader import SafetensorsFile
from ..scheme import QuantScheme, QuantStore
from ..tensor import QuantizedTensor
from .common import (
    CommandError,
    MiB,
    check_calibration,
    check_scheme,
    not_the_input,
    output_folder,
    progress_bar,
    shown,
)
from .stats import ErrorStats, quality_warning, quantization_error, sqnr_summary
from .targets import GGUF_SOURCE, check_out_name, out_format, weight_paths, weights_file_command, with_suffix

__all__ = ["run"]


def run(a: argparse.Namespace) -> int:
    """``arrayquant quantize IN OUT --scheme SCHEME``: which format is written, then its command."""
    source = Path(a.input)
    kind = detect(source) if source.exists() else "arrayquant"  # a missing IN is reported further on
    if source.is_dir():
        kind = "folder"
    fmt = a.format or ("compressed-tensors" if kind == "folder" else out_format(kind, a.output))
    if kind in ("gguf", "burnpack") and fmt != kind:
        msg = (
            f"IN {shown(a.input)} is a {kind} file: quantize writes {kind} from it; turn it into "
            "safetensors with arrayquant dequantize first"
        )
        raise CommandError(msg)
    if fmt == "gguf" and kind not in ("gguf", "folder"):
        raise CommandError(GGUF_SOURCE)
    if (kind == "onnx") != (fmt in ("onnx", "matmulnbits")):
        msg = (
            f"IN {shown(a.input)} is an ONNX model: quantize writes ONNX from it (--format onnx or matmulnbits)"
            if kind == "onnx"
            else f"--format {fmt} writes ONNX models, from an ONNX model IN (a .onnx file)"
        )
        raise CommandError(msg)
    check_out_name(a, kind, fmt)
    arrayquant_only = a.min_size or a.backend or a.device or a.nonfinite != "error"
    gguf_options = a.pure or a.output_tensor_type or a.token_embedding_type or a.tensor_type
    if gguf_options and kind != "gguf":
        msg = "--pure, --output-tensor-type, --token-embedding-type and --tensor-type apply to GGUF IN and OUT only"
        raise CommandError(msg)
    if a.requantize and kind not in ("gguf", "burnpack"):
        msg = (
            "--requantize applies to GGUF and Burnpack IN; turn a quantized safetensors file or model folder "
            "into floats with arrayquant dequantize, then quantize that"
        )
        raise CommandError(msg)
    if fmt == "compressed-tensors":
        if arrayquant_only:
            msg = "--min-size, --backend, --device and --nonfinite apply to --format arrayquant only"
            raise CommandError(msg)
        return _folder(a)
    for given, flag in ((a.max_shard_size is not None, "--max-shard-size"), (a.no_fused_shards, "--no-fused-shards")):
        if given:
            msg = f"{flag} applies to --format compressed-tensors only (model folders)"
            raise CommandError(msg)
    if kind == "onnx":
        if arrayquant_only:
            msg = "--min-size, --backend, --device and --nonfinite do not apply to ONNX models"
            raise CommandError(msg)
        return _onnx(a, fmt)
    if kind in ("gguf", "burnpack"):
        if arrayquant_only:
            msg = f"--min-size, --backend, --device and --nonfinite do not apply to {kind} files"
            raise CommandError(msg)
        return _format_file(a, kind)
    return _safetensors(a, kind, fmt)


def _llama_quantize_options(a: argparse.Namespace) -> dict[str, Any]:
    """llama-quantize's options of a GGUF run, for :func:`arrayquant.quantize_file` (only those given)."""
    out: dict[str, Any] = {}
    if a.pure:
        out["pure"] = True
    if a.output_tensor_type:
        out["output_tensor_type"] = a.output_tensor_type
    if a.token_embedding_type:
        out["token_embedding_type"] = a.token_embedding_type
    pairs = []
    for item in a.tensor_type:
        pattern, sep, kind = item.partition("=")
        if not sep or not pattern or not kind:
            msg = f"--tensor-type {shown(item)}: it takes PATTERN=TYPE, e.g. attn_v=q8_0"
            raise CommandError(msg)
        pairs.append((pattern, kind))
    if pairs:
        out["tensor_types"] = pairs
    return out


def _importance_for(src: str, importance: str | None) -> dict[str, np.ndarray] | None:
    """The importance vectors of ``importance`` (a file), checked against the tensors of ``src``; None without one."""
    if importance is None:
        return None
    vectors = load_importance(importance)
    check_importance(vectors, tensor_shapes(src), shown(importance))
    return vectors


def _sizes(before: int, after: int, what: str = "") -> str:
    return f"size: {before / MiB:.1f} MiB -> {after / MiB:.1f} MiB{what} ({before / max(after, 1):.2f}x smaller)"


# ---------------------------------------------------------------------------------------------
# a safetensors file: arrayquant's layout, or a Burnpack file
# ---------------------------------------------------------------------------------------------


def _safetensors(a: argparse.Namespace, kind: str, fmt: str) -> int:
    """A safetensors IN quantized into arrayquant's layout (or a Burnpack file), one tensor at a time.

    The SQNR of each quantized tensor is measured while its input is in memory, in row slabs.
    """
    src, dst = a.input, a.output
    scheme = check_scheme(a.scheme)  # refuse an impossible scheme before any work or output
    vectors: dict[str, np.ndarray] = {}
    if a.importance is not None and a.calibration is not None:  # the file's own errors first
        vectors = load_importance(a.importance)
    check_calibration(scheme, a.calibration, a.importance is not None)
    output_folder(dst)
    not_the_input(src, dst)
    if kind == "compressed-tensors":  # a file: codes under float-looking names
        msg = (
            f"IN {shown(src)} is in compressed-tensors' layout: its weights are quantized already; quantize "
            "the float model, or turn this one back into floats first with arrayquant dequantize"
        )
        raise CommandError(msg)
    if a.importance is not None:
        check_importance(vectors, tensor_shapes(src), shown(a.importance))
    results: list[tuple[str, ErrorStats]] = []

    def observe(name: str, x: Any, qt: QuantizedTensor) -> None:
        results.append((name, quantization_error(x, qt, ErrorStats())))

    with SafetensorsFile(src) as st:  # the bar counts bytes
        sizes = {name: e.nbytes for name, e in st.entries.items()}
    with progress_bar(a.quiet, sizes) as step:
        summary = quantize_file(
            src,
            dst,
            scheme,
            format=fmt,
            include=a.include,
            exclude=a.exclude,
            min_size=a.min_size,
            progress=step,
            calibration=a.calibration,
            importance=vectors or None,
            nonfinite=a.nonfinite,
            backend=a.backend,
            device=a.device,
            observe=observe,
        )
    unused = [n for n in vectors if n not in summary.quantized]
    if unused:
        print(f"note: {len(unused)} importance vectors name tensors left unquantized (e.g. {unused[0]!r})")
    done, total = len(summary.quantized), len(summary.quantized) + len(summary.left_out)
    how = f" ({a.calibration} calibration)" if a.calibration else ""
    print(f"quantized {done} of {total} tensors with {scheme}{how} ({total - done} copied)")
    if vectors:
        weighted = sum(1 for n in summary.quantized if n in vectors)
        print(f"importance: {weighted} of {done} quantized tensors weighted by {shown(a.importance)}")
    print(_sizes(Path(src).stat().st_size, Path(dst).stat().st_size))
    print(sqnr_summary(results))
    quality_warning(results)
    if summary.zeroed:
        first = next(iter(summary.zeroed))
        print(
            f"note: --nonfinite zero set {sum(summary.zeroed.values())} NaN or infinite values to 0 in "
            f"{len(summary.zeroed)} tensors (e.g. {first!r})",
            file=sys.stderr,
        )
    if not summary.quantized:
        print("warning: no tensor matched; the output is a copy of the input", file=sys.stderr)
    print(f"wrote {shown(dst)}")
    return 0


# ---------------------------------------------------------------------------------------------
# a model folder: a compressed-tensors folder
# ---------------------------------------------------------------------------------------------


def _folder(a: argparse.Namespace) -> int:
    """``arrayquant quantize IN OUT --format compressed-tensors``: a model folder transformers and vLLM load.

    A scheme whose values compressed-tensors holds in another store (``e4m3``, whose default store
    packs four values in a u32, is stored one value per byte) is written in that store, with a
    note. It ends with the sizes of the weight files before and after, the mean and worst SQNR of
    the quantized weights (measured after writing, one weight at a time, against IN's floats) and
    a warning for any below the quality floor.
    """
    from ..io.compressed_tensors.requantize import parse_size

    src, dst = a.input, a.output
    scheme = check_scheme(a.scheme)
    scheme, note = _folder_scheme(scheme, a.scheme, src, dst)  # no format: refused before any work
    limit = None if a.max_shard_size is None else parse_size(_shard_size(a.max_shard_size))
    vectors = _importance_for(src, a.importance)
    not_the_input(src, dst)
    with progress_bar(a.quiet) as step:
        summary = quantize_file(
            src,
            dst,
            scheme,
            format="compressed-tensors",
            include=a.include,
            exclude=a.exclude,
            progress=step,
            max_shard_size=limit,
            calibration=a.calibration or "minmax",
            importance=vectors,
            fused_shards=not a.no_fused_shards,
        )
    if note:
        print(note)
    print(f"quantized {len(summary.quantized)} Linear weights with {scheme} as {summary.stored_as}")
    for module, why in sorted(summary.left_out.items()):
        print(f"  left in float: {shown(module)} ({why})")
    if summary.copied_files:
        print(f"copied {len(summary.copied_files)} other files: {', '.join(map(shown, summary.copied_files))}")
    if summary.skipped_files:
        names = ", ".join(map(shown, summary.skipped_files))
        print(f"not copied: {names} (float weights in another format, which an engine could load instead)")
    for name, why in sorted(summary.refused_files.items()):
        print(f"not copied: {shown(name)} ({why})")
    before = sum(p.stat().st_size for p in weight_paths(src))
    after = sum((Path(dst) / shard).stat().st_size for shard in summary.shards)
    print(_sizes(before, after, " of weight files"))
    results = _folder_errors(src, dst)
    print(sqnr_summary(results))
    quality_warning(results)
    print(f"wrote {shown(dst)} ({len(summary.shards)} weight file(s), config.json with its quantization_config)")
    for warning in summary.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _shard_size(text: str) -> str:
    """``--max-shard-size`` with its unit; a bare number is refused (it would be bytes: 5 is 5 bytes)."""
    if re.fullmatch(r"\s*\d+\s*", text):
        n = text.strip()
        msg = (
            f"--max-shard-size {n} has no unit; write one, e.g. {n}GB, {n}MB or {n}GiB "
            f"({n}B if you mean {n} bytes, which puts nearly every tensor in a shard of its own)"
        )
        raise CommandError(msg)
    return text


_FOLDER_SCHEMES = (
    "nvfp4, mxfp8, mxfp4, e4m3 (an f32, f16 or bf16 scale per tensor, row, group or 2-d block) and q8s, q4s, q2s, "
    "q8f, q4f, q2f (an f32, f16 or bf16 scale per tensor, row or group)"
)


def _folder_scheme(scheme: QuantScheme, text: str, src: str, dst: str) -> tuple[QuantScheme, str]:
    """The scheme a compressed-tensors folder is written with, and a note ("" or how it differs).

    A scheme that maps only in another store (``e4m3`` packed in u32 words, its default: the
    format stores one FP8 value per byte) is written in that store, values unchanged. Any other
    scheme without a compressed-tensors format is a :class:`SchemeError` that names the file
    command which keeps it.
    """
    from ..io.compressed_tensors.schemes import weight_format

    try:
        weight_format(scheme)
        return scheme, ""
    except SchemeError:
        pass
    native = dataclasses.replace(scheme, store=QuantStore.native())
    if native != scheme:
        try:
            weight_format(native)
        except SchemeError:
            pass
        else:
            return native, (
                f"note: compressed-tensors stores {scheme.value.name.lower()} values one per byte: {text} is "
                f"written as {native} (the same values, stored unpacked)"
            )
    msg = (
        f"scheme {text} has no compressed-tensors format, the layout a model folder is written in (it holds "
        f"{_FOLDER_SCHEMES}); to keep {text}, quantize the weights into arrayquant's own layout: "
        + weights_file_command(src, with_suffix(dst, ".safetensors"), text)
    )
    raise SchemeError(msg)


def _folder_errors(src: str, dst: str) -> list[tuple[str, ErrorStats]]:
    """The error of every quantized weight of the folder ``dst`` against its float in ``src``.

    Read after writing, one weight at a time: the compressed-tensors entries decoded from
    ``dst`` and the float tensor read from ``src``'s file a slab of rows at a time.
    """
    from ..io.compressed_tensors.model import iter_model

    results: list[tuple[str, ErrorStats]] = []
    with contextlib.ExitStack() as stack:
        where: dict[str, SafetensorsFile] = {}
        for path in weight_paths(src):
            st = stack.enter_context(SafetensorsFile(path))
            where.update(dict.fromkeys(st.entries, st))
        for _, name, tensor in iter_model(dst, passthrough=True):
            if isinstance(tensor, QuantizedTensor) and name in where:
                results.append((name, quantization_error(_Rows(where[name], name), tensor, ErrorStats())))
            del tensor
    return results


class _Rows:
    """A tensor of an open safetensors file whose row slabs are read as :func:`quantization_error` asks
    for them (``x[rows, ...]``): the float weight is never whole in memory, as when it was quantized."""

    def __init__(self, st: Any, name: str) -> None:
        self.st, self.name = st, name

    def __getitem__(self, key: tuple[slice, Any]) -> np.ndarray:
        rows = key[0]
        return np.asarray(self.st.rows(self.name, rows.start, rows.stop))


# ---------------------------------------------------------------------------------------------
# a GGUF or Burnpack file: the same format out
# ---------------------------------------------------------------------------------------------


def _format_file(a: argparse.Namespace, kind: str) -> int:
    """``arrayquant quantize IN OUT`` for a GGUF or Burnpack IN: the same format out, everything else kept.

    A weight that the run would quantize but that IN holds quantized already, in another type or
    scheme, is refused with a :class:`PathError` (llama-quantize refuses them too, without
    ``--allow-requantize``): quantizing quantized values adds a second error to the first. With
    ``--requantize`` each such weight is dequantized to float32 (into a hidden temporary file
    beside OUT, removed at the end) and quantized from there.
    """
    src, dst, scheme_text = a.input, a.output, a.scheme
    module = format_module(kind)
    output_folder(dst)
    not_the_input(src, dst)
    vectors = _importance_for(src, a.importance)
    llama = _llama_quantize_options(a) if kind == "gguf" else {}
    again: dict[str, str] = module.quantized_already(src, scheme_text, include=a.include, exclude=a.exclude, **llama)
    if again and not a.requantize:
        first = next(iter(again))
        msg = (
            f"IN {shown(src)} holds {len(again)} weight(s) quantized already that --scheme {shown(scheme_text)} "
            f"would quantize again (e.g. {first!r}, {again[first]}); quantizing quantized values adds a second "
            "error to the first, so they are not re-quantized by default: quantize the float model, or rerun "
            "with --requantize to dequantize each to float32 and quantize it from there"
        )
        raise PathError(msg)
    with progress_bar(a.quiet) as step, _float_copy(kind, src, dst, again) as source:
        summary = quantize_file(
            source,
            dst,
            scheme_text,
            format=kind,
            include=a.include,
            exclude=a.exclude,
            progress=step,
            # GGUF's default is ggml's own quantizer (llama-quantize's bytes); Burnpack's is minmax
            **({} if a.calibration is None else {"calibration": a.calibration}),
            importance=vectors,
            **llama,
        )
    what = summary.stored_as
    if summary.types:  # a llama-quantize mix: each tensor in its own type
        counts: dict[str, int] = {}
        for kind_of in summary.types.values():
            counts[kind_of] = counts.get(kind_of, 0) + 1
        mix = ", ".join(f"{k} x{c}" for k, c in sorted(counts.items()))
        print(f"quantized {len(summary.quantized)} tensors as {what} ({mix})")
    else:
        print(f"quantized {len(summary.quantized)} tensors as {what}")
    if again:
        done = [n for n in again if n in summary.quantized]
        print(f"re-quantized {len(done)} of them through float32 (--requantize): {_kinds(again, done)}")
    for name, other in summary.fallback.items():
        picked = "the type llama-quantize picks" if summary.types else f"{what} blocks"
        print(f"  {shown(name)}: rows of {picked} do not fit, written as {other} (llama-quantize's fallback)")
    for name, why in sorted(summary.left_out.items()):
        if name in again:
            why = f"{why}; it was {again[name]} in IN, dequantized to float32 by --requantize"
        print(f"  left as it was: {shown(name)} ({why})")
    lost = [n for n in again if n not in summary.quantized]
    if lost:
        print(
            f"warning: {len(lost)} weight(s) quantized in IN could not be quantized as {what} and are float32 now "
            f"(e.g. {lost[0]!r}); see the lines above",
            file=sys.stderr,
        )
    print(f"wrote {shown(dst)} ({Path(dst).stat().st_size / MiB:.1f} MiB, {kind})")
    return 0


def _onnx(a: argparse.Namespace, fmt: str) -> int:
    """``arrayquant quantize model.onnx out.onnx``: the linear layers' weights as QDQ or MatMulNBits."""
    output_folder(a.output)
    not_the_input(a.input, a.output)
    with progress_bar(a.quiet) as step:
        summary = quantize_file(
            a.input,
            a.output,
            a.scheme,
            format=fmt,
            include=a.include,
            exclude=a.exclude,
            progress=step,
            **({} if a.calibration is None else {"calibration": a.calibration}),
            importance=_importance_for(a.input, a.importance),
        )
    print(f"quantized {len(summary.quantized)} weights as {summary.stored_as} ({summary.scheme})")
    for name, why in sorted(summary.left_out.items()):
        print(f"  left as it was: {shown(name)} ({why})")
    print(f"wrote {shown(a.output)} ({Path(a.output).stat().st_size / MiB:.1f} MiB, {fmt})")
    return 0


def _kinds(was: dict[str, str], names: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for n in names:
        counts[was[n]] = counts.get(was[n], 0) + 1
    return ", ".join(f"{k} x{c}" for k, c in counts.items()) or "none"


@contextlib.contextmanager
def _float_copy(kind: str, src: str, dst: str, names: Collection[str]) -> Iterator[str]:
    """``src`` itself, or with ``names`` a hidden copy beside ``dst`` with those tensors dequantized
    to float32 (everything else as stored), removed on the way out."""
    if not names:
        yield src
        return
    folder = Path(dst).parent
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(dst).name}.", suffix=f".float{Path(src).suffix}", dir=folder)
    os.close(fd)
    try:
        dequantize_file(src, tmp, dtype="float32", format=kind, names=list(names))
        yield tmp
    finally:
        Path(tmp).unlink(missing_ok=True)
