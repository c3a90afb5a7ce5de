"""Fuzz targets and a memory-capped harness for every reader of untrusted input.

A *case* is ``(target, seed)``: the seed alone decides what the case does, so any outcome can be
replayed (``python ci/fuzz.py --replay TARGET:SEED``) and turned into a stand-alone Python
reproducer (:func:`reproducer`). Targets:

- ``load``: ``aq.load`` of a mutated checkpoint, every tensor checked (dequantize, Burn bytes
  round trip);
- ``cli``: the CLI's own reader (``arrayquant.io.arrayquant.layout.Checkpoint``: open, walk ``.tensors``,
  ``.array`` / ``.quantized`` + ``aq.dequantize``), which must accept exactly what ``load``
  accepts; on every fourth case also ``arrayquant inspect``, ``dequantize`` and ``compare``
  through ``cli.main`` with a strict UTF-8 stdout, expecting exit 0 or 1 and no traceback;
- ``nvfp4``: ``read_nvfp4`` of a mutated compressed-tensors file or of a mapping of arrays of
  any dtype, shape and layout, or of things that are not arrays;
- ``gguf``, ``burnpack``, ``onnx``: ``aq.load`` (the format found from the content) of a mutated
  GGUF, Burnpack or ONNX file written by arrayquant (ONNX: QDQ with INT4 zero points and FP8, and
  MatMulNBits), every tensor checked; on every fourth case also ``arrayquant inspect`` and
  ``dequantize``;
- ``bytes``: ``aq.from_bytes(buf, scheme, shape)`` + ``aq.dequantize`` with random scheme text
  (block extents up to 2**64 and 5,000 digits, 70-dimensional blocks, two levels, every scale
  dtype, lookup, stores), random shapes (rank 0 to 70, zero and huge extents, non-int extents)
  and buffer types (bytes, bytearray, memoryview, NumPy arrays of any dtype, non-contiguous
  views, str, None, int);
- ``folder``: ``aq.load`` of a Hugging Face model folder (float, one file or three shards, and
  ``quantize_model``'s compressed-tensors folders of every format, sharded and cut inside modules)
  made hostile: index shard names outside the folder (``../``, absolute, ``a/../b``), not file
  names (NUL, ``"\\ud800"``, a folder, non-strings), FIFOs, links out, link loops, lying or
  duplicate entries; config.json not JSON, 100,000 deep, not a file, or a quantization_config
  with absurd fields, catastrophic or broken patterns and unknown formats; compressed-tensors
  entries dropped, re-typed or lying (``weight_shape`` of 2**40); extra files that are links to
  ``/dev/zero``, FIFOs, link loops or 400-deep folders. On every fourth case also ``arrayquant
  inspect``, ``dequantize`` and ``quantize``. Sentinels lie beside the folder and two levels above
  OUT: anything created, changed or removed outside OUT (IN included), or a sentinel's tensor in a
  result, is ``escaped``;
- ``gguf-meta``: GGUF metadata bombs (200,000 key/values, 4 MiB arrays, 500,000 empty strings,
  a 150,000-token tokenizer that must read right) and lies (counts and lengths of 2**40 and more,
  nested arrays 100,000 deep, unknown types, bad UTF-8, ``general.alignment`` 0, 3, 2**31 or not a
  UINT32), at most 4 MiB each, through ``aq.load`` and ``read_metadata`` (and the CLI);
- ``ops``: ``aq.ops`` layout operations, reductions, sorts and selections on small quantized
  tensors of many schemes, with hostile arguments (sizes of 2**40, 2**63, -1, 0, floats, bools,
  None; bad axes; indices out of range or of odd dtypes; slices with huge steps; mismatched
  tensors to join). An accepted result has NumPy's shape for the same operation on the
  dequantized input, and its values where ``is_exact`` says the codes were moved.

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
  ``cli`` (an exit status other than 0/1, a traceback or a multi-line error), ``escaped`` (a
  model folder case that touched a file outside its OUT or read one outside its folder).

Workers cap the size of a file they write (``RLIMIT_FSIZE``, 256 MiB), and a folder case with
FIFOs has a forked helper open them after 5.5 s, so a reader blocked opening one (in C, where
SIGALRM cannot reach) ends as ``slow`` rather than holding the worker.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import multiprocessing
import operator
import os
import random
import re
import signal
import stat
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

TARGETS = ("load", "cli", "nvfp4", "bytes", "quantize", "gguf", "burnpack", "onnx", "folder", "gguf-meta", "ops")
FILE_TARGETS = ("gguf", "burnpack", "onnx")  # files of these formats, mutated and read through aq.load
# the share of CI's cases per target a target gets (the rest: 1); model folders cost more per case
CI_SHARE = {"folder": 0.5}
# how many kinds of typed refusal a target must reach in CI: the GGUF and Burnpack readers refuse
# most damage as one kind (corrupt data), some as a shape
ERROR_KINDS = {"gguf": 2, "burnpack": 2, "onnx": 2, "gguf-meta": 1}
SLOW_S = 5.0  # a case over this is a failure
ABORT_S = 10  # ... and is aborted here (SIGALRM)
HARD_S = 60.0  # the parent kills a worker that has not answered by then
RSS_GROWTH = 256 * 2**20  # peak-RSS growth of one case counted as a memory failure
DEFAULT_CAP = 2 * 2**30  # address space allowed above the worker's size after start-up
FILE_CAP = 256 * 2**20  # the largest file a worker may write
FAIL = "FAIL "
FAILURE_CLASSES = {
    "exception": "an exception that is not the library's",
    "warning": "a warning that reached the caller",
    "slow": f"over {SLOW_S:.0f} s",
    "memory": "MemoryError at the address-space cap, or peak RSS up by more than 256 MiB",
    "crash": "the worker died",
    "inconsistent": "an accepted result that fails its checks, or readers that disagree",
    "cli": "a CLI exit status other than 0/1, a traceback, or exit 1 without its error line",
    "escaped": "a file outside the case's OUT created, changed or removed, or a tensor read from outside the folder",
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


class Escaped(Exception):
    """A case that wrote outside its OUT folder (or into IN), or read a tensor from outside its folder."""


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
                    tensors[name] = x.astype(aq.io.safetensors.reader.ml_dtype("bfloat16"))
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
    """Valid GGUF, Burnpack or ONNX files written by arrayquant: quantized tensors the format holds, and plain ones."""
    import numpy as np

    import arrayquant as aq

    if target == "onnx":
        return _onnx_bases()
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


def _onnx_bases() -> tuple[bytes, ...]:
    """A MatMul + Gemm model quantized by ``aq.quantize_file`` as QDQ (INT4 blocks with zero points, FP8)
    and as MatMulNBits, a few kilobytes each."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import arrayquant as aq

    w1, w2 = _x((32, 64), 4), _x((16, 64), 5)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Gemm", ["h", "W2"], ["y"], transB=1)],
        "fuzz",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = []
    with tempfile.TemporaryDirectory() as folder:
        src = Path(folder) / "m.onnx"
        onnx.save(model, src)
        for i, (scheme, fmt) in enumerate(
            (("u4:block16:zero_point", "onnx"), ("mxfp8", "onnx"), ("q4s:block16", "matmulnbits"))
        ):
            dst = Path(folder) / f"{i}.onnx"
            aq.quantize_file(src, dst, scheme, format=fmt)
            out.append(dst.read_bytes())
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
    name: str = ""  # the nvfp4 weight name; the folder base; the ops function
    cli: bool = False
    expect: Any = None  # folder, gguf-meta: what a valid input must read to (a base's index, metadata)


# The harness's own check: each of these must end in its class (tests/test_fuzz.py runs them).
SELFTEST: list[tuple[str, str]] = [
    ("loaded-correct", "x = np.ones(4)"),
    ("error ShapeError", "raise aq.ShapeError('a typed error')"),
    ("FAIL exception KeyError", "{}['missing']"),
    ("FAIL warning UserWarning", "import warnings; warnings.warn('leaked')"),
    ("FAIL warning RuntimeWarning", "np.float32(3e38) * np.float32(10)"),
    ("FAIL exception RecursionError", "import json; json.loads('[' * 100000)"),
    ("FAIL inconsistent", "raise Inconsistent('an accepted result that does not hold up')"),
    ("FAIL escaped", "watch_escape(lambda root: (root / 'notes.txt').write_text('changed'))"),
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
    makers = {
        "nvfp4": _nvfp4_case,
        "bytes": _bytes_case,
        "quantize": _quantize_case,
        "folder": _folder_case,
        "gguf-meta": _gguf_meta_case,
        "ops": _ops_case,
    }
    if target in makers:
        return makers[target](r, seed)
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
# model folders (target "folder")
# ---------------------------------------------------------------------------------------------

INDEX = "model.safetensors.index.json"
SECRET = "victim.secret"  # the tensor of the files beside a case's folder: in a result, a read outside it
SENTINELS = ("victim.safetensors", "notes.txt")  # beside the folder, and two levels above OUT
FOLDER_WEIGHTS: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (16, 64),
    "model.layers.0.self_attn.q_proj.weight": (32, 64),
    "model.layers.0.mlp.up_proj.weight": (48, 64),
    "model.layers.0.input_layernorm.weight": (64,),
    "model.layers.1.mlp.down_proj.weight": (64, 32),
    "lm_head.weight": (16, 64),
}
MODEL_CONFIG = {"model_type": "llama", "hidden_size": 64, "vocab_size": 16, "num_hidden_layers": 2}
# the schemes with a compressed-tensors format (docs/guide.md): NVFP4, MX, W4A16 / W8A16 groups and rows, FP8 rows
FOLDER_SCHEMES = ("nvfp4", "mxfp8", "mxfp4", "q4s:block32:bf16", "q8s:block65536:bf16", "e4m3:block1x65536:bf16:native")
# Run by a case before its source, with ROOT (the case's folder) and IN (the model folder) set;
# the reproducer prints it as it is. "@ROOT@" in a text or a link target becomes ROOT's path.
FOLDER_PRELUDE = """\
def put(name, data):
    if isinstance(data, str):
        data = data.replace("@ROOT@", str(ROOT)).encode()
    (IN / name).write_bytes(data)
def fifo(name):
    os.mkfifo(IN / name)
def link(name, target):
    os.symlink(target.replace("@ROOT@", str(ROOT)), IN / name)
def mkdir(name):
    (IN / name).mkdir(parents=True)
"""


