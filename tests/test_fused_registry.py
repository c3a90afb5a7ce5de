"""The fused-kernel registry: who is asked, how it is turned off, and what ``arrayquant backends`` says.

The kernels' bits are compared with the portable path in tests/test_fused_quantize.py and
tests/test_fused_dequantize.py; here the routing is checked with spies on the kernel modules.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import arrayquant as aq
from arrayquant import fused
from arrayquant.fused import registry, threads
from arrayquant.invariants import plan_for

numba = pytest.importorskip("numba")
from arrayquant.fused import numba_dequantize, numba_quantize  # noqa: E402


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records which fused kernels run (the real kernels still do the work)."""
    seen: list[str] = []
    for mod, name in (
        (numba_quantize, "quantize"),
        (numba_quantize, "encode"),
        (numba_quantize, "absmax"),
        (numba_quantize, "quantize_under"),
        (numba_dequantize, "dequantize"),
    ):
        real = getattr(mod, name)

        def spy(*args, _real=real, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(mod, name, spy)
    monkeypatch.delenv("ARRAYQUANT_FUSED", raising=False)
    return seen


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)


def test_quantize_and_dequantize_ask_the_registry_first(calls: list[str]) -> None:
    x = _x()
    qt = aq.quantize(x, "q8s:block32:f16")
    aq.dequantize(qt)
    aq.quantize(x, "q8s:block32:f16", aq.compute_q_params("q8s:block32:f16", *aq.compute_range(x, "q8s:block32:f16")))
    assert calls == ["quantize", "dequantize", "encode"]


def test_turned_off_by_the_environment_and_by_the_context_manager(
    calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _x()
    with aq.fused_kernels(False):
        a = aq.quantize(x, "q4s:block32:f16")
        aq.dequantize(a)
        assert fused.why_not() == "turned off by fused_kernels(enabled=False)"
    monkeypatch.setenv("ARRAYQUANT_FUSED", "0")
    b = aq.quantize(x, "q4s:block32:f16")
    assert fused.why_not() == "turned off by ARRAYQUANT_FUSED=0"
    assert calls == []
    with aq.fused_kernels(True):  # an explicit choice wins over the environment
        c = aq.quantize(x, "q4s:block32:f16")
    assert calls == ["quantize"]
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.values, c.values)


def test_what_is_not_covered_stays_portable(calls: list[str]) -> None:
    x = _x()
    aq.quantize(x.astype(np.float16), "q8s:block32:f16")  # f16 input
    aq.quantize(x, "q4f:block32:f32:lookup:nf4")  # a lookup table
    aq.quantize(x, "q8s:block32:f16", check_finite=False)  # unverified input: NaN is scrubbed portably
    aq.quantize(x, "q8s:block32:f16", calibration="absmean")
    torch = pytest.importorskip("torch")
    aq.dequantize(aq.quantize(torch.asarray(x), "q8s:block32:f16"))
    assert calls == []
    plan = plan_for(aq.QuantScheme.parse("q4f:block32:f32:lookup:nf4"))
    assert registry.quantize_kernel(x, plan, x.shape) is None


def test_nan_falls_back_to_the_checked_portable_path(calls: list[str]) -> None:
    x = _x()
    x[3, 17] = np.nan
    with pytest.raises(aq.NonFiniteInputError, match=r"\(3, 17\)"):
        aq.quantize(x, "q8s:block32:f16")
    assert calls == ["quantize"]  # asked, declined, then the portable path reported where


def test_a_dask_graph_keeps_the_choice_made_when_it_was_built(calls: list[str]) -> None:
    da = pytest.importorskip("dask.array")
    import dask

    x = _x()
    with aq.fused_kernels(False):
        lazy = aq.quantize(da.from_array(x, chunks=(4, 32)), "q8s:block32:f16")
    with dask.config.set(scheduler="sync"):
        portable = lazy.values.compute()
    assert calls == []
    lazy = aq.quantize(da.from_array(x, chunks=(4, 32)), "q8s:block32:f16")
    with dask.config.set(scheduler="sync"):
        values = lazy.values.compute()
        assert calls == ["quantize"] * 4  # one per chunk
        again = aq.QuantizedTensor(
            lazy.scheme,
            lazy.shape,
            lazy.dtype,
            da.from_array(values, chunks=(4, 1)),
            da.from_array(lazy.scales.compute()),
        )
        y = aq.dequantize(again).compute()
    assert calls.count("dequantize") == 4
    np.testing.assert_array_equal(values, portable)
    with aq.fused_kernels(False):
        np.testing.assert_array_equal(y, aq.dequantize(aq.quantize(x, "q8s:block32:f16")))


