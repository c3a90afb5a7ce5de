"""The public surface: ``__all__`` is honest and documented (docs/api/), and each public name behaves as documented."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import pkgutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.backends.shim import to_host

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# __all__
# ---------------------------------------------------------------------------------------------


def _ruff_key(name: str) -> tuple[int, str]:
    """RUF022's "isort-style" order: SCREAMING_CASE, then CamelCase, then the rest."""
    if name.isupper() and len(name) > 1:
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def _modules() -> list[types.ModuleType]:
    names = ["arrayquant"] + [m.name for m in pkgutil.walk_packages(aq.__path__, "arrayquant.")]
    return [importlib.import_module(n) for n in names]


def test_all_names_exist() -> None:
    missing = [name for name in aq.__all__ if not hasattr(aq, name)]
    assert not missing


def test_all_is_unique_and_sorted() -> None:
    assert len(aq.__all__) == len(set(aq.__all__))
    assert aq.__all__ == sorted(aq.__all__) or aq.__all__ == sorted(aq.__all__, key=_ruff_key)


def test_all_lists_every_public_class_and_function() -> None:
    unlisted = []
    for name, obj in vars(aq).items():
        if name.startswith("_") or name in aq.__all__:
            continue
        if isinstance(obj, types.ModuleType):
            assert obj.__name__.startswith("arrayquant."), f"aq.{name} is a foreign module {obj.__name__}"
            continue
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "").startswith(
            "arrayquant"
        ):
            unlisted.append(name)
    assert not unlisted, f"public names missing from arrayquant.__all__: {unlisted}"


def test_star_import_gives_all() -> None:
    namespace: dict[str, Any] = {}
    exec("from arrayquant import *", namespace)
    assert set(aq.__all__) <= set(namespace)


@pytest.mark.parametrize("module", _modules(), ids=lambda m: m.__name__)
def test_every_module_all_is_honest(module: types.ModuleType) -> None:
    names = getattr(module, "__all__", None)
    assert names is not None, f"{module.__name__} has no __all__"
    assert len(names) == len(set(names)), f"duplicates in {module.__name__}.__all__"
    assert [n for n in names if not hasattr(module, n)] == []
    assert names == sorted(names) or names == sorted(names, key=_ruff_key)
    defined_here = [
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", None) == module.__name__
    ]
    assert [n for n in defined_here if n not in names] == [], f"unlisted public names in {module.__name__}"


# ---------------------------------------------------------------------------------------------
# The public API: the scheme model
# ---------------------------------------------------------------------------------------------

# The one list of public names is ``arrayquant.__all__``: the API reference (docs/api/) is generated
# from it, and these tests check that the reference lists each name once and each has a docstring.
REFERENCE = ROOT / "docs" / "api" / "_reference.py"


