"""Model folders written by compressed-tensors' own compressor, read by arrayquant.

Published compressed-tensors models are made by llm-compressor: it attaches a preset scheme to
every ``Linear`` (``apply_quantization_config``), an observer fills the weight's qparams, and
``ModelCompressor`` compresses the model and writes ``config.json``'s ``quantization_config``.
These tests do the same with compressed-tensors 0.20.1 alone (its ``calculate_qparams`` and
``generate_gparam`` in place of llm-compressor's min-max observer) on a tiny Llama built in code,
then check, per quantized ``Linear``, that ``aq.dequantize(aq.load(folder)[...])`` equals the
decompression of compressed-tensors' own per-format compressor on the same entries, and that
every other entry (embeddings, norms, ``lm_head``, biases, activation scales) comes back as the
array stored.

Where compressed-tensors decompresses: int and FP8 formats give the weight in the scale dtype
(``code.to(scale.dtype) * scale``, rounded there), the NVFP4 and MX compressors in bfloat16
(``unpack_fp4_from_uint8``'s default dtype), from an f32 product. arrayquant computes in f32
and rounds once to the requested dtype, so ``aq.dequantize(qt, <that dtype>)`` is compared bit
for bit: the int/FP8 product of a code and a scale is exact in f32, and MX scales are powers of
two (their bfloat16 result is exact, so the f32 one is compared too). NVFP4 is the exception:
compressed-tensors divides (``f32(scale / global_scale)``) where arrayquant multiplies by
``f32(1 / global_scale)``, so the f32 effective scales can differ by an ulp. Measured against
compressed-tensors' own f32 arithmetic: at most 1.49e-7 relative (asserted <= 2 ** -22); in
bfloat16 no element differs here, and at most one bfloat16 ulp is allowed.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import CorruptDataError
from arrayquant.io.compressed_tensors import ints as ct_int

pytest.importorskip("compressed_tensors")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ctq = pytest.importorskip("compressed_tensors.quantization")
from compressed_tensors.compressors import BaseCompressor, ModelCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

# the entries compressed-tensors writes for a compressed weight (the rest are plain tensors)
_WEIGHT_PARTS = ("weight_packed", "weight_scale", "weight_global_scale", "weight_shape", "weight_zero_point")
_INPUT_SCALE = 0.0625  # written into static activation scales, to find them again

# preset -> (format written, arrayquant scheme of down_proj (256 columns), activation entries)
# with {s} the scale dtype of the model (bf16 or f32)
PRESETS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "W4A16": ("pack-quantized", "q4f:block128:{s}", ()),
    "W8A16": ("pack-quantized", "q8f:block128:{s}", ()),
    "W8A8": ("int-quantized", "q8f:block256:{s}", ()),
    "W4AFP8": ("int-quantized", "q4f:block128:{s}", ()),
    "W4A8": ("int-quantized", "q4f:block128:{s}", ()),
    "W2A8": ("int-quantized", "q2f:block128:{s}", ()),
    "W4A16_ASYM": ("pack-quantized", "q4f:block128:{s}:zero_point", ()),
    "W8A16_ASYM": ("pack-quantized", "q8f:block256:{s}:zero_point", ()),  # not a preset: see _CUSTOM
    "W3A16": ("pack-quantized", "q3f:block128:{s}", ()),
    "W5A16": ("pack-quantized", "q5f:block128:{s}", ()),
    "W6A16": ("pack-quantized", "q6f:block128:{s}", ()),
    "W7A16": ("pack-quantized", "q7f:block128:{s}", ()),
    "FP8": ("float-quantized", "e4m3:tensor:{s}:native", ("input_scale",)),
    "FP8_DYNAMIC": ("float-quantized", "e4m3:block256:{s}:native", ()),
    "FP8_BLOCK": ("float-quantized", "e4m3:block128x128:{s}:native", ()),
    "NVFP4A16": ("nvfp4-pack-quantized", "nvfp4", ()),
    "NVFP4": ("nvfp4-pack-quantized", "nvfp4", ("input_global_scale",)),
    "MXFP4A16": ("mxfp4-pack-quantized", "mxfp4", ()),
    "MXFP4": ("mxfp4-pack-quantized", "mxfp4", ()),
    "MXFP8A16": ("mxfp8-quantized", "mxfp8", ()),
    "MXFP8": ("mxfp8-quantized", "mxfp8", ()),
}
# the f32 model runs a subset: one per format and strategy
F32_PRESETS = ("W4A16", "W4A16_ASYM", "W8A8", "W4AFP8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4", "MXFP4", "MXFP8")
CASES = [(p, "bfloat16") for p in PRESETS] + [(p, "float32") for p in F32_PRESETS]
# schemes llm-compressor users write out by hand: 8-bit weights with a zero point per row
_CUSTOM = {"W8A16_ASYM": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": False}}


def _tiny_llama(dtype: Any) -> Any:
    """A 2-layer Llama (with biases) whose Linear weights span several distributions."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # k_proj/v_proj have 64 rows: a partial 128x128 block
        max_position_embeddings=32,
        tie_word_embeddings=False,
        attention_bias=True,
        mlp_bias=True,
    )
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(0.0, 0.5)  # not the zeros and ones of init: a copy that drops them shows
        first, second = model.model.layers
        first.self_attn.q_proj.weight[5] = 0.0  # a row of zeros
        t = torch.distributions.StudentT(torch.tensor(2.0))  # heavy tails
        for lin in (second.mlp.gate_proj, second.mlp.down_proj, second.self_attn.v_proj):
            lin.weight.copy_(t.sample(lin.weight.shape) * 0.02)
        o = second.self_attn.o_proj.weight
        o.normal_(0.0, 0.02)
        o.view(-1)[torch.randperm(o.numel())[:20]] *= 300.0  # isolated outliers
        first.mlp.up_proj.weight.uniform_(-1e-3, 1e-3)  # small, uniform
    return model.to(dtype)


