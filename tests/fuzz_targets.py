"""Fuzz targets and a memory-capped harness for every reader of untrusted input.

A *case* is ``(target, seed)``: the seed alone decides what the case does, so any outcome can be
replayed (``python ci/fuzz.py --replay TARGET:SEED``) and turned into a stand-alone Python
reproducer (:func:`reproducer`). Targets:

- ``load``: ``aq.load`` of a mutated checkpoint, every tensor checked (dequantize, Burn bytes
  round trip);
- ``cli``: the CLI's own reader (``cli_commands.Checkpoint``: open, walk ``.tensors``,
  ``.array`` / ``.quantized`` + ``aq.dequantize``), which must accept exactly what ``load``
  accepts; on every fourth case also ``arrayquant inspect``, ``dequantize`` and ``compare``
  through ``cli.main`` with a strict UTF-8 stdout, expecting exit 0 or 1 and no traceback;
- ``nvfp4``: ``read_nvfp4`` of a mutated compressed-tensors file or of a mapping of arrays of
  any dtype, shape and layout, or of things that are not arrays;
- ``gguf``, ``burnpack``: ``aq.load`` (the format found from the content) of a mutated GGUF or
  Burnpack file written by arrayquant, every tensor checked; on every fourth case also
  ``arrayquant inspect`` and ``dequantize``;
- ``bytes``: ``aq.from_bytes(buf, scheme, shape)`` + ``aq.dequantize`` with random scheme text
  (block extents up to 2**64 and 5,000 digits, 70-dimensional blocks, two levels, every scale
  dtype, lookup, stores), random shapes (rank 0 to 70, zero and huge extents, non-int extents)
  and buffer types (bytes, bytearray, memoryview, NumPy arrays of any dtype, non-contiguous
  views, str, None, int).

Files are mutated from valid ones written by ``aq.save`` and ``write_nvfp4``: byte edits, a lying
header length, JSON header splices (dtypes such as ``"f32"``, shapes such as ``["2", 2.9]``,
``[1e999]``, ``[0, 2**62]``, 70 dimensions, overlapping offsets, ``'[' * 100000``, unprintable
names such as ``"\\ud800"``), metadata edits (scheme strings with garbage and huge numbers, block
extents of 2**29 and 2**40 on a matching layout, lying shapes and ranks) and consistent
re-layouts (entries re-typed, re-shaped to rank 33/65/70, cut, swapped, copied).

:class:`Harness` runs cases in a ``spawn`` worker process whose address space is capped with
``resource.setrlimit(RLIMIT_AS)`` (its size after start-up plus ``cap``), one case at a time,
and classifies each outcome:

- ``loaded-correct``: accepted, and everything checked about the result holds;
- ``error <Type>``: a typed library error (``aq.QuantizationError``, ``BackendUnavailableError``,
  ``DeviceError``), or for the CLI an exit status 1 with a one-line message;
- ``FAIL ...``: a failure: ``exception <Type>`` (any other exception), ``warning <Category>``
  (a warning that reached the caller), ``slow`` (over 5 s, aborted at 10 s), ``memory``
  (``MemoryError``, or the worker's peak RSS grew by more than 256 MiB), ``crash`` (the worker
  died), ``inconsistent`` (an accepted result that fails its checks, or readers that disagree),
  ``cli`` (an exit status other than 0/1, a traceback or a multi-line error).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import multiprocessing
import os
import random
import re
import signal
import struct
import sys
import tempfile
import time
import traceback
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

TARGETS = ("load", "cli", "nvfp4", "bytes", "quantize", "gguf", "burnpack")
FILE_TARGETS = ("gguf", "burnpack")  # files of these formats, mutated and read through aq.load
SLOW_S = 5.0  # a case over this is a failure
ABORT_S = 10  # ... and is aborted here (SIGALRM)
HARD_S = 60.0  # the parent kills a worker that has not answered by then
RSS_GROWTH = 256 * 2**20  # peak-RSS growth of one case counted as a memory failure
DEFAULT_CAP = 2 * 2**30  # address space allowed above the worker's size after start-up
FAIL = "FAIL "
FAILURE_CLASSES = {
    "exception": "an exception that is not the library's",
    "warning": "a warning that reached the caller",
    "slow": f"over {SLOW_S:.0f} s",
    "memory": "MemoryError at the address-space cap, or peak RSS up by more than 256 MiB",
    "crash": "the worker died",
    "inconsistent": "an accepted result that fails its checks, or readers that disagree",
    "cli": "a CLI exit status other than 0/1, a traceback, or exit 1 without its error line",
    "generator": "the case generator itself failed (a harness bug)",
}


# ---------------------------------------------------------------------------------------------
# outcomes
# ---------------------------------------------------------------------------------------------


class CaseTimeout(BaseException):
    """Raised by SIGALRM inside a case that runs past ``ABORT_S``."""


class Inconsistent(Exception):
    """An accepted result that does not hold up, or two readers that disagree."""


class CliFailure(Exception):
    """A CLI run that ended other than in exit 0, or exit 1 with one line of error."""


@dataclass
class Result:
    target: str
    seed: int
    outcome: str
    detail: str = ""
    seconds: float = 0.0
    kind: str = ""
    stage: str = ""
    extra: dict[str, int] = field(default_factory=dict)
    restart: bool = False
    where: str = ""  # the library frame an exception came from

    @property
    def failed(self) -> bool:
        return self.outcome.startswith(FAIL)


def _library_errors() -> tuple[type[BaseException], ...]:
    import arrayquant as aq
    from arrayquant.errors import BackendUnavailableError, DeviceError

    return (aq.QuantizationError, BackendUnavailableError, DeviceError)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 400 else text[:400] + "..."


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc`` inside the library (or the last one), for the failure key."""
    frames = traceback.extract_tb(exc.__traceback__)
    lib = [f for f in frames if "arrayquant" in f.filename and "fuzz_targets" not in f.filename]
    if not (lib or frames):
        return ""
    f = (lib or frames)[-1]
    return f"{Path(f.filename).name}:{f.lineno} ({f.name})"


# ---------------------------------------------------------------------------------------------
# building files
# ---------------------------------------------------------------------------------------------

# header dtype -> item size
ITEM = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
BAD_DTYPES = ["f32", "F32 ", "", "C64", "F4", "F8_E4M3FNUZ", "XX", "float32", "\ud800", 5, None, ["F32"], {"a": 1}]
_RAW = re.compile(r'"@@RAW:(.*?)@@"')


def raw_json(text: str) -> str:
    """A JSON token spliced verbatim into a header (``1e999``, ``2.9``, a 5,000-digit number)."""
    return f"@@RAW:{text}@@"


def dump_header(header: Any) -> bytes:
    text = json.dumps(header)  # ensure_ascii: a lone surrogate is written as \\ud800, valid JSON
    return _RAW.sub(lambda m: m.group(1), text).encode()


def join(header_text: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header_text)) + header_text + data


def split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


Entry = tuple[str, str, list[int], bytes]  # name, header dtype, shape, raw bytes


def layout(entries: Iterable[Entry], meta: dict[str, str] | None) -> bytes:
    """A safetensors file with consistent offsets (entries in the order given)."""
    header: dict[str, Any] = {}
    if meta is not None:
        header["__metadata__"] = meta
    data = bytearray()
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return join(dump_header(header), bytes(data))


def entries_of(blob: bytes) -> tuple[list[Entry], dict[str, str] | None]:
    header, data = split(blob)
    meta = header.pop("__metadata__", None)
    out = []
    for name, info in header.items():
        a, b = info["data_offsets"]
        out.append((name, info["dtype"], list(info["shape"]), data[a:b]))
    return out, meta


def _x(shape: tuple[int, ...], seed: int) -> Any:
    import numpy as np

    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 4
    x.reshape(-1)[:2] = 0
    return x


CHECKPOINT_CONTENTS: list[list[tuple[str, tuple[int, ...], str | None]]] = [
    [("w", (2, 8), "q8s:block4:ue4m3:tensor:f32:native"), ("bias", (3,), None)],
    [("w", (2, 32), "nvfp4")],
    [("a", (3, 16), "q4f:block8:f16:packed_u32"), ("b", (5, 4), "q2s:packed_u32:1")],
    [("w", (2, 16), "e4m3:block8:ue8m0:native"), ("n", (4,), "int64")],
    [("w", (2, 16), "q4f:block16:f16:lookup:packed_u32")],
    [("w", (4, 4), "e5m2:tensor:bf16:native"), ("w2", (3, 8), "e2m1:block8:ue4m3:tensor:f32:native")],
    [("w", (1, 4), "q8s:block4:f32:native")],
    [("layer.weight", (4, 32), "mxfp8"), ("layer.bias", (4,), None), ("emb", (3, 32), "mxfp4")],
    [("w", (8,), "q8f"), ("h", (2, 3), "bfloat16"), ("m", (2,), "bool")],
    [("w", (3, 3, 8), "q4s:block2x4:bf16:packed_u32:1"), ("s", (), None)],
]


