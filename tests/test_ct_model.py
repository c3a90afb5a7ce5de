"""Model folders quantized into compressed-tensors, loaded by the real transformers."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.io.compressed_tensors.requantize import quantize_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ct = pytest.importorskip("compressed_tensors.quantization")


def _tiny_llama(folder: Path, dtype: object, shards: bool) -> object:
    """A 2-layer Llama with random weights, saved as save_pretrained does (no download)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg).to(dtype).eval()
    model.save_pretrained(folder, max_shard_size="100KB" if shards else "1GB")
    return model


def _load_dense(folder: Path) -> object:
    config = transformers.CompressedTensorsConfig(dequantize=True)  # decompress to dense weights
    with warnings.catch_warnings():
        # transformers says the folder's own quantization_config wins, which is what is wanted here
        warnings.simplefilter("ignore", UserWarning)
        return transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=config).eval()


LINEARS = 14  # 7 projections in each of 2 layers


# scheme, its compressed-tensors format, and whether transformers' dense weights equal
# arrayquant's dequantized ones bit for bit (NVFP4: compressed-tensors divides by the global scale)
FOLDER_CASES = [
    ("nvfp4", "nvfp4-pack-quantized", False, True),
    ("mxfp8", "mxfp8-quantized", True, False),
    ("mxfp4", "mxfp4-pack-quantized", True, False),
    ("e4m3:block32x32:bf16:native", "float-quantized", True, False),
    ("q4s:block32:bf16", "pack-quantized", True, True),
    ("q8s:block32:f32", "pack-quantized", True, False),
    # one scale per row on weights of every width: a block as long as the longest row, clamped to each
    ("e4m3:block1x4096:bf16:native", "float-quantized", True, False),
    # groups of 64: rows of 64 are one group (strategy channel), rows of 128 two: a config group each
    ("q4s:block64:bf16", "pack-quantized", True, True),
]
# the config groups each case's weights fall into: (strategy, group_size) -> how many modules
STRATEGIES = {
    "e4m3:block1x4096:bf16:native": {("channel", None): 14},
    "q4s:block64:bf16": {("channel", None): 12, ("group", 64): 2},
}


