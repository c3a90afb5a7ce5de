"""GPTQ: data-aware quantization of a linear layer's weight, on any Array API backend.

GPTQ (Frantar et al., 2022, https://arxiv.org/abs/2210.17323) quantizes the weight ``W`` of a
linear layer ``y = x @ W.T`` column by column (input feature by input feature) and spreads each
column's quantization error over the columns not yet quantized, weighted by the inverse of the
layer's Hessian ``H = X.T @ X`` of calibration activations ``X``, so that the layer output
``X @ W.T`` moves as little as possible. The loop follows the reference implementation,
IST-DASLab's ``gptq.py`` (``GPTQ.fasterquant``) and its descendant in llm-compressor
(``src/llmcompressor/modifiers/quantization/gptq/gptq_quantize.py``):

- dead inputs (``H[j, j] == 0``) get ``H[j, j] = 1`` and their weight column is zeroed;
- dampening: ``damp * mean(diag(H))`` is added to the diagonal;
- optional act-order: columns are visited by descending ``diag(H)`` (a stable sort, so ties keep
  their order on every backend) and the result is put back in the original order;
- ``U`` is the upper Cholesky factor of ``H^-1``; the loop runs over column blocks of
  ``block_size`` (128), with the per-column update inside a block and one matrix product for the
  columns after it (the "lazy batch" update).

Scales use arrayquant's own rule. Without act-order each group (block of the scheme along the
input axis) gets its scale when the loop reaches the group's first column, from the group's
*current* (error-updated) weights: MinMax ``compute_range`` then ``compute_q_params``, stored
rounded up by :func:`quantize`. (The reference reads the group from ``W``, whose columns inside
the current column block lag behind the in-block updates; here the group's values are brought
up to date first.) With act-order a group's columns are no longer visited together, so, as the
reference's ``static_groups`` and llm-compressor's ``actorder="weight"`` do, every group's
parameters are computed before the loop from the (dead-column-zeroed) original weights; the stored layout
stays the scheme's contiguous groups in the original column order (no ``g_idx`` is needed). A
two-level scheme (NVFP4) keeps the per-tensor scale of the original weights' MinMax, and each
block scale is normalised under it. Per-tensor and per-row schemes (a block spanning the whole
input axis) have one group, calibrated on the initial weights, as the reference's
``groupsize=-1``.

Affine schemes (zero point ``x = s * (q - z)``, offset ``x = d * q + m``) get their second
parameter the same way, at the same moment and from the same weights as the scale: this is the
reference's asymmetric quantizer (``Quantizer.find_params`` with ``sym=False``: the range
extended to hold 0, ``scale = (xmax - xmin) / maxq``, ``zero = round(-xmin / scale)``, codes
``clamp(round(x / scale) + zero, 0, maxq)``, values ``scale * (q - zero)``; IST-DASLab's
``quant.py``, AutoGPTQ's ``auto_gptq/quantization/quantizer.py``) under arrayquant's own affine
rule (:mod:`arrayquant.kernels.affine`): the scale is rounded up onto the scale dtype *before*
``z = clip(round_half_even(qmin - min(lo, 0) / s), qmin, qmax)`` is computed from it, so the
error feedback sees the parameters that are stored; the offset mode takes ``m = lo`` rounded
down and ``d = (hi - m) / qmax`` rounded up. A group of zeros stores ``s = 0, z = 0`` (the
reference widens it to ``[-1, 1]``; both read back as zeros).

Each column is quantized with its group's parameters by :func:`quantize` itself, and the result
is ``quantize(U, scheme, params=QParams(scales, global_scale))`` (``QParams(scales,
zero_point=z)`` or ``QParams(scales, offset=m)`` for the affine modes) of the matrix ``U`` of the
columns as they were when quantized: the codes and stored scales (and zero points or offsets) are
exactly arrayquant's quantization of those updated weights.

Precision and backends: the linear algebra runs in float32 as the references do
(``GPTQ_PRECISION = torch.float32``), through the Array API ``linalg`` extension
(``cholesky``, ``solve``; NumPy, torch, JAX, CuPy and array-api-strict have it). ``H^-1`` is
``L^-T L^-1`` with ``L^-1 = solve(L, I)``, the Array API's stand-in for torch's
``cholesky_inverse``. Results are deterministic per backend. Across backends the quantization of
given updated weights is bit-identical (it is arrayquant's quantize), but Cholesky, ``solve`` and
the matrix products are each library's own float32 LAPACK/BLAS (or XLA) code, whose rounding
differs; the updated weights, and so some codes, can differ between backends. A flipped code
feeds a different error forward, so differences grow along the columns: on small layers torch
and JAX match NumPy's codes with updated weights within 1e-6, on a 384 x 1536 layer torch differs
from NumPy in 0.3 to 0.5 % of the codes (array-api-strict, NumPy underneath, matches exactly). Dask arrays are
computed first (the column loop is sequential, one lazy graph per column would only grow) and
the result is handed back as Dask arrays.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import array_api_compat as compat

from .backends import shim
from .dequantize import dequantize
from .errors import DTypeError, NonFiniteInputError, ParamsError, SchemeError, ShapeError
from .quantize import compute_q_params, compute_range, quantize
from .scheme import QParams, QuantMode, QuantScheme
from .tensor import QuantizedTensor

__all__ = ["GPTQResult", "gptq_quantize", "gptq_solve"]


class GPTQResult(NamedTuple):
    """What :func:`gptq_solve` found.

    ``tensor`` is the quantized weight; ``updated`` the f32 weight columns as GPTQ quantized them
    (after the error feedback, in the original column order), and ``params`` the unrounded
    scales (and global scale) such that ``quantize(updated, scheme, params=params)`` is
    ``tensor`` bit for bit. For an affine scheme ``params`` holds the stored scales with the
    zero points (``zero_point``, in the codes' dtype) or the offsets (``offset``, f32).
    """

    tensor: QuantizedTensor
    updated: Any
    params: QParams


def gptq_quantize(
    w: Any,
    scheme: QuantScheme | str,
    *,
    hessian: Any = None,
    activations: Any = None,
    damp: float = 0.01,
    block_size: int = 128,
    act_order: bool = False,
) -> QuantizedTensor:
    """Quantize a linear layer's weight with GPTQ: codes that keep ``X @ W.T`` close.

    Parameters
    ----------
    w : array
        The weight, ``(out_features, in_features)``, real floating, finite, of any Array API
        backend with the ``linalg`` extension (a Dask array is computed first).
    scheme : QuantScheme or str
        A per-tensor scheme or a block scheme whose blocks run along the input axis (``[G]`` or
        ``[1, G]``): ``"q4s:block32:f16"``, ``"mxfp4"``, ``"nvfp4"``, ``"e4m3:block4096:f32"`` (one
        scale per row when the block spans the row), and the affine ``"u4:block128:bf16:zero_point"``,
        ``"q4f:block32:f16:zero_point"``, ``"u4:block32:f16:offset"`` (``"q4_1"``).
    hessian : array, optional
        ``H = X.T @ X`` (any positive multiple), ``(in_features, in_features)``, finite.
    activations : array, optional
        Calibration inputs ``X`` of the layer, ``(n_samples, in_features)``; ``H = X.T @ X`` in
        f32. Exactly one of ``hessian`` and ``activations`` is required.
    damp : float
        Dampening: ``damp * mean(diag(H))`` is added to ``H``'s diagonal (0.01, as the references).
    block_size : int
        Columns per lazy-update block (128, as the references); the result depends on it only
        through float32 rounding.
    act_order : bool
        Visit columns by descending ``diag(H)``; group scales then come from the original
        weights before the loop (see the module notes).

    Returns
    -------
    QuantizedTensor
        The quantized weight, in ``w``'s namespace and on its device, ``dtype`` that of ``w``.

    Raises
    ------
    ParamsError
        Neither or both of ``hessian``/``activations``; ``damp`` not a finite number > 0;
        ``block_size`` not an integer >= 1; a Hessian that is not positive definite after
        dampening; arrays of different namespaces.
    SchemeError
        An invalid scheme, or blocks that do not run along the input axis.
    ShapeError
        ``w`` not 2-d or empty; a Hessian not ``(in_features, in_features)``; activations not
        ``(n, in_features)``.
    DTypeError
        ``w``, the Hessian or the activations not real floating.
    NonFiniteInputError
        NaN or infinity in ``w``, the Hessian or the activations.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> w = rng.standard_normal((8, 64)).astype(np.float32)
    >>> x = rng.standard_normal((256, 64)).astype(np.float32)
    >>> qt = gptq_quantize(w, "q4s:block32:f16", activations=x)
    >>> qt.scales.shape
    (8, 2)
    >>> qt = gptq_quantize(w, "u4:block32:f16:zero_point", activations=x)
    >>> qt.zero_point.dtype, qt.zero_point.shape
    (dtype('uint8'), (8, 2))
    """
    return gptq_solve(
        w, scheme, hessian=hessian, activations=activations, damp=damp, block_size=block_size, act_order=act_order
    ).tensor


def gptq_solve(
    w: Any,
    scheme: QuantScheme | str,
    *,
    hessian: Any = None,
    activations: Any = None,
    damp: float = 0.01,
    block_size: int = 128,
    act_order: bool = False,
) -> GPTQResult:
    """:func:`gptq_quantize`, also returning the updated weights and the scales it used.

    Takes the same arguments and raises the same errors as :func:`gptq_quantize`.

    Returns
    -------
    GPTQResult
        ``(tensor, updated, params)``: ``quantize(updated, scheme, params=params)`` is ``tensor``.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayquant as aq
    >>> rng = np.random.default_rng(0)
    >>> w = rng.standard_normal((8, 64)).astype(np.float32)
    >>> x = rng.standard_normal((256, 64)).astype(np.float32)
    >>> r = gptq_solve(w, "u4:block32:f16:offset", activations=x)
    >>> again = aq.quantize(r.updated, "u4:block32:f16:offset", params=r.params)
    >>> bool(np.array_equal(again.values, r.tensor.values) and np.array_equal(again.offset, r.tensor.offset))
    True
    """
    scheme = QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme
    if not isinstance(scheme, QuantScheme):
        msg = f"scheme must be a QuantScheme or its text form, got {type(scheme).__name__}"
        raise SchemeError(msg)
    damp = _check_damp(damp)
    block_size = _check_block_size(block_size)
    lazy = compat.is_dask_array(w)
    if lazy:
        # the column loop is sequential: a lazy graph per column would only grow; compute once
        w = shim.to_host(w)
        hessian = None if hessian is None else shim.to_host(hessian)
        activations = None if activations is None else shim.to_host(activations)
    xp = _namespace(w, "w")
    if w.ndim != 2 or 0 in tuple(w.shape):
        msg = f"w has shape {tuple(w.shape)}; GPTQ needs a non-empty 2-d weight (out_features, in_features)"
        raise ShapeError(msg)
    cols = int(w.shape[1])
    group = _group_width(scheme, cols)
    _check_finite(xp, w, "w")
    h = _hessian(xp, w, cols, hessian, activations)
    result = _solve(xp, w, scheme, h, group, damp, block_size, bool(act_order))
    if not lazy:
        return result
    back = lambda a: None if a is None else shim.convert(a, "dask", None)
    p = result.params
    return GPTQResult(
        result.tensor.to_backend("dask"),
        back(result.updated),
        QParams(
            scales=back(p.scales),
            global_scale=back(p.global_scale),
            table=back(p.table),
            zero_point=back(p.zero_point),
            offset=back(p.offset),
        ),
    )


# -- validation -------------------------------------------------------------------------------


def _namespace(a: Any, name: str) -> Any:
    try:
        xp = compat.array_namespace(a)
    except TypeError:
        msg = f"{name} must be an array of an Array API backend, got {type(a).__name__}"
        raise DTypeError(msg) from None
    if not xp.isdtype(a.dtype, "real floating"):
        msg = f"{name} has dtype {a.dtype}; GPTQ needs real floating data"
        raise DTypeError(msg)
    return xp


def _check_damp(damp: Any) -> float:
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not math.isfinite(damp) or damp <= 0:
        msg = f"damp must be a finite number > 0 (the references use 0.01), got {damp!r}"
        raise ParamsError(msg)
    return float(damp)


def _check_block_size(block_size: Any) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        msg = f"block_size must be an integer >= 1 (the references use 128), got {block_size!r}"
        raise ParamsError(msg)
    return block_size


def _group_width(scheme: QuantScheme, cols: int) -> int | None:
    """Columns per scale group along the input axis; None for a per-tensor scheme."""
    block = scheme.block_size
    if block is None:
        return None
    dims = block.dims
    if len(dims) > 2 or (len(dims) == 2 and dims[0] != 1):
        msg = (
            f"scheme {scheme}: GPTQ needs blocks along the input axis only ([G] or [1, G]) so each column "
            f"block shares its rows' scales; got block {list(dims)}"
        )
        raise SchemeError(msg)
    return min(dims[-1], cols)


def _check_finite(xp: Any, a: Any, name: str) -> None:
    if not bool(xp.all(xp.isfinite(a))):
        msg = f"{name} holds NaN or infinity; GPTQ needs finite values"
        raise NonFiniteInputError(msg)


def _hessian(xp: Any, w: Any, cols: int, hessian: Any, activations: Any) -> Any:
    if (hessian is None) == (activations is None):
        msg = "pass exactly one of hessian= (H = X.T @ X) and activations= (X, (n_samples, in_features))"
        raise ParamsError(msg)
    name = "hessian" if hessian is not None else "activations"
    a = hessian if hessian is not None else activations
    if compat.is_dask_array(a):
        a = shim.to_host(a)
    if _namespace(a, name) is not xp:
        msg = f"{name} is a {shim.backend_name(a)} array but w is {shim.backend_name(w)}; pass both from one backend"
        raise ParamsError(msg)
    shape = tuple(int(n) for n in a.shape)
    if hessian is not None and shape != (cols, cols):
        msg = f"hessian has shape {shape}; it must be square (in_features, in_features) = ({cols}, {cols})"
        raise ShapeError(msg)
    if activations is not None and (len(shape) != 2 or shape[1] != cols or shape[0] == 0):
        msg = f"activations have shape {shape}; they must be (n_samples >= 1, in_features={cols})"
        raise ShapeError(msg)
    _check_finite(xp, a, name)
    a = xp.astype(a, xp.float32)
    return a if hessian is not None else xp.matmul(xp.matrix_transpose(a), a)


# -- the algorithm ----------------------------------------------------------------------------


def _upper_inverse_factor(xp: Any, h: Any, damp: float) -> Any:
    """``U`` upper with ``U.T @ U = (H + damp * mean(diag H) * I)^-1``, as the reference's
    ``cholesky`` / ``cholesky_inverse`` / ``cholesky(upper=True)``."""
    n = int(h.shape[0])
    dev = compat.device(h)
    eye = xp.eye(n, dtype=xp.float32, device=dev)
    diag = xp.linalg.diagonal(h) if hasattr(xp.linalg, "diagonal") else xp.sum(h * eye, axis=1)
    h = h + (damp * xp.mean(diag)) * eye
    try:
        lower = xp.linalg.cholesky(h)
        lower_inv = xp.linalg.solve(lower, eye)
        u = xp.linalg.cholesky(xp.matmul(xp.matrix_transpose(lower_inv), lower_inv), upper=True)
    except Exception as exc:  # LinAlgError and friends differ per library
        msg = f"the Hessian is not positive definite after dampening ({exc}); raise damp or add calibration samples"
        raise ParamsError(msg) from None
    if not bool(xp.all(xp.isfinite(u))):  # JAX reports a failed factorisation as NaN
        msg = "the Hessian is not positive definite after dampening; raise damp or add calibration samples"
        raise ParamsError(msg)
    return u


class _Scales:
    """Group parameters under arrayquant's rule: scales, the zero points or offsets of an affine
    scheme, and two-level block scales under a fixed global."""

    def __init__(self, xp: Any, scheme: QuantScheme, w0: Any) -> None:
        self.xp = xp
        self.scheme = scheme
        self.glob = None
        self.table = None
        self.one_level = scheme
        self.mode = scheme.mode
        if scheme.is_two_level:
            # the global comes from the original weights' MinMax, as quantize() would give it
            self.glob = compute_q_params(scheme, *compute_range(w0, scheme)).global_scale
            self.one_level = dataclasses.replace(scheme, tensor=None)

    def of(self, v: Any) -> tuple[Any, Any]:
        """``(scales, zero)`` of the weights ``v`` (one group wide): ``(rows, 1)`` each, or ``(1,)`` per tensor.

        Symmetric and lookup schemes: unrounded scales, ``zero`` None. Affine schemes: the MinMax
        parameters of :func:`compute_q_params`, i.e. stored scales with the zero points (code
        dtype) computed from them, or stored offsets (f32) and the scales computed from those.
        """
        p = compute_q_params(self.one_level, *compute_range(v, self.scheme))
        self.table = p.table
        if self.mode is QuantMode.ZERO_POINT:
            return p.scales, p.zero_point
        if self.mode is QuantMode.OFFSET:
            return p.scales, p.offset
        if self.glob is None:
            return p.scales, None
        # the same single f32 division as quantize's two-level normalisation
        return self.xp.divide(p.scales, self.xp.reshape(self.glob, (1, 1))), None

    def params(self, scales: Any, zero: Any) -> QParams:
        if self.mode is QuantMode.ZERO_POINT:
            return QParams(scales=scales, zero_point=zero)
        if self.mode is QuantMode.OFFSET:
            return QParams(scales=scales, offset=zero)
        return QParams(scales=scales, global_scale=self.glob, table=self.table)

    def fake(self, col: Any, group: tuple[Any, Any]) -> Any:
        """``col`` (rows,) quantized with its group's parameters and dequantized, exactly as in the final tensor."""
        qt = quantize(self.xp.reshape(col, (-1, 1)), self.scheme, params=self.params(*group))
        return self.xp.reshape(dequantize(qt), (-1,))


def _solve(
    xp: Any, w: Any, scheme: QuantScheme, h: Any, group: int | None, damp: float, block_size: int, act_order: bool
) -> GPTQResult:
    cols = int(w.shape[1])
    w0 = xp.astype(w, xp.float32)
    dev = compat.device(w0)
    eye = xp.eye(cols, dtype=xp.float32, device=dev)
    diag = xp.sum(h * eye, axis=1)
    dead = diag == 0
    weights = xp.where(dead[None, :], xp.asarray(0.0, dtype=xp.float32, device=dev), w0)
    h = xp.where(xp.logical_and(dead[:, None], eye == 1), xp.asarray(1.0, dtype=xp.float32, device=dev), h)
    scales = _Scales(xp, scheme, w0)
    width = cols if group is None else group
    n_groups = -(-cols // width)
    group_params: list[Any] = [None] * n_groups  # (scales, zero points / offsets or None) per group
    perm = None
    order = list(range(cols))
    if act_order:
        # static groups: a group's columns are scattered over the visit order
        for g in range(n_groups):
            group_params[g] = scales.of(weights[:, g * width : (g + 1) * width])
        perm = xp.argsort(xp.sum(h * eye, axis=1), descending=True, stable=True)
        order = [int(i) for i in perm]
        weights = xp.take(weights, perm, axis=1)
        h = xp.take(xp.take(h, perm, axis=0), perm, axis=1)
    u = _upper_inverse_factor(xp, h, damp)

    done: list[Any] = []  # each column as quantized, in visit order
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        w1 = weights[:, i1:i2]
        u1 = u[i1:i2, i1:i2]
        errs: list[Any] = []
        for i in range(i2 - i1):
            j = i1 + i
            g = order[j] // width
            if group_params[g] is None:  # no act-order: the group starts here, at its current values
                end = min(j + width, cols)
                current = w1[:, i : min(end, i2) - i1]
                if end > i2:  # the group runs past this block: apply the block's pending updates
                    ahead = weights[:, i2:end]
                    if errs:
                        ahead = ahead - xp.matmul(xp.stack(errs, axis=1), u[i1:j, i2:end])
                    current = xp.concat([current, ahead], axis=1)
                group_params[g] = scales.of(current)
            col = w1[:, i]
            q = scales.fake(col, group_params[g])
            done.append(col)
            err = (col - q) / u1[i, i]
            # the columns before i are spent; updating the whole block keeps the arrays immutable-friendly
            w1 = w1 - err[:, None] * u1[i : i + 1, :]
            errs.append(err)
        if i2 < cols:
            rest = weights[:, i2:] - xp.matmul(xp.stack(errs, axis=1), u[i1:i2, i2:])
            weights = xp.concat([weights[:, :i2], rest], axis=1)

    updated = xp.stack(done, axis=1)
    if perm is not None:
        updated = xp.take(updated, xp.argsort(perm, stable=True), axis=1)
    if group is None:
        params = scales.params(*group_params[0])
    else:
        zeros = [p[1] for p in group_params]
        zero = None if zeros[0] is None else xp.concat(zeros, axis=1)
        params = scales.params(xp.concat([p[0] for p in group_params], axis=1), zero)
    tensor = quantize(updated, scheme, params=params)
    return GPTQResult(dataclasses.replace(tensor, dtype=w.dtype), updated, params)