def _st_file(arrays: dict[str, Any]) -> bytes:
    """A plain float32 safetensors file, as ``save_pretrained`` writes one."""
    return layout([(k, "F32", list(v.shape), v.tobytes()) for k, v in arrays.items()], {"format": "pt"})


def _float_folder(shards: int) -> dict[str, bytes]:
    arrays = {n: _x(s, 60 + i) / 64 for i, (n, s) in enumerate(FOLDER_WEIGHTS.items())}
    files = {"config.json": json.dumps(MODEL_CONFIG).encode(), "tokenizer.json": b'{"version": "1.0", "model": {}}\n'}
    if shards == 1:
        files["model.safetensors"] = _st_file(arrays)
        return files
    names = list(arrays)
    weight_map: dict[str, str] = {}
    for k in range(shards):
        shard = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        files[shard] = _st_file({n: arrays[n] for n in names[k::shards]})
        weight_map.update(dict.fromkeys(names[k::shards], shard))
    total = sum(a.nbytes for a in arrays.values())
    files[INDEX] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    ).encode()
    return files


def _write_folder(folder: Path, files: Iterable[tuple[str, bytes]]) -> None:
    folder.mkdir(parents=True)
    for name, data in files:
        (folder / name).write_bytes(data)


@cache
def folder_bases() -> tuple[tuple[str, tuple[tuple[str, bytes], ...]], ...]:
    """(label, files) of small valid model folders: float (one file, three shards) and written by
    ``quantize_model`` in every compressed-tensors format, one of them sharded, one cut inside modules."""
    from arrayquant.io.compressed_tensors.requantize import quantize_model

    out = [("float", _float_folder(1)), ("float-sharded", _float_folder(3))]
    with tempfile.TemporaryDirectory() as tmp:
        single, sharded = Path(tmp) / "float", Path(tmp) / "sharded"
        _write_folder(single, out[0][1].items())
        _write_folder(sharded, out[1][1].items())
        jobs = [(single, s, None) for s in FOLDER_SCHEMES] + [(sharded, "nvfp4", None), (single, "mxfp8", 3000)]
        for i, (src, scheme, cut) in enumerate(jobs):
            dst = Path(tmp) / f"q{i}"
            quantize_model(src, dst, scheme, max_shard_size=cut)
            label = scheme + ("-sharded" if src == sharded else "-cut" if cut else "")
            out.append((label, {p.name: p.read_bytes() for p in sorted(dst.iterdir())}))
    return tuple((label, tuple(sorted(files.items()))) for label, files in out)


