"""Weights quantized a row slab at a time (``io/ct_stream.py``) and the reader's slab and pass-through access.

The oracle for the slab path is the whole-tensor path: ``write_weight(quantize(x))``, itself
checked against the real compressed-tensors in ``test_ct_float.py``, ``test_ct_int.py`` and
``test_compressed_tensors.py``. Slabs are forced small so every case spans many of them, and the
data puts the largest block of the tensor in the last slab, where a per-slab global scale would
differ from the tensor's.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import CorruptDataError, NonFiniteInputError, ShapeError
from arrayquant.io.arrayquant.checkpoint import save_stream
from arrayquant.io.compressed_tensors.schemes import write_weight
from arrayquant.io.compressed_tensors.stream import quantize_entry
from arrayquant.io.safetensors.reader import SafetensorsFile

ml_dtypes = pytest.importorskip("ml_dtypes")

SCHEMES = [
    "nvfp4",
    "mxfp8",
    "mxfp4",
    "q4s:block32:bf16",
    "q8s:block128:f32",
    "q8s",  # one scale for the tensor
    "q4f:block1x64:f16",
    "e4m3:tensor:f32:native",
    "e4m3:block128x128:f32:native",  # 2-d blocks: slabs of whole block rows
    "e4m3:block32x64:bf16:native",
    "e4m3:block4096:bf16:native",  # one scale per row
    "u4:block32:bf16:zero_point",  # zero points packed down the rows: slabs of whole words of them
    "q3f:block64:f16:zero_point",  # 3-bit fields: 32 rows of zero points fill 3 words
    "u8:block4096:f32:zero_point",  # one zero point per row
    "q5s:zero_point",  # one zero point for the tensor
    "q6f:block32:bf16",  # symmetric, 6-bit fields crossing words
]


def _data(shape: tuple[int, int], dist: str, dtype: object) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(repr((shape, dist)).encode()))
    x = rng.standard_normal(shape).astype(np.float32)
    if dist == "heavy":
        x = (rng.standard_t(2, shape) * 3).astype(np.float32)
    x[-1, -1] = 40.0  # the tensor's largest value in its last row: the global scale comes from the last slab
    x[shape[0] // 2] = 0.0  # a row of zeros
    return x.astype(dtype)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
    ("shape", "dist", "dtype"),
    [((300, 256), "normal", np.float32), ((257, 128), "heavy", ml_dtypes.bfloat16), ((130, 64), "normal", np.float16)],
)
def test_slabs_give_the_whole_tensor_bits(
    tmp_path: Path, scheme: str, shape: tuple[int, int], dist: str, dtype: object
) -> None:
    x = _data(shape, dist, dtype)
    path = tmp_path / "w.safetensors"
    save_stream(path, iter([("m.weight", x)]))
    want = write_weight(aq.quantize(x, scheme), "m")
    with SafetensorsFile(path) as st:
        for slab_bytes in (1, 3000, 40_000):  # one row (or block row) per slab, a few, about half
            got = quantize_entry(st, "m.weight", aq.QuantScheme.parse(scheme), "m", slab_bytes=slab_bytes)
            assert list(got) == list(want)
            for key, arr in want.items():
                assert got[key].dtype == arr.dtype, key
                assert got[key].shape == arr.shape, key
                assert got[key].tobytes() == arr.tobytes(), (key, slab_bytes)


def test_slabs_raise_as_the_whole_tensor(tmp_path: Path) -> None:
    x = np.ones((64, 32), np.float32)
    x[50, 3] = np.nan
    path = tmp_path / "w.safetensors"
    save_stream(path, iter([("a.weight", x), ("b.weight", np.ones((8, 20), np.float32))]))
    with SafetensorsFile(path) as st:
        for scheme in ("nvfp4", "mxfp8", "q8s"):
            with pytest.raises(NonFiniteInputError, match="NaN"):
                quantize_entry(st, "a.weight", aq.QuantScheme.parse(scheme), "a", slab_bytes=1)
        with pytest.raises(ShapeError, match="multiple of 32"):  # 20 columns: no whole MX group
            quantize_entry(st, "b.weight", aq.QuantScheme.mxfp8(), "b", slab_bytes=1)


def _file(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    arrays = {
        "f": rng.standard_normal((7, 3, 2)).astype(np.float32),
        "b": rng.standard_normal((5, 4000)).astype(ml_dtypes.bfloat16),  # past the file buffer
        "i": np.arange(6, dtype=np.int64).reshape(6, 1),
        "s": np.array(2.5, np.float32),
        "z": np.zeros((0, 4), np.float16),
    }
    path = tmp_path / "a.safetensors"
    save_stream(path, iter(arrays.items()))
    return path, arrays


def test_rows_read_a_slab_as_array_types_it(tmp_path: Path) -> None:
    path, arrays = _file(tmp_path)
    with SafetensorsFile(path) as st:
        for name in ("f", "b", "i", "z"):
            whole = arrays[name]
            for start, stop in ((0, 2), (2, 5), (4, 100), (0, len(whole)), (3, 3)):
                got = st.rows(name, start, stop)
                assert got.dtype == whole.dtype
                assert got.shape == whole[start:stop].shape
                assert got.tobytes() == whole[start:stop].tobytes()
        with pytest.raises(ShapeError, match=r"entry 's' is 0-d; it has no rows"):
            st.rows("s", 0, 1)


def test_passthrough_copies_entries_as_stored(tmp_path: Path) -> None:
    path, arrays = _file(tmp_path)
    out = tmp_path / "b.safetensors"
    with SafetensorsFile(path) as st:
        save_stream(out, ((name, st.passthrough(name)) for name in st.entries))
    with SafetensorsFile(out) as st:
        assert sorted(st.entries) == sorted(arrays)
        for name, want in arrays.items():
            got = st.array(name)
            assert got.dtype == want.dtype
            assert got.shape == want.shape
            assert got.tobytes() == want.tobytes()


def test_truncated_source_is_corrupt(tmp_path: Path) -> None:
    path, _ = _file(tmp_path)
    st = SafetensorsFile(path)
    try:
        cut = st.entries["b"].stop - 4
        path.write_bytes(path.read_bytes()[:cut])  # cut inside 'b' while open: the header was read whole
        with pytest.raises(CorruptDataError, match=r"entry 'b' is cut short; the file was truncated"):
            save_stream(tmp_path / "c.safetensors", iter([("b", st.passthrough("b"))]))
        with pytest.raises(CorruptDataError, match=r"entry 'b' is cut short; the file was truncated"):
            st.rows("b", 0, 5)
        assert not (tmp_path / "c.safetensors").exists()
    finally:
        st.close()


SEARCHED = [
    (scheme, calibration)
    for scheme in ("mxfp4", "q4s:block32:f16", "nvfp4", "e4m3:tensor:f32:native")
    for calibration in ("mse", "4over6", "percentile:99")
    if calibration != "4over6" or scheme == "nvfp4"  # 4over6 is for E2M1 values with UE4M3 block scales
]


@pytest.mark.parametrize(("scheme", "calibration"), SEARCHED)
def test_searched_calibrations_give_the_whole_tensor_bits(tmp_path: Path, scheme: str, calibration: str) -> None:
    """Blocks lie within a slab, so a per-block search matches the whole tensor's; a per-tensor or two-level
    search reads the tensor whole."""
    x = _data((300, 256), "heavy", np.float32)
    imp = np.random.default_rng(4).uniform(0, 2, 256).astype(np.float32)
    path = tmp_path / "w.safetensors"
    save_stream(path, iter([("m.weight", x)]))
    weights = {"importance": imp} if calibration != "percentile:99" else {}
    want = write_weight(aq.quantize(x, scheme, calibration=calibration, **weights), "m")
    with SafetensorsFile(path) as st:
        got = quantize_entry(
            st, "m.weight", aq.QuantScheme.parse(scheme), "m", slab_bytes=3000, calibration=calibration, **weights
        )
    assert list(got) == list(want)
    for key, arr in want.items():
        assert got[key].tobytes() == arr.tobytes(), key
