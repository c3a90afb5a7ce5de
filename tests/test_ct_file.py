"""One compressed-tensors safetensors file (``io/ct_file.py``) and mixed-precision configs.

The oracles are compressed-tensors itself: its ``QuantizationConfig`` parses the config, its
``is_match`` and ``apply_quantization_config`` put each module of a torch model in its group, and
its ``ModelCompressor`` (the path transformers takes) decompresses the file loaded with
``safetensors.torch``; that decompression is compared with ``aq.dequantize``. Plain arrays are
compared byte for byte with what ``safetensors.torch`` reads.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("compressed_tensors")
torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config  # noqa: E402
from compressed_tensors.utils.match import is_match  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import arrayquant as aq  # noqa: E402
from arrayquant.errors import CorruptDataError, SchemeError, ShapeError  # noqa: E402
from arrayquant.io.arrayquant.checkpoint import save_stream  # noqa: E402
from arrayquant.io.compressed_tensors.config import modules_quantization_config, quantization_config, weight_groups  # noqa: E402
from arrayquant.io.compressed_tensors.file import file_quantization_config, save_compressed_tensors  # noqa: E402
from arrayquant.io.compressed_tensors.schemes import read_weight  # noqa: E402
from arrayquant.io.safetensors.reader import SafetensorsFile  # noqa: E402

NVFP4 = ("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16})
FP8_BLOCK = ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]})
W4_G32 = ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32})
W4_G128 = ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128})
# names one a prefix, suffix or digit-extension of another: an unanchored pattern would take both
MODULES = ["layers.0.q", "layers.0.q_proj", "layers.10.q", "layers.1.q", "model.layers.1.q"]


def tiny_model(names: list[str], shape: tuple[int, int] = (32, 64)) -> Any:
    """Nested torch modules with a ``Linear`` at each dotted name."""
    root = torch.nn.Module()
    for name in names:
        *path, leaf = name.split(".")
        parent = root
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, torch.nn.Linear(shape[1], shape[0], bias=False))
    return root


def parsed(cfg: dict[str, Any]) -> Any:
    return QuantizationConfig.model_validate(json.loads(json.dumps(cfg)))  # through JSON, as config.json


# -- the config -------------------------------------------------------------------------------
def test_one_kind_gives_the_linear_group() -> None:
    reordered = (NVFP4[0], dict(reversed(NVFP4[1].items())))  # same arguments, other key order
    cfg = modules_quantization_config({"a": NVFP4, "b": reordered}, ["lm_head"])
    assert cfg == quantization_config(*NVFP4, ["lm_head"])
    assert cfg["format"] == "nvfp4-pack-quantized"
    assert cfg["config_groups"]["group_0"]["targets"] == ["Linear"]
    assert cfg["config_groups"]["group_0"]["format"] is None
    assert parsed(cfg).format == "nvfp4-pack-quantized"


def test_mixed_config_parses_and_ct_matches_each_module_to_its_group() -> None:
    want = {"layers.0.q": 0, "layers.0.q_proj": 1, "layers.10.q": 2, "layers.1.q": 0, "model.layers.1.q": 3}
    kinds = [NVFP4, FP8_BLOCK, W4_G32, W4_G128]
    cfg = modules_quantization_config({m: kinds[g] for m, g in want.items()}, ["lm_head"])
    qc = parsed(cfg)
    assert cfg["format"] == qc.format == "mixed-precision"
    assert list(qc.config_groups) == ["group_0", "group_1", "group_2", "group_3"]
    assert [s.format for s in qc.config_groups.values()] == [k[0] for k in kinds]
    assert qc.ignore == ["lm_head"]
    model = tiny_model([*MODULES, "lm_head"], (32, 128))
    for name in [*MODULES, "lm_head"]:
        module = model.get_submodule(name)
        hits = [i for i, s in enumerate(qc.config_groups.values()) if is_match(name, module, s.targets)]
        assert hits == ([want[name]] if name in want else []), name
    # compressed-tensors' own application: each module gets its group's format and arguments
    apply_quantization_config(model, qc)
    for name, g in want.items():
        scheme = model.get_submodule(name).quantization_scheme
        assert scheme.format == kinds[g][0], name
        assert {k: v for k, v in scheme.weights.model_dump().items() if k in kinds[g][1]} == kinds[g][1]
    assert not hasattr(model.get_submodule("lm_head"), "quantization_scheme")
    # the reader takes each group's own format
    assert weight_groups(cfg) == [
        (fmt, [f"re:^{re.escape(m)}$" for m, g in want.items() if g == i], args) for i, (fmt, args) in enumerate(kinds)
    ]


def test_one_format_different_arguments_keeps_the_format() -> None:
    cfg = modules_quantization_config({"a": W4_G32, "b": W4_G128}, [])
    qc = parsed(cfg)
    assert cfg["format"] == qc.format == "pack-quantized"  # one format: compressed-tensors' _flatten_formats
    assert [(s.targets, s.weights.group_size) for s in qc.config_groups.values()] == [
        (["re:^a$"], 32),
        (["re:^b$"], 128),
    ]


def test_config_errors() -> None:
    with pytest.raises(ShapeError, match=r"no quantized modules: a quantization_config needs at least one"):
        modules_quantization_config({}, [])
    cfg = modules_quantization_config({"a": NVFP4, "b": FP8_BLOCK}, [])
    cfg["config_groups"]["group_1"]["format"] = None
    with pytest.raises(
        CorruptDataError, match=r"group 'group_1' names no format while the config's format is 'mixed-precision'"
    ):
        weight_groups(cfg)


# -- the file ---------------------------------------------------------------------------------
SCHEMES = ["nvfp4", "mxfp8", "mxfp4", "e4m3:block128x128:f32:native", "e4m3:tensor:f32:native", "q4s:block32:f32"]
SHAPES = [(64, 128), (48, 256)]


def sample(shape: tuple[int, int], dist: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dist == "normal":
        return (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    x = rng.standard_t(2, shape)  # heavy tails, and a row of zeros
    x[1] = 0
    return x.astype(np.float32)


def quantized(shape: tuple[int, int], dist: str) -> dict[str, aq.QuantizedTensor]:
    """One weight per scheme, under module names that an unanchored pattern would confuse."""
    names = ["layers.0.q", "layers.0.q_proj", "layers.10.q", "layers.1.q", "model.layers.1.q", "layers.2.o"]
    return {
        f"{m}.weight": aq.quantize(sample(shape, dist, zlib.crc32(repr((s, shape, dist)).encode())), s)
        for m, s in zip(names, SCHEMES, strict=True)
    }


def plain() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "lm_head.weight": rng.standard_normal((8, 128)).astype(ml_dtypes.bfloat16),
        "layers.0.q.bias": rng.standard_normal(64).astype(np.float32),
        "embed.ids": np.arange(12, dtype=np.int32).reshape(3, 4),
    }


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dist", ["normal", "heavy"])
def test_ct_model_compressor_decompresses_the_file(tmp_path: Path, shape: tuple[int, int], dist: str) -> None:
    qts = quantized(shape, dist)
    path = tmp_path / "model.safetensors"
    save_compressed_tensors(path, {**qts, **plain()})
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt"
    qc = QuantizationConfig.model_validate(json.loads(meta["quantization_config"]))
    assert qc.format == "mixed-precision"
    assert qc.ignore == ["lm_head"]  # the 2-d float weight left as it is
    modules = [n.removesuffix(".weight") for n in qts]
    model = tiny_model(modules, shape)
    # transformers' path: apply the config, compress (to create the entries), load the file, decompress
    apply_quantization_config(model, qc)
    compressor = ModelCompressor(quantization_config=qc)
    compressor.compress_model(model)
    state = {k: v for k, v in load_file(str(path)).items() if k.rsplit(".", 1)[0] in modules and ".weight" in k}
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys
    assert not result.unexpected_keys
    compressor.decompress_model(model)
    for name, qt in qts.items():
        got = model.get_submodule(name.removesuffix(".weight")).weight.detach()
        want = torch.from_numpy(np.asarray(aq.dequantize(qt))).to(got.dtype)  # compressed-tensors' output dtype
        if str(qt.scheme) == "nvfp4":
            # compressed-tensors divides by the stored reciprocal where arrayquant multiplies (see
            # io/compressed_tensors.py): one f32 ulp, which rounding to bf16 may keep as one bf16 ulp
            assert got.dtype == torch.bfloat16
            ulps = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
            assert int(ulps.max()) <= 1, name
        else:
            assert torch.equal(got, want), name


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_through_arrayquant(tmp_path: Path, shape: tuple[int, int]) -> None:
    qts, arrays = quantized(shape, "normal"), plain()
    path = tmp_path / "model.safetensors"
    save_compressed_tensors(path, {**qts, **arrays})
    cfg = file_quantization_config(path)
    assert cfg is not None
    groups = weight_groups(cfg)
    with SafetensorsFile(path) as st:
        entries = {k: st.array(k) for k in st.entries}
    nv = {"layers.0.q.weight_packed", "layers.0.q.weight_scale", "layers.0.q.weight_global_scale"}
    assert nv <= set(entries)
    assert "layers.0.q.weight" not in entries
    for name, qt in qts.items():
        module = name.removesuffix(".weight")
        (fmt, _, args), *more = [g for g in groups if any(re.match(t[3:], module) for t in g[1])]
        assert not more, module
        mine = {k: v for k, v in entries.items() if k.rsplit(".", 1)[0] == module}
        back = read_weight(mine, module, fmt, args, backend="numpy")
        # compressed-tensors' int range is the full one: q4s codes read back as q4f (io/ct_int.py)
        assert str(back.scheme) == str(qt.scheme).replace("q4s", "q4f")
        assert back.shape == qt.shape
        got, want = np.asarray(aq.dequantize(back)), np.asarray(aq.dequantize(qt))
        if qt.global_scale is None:
            np.testing.assert_array_equal(got, want)
        else:  # nvfp4: the global scale crosses as its f32 reciprocal (io/compressed_tensors.py)
            np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)
        np.testing.assert_array_equal(np.asarray(back.values), np.asarray(qt.values))
        np.testing.assert_array_equal(np.asarray(back.scales), np.asarray(qt.scales))
        if qt.global_scale is None:
            assert back.global_scale is None
            if back.scheme == qt.scheme:
                assert aq.to_bytes(back) == aq.to_bytes(qt)
        else:  # nvfp4's divisor: the f32 reciprocal of a reciprocal, one ulp at most (io/compressed_tensors.py)
            g, g2 = np.asarray(qt.global_scale, np.float32), np.asarray(back.global_scale, np.float32)
            assert abs(int(g2.view(np.int32)[0]) - int(g.view(np.int32)[0])) <= 1
    # plain arrays: byte for byte as safetensors' own reader sees them
    theirs = load_file(str(path))
    for name, arr in arrays.items():
        t = theirs[name]
        assert list(t.shape) == list(arr.shape)
        assert (
            str(t.dtype)
            == {"bfloat16": "torch.bfloat16", "float32": "torch.float32", "int32": "torch.int32"}[arr.dtype.name]
        )
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        assert raw.numpy().tobytes() == arr.tobytes(), name


def test_uniform_file_has_the_linear_group(tmp_path: Path) -> None:
    x = sample((64, 128), "normal", 3)
    path = tmp_path / "m.safetensors"
    save_compressed_tensors(path, {"a.weight": aq.quantize(x, "mxfp8"), "b.weight": aq.quantize(-x, "mxfp8")})
    cfg = file_quantization_config(path)
    assert cfg is not None
    qc = QuantizationConfig.model_validate(cfg)
    assert qc.format == "mxfp8-quantized"
    assert [s.targets for s in qc.config_groups.values()] == [["Linear"]]
    assert qc.ignore == []


def test_file_without_quantized_tensors_has_no_config(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    save_compressed_tensors(path, {"w": np.ones((2, 3), np.float32)})
    assert file_quantization_config(path) is None
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["format"] == "pt"
        assert "quantization_config" not in f.metadata()


def test_save_errors_leave_the_target_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"before")
    qt = aq.quantize(sample((64, 128), "normal", 1), "mxfp8")
    for name in ("w", ".weight", "m.weight_packed"):
        with pytest.raises(
            ShapeError, match=rf"quantized tensor {re.escape(repr(name))} is not named '<module>.weight'"
        ):
            save_compressed_tensors(path, {name: qt})
    with pytest.raises(ShapeError, match=r"format='arrayquant'"):
        save_compressed_tensors(path, {"w": qt})
    nf4 = aq.quantize(sample((64, 128), "normal", 2), "nf4")
    with pytest.raises(
        SchemeError,
        match=r"quantized tensor 'm.weight': scheme nf4 has no compressed-tensors format; .*format='arrayquant'",
    ):
        save_compressed_tensors(path, {"ok.weight": qt, "m.weight": nf4})
    with pytest.raises(ShapeError, match=r"tensor name 'm.weight_scale' appears twice"):
        save_compressed_tensors(path, {"m.weight": qt, "m.weight_scale": np.ones(4, np.float32)})
    assert path.read_bytes() == b"before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no temporary left behind


def test_file_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_stream(path, [("w", np.ones(2, np.float32))], metadata={"quantization_config": "{not json"})
    with pytest.raises(CorruptDataError, match=r"the metadata's quantization_config is not JSON"):
        file_quantization_config(path)
    save_stream(path, [("w", np.ones(2, np.float32))], metadata={"quantization_config": "[1, 2]"})
    with pytest.raises(CorruptDataError, match=r"the metadata's quantization_config is a JSON list, not an object"):
        file_quantization_config(path)


def test_aq_load_reads_a_mixed_file_with_its_config_beside(tmp_path: Path) -> None:
    """The model-folder reader takes the stored config and each group's format (anchored targets)."""
    qts = quantized((64, 128), "heavy")
    path = tmp_path / "model.safetensors"
    save_compressed_tensors(path, {**qts, **plain()})
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": file_quantization_config(path)}))
    back = aq.load(path, backend="numpy")
    assert sorted(back) == sorted([*qts, *plain()])
    for name, qt in qts.items():
        assert str(back[name].scheme) == str(qt.scheme).replace("q4s", "q4f"), name
        got, want = np.asarray(aq.dequantize(back[name])), np.asarray(aq.dequantize(qt))
        np.testing.assert_allclose(got, want, rtol=2e-7 if qt.global_scale is not None else 0, atol=0)


