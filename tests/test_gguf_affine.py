"""GGUF's Q4_1, Q5_0 and Q5_1 as arrayquant tensors, bit for bit, against ggml's C and gguf-py.

Oracles: ggml-base compiled from the pinned llama-cpp-python sdist (``tests/ggml_oracle.py``:
``ggml_quantize_chunk``, the bytes llama-quantize writes, and ``dequantize_row_q4_1`` etc.), and
gguf-py (``gguf.quants.quantize`` / ``dequantize``, ``GGUFWriter`` / ``GGUFReader``). Block
layouts (ggml-common.h ``block_q4_1``, ``block_q5_0``, ``block_q5_1``) are parsed here with
Python integers, one block at a time: f16 ``d``; f16 ``m`` (Q4_1, Q5_1); a little-endian uint32
``qh`` whose bit ``j`` is bit 4 of element ``j`` (Q5_0, Q5_1); 16 bytes ``qs``, element ``j`` in
the low nibble of ``qs[j]`` and ``j + 16`` in the high one.

The tests against ggml skip where it cannot be built (no C compiler), as in test_ggml_bytes.py;
those against gguf-py run everywhere gguf is installed.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.errors import CorruptDataError, ParamsError, QuantizationError, ShapeError
from arrayquant.io import gguf as G
from arrayquant.io.gguf import types as gt

from . import ggml_oracle

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

TYPES = ["Q4_1", "Q5_0", "Q5_1"]
SCHEMES = {"Q4_1": "u4:block32:f16:offset", "Q5_0": "q5f:block32:f16", "Q5_1": "u5:block32:f16:offset"}
STORES = ["packed_u32", "native", "packed_native"]
# ggml-common.h: bytes per block of 32, and whether the block has m (f16) and qh (uint32)
LAYOUT = {"Q4_1": (20, True, False), "Q5_0": (22, False, True), "Q5_1": (24, True, True)}


def bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a), dtype=np.float32).view(np.uint32)


def f16_bits(a: Any) -> np.ndarray:
    return np.asarray(a, np.float32).reshape(-1).astype(np.float16).view(np.uint16)


def scheme(type_name: str, store: str = "packed_u32") -> aq.QuantScheme:
    text = SCHEMES[type_name]
    if store != "packed_u32":
        text = text.replace(":offset", f":{store}:offset") if text.endswith(":offset") else f"{text}:{store}"
    return aq.QuantScheme.parse(text)


def parse(raw: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Stored codes ``q`` (blocks, 32), d's f16 bits, m's f16 bits (or None), block by block."""
    size, has_m, has_qh = LAYOUT[type_name]
    data = np.ascontiguousarray(raw, np.uint8).tobytes()
    n = len(data) // size
    codes = np.zeros((n, 32), np.uint8)
    d = np.zeros(n, np.uint16)
    m = np.zeros(n, np.uint16) if has_m else None
    for i in range(n):
        block = data[i * size : (i + 1) * size]
        d[i] = int.from_bytes(block[0:2], "little")
        at = 2
        if m is not None:
            m[i] = int.from_bytes(block[2:4], "little")
            at = 4
        qh = int.from_bytes(block[at : at + 4], "little") if has_qh else 0
        qs = block[-16:]
        for j in range(16):
            codes[i, j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4)
            codes[i, j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)
    return codes, d, m