def _observe(module: Any) -> None:
    """The min-max qparams llm-compressor's observer computes, with compressed-tensors' own code."""
    args = module.quantization_scheme.weights
    w = module.weight.detach()
    strategy = args.strategy
    global_scale = None
    if strategy == ctq.QuantizationStrategy.TENSOR:
        lo, hi = w.amin(), w.amax()
    elif strategy == ctq.QuantizationStrategy.CHANNEL:
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    elif strategy in (ctq.QuantizationStrategy.GROUP, ctq.QuantizationStrategy.TENSOR_GROUP):
        groups = w.unflatten(-1, (-1, args.group_size))
        lo, hi = groups.amin(-1), groups.amax(-1)
        if strategy == ctq.QuantizationStrategy.TENSOR_GROUP:
            global_scale = generate_gparam(w.amin(), w.amax())
            module.weight_global_scale.data.copy_(global_scale)
    else:
        assert strategy == ctq.QuantizationStrategy.BLOCK
        rb, cb = args.block_structure
        rows, cols = w.shape
        padded = torch.nn.functional.pad(w, (0, 0, 0, math.ceil(rows / rb) * rb - rows))
        blocks = padded.reshape(-1, rb, cols // cb, cb)
        lo, hi = blocks.amin((1, 3)), blocks.amax((1, 3))
    scale, zero_point = calculate_qparams(lo, hi, args, global_scale=global_scale)
    module.weight_scale.data = scale.to(module.weight_scale.dtype) if scale.is_floating_point() else scale
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data = zero_point.to(module.weight_zero_point.dtype)
    for static in ("input_scale", "input_global_scale"):  # calibrated activation scales
        if hasattr(module, static):
            getattr(module, static).data.fill_(_INPUT_SCALE)


def _write(folder: Path, preset: str | dict[str, str], dtype: str) -> None:
    """Quantize, compress and save as llm-compressor does (``save_pretrained`` + ``update_config``).

    ``preset`` names one scheme for every ``Linear``, or maps ``re:`` targets to schemes.
    """
    model = _tiny_llama(getattr(torch, dtype))
    targets = {"Linear": preset} if isinstance(preset, str) else preset
    groups = {
        f"group_{i}": ctq.QuantizationScheme(targets=[t], weights=ctq.QuantizationArgs(**_CUSTOM[p]))
        if p in _CUSTOM
        else ctq.preset_name_to_scheme(p, [t])
        for i, (t, p) in enumerate(targets.items())
    }
    config = ctq.QuantizationConfig(config_groups=groups, ignore=["lm_head"])
    ctq.apply_quantization_config(model, config, show_progress=False)
    for _, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is not None:
            _observe(module)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(str(folder))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Any:
    made: dict[tuple[str, str], Path] = {}

    def get(preset: str, dtype: str) -> Path:
        if (preset, dtype) not in made:
            folder = tmp_path_factory.mktemp(f"{preset}-{dtype}")
            _write(folder, preset, dtype)
            made[preset, dtype] = folder
        return made[preset, dtype]

    return get


def _ct_decompress(folder: Path, saved: dict[str, Any]) -> dict[str, Any]:
    """Each quantized module's weight as compressed-tensors' own compressor decompresses it.

    The per-format compressor on each module's entries, as compressed-tensors' model-free
    ``CompressedTensorsDequantizer.process`` does; that class itself cannot be used here, as with
    ``targets: ["Linear"]`` it takes ``embed_tokens.weight`` for an int-/float-quantized weight.
    """
    qc = ctq.QuantizationConfig.model_validate(json.loads((folder / "config.json").read_text())["quantization_config"])
    out = {}
    for key in saved:
        if key.endswith(".weight_scale"):
            module = key.removesuffix(".weight_scale")
            # the group whose target matches (every Linear here is a quantized one)
            (scheme,) = [
                g for g in qc.config_groups.values() if any(t == "Linear" or re.match(t[3:], module) for t in g.targets)
            ]
            compressor = BaseCompressor.get_value_from_registry(scheme.format or qc.format)
            names = compressor.compression_param_names(scheme)
            state = {p: saved[f"{module}.{p}"] for p in names if f"{module}.{p}" in saved}
            out[module] = compressor.decompress(state, scheme)["weight"]
    return out


def _np(t: Any) -> np.ndarray:
    """A torch tensor as NumPy, bfloat16 as ml_dtypes' (bits unchanged)."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize(("preset", "dtype"), CASES)
def test_ct_written_folder_reads_as_ct_decompresses(folders: Any, preset: str, dtype: str) -> None:
    folder = folders(preset, dtype)
    fmt, scheme_text, activation_entries = PRESETS[preset]
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert qc["format"] == fmt
    saved = load_file(folder / "model.safetensors")
    ref = _ct_decompress(folder, saved)
    assert len(ref) == 14  # 7 Linear layers x 2; lm_head is ignored

    got = aq.load(folder)

    quantized = {k for k, v in got.items() if isinstance(v, aq.QuantizedTensor)}
    assert quantized == {f"{m}.weight" for m in ref}
    worst = 0.0
    for module, want in ref.items():
        qt = got[f"{module}.weight"]
        mine = np.asarray(aq.dequantize(qt, "bfloat16" if want.dtype == torch.bfloat16 else "float32"))
        want_np = _np(want)
        assert mine.dtype == want_np.dtype, module
        assert mine.shape == want_np.shape, module
        if fmt.startswith("nvfp4"):
            # the f32 effective scales may differ by an ulp (division vs multiplication), which
            # can move a bfloat16 rounding by one ulp; measured: none of the 294,912 elements of
            # each NVFP4 folder here moves
            steps = np.abs(_bits(mine).astype(np.int32) - _bits(want_np).astype(np.int32))
            assert int(steps.max()) <= 1, module
            np.testing.assert_array_equal(np.signbit(mine), np.signbit(want_np), err_msg=module)
        else:
            # compressed-tensors rounds an exact f32 product once into its dtype, as arrayquant does
            np.testing.assert_array_equal(_bits(mine), _bits(want_np), err_msg=module)
        if fmt.startswith("mx"):
            # power-of-two scales: compressed-tensors' bfloat16 result is exact, so is the f32 one
            exact = np.asarray(aq.dequantize(qt, "float32"))
            np.testing.assert_array_equal(exact, want_np.astype(np.float32), err_msg=module)
        elif fmt.startswith("nvfp4"):
            worst = max(worst, _nvfp4_f32_difference(qt, saved, module))
    assert worst <= 2.0**-22  # measured: at most one f32 ulp of the effective scale
    s = "bf16" if dtype == "bfloat16" else "f32"
    assert str(got["model.layers.0.mlp.down_proj.weight"].scheme) == scheme_text.format(s=s)

    # every other entry comes back as the array stored, bit for bit and in its dtype
    plain = {k for k in saved if k.rpartition(".")[2] not in (*_WEIGHT_PARTS, "weight") or _module(k) not in ref}
    assert set(got) - quantized == plain
    for key in plain:
        arr = np.asarray(got[key])
        assert arr.dtype == _np(saved[key]).dtype, key
        np.testing.assert_array_equal(_bits(arr), _bits(_np(saved[key])), err_msg=key)
    # activation scales compressed-tensors writes are plain arrays under their own names
    found = {k.rpartition(".")[2] for k in plain if k.rpartition(".")[2].startswith(("input_", "output_"))}
    assert found == set(activation_entries)
    for key in plain:
        if key.rpartition(".")[2] in activation_entries:
            assert np.asarray(got[key]).astype(np.float32).tolist() == [_INPUT_SCALE], key


def _nvfp4_f32_difference(qt: Any, saved: dict[str, Any], module: str) -> float:
    """Max relative difference of ``aq.dequantize`` to compressed-tensors' f32 NVFP4 arithmetic."""
    packed = saved[f"{module}.weight_packed"]
    rows, half = packed.shape
    codes = unpack_fp4_from_uint8(packed, rows, half * 2, dtype=torch.float32)
    args = ctq.QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16)
    want = ct_dequantize(
        codes,
        saved[f"{module}.weight_scale"].to(torch.float32),
        args=args,
        dtype=torch.float32,
        global_scale=saved[f"{module}.weight_global_scale"],
    ).numpy()
    mine = np.asarray(aq.dequantize(qt, "float32"))
    nonzero = want != 0
    np.testing.assert_array_equal(mine == 0, ~nonzero)
    return float(np.max(np.abs(mine[nonzero] - want[nonzero]) / np.abs(want[nonzero]), initial=0.0))


