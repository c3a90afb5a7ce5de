"""The weights an engine fuses into one layer share one per-tensor level (issue 21, item 1).

vLLM and SGLang load q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``, each expert's gate
and up (``w1``/``w3``) into its ``w13`` and DeepSeek's ``q_a_proj``/``kv_a_proj_with_mqa`` into
``fused_qkv_a_proj``, and keep one per-tensor level per fused layer. This file builds tiny
Llama-, Qwen2-, Mixtral- and DeepSeek-V3-shaped folders (the real tensor names and configs, the
shards of each fused layer of very different magnitudes and in different files), quantizes them,
and applies the engines' loading rules in NumPy to what was written, read with the
``safetensors`` library and decoded here from the codes (not with arrayquant's reader):

- NVFP4 linear layers: ``weight_global_scale.max()`` over the shards, its reciprocal multiplying
  every shard (vLLM ``compressed_tensors_w4a4_nvfp4.py`` / ``..._w4a16_nvfp4.py``,
  ``process_weights_after_loading``); NVFP4 MoE: the gate's (``w1``) global for the expert's
  ``w13``, ``w13_weight_global_scale[:, 0]`` (``compressed_tensors_moe_w4a4_nvfp4.py``);
- per-tensor FP8: ``requantize_with_max_scale`` (vLLM ``utils/w8a8_utils.py``): each shard
  dequantized in float16 with its own scale and quantized again to E4M3 with the largest one; per
  expert for ``w13`` in the MoE layer (``compressed_tensors_moe_w8a8_fp8.py``).

What the engine then multiplies with must equal each shard's own decompression: exactly for NVFP4,
and for FP8 the requantization must give back the stored codes. With ``fused_shards=False``
(every weight its own level, the behaviour before) it does not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.io.compressed_tensors.requantize import quantize_model
from arrayquant.io.compressed_tensors.stream import quantize_entry
from arrayquant.io.safetensors.reader import SafetensorsFile

safetensors = pytest.importorskip("safetensors")
ml_dtypes = pytest.importorskip("ml_dtypes")
st_numpy = pytest.importorskip("safetensors.numpy")

NVFP4 = "nvfp4"
FP8 = "e4m3:tensor:f32:native"  # compressed-tensors float-quantized, strategy tensor
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
HIDDEN, INTER, EXPERT_INTER = 64, 128, 32

# -- tiny model folders -------------------------------------------------------------------------


def _weight(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return rng.normal(0.0, scale, shape).astype(np.float32)


def _attention(rng: np.random.Generator, p: str, sizes: tuple[float, float, float], bias: bool = False) -> dict:
    q, k, v = sizes  # deliberately different magnitudes: the engine fuses them
    out = {
        f"{p}.self_attn.q_proj.weight": _weight(rng, (HIDDEN, HIDDEN), q),
        f"{p}.self_attn.k_proj.weight": _weight(rng, (HIDDEN // 2, HIDDEN), k),
        f"{p}.self_attn.v_proj.weight": _weight(rng, (HIDDEN // 2, HIDDEN), v),
        f"{p}.self_attn.o_proj.weight": _weight(rng, (HIDDEN, HIDDEN), 0.5),
    }
    if bias:  # Qwen2's q/k/v have biases: 1-d, copied as stored
        for name in ("q_proj", "k_proj", "v_proj"):
            rows = out[f"{p}.self_attn.{name}.weight"].shape[0]
            out[f"{p}.self_attn.{name}.bias"] = _weight(rng, (rows,), 0.1)
    return out


def _mlp(rng: np.random.Generator, p: str, gate: float, up: float, inter: int = INTER) -> dict:
    return {
        f"{p}.gate_proj.weight": _weight(rng, (inter, HIDDEN), gate),
        f"{p}.up_proj.weight": _weight(rng, (inter, HIDDEN), up),
        f"{p}.down_proj.weight": _weight(rng, (HIDDEN, inter), 0.5),
    }


def _norms(p: str) -> dict:
    return {f"{p}.input_layernorm.weight": np.ones(HIDDEN, np.float32)}


def _frame(rng: np.random.Generator) -> dict:
    return {
        "model.embed_tokens.weight": _weight(rng, (256, HIDDEN), 0.02),
        "model.norm.weight": np.ones(HIDDEN, np.float32),
        "lm_head.weight": _weight(rng, (256, HIDDEN), 0.02),
    }


def llama_tensors(rng: np.random.Generator) -> dict:
    out = _frame(rng)
    for i, (sizes, gate, up) in enumerate([((1.0, 0.08, 0.3), 0.12, 1.5), ((0.05, 2.0, 0.7), 1.1, 0.04)]):
        p = f"model.layers.{i}"
        out |= _attention(rng, p, sizes) | _mlp(rng, f"{p}.mlp", gate, up) | _norms(p)
    return out


def qwen2_tensors(rng: np.random.Generator) -> dict:
    p = "model.layers.0"
    return _frame(rng) | _attention(rng, p, (0.6, 3.0, 0.09), bias=True) | _mlp(rng, f"{p}.mlp", 2.5, 0.2) | _norms(p)


def mixtral_tensors(rng: np.random.Generator) -> dict:
    p = "model.layers.0"
    out = _frame(rng) | _attention(rng, p, (0.3, 1.2, 0.06)) | _norms(p)
    out[f"{p}.block_sparse_moe.gate.weight"] = _weight(rng, (4, HIDDEN), 0.1)  # the router
    for e, (w1, w3) in enumerate([(1.0, 0.1), (0.05, 1.3), (0.7, 0.7), (2.0, 0.02)]):
        q = f"{p}.block_sparse_moe.experts.{e}"
        out[f"{q}.w1.weight"] = _weight(rng, (EXPERT_INTER, HIDDEN), w1)
        out[f"{q}.w2.weight"] = _weight(rng, (HIDDEN, EXPERT_INTER), 0.5)
        out[f"{q}.w3.weight"] = _weight(rng, (EXPERT_INTER, HIDDEN), w3)
    return out


def deepseek_tensors(rng: np.random.Generator) -> dict:
    """DeepSeek-V3 with MLA (q_lora_rank 32, kv_lora_rank 32, rope 16), layer 0 dense, layer 1 MoE."""
    out = _frame(rng)
    for i in range(2):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        mla = (1.4, 0.06) if i == 0 else (0.09, 1.0)
        out |= {
            f"{a}.q_a_proj.weight": _weight(rng, (32, HIDDEN), mla[0]),
            f"{a}.q_a_layernorm.weight": np.ones(32, np.float32),
            f"{a}.q_b_proj.weight": _weight(rng, (4 * 24, 32), 0.5),
            f"{a}.kv_a_proj_with_mqa.weight": _weight(rng, (32 + 16, HIDDEN), mla[1]),
            f"{a}.kv_a_layernorm.weight": np.ones(32, np.float32),
            f"{a}.kv_b_proj.weight": _weight(rng, (4 * 32, 32), 0.5),
            f"{a}.o_proj.weight": _weight(rng, (HIDDEN, 4 * 16), 0.5),
        } | _norms(p)
    out |= _mlp(rng, "model.layers.0.mlp", 0.03, 1.2)
    out["model.layers.1.mlp.gate.weight"] = _weight(rng, (4, HIDDEN), 0.1)
    out["model.layers.1.mlp.gate.e_score_correction_bias"] = np.zeros(4, np.float32)
    out |= _mlp(rng, "model.layers.1.mlp.shared_experts", 1.6, 0.1, EXPERT_INTER)
    for e, (gate, up) in enumerate([(1.0, 0.05), (0.2, 2.2), (0.04, 0.9), (1.1, 1.0)]):
        out |= _mlp(rng, f"model.layers.1.mlp.experts.{e}", gate, up, EXPERT_INTER)
    return out


# model: (config, tensors, the fused layers as vLLM loads them: (kind, members))
CONFIGS = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
    "mixtral": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 4},
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "n_routed_experts": 4,
        "first_k_dense_replace": 1,
    },
}
TENSORS: dict[str, Callable[[np.random.Generator], dict]] = {
    "llama": llama_tensors,
    "qwen2": qwen2_tensors,
    "mixtral": mixtral_tensors,
    "deepseek_v3": deepseek_tensors,
}


def engine_layers(model: str) -> list[tuple[str, list[str]]]:
    """The fused layers vLLM builds from the model's checkpoint names: ("linear" or "moe", members).

    Written from vLLM's loaders (llama.py, qwen2.py, mixtral.py, deepseek_v2.py and
    FusedMoE.make_expert_params_mapping), independently of arrayquant's table.
    """
    qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    layers: list[tuple[str, list[str]]] = []
    if model in ("llama", "qwen2"):
        for i in range(2 if model == "llama" else 1):
            p = f"model.layers.{i}"
            layers += [("linear", [f"{p}.{m}" for m in qkv]), ("linear", [f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"])]
    elif model == "mixtral":
        p = "model.layers.0"
        layers.append(("linear", [f"{p}.{m}" for m in qkv]))
        for e in range(4):
            q = f"{p}.block_sparse_moe.experts.{e}"
            layers.append(("moe", [f"{q}.w1", f"{q}.w3"]))
    else:
        for i in range(2):
            a = f"model.layers.{i}.self_attn"
            layers.append(("linear", [f"{a}.q_a_proj", f"{a}.kv_a_proj_with_mqa"]))
        for p in ("model.layers.0.mlp", "model.layers.1.mlp.shared_experts"):
            layers.append(("linear", [f"{p}.gate_proj", f"{p}.up_proj"]))
        for e in range(4):
            q = f"model.layers.1.mlp.experts.{e}"
            layers.append(("moe", [f"{q}.gate_proj", f"{q}.up_proj"]))
    return layers


def write_model(folder: Path, model: str, files: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """A model folder: config.json and ``files`` indexed shards, neighbours by name in different files."""
    folder.mkdir(parents=True)
    tensors = TENSORS[model](np.random.default_rng(seed))
    names = sorted(tensors)
    weight_map = {}
    for k in range(files):
        shard = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::files]}
        st_numpy.save_file(part, str(folder / shard), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, shard)
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps(CONFIGS[model]))
    return tensors


# -- the folder written, read and decoded here --------------------------------------------------


def read_entries(folder: Path) -> dict[str, np.ndarray]:
    """Every entry of the folder's safetensors files as NumPy arrays (FP8 as uint8 codes)."""
    dtypes = {
        "F32": np.float32,
        "F16": np.float16,
        "U8": np.uint8,
        "F8_E4M3": np.uint8,
        "I32": np.int32,
        "I64": np.int64,
    }
    out: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("*.safetensors")):
        for name, info in safetensors.deserialize(path.read_bytes()):
            out[name] = np.frombuffer(info["data"], dtypes[info["dtype"]]).reshape(info["shape"]).copy()
    return out