def _dequantized(out: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    import arrayquant as aq

    return {k: aq.dequantize(v) if isinstance(v, aq.QuantizedTensor) else np.asarray(v) for k, v in out.items()}


@cache
def folder_expected(i: int) -> dict[str, Any]:
    """What ``aq.load`` gives for base folder ``i``, dequantized: a benign mutation must give the same."""
    import arrayquant as aq

    with tempfile.TemporaryDirectory() as tmp:
        _write_folder(Path(tmp) / "m", folder_bases()[i][1])
        return _dequantized(aq.load(Path(tmp) / "m", backend="numpy"))


def _sentinel(name: str) -> bytes:
    if name.endswith(".safetensors"):
        return layout([(SECRET, "F32", [4], struct.pack("<4f", 42.0, 42.0, 42.0, 42.0))], {"format": "pt"})
    return b"notes beside the model folder\n"


@dataclass
class _Folder:
    """A folder being mutated: files by name (text may hold "@ROOT@"), and source lines for the rest."""

    files: dict[str, bytes | str]
    first: list[str] = field(default_factory=list)  # folders, made before the files
    last: list[str] = field(default_factory=list)  # FIFOs and links, after them
    taken: set[str] = field(default_factory=set)  # names made so: no file, FIFO or link may take them again

    def special(self, line: str, name: str, first: bool = False) -> bool:
        """``line`` (a fifo, link or mkdir call) making ``name``, unless an earlier edit made that name."""
        if name in self.taken:
            return False
        self.taken.add(name)
        self.files.pop(name, None)
        (self.first if first else self.last).append(line)
        return True

    def index(self) -> dict[str, Any] | None:
        raw = self.files.get(INDEX)
        try:
            found = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        return found if isinstance(found, dict) and isinstance(found.get("weight_map"), dict) else None

    def shards(self) -> list[str]:
        index = self.index()
        if index is not None:
            return sorted({v for v in index["weight_map"].values() if isinstance(v, str) and v in self.files})
        return ["model.safetensors"] if "model.safetensors" in self.files else []

    def indexed(self) -> dict[str, Any]:
        """The index, made for a single-file folder (an index is what names files to read)."""
        index = self.index()
        if index is None:
            names = [e[0] for e in entries_of(_bytes(self.files.get("model.safetensors", b"")))[0]]
            index = {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")}
        return index

    def source(self) -> str:
        lines = list(self.first)
        for name, data in self.files.items():
            if name in self.taken:
                continue
            if isinstance(data, str):
                expr = repr(data) if len(data) <= 4000 else f"{_blob_expr(data.encode())}.decode()"
            else:
                expr = _blob_expr(data)
            lines.append(f"put({name!r}, {expr})")
        return "\n".join(lines + self.last)


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


# weight_map values: outside the folder, not a file name, not a regular file, or a link
SHARD_LIES = [
    "../victim.safetensors",
    "../../victim.safetensors",
    "../o/victim.safetensors",
    "@ROOT@/victim.safetensors",
    "@ROOT@/model/../victim.safetensors",
    "/dev/zero",
    "/etc/passwd",
    "a/../{shard}",
    "./{shard}",
    "{shard}/",
    "sub/{shard}",
    "{stem}\x00.safetensors",
    "\ud800",
    "\ud800.safetensors",
    "",
    ".",
    "..",
    " ",
    "..\\victim.safetensors",
    "C:\\victim.safetensors",
    "a" * 300 + ".safetensors",
    "missing.safetensors",
    "sub",
    "fifo.safetensors",
    "outside.safetensors",
    "loop.safetensors",
    "dangling.safetensors",
    "config.json",
    INDEX,
    5,
    None,
    ["{shard}"],
    {"a": 1},
    True,
]
# strange, hostile or catastrophic patterns for targets and ignore
PATTERNS = [
    "Linear",
    "re:.*",
    "re:(.*.*)*!",
    "re:(a+)+$",
    "re:(x|x|x)*y",
    "re:(",
    "re:[",
    "re:(?P<a>",
    "re:\\",
    "re:" + "a" * 10000,
    "re:" + "(" * 300 + ")" * 300,
    "re:.*mlp.*",
    "re:^model\\.layers\\.0\\..*$",
    "re:(?i)LINEAR",
    "re:\ud800",
    "",
    "\x00",
    "lm_head",
]
QC_FIELDS: dict[str, list[Any]] = {
    "num_bits": [[], -1, 0, 1, 3, 5, 16, 64, 2**31, 2**70, "4", 4.0, 4.5, None, True, raw_json("1e999")],
    "strategy": ["tensor", "channel", "group", "block", "tensor_group", "token", "attn_head", "", "GROUP", None, 5],
    "group_size": [0, -1, 1, 3, 7, 2**31, 2**40, 2**70, "16", 16.5, None, [16], raw_json("9" * 400)],
    "block_structure": [[2**40, 1], [0, 0], [-1, 16], [1], [16, 16, 16], "x", None, [1.5, 2]],
    "type": ["int", "float", "", "complex", None, 4],
    "symmetric": [False, "yes", None, 0],
    "scale_dtype": ["torch.float8_e4m3fn", "torch.float64", "torch.complex64", "", "torch.\ud800", None, 5],
    "dynamic": [True, "local", None],
    "zp_dtype": ["torch.int8", "x", None],
    "actorder": ["group", "weight", "x", None],
    "observer": ["minmax", None, 5],
}
FORMATS = [
    "nvfp4-pack-quantized",
    "mxfp8-quantized",
    "mxfp4-pack-quantized",
    "pack-quantized",
    "float-quantized",
    "int-quantized",
    "naive-quantized",
    "marlin-24",
    "dense",
    "sparse-24-bitmask",
    "",
    None,
    5,
    "\ud800",
    "x" * 5000,
]


def _index_edit(r: random.Random, f: _Folder) -> tuple[str, bool]:
    """An edit of the index: a shard name that must be refused, a weight_map that is not one, or entries that lie."""
    index = f.indexed()
    wm = index["weight_map"]
    shards = f.shards() or ["model.safetensors"]
    op = r.choice(["value", "value", "value", "map", "dup", "dup", "alias"])
    if op == "value":
        shard = r.choice(shards)
        lie = r.choice(SHARD_LIES)
        stem = shard.rsplit(".", 1)[0]
        fill = lambda v: v.format(shard=shard, stem=stem) if isinstance(v, str) else v
        lie = [fill(v) for v in lie] if isinstance(lie, list) else fill(lie)
        if lie in ("sub", f"sub/{shard}"):
            if f.special("mkdir('sub')", "sub", first=True) and lie != "sub":
                f.files[f"sub/{shard}"] = f.files.get(shard, b"")
        elif lie == "fifo.safetensors":
            f.special("fifo('fifo.safetensors')", lie)
        elif lie == "outside.safetensors":
            to = r.choice(["../victim.safetensors", "@ROOT@/victim.safetensors", "/dev/zero", "../o/notes.txt"])
            f.special(f"link('outside.safetensors', {to!r})", lie)
        elif lie == "loop.safetensors":  # a link to itself, or two links to each other
            other = r.choice(["loop.safetensors", "l2"])
            if f.special(f"link('loop.safetensors', {other!r})", lie) and other == "l2":
                f.special("link('l2', 'loop.safetensors')", other)
        elif lie == "dangling.safetensors":
            f.special("link('dangling.safetensors', 'nowhere.safetensors')", lie)
        keys = [k for k, v in wm.items() if v == shard] or list(wm)
        for k in keys if r.random() < 0.5 else keys[:1]:
            wm[k] = lie
        f.files[INDEX] = json.dumps(index)
        return f"index-value:{lie!r}"[:60], False
    if op == "map":
        text = r.choice(
            [
                json.dumps({"weight_map": r.choice([[], "x", None, 5, {}, [["a", shards[0]]]])}),
                json.dumps({"metadata": {}}),
                json.dumps([index]),
                "{",
                "",
                "[" * 100000,
                '{"weight_map": ' + '{"a": ' * 100000,
                json.dumps({"weight_map": {f"t{i}": shards[0] for i in range(50000)}}),  # 50,000 ghosts
            ]
        )
        f.files[INDEX] = text
        return "index-map", False
    if op == "alias":  # a link to a shard of the folder: it is the folder's own file
        shard = r.choice(shards)
        if not f.special(f"link('alias.safetensors', {shard!r})", "alias.safetensors"):
            return "index-alias", True
        for k, v in wm.items():
            if v == shard:
                wm[k] = "alias.safetensors"
        f.files[INDEX] = json.dumps(index)
        return "index-alias", True
    # dup: a tensor under the wrong shard, a tensor left out, a ghost, a key twice, a shard twice
    names = sorted(wm)
    how = r.choice(["wrong-shard", "left-out", "ghost", "twice", "same-tensor"])
    if how == "wrong-shard" and len(shards) > 1:
        k = r.choice(names)
        wm[k] = r.choice([s for s in shards if s != wm[k]])
    elif how == "left-out" and names:
        del wm[r.choice(names)]
    elif how == "ghost":
        wm[r.choice(["ghost.weight", *(n + ".weight_scale" for n in names), ""])] = r.choice(shards)
    elif how == "twice" and names:
        k = r.choice(names)
        text = json.dumps(index).replace(
            '"weight_map": {', f'"weight_map": {{{json.dumps(k)}: "{r.choice(shards)}", ', 1
        )
        f.files[INDEX] = text
        return f"index-dup:{how}", False
    elif how == "same-tensor" and len(shards) > 1:  # one tensor in two shards
        a, b = r.sample(shards, 2)
        entries_a, _ = entries_of(_bytes(f.files[a]))
        entries_b, meta_b = entries_of(_bytes(f.files[b]))
        if entries_a:
            f.files[b] = layout([*entries_b, r.choice(entries_a)], meta_b)
    f.files[INDEX] = json.dumps(index)
    return f"index-dup:{how}", False


def _groups(qc: dict[str, Any]) -> list[dict[str, Any]]:
    groups = qc.get("config_groups")
    return [g for g in groups.values() if isinstance(g, dict)] if isinstance(groups, dict) else []


def _config_edit(r: random.Random, f: _Folder, quantized_sibling: dict[str, Any]) -> tuple[str, bool]:
    """An edit of config.json: not JSON, nested deep, not a file, or a quantization_config that lies."""
    try:
        config = json.loads(f.files.get("config.json", "{}"))
    except ValueError:
        config = {}
    config = config if isinstance(config, dict) else {}
    qc = config.get("quantization_config")
    op = r.choice(["text", "deep", "file", "field", "field", "field", "patterns", "patterns", "format", "top"])
    if op == "text":
        f.files["config.json"] = r.choice([b"{", b"\xff\xfe{}", b"", b"null", b"[]", b'"x"', b"5", b'{"a": NaN}'])
    elif op == "deep":
        f.files["config.json"] = r.choice(
            [
                '{"a":' * 100000,
                "[" * 100000 + "]" * 100000,
                '{"model_type": "llama", "quantization_config": ' + '{"a": ' * 100000 + "1" + "}" * 100001,
                json.dumps({**config, "quantization_config": {"config_groups": {"g": {"targets": [[[["Linear"]]]]}}}}),
            ]
        )
    elif op == "file":
        line = r.choice(
            [
                "fifo('config.json')",
                "link('config.json', '/dev/zero')",
                "mkdir('config.json')",
                "link('config.json', 'nowhere.json')",
                "link('config.json', 'config.json')",
                "link('config.json', '../notes.txt')",
            ]
        )
        f.special(line, "config.json", first=line.startswith("mkdir"))
        return f"config-file:{line.split('(')[0]}", False
    else:
        if not isinstance(qc, dict) or r.random() < 0.15:  # a float folder that claims to be quantized
            qc = json.loads(json.dumps(quantized_sibling))
            config["quantization_config"] = qc
        groups = _groups(qc) or [qc.setdefault("config_groups", {}).setdefault("group_0", {"targets": ["Linear"]})]
        group = r.choice(groups)
        if op == "field":
            where = group.setdefault("weights", {}) if isinstance(group.get("weights"), dict) else group
            if r.random() < 0.15:
                where = group.setdefault("input_activations", {}) or {}
                group["input_activations"] = where
            name = r.choice(list(QC_FIELDS))
            if r.random() < 0.1:
                where.pop(name, None)
            else:
                where[name] = r.choice(QC_FIELDS[name])
            op = f"field:{name}"
        elif op == "patterns":
            key = r.choice(["targets", "ignore"])
            value: Any = [r.choice(PATTERNS) for _ in range(r.choice([1, 1, 2, 3]))]
            if r.random() < 0.1:
                value = r.choice(["Linear", None, 5, [5], {"re:.*": 1}, [["Linear"]]])
            (group if key == "targets" else qc)[key] = value
            op = f"{key}:{value!r}"[:50]
        elif op == "format":
            (qc if r.random() < 0.7 else group)["format"] = r.choice(FORMATS)
        else:
            edit = r.choice(["groups", "method", "status", "qc", "drop-qc", "many-groups", "kv"])
            if edit == "groups":
                qc["config_groups"] = r.choice([[], "x", {}, None, {"g": None}, {"g": {}}, {"g": {"weights": None}}])
            elif edit == "method":
                qc["quant_method"] = r.choice(["gptq", "awq", "", None, "COMPRESSED-TENSORS", "compressed_tensors"])
            elif edit == "status":
                qc["quantization_status"] = r.choice(["frozen", "initialized", "calibration", "", None])
            elif edit == "qc":
                config["quantization_config"] = r.choice(["x", [], None, 5, {}])
            elif edit == "drop-qc":  # the codes are left as plain tensors
                config.pop("quantization_config", None)
            elif edit == "many-groups":  # 2,000 groups, each naming one layer by a pattern
                qc["config_groups"] = {
                    f"g{i}": {**group, "targets": [f"re:^model\\.layers\\.{i}\\..*$"]} for i in range(2000)
                }
            else:
                qc["kv_cache_scheme"] = r.choice([{"num_bits": 2**70, "type": "float"}, "x", {"strategy": "\ud800"}])
            op = f"top:{edit}"
    if op not in ("text", "deep"):
        f.files["config.json"] = dump_header(config).decode()
    return f"config-{op}", False


def _entry_edit(r: random.Random, f: _Folder) -> tuple[str, bool]:
    """An edit of a shard: a compressed-tensors entry dropped, re-typed, re-shaped or lying, or bytes damaged."""
    shards = f.shards()
    if not shards:
        return "entries-none", False
    shard = r.choice(shards)
    blob = _bytes(f.files[shard])
    if r.random() < 0.2:
        kind, f.files[shard] = mutate_file(r, blob)
        return f"shard-{kind}", False
    entries, meta = entries_of(blob)
    suffixes = ("weight_scale", "weight_global_scale", "weight_packed", "weight_shape", "weight_zero_point")
    ct = [i for i, e in enumerate(entries) if e[0].endswith(suffixes)] or list(range(len(entries)))
    if not ct:
        return "entries-none", False
    i = r.choice(ct)
    name, dtype, shape, raw = entries[i]
    op = r.choice(["drop", "drop", "retype", "reshape", "rename", "shape-lie", "move"])
    if op == "drop":
        del entries[i]
    elif op == "retype":
        new = r.choice(["F32", "U8", "I64", "F16", "BF16", "F8_E4M3", "I32", "BOOL"])
        raw = raw[: len(raw) // ITEM[new] * ITEM[new]]
        entries[i] = (name, new, [len(raw) // ITEM[new]] if r.random() < 0.5 else shape, raw)
    elif op == "reshape":
        n = math.prod(shape)
        entries[i] = (name, dtype, r.choice([[n], [1, n], shape[::-1], [*shape, 1], [1] * 40 + [n]]), raw)
    elif op == "rename":
        new_name = r.choice([name + "s", name.replace("weight_", "weight."), name.replace("layers.0", "layers.9")])
        entries[i] = (new_name, dtype, shape, raw)
    elif op == "shape-lie" or len(shards) < 2:  # weight_shape: the rows and columns the codes stand for
        dims = r.choice(
            [[2**40, 64], [0, 64], [-1, 64], [64, 2**62], [32], [32, 64, 1], [2**31, 2**31], [2**63 - 1, 1]]
        )
        wide = r.random() < 0.8
        packed = struct.pack(
            f"<{len(dims)}{'q' if wide else 'i'}", *(d if wide else (d + 2**31) % 2**32 - 2**31 for d in dims)
        )
        owner = name.rsplit(".", 1)[0] + ".weight_shape"
        entries = [e for e in entries if e[0] != owner] + [(owner, "I64" if wide else "I32", [len(dims)], packed)]
        op = "shape-lie"
    else:  # move the entry to another shard, the index following it: a module cut across shards
        index = f.indexed()
        other = r.choice([s for s in shards if s != shard])
        del entries[i]
        o_entries, o_meta = entries_of(_bytes(f.files[other]))
        f.files[other] = layout([*o_entries, (name, dtype, shape, raw)], o_meta)
        index["weight_map"][name] = other
        f.files[shard] = layout(entries, meta)
        f.files[INDEX] = json.dumps(index)
        return "entries-move", True
    f.files[shard] = layout(entries, meta)
    return f"entries-{op}:{name.rsplit('.', 1)[-1]}", False


def _extra_edit(r: random.Random, f: _Folder) -> tuple[str, bool]:
    """Files beside the weights that are not regular, loop, or point away: every reader must leave them alone."""
    op = r.choice(["zero", "fifo", "loop", "loop2", "loop-up", "dangling", "outside", "deep", "hidden", "bin-fifo"])
    if op == "zero":
        f.special("link('tokenizer.json', '/dev/zero')", "tokenizer.json")
    elif op == "fifo":
        name = r.choice(
            ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"]
        )
        f.special(f"fifo({name!r})", name)
    elif op == "loop":
        f.special("link('loop', '.')", "loop")
    elif op == "loop2":
        if f.special("link('a', 'b')", "a"):
            f.special("link('b', 'a')", "b")
    elif op == "loop-up":  # a link back up, and one to the case's own folder (OUT is being written in it)
        if f.special("mkdir('d/e')", "d", first=True):
            f.last += ["link('d/e/up', '../..')", "link('d/root', '@ROOT@')"]
        return "extra-loop-up", False  # a folder may be refused for this
    elif op == "dangling":
        f.special("link('README.md', 'nowhere.md')", "README.md")
    elif op == "outside":  # a regular file elsewhere: copied by its content, as the library says
        f.special("link('notes.txt', '../notes.txt')", "notes.txt")
    elif op == "deep":
        f.special("mkdir('/'.join(['deep'] * 400))", "deep", first=True)
    elif op == "hidden":
        if f.special("mkdir('.cache/huggingface')", ".cache", first=True):
            f.files[".cache/huggingface/x.lock"] = b""
    else:
        name = r.choice(["pytorch_model.bin", "consolidated.safetensors", "model.pth"])
        f.special(f"fifo({name!r})", name)
    return f"extra-{op}", True


def _folder_case(r: random.Random, seed: int) -> Case:
    bases = folder_bases()
    i = r.randrange(len(bases))
    label, files = bases[i]
    f = _Folder(dict(files))
    quantized_sibling = json.loads(dict(bases[2][1])["config.json"])["quantization_config"]
    kinds, benign = [], True
    if r.random() < 0.04:
        kinds.append("base")
    else:
        for _ in range(r.choice([1, 1, 1, 2])):
            family = r.choice(["index", "index", "config", "config", "entries", "extra", "extra"])
            try:
                if family == "index":
                    kind, ok = _index_edit(r, f)
                elif family == "config":
                    kind, ok = _config_edit(r, f, quantized_sibling)
                elif family == "entries":
                    kind, ok = _entry_edit(r, f)
                else:
                    kind, ok = _extra_edit(r, f)
            except (ValueError, KeyError, TypeError, IndexError, RecursionError, AttributeError):
                continue  # an earlier edit made the folder unparseable for this one
            kinds.append(kind)
            benign = benign and ok
    return Case(
        "folder", seed, f"{label}/{'+'.join(kinds) or 'none'}", source=f.source(), cli=seed % 4 == 0,
        expect=i if benign else None, name=label,
    )  # fmt: skip


def _snapshot(root: Path, skip: Iterable[Path]) -> dict[str, tuple[Any, ...]]:
    """Every path under ``root`` (links not followed, ``skip`` left out): kind, and content or target."""
    import hashlib

    skipped = {str(p) for p in skip}
    out: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skipped]
        for name in dirs + files:
            path = os.path.join(folder, name)
            if path in skipped:
                continue
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as fh:
                    digest = hashlib.sha1(fh.read()).hexdigest()
                entry: tuple[Any, ...] = ("file", info.st_size, info.st_mtime_ns, digest)
            elif stat.S_ISLNK(info.st_mode):
                entry = ("link", os.readlink(path))
            else:
                entry = (stat.S_IFMT(info.st_mode),)
            out[os.path.relpath(path, root)] = entry
    return out


def _changes(before: dict[str, tuple[Any, ...]], after: dict[str, tuple[Any, ...]]) -> list[str]:
    out = [f"created {k!r}" for k in sorted(after.keys() - before.keys())]
    out += [f"removed {k!r}" for k in sorted(before.keys() - after.keys())]
    return out + [f"changed {k!r}" for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]


@contextlib.contextmanager
def _fifo_openers(root: Path, after: float) -> Iterator[None]:
    """Past ``after`` seconds, open each FIFO under ``root`` for writing, again and again, until the block ends.

    A reader blocked opening a FIFO inside C code that holds the GIL (safetensors' Rust ``safe_open``
    does) runs no Python: not SIGALRM's handler, not a thread. A forked child opening the FIFO lets the
    open return and the read see end-of-file, so the case ends as ``slow`` instead of holding the
    worker until the parent kills it. The child ends by itself once the parent is gone or past ``HARD_S``.
    """
    fifos = []
    for folder, _, files in os.walk(root):
        fifos += [os.path.join(folder, n) for n in files if stat.S_ISFIFO(os.lstat(os.path.join(folder, n)).st_mode)]
    if not fifos:
        yield
        return
    parent = os.getpid()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork in a threaded process (3.12+): the child only pokes
        pid = os.fork()
    if pid == 0:  # the child: system calls only, then out without running the parent's cleanup
        try:
            time.sleep(after)
            end = time.monotonic() + HARD_S
            while os.getppid() == parent and time.monotonic() < end:
                for path in fifos:
                    with contextlib.suppress(OSError):  # no reader waiting: ENXIO
                        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                time.sleep(0.05)
        finally:
            os._exit(0)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@contextlib.contextmanager
def guarded(root: Path, skip: Iterable[Path] = ()) -> Iterator[None]:
    """Raise :class:`Escaped` when the block created, changed or removed anything under ``root`` but ``skip``."""
    skip = list(skip)
    before = _snapshot(root, skip)
    try:
        yield
    finally:
        changed = _changes(before, _snapshot(root, skip))
        if changed:
            raise Escaped(f"outside OUT (IN included): {'; '.join(changed[:4])}")


def watch_escape(step: Callable[[Path], object]) -> None:
    """``step(root)`` in a fresh folder holding the sentinels, under :func:`guarded` (the harness's self-test)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in SENTINELS:
            (root / name).write_bytes(_sentinel(name))
        with guarded(root):
            step(root)


def _clear(path: Path) -> None:
    import shutil

    if os.path.lexists(path):
        shutil.rmtree(path)


def folder_paths(workdir: Path) -> tuple[Path, Path, list[Path]]:
    """The case's own folder, the model folder in it, and the two OUT folders (two levels below a sentinel)."""
    root = workdir / "folder-case"
    return root, root / "model", [root / "o" / "p" / "dequantized", root / "o" / "p" / "quantized"]


def build_folder(case: Case, workdir: Path, ns: dict[str, Any]) -> None:
    """A fresh case folder: the sentinels beside the model folder and above OUT, then the case's files."""
    root, inside, _ = folder_paths(workdir)
    _clear(root)
    inside.mkdir(parents=True)
    (root / "o" / "p").mkdir(parents=True)
    for where in (root, root / "o"):
        for name in SENTINELS:
            (where / name).write_bytes(_sentinel(name))
    scope = dict(ns)
    scope.update(os=os, ROOT=root, IN=inside)
    exec(FOLDER_PRELUDE, scope)
    exec(case.source, scope)


def _no_secret(text: str, what: str) -> None:
    if SECRET in text:
        raise Escaped(f"{what} shows the tensor {SECRET!r} of a file beside the folder: it read outside the folder")


def _same_as(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    import numpy as np

    if list(got) != list(want) and sorted(got) != sorted(want):
        raise Inconsistent(f"{what} gives tensors {sorted(got)[:6]}, the folder holds {sorted(want)[:6]}")
    for k, v in want.items():
        if got[k].shape != v.shape or not np.array_equal(got[k], v, equal_nan=True):
            raise Inconsistent(f"{what} gives other values for {k!r} than the base folder")


def read_folder(folder: Path, expect: int | None) -> None:
    """``aq.load`` of the folder, every tensor checked; after a benign edit, the base's own values."""
    import numpy as np

    import arrayquant as aq

    Stage.now = "load folder"
    out = aq.load(folder, backend="numpy")
    _no_secret(" ".join(map(str, out)), "aq.load")
    lib = _library_errors()
    for name, item in out.items():
        if isinstance(item, aq.QuantizedTensor):
            _checked(lambda item=item: check_tensor(item), lib)  # type: ignore[misc]
        elif not isinstance(item, np.ndarray):
            raise Inconsistent(f"load returned {type(item).__name__} for {name!r}")
    if expect is not None:
        Stage.now = "compare with the base folder"
        _same_as(_dequantized(out), folder_expected(expect), "aq.load after a benign edit")


def run_folder(case: Case, workdir: Path, ns: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """Load the folder (and with ``case.cli`` inspect, dequantize and quantize it); nothing outside OUT may change."""
    import arrayquant as aq

    lib = _library_errors()
    extra: dict[str, int] = {}
    root, inside, (deq, quant) = folder_paths(workdir)
    Stage.now = "build folder"
    build_folder(case, workdir, ns)
    with guarded(root, (deq, quant)), _fifo_openers(root, SLOW_S + 0.5):
        outcome = _outcome_of(lambda: read_folder(inside, case.expect), lib)
        if not case.cli:
            return outcome, extra
        shown: list[tuple[str, str]] = []
        codes = [
            run_cli(["inspect", str(inside)], shown),
            run_cli(["dequantize", str(inside), str(deq)], shown),
            run_cli(["quantize", str(inside), str(quant), "--scheme", "nvfp4", "--quiet"], shown),
        ]
        _no_secret(shown[0][0], "arrayquant inspect")
        said = [err.strip().splitlines()[-1][:200] if err.strip() else "" for _, err in shown]
        for cmd, rc in zip(("inspect", "dequantize", "quantize"), codes, strict=True):
            extra[f"cli {cmd} exit {rc}"] = 1
        if outcome == "loaded-correct" and codes[:2] != [0, 0]:
            why = said[0] if codes[0] else said[1]
            raise Inconsistent(f"aq.load accepts the folder but inspect/dequantize exit {codes[:2]}: {why}")
        if case.expect is not None:  # a benign edit: the commands do what they do with the base
            float_base = folder_bases()[case.expect][0].startswith("float")
            if codes[2] != (0 if float_base else 1):
                what = "float" if float_base else "quantized"
                msg = f"arrayquant quantize of a {what} folder after a benign edit exits {codes[2]}: {said[2]}"
                raise Inconsistent(msg)
            Stage.now = "load the dequantized folder"
            got = _dequantized(aq.load(deq, backend="numpy"))
            _same_as(got, folder_expected(case.expect), "the folder arrayquant dequantize wrote")
    return outcome, extra


# ---------------------------------------------------------------------------------------------
# GGUF metadata (target "gguf-meta")
# ---------------------------------------------------------------------------------------------

# GGUF value types (gguf.GGUFValueType) and the bytes of one scalar of each
G_U8, G_I8, G_U16, G_I16, G_U32, G_I32, G_F32, G_BOOL, G_STR, G_ARR, G_U64, G_I64, G_F64 = range(13)
G_SIZE = {G_U8: 1, G_I8: 1, G_U16: 2, G_I16: 2, G_U32: 4, G_I32: 4, G_F32: 4, G_BOOL: 1, G_U64: 8, G_I64: 8, G_F64: 8}
GGUF_LIMIT = 4 * 2**20  # no hostile file above this: the bombs are in what the header says, not in its size
LIES = [2**31, 2**32 - 1, 2**32 + 1, 2**40, 2**62, 2**63, 2**64 - 1, (1 << 22) + 1]


def _gstr(text: str | bytes) -> bytes:
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return _gstr(key) + struct.pack("<I", vtype) + payload


def _garr(itype: int, n: int, items: bytes) -> bytes:
    return struct.pack("<IQ", itype, n) + items


@dataclass
class _Gguf:
    """A GGUF file taken apart: encoded key/values (key, bytes, how many they are) and tensors with their data."""

    version: int
    kvs: list[tuple[str, bytes, int]]
    tensors: list[tuple[str, list[int], int, bytes]]  # name, dims (GGUF order), type id, data


def _skip_gguf_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in G_SIZE:
        return pos + G_SIZE[vtype]
    if vtype == G_STR:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    itype, n = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    for _ in range(n):
        pos = _skip_gguf_value(buf, pos, itype)
    return pos


def gguf_parse(blob: bytes) -> _Gguf:
    """A GGUF file arrayquant wrote (trusted: nothing is checked)."""
    import gguf

    version, n_tensors, n_kv = struct.unpack_from("<IQQ", blob, 4)
    pos, kvs = 24, []
    for _ in range(n_kv):
        start = pos
        n = struct.unpack_from("<Q", blob, pos)[0]
        key = blob[pos + 8 : pos + 8 + n].decode()
        vtype = struct.unpack_from("<I", blob, pos + 8 + n)[0]
        pos = _skip_gguf_value(blob, pos + 12 + n, vtype)
        kvs.append((key, blob[start:pos], 1))
    align = 32
    for key, raw, _ in kvs:
        if key == "general.alignment":
            align = struct.unpack_from("<I", raw, len(raw) - 4)[0]
    infos = []
    for _ in range(n_tensors):
        n = struct.unpack_from("<Q", blob, pos)[0]
        name = blob[pos + 8 : pos + 8 + n].decode()
        pos += 8 + n
        rank = struct.unpack_from("<I", blob, pos)[0]
        dims = list(struct.unpack_from(f"<{rank}Q", blob, pos + 4))
        ttype, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * rank)
        pos += 4 + 8 * rank + 12
        infos.append((name, dims, ttype, offset))
    data_start = -(-pos // align) * align
    tensors = []
    for name, dims, ttype, offset in infos:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
        start = data_start + offset
        tensors.append((name, dims, ttype, blob[start : start + math.prod(dims) // block * size]))
    return _Gguf(version, [kv for kv in kvs if kv[0] != "general.alignment"], tensors)


def gguf_build(g: _Gguf, alignment: int = 32, n_kv: int | None = None, n_tensors: int | None = None) -> bytes:
    """The file: header (counts as given, else true), key/values, tensor infos, data laid out at ``alignment``."""
    kvs = b"".join(raw for _, raw, _ in g.kvs)
    count = sum(n for *_, n in g.kvs)
    head = b"GGUF" + struct.pack("<IQQ", g.version, len(g.tensors) if n_tensors is None else n_tensors,
                                 count if n_kv is None else n_kv)  # fmt: skip
    infos, data, at = b"", b"", 0
    for name, dims, ttype, raw in g.tensors:
        at = -(-at // alignment) * alignment
        infos += _gstr(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ttype, at)
        data += bytes(at - len(data)) + raw
        at += len(raw)
    pre = head + kvs + infos
    return pre + bytes(-len(pre) % alignment) + data


@cache
def _gguf_block(kind: str, n: int) -> tuple[bytes, int]:
    """Large, valid key/value blocks (cached: a case builds megabytes of them): bytes, how many key/values."""
    import numpy as np

    if kind == "many-kv":  # n tiny key/values
        return b"".join(_kv(f"x.{j:x}", G_U8, bytes([j & 255])) for j in range(n)), n
    if kind == "u8":
        return _kv("x.bytes", G_ARR, _garr(G_U8, n, (bytes(range(256)) * (n // 256 + 1))[:n])), 1
    if kind == "i32":
        return _kv("x.ints", G_ARR, _garr(G_I32, n, np.arange(-n // 2, n - n // 2, dtype="<i4").tobytes())), 1
    if kind == "empty":  # n empty strings
        return _kv("x.empty", G_ARR, _garr(G_STR, n, bytes(8 * n))), 1
    tokens = b"".join(_gstr(_token(j)) for j in range(n))  # a tokenizer as llama.cpp's converters write it
    scores = np.linspace(0, -n, n, dtype="<f4").tobytes()
    types = (np.arange(n) % 6 + 1).astype("<i4").tobytes()
    return (
        _kv("tokenizer.ggml.model", G_STR, _gstr("gpt2"))
        + _kv("tokenizer.ggml.tokens", G_ARR, _garr(G_STR, n, tokens))
        + _kv("tokenizer.ggml.scores", G_ARR, _garr(G_F32, n, scores))
        + _kv("tokenizer.ggml.token_type", G_ARR, _garr(G_I32, n, types)),
        4,
    )


def _token(j: int) -> str:
    return ["\u0120", "", "\u00e9", "<0x0A>", "\u6f22"][j % 5] + format(j, "x")


def _gguf_expect(kind: str, n: int) -> dict[str, tuple[int, dict[int, Any]]]:
    """For a block of :func:`_gguf_block`: key -> (items, {index: value}) that ``read_metadata`` must give."""
    if kind == "many-kv":
        return {f"x.{j:x}": (-1, {0: j & 255}) for j in (0, n // 2, n - 1)}
    if kind == "u8":
        return {"x.bytes": (n, {0: 0, n - 1: (n - 1) % 256, 300: 44})}
    if kind == "i32":
        return {"x.ints": (n, {0: -n // 2, n - 1: n - 1 - n // 2})}
    if kind == "empty":
        return {"x.empty": (n, {0: "", n - 1: ""})}
    return {"tokenizer.ggml.tokens": (n, {j: _token(j) for j in (0, 1, 2, 3, 4, n // 2, n - 1)}),
            "tokenizer.ggml.token_type": (n, {n - 1: (n - 1) % 6 + 1})}  # fmt: skip


def _gguf_lie(r: random.Random, g: _Gguf) -> tuple[str, dict[str, Any]]:
    """A header that lies: counts and lengths far past the file's end, nested or unknown types, bad text."""
    lie = r.choice(LIES)
    op = r.choice(
        ["array-count", "string-length", "key-length", "item-length", "kv-count", "tensor-count", "nested",
         "deep-nested", "type", "item-type", "utf8", "dup-key", "version", "truncated-kv"]
    )  # fmt: skip
    counts: dict[str, Any] = {}
    if op == "array-count":
        itype = r.choice([G_U8, G_I32, G_F64, G_STR, G_BOOL])
        g.kvs.append(("x.lie", _kv("x.lie", G_ARR, _garr(itype, lie, bytes(r.choice([0, 8, 64])))), 1))
    elif op == "string-length":
        g.kvs.append(("x.s", _kv("x.s", G_STR, struct.pack("<Q", lie % 2**64) + b"abc"), 1))
    elif op == "key-length":
        g.kvs.append(("?", struct.pack("<Q", lie % 2**64) + b"key" + struct.pack("<IB", G_U8, 1), 1))
    elif op == "item-length":
        items = _gstr("a") + struct.pack("<Q", lie % 2**64) + b"bc" + _gstr("d")
        g.kvs.append(("x.items", _kv("x.items", G_ARR, _garr(G_STR, 3, items)), 1))
    elif op == "kv-count":
        counts["n_kv"] = r.choice([lie % 2**64, sum(n for *_, n in g.kvs) + 1, sum(n for *_, n in g.kvs) + 1000])
    elif op == "tensor-count":
        counts["n_tensors"] = r.choice([lie % 2**64, len(g.tensors) + 1, 0])
    elif op == "nested":  # an array of arrays, which llama.cpp refuses
        inner = _garr(G_U8, 3, b"abc")
        g.kvs.append(("x.nested", _kv("x.nested", G_ARR, _garr(G_ARR, 2, inner + inner)), 1))
    elif op == "deep-nested":  # arrays of one array, 100,000 deep (1.2 MB)
        depth = r.choice([100, 1000, 100_000])
        g.kvs.append(("x.deep", _kv("x.deep", G_ARR, struct.pack("<IQ", G_ARR, 1) * depth + _garr(G_U8, 0, b"")), 1))
    elif op == "type":
        vtype = r.choice([13, 255, 2**31, 2**32 - 1])
        g.kvs.append(("x.t", _kv("x.t", vtype, bytes(8)), 1))
    elif op == "item-type":
        g.kvs.append(("x.it", _kv("x.it", G_ARR, _garr(r.choice([13, 99, 2**32 - 1]), 2, bytes(16))), 1))
    elif op == "utf8":
        key, value = r.choice([(b"\xff\xfe", b"x"), (b"x.sur", b"\xed\xa0\x80"), (b"", b"x"), (b"x.nul\x00", b"\x00")])
        g.kvs.append(("?", _kv(key, G_STR, _gstr(value)), 1))
    elif op == "dup-key":
        g.kvs.append(r.choice(g.kvs))
    elif op == "version":
        g.version = r.choice([0, 1, 4, 2**32 - 1, 0x03000000])
    else:  # a last key/value cut short
        g.kvs.append(("x.cut", _kv("x.cut", G_ARR, _garr(G_U32, 1000, bytes(10))), 1))
        g.tensors = []
        counts["n_tensors"] = 0
    return op, counts


def _gguf_meta_case(r: random.Random, seed: int) -> Case:
    bases = format_bases("gguf")
    i = r.randrange(len(bases))
    g = gguf_parse(bases[i])
    p = r.random()
    expect: dict[str, Any] | None = {"base": i, "meta": {}}
    align, counts = 32, {}
    if p < 0.3:  # a valid bomb: it must read, fast and right, or be refused as too large
        kind = r.choice(["many-kv", "u8", "i32", "empty", "tokens", "tokens"])
        n = {
            "many-kv": r.choice([50_000, 100_000, 150_000, 200_000]),
            "u8": r.choice([1, 2, 3, 4]) * 2**20 - 2**16,
            "i32": (r.choice([1, 2, 3, 4]) * 2**20 - 2**16) // 4,
            "empty": r.choice([100_000, 250_000, 500_000]),
            "tokens": r.choice([32_000, 150_000]),
        }[kind]
        block, count = _gguf_block(kind, n)
        if kind == "tokens":
            g.kvs = [kv for kv in g.kvs if not kv[0].startswith("tokenizer.")]
        g.kvs.append((kind, block, count))
        expect["meta"] = _gguf_expect(kind, n)  # type: ignore[index]
        kind = f"bomb-{kind}:{n}"
    elif p < 0.45:  # general.alignment: a valid power of two (the data laid out by it), or not
        value = r.choice(
            [1, 8, 16, 64, 256, 4096, 0, 3, 48, 2**31, 2**32 - 1, "u64", "str", "i32", "f32", "arr", "twice"]
        )
        if isinstance(value, int):
            g.kvs.insert(0, ("general.alignment", _kv("general.alignment", G_U32, struct.pack("<I", value)), 1))
            align = value if value and not value & (value - 1) and value <= 4096 else 32
            if align == value:
                expect["meta"] = {"general.alignment": (-1, {0: value})}  # type: ignore[index]
            else:
                expect = None
        else:
            payload = {
                "u64": (G_U64, struct.pack("<Q", 2**64 - 1)),
                "str": (G_STR, _gstr("32")),
                "i32": (G_I32, struct.pack("<i", -32)),
                "f32": (G_F32, struct.pack("<f", 32.0)),
                "arr": (G_ARR, _garr(G_U32, 1, struct.pack("<I", 32))),
                "twice": (G_U32, struct.pack("<I", 32)),
            }[value]
            g.kvs.insert(0, ("general.alignment", _kv("general.alignment", *payload), 1))
            if value == "twice":
                g.kvs.append(("general.alignment", _kv("general.alignment", G_U32, struct.pack("<I", 64)), 1))
            expect = None
        kind = f"alignment:{value}"
    elif p < 0.95:
        op, counts = _gguf_lie(r, g)
        expect = None
        kind = f"lie-{op}"
    else:
        kind, expect = "base", {"base": i, "meta": {}}
    blob = gguf_build(g, align, counts.get("n_kv"), counts.get("n_tensors"))
    if r.random() < 0.1 and len(blob) < 2**20:
        extra, blob = binary_mutation(r, blob)
        kind, expect = f"{kind}+{extra}", None
    if len(blob) > GGUF_LIMIT:
        msg = f"gguf-meta case {kind} is {len(blob)} bytes, over {GGUF_LIMIT}"
        raise ValueError(msg)
    return Case("gguf-meta", seed, kind, blob, cli=seed % 4 == 0, expect=expect)


@cache
def gguf_expected(i: int) -> dict[str, Any]:
    """What ``aq.load`` gives for GGUF base ``i``, dequantized."""
    import arrayquant as aq

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "base.gguf"
        path.write_bytes(format_bases("gguf")[i])
        return _dequantized(aq.load(path, backend="numpy"))


def read_gguf_meta(path: Path, expect: dict[str, Any] | None) -> None:
    """``aq.load`` and ``read_metadata``; a valid file must read to its tensors and metadata."""
    from arrayquant.io.gguf import read_metadata

    out = read_load(path)
    lib = _library_errors()
    Stage.now = "read_metadata"
    try:
        meta = read_metadata(path)
    except lib as exc:
        raise Inconsistent(f"aq.load accepts the file but read_metadata raised {_short(exc)}") from exc
    if expect is None:
        return
    Stage.now = "compare with the base file"
    _same_as(_dequantized(out), gguf_expected(expect["base"]), "aq.load of a valid file")
    for key, (n, samples) in expect["meta"].items():
        if key not in meta:
            raise Inconsistent(f"read_metadata lost the key {key!r}")
        value = meta[key].value
        if n >= 0 and len(value) != n:
            raise Inconsistent(f"read_metadata gives {len(value)} items for {key!r}, the file holds {n}")
        for at, want in samples.items():
            got = value[at] if n >= 0 else value
            if got != want:
                raise Inconsistent(f"read_metadata gives {got!r} for {key!r}[{at}], the file holds {want!r}")


# ---------------------------------------------------------------------------------------------
# operations on quantized tensors (target "ops")
# ---------------------------------------------------------------------------------------------

OPS_SCHEMES = [
    "q8s",
    "q8s:native",
    "q4s:block32:f16",
    "nvfp4",
    "mxfp8",
    "mxfp4",
    "e4m3:block8:ue8m0:native",
    "q4f:block16:bf16:packed_u32",
    "q2s:packed_u32:1",
    "q8s:block2x4:bf16",
    "e2m1:block4:f16:packed_u32",
    "e5m2:tensor:bf16:native",
    "q4f:block16:f16:lookup:packed_u32",
]
OPS_SHAPES = [(4, 32), (2, 3, 32), (64,), (1, 32), (8, 32), (2, 1, 32), (3, 64), (1, 1, 1, 32)]
# (Burn's tile is repeat_dim, its expand broadcast_to)
LAYOUT_OPS = ("reshape", "permute_dims", "swapaxes", "matrix_transpose", "getitem", "narrow", "split", "chunk", "flip",
              "take", "take_along_axis", "repeat", "repeat_dim", "broadcast_to", "expand_dims", "squeeze", "concat",
              "stack")  # fmt: skip
OTHER_OPS = ("sum", "mean", "prod", "max", "min", "argmax", "cumulative_sum", "sort", "argsort", "topk")
# selected codes, exact on a per-tensor scheme (ops/elementwise.py)
PICKING_OPS = ("max", "min", "sort", "topk")
SMALL = ["1", "2", "3", "4", "7"]
ABSURD = ["0", "-1", "-2", "2**31", "2**40", "2**62", "2**63 - 1", "2**63", "2**64", "10**30", "-(2**63)"]
ODD = ["1.0", "2.5", "True", "False", "None", "'2'", "np.int64(2)", "np.uint64(2**63)", "np.float32(2)", "[2]",
       "(2,)", "float('nan')", "float('inf')", "np.int8(-1)", "2**100", "b'2'"]  # fmt: skip


def _size_src(r: random.Random) -> str:
    p = r.random()
    return r.choice(SMALL) if p < 0.45 else r.choice(ABSURD) if p < 0.8 else r.choice(ODD)


def _axis_src(r: random.Random, rank: int) -> str:
    if r.random() < 0.7:
        return str(r.randrange(-rank, rank))
    return r.choice([str(rank), str(-rank - 1), "2**63", "-(2**63)", "2**64", "None", "1.5", "True", "'0'",
                     "np.int64(0)", "[0]", "(0, 0)", "99", "np.uint8(0)"])  # fmt: skip


def _index_src(r: random.Random, n: int, rank: int = 1, shape: tuple[int, ...] = ()) -> str:
    """Indices for take (1-d) or take_along_axis (``shape``): in range, out of it, or of an odd dtype."""
    dims = shape or (r.choice([1, 2, 5]),)
    count = math.prod(dims)
    p = r.random()
    if p < 0.5:
        values = [r.randrange(-n, n) for _ in range(count)]
    elif p < 0.75:
        values = [r.choice([n, -n - 1, 2**31, 2**40, -(2**62), 2**63 - 1, 0]) for _ in range(count)]
    else:
        return r.choice(
            ["[]", "[[0]]", "np.zeros(0, np.int64)", "np.array([0.0, 1.0])", "np.array([True, False])",
             "np.array([0], np.uint64)", "np.array([2**63], np.uint64)", "np.array([1], np.int8)", "None",
             "'0'", "[0, 'a']", "[[0, 1], [2]]", "np.array([0], object)", "qt", "np.array([[0]], np.int64)",
             "np.zeros((1,) * 40, np.int64)", "np.arange(1000) % 2"]
        )  # fmt: skip
    dtype = r.choice(["np.int64", "np.int32", "np.int16", "np.uint32", "np.int8"])
    if "int8" in dtype or "int16" in dtype:
        values = [max(min(v, 127), -128) for v in values]
    if "uint" in dtype:
        values = [v % 2**32 for v in values]
    if "int32" in dtype:
        values = [max(min(v, 2**31 - 1), -(2**31)) for v in values]
    if r.random() < 0.25 and not shape:
        return repr(values)
    return f"np.array({values!r}, {dtype}).reshape({dims!r})"


def _key_src(r: random.Random, shape: tuple[int, ...]) -> str:
    """A basic index: slices with huge or zero steps and bounds, ints in and out of range, None, Ellipsis."""
    hostile = r.random() < 0.5
    items = []
    for n in shape[: r.choice([1, len(shape), len(shape), len(shape) + hostile])]:
        p = r.random()
        if p < 0.5 or (not hostile and items and all(i.lstrip("-").isdigit() for i in items)):
            a, b = r.choice([None, 0, 1, 16, -1, n, "-(2**62)"]), r.choice([None, n, 16, 32, -1, 2, "2**62", "2**100"])
            items.append(f"slice({a}, {b}, {r.choice([None, 1, 1, 2, -1, -2, 2**62, -(2**62)])})")
        elif p < 0.75:
            items.append(str(r.randrange(-n, n)) if not hostile else r.choice([str(n), str(-n - 1), "2**63", "True"]))
        elif p < 0.85 or not hostile:
            items.append(r.choice(["None", "np.int64(0)", "None"]))
        elif p < 0.93:
            big = r.choice(["2**63", "-(2**63)", "2**100", "0", "1.5", "'a'", "np.int64(2**62)", "np.uint64(2**63)"])
            items.append(f"slice({r.choice(['None', big])}, {r.choice(['None', big])}, {r.choice(['None', big, '0'])})")
        else:
            items.append(r.choice(["[0]", "(0, 1)", "np.array([0])", "np.array(0)", "1.0", "'0'", "{}", "slice"]))
    if r.random() < 0.15:
        items.insert(r.randrange(len(items) + 1), "...")
        if hostile and r.random() < 0.5:
            items.append("...")
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _shape_src(r: random.Random, shape: tuple[int, ...], grow: bool = False) -> str:
    n = math.prod(shape)
    p = r.random()
    if grow:  # broadcast_to: leading axes, -1 keeping an axis, or wrong extents
        if p < 0.5:
            lead = [_size_src(r) for _ in range(r.choice([0, 1, 1, 2]))]
            keep = [r.choice([str(s), "-1"]) for s in shape]
            return "(" + ", ".join(lead + keep) + ",)"
        return r.choice([f"{shape[:-1]!r}", "()", "(2**40,) * 3", f"(0, {n})", f"(1,) * 65 + {shape!r}",
                         f"(-1, {', '.join(map(str, shape))})", f"(2, {shape[-1] + 1})", "None", "'x'", f"{n}",
                         f"(2**62,) + {shape!r}", f"(2**63,) + {shape!r}", f"(1.0,) + {shape!r}"])  # fmt: skip
    if p < 0.45:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        d = r.choice(divisors)
        return r.choice([f"({n},)", f"({d}, {n // d})", f"({d}, -1)", f"(-1, {d})", f"(1, {d}, {n // d})", f"{n}"])
    return r.choice(["(2**40, 0)", "(-1, -1)", "(2**62, 2**62)", "(0,)", "()", f"[{n}]", f"({n}, 1.0)",
                     f"(True, {n})", "None", "'4x32'", f"(({n},),)", "(2**64,)", f"(-{n},)", f"(1,) * 69 + ({n},)",
                     f"(2**32, {n} // 2**32 or 1)", f"(np.int64({n}),)", "(-1, 0)", "(2**63, -1)"])  # fmt: skip


def _other_src(r: random.Random, shape: tuple[int, ...], scheme: str) -> str:
    """A second tensor for concat/stack: the same kind, or mismatched in shape, scheme, dtype or type."""
    op = r.choice(["same", "same", "same-scales", "scheme", "dtype", "shape", "rank", "array", "none", "table"])
    other_shape, other_scheme, dtype = shape, scheme, "np.float32"
    if op == "shape":
        other_shape = (*shape[:-1], shape[-1] * 2) if r.random() < 0.5 else (shape[0] + 1, *shape[1:])
    elif op == "rank":
        other_shape = (1, *shape)
    elif op == "scheme":
        other_scheme = r.choice(OPS_SCHEMES)
    elif op == "dtype":
        dtype = r.choice(["np.float16", "np.float64"])
    elif op == "array":
        return "np.ones(qt.shape, np.float32)"
    elif op == "none":
        return "None"
    elif op == "same-scales":
        return "qt"
    table = _table(other_scheme)
    if op == "table" and table:  # the same lookup scheme with another table
        table = ", table=np.linspace(-1, 1, 16, dtype=np.float32)"
    return f"aq.quantize((rng.standard_normal({other_shape!r}) * 4).astype({dtype}), {other_scheme!r}{table})"


def _table(scheme: str) -> str:
    return ", table=np.asarray(aq.NF4, np.float32)" if "lookup" in scheme else ""


def _op_args(r: random.Random, name: str, shape: tuple[int, ...], scheme: str) -> tuple[str, str, str]:
    """(first argument, positional arguments, keyword arguments) as source."""
    rank = len(shape)
    ax = lambda: _axis_src(r, rank)
    first = "qt"
    args: list[str] = []
    kwargs: dict[str, str] = {}
    if name == "reshape":
        args = [_shape_src(r, shape)]
    elif name == "permute_dims":
        perm = list(range(rank))
        r.shuffle(perm)
        wrong = [repr((0,) * rank), repr(tuple(range(rank + 1))), "None", "'ab'", f"({rank},) * {rank}"]
        args = [r.choice([repr(tuple(perm))] * 3 + [repr(tuple(p - rank for p in perm)), *wrong])]
    elif name == "swapaxes":
        args = [ax(), ax()]
    elif name == "getitem":
        args = [_key_src(r, shape)]
    elif name == "narrow":
        args = [ax(), r.choice(["0", "1", "-1", "16", str(shape[-1]), "2**63", "-(2**63)", "1.0"]), _size_src(r)]
    elif name == "split":
        args = [r.choice([_size_src(r), f"[{_size_src(r)}, {_size_src(r)}]", f"[{shape[0]}]", "[]", "[1] * 10**5"])]
        kwargs["axis"] = ax()
    elif name == "chunk":
        args = [_size_src(r)]
        kwargs["axis"] = ax()
    elif name == "flip":
        kwargs["axis"] = r.choice([ax(), ax(), "None", f"({ax()}, {ax()})", "()"])
    elif name == "take":
        axis = ax() if rank > 1 or r.random() < 0.5 else "None"
        n = shape[int(axis)] if axis.lstrip("-").isdigit() and -rank <= int(axis) < rank else shape[0]
        args = [_index_src(r, n)]
        kwargs["axis"] = axis
    elif name == "take_along_axis":
        axis = ax()
        a = int(axis) if axis.lstrip("-").isdigit() and -rank <= int(axis) < rank else -1
        dims = tuple(r.choice([1, s]) if i != a % rank else r.choice([1, 3, s]) for i, s in enumerate(shape))
        if r.random() < 0.15:
            dims = dims[1:] or (1, 1)
        args = [_index_src(r, shape[a], rank, dims)]
        kwargs["axis"] = axis
    elif name == "repeat":
        args = [_size_src(r)]
        kwargs["axis"] = r.choice([ax(), "None"])
    elif name == "repeat_dim":
        args = [ax(), _size_src(r)]
    elif name == "broadcast_to":
        args = [_shape_src(r, shape, grow=True)]
    elif name == "expand_dims":
        kwargs["axis"] = _axis_src(r, rank + 1)
    elif name == "squeeze":
        ones = [str(i) for i, s in enumerate(shape) if s == 1]
        args = [r.choice([*ones, *ones, ax(), f"({', '.join(ones)},)" if ones else "()", "None", "()"])]
    elif name in ("concat", "stack"):
        others = [_other_src(r, shape, scheme) for _ in range(r.choice([1, 1, 2]))]
        first = r.choice([f"[qt, {', '.join(others)}]"] * 6 + ["[]", "qt", "(qt,)", "[qt] * 1000", "None", "[None]"])
        kwargs["axis"] = _axis_src(r, rank + (name == "stack"))
    elif name in ("sum", "mean", "prod", "max", "min", "argmax"):
        kwargs["axis"] = r.choice([ax(), "None", f"({ax()}, {ax()})", "()"] if name != "argmax" else [ax(), "None"])
        kwargs["keepdims"] = r.choice(["False", "True", "1", "None"])
        if name in ("sum", "mean", "prod") and r.random() < 0.3:
            kwargs["propagation"] = r.choice(["'propagate'", "'inhibit'", "'x'", "None"])
    elif name in ("cumulative_sum", "sort", "argsort"):
        kwargs["axis"] = ax() if rank > 1 or r.random() < 0.7 else "None"
        if name != "cumulative_sum":
            kwargs["descending"] = r.choice(["False", "True"])
    elif name == "topk":
        args = [r.choice([_size_src(r), str(shape[-1]), str(shape[-1] + 1)])]
        kwargs["axis"] = ax()
        kwargs["largest"] = r.choice(["True", "False"])
    args_src = "(" + "".join(f"{a}, " for a in args) + ")"
    kwargs_src = "{" + ", ".join(f"{k!r}: {v}" for k, v in kwargs.items()) + "}"
    return first, args_src, kwargs_src


def _ops_case(r: random.Random, seed: int) -> Case:
    name = r.choice(LAYOUT_OPS * 3 + OTHER_OPS)
    scheme = r.choice(OPS_SCHEMES)
    shape = r.choice(OPS_SHAPES)
    if name in ("matrix_transpose", "swapaxes", "permute_dims") and len(shape) == 1 and r.random() < 0.8:
        shape = (4, 32)
    first, args, kwargs = _op_args(r, name, shape, scheme)
    source = f"""rng = np.random.default_rng({seed})
x = (rng.standard_normal({shape!r}) * 4).astype(np.float32)
qt = aq.quantize(x, {scheme!r}{_table(scheme)})
first = {first}
args = {args}
kwargs = {kwargs}
held = stored(first)
stage({"ops." + name!r})
out = aq.ops.{name}(first, *args, **kwargs)"""
    return Case("ops", seed, f"{name}/{scheme}/{len(shape)}d", source=source, name=name)


def stored(first: Any) -> list[Any]:
    """Copies of what the quantized inputs hold, to tell whether an operation wrote into them."""
    import arrayquant as aq

    items = first if isinstance(first, (list, tuple)) else [first]
    return [
        (q.values.copy(), q.scales.copy(), None if q.global_scale is None else q.global_scale.copy())
        for q in items
        if isinstance(q, aq.QuantizedTensor)
    ]


def _numpy_op(name: str, d: Any, p: dict[str, Any]) -> Any:
    """What the operation does to the dequantized input, with NumPy (the library's documented meaning)."""
    import numpy as np

    def index(v: Any) -> int:
        if isinstance(v, (bool, np.bool_)):
            raise TypeError("a bool is not an index")
        return operator.index(v)

    if name == "reshape":
        return np.reshape(d, p["shape"])
    if name == "permute_dims":
        return np.transpose(d, p["axes"])
    if name == "swapaxes":
        return np.swapaxes(d, p["axis1"], p["axis2"])
    if name == "matrix_transpose":
        return np.swapaxes(d, -1, -2)
    if name == "getitem":
        return d[p["key"]]
    if name in ("narrow", "split", "chunk"):
        ax = normalize_axis(p.get("axis", 0), d.ndim)
        n = d.shape[ax]
        if name == "narrow":
            start, length = index(p["start"]), index(p["length"])
            start = start + n if -n <= start < 0 else start
            if not (0 <= start < n and 1 <= length <= n - start):
                raise ValueError("narrow out of range")
            starts, sizes = [start], [length]
        else:
            arg = p["sizes"] if name == "split" else p["chunks"]
            if name == "chunk":
                c = index(arg)
                if c < 1:
                    raise ValueError("chunks < 1")
                arg = -(-n // c)
            if isinstance(arg, (int, np.integer)) and not isinstance(arg, (bool, np.bool_)):
                if arg < 1:
                    raise ValueError("split size < 1")
                sizes = [min(int(arg), n - i) for i in range(0, n, int(arg))]
            else:
                sizes = [index(s) for s in arg]
                if not sizes or min(sizes) < 1 or sum(sizes) != n:
                    raise ValueError("split sizes do not add up")
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
        pieces = [np.take(d, np.arange(s, s + k), axis=ax) for s, k in zip(starts, sizes, strict=True)]
        return pieces[0] if name == "narrow" else pieces
    if name == "flip":
        return np.flip(d, p.get("axis"))
    if name == "take":
        idx = np.asarray(p["indices"])
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices of dtype {idx.dtype}")
        return np.take(d, idx, axis=0 if p.get("axis") is None else index(p["axis"]))
    if name == "take_along_axis":
        idx = np.asarray(p["indices"])
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices of dtype {idx.dtype}")
        return np.take_along_axis(d, idx, axis=index(p.get("axis", -1)))
    if name == "repeat":
        axis = p.get("axis")
        return np.repeat(d, index(p["repeats"]), axis=None if axis is None else index(axis))
    if name == "repeat_dim":
        times = index(p["times"])
        if times < 1:
            raise ValueError("times < 1")
        return np.concatenate([d] * times, axis=index(p["axis"]))
    if name == "broadcast_to":
        shape = p["shape"]
        dims = [index(v) for v in ((shape,) if isinstance(shape, int) else shape)]
        lead = len(dims) - d.ndim
        dims = [d.shape[i - lead] if v == -1 and i >= lead else v for i, v in enumerate(dims)]
        return np.broadcast_to(d, dims)
    if name == "expand_dims":
        return np.expand_dims(d, index(p.get("axis", 0)))
    if name == "squeeze":
        axis = p["axis"]
        return np.squeeze(d, tuple(index(a) for a in axis) if isinstance(axis, (tuple, list)) else index(axis))
    if name in ("concat", "stack"):
        fn = np.concatenate if name == "concat" else np.stack
        return fn(d, axis=index(p.get("axis", 0)))
    axis = p.get("axis")
    if name in ("sum", "mean", "prod", "max", "min"):
        return getattr(np, name)(d, axis=axis, keepdims=bool(p.get("keepdims", False)))
    if name == "argmax":
        return np.argmax(d, axis=axis, keepdims=bool(p.get("keepdims", False)))
    if name == "cumulative_sum":
        return np.cumsum(d, axis=axis)
    if name in ("sort", "argsort"):
        out = np.sort(d, axis=index(axis))
        return np.flip(out, index(axis)) if p.get("descending") and name == "sort" else out
    k, ax = index(p["k"]), normalize_axis(p.get("axis", -1), d.ndim)
    if not 1 <= k <= d.shape[ax]:
        raise ValueError("k out of range")
    ordered = np.sort(d, axis=ax)
    ordered = np.flip(ordered, ax) if p.get("largest", True) else ordered
    return np.take(ordered, np.arange(k), axis=ax)


def normalize_axis(axis: Any, rank: int) -> int:
    if isinstance(axis, (bool,)) or not -rank <= operator.index(axis) < rank:
        raise ValueError(f"axis {axis!r} out of range")
    return operator.index(axis) % rank


def check_op(name: str, first: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, held: list[Any]) -> None:
    """An accepted operation: its inputs untouched, its results sound, of NumPy's shape, and equal where exact."""
    import inspect

    import numpy as np

    import arrayquant as aq

    Stage.now = "inputs unchanged"
    for before, after in zip(held, stored(first), strict=True):
        for a, b in zip(before, after, strict=True):
            if a is not None and not np.array_equal(a, b, equal_nan=True):
                raise Inconsistent(f"{name} changed the codes or scales of its input")
    results = out if isinstance(out, list) else [out]
    for res in results:
        if isinstance(res, aq.QuantizedTensor):
            check_tensor(res)
    many = isinstance(first, (list, tuple))
    d = [aq_dequantize(q) for q in first] if many else aq_dequantize(first)
    p = dict(inspect.signature(getattr(aq.ops, name)).bind(first, *args, **kwargs).arguments)
    Stage.now = "the same with NumPy"
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            ref = _numpy_op(name, d, p)
    except (ValueError, TypeError, IndexError, OverflowError) as exc:  # AxisError is a ValueError and an IndexError
        raise Inconsistent(f"{name} accepts arguments NumPy refuses ({type(exc).__name__}: {exc})") from None
    refs = ref if isinstance(ref, list) else [ref]
    if len(refs) != len(results):
        raise Inconsistent(f"{name} gives {len(results)} pieces, NumPy {len(refs)}")
    Stage.now = "is_exact"
    exact = False
    if name in LAYOUT_OPS:
        exact = aq.ops.is_exact(name, first, *args, **kwargs)
    elif name in PICKING_OPS:
        exact = not many and first.scheme.block_size is None
    Stage.now = "compare with NumPy"
    for res, want in zip(results, refs, strict=True):
        want = np.asarray(want)
        got = aq_dequantize(res) if isinstance(res, aq.QuantizedTensor) else np.asarray(res)
        if want.ndim == 0 and tuple(got.shape) == (1,):  # a quantized full reduction is 1-d, as Burn's
            want = want.reshape(1)
        if tuple(got.shape) != tuple(want.shape):
            raise Inconsistent(f"{name} gives shape {tuple(got.shape)}, NumPy {tuple(want.shape)}")
        if exact and not np.array_equal(got, want, equal_nan=True):
            raise Inconsistent(f"{name} takes the exact path but dequantizes unlike the same op on the floats")


def run_ops(case: Case, ns: dict[str, Any]) -> None:
    Stage.now = "build arguments"
    scope = dict(ns)
    exec(case.source, scope)
    lib = _library_errors()
    _checked(
        lambda: check_op(case.name, scope["first"], scope["args"], scope["kwargs"], scope["out"], scope["held"]), lib
    )


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
        "stored": stored,
        "watch_escape": watch_escape,
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


def read_load(path: Path) -> dict[str, Any]:
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
    return out


def read_cli(path: Path) -> None:
    """The CLI's reader over every tensor, as ``inspect`` and ``dequantize`` walk it."""
    import arrayquant as aq
    from arrayquant.io.arrayquant.layout import Checkpoint

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


def run_cli(argv: list[str], shown: list[tuple[str, str]] | None = None) -> int:
    """``arrayquant ARGV`` with stdout and stderr as a UTF-8 terminal's; exit status 0 or 1 only.

    ``shown`` gets what the command printed: (stdout, stderr).
    """
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
    if shown is not None:
        shown.append((out.buffer.getvalue().decode("utf-8", "replace"), text))
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
    if case.target == "folder":
        return run_folder(case, workdir, ns)
    if case.target == "ops":
        return _outcome_of(lambda: run_ops(case, ns), lib), extra
    if case.target in (*FILE_TARGETS, "gguf-meta"):
        path = workdir / ("case.gguf" if case.target == "gguf-meta" else f"case.{case.target}")
        path.write_bytes(case.blob)
        if case.target == "gguf-meta":
            outcome = _outcome_of(lambda: read_gguf_meta(path, case.expect), lib)
        else:
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
                # the issue's contract: finite input gives finite f32 values back (a float16
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
    except Escaped as exc:
        res.outcome, res.detail = f"{FAIL}escaped", str(exc)
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
            if target in ("folder", "gguf-meta"):  # their first seeds may be FIFOs or bombs: their bases instead
                continue
            for seed in range(4):
                classify(make_case(target, seed), Path(tmp), ns)
        for i, (_, files) in enumerate(folder_bases()):
            source = _Folder(dict(files)).source()
            classify(Case("folder", -1, "base", source=source, cli=True, expect=i), Path(tmp), ns)
            folder_expected(i)
        for i, blob in enumerate(format_bases("gguf")):
            classify(Case("gguf-meta", -1, "base", blob, cli=True, expect={"base": i, "meta": {}}), Path(tmp), ns)
    return ns


def _cap_file_size(limit: int = FILE_CAP) -> None:
    """Writes past ``limit`` bytes fail with EFBIG instead of filling the disk (a folder linking /dev/zero)."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the default would kill the worker
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (min(limit, hard) if hard != resource.RLIM_INFINITY else limit, hard))


def _worker(conn: Any, cap: int, slow_s: float, abort_s: int) -> None:
    import resource

    _cap_file_size()
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


def ci_counts(per_target: int, targets: Iterable[str] = TARGETS) -> dict[str, int]:
    """Cases per target for a run of about ``per_target`` each, scaled by :data:`CI_SHARE`."""
    return {t: max(1, round(per_target * CI_SHARE.get(t, 1.0))) for t in targets}


def plan_counts(counts: dict[str, int], seed: int) -> Iterator[tuple[str, int]]:
    """``counts[t]`` cases of each target, taken in turn while each has some left (as :func:`plan` for equal counts)."""
    for i in range(max(counts.values(), default=0)):
        for target, n in counts.items():
            if i < n:
                yield target, seed * 10**9 + i


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
    if case.target == "folder":
        root = "ROOT = pathlib.Path(tempfile.mkdtemp())\nIN = ROOT / 'model'\nIN.mkdir()\n"
        root += "(ROOT / 'o' / 'p').mkdir(parents=True)\n"
        for where in ("ROOT", "ROOT / 'o'"):
            root += "".join(f"({where} / {n!r}).write_bytes({_blob_expr(_sentinel(n))})\n" for n in SENTINELS)
        out = "str(ROOT / 'o' / 'p' / {!r})"
        return (
            head.replace("import array,", "import array, os, pathlib, tempfile,")
            + root + FOLDER_PRELUDE + case.source
            + "\nprint(ROOT)\naq.load(IN, backend='numpy')\nfrom arrayquant.cli import main\n"
            + f"main(['inspect', str(IN)])\nmain(['dequantize', str(IN), {out.format('dequantized')}])\n"
            + f"main(['quantize', str(IN), {out.format('quantized')}, '--scheme', 'nvfp4', '--quiet'])\n"
        )  # fmt: skip
    if case.target == "gguf-meta":
        return head + (
            f"blob = {_blob_expr(case.blob)}\nopen('case.gguf', 'wb').write(blob)\n"
            "from arrayquant.io.gguf import read_metadata\n"
            "for v in aq.load('case.gguf', backend='numpy').values():\n"
            "    if isinstance(v, aq.QuantizedTensor): aq.dequantize(v); aq.to_bytes(v)\n"
            "read_metadata('case.gguf')\n"
        )
    if case.target in ("load", "cli", *FILE_TARGETS) or not case.source:
        name = "case.onnx" if case.target == "onnx" else "case.safetensors"  # ONNX is found by its suffix too
        head += f"blob = {_blob_expr(case.blob)}\nopen({name!r}, 'wb').write(blob)\n"
        if case.target in ("load", *FILE_TARGETS):  # aq.load finds the format from the content
            return (
                head
                + f"for v in aq.load({name!r}, backend='numpy').values():\n"
                + ("    if isinstance(v, aq.QuantizedTensor): aq.dequantize(v); aq.to_bytes(v)\n")
            )
        if case.target == "nvfp4":
            return head + (
                f"from arrayquant.io import read_nvfp4\n"
                f"aq.dequantize(read_nvfp4('case.safetensors', {case.name!r}, backend='numpy'))\n"
            )
        return head + (
            "from arrayquant.io.arrayquant.layout import Checkpoint\nfrom arrayquant.cli import main\n"
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
    if case.target != "bytes":  # quantize, ops, selftest
        skip = ("stage(", "held = ")
        body = "\n".join(ln for ln in case.source.splitlines() if not ln.startswith(skip))
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
