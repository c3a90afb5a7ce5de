"""Fuzzing the readers: mutated checkpoints and Burn byte buffers end well or in a typed error.

Every outcome of ``aq.load`` on a mutated checkpoint, or of ``aq.from_bytes`` on a mutated
buffer (or a true buffer read under a lying scheme or shape), is one of two things:

- a tensor that is correct by itself: ``aq.dequantize`` works and ``aq.to_bytes`` round-trips
  (a Burn buffer that was accepted comes back byte for byte);
- an ``aq.QuantizationError`` subclass.

Anything else (a ``KeyError``, ``OverflowError``, ``RecursionError``, a NumPy warning, a
crash) fails the test. Mutations: truncation, bit flips, overwritten and appended bytes, a lying
header length, edits of the JSON header (dtype, shape, data_offsets, renamed or dropped
entries), edits of the metadata (format, scheme, shape, dtype), and structural edits re-written
with the raw safetensors API (dropped, retyped, reshaped, cut, swapped, copied and randomised
entries). CI runs ~200 examples per target; ``-m slow`` runs 5000. ``OUTCOMES`` counts what
happened, printed at the end of the module (``pytest -s``).

The second half runs the harness of ``tests/fuzz_targets.py`` (also ``ci/fuzz.py``): ``load``,
the CLI's reader and commands, ``read_nvfp4``, ``from_bytes`` with random schemes, shapes and
buffer types, ``quantize`` of data at the ends of each float range, mutated GGUF and Burnpack
files, hostile model folders (``folder``: every reader and command must stay inside the folder and
OUT), GGUF metadata bombs (``gguf-meta``) and operations with hostile arguments (``ops``); each
case in a worker process with its address space capped (``RLIMIT_AS``), where any non-library
exception, leaked warning, case over 5 s, memory-cap hit, inconsistent result or file touched
outside OUT is a failure. CI runs 1,000 cases per target (``ft.CI_SHARE`` scales a costly target
down: 500 model folders); ``-m slow`` runs 200,000 in all.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
import warnings
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrayquant as aq

from . import fuzz_targets as ft

# Hypothesis imports this (and libcst) only to report a failure; pyproject turns warnings into
# errors, and libcst's DeprecationWarning would then hide the falsifying example. Import it now.
with warnings.catch_warnings(), contextlib.suppress(ImportError):  # no libcst: nothing to pre-import
    warnings.simplefilter("ignore", DeprecationWarning)
    import hypothesis.extra._patching  # noqa: F401

OUTCOMES: Counter[str] = Counter()

CI = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
LONG = settings(CI, max_examples=5000)

# header dtype -> (TensorSpec name, item size)
DTYPES = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
}
HEADER_DTYPES = [*DTYPES, "U64", "C64", "F4", "F6_E2M3", "F8_E4M3FNUZ", "XX", "", "f32"]
SCHEMES = [
    "q8s:block4:ue4m3:tensor:f32:native",
    "nvfp4",
    "mxfp8",
    "mxfp4",
    "q4f:block8:f16:packed_u32",
    "q2s:packed_u32:1",
    "e4m3:block8:ue8m0:native",
    "e5m2:tensor:bf16:native",
    "q8f",
    "q4s:block2x4:bf16:packed_u32:1",
    "e2m1:block4:f16:packed_u32",
    "q2f:tensor:f16:native",
    "e2m1:block8:ue4m3:tensor:f32:native",
]
SHAPES = [(2, 8), (2, 32), (3, 16), (5, 4), (4, 4), (16,), (1, 64), (3, 3, 8)]


def _x(shape: tuple[int, ...], seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 4
    x.reshape(-1)[:2] = 0
    return x


@cache
def checkpoint_bases() -> tuple[bytes, ...]:
    """Small valid checkpoints (a few hundred bytes, so random edits often hit the header)."""
    import tempfile

    contents = [
        {"w": aq.quantize(_x((2, 8), 0), SCHEMES[0]), "bias": np.arange(3, dtype=np.float32)},
        {"w": aq.quantize(_x((2, 32), 1), "nvfp4")},
        {"a": aq.quantize(_x((3, 16), 2), SCHEMES[4]), "b": aq.quantize(_x((5, 4), 3), SCHEMES[5])},
        {"w": aq.quantize(_x((2, 16), 4), SCHEMES[6]), "n": np.arange(4, dtype=np.int64)},
        {"w": aq.quantize(_x((2, 16), 5), "q4f:block16:f16:lookup:packed_u32", table=np.asarray(aq.NF4, np.float32))},
        {"w": aq.quantize(_x((4, 4), 6), SCHEMES[7]), "w2": aq.quantize(_x((3, 8), 7), SCHEMES[12])},
    ]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, tensors in enumerate(contents):
            path = Path(tmp) / f"{i}.safetensors"
            aq.save(path, tensors)
            out.append(path.read_bytes())
    return tuple(out)


BURN_SHAPES = {"q2s:packed_u32:1": (5, 4), "q4s:block2x4:bf16:packed_u32:1": (3, 3, 8), "q8f": (16,)}


@cache
def burn_bases() -> tuple[tuple[str, tuple[int, ...], bytes], ...]:
    """One true buffer per scheme (no lookup scheme: the Burn layout carries no table)."""
    out = []
    for i, scheme in enumerate(SCHEMES):
        shape = BURN_SHAPES.get(scheme, (2, 32) if i % 2 else (3, 16))
        out.append((scheme, shape, aq.to_bytes(aq.quantize(_x(shape, i), scheme))))
    return tuple(out)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    if OUTCOMES:
        lines = [f"  {k}: {v}" for k, v in sorted(OUTCOMES.items())]
        print(f"\nfuzz outcomes ({sum(OUTCOMES.values())} cases):\n" + "\n".join(lines))


# ---------------------------------------------------------------------------------------------
# checking one outcome
# ---------------------------------------------------------------------------------------------


def _check_tensor(qt: aq.QuantizedTensor) -> None:
    """A tensor a reader accepted must be usable and reproduce its own bytes."""
    deq = aq.dequantize(qt)
    assert tuple(deq.shape) == tuple(qt.shape)
    buf = aq.to_bytes(qt)
    assert len(buf) == aq.quantized_nbytes(qt.scheme, qt.shape) == qt.nbytes
    if qt.table is None:
        again = aq.from_bytes(buf, qt.scheme, qt.shape, backend="numpy")
        assert aq.to_bytes(again) == buf
        np.testing.assert_array_equal(aq.dequantize(again, qt.dtype), deq)


def _load(workdir: Path, blob: bytes, kind: str) -> None:
    path = workdir / "case.safetensors"
    path.write_bytes(blob)
    try:
        out = aq.load(path, backend="numpy")
    except aq.QuantizationError as exc:
        OUTCOMES[f"checkpoint/{kind}: {type(exc).__name__}"] += 1
        return
    for name, item in out.items():
        if isinstance(item, aq.QuantizedTensor):
            _check_tensor(item)
            again = workdir / "again.safetensors"
            aq.save(again, {"t": item})
            assert aq.to_bytes(aq.load(again, backend="numpy")["t"]) == aq.to_bytes(item), name
        else:
            assert isinstance(item, np.ndarray), (name, type(item))
    OUTCOMES[f"checkpoint/{kind}: loaded"] += 1


def _from_bytes(buf: bytes, scheme: str, shape: tuple[int, ...], kind: str) -> None:
    try:
        qt = aq.from_bytes(buf, scheme, shape, backend="numpy")
    except aq.QuantizationError as exc:
        OUTCOMES[f"burn/{kind}: {type(exc).__name__}"] += 1
        return
    _check_tensor(qt)
    assert aq.to_bytes(qt) == bytes(buf), "an accepted buffer must come back byte for byte"
    OUTCOMES[f"burn/{kind}: loaded"] += 1


# ---------------------------------------------------------------------------------------------
# mutations
# ---------------------------------------------------------------------------------------------


def _split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def _join(header: dict[str, Any], data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _bytes_mutation(data: st.DataObject, blob: bytes) -> tuple[str, bytes]:
    op = data.draw(st.sampled_from(["truncate", "flip", "overwrite", "append", "insert"]), label="op")
    if op == "truncate":
        return op, blob[: data.draw(st.integers(0, max(0, len(blob) - 1)), label="cut")]
    if op == "flip":
        out = bytearray(blob)
        for pos, bit in data.draw(
            st.lists(st.tuples(st.integers(0, len(blob) - 1), st.integers(0, 7)), min_size=1, max_size=8)
        ):
            out[pos] ^= 1 << bit
        return op, bytes(out)
    if op == "overwrite":
        pos = data.draw(st.integers(0, len(blob) - 1), label="pos")
        junk = data.draw(st.binary(min_size=1, max_size=16), label="junk")
        return op, (blob[:pos] + junk + blob[pos + len(junk) :])[: max(len(blob), pos + len(junk))]
    junk = data.draw(st.binary(min_size=1, max_size=64), label="junk")
    if op == "append":
        return op, blob + junk
    pos = data.draw(st.integers(0, len(blob)), label="pos")
    return op, blob[:pos] + junk + blob[pos:]


def _length_lie(data: st.DataObject, blob: bytes) -> bytes:
    n = int.from_bytes(blob[:8], "little")
    lie = data.draw(
        st.one_of(st.integers(0, 2**64 - 1), st.integers(max(0, n - 16), n + 16), st.sampled_from([0, 1, 2**63])),
        label="length",
    )
    return struct.pack("<Q", lie) + blob[8:]


_any_shape = st.one_of(
    st.lists(st.integers(0, 64), max_size=4),
    st.lists(st.integers(-(2**70), 2**70), min_size=1, max_size=3),
    st.just("2x8"),
    st.just(None),
)


def _header_edit(data: st.DataObject, blob: bytes) -> tuple[str, bytes]:
    header, rest = _split(blob)
    keys = sorted(k for k in header if k != "__metadata__")
    key = data.draw(st.sampled_from(keys), label="entry")
    field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", "drop", "rename"]), label="field")
    entry = header[key]
    if field == "dtype":
        entry["dtype"] = data.draw(st.sampled_from(HEADER_DTYPES), label="dtype")
    elif field == "shape":
        entry["shape"] = data.draw(_any_shape, label="shape")
    elif field == "data_offsets":
        size = len(rest)
        entry["data_offsets"] = data.draw(
            st.one_of(
                st.lists(st.integers(0, size + 8), min_size=2, max_size=2),
                st.lists(st.integers(0, 2**64 + 1), min_size=0, max_size=3),
                st.just([entry["data_offsets"][1], entry["data_offsets"][0]]),
            ),
            label="offsets",
        )
    elif field == "drop":
        del header[key]
    else:
        others = [*keys, "w.scales", "w.global_scale", "w.table", "x", "w", "arrayquant.format"]
        header[data.draw(st.sampled_from(others), label="new name")] = header.pop(key)
    return f"header-{field}", _join(header, rest)


_SCHEME_TEXT = st.one_of(st.sampled_from(SCHEMES), st.text(max_size=12), st.just("q4f:block16:f16:lookup:packed_u32"))
_ORIG_DTYPE = st.sampled_from(["float32", "float16", "bfloat16", "float64", "int8", "asarray", "", "float8_e4m3fn"])


def _metadata_edit(data: st.DataObject, blob: bytes) -> tuple[str, bytes]:
    header, rest = _split(blob)
    meta = header.setdefault("__metadata__", {})
    described = sorted(k for k in meta if k.startswith("arrayquant.tensor."))
    op = data.draw(st.sampled_from(["format", "field", "drop", "describe", "garbage"]), label="meta op")
    if op == "format":
        meta["arrayquant.format"] = data.draw(st.one_of(st.just("2"), st.just("1 "), st.text(max_size=4)))
    elif op == "field" and described:
        key = data.draw(st.sampled_from(described))
        info = json.loads(meta[key])
        name = data.draw(st.sampled_from(["scheme", "shape", "dtype"]))
        if data.draw(st.booleans(), label="delete field"):
            info.pop(name)
        else:
            info[name] = data.draw({"scheme": _SCHEME_TEXT, "shape": _any_shape, "dtype": _ORIG_DTYPE}[name])
        meta[key] = json.dumps(info)
    elif op == "drop" and described:
        del meta[data.draw(st.sampled_from(described))]
    elif op == "describe":
        name = data.draw(st.sampled_from(sorted(k for k in header if k != "__metadata__") + ["ghost", ""]))
        shape = data.draw(st.one_of(st.sampled_from([list(s) for s in SHAPES]), _any_shape))
        meta["arrayquant.tensor." + name] = json.dumps(
            {"scheme": data.draw(_SCHEME_TEXT), "dtype": "float32", "shape": shape}
        )
    else:
        key = data.draw(st.sampled_from([*described, "arrayquant.format", "other"]))
        meta[key] = data.draw(st.text(max_size=30))
    return f"metadata-{op}", _join(header, rest)


Entry = tuple[str, list[int], bytes]


def _entries(blob: bytes) -> tuple[dict[str, Entry], dict[str, str]]:
    header, _ = _split(blob)
    entries = {k: (v["dtype"], list(v["shape"]), bytes(v["data"])) for k, v in safetensors.deserialize(blob)}
    return entries, header.get("__metadata__", {})


def _serialize(entries: dict[str, Entry], meta: dict[str, str]) -> bytes:
    buffers = {k: np.frombuffer(raw, np.uint8) if raw else np.zeros(0, np.uint8) for k, (_, _, raw) in entries.items()}
    specs = {
        k: safetensors.TensorSpec(dtype=DTYPES[d][0], shape=shape, data_ptr=buffers[k].ctypes.data, data_len=len(raw))
        for k, (d, shape, raw) in entries.items()
    }
    return bytes(safetensors.serialize(specs, metadata=meta or None))


def _structural_edit(data: st.DataObject, blob: bytes) -> tuple[str, bytes]:
    """Edits that keep a valid safetensors file, so arrayquant's own checks are what answers."""
    entries, meta = _entries(blob)
    keys = sorted(entries)
    op = data.draw(st.sampled_from(["drop", "retype", "reshape", "cut", "swap", "copy", "randomise"]), label="op")
    key = data.draw(st.sampled_from(keys), label="entry")
    dtype, shape, raw = entries[key]
    if op == "drop":
        del entries[key]
    elif op == "retype":
        new = data.draw(st.sampled_from(list(DTYPES)), label="dtype")
        size = DTYPES[new][1]
        raw = raw[: len(raw) // size * size]
        entries[key] = (new, [len(raw) // size], raw)
    elif op == "reshape":
        n = math.prod(shape)
        divisors = [d for d in range(1, n + 1) if n % d == 0] or [1]
        d = data.draw(st.sampled_from(divisors), label="rows")
        entries[key] = (dtype, data.draw(st.sampled_from([[n], [d, n // d], [1, d, n // d], [n // d, d, 1]])), raw)
    elif op == "cut":
        size = DTYPES[dtype][1]
        n = len(raw) // size
        keep = data.draw(st.integers(0, max(0, n - 1)), label="keep")
        entries[key] = (dtype, [keep], raw[: keep * size])
    elif op == "swap":
        other = data.draw(st.sampled_from(keys), label="other")
        entries[key], entries[other] = entries[other], entries[key]
    elif op == "copy":
        target = data.draw(
            st.sampled_from(
                [
                    f"{k}{s}"
                    for k in ("w", "a", "b", "bias", "w2", "n")
                    for s in ("", ".scales", ".global_scale", ".table")
                ]
            ),
            label="target",
        )
        entries[target] = entries[key]
    else:
        junk = data.draw(st.binary(min_size=len(raw), max_size=len(raw)), label="bytes")
        entries[key] = (dtype, shape, junk)
    return f"entries-{op}", _serialize(entries, meta)


# ---------------------------------------------------------------------------------------------
# the fuzz targets
# ---------------------------------------------------------------------------------------------


def checkpoint_case(workdir: Path, data: st.DataObject) -> None:
    blob = data.draw(st.sampled_from(checkpoint_bases()), label="base")
    family = data.draw(st.sampled_from(["bytes", "length", "header", "metadata", "entries"]), label="family")
    if family == "bytes":
        kind, blob = _bytes_mutation(data, blob)
    elif family == "length":
        kind, blob = "length-lie", _length_lie(data, blob)
    elif family == "header":
        kind, blob = _header_edit(data, blob)
    elif family == "metadata":
        kind, blob = _metadata_edit(data, blob)
    else:
        kind, blob = _structural_edit(data, blob)
    if data.draw(st.booleans(), label="and a byte-level edit"):
        extra, blob = _bytes_mutation(data, blob) if blob else ("none", blob)
        kind += "+" + extra
    _load(workdir, blob, kind.split("+")[0])


def burn_case(data: st.DataObject) -> None:
    scheme, shape, buf = data.draw(st.sampled_from(burn_bases()), label="base")
    op = data.draw(st.sampled_from(["bytes", "random-exact", "scheme-lie", "shape-lie", "both-lie"]), label="op")
    if op == "bytes":
        op, buf = _bytes_mutation(data, buf)
    elif op == "random-exact":  # any bytes of exactly the right length: every code and scale decodes
        buf = data.draw(st.binary(min_size=len(buf), max_size=len(buf)), label="bytes")
    if op in ("scheme-lie", "both-lie"):
        scheme = data.draw(st.sampled_from(SCHEMES), label="scheme")
    if op in ("shape-lie", "both-lie"):
        shape = data.draw(
            st.one_of(
                st.sampled_from(SHAPES),
                st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
            ),
            label="shape",
        )
    _from_bytes(buf, scheme, shape, op)


@CI
@given(data=st.data())
def test_fuzz_checkpoints(workdir: Path, data: st.DataObject) -> None:
    checkpoint_case(workdir, data)


@CI
@given(data=st.data())
def test_fuzz_burn_bytes(data: st.DataObject) -> None:
    burn_case(data)


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_fuzz_checkpoints_long(workdir: Path, data: st.DataObject) -> None:
    checkpoint_case(workdir, data)


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_fuzz_burn_bytes_long(data: st.DataObject) -> None:
    burn_case(data)


def test_bases_are_valid(workdir: Path) -> None:
    for blob in checkpoint_bases():
        path = workdir / "base.safetensors"
        path.write_bytes(blob)
        for item in aq.load(path, backend="numpy").values():
            if isinstance(item, aq.QuantizedTensor):
                _check_tensor(item)
        entries, meta = _entries(blob)
        assert aq.load(path).keys() == aq.load(workdir / "base.safetensors").keys()
        assert _serialize(entries, meta)  # the raw writer reproduces a loadable file
    for scheme, shape, buf in burn_bases():
        _from_bytes(buf, scheme, shape, "base")


# ---------------------------------------------------------------------------------------------
# every reader, in memory-capped workers (tests/fuzz_targets.py)
# ---------------------------------------------------------------------------------------------


def _harness_run(counts: dict[str, int], seed: int, workers: int = 1) -> ft.Tally:
    tally = ft.Tally()
    with ft.Harness(workers=workers) as h:
        for res in h.run(ft.plan_counts(counts, seed)):
            tally.add(res)
    print("\n" + tally.report())
    return tally


def _assert_clean(tally: ft.Tally, counts: dict[str, int]) -> None:
    cases = sum(counts.values())
    assert tally.total == cases
    for target, n in counts.items():  # each target reaches both ends: accepted inputs and typed refusals
        got = tally.per_target[target]
        assert got["loaded-correct"] >= 0.02 * n, (target, got)
        assert sum(1 for k in got if k.startswith("error ")) >= ft.ERROR_KINDS.get(target, 3), (target, got)
    assert tally.extra, "the CLI commands ran on no case"
    if tally.failed:
        pytest.fail(f"{tally.failed} of {cases} fuzz cases failed\n{tally.report(examples=3)}", pytrace=False)


def test_fuzz_harness_catches_every_failure_class() -> None:
    """The harness itself: each failure class is detected (slow and abort thresholds shortened)."""
    with ft.Harness(slow_s=0.5, abort_s=1) as h:
        results = {r.seed: r for r in h.run(("selftest", i) for i in range(len(ft.SELFTEST)))}
        starts = h.starts
    got = [(ft.SELFTEST[i][0], results[i].outcome) for i in range(len(ft.SELFTEST))]
    assert [want for want, _ in got] == [outcome for _, outcome in got]
    assert "changed 'notes.txt'" in results[7].detail
    assert "aborted after 1 s" in results[9].detail
    assert "peak RSS grew" in results[11].detail
    assert "exit code -9" in results[12].detail
    assert starts == 3  # a fresh worker after the memory cases; none needed after the crash


def test_fuzz_cases_replay_and_reproduce() -> None:
    """A seed alone decides a case, and its reproducer is Python that runs on its own."""
    for target in ft.TARGETS:
        a, b = ft.make_case(target, 7), ft.make_case(target, 7)
        assert (a.kind, a.blob, a.source, a.name) == (b.kind, b.blob, b.source, b.name)
        assert (a.kind, a.blob, a.source) != (lambda c: (c.kind, c.blob, c.source))(ft.make_case(target, 8))
        compile(ft.reproducer(a), f"<{target}>", "exec")


def test_fuzz_every_reader() -> None:
    counts = ft.ci_counts(1000)
    _assert_clean(_harness_run(counts, seed=0), counts)


@pytest.mark.slow
def test_fuzz_every_reader_long() -> None:
    """The opt-in run of the issue: 200,000 cases (ci/fuzz.py --cases 200000 runs them in equal turns)."""
    counts = ft.ci_counts(200_000 // len(ft.TARGETS))
    _assert_clean(_harness_run(counts, seed=1, workers=2), counts)


def test_fuzz_folder_gguf_ops_bases(tmp_path: Path) -> None:
    """The valid inputs the new targets start from read back as what they were built from."""
    float_weights = None
    for i, (label, files) in enumerate(ft.folder_bases()):
        got = ft.folder_expected(i)
        if label.startswith("float"):
            float_weights = float_weights or got
            assert got.keys() == float_weights.keys() == set(ft.FOLDER_WEIGHTS)
            assert all(np.array_equal(got[k], float_weights[k]) for k in got), label
        else:  # quantized: the same tensors, close to the float ones
            assert float_weights is not None
            assert got.keys() == float_weights.keys(), label
            for k, v in got.items():
                assert v.shape == float_weights[k].shape, (label, k)
                assert np.abs(v - float_weights[k]).max() <= 0.3 * np.abs(float_weights[k]).max(), (label, k)
        # a case of the base writes it again, and reads back the same
        case = ft.Case("folder", -1, "base", source=ft._Folder(dict(files)).source(), expect=i)
        assert ft.classify(case, tmp_path, ft._namespace()).outcome == "loaded-correct", label
    for i, blob in enumerate(ft.format_bases("gguf")):  # a re-layout at another alignment holds the same
        g = ft.gguf_parse(blob)
        g.kvs.insert(0, ("general.alignment", ft._kv("general.alignment", ft.G_U32, struct.pack("<I", 64)), 1))
        path, orig = tmp_path / f"{i}.gguf", tmp_path / f"orig{i}.gguf"
        path.write_bytes(ft.gguf_build(g, 64))
        orig.write_bytes(blob)
        meta, want_meta = aq.io.gguf.read_metadata(path), aq.io.gguf.read_metadata(orig)
        assert meta.keys() - {"general.alignment"} == want_meta.keys() - {"general.alignment"}
        assert all(meta[k].value == want_meta[k].value for k in want_meta if k != "general.alignment")
        again = {k: aq.dequantize(v) if isinstance(v, aq.QuantizedTensor) else v for k, v in aq.load(path).items()}
        want = ft.gguf_expected(i)
        assert again.keys() == want.keys()
        assert all(np.array_equal(again[k], want[k]) for k in want)
    for seed in range(40):  # every file under the limit; a real tokenizer's 150,000 tokens read (others may be refused)
        case = ft.make_case("gguf-meta", seed)
        assert len(case.blob) <= ft.GGUF_LIMIT
        if case.kind.startswith("bomb"):
            res = ft.classify(case, tmp_path, ft._namespace())
            assert not res.failed, (case.kind, res.detail)
            assert res.outcome == "loaded-correct" or not case.kind.startswith("bomb-tokens"), case.kind
