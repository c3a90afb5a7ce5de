"""What arrayquant is timed beside: the obvious NumPy forms and the peers users would pick instead.

The obvious forms are plain NumPy (or CuPy: ``m`` is the namespace) for int8 per tensor and per
block, and NumPy + ml_dtypes casts for the float presets. The peers are gguf's quantizers, torch
eager and ``torch.compile`` forms, bitsandbytes, and arrayquant's own kernels under ``jax.jit``;
each is imported inside the function that builds its :class:`~.harness.Pair` rows, so a missing one
is only an unavailable row. :data:`PEERS` names them, :data:`PEER_BACKENDS` says which input
backends each runs with, and :data:`PEER_MAP` which arrayquant cases each row stands beside.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dequantize import dequantize
from ..quantize import quantize
from ..scheme import QuantScheme
from ..tensor import QuantizedTensor
from .harness import Bench, Pair, make_sync
from .jobs import ALL_CASES, BLOCK, FLOAT_BASELINE, INT8_BLOCK_SCHEMES, INT8_TENSOR_SCHEMES

__all__ = [
    "FLOAT_FORMS",
    "PEERS",
    "PEER_BACKENDS",
    "PEER_MAP",
    "FloatForm",
    "f16_round_up",
    "float_forms",
    "np_dequantize_block",
    "np_dequantize_float",
    "np_dequantize_tensor",
    "np_quantize_block",
    "np_quantize_float",
    "np_quantize_tensor",
    "torch_forms",
    "ue4m3_round_up",
]


# --- the obvious NumPy forms (``m`` is numpy, or cupy on a GPU) -------------------------------


def np_quantize_tensor(x: Any, m: Any = np) -> tuple[Any, Any]:
    scale = m.abs(x).max() * m.float32(2) / m.float32(254)
    return m.clip(m.round(x / scale), -127, 127).astype(m.int8), scale


def np_dequantize_tensor(codes: Any, scale: Any, m: Any = np) -> Any:
    return codes.astype(m.float32) * scale


def f16_round_up(s: Any, m: Any = np) -> Any:
    """``s`` rounded up onto the F16 grid, as f32: cast, then step up where the cast went below."""
    h = s.astype(m.float16)
    h = m.where(h.astype(m.float32) < s, m.nextafter(h, m.float16(m.inf)), h)
    return h.astype(m.float32)


def np_quantize_block(x: Any, m: Any = np) -> tuple[Any, Any]:
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    scales = f16_round_up(m.abs(xb).max(axis=-1) * m.float32(2) / m.float32(254), m)
    codes = m.clip(m.round(xb / scales[..., None]), -127, 127).astype(m.int8)
    return codes.reshape(x.shape), scales


def np_dequantize_block(codes: Any, scales: Any, m: Any = np) -> Any:
    cb = codes.reshape(*codes.shape[:-1], codes.shape[-1] // BLOCK, BLOCK)
    return (cb.astype(m.float32) * scales[..., None]).reshape(codes.shape)


# --- the obvious NumPy + ml_dtypes forms of the float presets ---------------------------------


@dataclass(frozen=True)
class FloatForm:
    block: int
    value: str  # the ml_dtypes minifloat of the codes
    max: float  # its largest finite magnitude
    ue4m3: bool  # UE4M3 block scales under an f32 per-tensor scale (nvfp4), else UE8M0


FLOAT_FORMS = {
    "nvfp4": FloatForm(16, "float4_e2m1fn", 6.0, ue4m3=True),
    "mxfp4": FloatForm(32, "float4_e2m1fn", 6.0, ue4m3=False),
    "mxfp8": FloatForm(32, "float8_e4m3fn", 448.0, ue4m3=False),
}


def ue4m3_round_up(s: np.ndarray) -> np.ndarray:
    """``s`` (at most 448) rounded up onto the UE4M3 grid, as f32: cast, then step up where it went below."""
    import ml_dtypes

    h = np.minimum(s, np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
    bits = h.view(np.uint8)
    h = np.where(h.astype(np.float32) < s, (bits + np.uint8(1)).view(ml_dtypes.float8_e4m3fn), h)
    return h.astype(np.float32)


def np_quantize_float(x: np.ndarray, form: FloatForm) -> tuple[np.ndarray, np.ndarray]:
    """Minifloat codes (ml_dtypes, one per element) and the f32 effective scale per block."""
    import ml_dtypes

    xb = x.reshape(*x.shape[:-1], x.shape[-1] // form.block, form.block)
    s = np.abs(xb).max(axis=-1) / np.float32(form.max)
    if form.ue4m3:
        g = np.float32(s.max() / np.float32(448))
        scales = ue4m3_round_up(s / g) * g
    else:
        scales = np.exp2(np.ceil(np.log2(s)))  # UE8M0: the next power of two
    y = np.clip(xb / scales[..., None], -form.max, form.max)
    return y.astype(getattr(ml_dtypes, form.value)).reshape(x.shape), scales


def np_dequantize_float(codes: np.ndarray, scales: np.ndarray, form: FloatForm) -> np.ndarray:
    cb = codes.reshape(*codes.shape[:-1], codes.shape[-1] // form.block, form.block)
    return (cb.astype(np.float32) * scales[..., None]).reshape(codes.shape)


# --- the peers ----------------------------------------------------------------------------------


def _unpair(fn: Callable[..., Any], out: Any) -> Any:
    """``fn(*out)``: a dequantizer applied to what its quantizer returned."""
    return fn(*out)


def _dequantize_gguf(dequantize: Callable[[Any, Any], Any], kind: Any, out: Any) -> Any:
    return dequantize(out, kind)


def float_forms(b: Bench) -> list[Pair]:
    """The NumPy + ml_dtypes forms of the float presets on ``b``'s host input (ImportError without ml_dtypes)."""
    import ml_dtypes  # noqa: F401 - unavailable without it

    pairs = []
    for preset, form in FLOAT_FORMS.items():
        pairs.append(
            Pair(
                FLOAT_BASELINE + preset,
                functools.partial(np_quantize_float, b.host, form),
                functools.partial(_unpair, functools.partial(np_dequantize_float, form=form)),
                kind="numpy",
            )
        )
    return pairs