@cache
def checkpoint_bases() -> tuple[bytes, ...]:
    """Small valid checkpoints written by ``aq.save``, a few hundred bytes each."""
    import numpy as np

    import arrayquant as aq

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, content in enumerate(CHECKPOINT_CONTENTS):
            tensors: dict[str, Any] = {}
            for j, (name, shape, scheme) in enumerate(content):
                x = _x(shape, 10 * i + j)
                if scheme is None:
                    tensors[name] = x
                elif scheme in ("int64", "bool"):
                    tensors[name] = np.arange(math.prod(shape)).reshape(shape).astype(scheme)
                elif scheme == "bfloat16":
                    tensors[name] = x.astype(aq.io.checkpoint._ml_dtype("bfloat16"))
                elif "lookup" in scheme:
                    tensors[name] = aq.quantize(x, scheme, table=np.asarray(aq.NF4, np.float32))
                else:
                    tensors[name] = aq.quantize(x, scheme)
            path = Path(tmp) / f"{i}.safetensors"
            aq.save(path, tensors)
            out.append(path.read_bytes())
    return tuple(out)


@cache
def float_base() -> bytes:
    """A plain float checkpoint: the ORIGINAL of ``arrayquant compare``."""
    import arrayquant as aq

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "orig.safetensors"
        aq.save(path, {"w": _x((2, 8), 0), "a": _x((3, 16), 1), "layer.weight": _x((4, 32), 2)})
        return path.read_bytes()


NVFP4_SHAPES = [(2, 32), (1, 16), (3, 64), (2, 2, 16)]


@cache
@cache
def format_bases(target: str) -> tuple[bytes, ...]:
    """Valid GGUF or Burnpack files written by arrayquant: quantized tensors the format holds, and plain ones."""
    import numpy as np

    import arrayquant as aq

    x = _x((4, 256), 3)
    plain = {"norm.weight": np.linspace(-1, 1, 8, dtype=np.float32), "ids": np.arange(6, dtype=np.int32)}
    if target == "gguf":
        sets = [
            {"blk.0.attn_q.weight": aq.quantize(x, "q8_0"), **plain},
            {"blk.0.ffn_up.weight": aq.quantize(x, "mxfp4"), "blk.0.ffn_down.weight": aq.quantize(x, "tq2_0")},
            {"w": aq.quantize(x, "e2m1:block16:ue4m3:packed_native"), "b": x[0].astype(np.float16)},
        ]
        options: dict[str, Any] = {"metadata": {"general.name": "fuzz", "tokenizer.ggml.tokens": ["a", "b"]}}
    else:
        sets = [
            {"w": aq.quantize(x, "q8s"), **plain},
            {"a": aq.quantize(x, "q4s:block32:f16"), "b": aq.quantize(x, "nvfp4"), "c": aq.quantize(x, "mxfp8")},
        ]
        options = {"metadata": {"model": "fuzz"}}
    out = []
    with tempfile.TemporaryDirectory() as folder:
        for i, tensors in enumerate(sets):
            path = Path(folder) / f"{i}.{target}"
            aq.save(path, tensors, format=target, **options)
            out.append(path.read_bytes())
    return tuple(out)


def binary_mutation(r: random.Random, blob: bytes) -> tuple[str, bytes]:
    """1-3 edits of a binary file: byte edits, a lying count or offset, a cut."""
    kinds = []
    for _ in range(r.choice([1, 1, 2, 3])):
        if r.random() < 0.4 and len(blob) >= 16:
            at = r.randrange(len(blob) - 8)
            width = r.choice([2, 4, 8])
            lie = r.choice([0, 1, 2**31, 2**32 - 1, 2**32 + 1, 2**62, 2**64 - 1, r.randrange(2**64)]) % 2 ** (8 * width)
            blob = blob[:at] + lie.to_bytes(width, "little") + blob[at + width :]
            kinds.append("count-lie")
        else:
            kind, blob = bytes_mutation(r, blob)
            kinds.append(kind)
    return "+".join(kinds), blob


def nvfp4_bases() -> tuple[tuple[str, dict[str, Any]], ...]:
    """``write_nvfp4`` outputs (uint8 scale codes), named ``fc``, ``""`` and a dotted prefix."""
    import arrayquant as aq
    from arrayquant.io import write_nvfp4

    out = []
    for i, shape in enumerate(NVFP4_SHAPES):
        name = ["fc", "", "model.layers.0.mlp", "x"][i]
        out.append((name, write_nvfp4(aq.quantize(_x(shape, 40 + i), "nvfp4"), name or None, scale_codes=True)))
    return tuple(out)


def nvfp4_file(entries: dict[str, Any], extra: bool) -> bytes:
    rows = []
    for key, arr in entries.items():
        dtype = "U8" if key.endswith("weight_packed") else "F8_E4M3" if key.endswith("weight_scale") else "F32"
        rows.append((key, dtype, list(arr.shape), arr.tobytes()))
    if extra:
        rows.append(("lm_head.weight", "F32", [2, 2], bytes(16)))
    return layout(rows, {"format": "pt"})


# ---------------------------------------------------------------------------------------------
# random values
# ---------------------------------------------------------------------------------------------

HUGE = [2**29, 2**31, 2**32, 2**40, 2**53, 2**62, 2**63, 2**64, 2**70]
SCALE_DTYPES = ["f32", "f16", "bf16", "ue4m3", "ue8m0"]
VALUES = ["q8f", "q4f", "q2f", "q8s", "q4s", "q2s", "e4m3", "e5m2", "e2m1"]
PRESET_NAMES = ["nvfp4", "mxfp8", "mxfp4", "nf4"]


def _extent(r: random.Random) -> Any:
    p = r.random()
    if p < 0.55:
        return r.choice([1, 1, 2, 3, 4, 8, 16, 32, 64])
    if p < 0.8:
        return r.choice(HUGE)
    return r.choice([0, -1, -(2**40), "\u00b2", "", "1.5", " 4", "9" * r.choice([20, 400, 5000]), "0x10", "1_0"])


def scheme_text(r: random.Random) -> str:
    """Scheme text from the grammar, with legal and illegal tokens, extents and orders."""
    if r.random() < 0.1:
        base = r.choice(PRESET_NAMES)
        return base if r.random() < 0.6 else base + ":" + r.choice(["native", "lookup", "block32", "f16", ""])
    value = r.choice(VALUES) if r.random() < 0.93 else r.choice(["q3s", "", "Q8S", " e2m1", "q8s\x00", "e8m0", "²"])
    tokens: list[str] = []
    if r.random() < 0.7:
        n = r.choice([1, 1, 1, 1, 2, 2, 3, 33, 65, 70])
        dims = [_extent(r) if r.random() < 0.5 else r.choice([1, 2, 4, 8, 16, 32]) for _ in range(n)]
        tok = "block" + "x".join(map(str, dims))
        tokens.append(tok)
        if r.random() < 0.7:
            tokens.append(r.choice([*SCALE_DTYPES, "f64", "e4m3"]))
    if r.random() < 0.4:
        tokens.append("tensor")
        if r.random() < 0.7:
            tokens.append(r.choice(SCALE_DTYPES))
    if r.random() < 0.6:
        tokens.append(r.choice(["native", "packed_u32", "packed_native"]))
        if r.random() < 0.5:
            tokens.append(str(r.choice([0, 1, 2, 3, 5, 70, 2**40, "\u00b2", "-1"])))
    if r.random() < 0.3:
        tokens.append(r.choice(["symmetric", "lookup"]))
    if r.random() < 0.15:
        tokens.append(r.choice(["round_up", "ocp"]))
    if r.random() < 0.1:
        tokens.append(r.choice(["tensor", "native", "block4", "junk", "", "\ud800"]))
    if r.random() < 0.2:
        r.shuffle(tokens)
    return ":".join([value, *tokens])