def fp4(packed: np.ndarray) -> np.ndarray:
    """E2M1 codes, two per byte (element 2k in the low nibble), as f32."""
    nibbles = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    values = E2M1[nibbles & 0x7]
    return np.where(nibbles & 0x8, -values, values).astype(np.float32)


def fp8(codes: np.ndarray) -> np.ndarray:
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def nvfp4_parts(e: dict[str, np.ndarray], module: str) -> tuple[np.ndarray, np.float32]:
    """The shard's codes times its block scales (exact in f32), and its global divisor."""
    codes = fp4(e[f"{module}.weight_packed"])
    blocks = np.repeat(fp8(e[f"{module}.weight_scale"]), 16, axis=1)
    divisor = e[f"{module}.weight_global_scale"].reshape(-1)
    assert divisor.shape == (1,)
    return codes * blocks, np.float32(divisor[0])


def own_nvfp4(e: dict[str, np.ndarray], module: str) -> np.ndarray:
    """The shard's own decompression: its block values times the reciprocal of its own divisor."""
    values, divisor = nvfp4_parts(e, module)
    return values * (np.float32(1) / divisor)


def engine_nvfp4(e: dict[str, np.ndarray], kind: str, members: list[str]) -> list[np.ndarray]:
    """The engine's fused weight, split back per shard: one global for the whole layer."""
    parts = [nvfp4_parts(e, m) for m in members]
    # linear: weight_global_scale.max(), then 1 / it; the MoE w13: the gate's (w1), w13_weight_global_scale[:, 0]
    divisor = np.max(np.array([d for _, d in parts], np.float32)) if kind == "linear" else parts[0][1]
    multiplier = np.float32(1) / divisor
    fused = np.concatenate([v for v, _ in parts]) * multiplier
    return np.split(fused, np.cumsum([v.shape[0] for v, _ in parts])[:-1])


