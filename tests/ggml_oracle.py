"""ggml's own quantizers as a test oracle: ggml-base compiled from the llama-cpp-python sdist.

``llama-quantize`` writes every block through ``ggml_quantize_chunk``, which (without an imatrix)
calls the reference ``quantize_row_*_ref`` loops in ggml-quants.c: scalar C, so their bytes do
not depend on the CPU. This module fetches the pinned sdist with pip, compiles only ggml-base's
sources (ggml.c, ggml-quants.c, gguf.cpp, ...: about 20 s on 2 cores) into a shared library,
caches it, and calls it through ctypes.

The cache is ``$ARRAYQUANT_TEST_CACHE`` or ``~/.cache/arrayquant-tests``; a build found there is
reused. Run ``python tests/ggml_oracle.py`` to build it ahead of the tests.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

VERSION = "0.3.36"  # llama-cpp-python; its vendor/llama.cpp is the ggml the tests compare with
_GGML = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/ggml/"
_SOURCES = (
    "ggml.c",
    "ggml.cpp",
    "ggml-alloc.c",
    "ggml-backend.cpp",
    "ggml-backend-meta.cpp",
    "ggml-opt.cpp",
    "ggml-threading.cpp",
    "ggml-quants.c",
    "gguf.cpp",
)  # ggml-base, as ggml/src/CMakeLists.txt lists it
TYPES = {
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "TQ1_0": 34,
    "TQ2_0": 35,
    "MXFP4": 39,
    "NVFP4": 40,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "IQ4_NL": 20,
    "IQ4_XS": 23,
}  # enum ggml_type (ggml.h)


def cache_dir() -> Path:
    root = os.environ.get("ARRAYQUANT_TEST_CACHE") or Path.home() / ".cache" / "arrayquant-tests"
    return Path(root) / f"ggml-{VERSION}"


def sdist(work: Path) -> Path:
    """The pinned llama-cpp-python sdist: cached, or fetched with pip into ``work`` and cached."""
    cached = cache_dir() / f"llama_cpp_python-{VERSION}.tar.gz"
    if cached.is_file():
        return cached
    got = work / "download"
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*cmd, "--dest", str(got), f"llama-cpp-python=={VERSION}"], check=True)
    (found,) = got.glob("llama_cpp_python-*.tar.gz")
    cached.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(found, cached)
    return cached


def _extract(sdist: Path, to: Path) -> Path:
    """ggml's headers and ggml-base's sources only (the sdist is 77 MB)."""
    with tarfile.open(sdist) as tar:
        wanted = []
        for m in tar.getmembers():
            rel = m.name[len(_GGML) :] if m.isfile() and m.name.startswith(_GGML) else ""
            top = rel.startswith("src/") and rel.count("/") == 1
            if rel.startswith("include/") or top or (rel.startswith("src/") and rel.endswith(".h")):
                wanted.append(m)
        tar.extractall(to, members=wanted, filter="data")
    return to / _GGML


def build() -> Path:
    """The path of the cached ``libggml-base-release.so``, compiled first if needed."""
    lib = cache_dir() / "libggml-base-release.so"
    if lib.is_file():
        return lib
    cc, cxx = shutil.which(os.environ.get("CC", "cc")), shutil.which(os.environ.get("CXX", "c++"))
    if cc is None or cxx is None:
        msg = "the ggml oracle needs a C and a C++ compiler (cc, c++)"
        raise RuntimeError(msg)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ggml = _extract(sdist(work), work / "src")
        (work / "inc").mkdir()
        (work / "inc" / "ggml-version.h").write_text(
            f'#pragma once\n#define GGML_VERSION "llama-cpp-python-{VERSION}"\n#define GGML_COMMIT "sdist"\n'
        )
        # a release build, as llama.cpp's are: NDEBUG drops the asserts (nearest_int's range check among them)
        flags = ["-O2", "-DNDEBUG", "-fPIC", "-D_GNU_SOURCE", "-DGGML_BUILD", "-DGGML_SHARED", f"-I{work / 'inc'}"]
        flags += [f"-I{ggml / 'include'}", f"-I{ggml / 'src'}"]
        objects = []
        for name in _SOURCES:
            obj = work / f"{name}.o"
            std = ["-std=c11"] if name.endswith(".c") else ["-std=c++17"]
            compiler = cc if name.endswith(".c") else cxx
            subprocess.run([compiler, *flags, *std, "-c", str(ggml / "src" / name), "-o", str(obj)], check=True)
            objects.append(str(obj))
        out = work / "libggml-base.so"
        subprocess.run([cxx, "-shared", "-o", str(out), *objects, "-lm", "-lpthread"], check=True)
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp_lib = lib.with_suffix(".so.tmp")
        shutil.copyfile(out, tmp_lib)
        os.replace(tmp_lib, lib)  # whole or absent, for a run that stops half way
    return lib


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 3
    lib.ggml_quantize_chunk.argtypes += [ctypes.c_void_p]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    for name in TYPES:
        fn = getattr(lib, _dequantizer(name))
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def _dequantizer(type_name: str) -> str:
    """The C name of a type's row dequantizer (``dequantize_row_q4_K``, ``dequantize_row_iq4_xs``)."""
    name = type_name.lower()
    return f"dequantize_row_{name[:-2] + '_K' if name.endswith('_k') else name}"


def quantize(x: np.ndarray, type_name: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """``ggml_quantize_chunk`` of f32 rows ``x`` (last axis the row): uint8, ``(*lead, row bytes)``.

    ``imatrix`` (one f32 weight per column) is llama-quantize's importance matrix for the tensor
    (``quant_weights``): the K-quants, IQ4 and Q4_0 ... Q5_1 then run their weighted searches.
    """
    lib = _lib()
    x = np.ascontiguousarray(x, dtype=np.float32)
    cols = x.shape[-1]
    rows = x.size // cols
    row = lib.ggml_row_size(TYPES[type_name], cols)
    out = np.zeros(rows * row, np.uint8)
    qw = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32).reshape(cols)
    ptr = None if qw is None else qw.ctypes.data
    n = lib.ggml_quantize_chunk(TYPES[type_name], x.ctypes.data, out.ctypes.data, 0, rows, cols, ptr)
    assert n == out.size
    return out.reshape(*x.shape[:-1], row)


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """ggml's ``dequantize_row_*`` of the bytes of a tensor of ``shape``: f32."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(shape, np.float32)
    getattr(_lib(), _dequantizer(type_name))(raw.ctypes.data, out.ctypes.data, out.size)
    return out


if __name__ == "__main__":
    print(build())