def data(dist: str, type_name: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{dist}/{type_name}".encode()))
    if dist == "normal":
        return (rng.standard_normal((12, 256)) * 0.02).astype(np.float32)
    if dist == "positive":  # m > 0: the offset carries the block
        return (np.abs(rng.standard_normal((6, 128))) + 0.5).astype(np.float32)
    if dist == "negative":  # Q5_0: the extreme negative, d > 0
        return (-np.abs(rng.standard_normal((6, 128))) - 1).astype(np.float32)
    if dist == "outliers":
        x = rng.standard_normal((8, 256)).astype(np.float32)
        hit = rng.random(x.shape) < 0.02
        x[hit] *= rng.choice([-100.0, 100.0, 1e4], size=int(hit.sum())).astype(np.float32)
        return x
    if dist == "ties":  # multiples of 1/8: many values half way between codes
        return (rng.integers(-64, 65, (8, 256)) / 8).astype(np.float32)
    if dist == "constant":  # d = 0 (Q5_0: -0.0 or +0.0 times code 0), and an all +0.0 block
        values = [0.5, -3.25, 1e-3, 7.0, -1e-5, 0.1, 65504.0, -65504.0, 0.0, 3.0e4, -0.3, 123.456]
        return np.repeat(np.asarray(values, np.float32), 32).reshape(3, 128)
    if dist == "tiny":  # normal f32, d below f16's least subnormal: stored as 0
        return (rng.standard_normal((4, 128)) * np.logspace(-37, -26, 4)[:, None]).astype(np.float32)
    if dist == "multi":  # rows of seven blocks, each its own scale and offset
        x = rng.uniform(-1, 1, (6, 7 * 32)) * np.repeat(np.logspace(-4, 3, 7), 32)
        return (x + np.repeat(rng.normal(size=7) * 10, 32)).astype(np.float32)
    if dist == "3d":
        return rng.standard_normal((2, 3, 64)).astype(np.float32)
    if dist == "signed_zeros":  # all-zero blocks of random signs, and zero (of both signs) the minimum
        zeros = np.where(rng.random((16, 32)) < 0.5, 0.0, -0.0)
        pos = np.where(rng.random((16, 32)) < 0.3, zeros, np.abs(rng.standard_normal((16, 32))))
        return np.concatenate([zeros, pos]).astype(np.float32).reshape(4, -1)
    raise KeyError(dist)


DISTS = ["normal", "positive", "negative", "outliers", "ties", "constant", "tiny", "multi", "3d"]


def gguf_py_file(path: Path, tensors: dict[str, tuple[np.ndarray, str]]) -> None:
    """A GGUF file by gguf-py's own writer: (bytes, type) or (float32 values, "F32"/"F16")."""
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (value, type_name) in tensors.items():
        if type_name in ("F32", "F16"):
            w.add_tensor(name, value)
        else:
            w.add_tensor(name, value, raw_dtype=T[type_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def file_bytes(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """Each tensor's type and stored bytes, as gguf-py's reader finds them."""
    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, np.asarray(t.data).view(np.uint8).reshape(-1).copy()) for t in r.tensors}


def restore(qt: aq.QuantizedTensor, store: str) -> aq.QuantizedTensor:
    """The same codes, scales and offsets in another store of the scheme."""
    target = scheme(gt.type_of(qt.scheme) or "", store)
    values = aq.pack(np.asarray(qt.codes()), target)
    return aq.QuantizedTensor(target, qt.shape, np.float32, values, qt.scales, offset=qt.offset)


def check_tensor(qt: Any, raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> None:
    """``qt`` holds exactly the codes, d and m of ``raw``, in the canonical (packed_u32) store."""
    assert isinstance(qt, aq.QuantizedTensor)
    assert qt.scheme == aq.QuantScheme.parse(SCHEMES[type_name])
    assert qt.scheme.store.kind == "packed_u32"
    assert qt.shape == shape
    want_q, want_d, want_m = parse(raw, type_name)
    codes = np.asarray(qt.codes())
    assert codes.dtype == (np.int8 if type_name == "Q5_0" else np.uint8)
    stored = codes.astype(np.int16) + (16 if type_name == "Q5_0" else 0)  # Q5_0: our code is q - 16
    np.testing.assert_array_equal(stored.reshape(-1, 32), want_q)
    grid = (*shape[:-1], shape[-1] // 32)
    assert qt.scales.shape == grid
    np.testing.assert_array_equal(f16_bits(qt.scales), want_d)  # the sign of d (and of zero) kept
    if want_m is None:
        assert qt.offset is None
    else:
        assert qt.offset.shape == grid
        assert np.asarray(qt.offset).dtype == np.float32
        np.testing.assert_array_equal(f16_bits(qt.offset), want_m)


def sign_of_zero_blocks(x: np.ndarray, type_name: str) -> np.ndarray:
    """Blocks where gguf-py may store another zero than ggml: Q5_0's all-zero block led by -0.0
    (gguf-py's max is that element, ggml's stays +0.0), and Q4_1/Q5_1 blocks whose minimum is a
    zero present with both signs (ggml keeps the first, NumPy's min either)."""
    b = x.reshape(-1, 32)
    zero = b == 0
    neg = zero & np.signbit(b)
    if type_name == "Q5_0":
        return zero.all(axis=1) & neg[:, 0]
    return (b.min(axis=1) == 0) & neg.any(axis=1) & (zero & ~neg).any(axis=1)


# -- 1. calibration="ggml", written by arrayquant: ggml's bytes, and gguf-py's ------------------
@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("dist", [*DISTS, "signed_zeros"])
@pytest.mark.parametrize("type_name", TYPES)
def test_saved_ggml_calibration_is_ggml_quantize_chunk(tmp_path: Path, type_name: str, dist: str, store: str) -> None:
    x = data(dist, type_name)
    qt = aq.quantize(x, scheme(type_name, store), calibration="ggml")
    path = tmp_path / "q.gguf"
    aq.save(path, {"w.weight": qt})
    ((kind, got),) = file_bytes(path).values()
    assert kind == type_name
    want = ggml_oracle.quantize(x, type_name)
    assert got.size == want.size == x.size // 32 * LAYOUT[type_name][0]
    diff = np.flatnonzero((got.reshape(-1, LAYOUT[type_name][0]) != want.reshape(-1, LAYOUT[type_name][0])).any(1))
    assert diff.size == 0, f"{diff.size} blocks differ from ggml, first {diff[:3]}"


@pytest.mark.parametrize("dist", [*DISTS, "signed_zeros"])
@pytest.mark.parametrize("type_name", TYPES)
def test_ggml_calibration_is_gguf_py_quantize(type_name: str, dist: str) -> None:
    x = data(dist, type_name)
    size = LAYOUT[type_name][0]
    kind, raw = gt.encode(aq.quantize(x, SCHEMES[type_name], calibration="ggml"))
    assert kind == type_name
    assert raw.shape == (*x.shape[:-1], x.shape[-1] // 32 * size)
    got = raw.reshape(-1, size)
    want = gguf.quants.quantize(x, T[type_name]).reshape(-1, size)
    odd = sign_of_zero_blocks(x, type_name)
    if dist != "signed_zeros":
        assert not odd.any()
    rows = np.flatnonzero((got != want).any(axis=1) & ~odd)
    assert rows.size == 0, f"{rows.size} blocks differ from gguf-py, first {rows[:3]}"
    # where gguf-py's zero differs, only the f16 sign bits of d (byte 1) and m (byte 3) may
    allowed = np.zeros(size, np.uint8)
    allowed[[1, 3] if LAYOUT[type_name][1] else [1]] = 0x80
    assert not ((got[odd] ^ want[odd]) & ~allowed).any()
    if dist == "signed_zeros":
        assert odd.any()


# -- 2. files gguf-py wrote, read by arrayquant ---------------------------------------------------
def _gguf_py_tensor(tmp_path: Path, type_name: str, dist: str) -> tuple[np.ndarray, np.ndarray, Path]:
    x = data(dist, type_name)
    raw = gguf.quants.quantize(x, T[type_name])
    path = tmp_path / "g.gguf"
    gguf_py_file(path, {"blk.0.ffn_up.weight": (raw, type_name), "b": (x.reshape(-1)[:5].copy(), "F32")})
    return x, raw, path


@pytest.mark.parametrize("dist", [*DISTS, "signed_zeros"])
@pytest.mark.parametrize("type_name", TYPES)
def test_gguf_py_file_reads_exactly(tmp_path: Path, type_name: str, dist: str) -> None:
    x, raw, path = _gguf_py_tensor(tmp_path, type_name, dist)
    ((name, qt, note), _) = list(G.iter_tensors(path))
    assert (name, note) == ("blk.0.ffn_up.weight", "")
    check_tensor(qt, raw, type_name, x.shape)
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf.quants.dequantize(raw, T[type_name])))
    loaded = aq.load(path)
    check_tensor(loaded["blk.0.ffn_up.weight"], raw, type_name, x.shape)


@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("dist", [*DISTS, "signed_zeros"])
@pytest.mark.parametrize("type_name", TYPES)
def test_gguf_py_file_reads_as_ggml_dequantizes(tmp_path: Path, type_name: str, dist: str) -> None:
    x, raw, path = _gguf_py_tensor(tmp_path, type_name, dist)
    qt = aq.load(path)["blk.0.ffn_up.weight"]
    want = ggml_oracle.dequantize(raw, type_name, x.shape)
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(want))  # -0.0 included


@pytest.mark.usefixtures("oracle")
def test_q5_0_reads_with_ggml_negative_scales() -> None:
    # ggml's d = max / -16: a block whose extreme is positive has d < 0, stored with its sign
    x = data("normal", "Q5_0")
    raw = ggml_oracle.quantize(x, "Q5_0")
    qt, why = gt.decode(raw, "Q5_0", x.shape, backend="numpy")
    assert why == ""
    check_tensor(qt, raw, "Q5_0", x.shape)
    assert 0.3 < (np.asarray(qt.scales) < 0).mean() < 0.7
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(ggml_oracle.dequantize(raw, "Q5_0", x.shape)))


# -- 3. round trips --------------------------------------------------------------------------------
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("type_name", TYPES)
def test_read_then_written_is_the_same_bytes(tmp_path: Path, type_name: str, store: str) -> None:
    for dist in ("outliers", "constant", "signed_zeros"):
        _, raw, path = _gguf_py_tensor(tmp_path, type_name, dist)
        loaded = aq.load(path)
        loaded["blk.0.ffn_up.weight"] = restore(loaded["blk.0.ffn_up.weight"], store)
        out = tmp_path / "o.gguf"
        aq.save(out, loaded)
        back = file_bytes(out)
        assert back["blk.0.ffn_up.weight"][0] == type_name
        assert back["blk.0.ffn_up.weight"][1].tobytes() == raw.tobytes()
        assert back["b"][1].tobytes() == file_bytes(path)["b"][1].tobytes()


@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("type_name", TYPES)
def test_ggml_bytes_back_to_the_same_bytes_from_every_store(tmp_path: Path, type_name: str) -> None:
    x = np.concatenate([data("multi", type_name)[:, :192], data("signed_zeros", type_name)[:, :192]])
    raw = ggml_oracle.quantize(x, type_name)
    path = tmp_path / "l.gguf"
    gguf_py_file(path, {"w": (raw, type_name)})
    qt = aq.load(path)["w"]
    check_tensor(qt, raw, type_name, x.shape)
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(ggml_oracle.dequantize(raw, type_name, x.shape)))
    for store in STORES:
        other = restore(qt, store)
        assert other.scheme.store.kind == store
        np.testing.assert_array_equal(bits(aq.dequantize(other)), bits(aq.dequantize(qt)))
        assert gt.encode(other)[1].tobytes() == raw.tobytes()
        G.save(tmp_path / "s.gguf", {"w": other})
        assert file_bytes(tmp_path / "s.gguf")["w"][1].tobytes() == raw.tobytes()


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("type_name", TYPES)
def test_minmax_tensors_written_read_back_exactly(tmp_path: Path, type_name: str, store: str) -> None:
    # arrayquant's own (MinMax) codes, d and m: gguf-py's values are aq.dequantize's, and they read back
    x = data("multi", type_name)
    qt = aq.quantize(x, scheme(type_name, store))
    G.save(tmp_path / "m.gguf", {"w": qt})
    kind, raw = file_bytes(tmp_path / "m.gguf")["w"]
    assert kind == type_name
    values = gguf.quants.dequantize(raw.reshape(x.shape[0], -1), T[type_name])
    np.testing.assert_array_equal(bits(values), bits(aq.dequantize(qt)))
    back = G.load(tmp_path / "m.gguf")["w"]
    check_tensor(back, raw, type_name, x.shape)
    np.testing.assert_array_equal(np.asarray(back.codes()), np.asarray(qt.codes()))