def own_fp8(e: dict[str, np.ndarray], module: str) -> np.ndarray:
    scale = e[f"{module}.weight_scale"].reshape(-1)
    assert scale.shape == (1,)
    assert scale.dtype == np.float32
    return fp8(e[f"{module}.weight"]) * scale[0]


def requantize_with_max_scale(codes: list[np.ndarray], scales: list[np.float32]) -> tuple[list[np.ndarray], Any]:
    """vLLM's rule for the per-tensor FP8 shards of one fused layer, in NumPy.

    ``per_tensor_dequantize``: codes to float16 times the shard's scale (a float16 product, the
    scale taken to float16); ``scaled_fp8_quant`` with the largest scale: times its f32
    reciprocal, clamped to +-448, rounded to E4M3.
    """
    top = np.max(np.array(scales, np.float32))
    inverse = np.float32(1) / top
    out = []
    for c, s in zip(codes, scales, strict=True):
        dq = (fp8(c).astype(np.float16).astype(np.float32) * np.float32(np.float16(s))).astype(np.float16)
        q = np.clip(dq.astype(np.float32) * inverse, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        out.append(q.view(np.uint8))
    return out, top


def engine_fp8(e: dict[str, np.ndarray], members: list[str]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The engine's weights per shard after requantizing to the layer's largest scale, and their codes."""
    codes = [e[f"{m}.weight"] for m in members]
    scales = [np.float32(e[f"{m}.weight_scale"].reshape(-1)[0]) for m in members]
    requantized, top = requantize_with_max_scale(codes, scales)
    return [fp8(q) * top for q in requantized], requantized


def engine_errors(folder: Path, model: str, scheme: str) -> list[tuple[str, float]]:
    """Per fused-layer shard: the largest relative error of the engine's weight vs its own decompression."""
    e = read_entries(folder)
    errors = []
    for kind, members in engine_layers(model):
        if scheme == NVFP4:
            got, want = engine_nvfp4(e, kind, members), [own_nvfp4(e, m) for m in members]
        else:
            got, want = engine_fp8(e, members)[0], [own_fp8(e, m) for m in members]
        for m, g, w in zip(members, got, want, strict=True):
            nonzero = w != 0
            errors.append((m, float(np.max(np.abs(g - w)[nonzero] / np.abs(w[nonzero])))))
    return errors


MODELS = sorted(CONFIGS)


# -- the engines' rules on the folders written --------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_nvfp4_engine_weights_are_each_shards_own(tmp_path: Path, model: str) -> None:
    write_model(tmp_path / "in", model)
    summary = quantize_model(tmp_path / "in", tmp_path / "out", NVFP4)
    e = read_entries(tmp_path / "out")
    for kind, members in engine_layers(model):
        divisors = {float(e[f"{m}.weight_global_scale"][0]) for m in members}
        assert len(divisors) == 1, (members, divisors)  # one global for the fused layer
        for m, got in zip(members, engine_nvfp4(e, kind, members), strict=True):
            np.testing.assert_array_equal(got, own_nvfp4(e, m), err_msg=m)
    assert all(err == 0 for _, err in engine_errors(tmp_path / "out", model, NVFP4))
    # the summary names each fused layer with its members
    assert sorted(map(sorted, summary.fused_groups.values())) == sorted(sorted(m) for _, m in engine_layers(model))


@pytest.mark.parametrize("model", MODELS)
def test_fp8_requantization_to_the_largest_scale_is_the_identity(tmp_path: Path, model: str) -> None:
    write_model(tmp_path / "in", model)
    quantize_model(tmp_path / "in", tmp_path / "out", FP8)
    e = read_entries(tmp_path / "out")
    for _, members in engine_layers(model):
        weights, codes = engine_fp8(e, members)
        for m, w, c in zip(members, weights, codes, strict=True):
            np.testing.assert_array_equal(c, e[f"{m}.weight"], err_msg=m)  # the stored codes come back
            np.testing.assert_array_equal(w, own_fp8(e, m), err_msg=m)


@pytest.mark.parametrize("scheme", [NVFP4, FP8])
@pytest.mark.parametrize("model", MODELS)
def test_without_fused_shards_the_engine_gets_other_weights(tmp_path: Path, model: str, scheme: str) -> None:
    """The behaviour before: a level per shard; the engine's rule then changes the smaller shards."""
    write_model(tmp_path / "in", model)
    summary = quantize_model(tmp_path / "in", tmp_path / "out", scheme, fused_shards=False)
    assert summary.fused_groups == {}
    worst = max(err for _, err in engine_errors(tmp_path / "out", model, scheme))
    assert worst > 0.05


@pytest.mark.parametrize("model", MODELS)
def test_the_largest_shard_of_each_layer_keeps_its_own_level(tmp_path: Path, model: str) -> None:
    """A shared level is the largest member's own: that member is the same bits as quantized alone."""
    tensors = write_model(tmp_path / "in", model)
    quantize_model(tmp_path / "in", tmp_path / "shared", NVFP4)
    quantize_model(tmp_path / "in", tmp_path / "own", NVFP4, fused_shards=False)
    shared, own = read_entries(tmp_path / "shared"), read_entries(tmp_path / "own")
    for _, members in engine_layers(model):
        top = max(members, key=lambda m: float(np.max(np.abs(tensors[f"{m}.weight"]))))
        for part in ("weight_packed", "weight_scale", "weight_global_scale"):
            np.testing.assert_array_equal(shared[f"{top}.{part}"], own[f"{top}.{part}"])
    # everything outside the fused layers is untouched
    grouped = {f"{m}." for _, ms in engine_layers(model) for m in ms}
    for key, value in own.items():
        if not any(key.startswith(g) for g in grouped):
            np.testing.assert_array_equal(shared[key], value, err_msg=key)


@pytest.mark.parametrize(("scheme", "calibration"), [(NVFP4, "mse"), (NVFP4, "4over6"), (FP8, "mse")])
def test_search_calibrations_share_the_level_too(tmp_path: Path, scheme: str, calibration: str) -> None:
    write_model(tmp_path / "in", "llama", files=2)
    quantize_model(tmp_path / "in", tmp_path / "out", scheme, calibration=calibration)
    assert all(err == 0 for _, err in engine_errors(tmp_path / "out", "llama", scheme))


# -- groups: the table, the fallback, members left in float -------------------------------------


def _write_flat(folder: Path, config: dict, tensors: dict[str, np.ndarray]) -> None:
    folder.mkdir()
    st_numpy.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))


