"""The row kernels (LLVM vector code for x86 with AVX2): every kind of row, run length and batch remainder.

Oracles as for the other fused products (``tests/matmul_models``): the f32 dot-product bound around
NumPy's float64 product of the dequantized weight, and the int8 path's definition modelled in NumPy.
Each case also checks that the row kernels really ran (the weight's row layout was built) and that
the panel kernels, which serve CPUs without AVX2, give the same answer within the same bounds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import SchemeError, ShapeError
from arrayquant.invariants import plan_for
from arrayquant.ops import linalg

from .matmul_models import EPS, bound, int8_model, permute, weight

pytest.importorskip("numba")

from arrayquant.fused import numba_matmul, numba_simd

F32 = np.float32

pytestmark = pytest.mark.skipif(not numba_simd.available(), reason="the row kernels need an x86 CPU with AVX2 and FMA")

# (scheme, K, run): every field kind (nibbles plain, signed, E2M1; bytes signed, unsigned, from codes()),
# every span (runs of 16, 32, 64 within a chunk; longer runs of several chunks; blocks past 256), odd
# chunk counts (K = 192: three nibble chunks) and run counts that are not a multiple of 8 (the affine tail)
CASES = [
    ("q4s:block32", 192, 32),
    ("q4s:block32:packed_native", 192, 32),
    ("u4:block32:zero_point", 576, 32),
    ("u4:block32:f16:offset", 192, 32),
    ("q4f:block16:f16", 192, 16),
    ("q4s:block64", 192, 64),
    ("q4s:block128", 384, 128),
    ("q4s:block512", 1024, 256),
    ("q4s", 192, 192),
    ("mxfp4", 192, 32),
    ("nvfp4", 192, 16),
    ("e2m1:block32:native", 192, 32),
    ("q8s:block32", 96, 32),
    ("q8s:block16", 96, 16),
    ("q8f:block64:f16", 192, 64),
    ("q8s:block4096", 4096, 256),
    ("q6_k", 96, 16),
    ("q5_1", 96, 32),
    ("q2_k", 96, 16),
    ("u8:block32:zero_point", 96, 32),
]


def _fresh(scheme: str, k: int) -> aq.QuantizedTensor:
    return weight(scheme, n=32, k=k, seed=k)


@pytest.mark.parametrize(("scheme", "k", "run"), CASES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
def test_f32_rows_are_the_dequantized_product_to_f32_rounding(scheme: str, k: int, run: int, rows: int) -> None:
    w = _fresh(scheme, k)
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(F32)
    got = aq.matmul(x, w.T, path="fused")
    assert w in numba_matmul._ROWS  # the row kernels ran
    wd = aq.dequantize(w).astype(np.float64)
    assert np.all(np.abs(got - x.astype(np.float64) @ wd.T) <= bound(x, wd))
    numba_matmul.SIMD = False
    try:
        panel = numba_matmul.matmul_t(x, w, plan_for(w.scheme))
    finally:
        numba_matmul.SIMD = True
    assert panel is not None
    assert np.all(np.abs(panel - x.astype(np.float64) @ wd.T) <= bound(x, wd))


@pytest.mark.parametrize(("scheme", "k", "run"), [c for c in CASES if not c[0].startswith("u8")])
@pytest.mark.parametrize("rows", [1, 4, 6])
def test_int8_rows_follow_the_definition(scheme: str, k: int, run: int, rows: int) -> None:
    w = _fresh(scheme, k)
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(F32)
    got = aq.matmul(x, w.T, path="fused_int8").astype(np.float64)
    assert w in numba_matmul._ROWS
    scale = np.abs(x.astype(np.float64)) @ np.abs(aq.dequantize(w).astype(np.float64)).T
    assert np.all(np.abs(got - int8_model(x, w, run)) <= 64 * EPS * scale + 1e-30)
    numba_matmul.SIMD = False
    try:
        panel = numba_matmul.matmul_t(x, w, plan_for(w.scheme), "int8")
    finally:
        numba_matmul.SIMD = True
    assert panel is not None
    assert np.all(np.abs(panel - got) <= 128 * EPS * scale + 1e-30)


def test_unsigned_bytes_take_the_panel_for_int8_sums() -> None:
    # 8-bit unsigned codes times int8 activations could saturate the byte multiply-add: the panel sums them
    w = _fresh("u8:block32:zero_point", 96)
    plan = plan_for(w.scheme)
    assert numba_matmul._simd_field(plan, "int8", (32, 96)) is None
    assert numba_matmul._simd_field(plan, "f32", (32, 96)) is not None
    x = np.random.default_rng(0).standard_normal((2, 96)).astype(F32)
    got = aq.matmul(x, w.T, path="fused_int8").astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(aq.dequantize(w).astype(np.float64)).T
    assert np.all(np.abs(got - int8_model(x, w, 32)) <= 64 * EPS * scale + 1e-30)


@pytest.mark.parametrize(
    ("scheme", "k", "why"),
    [
        ("mxfp8", 64, "e4m3"),  # minifloat bytes: the panel's bfloat16 decode
        ("q4s:block32", 96, "K"),  # nibble rows step 64 weights at a time
        ("q4s:block48", 96, "run"),  # a run neither a divisor nor a multiple of the step
    ],
)
def test_what_the_row_kernels_leave_to_the_panel(scheme: str, k: int, why: str) -> None:
    w = _fresh(scheme, k)
    plan = plan_for(w.scheme)
    assert numba_matmul._simd_field(plan, "f32", (32, k)) is None
    x = np.random.default_rng(1).standard_normal((3, k)).astype(F32)
    got = aq.matmul(x, w.T, path="fused")
    assert w not in numba_matmul._ROWS
    assert w in numba_matmul._PANELS
    wd = aq.dequantize(w).astype(np.float64)
    assert np.all(np.abs(got - x.astype(np.float64) @ wd.T) <= bound(x, wd))


def test_activations_are_laid_out_as_the_rows_read_them() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 128)).astype(F32)
    x[2, 40:48] = 0  # a run of zeros: scale 0, codes 0
    run = 16
    xs = np.empty((3, 128), F32)
    sx, xsum = np.ones((3, 8), F32), np.empty((3, 8), F32)
    numba_simd.activations(x, run, False, True, False, F32(1), xs, sx, xsum)
    assert np.array_equal(xs, permute(x))
    assert np.allclose(xsum, x.reshape(3, 8, 16).sum(axis=2), rtol=0, atol=1e-5)
    codes = np.empty((3, 128), np.int8)
    numba_simd.activations(x, run, True, True, False, F32(0.5), codes, sx, xsum)
    want_sx = (np.max(np.abs(x.reshape(3, 8, 16)), axis=2) / F32(127)).astype(F32)
    assert np.array_equal(sx, want_sx * F32(0.5))
    inv = np.divide(F32(1), want_sx, out=np.zeros_like(want_sx), where=want_sx > 0)
    want = np.clip(np.rint(x.reshape(3, 8, 16) * inv[:, :, None]), -127, 127).astype(np.int8).reshape(3, 128)
    assert np.array_equal(codes, permute(want))
    numba_simd.activations(x, run, True, False, False, F32(1), codes, sx, xsum)
    assert np.array_equal(codes, want)  # byte rows: in place
    untouched = np.full((3, 128), 7, F32)
    numba_simd.activations(x, run, False, False, False, F32(1), untouched, sx, xsum)
    assert np.all(untouched == 7)  # f32 sums of byte rows read x itself: nothing copied
    numba_simd.activations(x, run, False, False, True, F32(1), untouched, sx, xsum)
    assert np.array_equal(untouched, x)


def test_nan_and_inf_activations_on_the_rows() -> None:
    w = _fresh("q4s:block32", 128)
    x = np.random.default_rng(5).standard_normal((3, 128)).astype(F32)
    x[1, 7] = np.nan
    x[2, 9] = np.inf
    ref = aq.matmul(x, w.T, path="reference")
    got = aq.matmul(x, w.T, path="fused")
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    assert np.all(np.isfinite(got[0]))
    y8 = aq.matmul(x, w.T, path="fused_int8")
    assert np.all(np.isnan(y8[1]))  # the run's scale is NaN
    assert np.all(np.isnan(y8[2]))  # an infinite scale times codes of 0
    assert np.all(np.isfinite(y8[0]))


def test_a_repeated_product_takes_the_kept_decision_and_only_when_it_holds() -> None:
    w = _fresh("q4s:block32", 128)
    x = np.random.default_rng(6).standard_normal((2, 128)).astype(F32)
    first = x @ w.T
    assert numba_matmul._ROWS[w].decided == {"auto": "f32"}
    assert np.array_equal(numba_matmul.shortcut(x, w, "auto", linalg.FUSED_ROWS), first)
    assert np.array_equal(x @ w.T, first)
    # the stored layout written the other way: the same decision, the same kernel
    assert np.array_equal(numba_matmul.shortcut_t(np.ascontiguousarray(x.T), w, "auto", 32), first.T)
    assert np.array_equal(w @ x.T, first.T)
    assert np.array_equal(w @ x[1], first[1])  # a vector: the checked path
    assert numba_matmul.shortcut_t(x[1], w, "auto", 32) is None
    eight = aq.matmul(x, w.T, path="fused_int8")
    assert numba_matmul._ROWS[w].decided == {"auto": "f32", "fused_int8": "int8"}
    assert np.array_equal(aq.matmul(x, w.T, path="fused_int8"), eight)
    # what the decision rests on is checked again
    assert numba_matmul.shortcut(x.astype(np.float64), w, "auto", 32) is None
    assert numba_matmul.shortcut(np.asfortranarray(np.ones((3, 128), F32)), w, "auto", 32) is None
    assert numba_matmul.shortcut(np.ones((33, 128), F32), w, "auto", 32) is None
    assert numba_matmul.shortcut(np.ones((33, 128), F32), w, "fused_int8", 32) is not None  # forced: no limit
    assert numba_matmul.shortcut(np.ones((2, 64), F32), w, "auto", 32) is None
    assert numba_matmul.shortcut(x, w, "fused", 32) is None  # not decided for this path yet
    assert linalg.matmul_path(np.ones((33, 128), F32), w.T) == "reference"
    with aq.fused_kernels(False):
        assert numba_matmul.shortcut(x, w, "auto", 32) is None
        assert np.array_equal(x @ w.T, aq.matmul(x, w.T, path="reference"))
        with pytest.raises(SchemeError, match=r"path='fused_int8' does not apply: the fused CPU kernels are off"):
            aq.matmul(x, w.T, path="fused_int8")
    with pytest.raises(ShapeError, match=r"inner dimensions differ"):
        np.ones((2, 64), F32) @ w.T
    # a float64 x after float32 ones: the checked path, as always (auto: the reference)
    assert aq.matmul(x.astype(np.float64), w.T).dtype == np.float64
    numba_matmul.SIMD = False
    try:
        assert numba_matmul.shortcut(x, w, "auto", 32) is None
    finally:
        numba_matmul.SIMD = True


def test_available_follows_a_chosen_compile_target(monkeypatch: pytest.MonkeyPatch) -> None:
    import numba

    monkeypatch.setattr(numba.config, "CPU_NAME", "generic")
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "")
    assert not numba_simd.available()
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+sse4.2,+avx2,+fma")
    assert numba_simd.available()
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx2")
    assert not numba_simd.available()
    monkeypatch.setattr(numba.config, "CPU_FEATURES", None)  # a CPU name alone: numba adds the host's features
    assert numba_simd.available()


# what LLVM's Haswell target has: AVX2 and FMA, no AVX-512 (the row kernels' 16-lane vectors split in two)
_HASWELL = (
    "+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+movbe,"
    "+cx16,+fxsr,+mmx,+pclmul,+aes,+xsave,+xsaveopt,+fsgsbase,+rdrnd,-avx512f,-avx512bw,-avx512vl,-avx512vnni,-gfni"
)


def test_an_avx2_only_build_gives_the_same_bits(tmp_path: Path) -> None:
    # the kernels compiled for a CPU without AVX-512 take other instructions for the same LLVM vector
    # code (no gf2p8affine nibble shift, 16-lane vectors in two halves): the same results, bit for bit
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, numpy as np, arrayquant as aq\n"
        "from arrayquant.fused import numba_matmul\n"
        "rng = np.random.default_rng(0)\n"
        "out = {}\n"
        "for scheme in ['q4s:block32', 'nvfp4', 'u4:block32:zero_point', 'q8s:block64', 'q6_k', 'q4s:block512']:\n"
        "    w = aq.quantize(rng.standard_normal((32, 1024)).astype(np.float32), scheme)\n"
        "    x = rng.standard_normal((5, 1024)).astype(np.float32)\n"
        "    for path in ('fused', 'fused_int8'):\n"
        "        out[scheme + ' ' + path] = aq.matmul(x, w.T, path=path).tobytes().hex()\n"
        "    assert w in numba_matmul._ROWS\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "ARRAYQUANT_THREADS": "1"}
    host = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    env |= {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _HASWELL, "NUMBA_CACHE_DIR": str(tmp_path)}
    haswell = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert json.loads(haswell.stdout) == json.loads(host.stdout)


@pytest.mark.parametrize("scheme", ["q4s:block32", "u4:block32:zero_point", "nvfp4", "q8s:block64", "q6_k"])
@pytest.mark.parametrize("path", ["fused", "fused_int8"])
def test_a_row_does_not_depend_on_the_rows_beside_it(scheme: str, path: str) -> None:
    # rows of x go through the kernels four or two at a time, the rest one by one: the same sums each way
    w = _fresh(scheme, 256)
    x = np.random.default_rng(7).standard_normal((7, 256)).astype(F32)
    batch = aq.matmul(x, w.T, path=path)
    for i in range(7):
        assert np.array_equal(aq.matmul(x[i : i + 1], w.T, path=path)[0], batch[i])


def test_the_row_kernels_load_from_the_disk_cache(tmp_path: Path) -> None:
    # a kernel's closure holds plain numbers (its variant code), so numba's cache finds it in a new process
    import os
    import subprocess
    import sys

    script = (
        "import numpy as np, arrayquant as aq\n"
        "from arrayquant.fused import numba_matmul\n"
        "w = aq.quantize(np.ones((16, 64), np.float32), 'q4s:block32')\n"
        "aq.matmul(np.ones((1, 64), np.float32), w.T, path='fused_int8')\n"
        "kernel = numba_matmul._ROWS[w].calls['int8'][0][1]\n"
        "print(sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values()))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "ARRAYQUANT_THREADS": "1"}
    runs = [
        subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    first, second = (tuple(int(v) for v in r.stdout.split()) for r in runs)
    assert first == (0, 1)  # compiled and written
    assert second == (1, 0)  # read back