# -- 4. hostile input ------------------------------------------------------------------------------
def _block(type_name: str, d: float, m: float, q: list[int]) -> np.ndarray:
    """One block built from its definition (struct, little-endian), codes ``q`` as stored."""
    _, has_m, has_qh = LAYOUT[type_name]
    out = struct.pack("<e", d) + (struct.pack("<e", m) if has_m else b"")
    if has_qh:
        out += struct.pack("<I", sum(((v >> 4) & 1) << j for j, v in enumerate(q)))
    out += bytes((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4) for j in range(16))
    return np.frombuffer(out, np.uint8)


@pytest.mark.parametrize("type_name", TYPES)
def test_truncated_bytes_and_files(tmp_path: Path, type_name: str) -> None:
    size = LAYOUT[type_name][0]
    raw = np.tile(_block(type_name, 0.5, -1.0, list(range(16)) * 2), 4)
    with pytest.raises(
        CorruptDataError,
        match=rf"^{type_name} tensor of shape \(2, 64\) takes 4 blocks of {size} bytes \({4 * size} bytes\), "
        rf"but the data holds {4 * size - 1}$",
    ):
        gt.decode(raw[:-1], type_name, (2, 64))
    path = tmp_path / "t.gguf"
    G.save(path, {"w": gt.decode(raw, type_name, (2, 64))[0]})
    whole = path.read_bytes()
    path.write_bytes(whole[:-33])  # past gguf-py's padding (to 32 bytes) into the blocks
    with pytest.raises(CorruptDataError, match=r"tensor 'w' claims bytes .* past the end of the \d+-byte file"):
        aq.load(path)


