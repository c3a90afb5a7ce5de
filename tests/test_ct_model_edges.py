"""Model folders at their edges: which weights count as Linear, shards read alone, failures, refusals.

Folders are made in code with plain NumPy tensors (no transformers needed); what a weight
decodes to is compared with ``aq.quantize`` of the same array, whose codecs the other
compressed-tensors tests check against the real library.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.errors import CorruptDataError, NonFiniteInputError, ShapeError
from arrayquant.io.arrayquant.checkpoint import save_stream
from arrayquant.io.compressed_tensors.model import dequantize_model
from arrayquant.io.compressed_tensors.requantize import quantize_model

pytest.importorskip("ml_dtypes")


def _folder(path: Path, tensors: dict[str, np.ndarray], config: object = None, shards: int = 1) -> Path:
    """A Hugging Face-shaped folder: the tensors in ``shards`` files (with an index when several)."""
    path.mkdir(parents=True)
    names = list(tensors)
    groups = [names[i::shards] for i in range(shards)]
    if shards == 1:
        save_stream(path / "model.safetensors", ((n, tensors[n]) for n in names), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k, group in enumerate(groups, 1):
            shard = f"model-{k:05d}-of-{shards:05d}.safetensors"
            save_stream(path / shard, ((n, tensors[n]) for n in group), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(group, shard))
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = {"model_type": "llama", "vocab_size": 96} if config is None else config
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def _w(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def test_embeddings_and_heads_by_name_and_vocabulary_stay_float(tmp_path: Path) -> None:
    tensors = {
        "transformer.wte.weight": _w(96, 64, 1),  # GPT-2-style names
        "transformer.wpe.weight": _w(40, 64, 2),
        "shared.weight": _w(96, 64, 3),  # T5
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": _w(32, 8, 4),
        "cls.predictions.decoder.weight": _w(96, 64, 5),  # a head by its rows: the vocabulary
        "model.layers.0.mlp.shared_expert.gate_proj.weight": _w(128, 64, 6),  # a Linear, "shared" inside a word
        "model.layers.0.self_attn.q_proj.weight": _w(64, 64, 7),
        "model.layers.0.mlp.up_proj.weight": _w(96, 64, 8),  # as many rows as the vocabulary, inside a layer
    }
    src = _folder(tmp_path / "m", tensors)
    summary = quantize_model(src, tmp_path / "q", "mxfp8")
    assert sorted(summary.quantized) == [
        "model.layers.0.mlp.shared_expert.gate_proj",
        "model.layers.0.mlp.up_proj",
        "model.layers.0.self_attn.q_proj",
    ]
    assert "96 rows, the vocabulary size" in summary.left_out["cls.predictions.decoder"]
    for module in ("transformer.wte", "transformer.wpe", "shared"):
        assert summary.left_out[module].startswith("embedding, head or norm")
    back = aq.load(tmp_path / "q", backend="numpy")
    for name, x in tensors.items():
        if name.removesuffix(".weight") in summary.quantized:
            np.testing.assert_array_equal(aq.dequantize(back[name]), aq.dequantize(aq.quantize(x, "mxfp8")))
        else:
            np.testing.assert_array_equal(back[name], x)
    qc = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert qc["ignore"] == sorted({*summary.left_out, "lm_head"})


def test_conv1d_models_are_refused(tmp_path: Path) -> None:
    src = _folder(tmp_path / "gpt2", {"h.0.attn.c_attn.weight": _w(64, 192)}, {"model_type": "gpt2"})
    with pytest.raises(ShapeError, match=r"is a gpt2 model, whose projections are Conv1D layers storing weights"):
        quantize_model(src, tmp_path / "q", "mxfp8")
    assert not (tmp_path / "q").exists()


def test_a_bad_weight_stops_the_run_and_leaves_nothing(tmp_path: Path) -> None:
    bad = _w(64, 64, 1)
    bad[3, 5] = np.nan
    src = _folder(tmp_path / "m", {"a.q_proj.weight": _w(64, 64), "a.k_proj.weight": bad}, shards=2)
    with pytest.raises(NonFiniteInputError, match="NaN"):
        quantize_model(src, tmp_path / "q", "nvfp4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no output, no hidden partial folder
    (tmp_path / "q").mkdir()  # an empty folder may be the target, and stays usable after a failure
    with pytest.raises(NonFiniteInputError):
        quantize_model(src, tmp_path / "q", "mxfp8")
    assert not any((tmp_path / "q").iterdir())


def test_output_inside_the_input_is_refused(tmp_path: Path) -> None:
    src = _folder(tmp_path / "m", {"a.q_proj.weight": _w(64, 64)})
    with pytest.raises(ShapeError, match=r"lies inside .*; write the quantized model beside it, not into it"):
        quantize_model(src, src / "q", "mxfp8")
    assert not (src / "q").exists()


def test_weights_in_other_formats_are_not_copied(tmp_path: Path) -> None:
    src = _folder(tmp_path / "m", {"a.q_proj.weight": _w(64, 64)})
    for name in ("pytorch_model.bin", "consolidated.safetensors", "training_args.bin", "tokenizer.json"):
        (src / name).write_bytes(b"x")
    (src / "original").mkdir()
    (src / "original" / "consolidated.00.pth").write_bytes(b"x")
    (src / "original" / "params.json").write_text("{}")
    summary = quantize_model(src, tmp_path / "q", "mxfp8")
    assert sorted(summary.skipped_files) == [
        "consolidated.safetensors",
        "original/consolidated.00.pth",
        "pytorch_model.bin",
    ]
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == [
        "config.json",
        "model.safetensors",
        "original",
        "tokenizer.json",
        "training_args.bin",
    ]
    assert [p.name for p in (tmp_path / "q" / "original").iterdir()] == ["params.json"]


def test_a_shard_read_alone_finds_its_modules_in_the_others(tmp_path: Path) -> None:
    tensors = {f"layers.{i}.mlp.up_proj.weight": _w(64, 128, i) for i in range(3)}
    src = _folder(tmp_path / "m", tensors)
    # shards about one packed weight each: a module's entries land in different files
    quantize_model(src, tmp_path / "q", "nvfp4", max_shard_size=4200)
    shards = sorted((tmp_path / "q").glob("model-*.safetensors"))
    assert len(shards) > 3
    whole = aq.load(tmp_path / "q", backend="numpy")
    found: dict[str, object] = {}
    for shard in shards:
        for name, item in aq.load(shard, backend="numpy").items():
            assert name not in found
            found[name] = item
    assert sorted(found) == sorted(whole) == sorted(tensors)
    for name in tensors:
        np.testing.assert_array_equal(aq.dequantize(found[name]), aq.dequantize(whole[name]))
    # without its index, a shard holding half a module cannot be decoded: said, not guessed
    from safetensors import safe_open

    def names(shard: Path) -> list[str]:
        with safe_open(str(shard), "np") as f:
            return list(f.keys())

    half = next(
        s
        for s in shards
        if any(n.endswith("weight_packed") for n in names(s)) and not any(n.endswith("weight_scale") for n in names(s))
    )
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "config.json").write_bytes((tmp_path / "q" / "config.json").read_bytes())
    (lone / half.name).write_bytes(half.read_bytes())
    with pytest.raises(CorruptDataError, match=r"weight_packed' but no .*\.weight_scale to decode it with; a shard"):
        aq.load(lone / half.name, backend="numpy")


def test_a_file_config_wins_over_the_folder_config(tmp_path: Path) -> None:
    src = _folder(tmp_path / "m", {"a.q_proj.weight": _w(64, 64)})
    quantize_model(src, tmp_path / "q", "mxfp8")  # config.json: mxfp8-quantized
    x = _w(32, 64, 9)
    own = tmp_path / "q" / "extra.safetensors"
    aq.save(own, {"b.weight": aq.quantize(x, "nvfp4")}, format="compressed-tensors")
    back = aq.load(own, backend="numpy")
    assert str(back["b.weight"].scheme) == "nvfp4"
    np.testing.assert_array_equal(aq.dequantize(back["b.weight"]), aq.dequantize(aq.quantize(x, "nvfp4")))


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        ("model.safetensors.index.json", "{not json", r"is not JSON \(a safetensors index\)"),
        ("model.safetensors.index.json", "[1, 2]", "has no weight_map; it is not a safetensors index"),
        ("config.json", "[1]", "holds a JSON list, not the object of a model config"),
        ("config.json", "\xff", r"is not JSON \(a model config\)"),
    ],
)
def test_broken_folder_files_are_corrupt_data(tmp_path: Path, file: str, text: str, message: str) -> None:
    src = _folder(tmp_path / "m", {"a.q_proj.weight": _w(64, 64)})
    (src / file).write_bytes(text.encode("latin-1"))
    with pytest.raises(CorruptDataError, match=message):
        quantize_model(src, tmp_path / "q", "mxfp8")
    with pytest.raises(CorruptDataError, match=message):
        aq.load(src)
    assert not (tmp_path / "q").exists()


def test_dequantize_a_file_refuses_a_folder_target(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    aq.save(path, {"a.weight": aq.quantize(_w(32, 64), "mxfp8")}, format="compressed-tensors")
    (tmp_path / "out").mkdir()
    with pytest.raises(ShapeError, match=r"out is a folder; name the float .safetensors file to write"):
        dequantize_model(path, tmp_path / "out")
    done = dequantize_model(path, tmp_path / "w-float.safetensors")
    assert done.modules == ["a"]
    assert aq.load(tmp_path / "w-float.safetensors", backend="numpy")["a.weight"].dtype == np.float32
