"""Burn's ``QuantScheme`` in the CBOR of a QFloat dtype: :func:`encode_scheme` and :func:`decode_scheme`.

This module reads and writes the ``QuantScheme`` encoding of cubecl ``1e735584a`` (2026-08-19,
"Replace QuantLevel with per-tensor and per-block scale levels"), current at the Burn commit of
:data:`~arrayquant.io.burn.layout.BURN_COMMIT` (the serde of ``cubecl-common`` at the revision
Burn pins, ``crates/cubecl-common/src/quant/scheme.rs``)::

    {"value": "Q8F" | "Q8S" | "Q4F" | "Q4S" | "Q2F" | "Q2S" | "E4M3" | "E5M2" | "E2M1",
     "store": "Native" | {"PackedU32": dim} | {"PackedNative": dim},
     "mode": "Symmetric",
     "tensor": null | ScaleDtype,
     "block": null | {"size": {"storage": [u8; 5], "len": u8}, "dtype": ScaleDtype}}

(``ScaleDtype``: ``"F32"``, ``"F16"``, ``"BF16"``, ``"UE8M0"``, ``"UE4M3"``). A block size is
written canonically, as ``BlockSize::new`` makes it: leading 1s dropped, the extents first in
``storage``, unused slots 1 (``[1, 32]`` is ``{"storage": [32, 1, 1, 1, 1], "len": 1}``). The
encoding before that commit (``{"value", "param", "store", "level", "mode"}``) changed without
a format version bump; Burn's own reader would take such a scheme as per-tensor F32 (serde
fills the missing ``tensor``/``block`` with ``None``), so it, and any other key set, is refused
here with a :class:`~arrayquant.errors.SchemeError` that says which encoding is read.
``"Lookup"`` mode is refused too: the table does not travel in the bytes. The scheme's scale
rule (``ocp``) is not part of the encoding, so a tensor read back has the default rule (its
bytes, and so its values, are unchanged).

Note that Burn itself (burn-std's ``encode_scales``/``decode_scales``) does not implement UE8M0
scales yet, so an ``mxfp8``/``mxfp4`` file is valid Burnpack that Burn's backends may refuse to
dequantize.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import SchemeError
from ...scheme import QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype
from ...scheme.block import MAX_BLOCK_DIMS, BlockSize
from .layout import BURN_COMMIT, U64, is_int, short

__all__ = ["decode_scheme", "encode_scheme"]

_VALUES = {v: v.name for v in QuantValue if v.is_burn}  # Q8F, E2M1, ...: arrayquant's enum names are Burn's
_SCALES = {s: s.name for s in ScaleDtype}
_STORES = {"packed_u32": "PackedU32", "packed_native": "PackedNative"}
_SCHEME_KEYS = ("value", "store", "mode", "tensor", "block")
_TARGET = (
    f"the QuantScheme encoding of Burn {BURN_COMMIT[:8]} (cubecl 1e735584a, 2026-08-19): "
    "{value, store, mode, tensor, block}"
)


def encode_scheme(scheme: QuantScheme | str) -> dict[str, Any]:
    """``scheme`` as Burn's serde writes a ``QuantScheme`` (the CBOR of a QFloat dtype).

    Parameters
    ----------
    scheme : QuantScheme or str

    Returns
    -------
    dict
        ``{"value", "store", "mode", "tensor", "block"}``, the block size canonical.

    Raises
    ------
    SchemeError
        A scheme Burn's ``QuantScheme`` cannot hold: lookup mode (Burn's bytes carry no table),
        the zero-point and offset modes, the values Burn lacks (``u4``, ``q5f``, ...), PackedNative
        for anything but E2M1, or a block extent above 255 (Burn's ``BlockSize`` holds ``u8`` extents).

    Examples
    --------
    >>> encode_scheme("q4s:block32:f16")["block"]
    {'size': {'storage': [32, 1, 1, 1, 1], 'len': 1}, 'dtype': 'F16'}
    >>> encode_scheme("nvfp4")["store"], encode_scheme("nvfp4")["tensor"]
    ({'PackedNative': 0}, 'F32')
    """
    s = QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme
    if not isinstance(s, QuantScheme):
        msg = f"scheme must be a QuantScheme or its text, got {type(scheme).__name__}"
        raise SchemeError(msg)
    holds = (
        "Burnpack's QFloat holds symmetric schemes with block extents up to 255 (q8s, q4s:block32, nvfp4, mxfp8, ...)"
    )
    if s.mode.is_affine:
        msg = (
            f"scheme {s} is in {s.mode.value} mode, and Burn's QuantScheme has no zero points or offsets; {holds}; "
            "write an arrayquant checkpoint (.safetensors) to keep the affine scheme"
        )
        raise SchemeError(msg)
    if s.mode is not QuantMode.SYMMETRIC:
        msg = f"scheme {s} looks values up in a table, which Burn's quantized bytes do not carry; {holds}"
        raise SchemeError(msg)
    if not s.value.is_burn:
        msg = f"scheme {s} has {s.value.name} values, which Burn's QuantValue does not have; {holds}"
        raise SchemeError(msg)
    if s.store.kind == "packed_native" and s.value is not QuantValue.E2M1:
        msg = (
            f"scheme {s} packs {s.value.name} fields into bytes, which Burn's PackedNative does for E2M1 only; {holds}"
        )
        raise SchemeError(msg)
    block = None
    if s.block is not None:
        size, dtype = s.block
        dims = list(size.dims)
        while dims and dims[0] == 1:  # BlockSize::new drops every leading 1: [1] is the empty block
            dims.pop(0)
        if any(d > 255 for d in dims):
            msg = f"scheme {s} has block extents {list(size.dims)}, but Burn stores each extent in a u8; {holds}"
            raise SchemeError(msg)
        storage = dims + [1] * (MAX_BLOCK_DIMS - len(dims))
        block = {"size": {"storage": storage, "len": len(dims)}, "dtype": _SCALES[dtype]}
    store: Any = "Native" if s.store.kind == "native" else {_STORES[s.store.kind]: s.store.dim}
    return {
        "value": _VALUES[s.value],
        "store": store,
        "mode": "Symmetric",
        "tensor": None if s.tensor is None else _SCALES[s.tensor],
        "block": block,
    }


def _unit(obj: Any, names: Mapping[str, Any], what: str) -> Any:
    if not isinstance(obj, str) or obj not in names:
        msg = f"{what} {short(obj)} is not one of {', '.join(names)}; arrayquant reads {_TARGET}"
        raise SchemeError(msg)
    return names[obj]


def decode_scheme(obj: Any) -> QuantScheme:
    """The :class:`QuantScheme` of a QFloat dtype's CBOR, in the encoding :func:`encode_scheme` writes.

    Parameters
    ----------
    obj : dict
        The value under ``"QFloat"``.

    Returns
    -------
    QuantScheme

    Raises
    ------
    SchemeError
        Any other encoding (Burn's older ``{value, param, store, level, mode}`` among them, which
        changed without a version bump), lookup mode, or a scheme arrayquant refuses.

    Examples
    --------
    >>> str(decode_scheme(encode_scheme("q8s:block32:f16")))
    'q8s:block32:f16'
    """
    if not isinstance(obj, dict):
        msg = f"QFloat scheme {short(obj)} is not a map; arrayquant reads {_TARGET}"
        raise SchemeError(msg)
    keys = set(obj)
    if keys != set(_SCHEME_KEYS):
        old = " (Burn's encoding before 2026-08-19, with 'level' and 'param')" if {"level", "param"} & keys else ""
        msg = (
            f"QFloat scheme with keys {sorted(map(str, keys))}{old} is not an encoding arrayquant reads: it reads "
            f"{_TARGET}; re-save the model with a Burn at or after that commit"
        )
        raise SchemeError(msg)
    value = _unit(obj["value"], {n: v for v, n in _VALUES.items()}, "QFloat value")
    if obj["mode"] != "Symmetric":
        msg = (
            f"QFloat mode {short(obj['mode'])}: arrayquant reads 'Symmetric' schemes only (a 'Lookup' "
            f"table does not travel in the bytes); it reads {_TARGET}"
        )
        raise SchemeError(msg)
    store_obj = obj["store"]
    if store_obj == "Native":
        store = QuantStore.native()
    else:
        if not isinstance(store_obj, dict) or len(store_obj) != 1:
            msg = f"QFloat store {short(store_obj)} is not 'Native', {{'PackedU32': dim}} or {{'PackedNative': dim}}"
            raise SchemeError(msg)
        ((kind, dim),) = store_obj.items()
        kinds = {v: k for k, v in _STORES.items()}
        if kind not in kinds or not is_int(dim) or not 0 <= dim < U64:
            msg = f"QFloat store {short(store_obj)} is not 'Native', {{'PackedU32': dim}} or {{'PackedNative': dim}}"
            raise SchemeError(msg)
        store = QuantStore(kinds[kind], dim)
    scales = {n: s for s, n in _SCALES.items()}
    tensor = None if obj["tensor"] is None else _unit(obj["tensor"], scales, "QFloat tensor scale dtype")
    block = None
    if obj["block"] is not None:
        b = obj["block"]
        size = b.get("size") if isinstance(b, dict) else None
        if not isinstance(b, dict) or set(b) != {"size", "dtype"} or not isinstance(size, dict):
            msg = (
                f"QFloat block {short(b)} is not {{'size': {{'storage', 'len'}}, 'dtype'}}; arrayquant reads {_TARGET}"
            )
            raise SchemeError(msg)
        storage: Any = size.get("storage")
        n: Any = size.get("len")
        if (
            set(size) != {"storage", "len"}
            or not isinstance(storage, list)
            or len(storage) != MAX_BLOCK_DIMS
            or not all(is_int(d) and 0 <= d <= 255 for d in storage)
            or not is_int(n)
            or not 0 <= n <= MAX_BLOCK_DIMS
        ):
            msg = (
                f"QFloat block size {short(size)} is not {{'storage': [5 u8 extents], 'len': 0..5}}; "
                f"arrayquant reads {_TARGET}"
            )
            raise SchemeError(msg)
        dims = storage[:n] or [1]  # len 0: Burn's canonical [1], one scale per element
        block = (BlockSize(dims), _unit(b["dtype"], scales, "QFloat block scale dtype"))
    return QuantScheme(value, store, QuantMode.SYMMETRIC, tensor, block)