@pytest.mark.parametrize("type_name", TYPES)
def test_rows_that_are_not_whole_blocks(tmp_path: Path, type_name: str) -> None:
    with pytest.raises(ShapeError, match=rf"^{type_name} tensor of shape \(2, 48\): the last axis \(48\) must be"):
        gt.decode(np.zeros(2 * LAYOUT[type_name][0], np.uint8), type_name, (2, 48))
    qt = aq.quantize(data("normal", type_name)[:2, :48], SCHEMES[type_name])
    with pytest.raises(ShapeError, match=rf"^{type_name} tensor of shape \(2, 48\): the last axis \(48\) must be"):
        gt.encode(qt)
    with pytest.raises(ShapeError, match=rf"tensor 'w': {type_name} needs rows of whole 32-value blocks"):
        G.save(tmp_path / "x.gguf", {"w": qt})


NOT_EXACT = [
    ("Q4_1", "inf", "d = inf; arrayquant's scales and offsets are finite"),
    ("Q4_1", "nan_m", "m = nan; arrayquant's scales and offsets are finite"),
    (
        "Q4_1",
        "negative",
        "d = -0.5: arrayquant's offset-mode scales are >= 0 (ggml writes d = (max - min) / qmax, never negative)",
    ),
    ("Q5_1", "inf_m", "m = -inf; arrayquant's scales and offsets are finite"),
    (
        "Q5_1",
        "negative",
        "d = -0.5: arrayquant's offset-mode scales are >= 0 (ggml writes d = (max - min) / qmax, never negative)",
    ),
    ("Q5_0", "inf", "d = inf; arrayquant scales are finite"),
]


