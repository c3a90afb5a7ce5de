"""GGUF's K-quants and IQ4 byte for byte with ggml: the quantizers (with or without an imatrix), reader and writer.

The oracle is ggml-base compiled from the pinned llama-cpp-python sdist (``tests/ggml_oracle.py``),
a release build as llama.cpp's are, called through ctypes: ``ggml_quantize_chunk`` (what
llama-quantize writes every block with; its last argument the importance matrix) and
``dequantize_row_*``. Bytes, codes and stored scales are compared exactly, floats bit for bit.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.errors import BackendUnavailableError, ParamsError, SchemeError, ShapeError
from arrayquant.fused import ggml_blocks, ggml_kquants
from arrayquant.io.gguf import types as gguf_types

from . import ggml_oracle
from .test_ggml_bytes import _gguf_file
from .test_importance import _imatrix

gguf = pytest.importorskip("gguf")
pytest.importorskip("numba", reason="llama.cpp's K-quant quantizers run as numba kernels (pip install numba)")

KTYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1"]  # their imatrix searches
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}


def _data(dist: str, shape: tuple[int, int] = (8, 512)) -> np.ndarray:
    """Weights of many kinds, each row a different case where it matters."""
    rng = np.random.default_rng(zlib.crc32(dist.encode()))
    if dist == "normal":
        x = rng.standard_normal(shape) * 0.02
    elif dist == "heavy":
        x = rng.standard_t(1.5, shape)
    elif dist == "ties":  # multiples of 1/4: values half way between codes
        x = np.round(rng.standard_normal(shape) * 4) / 4
    elif dist == "sparse":  # mostly zeros: all-zero sub-blocks and super-blocks beside others
        x = np.where(rng.random(shape) < 0.9, 0.0, rng.standard_normal(shape))
    elif dist == "positive":  # all > 0: the mins are 0, the offsets -0.0
        x = np.abs(rng.standard_normal(shape)) + 3
    elif dist == "scales":  # rows from 1e-30 to 1e4: f16 d underflows and overflows, nearest_int past its range
        x = rng.standard_normal(shape) * np.logspace(-30, 4, shape[0])[:, None]
    elif dist == "constant":
        x = np.full(shape, -1.7)
    else:
        raise KeyError(dist)
    x = x.astype(np.float32)
    x[0, :32] = 0.0
    x[0, 32:48] = -0.0
    return x


DISTS = ["normal", "heavy", "ties", "sparse", "positive", "scales", "constant"]


def _imatrix_of(kind: str, cols: int) -> np.ndarray:
    rng = np.random.default_rng(cols)
    if kind == "dense":
        return np.abs(rng.standard_normal(cols)).astype(np.float32) + np.float32(0.01)
    if kind == "zeros":  # whole columns of weight 0 (tokens that never reached them)
        return (rng.random(cols) < 0.5).astype(np.float32)
    return (rng.standard_normal(cols) ** 2 * 1e6).astype(np.float32)  # large


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("type_name", KTYPES)
def test_quantizer_is_ggml_quantize_chunk(oracle: object, type_name: str, dist: str) -> None:
    x = _data(dist)
    got = ggml_kquants.quantize_rows(x, type_name)
    want = ggml_oracle.quantize(x, type_name)
    assert got.shape == want.shape
    rows = np.flatnonzero((got != want).any(axis=1))
    assert rows.size == 0, f"rows {rows.tolist()} differ"


@pytest.mark.parametrize("imatrix", ["dense", "zeros", "large"])
@pytest.mark.parametrize("dist", ["normal", "heavy", "sparse", "scales"])
@pytest.mark.parametrize("type_name", KTYPES + LEGACY)
def test_imatrix_search_is_ggml_quantize_chunk(oracle: object, type_name: str, dist: str, imatrix: str) -> None:
    x = _data(dist)
    qw = _imatrix_of(imatrix, x.shape[1])
    got = ggml_kquants.quantize_rows(x, type_name, qw)
    want = ggml_oracle.quantize(x, type_name, qw)
    rows = np.flatnonzero((got != want).any(axis=1))
    assert rows.size == 0, f"rows {rows.tolist()} differ"


@pytest.mark.parametrize("type_name", KTYPES)
def test_calibration_ggml_decodes_to_ggml_values(oracle: object, type_name: str) -> None:
    x = _data("heavy", (4, 512)) * np.float32(0.05)
    qw = _imatrix_of("dense", 512)
    for importance in (None, qw):
        qt = aq.quantize(x, type_name.lower(), calibration="ggml", importance=importance)
        assert str(qt.scheme) == ggml_blocks.SCHEMES[type_name]
        raw = ggml_oracle.quantize(x, type_name, importance)
        want = ggml_oracle.dequantize(raw, type_name, x.shape)
        np.testing.assert_array_equal(np.asarray(aq.dequantize(qt)).view(np.uint32), want.view(np.uint32))
        assert gguf_types.encode(qt)[1].tobytes() == raw.tobytes()


@pytest.mark.parametrize("type_name", LEGACY)
def test_legacy_types_take_an_imatrix_through_calibration_ggml(oracle: object, type_name: str) -> None:
    x = _data("normal", (4, 512))
    qw = _imatrix_of("dense", 512)
    qt = aq.quantize(x, type_name.lower(), calibration="ggml", importance=qw)
    raw = ggml_oracle.quantize(x, type_name, qw)
    assert gguf_types.encode(qt)[1].tobytes() == raw.tobytes()
    assert raw.tobytes() != ggml_oracle.quantize(x, type_name).tobytes()  # the imatrix changed the search


def test_stacked_experts_take_one_imatrix_each(oracle: object) -> None:
    x = _data("normal", (6, 512)).reshape(3, 2, 512)
    qw = np.stack([_imatrix_of(k, 512) for k in ("dense", "zeros", "large")])
    qt = aq.quantize(x, "q4_k", calibration="ggml", importance=qw[:, None, :])
    same = aq.quantize(x, "q4_k", calibration="ggml", importance=qw)  # (experts, cols) too
    assert aq.to_bytes(qt) == aq.to_bytes(same)
    raw = gguf_types.encode(qt)[1].reshape(3, 2, -1)
    for e in range(3):
        assert raw[e].tobytes() == ggml_oracle.quantize(x[e], "Q4_K", qw[e]).tobytes(), e


@pytest.mark.parametrize("type_name", KTYPES)
def test_files_llama_cpp_wrote_read_exactly_and_back(oracle: object, type_name: str) -> None:
    for dist in DISTS:
        x = _data(dist)
        for qw in (None, _imatrix_of("dense", 512)):
            raw = ggml_oracle.quantize(x, type_name, qw)
            qt, why = gguf_types.decode(raw, type_name, x.shape, backend="numpy")
            want = ggml_oracle.dequantize(raw, type_name, x.shape)
            if qt is None:  # an f16 d that overflowed: ggml's own values are infinite or NaN there
                assert dist == "scales"
                assert "non-finite" in why
                assert not np.isfinite(want).all()
                continue
            got = np.asarray(aq.dequantize(qt), np.float32)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # -0.0 included
            name, back = gguf_types.encode(qt)
            assert name == type_name
            # any factoring of the scales decodes to the same values, zero signs included ...
            again, _ = gguf_types.decode(back, type_name, x.shape, backend="numpy")
            assert again is not None
            np.testing.assert_array_equal(np.asarray(aq.dequantize(again)).view(np.uint32), want.view(np.uint32))
            # ... and the reference quantizers' blocks factor back to their own bytes (but where an f16 d
            # rounded to 0 and took its levels with it)
            if qw is None and dist != "scales":
                assert back.tobytes() == raw.tobytes(), dist


def test_decode_gives_the_arrayquant_scheme_of_each_type(oracle: object) -> None:
    x = _data("normal", (2, 256))
    want_kinds = {
        "Q2_K": (np.uint8, (2, 16)),
        "Q3_K": (np.int8, (2, 16)),
        "Q4_K": (np.uint8, (2, 8)),
        "Q5_K": (np.uint8, (2, 8)),
        "Q6_K": (np.int8, (2, 16)),
        "IQ4_NL": (np.int8, (2, 8)),
        "IQ4_XS": (np.int8, (2, 8)),
    }
    for type_name, (dtype, grid) in want_kinds.items():
        qt, _ = gguf_types.decode(ggml_oracle.quantize(x, type_name), type_name, x.shape, backend="numpy")
        assert qt is not None
        assert str(qt.scheme) == ggml_blocks.SCHEMES[type_name]
        assert np.asarray(qt.codes()).dtype == dtype
        assert qt.scales.shape == grid
        assert (qt.offset is not None) == (type_name in ("Q2_K", "Q4_K", "Q5_K"))
        assert gguf_types.type_of(qt.scheme) == type_name


def test_worked_q4_k_block() -> None:
    """One Q4_K super-block built by hand: d = 0.5, dmin = 0.25, sub-block 0 scale 3 / min 2, the rest 0."""
    raw = np.zeros((1, 144), np.uint8)
    raw[0, 0:2] = np.array([0.5], "<f2").view(np.uint8)
    raw[0, 2:4] = np.array([0.25], "<f2").view(np.uint8)
    raw[0, 4] = 3  # sub-block 0's 6-bit scale
    raw[0, 8] = 2  # its 6-bit min
    raw[0, 16:48] = 0x5A  # element i < 32: low nibble 0xA; element 32 + i: high nibble 5 (sub-block 1)
    qt, why = gguf_types.decode(raw, "Q4_K", (256,), backend="numpy")
    assert why == ""
    assert qt is not None
    y = np.asarray(aq.dequantize(qt))
    assert y[:32].tolist() == [0.5 * 3 * 10 - 0.25 * 2] * 32  # 14.5
    assert y[32:64].tolist() == [0.0] * 32  # scale 0 and min 0: (0 * 5) + -0.0
    assert qt.scales[:2].tolist() == [1.5, 0.0]
    assert qt.offset[:2].tolist() == [-0.5, -0.0]


def test_minmax_scales_do_not_factor_into_a_k_quant() -> None:
    x = _data("normal", (2, 256))
    qt = aq.quantize(x, "q4_k")  # arrayquant's MinMax: f32 scales, no f16 d behind them
    with pytest.raises(SchemeError, match=r"Q4_K block 0: its scales \(and offsets\) are not one f16 times Q4_K's"):
        gguf_types.encode(qt)
    with pytest.raises(SchemeError, match="Quantize from floats with calibration='ggml'"):
        aq.save(Path(os.devnull).with_name("never.gguf"), {"w": qt}, format="gguf")


@pytest.mark.parametrize(
    ("type_name", "at", "value", "why"),
    [
        ("Q4_K", 0, -1.0, "a negative scale d under offsets"),
        ("Q2_K", 80, -2.0, "a negative scale d under offsets"),
        ("Q4_K", 2, np.inf, "a non-finite f16 scale d or dmin"),
        ("Q6_K", 208, np.nan, "a non-finite f16 scale d"),
        ("IQ4_XS", 0, np.inf, "a non-finite f16 scale d"),
    ],
)
def test_blocks_that_are_no_tensor_read_as_marked_floats(type_name: str, at: int, value: float, why: str) -> None:
    size = ggml_blocks.KTYPES[type_name][1]
    raw = np.zeros((2, size), np.uint8)
    raw[1, 4:16] = 7  # some scales, so the values are not all zero
    raw[1, at : at + 2] = np.array([value], "<f2").view(np.uint8)
    qt, reason = gguf_types.decode(raw, type_name, (2, 256), backend="numpy")
    assert qt is None
    assert reason.startswith(f"{type_name} block 1 (row (1,), block 0 of the row) has {why}")


def test_quantize_rows_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ShapeError, match=r"Q4_K quantizes rows of whole blocks of 256; got shape \(2, 300\)"):
        ggml_kquants.quantize_rows(np.zeros((2, 300), np.float32), "Q4_K")
    with pytest.raises(ShapeError, match="an imatrix has one weight per column: 256 here, got 3"):
        ggml_kquants.quantize_rows(np.zeros((2, 256), np.float32), "Q4_K", np.ones(3, np.float32))
    with pytest.raises(ShapeError, match="Q4_0 without an imatrix is ggml_reference's quantizer"):
        ggml_kquants.quantize_rows(np.zeros((2, 256), np.float32), "Q4_0")
    monkeypatch.setattr(ggml_kquants, "_KERNELS", None)  # as without numba
    with pytest.raises(BackendUnavailableError, match=r"need numba: pip install numba \(or arrayquant\[fast\]\)"):
        ggml_kquants.quantize_rows(np.zeros((2, 256), np.float32), "Q4_K")


def test_importance_refusals() -> None:
    x = np.ones((2, 256), np.float32)
    with pytest.raises(ShapeError, match=r"importance has shape \(3,\); llama.cpp's importance matrix is one weight"):
        aq.quantize(x, "q4_k", calibration="ggml", importance=np.ones(3, np.float32))
    with pytest.raises(ShapeError, match=r"or one per matrix, \(4, 256\)"):
        aq.quantize(np.ones((4, 2, 256), np.float32), "q4_k", calibration="ggml", importance=np.ones((2, 256)))
    bad = np.ones(256, np.float32)
    bad[7] = -1
    with pytest.raises(ParamsError, match=r"importance has -1\.0 at flat index 7; weights must be finite and non-neg"):
        aq.quantize(x, "q6_k", calibration="ggml", importance=bad)
    with pytest.raises(ParamsError, match=r"\(its Q8_0 quantizer takes no importance matrix\); drop importance"):
        aq.quantize(x, "q8_0", calibration="ggml", importance=np.ones(256, np.float32))
    with pytest.raises(ShapeError, match="calibration 'ggml' quantizes whole blocks of 256 along the last axis"):
        aq.quantize(np.ones((2, 288), np.float32), "q4_k", calibration="ggml")


@pytest.mark.parametrize("source", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("with_imatrix", [False, True])
@pytest.mark.parametrize("type_name", KTYPES)
def test_cli_quantize_writes_llama_quantize_bytes(
    oracle: object, tmp_path: Path, type_name: str, with_imatrix: bool, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "m.gguf", tmp_path / "q.gguf"
    values = _gguf_file(src, source)
    args = ["quantize", str(src), str(dst), "--scheme", type_name.lower(), "--pure", "--quiet"]  # the type alone
    imatrix = {}
    if with_imatrix:  # llama-imatrix's file: in_sum2 / counts is each column's weight
        entries = {}
        for name, x in values.items():
            sums = _imatrix_of("dense", x.shape[-1]) * np.float32(3)
            entries[name] = (sums[None, :], np.array([[3.0]], np.float32))
            imatrix[name] = sums / np.float32(3)
        args += ["--importance", str(_imatrix(tmp_path / "imatrix.gguf", entries))]
    assert main(args) == 0
    capsys.readouterr()
    got = {t.name: t for t in gguf.GGUFReader(str(dst)).tensors}
    for name, x in values.items():
        block = 32 if type_name == "IQ4_NL" else 256
        want_type = type_name if x.shape[-1] % block == 0 else FALLBACK[type_name]
        assert got[name].tensor_type.name == want_type, name
        qw = imatrix.get(name) if want_type in ggml_kquants.TYPES else None  # Q8_0 takes none
        want = ggml_oracle.quantize(x, want_type, qw)
        assert np.asarray(got[name].data).tobytes() == want.tobytes(), name


def test_lookup_scales_may_be_negative() -> None:
    """IQ4's table is not symmetric: a block's mirror image needs a negative scale, as ggml stores it."""
    scheme = aq.QuantScheme.parse("q4f:block4:f32:lookup:iq4nl:native")
    codes = np.array([[-8, 7, 0, 1]], np.int8)  # fields 8, 7, 0, 1: table entries 1, -10, -127, -104
    qt = aq.QuantizedTensor(scheme, (1, 4), np.float32, codes, np.array([[-0.5]], np.float32))
    assert np.asarray(aq.dequantize(qt)).tolist() == [[-0.5, 5.0, 63.5, 52.0]]
    back = aq.from_bytes(aq.to_bytes(qt), scheme, (1, 4))
    assert np.asarray(back.scales).tolist() == [[-0.5]]
    nf4 = aq.QuantScheme.parse("q4f:block4:f32:lookup:nf4:native")  # the same holds for any table
    last = np.array([[-1, 0, 0, 0]], np.int8)  # field 15: NF4's 1.0
    assert np.asarray(aq.dequantize(aq.QuantizedTensor(nf4, (1, 4), np.float32, last, qt.scales)))[0, 0] == -0.5


def test_nearest_int_reads_the_bits_as_the_c_does() -> None:
    """``nearest_int`` against the C's definition done in NumPy (the bits of ``x + 12582912.0f``):
    halves round to even, and past ``|x| > 4194303`` (the assert ggml compiles out) the low bits."""
    halves = np.arange(-8, 8, dtype=np.float32) + np.float32(0.5)
    edges = np.array([4194303.0, 4194303.5, 4194304.0, -4194304.0, -4194304.5, -4194305.0], np.float32)
    wild = np.array([1e7, -1e7, 3.0e38, -3.0e38, np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40], np.float32)
    rng = np.random.default_rng(7)
    spread = (rng.standard_normal(2000) * 10.0 ** rng.integers(-3, 9, 2000)).astype(np.float32)
    values = np.concatenate([halves, edges, wild, spread])
    with np.errstate(invalid="ignore", over="ignore"):
        bits = (values + np.float32(12582912.0)).view(np.int32)
    want = (bits & 0x007FFFFF).astype(np.int64) - 0x00400000
    got = np.array([ggml_kquants.nearest_int(v) for v in values])
    np.testing.assert_array_equal(got, want)
    assert list(got[:16]) == [-8, -6, -6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6, 6, 8]
