"""Hostile Burnpack files (``io/burn/``): memory in proportion to the file, typed errors for absurd shapes.

Files are laid out as in ``test_burnpack.py`` (10-byte header, CBOR metadata, data at the next
multiple of 256); the hostile metadata is spliced from CBOR heads by hand so that building it
costs the test little. Memory is the peak RSS growth of ``aq.load`` in a fresh interpreter
(``resource.getrusage``): before the metadata was walked item by item, decoding it whole took
up to 75 times its size (1.4 GiB for 20 MB of ``0xA0``, each an empty dict).
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cbor2 = pytest.importorskip("cbor2")

import arrayquant as aq  # noqa: E402
from arrayquant.errors import CorruptDataError, ShapeError  # noqa: E402
from arrayquant.invariants.data import MAX_ELEMENTS  # noqa: E402
from arrayquant.io.burn import burnpack as bp  # noqa: E402

MAGIC = 0x4255524E
MB = 20_000_000  # the size of each hostile metadata block


def head(major: int, n: int) -> bytes:
    """A CBOR head with an 8-byte argument (valid CBOR, if not the narrowest)."""
    return bytes([major << 5 | 27]) + struct.pack(">Q", n)


def text(s: str) -> bytes:
    return bytes(cbor2.dumps(s))


def bpk(meta: bytes, data: bytes = b"") -> bytes:
    raw = struct.pack("<IHI", MAGIC, 1, len(meta)) + meta
    return raw + bytes(-len(raw) % 256) + data


def with_tensors(tensors: bytes, *rest: bytes) -> bytes:
    """The metadata map: ``tensors`` (a CBOR map), then key/value pairs already encoded."""
    return bytes([0xA0 + 1 + len(rest) // 2]) + text("tensors") + tensors + b"".join(rest)


def descriptor(extra: bytes = b"", shape: list[int] | None = None) -> bytes:
    """An empty U8 tensor's descriptor, with ``extra`` (an encoded key and value) appended."""
    fields = {"dtype": "U8", "shape": [0] if shape is None else shape, "data_offsets": [0, 0]}
    body = b"".join(text(k) + cbor2.dumps(v) for k, v in fields.items())
    return bytes([0xA0 + len(fields) + bool(extra)]) + body + extra


def unknown_key_of_empty_maps() -> bytes:
    return with_tensors(b"\xa0", text("extra"), head(4, MB), b"\xa0" * MB)


def padded_descriptors() -> bytes:
    n, pad = 10_000, MB // 10_000
    junk = text("junk") + head(4, pad) + b"\xa0" * pad  # a key Burn does not write: read, then dropped
    tensors = head(5, n) + b"".join(text(f"t{i:05}") + descriptor(junk) for i in range(n))
    return with_tensors(tensors)


def one_huge_descriptor() -> bytes:
    return with_tensors(head(5, 1) + text("w") + descriptor(text("junk") + head(4, MB) + b"\x80" * MB))


def short_metadata_strings() -> bytes:
    n = MB // 10  # 10 bytes a pair
    pairs = b"".join(text(f"{i:07x}") + text("v") for i in range(n))
    return with_tensors(b"\xa0", text("metadata"), head(5, n), pairs)


def many_scalars() -> bytes:
    n = MB // 14  # 14 bytes a scalar
    pairs = b"".join(text(f"{i:07x}") + b"\xa1" + text("Int") + b"\x01" for i in range(n))
    return with_tensors(b"\xa0", text("scalars"), head(5, n), pairs)


# name -> (metadata, error type or None, message, peak RSS growth in MiB before the walk (all loaded then))
HOSTILE: dict[str, tuple[Any, type[Exception] | None, str, int]] = {
    "an unknown key holding empty maps": (
        unknown_key_of_empty_maps,
        CorruptDataError,
        "the value of key 'extra', which Burn does not write, takes more than 65536 bytes of CBOR",
        1417,
    ),
    "descriptors padded with empty maps": (padded_descriptors, None, "", 1427),
    "one descriptor of empty lists": (
        one_huge_descriptor,
        CorruptDataError,
        "the descriptor of tensor 'w' (Burn's take a few hundred bytes) takes more than 65536 bytes of CBOR",
        1417,
    ),
    "short metadata strings": (
        short_metadata_strings,
        CorruptDataError,
        "2000000 'metadata' entries is over arrayquant's limit of 100000",
        241,
    ),
    "many scalars": (many_scalars, CorruptDataError, "1428571 'scalars' entries is over arrayquant's limit", 703),
}

# A process started by this one inherits its peak RSS as ru_maxrss (exec keeps it); one forked from
# that fresh interpreter starts from the interpreter's own, so the load is measured there.
MEASURE = textwrap.dedent(
    """
    import json, os, resource, sys, time
    import arrayquant as aq
    from arrayquant.io.burn import burnpack  # noqa: F401 - imported before the baseline
    import cbor2  # noqa: F401
    pid = os.fork()
    if pid:
        sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    try:
        n, error, message = len(aq.load(sys.argv[1], backend="numpy")), None, ""
    except Exception as exc:
        n, error, message = 0, type(exc).__name__, str(exc)
    seconds = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # KiB on Linux
    print(json.dumps({"n": n, "error": error, "message": message, "mib": grown, "seconds": seconds}), flush=True)
    os._exit(0)
    """
)