@pytest.mark.parametrize(("scheme", "fmt", "exact", "shards"), FOLDER_CASES)
def test_folder_loads_in_transformers(tmp_path: Path, scheme: str, fmt: str, exact: bool, shards: bool) -> None:
    src, dst = tmp_path / "llama", tmp_path / "llama-q"
    _tiny_llama(src, torch.bfloat16, shards)
    (src / "tokenizer.json").write_text('{"note": "copied as is"}')
    # each weight alone, as the reference below quantizes it (tests/test_fused_shards.py: shared levels)
    summary = quantize_model(src, dst, scheme, fused_shards=False)
    # loaded as transformers loads any folder (bf16 weights, f32 rotary buffers), as the other is
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    assert len(summary.quantized) == LINEARS
    assert set(summary.left_out) == {"lm_head", "model.embed_tokens"}

    # every non-weight file copied unchanged, shards as in the input with a valid index
    assert (dst / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert (dst / "generation_config.json").read_bytes() == (src / "generation_config.json").read_bytes()
    in_shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert sorted(p.name for p in dst.glob("*.safetensors")) == in_shards
    assert (len(in_shards) > 1) == shards
    if shards:
        index = json.loads((dst / "model.safetensors.index.json").read_text())
        from safetensors import safe_open

        found = {}
        for shard in in_shards:
            with safe_open(str(dst / shard), "np") as f:
                found.update(dict.fromkeys(f.keys(), shard))
        assert index["weight_map"] == found
        assert index["metadata"]["total_size"] > 0

    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    parsed = ct.QuantizationConfig.model_validate(config)
    assert parsed.format == fmt
    assert parsed.ignore == ["lm_head", "model.embed_tokens"]  # exactly the 2-d weights left in float
    if scheme in STRATEGIES:  # compressed-tensors' own matching puts each module in its group
        found: dict[tuple[str, int | None], int] = {}
        probe = transformers.AutoModelForCausalLM.from_pretrained(src)
        ct.apply_quantization_config(probe, parsed, show_progress=False)
        for _, module in probe.named_modules():
            qs = getattr(module, "quantization_scheme", None)
            if qs is not None:
                key = (str(getattr(qs.weights.strategy, "value", qs.weights.strategy)), qs.weights.group_size)
                found[key] = found.get(key, 0) + 1
        assert found == STRATEGIES[scheme]

    loaded = _load_dense(dst)
    assert loaded.dtype == torch.bfloat16
    # the reference: the same model with arrayquant's dequantized weights put in by hand
    state = model.state_dict()
    differing = total = 0
    for name in summary.quantized:
        w = state[name + ".weight"].float().numpy()
        ours = torch.from_numpy(np.asarray(aq.dequantize(aq.quantize(w, scheme)))).to(torch.bfloat16)
        theirs = loaded.get_submodule(name).weight.detach()
        changed = ours != theirs
        differing += int(changed.sum())
        total += ours.numel()
        # compressed-tensors divides by the global scale where arrayquant multiplies by its
        # reciprocal, and rounds to bf16 from there: at most one bf16 step apart, rarely
        step = torch.abs(ours.float()) * 2.0**-7
        assert bool(torch.all(torch.abs(ours.float() - theirs.float())[changed] <= step[changed]))
        state[name + ".weight"] = ours
    model.load_state_dict(state)
    ids = torch.tensor([[1, 5, 9, 77, 3, 64]])
    with torch.no_grad():
        theirs_out, ours_out = loaded(ids).logits, model(ids).logits
    if exact:
        assert differing == 0
        assert torch.equal(theirs_out, ours_out)
    else:
        assert differing / total < 0.01, (differing, total)
        np.testing.assert_allclose(theirs_out.float(), ours_out.float(), atol=0.05)


def test_destination_in_use_and_unmapped_scheme(tmp_path: Path) -> None:
    src = tmp_path / "llama"
    _tiny_llama(src, torch.float32, False)
    with pytest.raises(aq.ShapeError, match=r"exists and is not an empty folder"):
        quantize_model(src, src, "nvfp4")
    with pytest.raises(aq.SchemeError, match=r"has no compressed-tensors format; the schemes that map are: nvfp4"):
        quantize_model(src, tmp_path / "out", "q8s:block16:ue4m3:tensor:f32")
    with pytest.raises(aq.ShapeError, match=r"is neither a model folder .* nor a .safetensors file"):
        quantize_model(tmp_path / "missing", tmp_path / "out2", "nvfp4")
    (tmp_path / "empty").mkdir()
    with pytest.raises(aq.ShapeError, match=r"holds neither model.safetensors nor"):
        quantize_model(tmp_path / "empty", tmp_path / "out2", "nvfp4")
    quantize_model(src, tmp_path / "q", "mxfp8")
    already = r"is already quantized \(it has a quantization_config, quant_method 'compressed-tensors'\)"
    with pytest.raises(aq.ShapeError, match=already + "; quantize the float model, or turn this one back"):
        quantize_model(tmp_path / "q", tmp_path / "qq", "nvfp4")
    assert not (tmp_path / "qq").exists()


def test_cli_writes_a_folder_from_a_folder_or_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arrayquant.cli import main

    src = tmp_path / "llama"
    _tiny_llama(src, torch.float32, False)
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "mxfp8", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "quantized 14 Linear weights with mxfp8 as mxfp8-quantized" in out
    assert "left in float: lm_head" in out
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "mxfp8-quantized"
    assert config["model_type"] == "llama"  # the model's own config carried over

    file_in = src / "model.safetensors"
    argv = ["quantize", str(file_in), str(tmp_path / "f"), "--scheme", "q4s:block32:f32", "--format"]
    assert main([*argv, "compressed-tensors", "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "f" / "config.json").read_text())
    assert list(config) == ["quantization_config"]
    assert ct.QuantizationConfig.model_validate(config["quantization_config"]).format == "pack-quantized"


def test_cli_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arrayquant.cli import main

    src = tmp_path / "llama"
    _tiny_llama(src, torch.float32, False)
    assert main(["quantize", str(src), str(tmp_path / "a"), "--scheme", "q8s:block16:ue4m3:tensor:f32"]) == 1
    err = capsys.readouterr().err
    assert "has no compressed-tensors format, the layout a model folder is written in (it holds nvfp4" in err
    advice = f"arrayquant quantize {src / 'model.safetensors'} {tmp_path / 'a'}.safetensors"
    assert f"quantize the weights into arrayquant's own layout: {advice}" in err
    assert not (tmp_path / "a").exists()
    assert main(["quantize", str(src), str(tmp_path / "b"), "--scheme", "q8s", "--format", "arrayquant"]) == 1
    err = capsys.readouterr().err
    assert "is a model folder, which quantize writes as a compressed-tensors folder (drop --format arrayquant)" in err
    assert f"arrayquant quantize {src / 'model.safetensors'} {tmp_path / 'b'}.safetensors --scheme q8s" in err
    argv = ["quantize", str(src), str(tmp_path / "c"), "--scheme", "mxfp8", "--min-size", "5"]
    assert main(argv) == 1
    assert (
        "--min-size, --backend, --device and --nonfinite apply to --format arrayquant only" in capsys.readouterr().err
    )


@pytest.mark.parametrize(("scheme", "fmt", "exact", "shards"), FOLDER_CASES)
def test_load_reads_the_folder_back(tmp_path: Path, scheme: str, fmt: str, exact: bool, shards: bool) -> None:
    src, dst = tmp_path / "llama", tmp_path / "llama-q"
    _tiny_llama(src, torch.float32, shards)
    summary = quantize_model(src, dst, scheme, fused_shards=False)  # each weight alone, as the reference
    original = aq.load(src, backend="numpy") if not shards else None
    from safetensors.numpy import load_file

    floats: dict[str, np.ndarray] = {}
    for shard in src.glob("*.safetensors"):
        floats.update(load_file(str(shard)))
    if original is not None:  # a plain folder loads as its arrays
        assert sorted(original) == sorted(floats)
    back = aq.load(dst, backend="numpy")
    assert sorted(back) == sorted(floats)  # quantized weights under their own names again
    for name, x in floats.items():
        module = name.removesuffix(".weight")
        if module in summary.quantized:
            qt = back[name]
            assert isinstance(qt, aq.QuantizedTensor)
            want = aq.dequantize(aq.quantize(x, scheme), "float32")
            got = aq.dequantize(qt, "float32")
            if scheme == "nvfp4":  # the global scale crosses as its f32 reciprocal (see io/compressed_tensors.py)
                np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)
            else:
                np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_array_equal(back[name], x)
    # one shard file alone, with the config beside it, reads the same
    one = sorted(dst.glob("*.safetensors"))[0]
    part = aq.load(one, backend="numpy")
    assert set(part) <= set(back)


def test_load_refuses_a_folder_it_cannot_read(tmp_path: Path) -> None:
    src, dst = tmp_path / "llama", tmp_path / "llama-q"
    _tiny_llama(src, torch.float32, False)
    quantize_model(src, dst, "mxfp8")
    (dst / "config.json").write_text("{}")
    with pytest.raises(aq.CorruptDataError, match=r"holds quantized weights .* but no config.json with a quantization"):
        aq.load(dst)
    (dst / "config.json").write_text("{not json")
    with pytest.raises(aq.CorruptDataError, match=r"config.json is not JSON"):
        aq.load(dst)
    (tmp_path / "bare").mkdir()
    with pytest.raises(aq.ShapeError, match=r"holds neither model.safetensors nor"):
        aq.load(tmp_path / "bare")


@pytest.mark.parametrize(("scheme", "fmt", "exact", "shards"), FOLDER_CASES)
def test_dequantized_folder_loads_as_a_plain_model(
    tmp_path: Path, scheme: str, fmt: str, exact: bool, shards: bool
) -> None:
    from arrayquant.io.compressed_tensors.model import dequantize_model

    src, q, back = tmp_path / "llama", tmp_path / "llama-q", tmp_path / "llama-back"
    _tiny_llama(src, torch.bfloat16, shards)
    summary = quantize_model(src, q, scheme, fused_shards=False)  # each weight alone, as the reference
    done = dequantize_model(q, back)
    assert sorted(done.modules) == sorted(summary.quantized)
    assert done.dropped == []
    assert "quantization_config" not in json.loads((back / "config.json").read_text())
    assert sorted(p.name for p in back.iterdir()) == sorted(p.name for p in src.iterdir())
    plain = transformers.AutoModelForCausalLM.from_pretrained(back).eval()  # no quantizer involved
    assert plain.dtype == torch.bfloat16  # the model's own dtype, from its config
    original = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    state = original.state_dict()
    for module in summary.quantized:
        w = state[module + ".weight"].float().numpy()
        want = torch.from_numpy(np.asarray(aq.dequantize(aq.quantize(w, scheme)))).to(torch.bfloat16)
        got = plain.get_submodule(module).weight.detach()
        if scheme == "nvfp4":  # the global scale crossed as its f32 reciprocal: f32 results 1 ulp apart at most
            assert bool(torch.all(torch.abs(got.float() - want.float()) <= torch.abs(want.float()) * 2.0**-7))
        else:
            assert torch.equal(got, want)
    for name, value in original.state_dict().items():
        if name.removesuffix(".weight") not in summary.quantized:
            assert torch.equal(plain.state_dict()[name], value), name


def test_cli_dequantizes_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arrayquant.cli import main

    src = tmp_path / "llama"
    _tiny_llama(src, torch.float32, False)
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "mxfp4", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["dequantize", str(tmp_path / "q"), str(tmp_path / "d"), "--dtype", "float16"]) == 0
    assert "dequantized 14 weights" in capsys.readouterr().out
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "d")
    # --dtype sets the stored weights' dtype, and the config names it: the float model loads in it
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.float16
    from safetensors import safe_open

    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.0.mlp.up_proj.weight").dtype == torch.float16


