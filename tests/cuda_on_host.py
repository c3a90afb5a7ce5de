"""CUDA kernel sources compiled as C++ and run on the CPU, one "thread" at a time, over NumPy arrays.

The tests of the fused CuPy kernels use it where there is no GPU: the intrinsics ``__fdiv_rn`` and
friends become plain IEEE f32 operations (``-ffp-contract=off``), ``threadIdx.x`` walks every
thread of a one-dimensional launch in turn, and :func:`compile_kernels` returns callables with
CuPy's ``RawKernel`` calling convention, ``kernel(grid, block, args)``.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np

__all__ = ["PRELUDE", "HostKernel", "compile_kernels", "compiler"]

PRELUDE = r"""
#include <cmath>
#include <cstring>
using std::isnan;
using std::signbit;
struct aq_dim { unsigned int x; };
static aq_dim blockIdx = {0}, blockDim = {1}, threadIdx = {0};
extern "C" void aq_set_thread(unsigned int i) { threadIdx.x = i; }
#define __device__ static
#define __global__
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline int atomicOr(int* p, int v) { int o = *p; *p = o | v; return o; }
"""

_CTYPES = {np.int64: ctypes.c_longlong, np.int32: ctypes.c_int, np.uint32: ctypes.c_uint, np.float32: ctypes.c_float}


class HostKernel:
    """A kernel compiled as C++ and run thread by thread over NumPy arrays."""

    def __init__(self, lib: ctypes.CDLL, name: str) -> None:
        self._lib = lib
        self._fn = getattr(lib, name)
        self._fn.restype = None

    def __call__(self, grid, block, args):
        cargs = []
        keep = []
        for a in args:
            if isinstance(a, np.ndarray):
                assert a.flags.c_contiguous
                keep.append(a)
                cargs.append(ctypes.c_void_p(a.ctypes.data))
            else:
                cargs.append(_CTYPES[type(a)](a))  # only the exact scalar types the wrappers pass
        for i in range(grid[0] * block[0]):
            self._lib.aq_set_thread(i)
            self._fn(*cargs)


def compiler() -> str | None:
    """The host's C++ compiler, or None."""
    return shutil.which("g++") or shutil.which("c++")


def compile_kernels(sources: dict[str, str], build: Path) -> dict[str, HostKernel]:
    """Each ``extern "C"`` kernel of ``sources`` (name -> CUDA source) compiled into ``build``."""
    cxx = compiler()
    assert cxx is not None
    kernels = {}
    for name, src in sources.items():
        code = PRELUDE + src
        stem = build / f"{name}_{hashlib.sha1(code.encode()).hexdigest()[:8]}"
        stem.with_suffix(".cpp").write_text(code)
        cmd = [cxx, "-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-o"]
        subprocess.run([*cmd, str(stem.with_suffix(".so")), str(stem.with_suffix(".cpp"))], check=True)
        lib = ctypes.CDLL(str(stem.with_suffix(".so")))
        lib.aq_set_thread.argtypes = [ctypes.c_uint]
        kernels[name] = HostKernel(lib, name)
    return kernels