@pytest.mark.parametrize(("type_name", "case", "why"), NOT_EXACT)
def test_blocks_that_are_no_arrayquant_tensor(tmp_path: Path, type_name: str, case: str, why: str) -> None:
    q = [(7 * j) % 32 if type_name != "Q4_1" else (7 * j) % 16 for j in range(32)]
    d, m = {"inf": (np.inf, 1.0), "nan_m": (0.5, np.nan), "inf_m": (0.5, -np.inf), "negative": (-0.5, 1.0)}[case]
    good = _block(type_name, 0.25, -2.0, q)
    raw = np.concatenate([good, good, good, _block(type_name, d, m, q)])
    assert gt.decode(raw, type_name, (2, 64)) == (None, f"{type_name} block 3 (row (1,), block 1 of the row) has {why}")
    path = tmp_path / "n.gguf"
    gguf_py_file(path, {"w": (raw.reshape(2, -1), type_name)})
    ((_, value, note),) = list(G.iter_tensors(path))
    assert isinstance(value, np.ndarray)
    assert note == f"{type_name} read as float32 values: {type_name} block 3 (row (1,), block 1 of the row) has {why}"
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw.reshape(2, -1), T[type_name])
    np.testing.assert_array_equal(bits(value), bits(want))


def test_q5_0_negative_d_and_negative_zero_are_exact() -> None:
    q = [0, 31, 16, 15, 17] + list(range(27))
    for d in (-0.75, -0.0):
        raw = _block("Q5_0", d, 0.0, q)
        qt, why = gt.decode(raw, "Q5_0", (32,), backend="numpy")
        assert why == ""
        np.testing.assert_array_equal(np.asarray(qt.codes()), np.array(q) - 16)
        np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf.quants.dequantize(raw, T.Q5_0)))


