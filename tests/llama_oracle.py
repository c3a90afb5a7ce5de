"""llama.cpp itself as a test oracle: libllama built from the llama-cpp-python sdist, called through ctypes.

``llama_model_quantize`` is what the ``llama-quantize`` tool runs (its file types, ``--pure``,
``--output-tensor-type``, ``--token-embedding-type``, ``--tensor-type`` and ``--imatrix``), and a
model's logits come from llama.cpp's own graph on the CPU. The build is a portable release build
(``GGML_NATIVE=OFF``), the library alone (no tools, no examples), and a small C shim
(``tests/llama_shim.c``) keeps llama.h's structs out of ctypes. It is cached beside the ggml
oracle's (``$ARRAYQUANT_TEST_CACHE`` or ``~/.cache/arrayquant-tests``); ``python
tests/llama_oracle.py`` builds it ahead of the tests.
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
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .ggml_oracle import TYPES, VERSION, cache_dir, sdist

_LLAMA = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
_SHIM = Path(__file__).with_name("llama_shim.c")
# enum ggml_type (ggml.h) by name, for the options that name a type: the quantized ones and the floats
GGML_TYPES = {"F32": 0, "F16": 1, "BF16": 30, **TYPES}


def _extract(to: Path) -> Path:
    """llama.cpp's sources (its CMake project, ggml included) out of the cached sdist."""
    with tarfile.open(sdist(to)) as tar:
        wanted = [m for m in tar.getmembers() if m.name.startswith(_LLAMA) and "/.git" not in m.name]
        tar.extractall(to, members=wanted, filter="data")
    return to / _LLAMA


def _run(cmd: list[str]) -> None:
    """A build step, its output shown only where it fails (cmake's configure talks a lot)."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(done.stdout[-20000:], done.stderr[-20000:], sep="\n", file=sys.stderr)
        raise subprocess.CalledProcessError(done.returncode, cmd)


def build() -> Path:
    """The cached ``libaqllama.so`` (the shim over libllama), built first if needed (a few minutes)."""
    lib = cache_dir() / "llama" / "libaqllama.so"
    if lib.is_file():
        return lib
    cmake, cc = shutil.which("cmake"), shutil.which(os.environ.get("CC", "cc"))
    if cmake is None or cc is None:
        msg = "the llama.cpp oracle needs cmake and a C compiler"
        raise RuntimeError(msg)
    out = lib.parent
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = _extract(work)
        b = work / "build"
        flags = [
            "-DCMAKE_BUILD_TYPE=Release",
            # -O1 compiles in about half the time of -O3; the results are the same (no fast-math, no FMA)
            "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
            "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
            "-DBUILD_SHARED_LIBS=ON",
            "-DGGML_NATIVE=OFF",  # llama.cpp's portable build: baseline x86-64, no FMA
            "-DGGML_OPENMP=OFF",
            "-DLLAMA_BUILD_COMMON=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_TOOLS=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_CURL=OFF",
            "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",  # the libraries find each other beside them, wherever copied
        ]
        jobs = str(os.cpu_count() or 2)
        _run([cmake, "-S", str(src), "-B", str(b), *flags])
        _run([cmake, "--build", str(b), "--target", "llama", "-j", jobs])
        staged = work / "lib"
        staged.mkdir()
        for so in b.rglob("*.so*"):
            if so.is_file():
                shutil.copy2(so, staged / so.name)
        include = [f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}"]
        shim = staged / "libaqllama.so"
        link = [f"-L{staged}", "-lllama", "-Wl,-rpath,$ORIGIN"]
        subprocess.run([cc, "-O2", "-fPIC", "-shared", *include, str(_SHIM), "-o", str(shim), *link], check=True)
        out.mkdir(parents=True, exist_ok=True)
        for so in staged.iterdir():
            shutil.copy2(so, out / (so.name + ".tmp"))
        for so in staged.iterdir():
            os.replace(out / (so.name + ".tmp"), out / so.name)  # the shim last: present means complete
    return lib


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    c = ctypes
    lib.aq_quantize.restype = c.c_int
    lib.aq_quantize.argtypes = [c.c_char_p, c.c_char_p, c.c_int, c.c_int, c.c_int, c.c_int]
    lib.aq_quantize.argtypes += [c.POINTER(c.c_char_p), c.POINTER(c.c_int), c.c_int]
    lib.aq_quantize.argtypes += [c.POINTER(c.c_char_p), c.POINTER(c.c_void_p), c.POINTER(c.c_size_t), c.c_int]
    lib.aq_logits.restype = c.c_int
    lib.aq_logits.argtypes = [c.c_char_p, c.POINTER(c.c_int32), c.c_int, c.POINTER(c.c_float), c.c_int]
    return lib


def quantize(
    src: Path,
    dst: Path,
    ftype: int,
    *,
    pure: bool = False,
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    tensor_types: Sequence[tuple[str, str]] = (),
    imatrix: Mapping[str, np.ndarray] | None = None,
) -> None:
    """``llama-quantize`` of ``src`` into ``dst`` as the file type ``ftype`` (``enum llama_ftype``), one thread."""
    c = ctypes
    pats = [p.lower().encode() for p, _ in tensor_types]  # llama-quantize lowercases them
    kinds = [GGML_TYPES[t.upper()] for _, t in tensor_types]
    vectors = {k: np.ascontiguousarray(v, np.float32) for k, v in (imatrix or {}).items()}
    names = [k.encode() for k in vectors]
    rc = _lib().aq_quantize(
        str(src).encode(),
        str(dst).encode(),
        ftype,
        int(pure),
        -1 if output_tensor_type is None else GGML_TYPES[output_tensor_type.upper()],
        -1 if token_embedding_type is None else GGML_TYPES[token_embedding_type.upper()],
        (c.c_char_p * max(len(pats), 1))(*pats),
        (c.c_int * max(len(kinds), 1))(*kinds),
        len(pats),
        (c.c_char_p * max(len(names), 1))(*names),
        (c.c_void_p * max(len(vectors), 1))(*[v.ctypes.data for v in vectors.values()]),
        (c.c_size_t * max(len(vectors), 1))(*[v.size for v in vectors.values()]),
        len(vectors),
    )
    if rc != 0:
        msg = f"llama_model_quantize failed ({rc}) on {src}"
        raise RuntimeError(msg)


def logits(path: Path, tokens: Sequence[int], n_vocab: int) -> np.ndarray:
    """llama.cpp's logits after each token (one at a time, one CPU thread): ``(len(tokens), n_vocab)`` f32."""
    toks = np.ascontiguousarray(tokens, np.int32)
    out = np.zeros((len(toks), n_vocab), np.float32)
    c = ctypes
    ptr = toks.ctypes.data_as(c.POINTER(c.c_int32))
    rc = _lib().aq_logits(str(path).encode(), ptr, len(toks), out.ctypes.data_as(c.POINTER(c.c_float)), n_vocab)
    if rc != 0:
        msg = f"llama.cpp could not run {path} ({rc})"
        raise RuntimeError(msg)
    return out


if __name__ == "__main__":
    print(build())
    sys.exit(0)