def test_an_unknown_architecture_is_grouped_by_name(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    p = "transformer.blocks.0"
    tensors = {
        f"{p}.attn.q_proj.weight": _weight(rng, (64, 64), 1.0),
        f"{p}.attn.k_proj.weight": _weight(rng, (64, 64), 0.05),
        f"{p}.attn.v_proj.weight": _weight(rng, (64, 64), 0.3),
        f"{p}.ffn.gate_proj.weight": _weight(rng, (64, 64), 0.02),
        f"{p}.ffn.up_proj.weight": _weight(rng, (64, 64), 0.9),
        f"{p}.moe.experts.0.w1.weight": _weight(rng, (32, 64), 0.04),
        f"{p}.moe.experts.0.w3.weight": _weight(rng, (32, 64), 1.4),
        f"{p}.moe.experts.0.w2.weight": _weight(rng, (64, 32), 0.5),
    }
    _write_flat(tmp_path / "in", {"model_type": "not-a-known-model", "architectures": ["MysteryForCausalLM"]}, tensors)
    summary = quantize_model(tmp_path / "in", tmp_path / "out", NVFP4)
    assert {g: sorted(m) for g, m in summary.fused_groups.items()} == {
        f"{p}.attn.qkv_proj": sorted(f"{p}.attn.{n}" for n in ("q_proj", "k_proj", "v_proj")),
        f"{p}.ffn.gate_up_proj": [f"{p}.ffn.gate_proj", f"{p}.ffn.up_proj"],
        f"{p}.moe.experts.0.w13": [f"{p}.moe.experts.0.w1", f"{p}.moe.experts.0.w3"],
    }
    e = read_entries(tmp_path / "out")
    for members in summary.fused_groups.values():
        assert len({float(e[f"{m}.weight_global_scale"][0]) for m in members}) == 1


def test_a_member_left_in_float_leaves_its_group(tmp_path: Path) -> None:
    """Excluded or of a shape the format cannot hold: the others share the level of their own ranges."""
    rng = np.random.default_rng(2)
    a = "model.layers.0.self_attn"
    tensors = {
        f"{a}.q_proj.weight": _weight(rng, (64, 64), 0.1),
        f"{a}.k_proj.weight": _weight(rng, (64, 40), 5.0),  # 40 columns: not a multiple of NVFP4's 16
        f"{a}.v_proj.weight": _weight(rng, (64, 64), 0.6),
        "model.layers.0.mlp.gate_proj.weight": _weight(rng, (64, 64), 0.2),
        "model.layers.0.mlp.up_proj.weight": _weight(rng, (64, 64), 4.0),
    }
    _write_flat(tmp_path / "in", {"model_type": "llama"}, tensors)
    summary = quantize_model(tmp_path / "in", tmp_path / "out", NVFP4, exclude=["*.up_proj.weight"])
    assert "shape" in summary.left_out[f"{a}.k_proj"]
    assert "exclude" in summary.left_out["model.layers.0.mlp.up_proj"]
    assert summary.fused_groups == {f"{a}.qkv_proj": [f"{a}.q_proj", f"{a}.v_proj"]}
    e = read_entries(tmp_path / "out")
    own = read_entries(_quantized(tmp_path, "own", NVFP4))
    # q and v share v's global (the larger of the two); k's 5.0 played no part; gate is alone
    assert e[f"{a}.q_proj.weight_global_scale"][0] == e[f"{a}.v_proj.weight_global_scale"][0]
    assert e[f"{a}.v_proj.weight_global_scale"][0] == own[f"{a}.v_proj.weight_global_scale"][0]
    gate = "model.layers.0.mlp.gate_proj.weight_global_scale"
    assert e[gate][0] == own[gate][0]


def _quantized(tmp_path: Path, name: str, scheme: str) -> Path:
    quantize_model(tmp_path / "in", tmp_path / name, scheme, exclude=["*.up_proj.weight"], fused_shards=False)
    return tmp_path / name


@pytest.mark.parametrize("scheme", ["mxfp8", "mxfp4", "e4m3:block32:f32:native", "q8s:block32:f32", "q8s"])
def test_schemes_without_a_shared_level_are_unchanged(tmp_path: Path, scheme: str) -> None:
    """Block scales alone have no per-tensor level; integer per-tensor scales stay per shard."""
    write_model(tmp_path / "in", "llama", files=1)
    summary = quantize_model(tmp_path / "in", tmp_path / "a", scheme)
    quantize_model(tmp_path / "in", tmp_path / "b", scheme, fused_shards=False)
    assert summary.fused_groups == {}
    a, b = read_entries(tmp_path / "a"), read_entries(tmp_path / "b")
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_the_table_and_its_scopes() -> None:
    from arrayquant.io.compressed_tensors.fused_shards import FALLBACK, fused_groups, fusions_for

    whisper = fusions_for({"model_type": "whisper"})
    d = "model.decoder.layers.0"
    names = [f"{d}.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")]
    names += [f"{d}.encoder_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")]
    assert fused_groups(names, whisper) == {
        f"{d}.self_attn.qkv_proj": names[:3],
        f"{d}.encoder_attn.kv_proj": names[4:],  # vLLM's cross-attention keeps q apart
    }
    # Mixtral's experts fuse w1/w3 only; gate_proj/up_proj are no Mixtral names
    assert fused_groups(["e.0.gate_proj", "e.0.up_proj"], fusions_for({"model_type": "mixtral"})) == {}
    assert fusions_for({"model_type": 7}) == FALLBACK == fusions_for({})
    assert fused_groups(["q_proj", "k_proj"], FALLBACK) == {"qkv_proj": ["q_proj", "k_proj"]}