def test_aq_save_and_load_the_file_alone(tmp_path: Path) -> None:
    """``aq.save(format="compressed-tensors")``, then ``aq.load`` without config.json: the metadata's config."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((48, 64)).astype(np.float32)
    tensors = {
        "layers.0.q.weight": aq.quantize(x, "nvfp4"),
        "layers.0.mlp.weight": aq.quantize(x, "mxfp8"),
        "layers.0.q.bias": x[0].copy(),
    }
    path = tmp_path / "w.safetensors"
    aq.save(path, tensors, format="compressed-tensors")
    assert not (tmp_path / "config.json").exists()
    with SafetensorsFile(path) as st:  # the entries compressed-tensors names, not arrayquant's
        assert "layers.0.q.weight_packed" in st.entries
        assert "layers.0.mlp.weight_scale" in st.entries
    back = aq.load(path, backend="numpy")
    assert sorted(back) == sorted(tensors)
    for name in ("layers.0.q.weight", "layers.0.mlp.weight"):
        np.testing.assert_array_equal(aq.dequantize(back[name]), aq.dequantize(tensors[name]))
    np.testing.assert_array_equal(back["layers.0.q.bias"], x[0])


def test_aq_save_refuses_an_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(
        SchemeError,
        match=r"format 'gguf2' is not one aq\.save writes; use one of 'gguf', 'burnpack', 'compressed-tensors'",
    ):
        aq.save(tmp_path / "w.safetensors", {"a": np.ones(2, np.float32)}, format="gguf2")
    assert not any(tmp_path.iterdir())


def test_cli_reads_a_compressed_tensors_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """inspect and dequantize take a compressed-tensors file; quantize refuses one (its weights are codes)."""
    from arrayquant.cli import main

    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    path = tmp_path / "ct.safetensors"
    aq.save(path, {"fc.weight": aq.quantize(x, "mxfp8"), "fc.bias": x[0].copy()}, format="compressed-tensors")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"fc\.weight\s+32x64\s+mxfp8\s", out)
    assert "2 tensors, 1 quantized" in out
    back = tmp_path / "float.safetensors"
    assert main(["dequantize", str(path), str(back)]) == 0
    assert "dequantized 1 weights" in capsys.readouterr().out
    with safe_open(str(back), "np") as f:  # a plain float file any loader reads
        assert sorted(f.keys()) == ["fc.bias", "fc.weight"]
        np.testing.assert_array_equal(f.get_tensor("fc.weight"), aq.dequantize(aq.quantize(x, "mxfp8")))
        np.testing.assert_array_equal(f.get_tensor("fc.bias"), x[0])
    refusal = "is in compressed-tensors' layout: its weights are quantized already; quantize the float model"
    assert main(["quantize", str(path), str(tmp_path / "q.safetensors"), "--scheme", "q8s"]) == 1
    assert refusal in capsys.readouterr().err
    args = ["quantize", str(path), str(tmp_path / "q"), "--scheme", "q8s:block32", "--format", "compressed-tensors"]
    assert main(args) == 1
    assert "is already quantized (it has a quantization_config" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
    assert not (tmp_path / "q.safetensors").exists()