def load_in_a_fresh_process(path: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux (bytes on macOS)")
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_metadata_costs_memory_in_proportion(case: str, tmp_path: Path) -> None:
    build, error, message, before = HOSTILE[case]
    meta = build()
    assert MB <= len(meta) < 1.2 * MB
    path = tmp_path / "h.bpk"
    path.write_bytes(bpk(meta))
    got = load_in_a_fresh_process(path)
    # at most 5 times the metadata's size: the bytes read, what is kept, and one bounded window decoded
    bound = 5 * len(meta) / 2**20
    assert got["mib"] < bound, f"{case}: {got['mib']:.0f} MiB (was {before} MiB), bound {bound:.0f} MiB"
    if error is None:
        assert got["error"] is None, got["message"]
        assert got["n"] == 10_000
    else:
        assert got["error"] == error.__name__
        assert message in got["message"], got["message"]


def test_the_errors_are_typed_in_process(tmp_path: Path) -> None:
    """The same refusals as above, caught as the library's error types with pytest.raises (small files)."""
    scalars = b"".join(text(f"s{i}") + b"\xa1" + text("Int") + b"\x01" for i in range(100_001))
    cases = [
        (with_tensors(b"\xa0", text("x"), head(4, 70_000), b"\xa0" * 70_000), r"key 'x', which Burn does not write"),
        (
            with_tensors(head(5, 1) + text("w") + descriptor(text("j") + head(4, 70_000) + b"\x80" * 70_000)),
            r"the descriptor of tensor 'w' \(Burn's take a few hundred bytes\) takes more than 65536 bytes",
        ),
        (
            with_tensors(b"\xa0", text("metadata"), head(5, 100_001)),
            r"100001 'metadata' entries is over arrayquant's limit of 100000, the number of tensors Burn allows",
        ),
        (
            with_tensors(b"\xa0", text("scalars"), b"\xbf" + scalars + b"\xff"),
            r"100001 'scalars' entries is over arrayquant's limit of 100000",
        ),
        (head(5, 65) + b"".join(text(f"k{i}") + b"\x00" for i in range(65)), r"65 keys in the metadata map is over"),
        (with_tensors(head(5, 100_001)), r"100001 tensors is over Burn's limit of 100000"),
    ]
    for i, (meta, message) in enumerate(cases):
        path = tmp_path / f"{i}.bpk"
        path.write_bytes(bpk(meta))
        with pytest.raises(CorruptDataError, match=message):
            aq.load(path, backend="numpy")


def test_an_indefinite_tensors_map_past_the_limit(tmp_path: Path) -> None:
    """A map of indefinite length says no count up front: the count is checked as it goes."""
    entries = b"".join(text(f"t{i}") + descriptor() for i in range(100_001))
    path = tmp_path / "i.bpk"
    path.write_bytes(bpk(with_tensors(b"\xbf" + entries + b"\xff")))
    with pytest.raises(CorruptDataError, match=r"100001 tensors is over Burn's limit of 100000"):
        bp.load(path)


def test_what_burn_may_write_still_reads(tmp_path: Path) -> None:
    """Indefinite lengths, text in chunks, a small key Burn does not write, a descriptor past the first window."""
    shape = [1] * 63 + [4]  # each extent in 9 bytes: a 600-byte descriptor
    extents = b"\x9f" + b"".join(head(0, d) for d in shape) + b"\xff"
    desc = b"\xa3" + text("dtype") + text("U8") + text("shape") + extents + text("data_offsets") + cbor2.dumps([0, 4])
    assert len(desc) > 512
    chunked = b"\x7f" + text("a") + text("bc") + b"\xff"
    future = text("future") + cbor2.dumps({"a": [1, 2, {"b": None}]})
    noted = descriptor(text("note") + text("x" * 20_000))  # past the second window too (8 KiB)
    tensors = b"\xbf" + text("w") + desc + text("z") + noted + b"\xff"
    meta = b"\xbf" + text("tensors") + tensors + text("metadata") + b"\xa1" + chunked + text("v") + future + b"\xff"
    path = tmp_path / "ok.bpk"
    path.write_bytes(bpk(meta, bytes([1, 2, 3, 4])))
    got = bp.read_burnpack(path, backend="numpy")
    assert got.tensors["w"].shape == (1,) * 63 + (4,)
    assert got.tensors["w"].ravel().tolist() == [1, 2, 3, 4]
    assert got.tensors["z"].shape == (0,)
    assert got.metadata == {"abc": "v"}


def test_the_tensor_limit_itself_still_reads(tmp_path: Path) -> None:
    """Burn's 100,000 tensors, each with a param id: read, in file order, none refused by the new bounds."""
    n = 100_000
    entries = b"".join(
        text(f"layer{i:06}.weight") + descriptor(text("param_id") + head(0, 2**40 + i)) for i in range(n)
    )
    path = tmp_path / "many.bpk"
    path.write_bytes(bpk(with_tensors(head(5, n) + entries)))
    with bp.BurnpackFile(path) as f:
        assert len(f.entries) == n
        assert f.param_ids["layer099999.weight"] == 2**40 + n - 1
        assert {e.shape for e in f.entries} == {(0,)}


def test_cbor_faults_still_name_the_rules(tmp_path: Path) -> None:
    cases = [
        (with_tensors(b"\xc1\xa0"), r"not valid CBOR as Burn writes it .*: CBOR tag 1"),
        (with_tensors(b"\xa0", text("metadata"), b"\xa1" + text("k") + b"\xd8\x63" + text("v")), r"CBOR tag 99"),
        (with_tensors(b"\xa2" + text("w") + descriptor() + text("w") + descriptor()), r"Duplicate map key 'w'"),
        (with_tensors(b"\xa1" + b"\x01" + descriptor()), r"a map key of CBOR major type 0; keys are text"),
        (with_tensors(b"\xa1" + b"\x62\xff\xfe" + descriptor()), r"text that is not UTF-8"),
        (with_tensors(b"\xa1" + text("w") + b"\xa1"), r"premature end of stream"),
        (with_tensors(b"\xa2" + text("w") + descriptor()), r"premature end of the metadata: an item at offset"),
        (b"\xbf" + text("tensors") + b"\xa0", r"premature end of the metadata"),
        (with_tensors(b"\xbc"), r"invalid CBOR initial byte 0xbc at metadata offset 9"),
    ]
    for i, (meta, message) in enumerate(cases):
        path = tmp_path / f"{i}.bpk"
        path.write_bytes(bpk(meta))
        with pytest.raises(CorruptDataError, match=message):
            bp.load(path)


# -- absurd shapes --------------------------------------------------------------------------------------
def shape_file(tmp_path: Path, dtype: Any, shape: list[int]) -> Path:
    desc = {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
    path = tmp_path / "s.bpk"
    path.write_bytes(bpk(cbor2.dumps({"tensors": {"w": desc}})))
    return path


EMPTY_BEYOND = [
    ("F32", [0, 2**62]),  # the audit's: NumPy's "array is too big"
    ("F64", [0, 2**60]),
    ("U8", [0, 2**62 + 1]),  # past the element limit, though NumPy would take it
    ("U8", [0, 2**63]),  # NumPy: "Maximum allowed dimension exceeded"
    ("U8", [2**32, 2**32, 0]),  # the product overflows int64 with a zero in it
    ("U16", [0, 2**64 - 1, 2**64 - 1]),
    ({"Bool": "U32"}, [0, 2**62 + 1]),
]


@pytest.mark.parametrize(("dtype", "shape"), EMPTY_BEYOND, ids=[f"{d}-{s}" for d, s in EMPTY_BEYOND])
def test_empty_shapes_no_array_can_take_are_typed(dtype: Any, shape: list[int], tmp_path: Path) -> None:
    span = int(np.prod([d for d in shape if d], dtype=object))
    message = (
        rf"tensor 'w': shape {re.escape(str(shape))} is empty, but its non-zero extents multiply to {span} elements "
        rf"of \d byte\(s\), more than any array can hold \(at most {MAX_ELEMENTS} elements .* save the empty tensor "
        r"with small extents, e\.g\. \[0\]"
    )
    with pytest.raises(ShapeError, match=message):
        bp.load(shape_file(tmp_path, dtype, shape))


@pytest.mark.parametrize(
    ("dtype", "shape"), [("U8", [0, 2**62]), ("F64", [0, 2**59]), ({"Bool": "U32"}, [0, 2**62]), ("F32", [0] * 64)]
)
def test_empty_shapes_at_the_limit_still_read(dtype: Any, shape: list[int], tmp_path: Path) -> None:
    got = bp.load(shape_file(tmp_path, dtype, shape))["w"]
    assert got.shape == tuple(shape)
    assert got.size == 0


def test_other_absurd_shapes_stay_typed(tmp_path: Path) -> None:
    """Negative, non-integer and non-empty huge extents were typed already; they stay so."""
    for shape, error, message in [
        ([-1], CorruptDataError, r"shape extent -1 is not an integer in \[0, 18446744073709551616\)"),
        ([2**64], CorruptDataError, r"not valid CBOR as Burn writes it .*CBOR tag 2"),  # a bignum: no u64
        ([1.0], CorruptDataError, r"shape extent 1\.0 is not an integer"),
        ([2**62, 2**62], CorruptDataError, r"shape \[4611686018427387904, 4611686018427387904\] need .* bytes, but"),
    ]:
        with pytest.raises(error, match=message):
            bp.load(shape_file(tmp_path, "U8", shape))
    qfloat = {"QFloat": bp.encode_scheme("q8s:native")}
    with pytest.raises(
        ShapeError, match=r"tensor 'w': shape \(0, 4611686018427387904\) must have .* every extent >= 1"
    ):
        bp.load(shape_file(tmp_path, qfloat, [0, 2**62]))
