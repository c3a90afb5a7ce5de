"""Which format ``quantize`` and ``dequantize`` write, from IN's format, OUT's suffix and ``--format``,
and the refusals of what they do not write, each naming the command that does it."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ..io.formats import by_suffix, get_format
from .common import CommandError, shown

__all__ = [
    "GGUF_SOURCE",
    "check_out_name",
    "out_format",
    "suffix",
    "title",
    "weight_paths",
    "weights_file_command",
    "with_suffix",
]

GGUF_SOURCE = (
    "GGUF files come from llama.cpp's converters (convert_hf_to_gguf.py), which add the model's "
    "architecture and tokenizer; arrayquant re-quantizes a GGUF file given as IN"
)


def title(name: str) -> str:
    """How messages name the files of the format ``name`` ("GGUF", "safetensors")."""
    return get_format(name).title


def suffix(name: str) -> str:
    """The suffix that names the files of the format ``name`` ("" for a folder format)."""
    return get_format(name).suffix


def out_format(kind: str, output: str) -> str:
    """``--format`` by default: the input's own format, or for safetensors the output's suffix."""
    if kind in ("gguf", "burnpack", "onnx"):
        return kind
    return "burnpack" if by_suffix(output) == "burnpack" else "arrayquant"


def with_suffix(path: str, new: str) -> str:
    """``path`` named with the suffix ``new`` instead of a format's suffix (or with it added)."""
    p = Path(path.rstrip("/\\") or path)
    if by_suffix(p) is not None:
        p = p.with_suffix("")
    return str(p) + new


def weight_paths(src: str) -> list[Path]:
    """The weight files of a model folder (or the one file given)."""
    from ..io.compressed_tensors.folder import weight_files

    source = Path(src)
    return [source] if source.is_file() else [source / name for name in weight_files(source)[0]]


def weights_file_command(src: str, out: str, scheme_text: str) -> str:
    """The ``arrayquant quantize`` command line that writes the weights of ``src`` (a model folder
    or a file) to the file ``out``, quoted for a POSIX shell; for a sharded folder, its first
    shard's, with a word on the others."""
    files = weight_paths(src)
    line = f"arrayquant quantize {shlex.quote(str(files[0]))} {shlex.quote(out)} --scheme {shlex.quote(scheme_text)}"
    if len(files) > 1:
        line += f" (for its first of {len(files)} shards; the others alike, each to a file of its own)"
    return shown(line)


def _folder_out(a: argparse.Namespace, fmt: str, named: str | None) -> None:
    """Refuse a model folder IN whose OUT or ``--format`` asks for one file, with the command that writes it."""
    src, out = shown(a.input), shown(a.output)
    if "gguf" in (fmt, named):
        f16 = shown(shlex.quote(with_suffix(a.output, "-f16.gguf")))
        msg = (
            f"IN {src} is a model folder and OUT {out} a GGUF file, which arrayquant does not write from a folder: "
            f"{GGUF_SOURCE}. Convert the folder with llama.cpp (python convert_hf_to_gguf.py {src} --outtype f16 "
            f"--outfile {f16}), then quantize that file: arrayquant quantize {f16} "
            f"{shown(shlex.quote(a.output))} --scheme {shown(shlex.quote(a.scheme))}"
        )
        raise CommandError(msg)
    if fmt == "compressed-tensors":  # OUT named .safetensors or .bpk
        assert named is not None
        msg = (
            f"IN {src} is a model folder, which quantize writes as a compressed-tensors folder, and OUT {out} "
            f"names a {title(named)} file: name a new folder, or for one {title(named)} file, "
            "quantize the weights: " + weights_file_command(a.input, a.output, a.scheme)
        )
        raise CommandError(msg)
    target = a.output if named == fmt else with_suffix(a.output, suffix(fmt))
    msg = (
        f"IN {src} is a model folder, which quantize writes as a compressed-tensors folder (drop --format "
        f"{fmt}); for one {title(fmt)} file, quantize the weights: " + weights_file_command(a.input, target, a.scheme)
    )
    raise CommandError(msg)


def check_out_name(a: argparse.Namespace, kind: str, fmt: str) -> None:
    """Refuse an OUT whose suffix names another format than the one quantize would write there."""
    named = by_suffix(a.output)
    if fmt == "matmulnbits" and named == "onnx":
        return  # MatMulNBits models are ONNX files
    if kind == "folder" and (fmt != "compressed-tensors" or named is not None):
        _folder_out(a, fmt, named)
    if named is None or named == fmt:
        return
    out = shown(a.output)
    if fmt == "compressed-tensors":
        msg = (
            f"--format compressed-tensors writes a model folder, and OUT {out} names a {title(named)} "
            f"file: name a new folder (without {Path(a.output).suffix})"
        )
    elif kind in ("gguf", "burnpack") and fmt == kind:
        msg = (
            f"IN {shown(a.input)} is a {kind} file: quantize writes {kind} from it, and OUT {out} names a "
            f"{title(named)} file; name OUT with {suffix(kind)}, or turn IN into safetensors with "
            f"arrayquant dequantize first"
        )
    elif named == "gguf":
        msg = GGUF_SOURCE
    else:
        given = f"--format {fmt}" if a.format else f"IN {shown(a.input)}"
        msg = (
            f"OUT {out} names a {title(named)} file but {given} makes quantize write "
            f"{title(fmt)}: name OUT with {suffix(fmt)}, or drop --format"
        )
    raise CommandError(msg)
