"""Dask: block-aligned chunk tasks, laziness, global reductions, streaming saves, threads and a cluster.

Every result is checked against the NumPy oracle (codes, stored scales, global, dequantized values)
and against the eager NumPy path, whatever the input chunking; the graph is checked for what it
promises: chunks cut at whole blocks and words, one task per chunk and step, nothing computed
before the caller asks, and after the global pass every output chunk depending on its own input
chunk only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends import dask_graph
from arrayquant.invariants import plan_for
from arrayquant.io import regions
from arrayquant.storage import pack_unit

from .oracle import Case
from .test_conformance import check, weights

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

CASES = [
    Case("q8s", None, "f32", False, "packed_u32", 0),
    Case("q8s", (32,), "f16", False, "native", 0),
    Case("q4s", (32,), "f16", False, "packed_u32", 0),
    Case("q2f", (5,), "bf16", False, "packed_u32", 1),  # packs axis 0: chunks there hold whole words
    Case("e2m1", (16,), "ue4m3", True, "packed_u32", 0),  # NVFP4's shape: a global reduction
    Case("e2m1", (16,), "ue4m3", True, "packed_native", 0),
    Case("e4m3", (4, 8), "ue8m0", False, "native", 0),  # 2-D blocks
    Case("q4f", (3, 7), "f16", True, "packed_u32", 0),  # two-level with partial 2-D blocks
]
CHUNKS = [(13, 37), (1, 100), (70, 100), (64, 32)]


def lazy(x: np.ndarray, chunks: Any) -> Any:
    return da.from_array(x, chunks=chunks)


def host(a: Any) -> np.ndarray:
    return np.asarray(a.compute() if isinstance(a, da.Array) else a)


def same(qd: aq.QuantizedTensor, qa: aq.QuantizedTensor) -> None:
    np.testing.assert_array_equal(host(qd.values), qa.values)
    np.testing.assert_array_equal(host(qd.scales), qa.scales)
    if qa.global_scale is None:
        assert qd.global_scale is None
    else:
        np.testing.assert_array_equal(host(qd.global_scale), qa.global_scale)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.text)
@pytest.mark.parametrize("chunks", CHUNKS, ids=str)
def test_any_chunking_matches_the_oracle_and_numpy(case: Case, chunks: tuple[int, int]) -> None:
    x = weights((70, 100), seed=3)
    qd = aq.quantize(lazy(x, chunks), case.text)
    assert isinstance(qd.values, da.Array)
    assert isinstance(qd.scales, da.Array)
    check(qd, x, case)
    same(qd, aq.quantize(x, case.text))
    np.testing.assert_array_equal(host(aq.dequantize(qd)), aq.dequantize(aq.quantize(x, case.text)))


ODD = ["q3f:block8:f16:packed_u32:1", "u5:block4x16:f16:offset:packed_u32:1", "u3:block8:f32:zero_point:packed_native"]


@pytest.mark.parametrize("text", [c.text for c in CASES] + ODD)
def test_chunks_hold_whole_blocks_and_words(text: str) -> None:
    x = weights((70, 100), seed=4)
    qd = aq.quantize(lazy(x, (13, 37)), text)
    plan = plan_for(aq.QuantScheme.parse(text))
    dims = plan.block_dims(2) or (1, 1)
    per, words = pack_unit(plan)
    axis = plan.packed_axis(2)
    data_chunks = []
    for a, sizes in enumerate(qd.values.chunks):
        assert a != axis or all(n % words == 0 for n in sizes[:-1]), (a, sizes)
        fields = [n * per // words for n in sizes] if a == axis else list(sizes)
        unit = np.lcm(dims[a], per) if a == axis else dims[a]
        assert all(n % unit == 0 for n in fields[:-1]), (a, sizes)
        data_chunks.append(fields)
    if plan.block is not None:
        for a, sizes in enumerate(qd.scales.chunks):
            assert list(sizes[:-1]) == [n // dims[a] for n in data_chunks[a][:-1]]
        assert qd.scales.numblocks == qd.values.numblocks


def test_one_task_per_chunk_and_step() -> None:
    x = weights((256, 256), seed=5)
    qd = aq.quantize(lazy(x, (64, 64)), "q8s:block32:f16")
    n_chunks = 16
    graph = dict(qd.values.__dask_graph__())
    # the input, one task making a chunk's values and scales, one picking the values: no explosion
    assert len(graph) <= 3 * n_chunks + 4, len(graph)
    y = aq.dequantize(qd)
    assert len(dict(y.__dask_graph__())) <= 5 * n_chunks + 4  # + picking the scales, + decoding


def test_values_and_scales_come_from_one_read_of_each_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    from arrayquant import lazy as lazy_module

    calls: list[Any] = []
    original = lazy_module._Chunked.fused

    def counting(self: Any, xc: Any, table: Any, block_id: tuple[int, ...] = ()) -> Any:
        calls.append(block_id)
        return original(self, xc, table, block_id)

    monkeypatch.setattr(lazy_module._Chunked, "fused", counting)
    x = weights((256, 256), seed=24)
    qd = aq.quantize(lazy(x, (64, 128)), "q4s:block32:f16")
    with dask.config.set(scheduler="sync"):
        values, scales = dask.compute(qd.values, qd.scales)
    assert sorted(calls) == [(i, j) for i in range(4) for j in range(2)]  # each chunk once
    eager = aq.quantize(x, "q4s:block32:f16")
    np.testing.assert_array_equal(values, eager.values)
    np.testing.assert_array_equal(scales, eager.scales)


def _counting_scheduler(calls: list[Any]) -> Any:
    def get(dsk: Any, keys: Any, **kw: Any) -> Any:
        calls.append(keys)
        return dask.get(dsk, keys, **kw)

    return get


@pytest.mark.parametrize(
    "text", ["q8s", "q8s:native", "nvfp4", "mxfp4", "q4s:block32:f16", "q4f:block16:f16:native:lookup"]
)
def test_nothing_is_computed_until_asked(text: str) -> None:
    x = lazy(weights((64, 64), seed=6), (32, 32))
    table = da.from_array(np.asarray(aq.NF4, np.float32), chunks=8) if "lookup" in text else None
    calls: list[Any] = []
    with dask.config.set(scheduler=_counting_scheduler(calls)):
        qt = aq.quantize(x, text, table=table)
        y = aq.dequantize(qt)
        given = aq.quantize(x, text, aq.QParams(qt.scales, qt.global_scale, qt.table))
        assert calls == []
        assert isinstance(y, da.Array)
        assert isinstance(given.values, da.Array)
    eager = aq.quantize(np.asarray(x), text, table=None if table is None else np.asarray(aq.NF4, np.float32))
    same(qt, eager)
    same(given, eager)
    np.testing.assert_array_equal(host(y), aq.dequantize(eager))


def test_absmean_per_tensor_matches_numpy() -> None:
    x = weights((48, 96), seed=7)
    qd = aq.quantize(lazy(x, (10, 50)), "q4s:native", calibration="absmean")
    same(qd, aq.quantize(x, "q4s:native", calibration="absmean"))


def test_static_params_with_misaligned_scale_chunks() -> None:
    x = weights((64, 96), seed=8)
    eager = aq.quantize(x, "q4s:block32:f16")
    scales = da.from_array(np.asarray(eager.scales), chunks=(5, 2))  # nothing like the data's chunks
    qd = aq.quantize(lazy(x, (20, 40)), "q4s:block32:f16", aq.QParams(scales))
    same(qd, eager)


def test_global_pass_leaves_each_chunk_on_its_own_input() -> None:
    x = lazy(weights((128, 128), seed=9), (32, 128))
    qt = aq.quantize(x, "nvfp4")
    before = dict(qt.values.__dask_graph__())
    # before the global pass, one values chunk needs every input chunk (through the global)
    first = next(iter(dask.core.flatten(qt.values.__dask_keys__())))
    assert _input_chunks(before, first, x.name) == 4
    (values,), (glob,) = dask_graph.resolve([qt.values], [qt.global_scale])
    np.testing.assert_array_equal(glob, host(qt.global_scale))
    after = dict(values.__dask_graph__())
    for key in dask.core.flatten(values.__dask_keys__()):
        assert _input_chunks(after, key, x.name) == 1
    np.testing.assert_array_equal(host(values), host(qt.values))


def _input_chunks(graph: dict[Any, Any], key: Any, name: str) -> int:
    from dask.optimization import cull

    culled, _ = cull(graph, [key])
    return sum(1 for k in culled if isinstance(k, tuple) and k[0] == name)


def test_nonfinite_names_the_chunk_and_the_index() -> None:
    x = weights((40, 64), seed=10)
    x[27, 50] = np.nan
    for text in ("q8s:block32:f16", "nvfp4", "q8s", "q8s:native"):
        qt = aq.quantize(lazy(x, (10, 32)), text)
        with pytest.raises(
            aq.NonFiniteInputError,
            match=r"x has 1 non-finite element\(s\) in its chunk starting at \(20, 32\), found when the dask "
            r"graph ran \(first at index \(27, 50\): nan\); .*check_finite=False",
        ):
            qt.values.compute()
    unchecked = aq.quantize(lazy(x, (10, 32)), "q8s:block32:f16", check_finite=False)
    same(unchecked, aq.quantize(x, "q8s:block32:f16", check_finite=False))


def test_nonfinite_with_static_params_and_absmean() -> None:
    x = weights((16, 64), seed=11)
    x[9, 3] = np.inf
    params = aq.QParams(da.from_array(np.full((16, 2), 0.01, np.float32)))
    for qt in (
        aq.quantize(lazy(x, (8, 64)), "q8s:block32:f32", params),
        aq.quantize(lazy(x, (8, 64)), "q8s:native", calibration="absmean"),
    ):
        with pytest.raises(aq.NonFiniteInputError, match=r"chunk starting at \(8, 0\).*first at index \(9, 3\): inf"):
            qt.values.compute()


def test_threaded_scheduler() -> None:
    x = weights((256, 192), seed=12)
    with dask.config.set(scheduler="threads", num_workers=2):
        qd = aq.quantize(lazy(x, (64, 64)), "nvfp4")
        values, scales, glob, y = dask.compute(qd.values, qd.scales, qd.global_scale, aq.dequantize(qd))
    eager = aq.quantize(x, "nvfp4")
    np.testing.assert_array_equal(values, eager.values)
    np.testing.assert_array_equal(scales, eager.scales)
    np.testing.assert_array_equal(glob, eager.global_scale)
    np.testing.assert_array_equal(y, aq.dequantize(eager))


def test_dequantize_a_tensor_with_foreign_chunks() -> None:
    x = weights((70, 100), seed=13)
    eager = aq.quantize(x, "q4s:block32:f16")
    moved = eager.to_backend("dask")  # chunks chosen by dask, not by the quantizer
    odd = aq.QuantizedTensor(
        moved.scheme, moved.shape, moved.dtype, moved.values.rechunk((9, 3)), moved.scales.rechunk((7, 2))
    )
    np.testing.assert_array_equal(host(aq.dequantize(odd)), aq.dequantize(eager))


# --- saving lazy tensors ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["q8s", "q8s:block32:f16", "nvfp4", "mxfp4", "q2f:block5:bf16:packed_u32:1"])
def test_save_streams_chunk_by_chunk(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = weights((70, 100), seed=14)
    writes: list[tuple[slice, ...]] = []
    original = regions.ChunkTarget.__setitem__

    def counting(self: Any, index: Any, block: Any) -> None:
        writes.append(index)
        original(self, index, block)

    monkeypatch.setattr(regions.ChunkTarget, "__setitem__", counting)
    qd = aq.quantize(lazy(x, (13, 37)), text)
    aq.save(tmp_path / "w.safetensors", {"w": qd, "bias": lazy(x[0], 16)})
    blocked = qd.scales.npartitions if plan_for(qd.scheme).block is not None else 0
    assert len(writes) == qd.values.npartitions + blocked + 7  # a chunk at a time; the bias has 7
    loaded = aq.load(tmp_path / "w.safetensors")
    eager = aq.quantize(x, text)
    assert aq.to_bytes(loaded["w"]) == aq.to_bytes(eager)
    np.testing.assert_array_equal(loaded["bias"], x[0])


def test_save_stream_mixes_lazy_and_eager(tmp_path: Path) -> None:
    x = weights((64, 64), seed=15)
    items = [("a", aq.quantize(lazy(x, 16), "nvfp4")), ("b", aq.quantize(x, "q8s")), ("c", lazy(x, 20))]
    aq.io.arrayquant.checkpoint.save_stream(tmp_path / "s.safetensors", iter(items))
    loaded = aq.load(tmp_path / "s.safetensors")
    assert aq.to_bytes(loaded["a"]) == aq.to_bytes(aq.quantize(x, "nvfp4"))
    assert aq.to_bytes(loaded["b"]) == aq.to_bytes(aq.quantize(x, "q8s"))
    np.testing.assert_array_equal(loaded["c"], x)
    assert sorted(os.listdir(tmp_path)) == ["s.safetensors"]  # the spool is gone


def test_failed_lazy_save_leaves_the_target(tmp_path: Path) -> None:
    x = weights((64, 64), seed=16)
    target = tmp_path / "w.safetensors"
    aq.save(target, {"old": x[:2]})
    before = target.read_bytes()
    x[60, 1] = np.nan
    with pytest.raises(aq.NonFiniteInputError, match=r"chunk starting at \(48, 0\)"):
        aq.save(target, {"w": aq.quantize(lazy(x, 16), "q8s:block32:f16")})
    assert target.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["w.safetensors"]


def test_lazy_plain_array_of_unsupported_dtype(tmp_path: Path) -> None:
    x = da.from_array(np.ones(4, np.complex64))
    with pytest.raises(
        aq.DTypeError, match=r"tensor 'z' has dtype complex64, which a safetensors checkpoint cannot hold"
    ):
        aq.save(tmp_path / "w.safetensors", {"z": x})


# --- a real cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_client() -> Any:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_local_cluster_two_workers(cluster_client: Any, tmp_path: Path) -> None:
    assert len(cluster_client.scheduler_info()["workers"]) == 2
    x = weights((256, 256), seed=17)
    for text in ("nvfp4", "q4s:block32:f16", "q8s"):
        qd = aq.quantize(lazy(x, (64, 128)), text)
        values, scales, y = cluster_client.compute([qd.values, qd.scales, aq.dequantize(qd)], sync=True)
        eager = aq.quantize(x, text)
        np.testing.assert_array_equal(values, eager.values)
        np.testing.assert_array_equal(scales, eager.scales)
        np.testing.assert_array_equal(y, aq.dequantize(eager))
        aq.save(tmp_path / "w.safetensors", {"w": qd})  # the chunks are written by the workers
        assert aq.to_bytes(aq.load(tmp_path / "w.safetensors")["w"]) == aq.to_bytes(eager)
    x[100, 7] = np.inf
    with pytest.raises(aq.NonFiniteInputError, match=r"first at index \(100, 7\): inf"):
        cluster_client.compute(aq.quantize(lazy(x, 64), "nvfp4").values, sync=True)


@pytest.mark.parametrize("text", ["nvfp4", "mxfp8", "q8s:block8x16:f16", "q4f:block16:f16:native:lookup"])
def test_schemes_and_tensors_pickle(text: str) -> None:
    """Workers receive schemes, plans and tensors by pickle; each comes back equal."""
    import pickle

    scheme = aq.QuantScheme.parse(text)
    assert pickle.loads(pickle.dumps(scheme)) == scheme
    assert pickle.loads(pickle.dumps(plan_for(scheme))) == plan_for(scheme)
    table = np.asarray(aq.NF4, np.float32) if "lookup" in text else None
    qt = aq.quantize(weights((16, 32), seed=18), scheme, table=table)
    assert aq.to_bytes(pickle.loads(pickle.dumps(qt))) == aq.to_bytes(qt)


@pytest.mark.parametrize(
    ("shape", "chunks"), [((10,), 3), ((6, 7, 8), (4, 3, 5)), ((5, 1, 9), (2, 1, 9)), ((4, 6), (4, 6))]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint32, np.bool_])
def test_lazy_plain_arrays_land_in_place(shape: tuple[int, ...], chunks: Any, dtype: Any, tmp_path: Path) -> None:
    """Chunks cut along any axes are written as strided runs at the right offsets."""
    host_array = (np.arange(np.prod(shape)).reshape(shape) % 7).astype(dtype)
    aq.save(tmp_path / "p.safetensors", {"a": lazy(host_array, chunks), "b": lazy(host_array[..., :1], chunks)})
    loaded = aq.load(tmp_path / "p.safetensors")
    np.testing.assert_array_equal(loaded["a"], host_array)
    np.testing.assert_array_equal(loaded["b"], host_array[..., :1])
    assert loaded["a"].dtype == host_array.dtype


def test_every_entry_starts_aligned(tmp_path: Path) -> None:
    """Lazy saves order entries as safetensors does: each starts at a multiple of its element size."""
    x = weights((32, 64), seed=19)
    items = {
        "a": aq.quantize(lazy(x[:1, :16], 1), "nvfp4"),  # 9 bytes of values and scales, then an f32 global
        "b": aq.quantize(lazy(x, 16), "q8s"),  # u32 words
        "c": lazy(x[0].astype(np.float16), 7),
        "d": lazy(x.astype(np.float64), 16),
    }
    aq.save(tmp_path / "lazy.safetensors", items)
    aq.io.arrayquant.checkpoint.save_stream(tmp_path / "stream.safetensors", iter(items.items()))
    sizes = {"F64": 8, "F32": 4, "U32": 4, "F16": 2, "U8": 1, "I8": 1, "F8_E4M3": 1}
    for name in ("lazy.safetensors", "stream.safetensors"):
        with (tmp_path / name).open("rb") as f:
            _, header = aq.io.safetensors.reader.read_header(f, tmp_path / name, (tmp_path / name).stat().st_size)
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        assert all(v["data_offsets"][0] % sizes[v["dtype"]] == 0 for v in entries.values()), entries
        loaded = aq.load(tmp_path / name)
        assert aq.to_bytes(loaded["a"]) == aq.to_bytes(aq.quantize(x[:1, :16], "nvfp4"))
        np.testing.assert_array_equal(loaded["d"], x.astype(np.float64))


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pwrite`` may write less than asked (at most 2 GiB on Linux): every byte still lands."""
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: real(fd, memoryview(data)[:7], offset))
    x = weights((64, 64), seed=20)
    aq.save(tmp_path / "lazy.safetensors", {"w": aq.quantize(lazy(x, 16), "nvfp4"), "b": x})
    aq.io.arrayquant.checkpoint.save_stream(
        tmp_path / "stream.safetensors", iter([("b", x), ("w", aq.quantize(lazy(x, 16), "q8s"))])
    )
    monkeypatch.setattr(os, "pwrite", real)
    for name, text in (("lazy.safetensors", "nvfp4"), ("stream.safetensors", "q8s")):
        loaded = aq.load(tmp_path / name)
        assert aq.to_bytes(loaded["w"]) == aq.to_bytes(aq.quantize(x, text))
        np.testing.assert_array_equal(loaded["b"], x)