def test_ct_asymmetric_folder_reads_as_unsigned_when_asked(folders: Any) -> None:
    # the same stored bits as u4 codes and zero points (each 8 higher), the same weights
    folder = folders("W4A16_ASYM", "bfloat16")
    signed = aq.load(folder)
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    args = qc["config_groups"]["group_0"]["weights"]
    assert args["symmetric"] is False
    saved = {k: _np(v) for k, v in load_file(folder / "model.safetensors").items()}
    module = "model.layers.1.mlp.down_proj"
    unsigned = ct_int.read(saved, module, "pack-quantized", args, value="u4", backend="numpy")
    qt = signed[f"{module}.weight"]
    assert str(unsigned.scheme) == "u4:block128:bf16:zero_point"
    assert np.array_equal(np.asarray(unsigned.zero_point).astype(np.int16), np.asarray(qt.zero_point) + 8)
    np.testing.assert_array_equal(np.asarray(aq.dequantize(unsigned)), np.asarray(aq.dequantize(qt)))


_ARGS4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "channel"}


def test_int_quantized_reads_narrow_codes_stored_as_int8() -> None:
    # compressed-tensors' naive compressor stores 4-bit codes unpacked in int8 (W4AFP8, W4A8)
    entries = {"fc.weight": np.array([[-8, 7, 0, -1]], np.int8), "fc.weight_scale": np.array([[0.5]], np.float32)}
    qt = ct_int.read(entries, "fc", "int-quantized", _ARGS4, backend="numpy")
    assert str(qt.scheme) == "q4f:block4:f32"
    assert qt.codes().tolist() == [[-8, 7, 0, -1]]
    assert np.asarray(aq.dequantize(qt, "float32")).tolist() == [[-4.0, 3.5, 0.0, -0.5]]