def test_cli_inspects_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arrayquant.cli import main

    src = tmp_path / "llama"
    _tiny_llama(src, torch.float32, True)
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "nvfp4", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "q")]) == 0
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if row.startswith("model.layers.0.mlp.down_proj.weight "))
    assert line.split()[1:4] == ["64x128", "nvfp4", f"{aq.quantized_nbytes('nvfp4', (64, 128)):,}"]
    assert "model.embed_tokens.weight" in out  # float tensors listed with their dtype
    assert "21 tensors, 14 quantized" in out  # 14 projections, embedding, head, 2x2 layer norms, final norm
    assert main(["inspect", str(src)]) == 0  # a plain folder lists as its arrays
    assert "21 tensors, 0 quantized" in capsys.readouterr().out


@pytest.mark.parametrize(("limit", "count"), [("60KB", 0), (30_000, 0), ("1GiB", 1)])
def test_max_shard_size_cuts_the_output(tmp_path: Path, limit: object, count: int) -> None:
    """Shards of at most the size (a larger entry alone), named and indexed as save_pretrained does."""
    from safetensors import safe_open

    from arrayquant.io.compressed_tensors.requantize import parse_size

    src, dst, whole = tmp_path / "llama", tmp_path / "cut", tmp_path / "whole"
    _tiny_llama(src, torch.bfloat16, True)  # 100KB input shards, cut again differently
    summary = quantize_model(src, dst, "mxfp8", max_shard_size=limit)
    quantize_model(src, whole, "mxfp8")
    files = sorted(p.name for p in dst.glob("*.safetensors"))
    assert summary.shards == files
    if count == 1:
        assert files == ["model.safetensors"]
        assert not (dst / "model.safetensors.index.json").exists()
    else:
        n = len(files)
        assert n > 1
        assert files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
        index = json.loads((dst / "model.safetensors.index.json").read_text())
        found, total = {}, 0
        for shard in files:
            with safe_open(str(dst / shard), "pt") as f:  # torch holds every dtype (F8 too)
                sizes = {k: f.get_tensor(k).nbytes for k in f.keys()}  # noqa: SIM118
            found.update(dict.fromkeys(sizes, shard))
            total += sum(sizes.values())
            # within the limit, unless one entry alone is larger
            assert sum(sizes.values()) <= parse_size(limit) or len(sizes) == 1  # type: ignore[arg-type]
        assert index["weight_map"] == found
        assert index["metadata"]["total_size"] == total
    assert not list(dst.glob(".part-*"))
    # the same model as the folder with the input's shards
    ids = torch.tensor([[1, 5, 9, 77, 3, 64]])
    with torch.no_grad():
        assert torch.equal(_load_dense(dst)(ids).logits, _load_dense(whole)(ids).logits)


