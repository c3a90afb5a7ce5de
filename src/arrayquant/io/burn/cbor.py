"""The CBOR of Burnpack metadata: cbor2 loaded when first needed, a bounded walker, ciborium's floats.

:class:`Walker` reads the metadata item by item within bounds (no tags, no duplicate keys, a
depth limit, each decoded item at most :data:`~arrayquant.io.burn.layout.MAX_ITEM_SIZE` bytes);
:func:`dumps` writes it with every :class:`MinimalFloat` at the narrowest width, as ciborium does.
cbor2 is imported only here and only when called, so importing the Burnpack modules needs none.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Container
from typing import Any

from ...errors import BackendUnavailableError, CorruptDataError, DTypeError
from .layout import MAX_CBOR_DEPTH, MAX_ITEM_SIZE, short

__all__ = ["BadCbor", "MinimalFloat", "Walker", "cbor2_module", "dumps"]

_WINDOWS = (512, 8192, MAX_ITEM_SIZE)  # bytes an item is decoded in, each tried when it runs past the last


def cbor2_module() -> Any:
    """The cbor2 module, or a BackendUnavailableError that says how to install it."""
    try:
        import cbor2
    except ImportError:  # pragma: no cover - depends on the environment
        msg = "Burnpack files need cbor2: pip install 'arrayquant[burn]' (or cbor2)"
        raise BackendUnavailableError(msg) from None
    return cbor2


class _AnyTag(dict[int, Any]):
    """cbor2's semantic decoders, every tag refused: Burn writes none, and some decode to objects."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, tag: int) -> Callable[..., Any]:
        def refuse(*_: Any) -> Any:
            msg = f"CBOR tag {tag}"
            raise ValueError(msg)

        return refuse

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key]


def _refuse_tag(_: Any, tag: Any) -> Any:
    msg = f"CBOR tag {getattr(tag, 'tag', '?')}"
    raise ValueError(msg)


_NO_TAGS = _AnyTag()


class BadCbor(Exception):
    """A CBOR fault, raised as one CorruptDataError that says which CBOR Burn's writer makes."""