def test_two_level_on_dask_takes_two_fused_passes(calls: list[str]) -> None:
    da = pytest.importorskip("dask.array")
    import dask

    x = _x() * np.float32(1e3)
    with aq.fused_kernels(False):
        portable = aq.quantize(x, "nvfp4")
    assert calls == []
    lazy = aq.quantize(da.from_array(x, chunks=(4, 32)), "nvfp4")
    with dask.config.set(scheduler="sync"):
        values, scales, glob = dask.compute(lazy.values, lazy.scales, lazy.global_scale)
    # max|x| of each chunk, then each chunk quantized beneath the global taken over all of them
    assert sorted(calls) == ["absmax"] * 4 + ["quantize_under"] * 4
    np.testing.assert_array_equal(values, portable.values)
    np.testing.assert_array_equal(scales, portable.scales)
    np.testing.assert_array_equal(glob, portable.global_scale)
    calls.clear()
    lazy = aq.quantize(da.from_array(x, chunks=(4, 32)), "q8s")  # per tensor: the maxima are fused too
    with dask.config.set(scheduler="sync"):
        values = lazy.values.compute()
    assert sorted(calls) == ["absmax"] * 4 + ["encode"] * 4
    with aq.fused_kernels(False):
        np.testing.assert_array_equal(values, aq.quantize(x, "q8s").values)


def test_nan_in_a_dask_chunk_of_a_two_level_scheme_is_reported(calls: list[str]) -> None:
    da = pytest.importorskip("dask.array")
    import dask

    x = _x()
    x[6, 40] = np.inf
    lazy = aq.quantize(da.from_array(x, chunks=(4, 32)), "nvfp4")
    with (
        dask.config.set(scheduler="sync"),
        pytest.raises(aq.NonFiniteInputError, match=r"chunk starting at \(4, 32\).*\(6, 40\): inf"),
    ):
        lazy.values.compute()
    assert "absmax" in calls  # asked, declined on that chunk, then the portable check reported it


def test_one_thread_launches_run_serially_without_the_lock() -> None:
    from arrayquant.fused.numba_launch import LOCK, launch

    seen: list[tuple[str, bool]] = []
    kernels = (lambda: seen.append(("parallel", LOCK.locked())), lambda: seen.append(("serial", LOCK.locked())))
    with aq.fused_kernels(threads=1):
        launch(kernels, 1 << 30)
    with aq.fused_kernels(threads=2):
        launch(kernels, 10)  # too small to share
        launch(kernels, 1 << 30)
    pool = numba.config.NUMBA_NUM_THREADS
    assert seen == [("serial", False), ("serial", False), ("parallel", True) if pool > 1 else ("serial", False)]


def test_threads_of_a_pool_quantize_side_by_side() -> None:
    # one-thread launches take no lock: dask's threaded scheduler runs chunks at once
    from concurrent.futures import ThreadPoolExecutor

    xs = [np.random.default_rng(seed).standard_normal((256, 512)).astype(np.float32) for seed in range(8)]

    def work(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with aq.fused_kernels(threads=1):
            qt = aq.quantize(x, "q4s:block32:f16")
            return qt.values, qt.scales, aq.dequantize(qt)

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(work, xs))
    with aq.fused_kernels(False):
        for x, (values, scales, y) in zip(xs, got, strict=True):
            want = aq.quantize(x, "q4s:block32:f16")
            np.testing.assert_array_equal(values, want.values)
            np.testing.assert_array_equal(scales, want.scales)
            np.testing.assert_array_equal(y, aq.dequantize(want))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"enabled": "no"}, "enabled must be True or False, got 'no'"),
        ({"threads": 0}, r"threads must be a positive int \(or None for one per core\), got 0"),
        ({"threads": 2.0}, "got 2.0"),
        ({"threads": True}, "got True"),
    ],
)
def test_bad_settings_are_typed_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(aq.ParamsError, match=message), aq.fused_kernels(**kwargs):  # type: ignore[arg-type]
        pass


def test_thread_count_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("ARRAYQUANT_THREADS", raising=False)
    assert threads.count() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("ARRAYQUANT_THREADS", "3")
    assert threads.count() == 3
    with aq.fused_kernels(threads=1):
        assert threads.count() == 1
        threads.apply()
        assert numba.get_num_threads() == 1
    assert threads.count() == 3
    monkeypatch.setenv("ARRAYQUANT_THREADS", "lots")  # not a count: the default
    assert threads.count() == len(os.sched_getaffinity(0))