@pytest.mark.parametrize(
    ("size", "message"),
    [("5XB", "is not a size; write bytes or e.g. '5GB'"), ("0", "must be positive"), ("-3", "is not a size")],
)
def test_max_shard_size_refusals(tmp_path: Path, size: str, message: str) -> None:
    from arrayquant.errors import ShapeError

    src = tmp_path / "llama"
    _tiny_llama(src, torch.float32, False)
    with pytest.raises(ShapeError, match=message):
        quantize_model(src, tmp_path / "out", "mxfp8", max_shard_size=size)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_cli_max_shard_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arrayquant.cli import main

    src = tmp_path / "llama"
    _tiny_llama(src, torch.float32, False)
    assert (
        main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "mxfp8", "--quiet", "--max-shard-size", "80KB"])
        == 0
    )
    assert "weight file(s)" in capsys.readouterr().out
    assert len(list((tmp_path / "q").glob("model-*-of-*.safetensors"))) > 1
    single = tmp_path / "llama" / "model.safetensors"
    code = main(
        ["quantize", str(single), str(tmp_path / "w.safetensors"), "--scheme", "q8s", "--max-shard-size", "1GB"]
    )
    assert code == 1
    assert "--max-shard-size applies to --format compressed-tensors only" in capsys.readouterr().err
    code = main(["quantize", str(src), str(tmp_path / "q2"), "--scheme", "mxfp8", "--max-shard-size", "big"])
    assert code == 1
    assert "max shard size 'big' is not a size" in capsys.readouterr().err