def valid_scheme_text(r: random.Random) -> str:
    """Scheme text that parses today (small blocks), for true layouts to start from."""
    return r.choice(
        [
            "q8s",
            "q8f",
            "q4s:packed_u32",
            "q2f:tensor:f16:native",
            "q8s:block4:ue4m3:tensor:f32:native",
            "q4f:block8:f16:packed_u32",
            "q2s:packed_u32:1",
            "e4m3:block8:ue8m0:native",
            "e5m2:tensor:bf16:native",
            "q4s:block2x4:bf16:packed_u32:1",
            "e2m1:block4:f16:packed_u32",
            "nvfp4",
            "mxfp8",
            "mxfp4",
            "q8s:block16:ue4m3:tensor:f32:native",
        ]
    )


def shape_of(r: random.Random) -> Any:
    """A shape: mostly small tuples, also rank 0 and 33-70, zero and huge extents, non-ints."""
    p = r.random()
    if p < 0.5:
        return tuple(r.choice([1, 2, 3, 4, 8, 16, 32]) for _ in range(r.choice([1, 1, 2, 2, 2, 3])))
    if p < 0.6:
        return r.choice([(), (0,), (0, 16), (2, 0), (0, 2**62), (2**62, 0, 3)])
    if p < 0.75:
        rank = r.choice([32, 33, 64, 65, 70])
        dims = [1] * rank
        dims[r.randrange(rank)] = r.choice([1, 2, 4, 16, 32])
        if r.random() < 0.2:
            dims[0] = 0
        return tuple(dims)
    if p < 0.9:
        return tuple(r.choice([1, 16, *HUGE]) for _ in range(r.choice([1, 2, 3])))
    return r.choice(
        [
            [2, 8],
            (2.0, 8),
            (2.5, 8),
            ("2", 8),
            (-1, 8),
            (True, 16),
            16,
            "2x8",
            None,
            (None,),
            ((2,), 8),
            (float("inf"),),
            (float("nan"), 4),
            "npint",
        ]
    )


# ---------------------------------------------------------------------------------------------
# file mutations
# ---------------------------------------------------------------------------------------------

ODD_NAMES = ["\ud800", "", " ", "\x00", "a" * 3000, "é", "\u202e", "w\nx", "__metadata__", "arrayquant.format", "../x"]


def bytes_mutation(r: random.Random, blob: bytes) -> tuple[str, bytes]:
    op = r.choice(["truncate", "flip", "overwrite", "append", "insert"])
    if not blob:
        return "append", bytes(r.randrange(256) for _ in range(r.randint(1, 16)))
    if op == "truncate":
        return op, blob[: r.randrange(len(blob))]
    if op == "flip":
        out = bytearray(blob)
        for _ in range(r.randint(1, 8)):
            out[r.randrange(len(out))] ^= 1 << r.randrange(8)
        return op, bytes(out)
    junk = bytes(r.randrange(256) for _ in range(r.randint(1, 32)))
    pos = r.randrange(len(blob) + 1)
    if op == "overwrite":
        return op, blob[:pos] + junk + blob[pos + len(junk) :]
    if op == "append":
        return op, blob + junk
    return op, blob[:pos] + junk + blob[pos:]


def length_lie(r: random.Random, blob: bytes) -> bytes:
    n = int.from_bytes(blob[:8], "little")
    lie = r.choice([0, 1, 2, n - 1, n + 1, n + 8, len(blob), 2**63, 2**64 - 1, r.randrange(2**64)])
    return struct.pack("<Q", lie % 2**64) + blob[8:]


def _elements(shape: Any) -> int:
    """The element count of a header shape an earlier edit may have spoiled (4 when unusable)."""
    try:
        n = math.prod(shape)
    except TypeError:
        return 4
    return n if isinstance(n, int) and 0 <= n <= 2**64 else 4


def odd_shape(r: random.Random, n: int) -> Any:
    """A header ``shape`` for an entry of ``n`` elements: wrong types, huge, high rank, or right."""
    return r.choice(
        [
            ["2", 2.9],
            [str(n)],
            [float(n)],
            [raw_json("1e999")],
            [raw_json("-1e999")],
            [raw_json("9" * 5000)],
            [0, 2**62],
            [2**62, 2**62],
            [2**64],
            [-1, -n],
            [1] * 70,
            [1] * 64 + [n],
            [1] * 65 + [n],
            [1] * 33 + [n],
            [n, 0],
            [True] * 2,
            [[n]],
            [None],
            None,
            "2x8",
            {"0": n},
            [],
            [n],
            [r.randrange(0, 2 * n + 2)],
        ]
    )


def odd_offsets(r: random.Random, header: dict[str, Any], info: dict[str, Any], size: int) -> Any:
    others = [v["data_offsets"] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    a, b = (info.get("data_offsets") or [0, 0])[:2] if isinstance(info.get("data_offsets"), list) else (0, 0)
    return r.choice(
        [
            list(r.choice(others)) if others else [0, 0],  # overlaps another entry
            [b, a],
            [a, b + 1],
            [a - 1, b - 1],
            [a, size + 8],
            [0, 2**64],
            [2**63, 2**63 + 4],
            [-4, b],
            [a, b, b],
            [a],
            [],
            [str(a), str(b)],
            [float(a), float(b) + 0.5],
            [raw_json("1e999"), raw_json("1e999")],
            None,
            f"{a}-{b}",
        ]
    )


def _scheme_lie(r: random.Random, scheme: str) -> str:
    """A metadata scheme edit: huge blocks on the same layout, garbage numbers, or random text."""
    p = r.random()
    if p < 0.35 and "block" in scheme:
        huge = r.choice([2**29, 536870912, 2**31, 2**40, 1099511627776, 2**62, 2**64])
        return re.sub(r"block(\d+)", lambda m: f"block{huge}", scheme, count=1)
    if p < 0.45:
        return r.choice(
            [
                "q8s:block536870912:f32:native",
                "q8s:block1099511627776",
                "q4s:packed_u32:\u00b2",
                "q8s:block" + "9" * 5000,
                "q8s:packed_u32:" + "9" * 5000,
                "q8s:block" + "x".join(["1"] * 70),
                "q8s:block0",
                "q8s:block-4",
                "nvfp4:lookup",
                "nf4",
                "\ud800",
                "",
            ]
        )
    return scheme_text(r)


def header_edit(r: random.Random, blob: bytes) -> tuple[str, bytes]:
    """One splice of the JSON header (or a hostile header of its own), offsets left as they are."""
    header, data = split(blob)
    names = [k for k in header if k != "__metadata__"]
    ops = ["dtype", "shape", "offsets", "drop", "rename", "entry", "toplevel", "duplicate", "meta"]
    op = r.choice(ops)
    if op == "toplevel":
        text = r.choice(
            [
                b"[" * 100000,
                b'{"a":' * 50000,
                b"[]",
                b'"x"',
                b"3",
                b"null",
                b'{"__metadata__": "x"}',
                b'{"__metadata__": {"a": 1}}',
                b'{"__metadata__": {"a": ' + b"[" * 100000 + b"}}",
                b"{\xff}",
                b"{" + b" " * 1000 + b"}",
                b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}',
            ]
        )
        return op, join(text, data)
    if op == "duplicate" and names:  # the same key twice in the JSON text
        key = json.dumps(r.choice(names))
        fake = key + ': {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}, '
        return op, join(dump_header(header).decode().replace("{", "{" + fake, 1).encode(), data)
    if op == "meta":
        meta = header.setdefault("__metadata__", {})
        if not isinstance(meta, dict):
            meta = header["__metadata__"] = {}
        keys = sorted(meta)
        m = r.choice(["scheme", "shape", "dtype", "drop-field", "garbage", "format", "not-json", "drop", "ghost"])
        key = r.choice(keys) if keys else "arrayquant.format"
        try:
            info = json.loads(meta.get(key, "{}"))
        except ValueError:
            info = {}
        if m in ("scheme", "shape", "dtype", "drop-field") and isinstance(info, dict) and "scheme" in info:
            if m == "scheme":
                info["scheme"] = _scheme_lie(r, str(info["scheme"]))
            elif m == "shape":
                n = _elements(info.get("shape"))
                info["shape"] = odd_shape(r, n)
            elif m == "dtype":
                info["dtype"] = r.choice(["float16", "bfloat16", "float64", "int8", "asarray", "", "\ud800", 3, None])
            else:
                info.pop(r.choice(sorted(info)))
            meta[key] = dump_header(info).decode()
        elif m == "garbage":
            meta[key] = r.choice(["", "{", "[]", "null", '{"scheme": 5}', "[" * 100000, "\ud800", "x" * 100])
        elif m == "format":
            meta["arrayquant.format"] = r.choice(["2", "1 ", "", "0", "\ud800", "1" * 5000])
        elif m == "not-json":
            header["__metadata__"] = r.choice([[], "x", 5, None, {"a": 5}, {"a": None}, {"a": ["x"]}])
        elif m == "drop" and keys:
            del meta[key]
        else:
            target = r.choice([*names, "ghost", "", "\ud800"])
            meta["arrayquant.tensor." + target] = json.dumps(
                {"scheme": _scheme_lie(r, "q8s:block4:f32:native"), "dtype": "float32", "shape": odd_shape(r, 8)}
            )
        return "meta-" + m, join(dump_header(header), data)
    if not names:
        return "empty", blob
    name = r.choice(names)
    info = header[name]
    if not isinstance(info, dict):
        return "entry", join(dump_header(header), data)
    if op == "dtype":
        info["dtype"] = r.choice([*BAD_DTYPES, *ITEM])
    elif op == "shape":
        n = _elements(info.get("shape"))
        info["shape"] = odd_shape(r, n)
    elif op == "offsets":
        info["data_offsets"] = odd_offsets(r, header, info, len(data))
    elif op == "drop":
        del header[name]
    elif op == "rename":
        new = r.choice([*ODD_NAMES, *(n + s for n in names for s in (".scales", ".global_scale", ".table", ".values"))])
        header[new] = header.pop(name)
    else:
        header[name] = r.choice([[], "x", 5, None, {}, {"dtype": "F32"}, {"shape": [1], "data_offsets": [0, 4]}])
    return op, join(dump_header(header), data)