def _peer_gguf(b: Bench) -> list[Pair]:
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    x = b.host
    return [
        Pair(
            f"gguf {t}",
            functools.partial(quants.quantize, x, T[t]),
            functools.partial(_dequantize_gguf, quants.dequantize, T[t]),
        )
        for t in ("Q8_0", "Q4_0", "MXFP4", "NVFP4")
    ]


def torch_forms(torch: Any) -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """The obvious torch forms: (quantize(x) -> (codes, scales), dequantize(codes, scales, shape))."""
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]

    def q8_tensor(x: Any) -> tuple[Any, Any]:
        s = torch.amax(torch.abs(x)) * (2.0 / 254.0)
        return torch.clamp(torch.round(x / s), -127, 127).to(torch.int8), s

    def dq8_tensor(q: Any, s: Any, shape: Any) -> Any:
        return q.to(torch.float32) * s

    def q8_block(x: Any) -> tuple[Any, Any]:
        xb = x.reshape(-1, BLOCK)
        s = (torch.amax(torch.abs(xb), dim=1, keepdim=True) * (2.0 / 254.0)).to(torch.float16)
        q = torch.clamp(torch.round(xb / s.to(torch.float32)), -127, 127).to(torch.int8)
        return q, s

    def dq8_block(q: Any, s: Any, shape: Any) -> Any:
        return (q.to(torch.float32) * s.to(torch.float32)).reshape(shape)

    def q_fp4(x: Any) -> tuple[Any, Any]:
        # E2M1 codes by threshold comparisons (ties to the even code), UE8M0 scale, two codes a byte
        xb = x.reshape(-1, BLOCK)
        s = torch.exp2(torch.ceil(torch.log2(torch.amax(torch.abs(xb), dim=1, keepdim=True) / 6.0)))
        y = xb / s
        a = torch.abs(y)
        m = (a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5.0)
        code = m | ((y < 0).to(torch.uint8) << 3)
        return code[:, 0::2] | (code[:, 1::2] << 4), s

    def dq_fp4(q: Any, s: Any, shape: Any) -> Any:
        lut = torch.tensor(e2m1 + [-v for v in e2m1], dtype=torch.float32, device=q.device)
        codes = torch.stack((q & 15, q >> 4), dim=-1).reshape(-1, BLOCK)
        return (lut[codes.to(torch.int64)] * s).reshape(shape)

    def q_fp8(x: Any) -> tuple[Any, Any]:
        xb = x.reshape(-1, BLOCK)
        s = torch.exp2(torch.ceil(torch.log2(torch.amax(torch.abs(xb), dim=1, keepdim=True) / 448.0)))
        return torch.clamp(xb / s, -448.0, 448.0).to(torch.float8_e4m3fn), s

    def dq_fp8(q: Any, s: Any, shape: Any) -> Any:
        return (q.to(torch.float32) * s).reshape(shape)

    return {
        "int8 per-tensor": (q8_tensor, dq8_tensor),
        "int8 block32": (q8_block, dq8_block),
        "fp4 block32": (q_fp4, dq_fp4),
        "fp8 block32": (q_fp8, dq_fp8),
    }


def _torch_input(b: Bench) -> Any:
    import torch

    torch.set_num_threads(1)
    return b.x if b.backend == "torch" else torch.from_numpy(b.host)