def test_small_launches_stay_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARRAYQUANT_THREADS", "2")
    threads.apply(1000)
    assert numba.get_num_threads() == 1
    threads.apply(threads.MIN_ELEMENTS_PER_THREAD * 4)
    assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)


def test_results_do_not_depend_on_the_thread_count() -> None:
    x = np.random.default_rng(1).standard_normal((3001, 96)).astype(np.float32)  # enough for 2 threads
    with aq.fused_kernels(threads=1):
        one = aq.quantize(x, "nvfp4")
    with aq.fused_kernels(threads=2):
        two = aq.quantize(x, "nvfp4")
    np.testing.assert_array_equal(one.values, two.values)
    np.testing.assert_array_equal(one.scales, two.scales)
    np.testing.assert_array_equal(one.global_scale, two.global_scale)


def test_without_numba_everything_runs_portably(calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "_numba_problem", lambda: "numba is not installed (pip install 'arrayquant[fast]')")
    x = _x()
    qt = aq.quantize(x, "mxfp4")
    aq.dequantize(qt)
    assert calls == []
    assert fused.why_not() == "numba is not installed (pip install 'arrayquant[fast]')"
    assert registry.describe()[0] == ("numba (CPU)", "off: numba is not installed (pip install 'arrayquant[fast]')")


def test_backends_command_lists_the_fused_kernels() -> None:
    def run(env: dict[str, str]) -> str:
        import os

        proc = subprocess.run(
            [sys.executable, "-m", "arrayquant", "backends"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, **env},
        )
        return proc.stdout.split("fused kernels")[1]

    on = run({"ARRAYQUANT_FUSED": "1", "ARRAYQUANT_FUSED_GPU": "0", "ARRAYQUANT_THREADS": "2"})
    assert f"numba (CPU)        on (numba {numba.__version__}, 2 threads)" in on
    assert "cupy (GPU)         off: unverified: off until proven on a GPU (ARRAYQUANT_FUSED_GPU=1 turns them on)" in on
    off = run({"ARRAYQUANT_FUSED": "0"})
    assert "numba (CPU)        off: turned off by ARRAYQUANT_FUSED=0" in off
    gpu = run({"ARRAYQUANT_FUSED_GPU": "1"})
    assert (
        "cupy (GPU)         off: cupy is not installed (pip install 'arrayquant[gpu]')" in gpu
        or "on (unverified)" in gpu
    )


@pytest.mark.parametrize(
    ("scheme", "shape"),
    [
        ("q4s:block32:f16", (8, 64)),
        ("nvfp4", (8, 64)),
        ("q8s:block8x32:f16", (16, 64)),
        ("q8s", (8, 64)),
        ("q8s", (64,)),
    ],
)
def test_mse_search_kernels_take_the_thread_setting(scheme: str, shape: tuple[int, ...], monkeypatch) -> None:
    # every MSE search kernel launches through launch(), which asks threads.planned: under
    # fused_kernels(threads=1) each launch is planned on one thread (the serial compilation runs)
    planned: list[int] = []
    real = threads.planned

    def spy(elements: int | None = None) -> int:
        planned.append(real(elements))
        return planned[-1]

    monkeypatch.setattr(threads, "planned", spy)
    monkeypatch.delenv("ARRAYQUANT_FUSED", raising=False)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with aq.fused_kernels(threads=1):
        qt = aq.quantize(x, scheme, calibration="mse")
    assert planned
    assert set(planned) == {1}
    with aq.fused_kernels(False):
        want = aq.quantize(x, scheme, calibration="mse")
    np.testing.assert_array_equal(np.asarray(qt.values), np.asarray(want.values))


def test_parallel_and_serial_kernels_are_cached_apart():
    # Numba's disk cache keys an entry by the function's name, code and closure, not by `parallel`:
    # the serial copy needs a name of its own, or one process's first launch decides both kernels
    pytest.importorskip("numba")
    from arrayquant.fused import numba_launch

    def add_one(x):
        for i in numba_launch.numba.prange(x.shape[0]):
            x[i] += 1.0

    par, ser = numba_launch.parallel_and_serial(add_one)
    assert par.py_func.__qualname__ != ser.py_func.__qualname__
    assert par.targetoptions.get("parallel") is True
    assert not ser.targetoptions.get("parallel", False)
    x = np.zeros(4, np.float32)
    par(x)
    ser(x)
    np.testing.assert_array_equal(x, np.full(4, 2.0, np.float32))