@pytest.mark.parametrize("code", [8, -9, 127])
def test_int_quantized_narrow_code_out_of_range_is_corrupt(code: int) -> None:
    entries = {"fc.weight": np.array([[0, code]], np.int8), "fc.weight_scale": np.array([[1.0]], np.float32)}
    want = rf"'fc\.weight' holds {code} at flat index 1, outside the 4-bit range \[-8, 7\]"
    with pytest.raises(CorruptDataError, match=want):
        ct_int.read(entries, "fc", "int-quantized", _ARGS4, backend="numpy")


def test_int_quantized_codes_not_int8_are_corrupt() -> None:
    entries = {"fc.weight": np.array([[0, 1]], np.int16), "fc.weight_scale": np.array([[1.0]], np.float32)}
    want = r"'fc\.weight' has dtype int16 for 4-bit weights; int-quantized stores codes as int8"
    with pytest.raises(CorruptDataError, match=want):
        ct_int.read(entries, "fc", "int-quantized", _ARGS4, backend="numpy")


def test_ct_mixed_precision_folder_reads_each_group(tmp_path: Path) -> None:
    # llm-compressor's mixed schemes: one group per scheme, by name pattern, format per group
    _write(tmp_path, {"re:.*mlp.*": "W4A16", "re:.*self_attn.*": "FP8_DYNAMIC"}, "bfloat16")
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "mixed-precision"
    assert sorted(g["format"] for g in qc["config_groups"].values()) == ["float-quantized", "pack-quantized"]
    saved = load_file(tmp_path / "model.safetensors")
    ref = _ct_decompress(tmp_path, saved)
    got = aq.load(tmp_path)
    assert len(ref) == 14
    for module, want in ref.items():
        qt = got[f"{module}.weight"]
        assert str(qt.scheme).startswith("q4f:block128" if ".mlp." in module else "e4m3:block"), module
        mine = np.asarray(aq.dequantize(qt, "bfloat16"))
        np.testing.assert_array_equal(_bits(mine), _bits(_np(want)), err_msg=module)