@pytest.mark.parametrize("type_name", ["Q4_1", "Q5_1"])
def test_offset_zero_signs_are_kept(type_name: str) -> None:
    # d = -0.0 (>= 0, as f16 bits 0x8000) and m = -0.0: the values are ggml's and gguf-py's, -0.0 included
    raw = np.concatenate([_block(type_name, -0.0, -0.0, [0] * 32), _block(type_name, 0.0, -0.0, [3] * 32)])
    qt, why = gt.decode(raw, type_name, (64,), backend="numpy")
    assert why == ""
    check_tensor(qt, raw, type_name, (64,))
    np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(gguf.quants.dequantize(raw, T[type_name])))
    assert gt.encode(qt)[1].tobytes() == raw.tobytes()


def test_encode_refuses_tensors_that_do_not_fit() -> None:
    x = data("normal", "Q4_1")[:2, :64]
    qt = aq.quantize(x, "q4_1")
    no_m = aq.QuantizedTensor(qt.scheme, qt.shape, np.float32, qt.values, qt.scales)
    with pytest.raises(ParamsError, match=r"is in offset mode \(x = d \* q \+ m\) but qt\.offset is None"):
        gt.encode(no_m)
    with pytest.raises(ShapeError, match=r"qt\.offset has shape \(2, 1\) but scheme u4:block32:f16:offset"):
        gt.encode(aq.QuantizedTensor(qt.scheme, qt.shape, np.float32, qt.values, qt.scales, offset=qt.offset[:, :1]))
    off_grid = np.asarray(qt.offset) + np.float32(1e-4)
    with pytest.raises(ParamsError, match=r"is not a stored F16 value"):
        gt.encode(aq.QuantizedTensor(qt.scheme, qt.shape, np.float32, qt.values, qt.scales, offset=off_grid))
    with pytest.raises(ParamsError, match=r"qt\.scales has 4 invalid entries"):
        gt.encode(aq.QuantizedTensor(qt.scheme, qt.shape, np.float32, qt.values, -qt.scales, offset=qt.offset))
    with pytest.raises(aq.SchemeError, match=r"^scheme u4:block32:f16:offset maps to GGUF Q4_1, not 'Q5_1'$"):
        gt.encode(qt, "Q5_1")