# -- the streaming layer: a given level, slab by slab -------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "calibration"),
    [(NVFP4, "minmax"), (NVFP4, "mse"), (NVFP4, "4over6"), (NVFP4, "percentile:99"), (FP8, "minmax"), (FP8, "mse")],
)
def test_quantize_entry_under_its_own_level_is_unchanged(tmp_path: Path, scheme: str, calibration: str) -> None:
    rng = np.random.default_rng(3)
    x = _weight(rng, (96, 64), 0.7)
    x[5, 7] = 9.0  # one large value: the global is the whole tensor's, not a slab's
    st_numpy.save_file({"w.weight": x}, str(tmp_path / "w.safetensors"))
    from arrayquant.io.compressed_tensors.stream import tensor_level

    s = aq.QuantScheme.parse(scheme)
    with SafetensorsFile(tmp_path / "w.safetensors") as st:
        for slab_bytes in (1 << 20, 16 * 64 * 4):  # one slab, and slabs of 16 rows
            plain = quantize_entry(st, "w.weight", s, "w", slab_bytes=slab_bytes, calibration=calibration)
            level = tensor_level(st, "w.weight", s, slab_bytes=slab_bytes, calibration=calibration)
            given = quantize_entry(st, "w.weight", s, "w", slab_bytes=slab_bytes, calibration=calibration, level=level)
            assert plain.keys() == given.keys()
            for key in plain:
                np.testing.assert_array_equal(np.asarray(given[key]), np.asarray(plain[key]), err_msg=key)


def test_transformers_loads_the_shared_levels(tmp_path: Path) -> None:
    """compressed-tensors decompresses each shard with the global written for it: the shared one."""
    import warnings

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # k ten times smaller than q, up ten times larger than gate
        model.model.layers[0].self_attn.k_proj.weight.mul_(0.1)
        model.model.layers[0].mlp.up_proj.weight.mul_(10)
    model.save_pretrained(tmp_path / "in")
    summary = quantize_model(tmp_path / "in", tmp_path / "out", NVFP4)
    assert len(summary.fused_groups) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dense = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path / "out", quantization_config=transformers.CompressedTensorsConfig(dequantize=True)
        )
    back = aq.load(tmp_path / "out", backend="numpy")
    for members in summary.fused_groups.values():
        assert len({float(back[f"{m}.weight"].global_scale[0]) for m in members}) == 1
        for m in members:
            ours = torch.from_numpy(np.asarray(aq.dequantize(back[f"{m}.weight"]))).to(torch.bfloat16).float()
            theirs = dense.get_submodule(m).weight.detach().float()
            # compressed-tensors divides by the global where arrayquant multiplies: one bf16 step at most
            assert bool(torch.all(torch.abs(ours - theirs) <= torch.abs(ours) * 2.0**-7)), m