@pytest.mark.parametrize("preset", ["FP8", "NVFP4", "FP8_DYNAMIC"])
def test_dequantized_folder_drops_activation_scales(folders: Any, tmp_path: Path, preset: str) -> None:
    """A float folder keeps no activation scale: transformers loads it with no unexpected key."""
    from arrayquant.io.compressed_tensors.model import dequantize_model

    src, back = folders(preset, "bfloat16"), tmp_path / "back"
    _, _, extra = PRESETS[preset]
    stored = load_file(str(src / "model.safetensors"))
    done = dequantize_model(src, back)
    assert sorted(done.dropped) == sorted(k for k in stored if k.rpartition(".")[2] in extra)
    assert len(done.dropped) == (14 if extra else 0)  # one per Linear of the 2-layer model
    model, info = transformers.AutoModelForCausalLM.from_pretrained(back, output_loading_info=True)
    assert not info["unexpected_keys"]
    assert not info["missing_keys"]
    loaded = aq.load(src)
    for module in done.modules:  # the float weights are arrayquant's decoding of the stored ones
        want = aq.dequantize(loaded[f"{module}.weight"], "bfloat16")
        got = model.get_submodule(module).weight.detach().view(torch.uint16).numpy()
        np.testing.assert_array_equal(got, np.asarray(want).view(np.uint16))


def test_inspect_says_activation_arguments_are_not_read(folders: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from arrayquant.cli import main

    assert main(["inspect", str(folders("FP8_DYNAMIC", "bfloat16"))]) == 0
    out = capsys.readouterr().out
    assert "the config also quantizes, at run time in the engine (not read by arrayquant" in out
    assert "group_0: input activations float 8-bit, strategy token, dynamic" in out
    assert main(["inspect", str(folders("W4A16", "bfloat16"))]) == 0
    assert "at run time in the engine" not in capsys.readouterr().out  # weights only: nothing to say


def test_ct_asymmetric_folder_runs_in_transformers_as_arrayquant_reads_it(folders: Any) -> None:
    # compressed-tensors' own W4A16_ASYM folder: transformers loads it only when asked to decompress at load
    # (its model gets unpacked zero points, the folder packed ones); arrayquant's folders carry that option
    import warnings

    folder = folders("W4A16_ASYM", "bfloat16")
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        transformers.AutoModelForCausalLM.from_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        option = transformers.CompressedTensorsConfig(dequantize=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=option)
    with torch.no_grad():
        assert bool(torch.isfinite(model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits).all())
    got = aq.load(folder)
    quantized = [k for k, v in got.items() if isinstance(v, aq.QuantizedTensor)]
    assert len(quantized) == 14
    for key in quantized:
        theirs = _np(model.get_submodule(key.removesuffix(".weight")).weight.detach())
        mine = np.asarray(aq.dequantize(got[key], "bfloat16"))
        np.testing.assert_array_equal(_bits(mine), _bits(theirs), err_msg=key)