def test_empty_chunks_from_filtering() -> None:
    x = weights((40, 64), seed=21)
    keep = np.arange(40) // 10 != 2
    y = lazy(x, (10, 64))[da.from_array(keep, chunks=10)]
    y.compute_chunk_sizes()
    assert 0 in y.chunks[0]
    for text in ("q8s", "q8s:block32:f16", "nvfp4", "q4s:block4:f16:packed_u32:1"):
        same(aq.quantize(y, text), aq.quantize(x[keep], text))
    eager = aq.quantize(x[keep], "q4s:packed_u32:1")  # 30 rows in 4 words of 8 rows
    moved = eager.to_backend("dask")
    odd = aq.QuantizedTensor(
        moved.scheme, moved.shape, moved.dtype, moved.values.rechunk(((3, 0, 1), (64,))), moved.scales
    )
    y = aq.dequantize(odd)
    assert y.shape == (30, 64)
    np.testing.assert_array_equal(host(y), aq.dequantize(eager))


def test_one_pass_for_every_global_of_a_save(tmp_path: Path) -> None:
    """Several tensors with globals: one scheduler pass for all the globals, one for the data."""
    calls: list[Any] = []
    x = weights((64, 64), seed=22)
    tensors = {f"w{i}": aq.quantize(lazy(x * (i + 1), 16), "nvfp4") for i in range(3)}
    tensors["p"] = aq.quantize(lazy(x, 16), "q8s")
    with dask.config.set(scheduler=_counting_scheduler(calls)):
        aq.save(tmp_path / "w.safetensors", tensors)
    assert len(calls) == 2
    loaded = aq.load(tmp_path / "w.safetensors")
    for i in range(3):
        assert aq.to_bytes(loaded[f"w{i}"]) == aq.to_bytes(aq.quantize(x * (i + 1), "nvfp4"))


def test_static_scales_are_checked_when_computed() -> None:
    x = weights((8, 64), seed=23)
    bad = np.full((8, 2), 0.01, np.float32)
    bad[5, 1] = np.nan
    qt = aq.quantize(lazy(x, 4), "q8s:block32:f32", aq.QParams(da.from_array(bad, chunks=(4, 1))))
    with pytest.raises(
        aq.ParamsError,
        match=r"params.scales \(its chunk starting at \(4, 1\)\) has 1 invalid entry \(first at flat index 1: nan\); "
        r"scales must be finite and >= 0",
    ):
        qt.values.compute()
    ones = da.from_array(np.ones((8, 2), np.float32))
    qt = aq.quantize(lazy(x, 4), "q8s:block32:ue4m3:tensor:f32", aq.QParams(ones, da.from_array(np.float32([-1.0]))))
    with pytest.raises(aq.ParamsError, match=r"params.global_scale \(its chunk starting at \(0,\)\) has 1 invalid"):
        qt.values.compute()