class Walker:
    """The metadata's CBOR, walked item by item so that only what is kept gets built.

    Decoding it whole cost memory far beyond its size: one byte ``0xA0`` is an empty dict of 64
    bytes, so 20 MB of them took 1.4 GiB. Here the maps Burn writes (the metadata, its tensors,
    metadata and scalars) are walked, keys and text read directly, and every other item (a
    descriptor, a scalar, the value of a key Burn does not write) is decoded by cbor2 inside a
    window of at most :data:`MAX_ITEM_SIZE` bytes and checked at once: decoding costs at most
    ~80 bytes a byte of that window, and nothing but the checked result stays.
    """

    def __init__(self, raw: bytearray, where: str) -> None:
        self.cbor2 = cbor2_module()
        self.raw = raw
        self.view = memoryview(raw)
        self.at = 0
        self.where = where

    def _take(self, n: int) -> memoryview:
        end = self.at + n
        if end > len(self.raw):
            msg = f"premature end of the metadata: an item at offset {self.at} needs {n} more bytes"
            raise BadCbor(msg)
        out, self.at = self.view[self.at : end], end
        return out

    def head(self) -> tuple[int, int | None]:
        """The next item's major type and argument (None: an indefinite length); a tag is a fault."""
        at = self.at
        byte = self._take(1)[0]
        major, info = byte >> 5, byte & 0x1F
        if info < 24:
            arg: int | None = info
        elif info < 28:
            arg = int.from_bytes(self._take(1 << (info - 24)), "big")
        elif info == 31 and 2 <= major <= 5:
            arg = None
        else:
            msg = f"invalid CBOR initial byte 0x{byte:02x} at metadata offset {at}"
            raise BadCbor(msg)
        if major == 6:
            msg = f"CBOR tag {arg}"
            raise BadCbor(msg)
        return major, arg

    def more(self, n: int | None, done: int) -> bool:
        """Whether a map or array of ``n`` entries (None: up to a break) has another after ``done``."""
        if n is not None:
            return done < n
        if self.at < len(self.raw) and self.raw[self.at] == 0xFF:
            self.at += 1
            return False
        return True

    def string(self, major: int, n: int | None) -> str | bytes:
        """The payload of a byte (major 2) or text (major 3) string whose head was read."""
        if n is None:  # indefinite: definite chunks of the same type up to a break
            chunks, done = [], 0
            while self.more(None, done):
                kind, size = self.head()
                if kind != major or size is None:
                    msg = "an indefinite-length string holds a chunk of another type"
                    raise BadCbor(msg)
                chunks.append(bytes(self._take(size)))
                done += 1
            data: bytes | memoryview = b"".join(chunks)
        else:
            data = self._take(n)
        if major == 2:
            return bytes(data)
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as exc:
            raise BadCbor(f"text that is not UTF-8 ({exc})") from None

    def key(self, seen: Container[Any]) -> str | bytes:
        """A map key (text, or bytes as cbor2 allows), never one of ``seen``."""
        major, n = self.head()
        if major not in (2, 3):
            msg = f"a map key of CBOR major type {major}; keys are text"
            raise BadCbor(msg)
        key = self.string(major, n)
        if key in seen:
            msg = f"Duplicate map key {short(key)}"
            raise BadCbor(msg)
        return key

    def value(self, depth: int, what: str, name: Any) -> Any:
        """The next item decoded by cbor2, in a window of at most MAX_ITEM_SIZE bytes; ``depth`` maps enclose it.

        ``what.format(name)`` names the item in the error for one that runs past the window (formatted
        only then: a file has up to 100,000 descriptors).
        """
        cbor2 = self.cbor2
        for size in _WINDOWS:
            end = min(self.at + size, len(self.raw))
            fp = io.BytesIO(bytes(self.view[self.at : end]))
            decoder = cbor2.CBORDecoder(
                fp,
                read_size=1,  # so fp.tell() is where the item ends
                max_depth=MAX_CBOR_DEPTH - depth,
                allow_duplicate_keys=False,
                strict_hashable_types=True,
                semantic_decoders=_NO_TAGS,
                tag_hook=_refuse_tag,
            )
            try:
                obj = decoder.decode()
            except cbor2.CBORDecodeEOF as exc:
                if end < len(self.raw):
                    continue  # the item goes on past the window
                raise BadCbor(str(exc)) from None
            except (cbor2.CBORError, ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
                raise BadCbor(str(exc) + (f" ({exc.__cause__})" if exc.__cause__ else "")) from None
            self.at += fp.tell()
            return obj
        msg = (
            f"{self.where}: {what.format(short(name))} takes more than {MAX_ITEM_SIZE} bytes of CBOR, over "
            "arrayquant's limit for one item; the file was not written by Burn"
        )
        raise CorruptDataError(msg)


class MinimalFloat:
    """A float to write as ciborium does: at the narrowest of f16/f32/f64 that holds it (ciborium-ll hdr.rs).

    Not a tuple or a float subclass, so cbor2 hands it to :func:`_minimal_float`.
    """

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


def _minimal_float(encoder: Any, obj: Any) -> None:
    if not isinstance(obj, MinimalFloat):
        msg = f"cannot write {type(obj).__name__} to CBOR"
        raise DTypeError(msg)
    encoder.write(cbor2_module().dumps(obj.value, canonical=True))  # cbor2's canonical float is the narrowest


def dumps(obj: Any) -> bytes:
    """``obj`` as CBOR, each :class:`MinimalFloat` in its narrowest encoding (the rest as cbor2 writes it).

    >>> dumps({"Float": MinimalFloat(0.5)}).hex()
    'a165466c6f6174f93800'
    """
    out: bytes = cbor2_module().dumps(obj, default=_minimal_float)
    return out
