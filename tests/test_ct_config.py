"""The quantization_config arrayquant writes, parsed back by compressed-tensors itself."""

from __future__ import annotations

import json

import pytest

from arrayquant.errors import CorruptDataError
from arrayquant.io.compressed_tensors.config import quantization_config, weight_groups

ct = pytest.importorskip("compressed_tensors.quantization")

# the weight arguments of compressed-tensors' own presets, as its model_dump writes them
PRESETS = {
    "nvfp4-pack-quantized": "NVFP4A16",
    "mxfp4-pack-quantized": "MXFP4A16",
    "float-quantized": "FP8_BLOCK",
    "pack-quantized": "W4A16",
}


@pytest.mark.parametrize(("fmt", "preset"), PRESETS.items())
def test_config_round_trips_through_compressed_tensors(fmt: str, preset: str) -> None:
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    weights = preset_name_to_scheme(preset, ["Linear"]).weights.model_dump()
    cfg = json.loads(json.dumps(quantization_config(fmt, weights, ["lm_head", "model.embed_tokens"])))
    parsed = ct.QuantizationConfig.model_validate(cfg)
    assert parsed.format == fmt
    assert parsed.quantization_status == ct.QuantizationStatus.COMPRESSED
    assert parsed.ignore == ["lm_head", "model.embed_tokens"]
    assert parsed.config_groups["group_0"].targets == ["Linear"]
    assert parsed.config_groups["group_0"].weights.model_dump() == weights
    assert parsed.config_groups["group_0"].input_activations is None
    # what compressed-tensors writes back from its own parse is what we wrote
    again = parsed.model_dump(exclude=["quant_method"])
    ours = {k: v for k, v in cfg.items() if k not in ("quant_method", "version", "sparsity_config", "transform_config")}
    assert json.loads(json.dumps(again, default=str)) == ours
    assert weight_groups(cfg) == [(fmt, ["Linear"], weights)]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"quant_method": "gptq"}, r"quant_method 'gptq'; arrayquant reads 'compressed-tensors' only"),
        ([], r"quant_method 'list'"),
        ({"quant_method": "compressed-tensors"}, r"has no config_groups"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": 3}}, r"group 'g' is not an object"),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"]}}},
            r"group 'g' lacks a format, its targets or its weights arguments",
        ),
    ],
)
def test_weight_groups_refuse_what_is_not_compressed_tensors(config: object, message: str) -> None:
    with pytest.raises(CorruptDataError, match=message):
        weight_groups(config)  # type: ignore[arg-type]