def test_fuzz_affine_blocks() -> None:
    """Any bytes as Q4_1 / Q5_0 / Q5_1: a tensor whose values are gguf-py's, a reason, or a typed error."""
    rng = np.random.default_rng(23)
    for i in range(600):
        type_name = TYPES[i % 3]
        size = LAYOUT[type_name][0]
        n = int(rng.integers(1, 4)) * size + (int(rng.integers(-1, 2)) if i % 5 == 0 else 0)
        raw = rng.integers(0, 256, n, dtype=np.uint8)
        if i % 2:  # mostly finite, non-negative d and finite m
            blocks = raw[: n // size * size].reshape(-1, size)
            blocks[:, 1] &= 0x3F
            if LAYOUT[type_name][1]:
                blocks[:, 3] &= 0xBF
        try:
            qt, why = gt.decode(raw, type_name, (n // size * 32,), backend="numpy")
        except QuantizationError:
            assert n % size or n < size
            continue
        assert (qt is None) != (why == "")
        if qt is not None:
            with np.errstate(all="ignore"):
                want = gguf.quants.dequantize(raw, T[type_name])
            np.testing.assert_array_equal(bits(aq.dequantize(qt)), bits(want))
            assert gt.encode(qt)[1].tobytes() == raw.tobytes()


# -- 5. aq.quantize_file into GGUF: llama-quantize's bytes ---------------------------------------
SHAPES = {
    "token_embd.weight": (40, 256),
    "blk.0.attn_q.weight": (64, 256),
    "blk.0.ffn_down.weight": (24, 224),
    "blk.0.ffn_gate.weight": (16, 48),  # not whole 32-blocks: llama-quantize's fallback, F16
}


@pytest.mark.usefixtures("oracle")
@pytest.mark.parametrize("dtype", ["F32", "F16"])
@pytest.mark.parametrize("type_name", TYPES)
def test_quantize_file_writes_llama_quantize_bytes(tmp_path: Path, type_name: str, dtype: str) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{type_name}{dtype}".encode()))
    src, dst = tmp_path / "m.gguf", tmp_path / "q.gguf"
    values, tensors = {}, {}
    for name, shape in SHAPES.items():
        x = (rng.standard_t(4, shape) * 0.05 + (0.02 if type_name != "Q5_0" else 0)).astype(np.float32)
        stored = x.astype(np.float16) if dtype == "F16" else x
        tensors[name] = (stored, dtype)
        values[name] = stored.astype(np.float32)
    tensors["blk.0.attn_norm.weight"] = (np.ones(256, np.float32), "F32")
    gguf_py_file(src, tensors)
    summary = aq.quantize_file(src, dst, type_name.lower(), pure=True)  # llama-quantize --pure
    assert summary.stored_as == type_name
    assert summary.fallback == {"blk.0.ffn_gate.weight": "F16"}
    got = file_bytes(dst)
    for name, x in values.items():
        kind, raw = got[name]
        if x.shape[-1] % 32:
            assert kind == "F16"
            assert raw.tobytes() == x.astype("<f2").tobytes()
            continue
        assert kind == type_name, name
        assert raw.tobytes() == ggml_oracle.quantize(x, type_name).tobytes(), name
    assert got["blk.0.attn_norm.weight"][0] == "F32"
    r = gguf.GGUFReader(str(dst))
    assert r.fields["general.file_type"].contents() == int(getattr(gguf.LlamaFileType, f"MOSTLY_{type_name}"))
    loaded = aq.load(dst)
    check_tensor(loaded["blk.0.attn_q.weight"], got["blk.0.attn_q.weight"][1], type_name, SHAPES["blk.0.attn_q.weight"])


@pytest.mark.usefixtures("oracle")
def test_cli_quantize_to_q5_1_is_llama_quantize(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = data("multi", "Q5_1")
    src, dst = tmp_path / "m.gguf", tmp_path / "q.gguf"
    gguf_py_file(src, {"blk.0.attn_k.weight": (x, "F32")})
    assert main(["quantize", str(src), str(dst), "--scheme", "q5_1", "--quiet"]) == 0
    capsys.readouterr()
    kind, raw = file_bytes(dst)["blk.0.attn_k.weight"]
    assert kind == "Q5_1"
    assert raw.tobytes() == ggml_oracle.quantize(x, "Q5_1").tobytes()