def _torch_pairs(b: Bench, compiled: bool) -> list[Pair]:
    import torch

    x = _torch_input(b)
    label = "torch.compile" if compiled else "torch"
    pairs = []
    for name, (q, dq) in torch_forms(torch).items():
        if compiled:
            q, dq = torch.compile(q, dynamic=False), torch.compile(dq, dynamic=False)
        pairs.append(
            Pair(
                f"{label} {name}",
                functools.partial(q, x),
                functools.partial(_unpair, functools.partial(dq, shape=tuple(x.shape))),
            )
        )
    return pairs


def _peer_torch(b: Bench) -> list[Pair]:
    return _torch_pairs(b, compiled=False)


def _peer_torch_compile(b: Bench) -> list[Pair]:
    return _torch_pairs(b, compiled=True)


def _peer_bitsandbytes(b: Bench) -> list[Pair]:
    import logging

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # CPU kernels it cannot find are not needed
    import bitsandbytes.functional as F

    x = _torch_input(b)
    four = lambda kind: functools.partial(F.quantize_4bit, x, blocksize=BLOCK, quant_type=kind)
    return [
        Pair(
            "bitsandbytes blockwise8 b32",
            functools.partial(F.quantize_blockwise, x, blocksize=BLOCK),
            lambda r: F.dequantize_blockwise(r[0], r[1]),
        ),
        Pair("bitsandbytes fp4 b32", four("fp4"), lambda r: F.dequantize_4bit(r[0], r[1])),
        Pair("bitsandbytes nf4 b32", four("nf4"), lambda r: F.dequantize_4bit(r[0], r[1])),
    ]


def _peer_jax_jit(b: Bench) -> list[Pair]:
    """arrayquant's own kernels under ``jax.jit`` on the default jax device (XLA fuses them)."""
    import jax
    import jax.numpy as jnp

    x = b.x if b.backend == "jax" else jax.device_put(b.host)
    sync = make_sync("jax", x)
    pairs = []
    for scheme in ALL_CASES:
        parsed = QuantScheme.parse(scheme)

        def fields(a: Any, scheme: str = scheme) -> tuple[Any, Any, Any]:
            qt = quantize(a, scheme)
            return qt.values, qt.scales, qt.global_scale

        def rebuild(v: Any, s: Any, g: Any, parsed: QuantScheme = parsed) -> Any:
            qt = QuantizedTensor(parsed, tuple(x.shape), jnp.float32, v, s, g)
            return dequantize(qt)

        qf, df = jax.jit(fields), jax.jit(rebuild)

        def run_q(qf: Any = qf) -> Any:
            out = qf(x)
            sync(out)  # jax dispatches asynchronously: wait, whatever the input backend
            return out

        def run_d(fields: Any, df: Any = df) -> Any:
            out = df(*fields)
            sync(out)
            return out

        pairs.append(
            Pair(
                f"jax.jit {scheme}",
                run_q,
                run_d,
                kind="jit",
                check=functools.partial(b.check, scheme),
            )
        )
    return pairs


PEERS: dict[str, Callable[[Bench], list[Pair]]] = {
    "gguf": _peer_gguf,
    "torch": _peer_torch,
    "torch.compile": _peer_torch_compile,
    "bitsandbytes": _peer_bitsandbytes,
    "jax.jit": _peer_jax_jit,
}
# the input backends each peer runs with: on the others it would time a different machine
PEER_BACKENDS = {
    "gguf": ("numpy",),
    "torch": ("numpy", "torch"),
    "torch.compile": ("numpy", "torch"),
    "bitsandbytes": ("numpy", "torch"),
    "jax.jit": ("numpy", "jax"),
}


# Which arrayquant cases each peer row stands beside (same job: same bits per value, block size)
_INT8_TENSOR_PEERS = ("torch int8 per-tensor", "torch.compile int8 per-tensor")
_INT8_BLOCK_PEERS = (
    "gguf Q8_0",
    "torch int8 block32",
    "torch.compile int8 block32",
    "bitsandbytes blockwise8 b32",
)
_FP4_PEERS = ("torch fp4 block32", "torch.compile fp4 block32", "bitsandbytes fp4 b32", "bitsandbytes nf4 b32")
PEER_MAP: dict[str, tuple[str, ...]] = {
    **{s: _INT8_TENSOR_PEERS for s in INT8_TENSOR_SCHEMES},
    **{s: _INT8_BLOCK_PEERS for s in INT8_BLOCK_SCHEMES},
    "q4s:block32:f16": ("gguf Q4_0", *_FP4_PEERS),
    "nvfp4": (FLOAT_BASELINE + "nvfp4", "gguf NVFP4", *_FP4_PEERS),
    "mxfp4": (FLOAT_BASELINE + "mxfp4", "gguf MXFP4", *_FP4_PEERS),
    "mxfp8": (FLOAT_BASELINE + "mxfp8", "torch fp8 block32", "torch.compile fp8 block32"),
}