def _reference() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("_arrayquant_api_reference", REFERENCE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_lists_every_public_name_once() -> None:
    listed = [name for _, names in _reference().sections() for name in names]
    assert sorted(listed) == sorted(aq.__all__)
    assert len(listed) == len(set(listed))
    page = _reference().render()
    for name in aq.__all__:
        assert f"\n   {name}\n" in page, f"aq.{name} is not in the reference's autosummary tables"


def test_every_public_name_is_documented() -> None:
    """Each name of ``__all__`` has its own docstring (or ``#:`` comment, for data) for the reference."""
    assert _reference().undocumented() == []


def test_quant_value() -> None:
    burn = ["Q8F", "Q4F", "Q2F", "Q8S", "Q4S", "Q2S", "E4M3", "E5M2", "E2M1"]
    wider = ["Q7F", "Q6F", "Q5F", "Q3F", "Q7S", "Q6S", "Q5S", "Q3S", "U8", "U7", "U6", "U5", "U4", "U3", "U2", "U1"]
    assert [v.name for v in aq.QuantValue] == burn + wider
    bits = {"Q8F": 8, "Q4F": 4, "Q2F": 2, "Q8S": 8, "Q4S": 4, "Q2S": 2, "E4M3": 8, "E5M2": 8, "E2M1": 4}
    bits |= {"Q7F": 7, "Q6F": 6, "Q5F": 5, "Q3F": 3, "Q7S": 7, "Q6S": 6, "Q5S": 5, "Q3S": 3}
    bits |= {"U8": 8, "U7": 7, "U6": 6, "U5": 5, "U4": 4, "U3": 3, "U2": 2, "U1": 1}
    ranges = {
        "Q8F": (-128, 127), "Q4F": (-8, 7), "Q2F": (-2, 1), "Q8S": (-127, 127), "Q4S": (-7, 7), "Q2S": (-1, 1),
        "E4M3": (-448.0, 448.0), "E5M2": (-57344.0, 57344.0), "E2M1": (-6.0, 6.0),
        "Q7F": (-64, 63), "Q6F": (-32, 31), "Q5F": (-16, 15), "Q3F": (-4, 3),
        "Q7S": (-63, 63), "Q6S": (-31, 31), "Q5S": (-15, 15), "Q3S": (-3, 3),
        "U8": (0, 255), "U7": (0, 127), "U6": (0, 63), "U5": (0, 31), "U4": (0, 15), "U3": (0, 7), "U2": (0, 3),
        "U1": (0, 1),
    }  # fmt: skip
    for v in aq.QuantValue:
        assert v.bits == bits[v.name]
        assert v.range == ranges[v.name]
        assert v.is_float is v.name.startswith("E")
        assert v.is_unsigned is v.name.startswith("U")
        assert v.is_burn is (v.name in burn)
    assert aq.QuantScheme().with_value("q8s").value is aq.QuantValue.Q8S
    assert aq.QuantScheme().with_value("Q8S").value is aq.QuantValue.Q8S


def test_quant_mode_and_calibration() -> None:
    assert [m.name for m in aq.QuantMode] == ["SYMMETRIC", "LOOKUP", "ZERO_POINT", "OFFSET"]
    assert [m.is_affine for m in aq.QuantMode] == [False, False, True, True]
    assert [c.name for c in aq.Calibration] == ["MINMAX", "ABSMEAN", "MSE", "PERCENTILE", "FOUR_OVER_SIX", "GGML"]
    assert aq.MSE() == aq.MSE(grid=100, max_shrink=0.2, norm=2.4)
    assert aq.Percentile().q == 99.9
    assert aq.QuantScheme().with_mode("lookup").mode is aq.QuantMode.LOOKUP


def test_scale_dtype() -> None:
    assert [d.name for d in aq.ScaleDtype] == ["F32", "F16", "BF16", "UE4M3", "UE8M0"]
    assert {d.name: d.nbytes for d in aq.ScaleDtype} == {"F32": 4, "F16": 2, "BF16": 2, "UE4M3": 1, "UE8M0": 1}
    assert aq.ScaleDtype.F16.max == 65504.0
    assert aq.ScaleDtype.UE4M3.max == 448.0
    assert aq.ScaleDtype.UE8M0.max == 2.0**127
    assert aq.ScaleDtype.BF16.max == float.fromhex("0x1.fep127")
    assert aq.ScaleDtype.F16.round_up(1.0012) == 1.001953125
    assert aq.ScaleDtype.UE4M3.round_up(0.3) == 0.3125
    assert aq.ScaleDtype.coerce("ue4m3") is aq.ScaleDtype.UE4M3


def test_quant_store() -> None:
    native, u32, u32_1, pn = (
        aq.QuantStore.native(),
        aq.QuantStore.packed_u32(),
        aq.QuantStore.packed_u32(dim=1),
        aq.QuantStore.packed_native(dim=0),
    )
    assert (native.kind, native.dim) == ("native", 0)
    assert (u32.kind, u32.dim) == ("packed_u32", 0)
    assert (u32_1.kind, u32_1.dim) == ("packed_u32", 1)
    assert (pn.kind, pn.dim) == ("packed_native", 0)
    assert hash(u32) == hash(aq.QuantStore.packed_u32(0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        u32.dim = 2  # type: ignore[misc]
    s = aq.QuantScheme()
    assert s.with_store("native").store == native
    assert s.with_store("packed_u32").store == u32
    assert s.with_store("packed_u32:1").store == u32_1
    assert s.with_value("e2m1").with_store("packed_native").store == pn


def test_block_size() -> None:
    assert aq.BlockSize((1, 32)) == aq.BlockSize((32,))
    assert hash(aq.BlockSize((1, 32))) == hash(aq.BlockSize(32))
    assert aq.BlockSize(32).to_dims(2) == (1, 32)
    assert aq.BlockSize((2, 32)).num_blocks((5, 64)) == (3, 2)


def test_quant_scheme_builders_and_properties() -> None:
    default = aq.QuantScheme()
    assert default.value is aq.QuantValue.Q8F
    assert default.store == aq.QuantStore.packed_u32(0)
    assert default.mode is aq.QuantMode.SYMMETRIC
    assert default.tensor_scale is aq.ScaleDtype.F32
    assert default.block_scale is None
    assert default.block_size is None
    assert default.num_levels == 1
    assert not default.is_two_level
    assert hash(default) == hash(aq.QuantScheme())
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.value = aq.QuantValue.Q8S  # type: ignore[misc]

    a = aq.QuantScheme().with_value("q8s").per_tensor("f32").per_block([16], "ue4m3")
    b = aq.QuantScheme().with_value("q8s").per_block([16], "ue4m3").per_tensor("f32")
    assert a == b
    assert a.is_two_level
    assert a.num_levels == 2
    assert a.scale_dtype is aq.ScaleDtype.UE4M3
    assert a.block_scale is aq.ScaleDtype.UE4M3
    assert a.tensor_scale is aq.ScaleDtype.F32
    assert a.block_size == aq.BlockSize(16)


def test_quant_scheme_presets_and_text() -> None:
    nv = aq.QuantScheme.nvfp4()
    assert (nv.value, nv.store, nv.block_size, nv.block_scale, nv.tensor_scale) == (
        aq.QuantValue.E2M1, aq.QuantStore.packed_native(0), aq.BlockSize(16), aq.ScaleDtype.UE4M3, aq.ScaleDtype.F32,
    )  # fmt: skip
    mx8 = aq.QuantScheme.mxfp8()
    assert (mx8.value, mx8.store, mx8.block_size, mx8.block_scale, mx8.is_two_level) == (
        aq.QuantValue.E4M3, aq.QuantStore.native(), aq.BlockSize(32), aq.ScaleDtype.UE8M0, False,
    )  # fmt: skip
    mx4 = aq.QuantScheme.mxfp4()
    assert (mx4.value, mx4.store, mx4.block_size, mx4.block_scale) == (
        aq.QuantValue.E2M1, aq.QuantStore.packed_native(0), aq.BlockSize(32), aq.ScaleDtype.UE8M0,
    )  # fmt: skip
    assert str(nv) == "nvfp4"
    for text in ["nvfp4", "mxfp8", "mxfp4", "q4s:block32:f16", "q8s:block16:ue4m3:tensor:f32:native", "q8f"]:
        assert str(aq.QuantScheme.parse(text)) == text
        assert aq.QuantScheme.parse(str(aq.QuantScheme.parse(text))) == aq.QuantScheme.parse(text)


def test_qparams() -> None:
    sig = inspect.signature(aq.QParams)
    assert list(sig.parameters) == ["scales", "global_scale", "table", "zero_point", "offset"]
    for name in ("global_scale", "table", "zero_point", "offset"):
        assert sig.parameters[name].default is None
    p = aq.QParams(scales=np.ones(1, np.float32))
    assert p.global_scale is None
    assert p.table is None


def test_nf4() -> None:
    if not hasattr(aq, "NF4"):
        pytest.fail("aq.NF4 (the 16-entry NF4 codebook) is missing")
    raw = np.asarray(aq.NF4 if isinstance(aq.NF4, (list, tuple)) else to_host(aq.NF4), dtype=np.float64)
    table = raw.astype(np.float32)
    assert table.shape == (16,)
    np.testing.assert_array_equal(table.astype(np.float64), raw)  # every entry is an f32 value
    assert (np.diff(table) > 0).all()
    assert table[0] == -1.0
    assert table[-1] == 1.0
    assert 0.0 in table


# ---------------------------------------------------------------------------------------------
# The public API: functions and the quantized tensor
# ---------------------------------------------------------------------------------------------

SIGNATURES = {
    "compute_range": "(x, scheme, calibration='minmax', *, importance=None)",
    "compute_q_params": "(scheme, min, max, *, table=None)",
    "quantize": (
        "(x, scheme, params=None, *, calibration='minmax', importance=None, table=None, rounding='half_even', "
        "check_finite=True)"
    ),
    "dequantize": "(qt, dtype=None)",
    "round_up_scales": "(s, scale_dtype)",
    "pack": "(codes, scheme)",
    "unpack": "(values, scheme, shape)",
    "to_bytes": "(qt)",
    "from_bytes": "(buf, scheme, shape, *, backend=None, device=None)",
    "quantized_nbytes": "(scheme, shape)",
    "asarray": "(obj, *, backend=None, device=None)",
}


def _bare_signature(fn: Any) -> str:
    sig = inspect.signature(fn)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_function_signature(name: str) -> None:
    assert hasattr(aq, name), f"aq.{name} is missing"
    fn = getattr(aq, name)
    assert callable(fn)
    assert _bare_signature(fn) == SIGNATURES[name]


def test_quantized_tensor_attributes() -> None:
    x = np.asarray([[0.5, -1.0, 0.25, 2.0]], np.float32)
    qt = aq.quantize(x, "q8s:block2:f16")
    assert isinstance(qt, aq.QuantizedTensor)
    assert qt.scheme == aq.QuantScheme.parse("q8s:block2:f16")
    assert qt.shape == (1, 4)
    assert qt.dtype == np.float32
    assert qt.device == "cpu"
    assert qt.values.dtype == np.uint32
    assert qt.scales.shape == (1, 2)
    assert qt.scales.dtype == np.float32
    assert qt.global_scale is None
    assert qt.table is None
    assert qt.zero_point is None
    assert qt.offset is None
    assert qt.codes().dtype == np.int8
    assert qt.nbytes == aq.quantized_nbytes(qt.scheme, qt.shape)
    zp = aq.quantize(x, "u8:block2:f16:zero_point")
    assert zp.codes().dtype == np.uint8
    assert zp.zero_point.dtype == np.uint8
    assert zp.zero_point.shape == (1, 2)
    assert aq.quantize(x, "u8:block2:f16:offset").offset.dtype == np.float32
    assert callable(qt.to_device)
    assert callable(qt.to_backend)
    with pytest.raises(dataclasses.FrozenInstanceError):
        qt.values = None  # type: ignore[misc]
    if hasattr(aq, "to_bytes"):
        assert len(aq.to_bytes(qt)) == qt.nbytes


def test_backends_namespace() -> None:
    for name in ["available", "get", "default"]:
        assert callable(getattr(aq.backends, name))
    infos = aq.backends.available()
    assert [i.name for i in infos] == ["numpy", "cupy", "torch", "jax", "dask", "array_api_strict"]
    for info in infos:
        for field in ["name", "installed", "usable", "devices", "reason"]:
            assert hasattr(info, field)
    numpy_info = aq.backends.get("numpy")
    assert numpy_info.usable
    assert numpy_info.installed
    assert "cpu" in numpy_info.devices
    assert aq.backends.default().usable
