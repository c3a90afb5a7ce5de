"""Importance files for ``--importance``: safetensors vectors and llama.cpp's imatrix GGUF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from arrayquant.errors import CorruptDataError, DTypeError, NonFiniteInputError, ParamsError, ShapeError
from arrayquant.io.importance import check_importance, load_importance

W = "blk.0.attn_q.weight"


def _imatrix(path: Path, entries: dict[str, tuple[np.ndarray, np.ndarray]], *, extra: bool = False) -> Path:
    """An imatrix GGUF laid out as llama-imatrix writes it: in_sum2 [nmat, n], counts [nmat, 1]."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), arch="imatrix")
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["calibration.txt"])
    w.add_uint32("imatrix.chunk_count", 3)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in entries.items():
        w.add_tensor(name + ".in_sum2", sums.astype(np.float32))
        w.add_tensor(name + ".counts", counts.astype(np.float32))
        if extra:  # newer llama.cpp also stores the plain sums, which importance does not use
            w.add_tensor(name + ".in_sum", np.ones_like(sums, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_safetensors_vectors_are_read_as_float32(tmp_path: Path) -> None:
    v = np.array([0.0, 0.5, 2.0, 1e-3], np.float64)
    path = tmp_path / "imp.safetensors"
    save_file({"a.weight": v, "b.weight": np.array([1.0, 3.0], np.float16)}, str(path))
    got = load_importance(path)
    assert list(got) == ["a.weight", "b.weight"]
    assert got["a.weight"].dtype == np.float32
    np.testing.assert_array_equal(got["a.weight"], v.astype(np.float32))
    np.testing.assert_array_equal(got["b.weight"], np.array([1.0, 3.0], np.float32))


@pytest.mark.parametrize("extra", [False, True])
def test_imatrix_gguf_gives_mean_squared_activation(tmp_path: Path, extra: bool) -> None:
    sums = np.array([[0.0, 3.0, 12.0, 6.0]], np.float32)  # sum over 3 tokens of x_j^2
    path = _imatrix(tmp_path / "imatrix.gguf", {W: (sums, np.array([[3.0]]))}, extra=extra)
    got = load_importance(path)
    assert list(got) == [W]
    np.testing.assert_array_equal(got[W], np.array([0.0, 1.0, 4.0, 2.0], np.float32))


def test_imatrix_per_expert_entries_are_refused(tmp_path: Path) -> None:
    path = _imatrix(tmp_path / "moe.gguf", {"blk.0.ffn_up_exps.weight": (np.ones((4, 8)), np.ones((4, 1)))})
    with pytest.raises(ShapeError, match=r"holds 4 matrices \(a mixture of experts\); only dense weights"):
        load_importance(path)


def test_imatrix_without_counts_is_refused(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "half.gguf"
    w = gguf.GGUFWriter(str(path), arch="imatrix")
    w.add_tensor(W + ".in_sum2", np.ones((1, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CorruptDataError, match=r"without both \.in_sum2 and \.counts: 'blk\.0\.attn_q\.weight'"):
        load_importance(path)


def test_imatrix_with_zero_tokens_is_refused(tmp_path: Path) -> None:
    path = _imatrix(tmp_path / "zero.gguf", {W: (np.zeros((1, 4)), np.zeros((1, 1)))})
    with pytest.raises(ParamsError, match=r"counts 0\.0 tokens; it needs at least one"):
        load_importance(path)


def test_gguf_that_is_no_imatrix_is_refused(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tensor(W, np.ones((2, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CorruptDataError, match=r"GGUF file without imatrix tensors"):
        load_importance(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_importance(tmp_path / "nope.safetensors")


def test_legacy_dat_is_refused_with_the_conversion(tmp_path: Path) -> None:
    path = tmp_path / "imatrix.dat"
    path.write_bytes((1).to_bytes(4, "little") + bytes(40))  # what an old .dat starts with
    with pytest.raises(CorruptDataError, match=r"llama-imatrix --in-file imatrix\.dat -o imatrix\.gguf"):
        load_importance(path)


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (np.array([1.0, np.nan, 2.0]), NonFiniteInputError, r"holds 1 NaN or infinite values \(first at column 1\)"),
        (np.array([np.inf, 1.0]), NonFiniteInputError, r"holds 1 NaN or infinite values \(first at column 0\)"),
        (np.array([1.0, 0.0, -0.5, -2.0]), ParamsError, r"holds 2 negative values \(column 2: -0\.5\)"),
    ],
)
def test_bad_values(tmp_path: Path, bad: np.ndarray, error: type[Exception], message: str) -> None:
    path = tmp_path / "imp.safetensors"
    save_file({"w": bad.astype(np.float32)}, str(path))
    with pytest.raises(error, match=message):
        load_importance(path)


def test_negative_imatrix_sum_is_refused(tmp_path: Path) -> None:
    path = _imatrix(tmp_path / "neg.gguf", {W: (np.array([[1.0, -3.0]]), np.array([[1.0]]))})
    with pytest.raises(ParamsError, match=r"holds 1 negative values \(column 1: -3\.0\)"):
        load_importance(path)


def test_vector_not_1d_or_not_float(tmp_path: Path) -> None:
    path = tmp_path / "imp.safetensors"
    save_file({"w": np.ones((2, 3), np.float32)}, str(path))
    with pytest.raises(ShapeError, match=r"'w' .* has shape \[2, 3\]; it must be 1-D"):
        load_importance(path)
    save_file({"w": np.ones(3, np.int32)}, str(path))
    with pytest.raises(DTypeError, match=r"'w' .* is I32; it must be floating point"):
        load_importance(path)


def test_check_names_and_lengths() -> None:
    shapes = {"a.weight": (8, 4), "a.bias": (8,)}
    check_importance({"a.weight": np.ones(4, np.float32)}, shapes, "imp")  # fits: no error
    with pytest.raises(ParamsError, match=r"1 of the 2 importance vectors of imp name no tensor .*: 'blk\.0\.x'"):
        check_importance({"a.weight": np.ones(4), "blk.0.x": np.ones(4)}, shapes, "imp")
    many = {f"n{i}": np.ones(1) for i in range(12)}
    with pytest.raises(ParamsError, match=r"'n9' and 2 more; the names must be the checkpoint's"):
        check_importance(many, shapes, "imp")
    with pytest.raises(ShapeError, match=r"has 8 values but the weight is \[8, 4\]: it needs one per input column, 4"):
        check_importance({"a.weight": np.ones(8)}, shapes, "imp")
