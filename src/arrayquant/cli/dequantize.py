"""``arrayquant dequantize``: the quantized tensors of a safetensors file, model folder, GGUF or Burnpack
file back to floats, through the library's ``dequantize_file``, in the format OUT's name says."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..io.formats import by_suffix, dequantize_file, detect
from .common import CommandError, MiB, not_the_input, output_folder, shown
from .targets import GGUF_SOURCE, suffix, title

__all__ = ["run"]


def run(a: argparse.Namespace) -> int:
    """``arrayquant dequantize IN OUT``: which format is written, then its command."""
    source = Path(a.input)
    kind = detect(source) if source.exists() else "arrayquant"  # a missing IN is reported further on
    named = by_suffix(a.output)
    src, out = shown(a.input), shown(a.output)
    if kind == "compressed-tensors":
        if source.is_dir() and named is not None:
            msg = f"IN {src} is a model folder: dequantize writes a float model folder, and OUT {out} names a file"
            raise CommandError(msg + "; name a new folder")
        if named not in (None, "arrayquant"):
            msg = (
                f"IN {src} is a compressed-tensors file: dequantize writes a float safetensors file from it, and "
                f"OUT {out} names a {title(named)} file; name OUT with .safetensors"
            )
            raise CommandError(msg)
        return _folder(a.input, a.output, a.dtype)
    if kind in ("gguf", "burnpack"):
        if named == kind:
            return _same_format(kind, a.input, a.output, a.dtype)
        if named not in (None, "arrayquant"):
            msg = (
                f"IN {src} is a {kind} file: dequantize writes {kind} (OUT named {suffix(kind)}) or safetensors "
                f"from it, and OUT {out} names a {title(named)} file; name OUT with {suffix(kind)} or "
                ".safetensors"
            )
            raise CommandError(msg)
        return _floats_file(a.input, a.output, a.dtype)
    if named == "gguf":
        raise CommandError(GGUF_SOURCE)
    return _safetensors(a.input, a.output, a.dtype, out_format=named or "arrayquant")


def _nothing_quantized(src: str, what: str = "the output is a copy of the input") -> None:
    print(f"warning: {shown(src)} holds no quantized tensor; {what}", file=sys.stderr)


def _same_format(kind: str, src: str, dst: str, dtype: str | None) -> int:
    """``arrayquant dequantize IN.gguf OUT.gguf`` (and ``.bpk`` alike): the file back to floats in its format.

    Quantized tensors become ``dtype`` (default float32); every other tensor, and the file's
    key/values (GGUF: ``general.file_type`` set to the float type), param ids and scalars
    (Burnpack), are kept as stored.
    """
    output_folder(dst)
    not_the_input(src, dst)
    done = dequantize_file(src, dst, dtype=dtype or "float32", format=kind)
    size = Path(dst).stat().st_size / MiB
    total = len(done.dequantized) + len(done.copied)
    print(
        f"dequantized {len(done.dequantized)} of {total} tensors to {done.dtype}; wrote {shown(dst)} "
        f"({size:.1f} MiB, {kind})"
    )
    if not done.dequantized:
        _nothing_quantized(src)
    return 0


def _folder(src: str, dst: str, dtype: str | None) -> int:
    """``arrayquant dequantize IN OUT``: a compressed-tensors folder (or file) back to plain floats."""
    if Path(src).is_file():
        output_folder(dst)
    not_the_input(src, dst)
    done = dequantize_file(src, dst, dtype=dtype, format="compressed-tensors")
    if not done.dequantized:
        print(f"warning: {shown(src)} holds no quantized weight; the folder was copied as it is", file=sys.stderr)
    if done.dropped:
        kinds = sorted({name.rpartition(".")[2] for name in done.dropped})
        print(
            f"dropped {len(done.dropped)} activation/KV-cache scales ({', '.join(kinds)}): only an engine "
            "that quantizes activations at run time uses them"
        )
    what = "a model folder without quantization_config" if Path(src).is_dir() else "a float safetensors file"
    print(f"dequantized {len(done.dequantized)} weights; wrote {shown(dst)}, {what}")
    return 0


def _safetensors(src: str, dst: str, dtype: str | None = None, out_format: str = "arrayquant") -> int:
    """Every quantized tensor of a safetensors file back to floats (``dtype``, default its original),
    into a safetensors file or, with ``out_format="burnpack"``, a Burnpack file."""
    output_folder(dst)
    not_the_input(src, dst)
    done = dequantize_file(src, dst, dtype=dtype, format=out_format)
    total = len(done.dequantized) + len(done.copied)
    size = Path(dst).stat().st_size / MiB
    kind = ", burnpack" if out_format == "burnpack" else ""
    print(
        f"dequantized {len(done.dequantized)} of {total} tensors to {dtype or 'their original dtypes'}; "
        f"wrote {shown(dst)} ({size:.1f} MiB{kind})"
    )
    if not done.dequantized:
        _nothing_quantized(src)
    return 0


def _floats_file(src: str, dst: str, dtype: str | None = None) -> int:
    """``arrayquant dequantize IN OUT`` for GGUF and Burnpack IN: a safetensors file of floats.

    Quantized tensors become ``dtype`` (default float32); tensors read as float values (GGUF
    types without an arrayquant scheme) and plain arrays are written as they are.
    """
    output_folder(dst)
    not_the_input(src, dst)
    done = dequantize_file(src, dst, dtype=dtype, format="arrayquant")
    size = Path(dst).stat().st_size / MiB
    total = len(done.dequantized) + len(done.copied)
    print(f"dequantized {len(done.dequantized)} of {total} tensors; wrote {shown(dst)} ({size:.1f} MiB)")
    return 0
