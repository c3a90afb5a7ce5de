"""The quantized tensor: stored values, stored scales and the scheme that explains them.

Import edge: ``arrayquant.tensor`` -> ``arrayquant.ops``, the one place this module reaches up, and
only at call time, through :func:`_ops`. ``ops`` imports this module (``QuantizedTensor``); the
operator methods (``qt.T``, ``qt[...]``, ``@``, ``+``, ...) dispatch to ``ops`` when called.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import array_api_compat as compat

from .backends import namespace, shim
from .scheme import QuantScheme
from .storage import quantized_nbytes, unpack

__all__ = ["QuantizedTensor", "dtype_name", "stored_transpose"]


def _ops() -> ModuleType:
    """``arrayquant.ops``, imported when a method first needs it.

    The one import edge from tensor up to ops (named at the top of this module): ops imports
    tensor, so the methods fetch ops at call time rather than at import time.
    """
    from . import ops

    return ops


def dtype_name(dtype: Any) -> str:
    """``"float32"`` for ``numpy.float32``, ``torch.float32``, ``jnp.float32``, ..."""
    return str(dtype).rsplit(".", 1)[-1].replace("'>", "").replace("<class '", "")


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """An immutable quantized tensor.

    ``values`` are the stored fields (int8, uint8 or uint32 words), ``scales`` the stored
    (rounded-up) scales as f32 shaped as the scale grid, ``global_scale`` the ``(1,)`` f32
    per-tensor scale of a two-level scheme, ``dtype`` the original float dtype. An affine scheme
    adds ``zero_point`` (zero_point mode: one integer per scale, int8 or uint8 as the codes) or
    ``offset`` (offset mode: one f32 per scale, on the scale dtype's grid), shaped as the scales.
    """

    scheme: QuantScheme
    shape: tuple[int, ...]
    dtype: Any
    values: Any
    scales: Any
    global_scale: Any = None
    table: Any = None
    zero_point: Any = None
    offset: Any = None

    @property
    def device(self) -> Any:
        """The device the values live on."""
        return compat.device(self.values)

    @property
    def nbytes(self) -> int:
        """Bytes of the Burn byte layout of this tensor."""
        return quantized_nbytes(self.scheme, self.shape)

    def codes(self) -> Any:
        """The unpacked codes: int8 for signed integer values, uint8 for unsigned and float values."""
        return unpack(self.values, self.scheme, self.shape)

    def to_backend(self, name: str, device: Any = None) -> QuantizedTensor:
        """The same tensor, bit for bit, as arrays of backend ``name`` (handed over by DLPack).

        Without ``device`` the arrays stay on their device when ``name`` can hold them there.
        """
        move = lambda a: None if a is None else shim.convert(a, name, device)
        xp = namespace(name)
        return replace(
            self,
            values=move(self.values),
            scales=move(self.scales),
            global_scale=move(self.global_scale),
            table=move(self.table),
            zero_point=move(self.zero_point),
            offset=move(self.offset),
            dtype=getattr(xp, dtype_name(self.dtype), xp.float32),  # e.g. bf16 where the target lacks it
        )

    def to_device(self, device: Any) -> QuantizedTensor:
        """The same tensor on ``device`` (``"cpu"``, ``"cuda:1"`` or a native device)."""
        return self.to_backend(shim.backend_name(self.values), device)

    # -- computing with it (arrayquant.ops): layout operations stay quantized where exact -------

    # NumPy defers binary operators (``x @ qt``) to this class instead of converting it
    __array_ufunc__ = None

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.shape)

    @property
    def T(self) -> QuantizedTensor:
        """The axes reversed (as NumPy's ``.T``), codes and scales moved, never requantized.

        For a 2-d tensor this is free: a view that keeps the stored tensor as it is, so
        ``x @ w.T`` multiplies with ``w``'s stored layout; its own codes and scales are built the
        first time something other than a matrix product reads them.
        """
        if self.ndim == 2:
            return _Transposed.of(self)
        return _ops().permute_dims(self, tuple(range(self.ndim))[::-1])

    @property
    def mT(self) -> QuantizedTensor:
        """The last two axes swapped (``matrix_transpose``); free for a 2-d tensor, as :attr:`T`."""
        if self.ndim == 2:
            return _Transposed.of(self)
        return _ops().matrix_transpose(self)

    def reshape(self, *shape: Any) -> QuantizedTensor:
        """The same data in ``shape`` (``qt.reshape(2, -1)`` or ``qt.reshape((2, -1))``); see ``aq.ops.reshape``."""
        target = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        return _ops().reshape(self, tuple(target))

    def __getitem__(self, key: Any) -> QuantizedTensor:
        return _ops().getitem(self, key)

    def __matmul__(self, other: Any) -> Any:
        return _ops().matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return _ops().matmul(other, self)

    # arithmetic as aq.ops does it: floats back (Burn's default propagation, "inhibit")
    def __add__(self, other: Any) -> Any:
        return _ops().add(self, other)

    def __radd__(self, other: Any) -> Any:
        return _ops().add(other, self)

    def __sub__(self, other: Any) -> Any:
        return _ops().subtract(self, other)

    def __rsub__(self, other: Any) -> Any:
        return _ops().subtract(other, self)

    def __mul__(self, other: Any) -> Any:
        return _ops().multiply(self, other)

    def __rmul__(self, other: Any) -> Any:
        return _ops().multiply(other, self)

    def __truediv__(self, other: Any) -> Any:
        return _ops().divide(self, other)

    def __rtruediv__(self, other: Any) -> Any:
        return _ops().divide(other, self)

    def __pow__(self, other: Any) -> Any:
        return _ops().pow(self, other)

    def __neg__(self) -> Any:
        return _ops().negative(self)

    def __abs__(self) -> QuantizedTensor:
        return _ops().abs(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        # why: without this NumPy silently wraps the tensor in a 0-d object array
        msg = (
            "a QuantizedTensor holds codes and scales, not float values; call aq.dequantize(qt) for the "
            "float array it stands for, or use qt.codes() / qt.scales for the stored parts"
        )
        raise TypeError(msg)

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor(scheme={str(self.scheme)!r}, shape={self.shape}, "
            f"dtype={dtype_name(self.dtype)}, backend={shim.backend_name(self.values)}, device={self.device!r})"
        )


# the scheme of a 2-d tensor's transpose by (scheme, shape): planning it costs more than the product of a small matrix
_T_SCHEMES: dict[tuple[Any, tuple[int, ...]], Any] = {}


class _Transposed(QuantizedTensor):
    """``w.T`` of a 2-d tensor ``w``: a layout flag, not a copy.

    It holds ``w`` as stored; the matrix product reads ``w`` directly (:func:`stored_transpose`).
    Anything else that reads the stored parts (``values``, ``scales``, ...) gets those of the real
    transpose, built once on first use. Copies (``dataclasses.replace``, pickling) are ordinary tensors.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> QuantizedTensor:  # type: ignore[misc]
        # why: dataclasses.replace(view, ...) calls the class with every field; give a plain tensor
        return QuantizedTensor(*args, **kwargs)

    @classmethod
    def of(cls, source: QuantizedTensor) -> QuantizedTensor:
        if isinstance(source, _Transposed):
            return source.__dict__["_source"]
        view = object.__new__(cls)
        fields = view.__dict__
        # the transpose's scheme (block dims and packed axis swapped), planned without moving any data
        key = (source.scheme, source.shape)
        if key not in _T_SCHEMES:
            if len(_T_SCHEMES) >= 256:  # a bound, not an eviction policy: weights come in few schemes
                _T_SCHEMES.clear()
            _T_SCHEMES[key] = _ops().manipulation._plan_matrix_transpose(source).scheme
        fields["scheme"] = _T_SCHEMES[key]
        fields["dtype"] = source.dtype
        fields["shape"] = (source.shape[1], source.shape[0])
        fields["_source"] = source
        return view

    def _built(self) -> QuantizedTensor:
        fields = self.__dict__
        if "_materialized" not in fields:
            fields["_materialized"] = _ops().matrix_transpose(fields["_source"])
        built: QuantizedTensor = fields["_materialized"]
        return built

    values = property(lambda self: self._built().values)
    scales = property(lambda self: self._built().scales)
    global_scale = property(lambda self: self._built().global_scale)
    table = property(lambda self: self._built().table)
    zero_point = property(lambda self: self._built().zero_point)
    offset = property(lambda self: self._built().offset)

    @property
    def device(self) -> Any:
        return self.__dict__["_source"].device

    def __reduce__(self) -> Any:
        return (QuantizedTensor, tuple(getattr(self, f) for f in _FIELDS))

    def __repr__(self) -> str:
        source = self.__dict__["_source"]
        return (
            f"QuantizedTensor(scheme={str(self.scheme)!r}, shape={self.shape}, dtype={dtype_name(self.dtype)}, "
            f"backend={shim.backend_name(source.values)}, device={self.device!r})"
        )


_FIELDS = ("scheme", "shape", "dtype", "values", "scales", "global_scale", "table", "zero_point", "offset")


def stored_transpose(qt: Any) -> QuantizedTensor | None:
    """The stored tensor ``w`` when ``qt`` is the free transpose ``w.T`` of a 2-d tensor, else None."""
    return qt.__dict__["_source"] if isinstance(qt, _Transposed) else None