def relayout(r: random.Random, blob: bytes) -> tuple[str, bytes]:
    """A structural edit that keeps a well-formed safetensors file with consistent offsets."""
    entries, meta = entries_of(blob)
    if not entries:
        return "relayout-empty", blob
    i = r.randrange(len(entries))
    name, dtype, shape, raw = entries[i]
    n = math.prod(shape)
    op = r.choice(["retype", "reshape", "rank", "cut", "swap", "copy", "randomise", "rename", "meta-rank", "zero"])
    if op == "reshape" and not (isinstance(n, int) and 0 < n <= 4096):
        op = "rank"  # too big to factor here; an earlier edit made the shape huge
    if op == "retype":
        new = r.choice(list(ITEM))
        raw = raw[: len(raw) // ITEM[new] * ITEM[new]]
        entries[i] = (name, new, [len(raw) // ITEM[new]], raw)
    elif op == "reshape":
        divisors = [d for d in range(1, n + 1) if n % d == 0] or [1]
        d = r.choice(divisors)
        entries[i] = (name, dtype, r.choice([[n], [d, n // d], [1, d, n // d], [n // d, d, 1]]) if n else [0], raw)
    elif op == "rank":  # the same elements at rank 33, 64, 65 or 70
        entries[i] = (name, dtype, [1] * r.choice([32, 33, 63, 64, 65, 69]) + [n], raw)
    elif op == "cut":
        size = ITEM.get(dtype, 1)
        keep = r.randrange(max(1, len(raw) // size))
        entries[i] = (name, dtype, [keep], raw[: keep * size])
    elif op == "swap":
        j = r.randrange(len(entries))
        other = entries[j]
        entries[i], entries[j] = (name, other[1], other[2], other[3]), (other[0], dtype, shape, raw)
    elif op == "copy":
        target = r.choice([e[0] for e in entries]) + r.choice(["", ".scales", ".global_scale", ".table", ".values"])
        entries.append((target, dtype, shape, raw))
    elif op == "randomise":
        entries[i] = (name, dtype, shape, bytes(r.randrange(256) for _ in raw))
    elif op == "rename":
        entries[i] = (r.choice(ODD_NAMES), dtype, shape, raw)
    elif op == "zero":
        entries[i] = (name, dtype, [*shape[:-1], 0] if shape else [0], b"")
    elif meta:  # meta-rank: a quantized tensor described, and laid out, at a higher rank
        keys = [k for k, v in meta.items() if '"scheme"' in v]
        if keys:
            key = r.choice(keys)
            info = json.loads(meta[key])
            k = r.choice([31, 32, 33, 62, 63, 64, 65])
            if isinstance(info.get("shape"), list):
                info["shape"] = [1] * k + info["shape"]
                meta[key] = json.dumps(info)
            owner = key.rsplit(".", 1)[-1] if "." in key else key
            tname = key[len("arrayquant.tensor.") :] if key.startswith("arrayquant.tensor.") else owner
            for j, (nm, dt, sh, rw) in enumerate(entries):
                if nm == tname or nm.startswith(tname + "."):
                    entries[j] = (nm, dt, [1] * k + sh, rw)
    return "relayout-" + op, layout(entries, meta)


def mutate_file(r: random.Random, blob: bytes) -> tuple[str, bytes]:
    """1-3 mutations of a valid file; the first names the case's kind."""
    kinds = []
    for _ in range(r.choice([1, 1, 1, 2, 3])):
        family = r.choice(["bytes", "length", "header", "header", "header", "relayout", "relayout"])
        try:
            if family == "bytes":
                kind, blob = bytes_mutation(r, blob)
            elif family == "length":
                kind, blob = "length-lie", length_lie(r, blob)
            elif family == "header":
                kind, blob = header_edit(r, blob)
            else:
                kind, blob = relayout(r, blob)
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, AttributeError):
            continue  # an earlier mutation made the file unparseable for this one: keep it as is
        kinds.append(kind)
    return "+".join(kinds) or "none", blob


# ---------------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    """What one seed does: a file to read, or Python source that builds the call's arguments."""

    target: str
    seed: int
    kind: str
    blob: bytes = b""
    source: str = ""  # for in-memory targets: defines the arguments
    name: str = ""  # the nvfp4 weight name
    cli: bool = False


# The harness's own check: each of these must end in its class (tests/test_fuzz.py runs them).
SELFTEST: list[tuple[str, str]] = [
    ("loaded-correct", "x = np.ones(4)"),
    ("error ShapeError", "raise aq.ShapeError('a typed error')"),
    ("FAIL exception KeyError", "{}['missing']"),
    ("FAIL warning UserWarning", "import warnings; warnings.warn('leaked')"),
    ("FAIL warning RuntimeWarning", "np.float32(3e38) * np.float32(10)"),
    ("FAIL exception RecursionError", "import json; json.loads('[' * 100000)"),
    ("FAIL inconsistent", "raise Inconsistent('an accepted result that does not hold up')"),
    ("FAIL slow", "import time; time.sleep(SLOW)"),
    ("FAIL slow", "while True: pass"),
    ("FAIL memory", "np.ones(3 << 30, np.uint8)"),
    ("FAIL memory", "x = b'1' * (300 << 20)"),
    ("FAIL crash", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
]


def _blob_expr(blob: bytes) -> str:
    return f"zlib.decompress(base64.b64decode({base64.b64encode(zlib.compress(blob, 9)).decode()!r}))"


def make_case(target: str, seed: int) -> Case:
    r = random.Random(f"{target}:{seed}")
    if target in ("load", "cli"):
        base = r.choice(checkpoint_bases())
        kind, blob = mutate_file(r, base) if r.random() < 0.97 else ("base", base)
        return Case(target, seed, kind, blob, cli=target == "cli" and seed % 4 == 0)
    if target in FILE_TARGETS:
        base = r.choice(format_bases(target))
        kind, blob = binary_mutation(r, base) if r.random() < 0.97 else ("base", base)
        return Case(target, seed, kind, blob, cli=seed % 4 == 0)
    if target == "nvfp4":
        return _nvfp4_case(r, seed)
    if target == "bytes":
        return _bytes_case(r, seed)
    if target == "quantize":
        return _quantize_case(r, seed)
    if target == "selftest":
        return Case(target, seed, SELFTEST[seed][0], source=SELFTEST[seed][1])
    msg = f"unknown fuzz target {target!r}; expected one of {TARGETS}"
    raise ValueError(msg)


def _nvfp4_case(r: random.Random, seed: int) -> Case:
    name, entries = r.choice(nvfp4_bases())
    ask = name if r.random() < 0.85 else r.choice(["", "fc", "\ud800", "x.y", "fc.weight_packed"])
    if r.random() < 0.5:
        kind, blob = mutate_file(r, nvfp4_file(entries, r.random() < 0.3))
        return Case("nvfp4", seed, "file:" + kind, blob, name=ask)
    lines = []
    kinds = []
    parts = dict(entries)
    for key in list(parts):
        arr = parts[key]
        expr = f"np.frombuffer({_blob_expr(arr.tobytes())}, {str(arr.dtype)!r}).reshape({tuple(arr.shape)!r})"
        if r.random() < 0.35:
            op = r.choice(
                [
                    "dtype",
                    "f8",
                    "rank0",
                    "rank64",
                    "rank33",
                    "zero",
                    "transpose",
                    "strided",
                    "pyobj",
                    "drop",
                    "value",
                    "codes",
                    "reshape",
                ]
            )
            kinds.append(f"{key.rsplit('.', 1)[-1]}-{op}")
            if op == "dtype":
                expr = f"{expr}.astype({r.choice(['float32', 'int8', 'float64', 'bool', 'uint16', 'object', 'U1'])!r})"
            elif op == "f8":
                expr = f"{expr}.view(np.uint8).view(ml_dtypes.{r.choice(['float8_e4m3fn', 'float8_e5m2'])})"
            elif op == "rank0":
                expr = f"{expr}.reshape(-1)[0]"
            elif op in ("rank64", "rank33"):  # NumPy itself holds at most 64 dimensions
                k = 63 if op == "rank64" else 32
                expr = f"{expr}.reshape((1,) * {k} + (-1,))"
            elif op == "zero":
                expr = f"{expr}[..., :0]"
            elif op == "transpose":
                expr = f"{expr}.T"
            elif op == "strided":
                expr = f"np.repeat({expr}, 2, axis=-1)[..., ::2]"
            elif op == "pyobj":
                expr = r.choice(["None", "'abc'", "b'\\x00'", "[1, 2]", "5", "{}", "memoryview(b'\\x00\\x01')"])
            elif op == "drop":
                del parts[key]
                continue
            elif op == "value":
                val = r.choice(["0.0", "-1.0", "float('inf')", "float('nan')", "1e-45", "3e38", "1e-38", "2.0"])
                expr = f"np.full({expr}.shape, {val}, np.float32)"
            elif op == "codes":
                expr = f"np.full({expr}.shape, {r.choice([0x7F, 0xFF, 0x80, 0x00, 0x7E, 0x88])}, np.uint8)"
            else:
                expr = f"{expr}.reshape(-1)"
        lines.append(f"entries[{key!r}] = {expr}")
    if r.random() < 0.1:
        lines.append(f"entries[{r.choice(['junk', name + '.weight_zero_point'])!r}] = np.zeros(3)")
    source = "entries = {}\n" + "\n".join(lines)
    return Case("nvfp4", seed, "mapping:" + ("+".join(kinds) or "none"), source=source, name=ask)


BUFFER_KINDS = [
    "bytes",
    "bytes",
    "bytes",
    "bytearray",
    "memoryview",
    "readonly-memoryview",
    "np-uint8",
    "np-int8",
    "np-float32",
    "np-2d",
    "np-noncontig",
    "memoryview-noncontig",
    "memoryview-u32",
    "array-I",
    "str",
    "None",
    "int",
    "list",
    "np-float8",
]


def _buffer_expr(kind: str, raw: str) -> str:
    return {
        "bytes": raw,
        "bytearray": f"bytearray({raw})",
        "memoryview": f"memoryview(bytearray({raw}))",
        "readonly-memoryview": f"memoryview({raw})",
        "np-uint8": f"np.frombuffer({raw}, np.uint8)",
        "np-int8": f"np.frombuffer({raw}, np.int8)",
        "np-float32": f"np.frombuffer({raw}[: len({raw}) // 4 * 4], np.float32)",
        "np-2d": f"np.frombuffer({raw}, np.uint8).reshape(1, -1)",
        "np-noncontig": f"np.repeat(np.frombuffer({raw}, np.uint8), 2)[::2]",
        "memoryview-noncontig": f"memoryview(bytes(2 * len({raw})))[::2]",
        "memoryview-u32": f"memoryview(bytearray({raw}[: len({raw}) // 4 * 4])).cast('I')",
        "array-I": f"array.array('I', {raw}[: len({raw}) // 4 * 4])",
        "str": f"{raw}.decode('latin-1')",
        "None": "None",
        "int": f"len({raw})",
        "list": f"list({raw})",
        "np-float8": f"np.frombuffer({raw}, ml_dtypes.float8_e4m3fn)",
    }[kind]


def _bytes_case(r: random.Random, seed: int) -> Case:
    """``from_bytes`` arguments. The buffer's length is found at run time, inside the harness."""
    valid = r.random() < 0.35
    text = valid_scheme_text(r) if valid else scheme_text(r)
    p = r.random()
    scheme = repr(text)
    if p < 0.15:
        scheme = f"aq.QuantScheme.parse({text!r})"  # an object; parse errors are the library's
    elif p < 0.2:
        scheme = r.choice(["None", "5", "b'q8s'", "['q8s']", "aq.QuantScheme", "'q8s '"])
    shape = shape_of(r)
    shape_src = "(np.int64(2), np.uint8(16))" if shape == "npint" else repr(shape)
    content = r.choice(["random", "zeros", "ones", "true", "true", "true"])
    length = r.choice(["exact", "exact", "exact", "short", "long", "empty"])
    kind = r.choice(BUFFER_KINDS)
    source = f"""scheme = {scheme}
shape = {shape_src}
rng = np.random.default_rng({seed})
try:  # the layout's length, when the library can tell it
    stage("quantized_nbytes")
    need = aq.quantized_nbytes(scheme, shape)
except aq.QuantizationError:
    need = {r.randrange(1, 64)}
stage("build arguments")
need = need if 0 <= need <= 1 << 20 else {r.randrange(1, 64)}
raw = {{"random": rng.integers(0, 256, need, np.uint8).tobytes(), "zeros": bytes(need), "ones": b"\\xff" * need,
        "true": true_bytes(scheme, shape, need, rng)}}[{content!r}]
raw = {{"exact": raw, "short": raw[:-1], "long": raw + b"\\x00", "empty": b""}}[{length!r}]
buf = {_buffer_expr(kind, "raw")}"""
    return Case("bytes", seed, f"{kind}/{content}/{length}{'/valid-scheme' if valid else ''}", source=source)


def _quantize_case(r: random.Random, seed: int) -> Case:
    """``aq.quantize`` of finite (or not) data at the ends of each float range, random schemes."""
    text = valid_scheme_text(r) if r.random() < 0.5 else scheme_text(r)
    shape = r.choice(
        [(2, 32), (4, 16), (64,), (3, 5), (1, 4), (2, 2, 16), (1,) * 32 + (16,), (1,) * 33 + (4,), (0, 16)]
    )
    dtype = r.choice(["float32", "float32", "float16", "bfloat16", "float64"])
    magnitude = r.choice(["1.0", "1e-40", "1e-30", "1e30", "1e38", "3.4e38", "'max'", "65504.0", "'tiny'"])
    special = r.choice(
        ["", "", "", "x[0] = -x[0]", "x[...] = 0", "x[...] = x.reshape(-1)[0]", "x.reshape(-1)[-1] = np.nan"]
    )
    guarded = f"if x.size:\n    {special}" if special else ""
    params = ""
    if r.random() < 0.15:
        value = r.choice(["1e300", "0.0", "-1.0", "np.nan", "1e-45", "1.0", "3.5e38", "np.inf"])
        size = r.choice(["(1,)", "(2, 1)", "(2, 2)", "(4, 1)", "()"])
        glob = r.choice(["", "", ", global_scale=np.array([1.0], np.float32)", ", global_scale=np.array([1e300])"])
        params = f", aq.QParams(scales=np.full({size}, {value}){glob})"
    kwargs = ""
    if "lookup" in text or r.random() < 0.05:
        kwargs = r.choice([", table=np.asarray(aq.NF4, np.float32)", ", table=np.linspace(-1, 1, 16)", ""])
    if r.random() < 0.05:
        kwargs += r.choice([", check_finite=False", ", rounding='half_away'", ", calibration='absmean'"])
    source = f"""scheme = {text!r}
dt = np.dtype(ml_dtypes.bfloat16) if {dtype!r} == "bfloat16" else np.dtype({dtype!r})
info = ml_dtypes.finfo(dt)
top = {{"max": float(info.max), "tiny": float(info.smallest_subnormal)}}.get({magnitude}, {magnitude})
rng = np.random.default_rng({seed})
with np.errstate(over="ignore", under="ignore"):  # building the input is not under test
    x = np.clip(rng.uniform(-1, 1, {shape!r}) * top, -float(info.max), float(info.max)).astype(dt)
{guarded}
stage("quantize")
qt = aq.quantize(x, scheme{params}{kwargs})"""
    return Case(
        "quantize", seed, f"{dtype}/{magnitude}/{special or 'plain'}{'/params' if params else ''}", source=source
    )


def true_bytes(scheme: Any, shape: Any, need: int, rng: Any) -> bytes:
    """The Burn bytes of real data under ``scheme``, when it is small and quantizes; else random."""
    import numpy as np

    import arrayquant as aq

    ok = isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape) and len(shape) <= 64
    if ok and 0 < math.prod(shape) <= 4096 and need <= 1 << 16 and "lookup" not in str(scheme):
        x = rng.standard_normal(shape).astype(np.float32)
        Stage.now = "quantize (to build true bytes)"  # quantize is checked here on the way
        try:
            return aq.to_bytes(aq.quantize(x, scheme))
        except aq.QuantizationError:
            pass
        Stage.now = "build arguments"
    return rng.integers(0, 256, need, np.uint8).tobytes()


# ---------------------------------------------------------------------------------------------
# running one case
# ---------------------------------------------------------------------------------------------


class Stage:
    """The step of a case now running, named in failure reports."""

    now = ""


def _set_stage(name: str) -> None:
    Stage.now = name


def logical_bytes(buf: Any) -> bytes:
    """The bytes a buffer holds in logical order (what an accepted buffer must come back as)."""
    import numpy as np

    return buf.tobytes() if isinstance(buf, np.ndarray) else memoryview(buf).tobytes()


def _namespace() -> dict[str, Any]:
    import array

    import ml_dtypes
    import numpy as np

    import arrayquant as aq

    return {
        "np": np,
        "aq": aq,
        "ml_dtypes": ml_dtypes,
        "zlib": zlib,
        "base64": base64,
        "array": array,
        "true_bytes": true_bytes,
        "stage": _set_stage,
        "inf": math.inf,
        "nan": math.nan,
    }


def aq_dequantize(qt: Any, dtype: Any = None) -> Any:
    import arrayquant as aq

    return aq.dequantize(qt, dtype)


def check_tensor(qt: Any) -> None:
    """An accepted tensor must dequantize to its shape and reproduce its own Burn bytes."""
    import numpy as np

    import arrayquant as aq

    Stage.now = "dequantize"
    deq = aq.dequantize(qt)
    if tuple(deq.shape) != tuple(qt.shape):
        raise Inconsistent(f"dequantize gave shape {tuple(deq.shape)} for a tensor of shape {tuple(qt.shape)}")
    Stage.now = "to_bytes"
    buf = aq.to_bytes(qt)
    if len(buf) != aq.quantized_nbytes(qt.scheme, qt.shape):
        raise Inconsistent(f"to_bytes gave {len(buf)} bytes, quantized_nbytes says otherwise")
    if qt.table is None:
        Stage.now = "from_bytes(to_bytes)"
        again = aq.from_bytes(buf, qt.scheme, qt.shape, backend="numpy")
        if aq.to_bytes(again) != buf:
            raise Inconsistent("from_bytes(to_bytes(qt)) does not give the same bytes back")
        if not np.array_equal(aq.dequantize(again, qt.dtype), deq, equal_nan=True):
            raise Inconsistent("from_bytes(to_bytes(qt)) dequantizes differently")


def _checked(step: Callable[[], None], lib: tuple[type[BaseException], ...]) -> None:
    """Run the checks of an accepted result: a library error there is an inconsistency."""
    try:
        step()
    except lib as exc:
        raise Inconsistent(f"accepted, then {Stage.now} raised {_short(exc)}") from exc


def read_load(path: Path) -> None:
    """``aq.load`` and every tensor checked."""
    import numpy as np

    import arrayquant as aq

    Stage.now = "load"
    out = aq.load(path, backend="numpy")
    lib = _library_errors()
    for name, item in out.items():
        if isinstance(item, aq.QuantizedTensor):
            _checked(lambda item=item: check_tensor(item), lib)  # type: ignore[misc]
        elif not isinstance(item, np.ndarray):
            raise Inconsistent(f"load returned {type(item).__name__} for {name!r}")


def read_cli(path: Path) -> None:
    """The CLI's reader over every tensor, as ``inspect`` and ``dequantize`` walk it."""
    import arrayquant as aq
    from arrayquant.cli_commands import Checkpoint

    Stage.now = "Checkpoint"
    with Checkpoint(path) as ck:
        for e in ck.tensors:
            if e.name in ck.described:
                Stage.now = "Checkpoint.quantized"
                qt = ck.quantized(e.name)
                Stage.now = "dequantize"
                aq.dequantize(qt)
                _checked(lambda qt=qt: check_tensor(qt), _library_errors())  # type: ignore[misc]
            else:
                Stage.now = "Checkpoint.array"
                ck.array(e.name)


def run_cli(argv: list[str]) -> int:
    """``arrayquant ARGV`` with stdout and stderr as a UTF-8 terminal's; exit status 0 or 1 only."""
    from arrayquant import cli

    Stage.now = "cli " + argv[0]
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    # as a terminal: stdout strict, stderr backslash-escaping (Python's own stderr never fails)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    old_stdout = sys.stdout
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
    except SystemExit as exc:
        raise CliFailure(f"arrayquant {argv[0]} raised SystemExit({exc.code})") from exc
    finally:
        sys.stdout = old_stdout  # main() points stdout at /dev/null on a broken pipe
    text = err.buffer.getvalue().decode("utf-8", "replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if rc not in (0, 1):
        raise CliFailure(f"arrayquant {argv[0]} exited {rc!r}: {text[-300:]}")
    if "Traceback" in text:
        raise CliFailure(f"arrayquant {argv[0]} printed a traceback: {text[-300:]}")
    if rc == 1 and not (lines and lines[-1].startswith("arrayquant: error:")):
        raise CliFailure(f"arrayquant {argv[0]} exited 1 without an error line: {text[-300:]}")
    return int(rc)


def _outcome_of(fn: Callable[[], None], lib: tuple[type[BaseException], ...]) -> str:
    try:
        fn()
    except lib as exc:
        return "error " + type(exc).__name__
    return "loaded-correct"


def execute(case: Case, workdir: Path, ns: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """Run ``case``; returns the outcome and extra counters, or raises what escaped the library."""
    lib = _library_errors()
    extra: dict[str, int] = {}
    if case.target in FILE_TARGETS:
        path = workdir / f"case.{case.target}"
        path.write_bytes(case.blob)
        outcome = _outcome_of(lambda: read_load(path), lib)
        if case.cli:
            codes = [
                run_cli(["inspect", str(path)]),
                run_cli(["dequantize", str(path), str(workdir / "out.safetensors")]),
            ]
            for cmd, rc in zip(("inspect", "dequantize"), codes, strict=True):
                extra[f"cli {cmd} exit {rc}"] = 1
            if outcome == "loaded-correct" and codes != [0, 0]:
                raise Inconsistent(f"aq.load accepts the file but inspect/dequantize exit {codes}")
        return outcome, extra
    if case.target in ("load", "cli"):
        path = workdir / "case.safetensors"
        path.write_bytes(case.blob)
        if case.target == "load":
            return _outcome_of(lambda: read_load(path), lib), extra
        outcome = _outcome_of(lambda: read_cli(path), lib)
        # one reader, one set of checks: load must agree (accepted / refused)
        loaded = _outcome_of(lambda: read_load(path), lib)
        if (outcome == "loaded-correct") != (loaded == "loaded-correct"):
            raise Inconsistent(f"the CLI reader gives {outcome!r} but aq.load gives {loaded!r}")
        if case.cli:
            orig = workdir / "orig.safetensors"
            if not orig.exists():
                orig.write_bytes(float_base())
            codes = [
                run_cli(["inspect", str(path)]),
                run_cli(["dequantize", str(path), str(workdir / "out.safetensors")]),
                run_cli(["compare", str(orig), str(path)]),
            ]
            for cmd, rc in zip(("inspect", "dequantize", "compare"), codes, strict=True):
                extra[f"cli {cmd} exit {rc}"] = 1
            if outcome == "loaded-correct" and codes[0] != 0:
                raise Inconsistent("the CLI reader accepts the file but arrayquant inspect exits 1")
        return outcome, extra
    if case.target == "nvfp4":
        from arrayquant.io import read_nvfp4

        def nvfp4() -> None:
            if not case.source:  # a file (perhaps cut to nothing)
                path = workdir / "case.safetensors"
                path.write_bytes(case.blob)
                source: Any = path
            else:
                Stage.now = "build arguments"
                scope = dict(ns)
                exec(case.source, scope)
                source = scope["entries"]
            Stage.now = "read_nvfp4"
            qt = read_nvfp4(source, case.name, backend="numpy")
            _checked(lambda: check_tensor(qt), lib)

        return _outcome_of(nvfp4, lib), extra

    if case.target == "quantize":

        def quantize() -> None:
            import numpy as np

            Stage.now = "build arguments"
            scope = dict(ns)
            exec(case.source, scope)
            qt, x = scope["qt"], scope["x"]

            def checks() -> None:
                check_tensor(qt)
                # the contract: finite input gives finite f32 values back (a float16
                # input may still dequantize past 65504 in float16: reported, not checked)
                if np.isfinite(np.asarray(x, np.float64)).all():
                    deq = np.asarray(aq_dequantize(qt, np.float32), np.float64).reshape(-1)
                    if not np.isfinite(deq).all():
                        bad = np.asarray(x, np.float64).reshape(-1)[~np.isfinite(deq)]
                        msg = f"finite {x.dtype} input {bad[:2].tolist()} dequantizes to non-finite f32 ({qt.scheme})"
                        raise Inconsistent(msg)

            _checked(checks, lib)

        return _outcome_of(quantize, lib), extra

    if case.target == "selftest":

        def selftest() -> None:
            Stage.now = "selftest"
            exec(case.source, dict(ns))

        return _outcome_of(selftest, lib), extra

    def from_bytes() -> None:
        import arrayquant as aq

        Stage.now = "build arguments"
        scope = dict(ns)
        exec(case.source, scope)
        Stage.now = "from_bytes"
        qt = aq.from_bytes(scope["buf"], scope["scheme"], scope["shape"], backend="numpy")

        def checks() -> None:
            check_tensor(qt)
            if aq.to_bytes(qt) != logical_bytes(scope["buf"]):
                raise Inconsistent("an accepted buffer does not come back byte for byte")

        _checked(checks, lib)

    return _outcome_of(from_bytes, lib), extra


def classify(case: Case, workdir: Path, ns: dict[str, Any], slow_s: float = SLOW_S, abort_s: int = ABORT_S) -> Result:
    """Run ``case`` with warnings recorded and an alarm set; every escape becomes a ``FAIL``."""
    Stage.now = ""
    res = Result(case.target, case.seed, "", kind=case.kind)
    old = signal.signal(signal.SIGALRM, _alarm)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            signal.alarm(abort_s)
            try:
                res.outcome, res.extra = execute(case, workdir, ns)
            finally:
                signal.alarm(0)
        if caught:
            w = caught[0]
            res.outcome = f"{FAIL}warning {w.category.__name__}"
            res.detail = f"{w.category.__name__}: {w.message} ({Path(w.filename).name}:{w.lineno})"
    except CaseTimeout:
        res.outcome, res.detail = f"{FAIL}slow", f"aborted after {abort_s} s"
    except MemoryError as exc:
        res.outcome, res.detail = f"{FAIL}memory", _short(exc)
        res.restart = True
    except Inconsistent as exc:
        res.outcome, res.detail = f"{FAIL}inconsistent", str(exc)
        res.where = _where(exc.__cause__) if exc.__cause__ else ""
    except CliFailure as exc:
        res.outcome, res.detail = f"{FAIL}cli", str(exc)
    except Exception as exc:  # what escaped the library: the failures this harness is for
        res.outcome, res.detail = f"{FAIL}exception {type(exc).__name__}", _short(exc)
        res.where = _where(exc)
    finally:
        signal.signal(signal.SIGALRM, old)
    res.seconds = time.perf_counter() - start
    res.stage = Stage.now
    if res.seconds > slow_s and not res.failed:
        res.outcome, res.detail = f"{FAIL}slow", f"took {res.seconds:.1f} s"
    return res


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


# ---------------------------------------------------------------------------------------------
# the capped worker and the harness
# ---------------------------------------------------------------------------------------------


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _max_rss() -> int:
    """Peak RSS since this process started (VmHWM: ru_maxrss would carry the parent's peak over exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _warm_fused() -> None:
    """Compile (or load from Numba's cache) every fused kernel the cases may reach, before the timers.

    A compile inside a case would count as slow, and one cut short by the alarm never reaches the
    cache, so the next worker would start it again. Read-only arrays (what ``from_bytes`` and
    ``load`` return) are kernels of their own to Numba.
    """
    import numpy as np

    import arrayquant as aq

    x = np.linspace(-3.0, 3.0, 4 * 96, dtype=np.float32).reshape(4, 96)
    schemes = (
        "q8s", "q8s:native", "q8f:block32:f16", "q4s:block32:f16", "q4f:block16:bf16:native",
        "q2s:block32:ue8m0", "e4m3", "e5m2:block32:f16", "e2m1:block32:ue4m3:native", "nvfp4", "mxfp4", "mxfp8",
    )  # fmt: skip
    for text in schemes:
        for data in (x, _read_only(x)):
            qt = aq.quantize(data, text)
            aq.quantize(data, text, aq.QParams(qt.scales, qt.global_scale))
            frozen = aq.QuantizedTensor(
                qt.scheme, qt.shape, qt.dtype, _read_only(qt.values), _read_only(qt.scales), qt.global_scale
            )
            aq.dequantize(qt)
            aq.dequantize(frozen)


def _read_only(a: Any) -> Any:
    if a is None:
        return None
    out = a.copy()
    out.setflags(write=False)
    return out


def warm_up() -> dict[str, Any]:
    """Import and build everything once, so the cap and the RSS baseline see a steady state."""
    import numpy as np

    # NumPy's own defaults (underflow is silent), whatever the parent process set
    np.seterr(divide="warn", over="warn", under="ignore", invalid="warn")
    checkpoint_bases()
    float_base()
    nvfp4_bases()
    _warm_fused()
    ns = _namespace()
    with tempfile.TemporaryDirectory() as tmp:
        for target in TARGETS:
            for seed in range(4):
                classify(make_case(target, seed), Path(tmp), ns)
    return ns


def _worker(conn: Any, cap: int, slow_s: float, abort_s: int) -> None:
    import resource

    ns = warm_up()
    ns.update(SLOW=slow_s + 0.3, Inconsistent=Inconsistent)  # for the SELFTEST cases
    base_vm = _vm_size()
    if cap > 0:
        limit = base_vm + cap
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    conn.send(("ready", {"vm": base_vm, "rss": _max_rss(), "cap": cap}))
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        while True:
            msg = conn.recv()
            if msg is None:
                return
            target, seed = msg
            before = _max_rss()
            old = signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(abort_s)
            try:
                case = make_case(target, seed)
            except (Exception, CaseTimeout) as exc:  # the generator itself: report, never hide
                conn.send(Result(target, seed, f"{FAIL}generator", _short(exc) or "timed out"))
                continue
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)
            res = classify(case, workdir, ns, slow_s, abort_s)
            grew = _max_rss() - before
            if grew > RSS_GROWTH and (not res.failed or res.outcome == FAIL + "slow"):
                res.outcome, res.detail = f"{FAIL}memory", f"peak RSS grew by {grew / 2**20:.0f} MiB"
            res.restart = res.restart or grew > RSS_GROWTH
            conn.send(res)


class Harness:
    """Cases run in capped ``spawn`` workers, one case in flight per worker."""

    def __init__(
        self, workers: int = 1, cap: int = DEFAULT_CAP, slow_s: float = SLOW_S, abort_s: int = ABORT_S
    ) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.cap = cap
        self.limits = (slow_s, abort_s)
        self.starts = 0
        self.slots: list[Any] = [None] * workers
        self.info: dict[str, Any] = {}

    def _start(self, i: int) -> Any:
        parent, child = self.ctx.Pipe()
        saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        os.environ.update(dict.fromkeys(saved, "1"))  # one thread per worker; the machine is shared
        try:
            proc = self.ctx.Process(target=_worker, args=(child, self.cap, *self.limits), daemon=True)
            proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        child.close()
        try:
            if not parent.poll(300):
                raise EOFError
            _, self.info = parent.recv()
        except (EOFError, OSError):
            proc.kill()
            proc.join()
            msg = f"a fuzz worker did not start (exit code {proc.exitcode}); its traceback is above"
            raise RuntimeError(msg) from None
        self.starts += 1
        self.slots[i] = (proc, parent)
        return self.slots[i]

    def _stop(self, i: int) -> None:
        slot = self.slots[i]
        self.slots[i] = None
        if slot is None:
            return
        proc, conn = slot
        with contextlib.suppress(OSError, ValueError):
            conn.send(None)
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        conn.close()

    def close(self) -> None:
        for i in range(len(self.slots)):
            self._stop(i)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, cases: Iterable[tuple[str, int]]) -> Iterator[Result]:
        """Each case's :class:`Result`, in completion order."""
        from multiprocessing.connection import wait

        todo = iter(cases)
        busy: dict[int, tuple[tuple[str, int], float]] = {}
        done = False
        while True:
            for i in range(len(self.slots)):
                if i in busy or done:
                    continue
                nxt = next(todo, None)
                if nxt is None:
                    done = True
                    break
                slot = self.slots[i] or self._start(i)
                slot[1].send(nxt)
                busy[i] = (nxt, time.monotonic())
            if not busy:
                return
            conns: dict[Any, int] = {self.slots[i][1]: i for i in busy}
            ready = wait(list(conns), timeout=1.0)
            for conn in ready:
                i = conns[conn]
                (target, seed), _ = busy.pop(i)
                try:
                    res: Result = _recv(conn)
                except (EOFError, OSError):  # the worker died: killed at the cap, or a crash
                    proc = self.slots[i][0]
                    proc.join(5)
                    res = Result(target, seed, f"{FAIL}crash", f"worker died with exit code {proc.exitcode}")
                    res.restart = True
                if res.restart:
                    self._stop(i)
                yield res
            now = time.monotonic()
            for i, ((target, seed), began) in list(busy.items()):
                if now - began > HARD_S:
                    busy.pop(i)
                    self._stop(i)
                    yield Result(target, seed, f"{FAIL}slow", f"no answer after {HARD_S:.0f} s; worker killed")


def _recv(conn: Any) -> Result:
    res: Result = conn.recv()
    return res


def plan(cases: int, seed: int, targets: Iterable[str] = TARGETS) -> Iterator[tuple[str, int]]:
    """``cases`` cases, the targets taken in turn; case seeds derive from the run's seed."""
    names = list(targets)
    for i in range(cases):
        yield names[i % len(names)], seed * 10**9 + i // len(names)


# ---------------------------------------------------------------------------------------------
# reports
# ---------------------------------------------------------------------------------------------

_NUM = re.compile(r"\d+")
_PATH = re.compile(r"/\S*?\.safetensors|/tmp/\S+")


def failure_key(res: Result) -> tuple[str, str, str]:
    """Failures raised at the same library line, or with messages that differ only in numbers
    and paths, are the same failure."""
    if res.where:  # the outcome names the exception type; an inconsistency, its cause's type
        cause = re.search(r"raised (\w+)", res.detail)
        return (res.target, res.outcome, f"{res.stage}: {res.where} {cause.group(1) if cause else ''}")
    text = _PATH.sub("<path>", res.detail)
    text = _NUM.sub("#", text)
    return (res.target, res.outcome, f"{res.stage}: {text[:200]}")


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    per_target: dict[str, Counter[str]] = field(default_factory=dict)
    extra: Counter[str] = field(default_factory=Counter)
    failures: dict[tuple[str, str, str], list[Result]] = field(default_factory=dict)
    slowest: float = 0.0

    def add(self, res: Result) -> None:
        self.outcomes[res.outcome] += 1
        self.per_target.setdefault(res.target, Counter())[res.outcome] += 1
        self.extra.update(res.extra)
        self.slowest = max(self.slowest, res.seconds)
        if res.failed:
            self.failures.setdefault(failure_key(res), []).append(res)

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    @property
    def failed(self) -> int:
        return sum(v for k, v in self.outcomes.items() if k.startswith(FAIL))

    def report(self, examples: int = 1) -> str:
        lines = [f"{self.total} cases, {self.failed} failures, slowest case {self.slowest:.2f} s", "failure classes:"]
        classes: Counter[str] = Counter()
        for k, v in self.outcomes.items():
            if k.startswith(FAIL):
                classes[k[len(FAIL) :].split(" ")[0]] += v
        lines += [f"  {classes[c]:>8}  {c}: {what}" for c, what in FAILURE_CLASSES.items()]
        lines.append("outcomes:")
        lines += [
            f"  {v:>8}  {k}" for k, v in sorted(self.outcomes.items(), key=lambda kv: (kv[0].startswith(FAIL), kv[0]))
        ]
        for target, counts in sorted(self.per_target.items()):
            lines.append(f"target {target}:")
            lines += [f"  {v:>8}  {k}" for k, v in sorted(counts.items())]
        if self.extra:
            lines.append("CLI exit statuses:")
            lines += [f"  {v:>8}  {k}" for k, v in sorted(self.extra.items())]
        if self.failures:
            lines.append(f"distinct failures: {len(self.failures)}")
            for (target, outcome, _), results in sorted(self.failures.items(), key=lambda kv: -len(kv[1])):
                first = results[0]
                where = f" [{first.where}]" if first.where else ""
                lines.append(f"  [{len(results)}x] {target} {outcome} at {first.stage or '?'}: {first.detail}{where}")
                for res in results[:examples]:
                    lines.append(f"      replay: python ci/fuzz.py --replay {res.target}:{res.seed}  ({res.kind})")
        return "\n".join(lines)


def reproducer(case: Case) -> str:
    """Stand-alone Python that does what ``case`` does (the checks of an accepted result left out)."""
    head = "import array, base64, zlib\nfrom math import inf, nan\n"
    head += "import ml_dtypes, numpy as np\nimport arrayquant as aq\n"
    if case.target in ("load", "cli", *FILE_TARGETS) or not case.source:
        head += f"blob = {_blob_expr(case.blob)}\nopen('case.safetensors', 'wb').write(blob)\n"
        if case.target in ("load", *FILE_TARGETS):  # aq.load finds the format from the content
            return (
                head
                + "for v in aq.load('case.safetensors', backend='numpy').values():\n"
                + ("    if isinstance(v, aq.QuantizedTensor): aq.dequantize(v); aq.to_bytes(v)\n")
            )
        if case.target == "nvfp4":
            return head + (
                f"from arrayquant.io import read_nvfp4\n"
                f"aq.dequantize(read_nvfp4('case.safetensors', {case.name!r}, backend='numpy'))\n"
            )
        return head + (
            "from arrayquant.cli_commands import Checkpoint\nfrom arrayquant.cli import main\n"
            "with Checkpoint('case.safetensors') as ck:\n    for e in ck.tensors:\n"
            "        if e.name in ck.described: aq.dequantize(ck.quantized(e.name))\n"
            "        else: ck.array(e.name)\n"
            "main(['inspect', 'case.safetensors'])\n"
        )
    if case.target == "nvfp4":
        return head + (
            f"from arrayquant.io import read_nvfp4\n{case.source}\n"
            f"aq.dequantize(read_nvfp4(entries, {case.name!r}, backend='numpy'))\n"
        )
    if case.target != "bytes":  # quantize, selftest
        body = "\n".join(ln for ln in case.source.splitlines() if not ln.startswith("stage("))
        return head + body + ("\naq.dequantize(qt)\n" if case.target == "quantize" else "\n")
    scope = _namespace()
    lines = case.source.splitlines()
    try:
        exec(case.source, scope)  # the concrete bytes, as the case made them
    except Exception:  # building the arguments is what fails: show all of it
        body = case.source.replace("true_bytes(scheme, shape, need, rng)", "b''")
        return head + body + "\nqt = aq.from_bytes(buf, scheme, shape, backend='numpy')\n"
    return (
        head
        + "\n".join([lines[0], lines[1], f"raw = {_blob_expr(scope['raw'])}", lines[-1]])
        + "\nqt = aq.from_bytes(buf, scheme, shape, backend='numpy')\naq.dequantize(qt)\n"
    )
