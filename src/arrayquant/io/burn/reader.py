"""Reading Burnpack files: :class:`BurnpackFile` (header and metadata checked, tensors one at a time),
:func:`read_burnpack`, :func:`load`, :func:`iter_tensors`, :func:`tensor_shapes` and :func:`sniff`.

Reading gives a :class:`~arrayquant.QuantizedTensor` for QFloat tensors (its bytes through
:func:`arrayquant.from_bytes`) and NumPy arrays for the rest (``Flex32`` as float32, ``Bool``
of any store as bool, notes saying so from :func:`iter_tensors`); param ids, metadata and
scalars come with :func:`read_burnpack` and are kept by
:func:`~arrayquant.io.burn.requantize.quantize_file`.

Reading enforces Burn's limits (``MAX_METADATA_SIZE`` 100 MiB, ``MAX_TENSOR_COUNT`` 100,000,
``MAX_TENSOR_SIZE`` 10 GiB, ``MAX_CBOR_RECURSION_DEPTH`` 128, ``MAX_FILE_SIZE`` 100 GiB) and
more than Burn checks: version exactly 1, every range inside the file, starts aligned to 256, no
two ranges overlapping, each tensor's byte count what its dtype and shape need, no CBOR tags, no
duplicate keys, no bytes after the metadata's CBOR item. All are :class:`CorruptDataError` (an
empty shape whose other extents no array can take, such as ``[0, 2**62]`` of F32, is a
:class:`ShapeError`); sizes are checked against the file before anything is read, so a lying
header never allocates more than the file holds. The metadata is walked item by item, not
decoded whole (see :class:`~arrayquant.io.burn.cbor.Walker`): only what is kept is built, each
descriptor, scalar or value of a key Burn does not write is decoded within
:data:`~arrayquant.io.burn.layout.MAX_ITEM_SIZE` bytes and checked at once, ``metadata`` and
``scalars`` hold at most :data:`~arrayquant.io.burn.layout.MAX_ENTRIES` entries and the metadata
map 64 keys, so reading costs memory in proportion to the file (about its metadata's size, plus
what the tensors' entries keep).
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...backends import default, shim
from ...errors import CorruptDataError, SchemeError, ShapeError
from ...invariants.data import MAX_ELEMENTS
from ...scheme import QuantScheme
from ...tensor import QuantizedTensor
from ..regions import write_all
from ..safetensors.reader import ml_dtype
from .bytes import from_bytes
from .cbor import BadCbor, Walker
from .layout import (
    ALIGNMENT,
    BOOL_STORES,
    CHUNK,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_CBOR_DEPTH,
    MAX_ENTRIES,
    MAX_FILE_SIZE,
    MAX_METADATA_SIZE,
    MAX_TENSOR_COUNT,
    MAX_TENSOR_SIZE,
    PLAIN,
    U64,
    VERSION,
    check_scalar,
    is_int,
    short,
)
from .schemes import decode_scheme

__all__ = [
    "Burnpack",
    "BurnpackEntry",
    "BurnpackFile",
    "iter_tensors",
    "load",
    "read_burnpack",
    "sniff",
    "tensor_shapes",
]

_MAX_KEYS = 64  # keys of the metadata map (Burn's has three)
_NUMPY_MAX_BYTES = 2**63 - 1  # NumPy refuses a shape whose non-zero extents times the item size pass this
_MAX_RANK = 64  # NumPy's; Burn has no limit, but no array of more axes can be built here


class BurnpackEntry(NamedTuple):
    """One tensor's descriptor, checked: its dtype (as stored), shape and absolute byte range."""

    name: str
    dtype: Any  # the DType's CBOR value, e.g. "F32", {"Bool": "U8"}, {"QFloat": {...}}
    shape: tuple[int, ...]
    start: int  # absolute, in the file
    stop: int
    param_id: int | None
    scheme: QuantScheme | None  # for QFloat

    @property
    def nbytes(self) -> int:
        return self.stop - self.start

    @property
    def kind(self) -> str:
        """``"QFloat"``, ``"Bool"`` or the plain dtype name."""
        return self.dtype if isinstance(self.dtype, str) else next(iter(self.dtype))


def _dtype_of(obj: Any, where: str) -> tuple[str | None, QuantScheme | None]:
    """(NumPy raw dtype or None for QFloat, scheme) of a stored DType; typed errors otherwise."""
    if isinstance(obj, str) and obj in PLAIN:
        return PLAIN[obj][0], None
    if isinstance(obj, dict) and len(obj) == 1:
        ((kind, arg),) = obj.items()
        if kind == "Bool" and isinstance(arg, str) and arg in BOOL_STORES:
            return BOOL_STORES[arg], None
        if kind == "QFloat":
            try:
                return None, decode_scheme(arg)
            except SchemeError as exc:
                raise SchemeError(f"{where}: {exc}") from None
    names = ", ".join([*PLAIN, "{'Bool': store}", "{'QFloat': scheme}"])
    msg = f"{where}: dtype {short(obj)} is not a Burn DType ({names})"
    raise CorruptDataError(msg)


def _uint(x: Any, limit: int, what: str) -> int:
    if not is_int(x) or not 0 <= x < limit:
        msg = f"{what} {short(x)} is not an integer in [0, {limit})"
        raise CorruptDataError(msg)
    return int(x)


def _expected_nbytes(raw: str | None, scheme: QuantScheme | None, shape: tuple[int, ...], where: str) -> int:
    if raw is not None:
        return math.prod(shape) * np.dtype(raw).itemsize
    from ...storage import quantized_nbytes

    assert scheme is not None
    try:
        return quantized_nbytes(scheme, shape)
    except (SchemeError, ShapeError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def _check_span(shape: tuple[int, ...], itemsize: int, where: str) -> None:
    """Refuse an empty shape no array can take: NumPy sizes even an empty array by its non-zero extents.

    A non-empty shape needs its bytes in the file, which bounds it; an empty one needs none, so
    ``[0, 2**62]`` would reach NumPy (a ValueError) and ``[0, 2**64 - 1]`` overflow its indices.
    ``itemsize`` is the array's (a bool is read as one byte whatever its store).
    """
    span = math.prod(d for d in shape if d)
    if span > MAX_ELEMENTS or span * itemsize > _NUMPY_MAX_BYTES:
        msg = (
            f"{where}: shape {list(shape)} is empty, but its non-zero extents multiply to {span} elements of "
            f"{itemsize} byte(s), more than any array can hold (at most {MAX_ELEMENTS} elements and "
            f"{_NUMPY_MAX_BYTES} bytes; NumPy sizes an empty array by those extents too), so it cannot be read; "
            "save the empty tensor with small extents, e.g. [0]"
        )
        raise ShapeError(msg)


class BurnpackFile:
    """An open Burnpack file, its header and metadata validated; tensors read one at a time.

    Attributes
    ----------
    entries : list of BurnpackEntry
        In file order (by data offset).
    metadata : dict of str to str
    scalars : dict of str to (kind, value)
        ``kind`` is ``"Int"``, ``"UInt"``, ``"Float"`` or ``"Bool"``.
    param_ids : dict of str to int
        The tensors that have one.

    Raises
    ------
    CorruptDataError
        Anything that is not a Burnpack file as Burn writes it (see the module notes).
    SchemeError
        A QFloat dtype in an encoding arrayquant does not read.
    ShapeError
        A shape no array can take (an empty one whose other extents are too large, a QFloat one
        arrayquant refuses).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115 - closed by close() / the context manager
        try:
            self._parse()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> BurnpackFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def _parse(self) -> None:
        where = str(self.path)
        size = os.fstat(self._file.fileno()).st_size
        if size > MAX_FILE_SIZE:
            msg = f"{where}: {size} bytes is over Burn's limit of {MAX_FILE_SIZE} bytes for a Burnpack file"
            raise CorruptDataError(msg)
        head = self._read(0, min(size, HEADER_SIZE))
        if len(head) < HEADER_SIZE:
            msg = f"{where}: {len(head)} bytes, less than the {HEADER_SIZE}-byte Burnpack header: truncated"
            raise CorruptDataError(msg)
        magic, version, meta_size = HEADER.unpack(head)
        if magic != MAGIC:
            msg = f"{where}: magic 0x{magic:08X} is not Burnpack's 0x{MAGIC:08X} (b'NRUB'); not a Burnpack file"
            raise CorruptDataError(msg)
        if version != VERSION:
            msg = f"{where}: Burnpack format version {version}; arrayquant reads version {VERSION}"
            raise CorruptDataError(msg)
        if meta_size > MAX_METADATA_SIZE:
            msg = f"{where}: metadata_size {meta_size} is over Burn's limit of {MAX_METADATA_SIZE} bytes"
            raise CorruptDataError(msg)
        if HEADER_SIZE + meta_size > size:
            msg = (
                f"{where}: metadata_size {meta_size} runs past the end of the {size}-byte file; "
                "the file is truncated or the header lies"
            )
            raise CorruptDataError(msg)
        self.data_start = -(-(HEADER_SIZE + meta_size) // ALIGNMENT) * ALIGNMENT
        cbor = Walker(self._read(HEADER_SIZE, meta_size), where)
        try:
            entries = self._metadata(cbor, size)
        except BadCbor as exc:
            msg = (
                f"{where}: the metadata is not valid CBOR as Burn writes it (nesting at most {MAX_CBOR_DEPTH}, "
                f"no tags, no duplicate keys): {exc}"
            )
            raise CorruptDataError(msg) from None
        if cbor.at != meta_size:
            msg = f"{where}: {meta_size - cbor.at} bytes follow the CBOR metadata inside metadata_size; the header lies"
            raise CorruptDataError(msg)
        entries.sort(key=lambda e: (e.start, e.stop, e.name))
        for before, after in itertools.pairwise(entries):
            if after.start < before.stop:
                msg = (
                    f"{where}: tensors {before.name!r} and {after.name!r} overlap (data offsets "
                    f"[{before.start - self.data_start}, {before.stop - self.data_start}) and "
                    f"[{after.start - self.data_start}, {after.stop - self.data_start}))"
                )
                raise CorruptDataError(msg)
        self.entries = entries
        self.by_name = {e.name: e for e in entries}
        self.param_ids = {e.name: e.param_id for e in entries if e.param_id is not None}

    def _metadata(self, cbor: Walker, size: int) -> list[BurnpackEntry]:
        """Burn's ``Metadata`` map: its tensors' entries; ``metadata`` and ``scalars`` kept, other keys checked."""
        not_meta = f"{self.path}: the metadata is not a map with a 'tensors' map"
        major, n = cbor.head()
        if major != 5:
            raise CorruptDataError(not_meta)
        self.metadata: dict[str, str] = {}
        self.scalars: dict[str, tuple[str, Any]] = {}
        entries: list[BurnpackEntry] | None = None
        seen: set[str | bytes] = set()
        while cbor.more(n, len(seen)):
            self._over(
                len(seen) + 1,
                _MAX_KEYS,
                "keys in the metadata map is over arrayquant's limit of {limit}; Burn's has 3",
            )
            key = cbor.key(seen)
            seen.add(key)
            if key == "tensors":
                entries = self._tensors(cbor, size, not_meta)
            elif key == "metadata":
                self.metadata = self._strings(cbor)
            elif key == "scalars":
                self.scalars = self._scalars(cbor)
            else:  # a key Burn does not write: checked as CBOR, then dropped
                cbor.value(1, "the value of key {}, which Burn does not write,", key)
        if entries is None:
            raise CorruptDataError(not_meta)
        return entries

    def _map(self, cbor: Walker, bad: str, limit: int, what: str) -> int | None:
        """The entry count of the map that comes next (None: up to a break), at most ``limit``."""
        major, n = cbor.head()
        if major != 5:
            raise CorruptDataError(bad)
        self._over(n, limit, what)
        return n

    def _over(self, n: int | None, limit: int, what: str) -> None:
        """``what`` says ``n`` is over ``limit`` (a format string with ``{limit}``)."""
        if n is not None and n > limit:
            msg = f"{self.path}: {n} {what.format(limit=limit)}"
            raise CorruptDataError(msg)

    def _tensors(self, cbor: Walker, size: int, bad: str) -> list[BurnpackEntry]:
        what = "tensors is over Burn's limit of {limit}"
        n = self._map(cbor, bad, MAX_TENSOR_COUNT, what)
        names: set[str | bytes] = set()
        entries = []
        while cbor.more(n, len(names)):
            self._over(len(names) + 1, MAX_TENSOR_COUNT, what)  # an indefinite-length map that goes on
            name = cbor.key(names)
            names.add(name)
            desc = cbor.value(2, "the descriptor of tensor {} (Burn's take a few hundred bytes)", name)
            entries.append(self._entry(name, desc, size))
        return entries

    def _strings(self, cbor: Walker) -> dict[str, str]:
        bad = f"{self.path}: 'metadata' is not a map of strings to strings"
        what = "'metadata' entries is over arrayquant's limit of {limit}, the number of tensors Burn allows"
        n = self._map(cbor, bad, MAX_ENTRIES, what)
        out: dict[str, str] = {}
        while cbor.more(n, len(out)):
            self._over(len(out) + 1, MAX_ENTRIES, what)
            key = cbor.key(out)
            major, length = cbor.head()
            if not isinstance(key, str) or major != 3:
                raise CorruptDataError(bad)
            out[key] = str(cbor.string(major, length))
        return out

    def _scalars(self, cbor: Walker) -> dict[str, tuple[str, Any]]:
        bad = f"{self.path}: 'scalars' is not a map of names to scalars"
        what = "'scalars' entries is over arrayquant's limit of {limit}, the number of tensors Burn allows"
        n = self._map(cbor, bad, MAX_ENTRIES, what)
        out: dict[str, tuple[str, Any]] = {}
        while cbor.more(n, len(out)):
            self._over(len(out) + 1, MAX_ENTRIES, what)
            name = cbor.key(out)
            if not isinstance(name, str):
                raise CorruptDataError(bad)
            out[name] = check_scalar(name, cbor.value(2, "scalar {}", name), str(self.path))
        return out

    def _entry(self, name: Any, desc: Any, size: int) -> BurnpackEntry:
        where = f"{self.path}: tensor {short(name)}"
        if not isinstance(name, str) or not isinstance(desc, dict):
            msg = f"{where}: not a name with a descriptor map"
            raise CorruptDataError(msg)
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in desc]
        if missing:
            msg = f"{where}: the descriptor lacks {missing}"
            raise CorruptDataError(msg)
        shape_obj, offsets = desc["shape"], desc["data_offsets"]
        if not isinstance(shape_obj, list) or len(shape_obj) > _MAX_RANK:
            msg = f"{where}: shape {short(shape_obj)} is not a list of at most {_MAX_RANK} extents"
            raise CorruptDataError(msg)
        shape = tuple(_uint(d, U64, f"{where}: shape extent") for d in shape_obj)
        if not isinstance(offsets, list) or len(offsets) != 2:
            msg = f"{where}: data_offsets {short(offsets)} is not [start, end]"
            raise CorruptDataError(msg)
        start, end = (_uint(o, U64, f"{where}: data offset") for o in offsets)
        pid = desc.get("param_id")
        param_id = None if pid is None else _uint(pid, U64, f"{where}: param_id")
        if end < start:
            msg = f"{where}: data_offsets [{start}, {end}] end before they start"
            raise CorruptDataError(msg)
        if end - start > MAX_TENSOR_SIZE:
            msg = f"{where}: {end - start} bytes is over Burn's limit of {MAX_TENSOR_SIZE} bytes for one tensor"
            raise CorruptDataError(msg)
        if start % ALIGNMENT:
            msg = f"{where}: data offset {start} is not a multiple of {ALIGNMENT}, as Burn aligns every tensor"
            raise CorruptDataError(msg)
        if self.data_start + end > size:
            msg = (
                f"{where}: data_offsets [{start}, {end}] run past the end of the file (the data section "
                f"holds {max(size - self.data_start, 0)} bytes); the file is truncated or the header lies"
            )
            raise CorruptDataError(msg)
        raw, scheme = _dtype_of(desc["dtype"], where)
        want = _expected_nbytes(raw, scheme, shape, where)
        if want != end - start:
            kind = desc["dtype"] if raw is not None else f"QFloat {scheme}"
            msg = (
                f"{where}: dtype {short(kind)} and shape {list(shape)} need {want} bytes, "
                f"but its data_offsets hold {end - start}"
            )
            raise CorruptDataError(msg)
        if raw is not None:  # a {"Bool": store} is read as bools of one byte
            _check_span(shape, 1 if isinstance(desc["dtype"], dict) else np.dtype(raw).itemsize, where)
        return BurnpackEntry(
            name, desc["dtype"], shape, self.data_start + start, self.data_start + end, param_id, scheme
        )

    def _read(self, at: int, n: int) -> bytearray:
        buf = bytearray(n)  # returned as is: a tensor is read into memory once, not copied again
        view, done = memoryview(buf), 0
        self._file.seek(at)
        while done < n:
            got = self._file.readinto(view[done:])
            if not got:
                msg = f"{self.path}: the file ends {n - done} bytes early; it changed or was truncated while read"
                raise CorruptDataError(msg)
            done += got
        return buf

    def raw(self, name: str) -> bytearray:
        """A tensor's stored bytes."""
        e = self.by_name[name]
        return self._read(e.start, e.nbytes)

    def copy_to(self, name: str, fd: int, offset: int) -> None:
        """Write a tensor's stored bytes at ``offset`` of the open file ``fd``, a chunk at a time."""
        e = self.by_name[name]
        at = e.start
        while at < e.stop:
            data = self._read(at, min(CHUNK, e.stop - at))
            write_all(fd, data, offset)
            at, offset = at + len(data), offset + len(data)

    def tensor(self, name: str, *, backend: str | None = None, device: Any = None) -> tuple[Any, str]:
        """``(QuantizedTensor or NumPy array, note)`` for one tensor; ``note`` says what was converted."""
        e = self.by_name[name]
        data = self.raw(name)
        if e.scheme is not None:
            return from_bytes(data, e.scheme, e.shape, backend=backend, device=device), ""
        if e.kind == "Bool":
            store = e.dtype["Bool"]
            codes = np.frombuffer(data, dtype=BOOL_STORES[store])
            if np.any(codes > 1):
                i = int(np.argmax(codes > 1))
                msg = f"{self.path}: tensor {name!r}: bool value {int(codes[i])} at flat index {i} is not 0 or 1"
                raise CorruptDataError(msg)
            return codes.astype(bool).reshape(e.shape), "" if store == "Native" else f"Bool({store}) read as bool"
        raw, spec = PLAIN[e.dtype]
        # a view of the buffer just read on a little-endian machine; byte-swapped on a big-endian one
        arr = np.frombuffer(data, dtype=raw).astype(np.dtype(raw).newbyteorder("="), copy=False).reshape(e.shape)
        if e.dtype == "BF16":
            arr = arr.view(ml_dtype(spec))
        return arr, "Flex32 read as float32" if e.dtype == "Flex32" else ""


class Burnpack(NamedTuple):
    """What :func:`read_burnpack` returns."""

    tensors: dict[str, Any]
    param_ids: dict[str, int]
    metadata: dict[str, str]
    scalars: dict[str, tuple[str, Any]]


def sniff(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts with Burnpack's magic; never raises (an unreadable file is not one)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except (OSError, ValueError, TypeError):
        return False
    return len(head) == 4 and struct.unpack("<I", head)[0] == MAGIC


def read_burnpack(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> Burnpack:
    """Every tensor of a Burnpack file, with its param ids, metadata and scalars.

    Parameters
    ----------
    path
        The ``.bpk`` file.
    backend, device : optional
        Where the arrays go (default: the default backend and its default device).

    Returns
    -------
    Burnpack
        ``tensors`` (name to :class:`~arrayquant.QuantizedTensor` for QFloat, to an array otherwise, in file
        order), ``param_ids``, ``metadata``, ``scalars``.

    Raises
    ------
    CorruptDataError
        A file that is not Burnpack as Burn writes it, or breaks Burn's limits.
    SchemeError
        A QFloat scheme in an encoding arrayquant does not read.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> from arrayquant.io.burn.writer import save
    >>> path = os.path.join(tempfile.mkdtemp(), "m.bpk")
    >>> save(path, {"w": np.ones((2, 3), np.float32)}, param_ids={"w": 7}, metadata={"producer": "doc"})
    >>> bp = read_burnpack(path, backend="numpy")
    >>> bp.tensors["w"].shape, bp.param_ids, bp.metadata
    ((2, 3), {'w': 7}, {'producer': 'doc'})
    """
    name = backend or default().name
    same = name.strip().lower() == "numpy" and device is None
    tensors: dict[str, Any] = {}
    with BurnpackFile(path) as f:
        for e in f.entries:
            obj, _ = f.tensor(e.name, backend=name, device=device)
            tensors[e.name] = obj if same or isinstance(obj, QuantizedTensor) else shim.convert(obj, name, device)
        return Burnpack(tensors, dict(f.param_ids), dict(f.metadata), dict(f.scalars))


def load(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
    """Every tensor of a Burnpack file: :class:`~arrayquant.QuantizedTensor` for QFloat ones, arrays for the rest.

    See :func:`read_burnpack`, which also returns the param ids, metadata and scalars.
    """
    return read_burnpack(path, backend=backend, device=device).tensors


def iter_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any, str]]:
    """``(name, QuantizedTensor or NumPy array, note)`` one at a time, in file order.

    ``note`` is ``""``, or says what was converted (``"Flex32 read as float32"``,
    ``"Bool(U8) read as bool"``). QuantizedTensors are on the NumPy backend.
    """
    with BurnpackFile(path) as f:
        for e in f.entries:
            obj, note = f.tensor(e.name, backend="numpy")
            yield e.name, obj, note


def tensor_shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, in file order, from the header and metadata alone.

    >>> import numpy as np, tempfile, os
    >>> from arrayquant.io.burn.writer import save
    >>> path = os.path.join(tempfile.mkdtemp(), "m.bpk")
    >>> save(path, {"w": np.ones((2, 3), np.float32)})
    >>> tensor_shapes(path)
    {'w': (2, 3)}
    """
    with BurnpackFile(path) as f:
        return {e.name: e.shape for e in f.entries}
