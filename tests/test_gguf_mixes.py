"""llama-quantize's file types (Q4_K_M, Q6_K, ...) against llama-quantize itself, and the files in llama.cpp.

The oracle is libllama built from the pinned llama-cpp-python sdist (``tests/llama_oracle.py``):
``llama_model_quantize``, what the ``llama-quantize`` tool runs, on tiny Llama models made here in
code (widths that are multiples of 256, so every type applies, and a feed-forward width of 384, so
``ffn_down`` takes llama-quantize's fallback). Every tensor's type and bytes are compared, and both
files run in llama.cpp: the same logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.errors import SchemeError
from arrayquant.io.gguf import mixes

from .test_importance import _imatrix

gguf = pytest.importorskip("gguf")
pytest.importorskip("numba", reason="llama.cpp's K-quant quantizers run as numba kernels (pip install numba)")

N_VOCAB, N_EMBD, N_FF = 512, 256, 384


def _model(
    path: Path, *, n_layer: int = 8, n_head_kv: int = 1, tied: bool = False, seed: int = 0
) -> dict[str, np.ndarray]:
    """A tiny Llama GGUF (f32) that llama.cpp loads: ``n_layer`` blocks, 4 heads of 64, no tokenizer."""
    rng = np.random.default_rng(seed)
    kv = N_EMBD // 4 * n_head_kv
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(4)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // 4)
    w.add_tokenizer_model("no_vocab")
    w.add_vocab_size(N_VOCAB)
    tensors: dict[str, np.ndarray] = {"token_embd.weight": rng.standard_normal((N_VOCAB, N_EMBD)) * 0.5}
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = 1 + 0.1 * rng.standard_normal(N_EMBD)
        tensors[p + "attn_q.weight"] = rng.standard_t(4, (N_EMBD, N_EMBD)) * 0.05
        tensors[p + "attn_k.weight"] = rng.standard_normal((kv, N_EMBD)) * 0.05
        tensors[p + "attn_v.weight"] = rng.standard_normal((kv, N_EMBD)) * 0.05
        tensors[p + "attn_output.weight"] = rng.standard_normal((N_EMBD, N_EMBD)) * 0.05
        tensors[p + "ffn_norm.weight"] = 1 + 0.1 * rng.standard_normal(N_EMBD)
        tensors[p + "ffn_gate.weight"] = rng.standard_normal((N_FF, N_EMBD)) * 0.05
        tensors[p + "ffn_up.weight"] = rng.standard_normal((N_FF, N_EMBD)) * 0.05
        tensors[p + "ffn_down.weight"] = rng.standard_t(3, (N_EMBD, N_FF)) * 0.05
    tensors["output_norm.weight"] = np.ones(N_EMBD)
    if not tied:
        tensors["output.weight"] = rng.standard_normal((N_VOCAB, N_EMBD)) * 0.05
    out = {}
    for name, x in tensors.items():
        out[name] = x.astype(np.float32)
        w.add_tensor(name, out[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _imatrix_for(values: dict[str, np.ndarray], folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """An imatrix GGUF for the model's 2-d weights (count 1: each vector is its in_sum2) and the vectors."""
    rng = np.random.default_rng(9)
    vectors = {k: rng.uniform(0.05, 3.0, v.shape[-1]).astype(np.float32) for k, v in values.items() if v.ndim == 2}
    entries = {k: (v[None, :], np.ones((1, 1), np.float32)) for k, v in vectors.items()}
    return _imatrix(folder / "imatrix.gguf", entries), vectors


def _tensors(path: Path) -> dict[str, Any]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def _compare(ours: Path, theirs: Path) -> dict[str, str]:
    """Every tensor of the two files: the same type and bytes; the types."""
    a, b = _tensors(ours), _tensors(theirs)
    assert sorted(a) == sorted(b)
    types = {}
    for name, t in b.items():
        assert a[name].tensor_type.name == t.tensor_type.name, (name, a[name].tensor_type.name, t.tensor_type.name)
        assert np.asarray(a[name].data).tobytes() == np.asarray(t.data).tobytes(), name
        types[name] = t.tensor_type.name
    return types


MIXED = ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q3_K_M", "Q3_K_S", "Q3_K_L", "Q2_K", "IQ4_XS", "IQ4_NL"]


@pytest.mark.parametrize("name", MIXED)
def test_types_and_bytes_are_llama_quantizes(llama: Any, tmp_path: Path, name: str) -> None:
    src = tmp_path / "f32.gguf"
    _model(src, n_head_kv=1 if name < "Q4" else 2)  # 4 or 2 heads per KV head: the gqa >= 4 rules both ways
    theirs = tmp_path / "theirs.gguf"
    llama.quantize(src, theirs, mixes.MIXES[name].ftype)
    summary = aq.quantize_file(src, tmp_path / "ours.gguf", name)
    types = _compare(tmp_path / "ours.gguf", theirs)
    assert summary.types == {k: v for k, v in types.items() if k in summary.types}
    assert set(summary.quantized) == {k for k, v in types.items() if v not in ("F32", "F16")}
    fields = gguf.GGUFReader(str(theirs)).fields
    ours_fields = gguf.GGUFReader(str(tmp_path / "ours.gguf")).fields
    assert ours_fields["general.file_type"].contents() == fields["general.file_type"].contents()
    assert len(set(types.values()) - {"F32"}) >= 2  # a mix: more than one type


@pytest.mark.parametrize("name", ["Q4_K_M", "Q3_K_M", "Q2_K_S", "IQ4_XS", "Q4_0", "Q5_0"])
def test_with_an_imatrix(llama: Any, tmp_path: Path, name: str) -> None:
    src = tmp_path / "f32.gguf"
    values = _model(src, n_head_kv=2, seed=1)
    path, vectors = _imatrix_for(values, tmp_path)
    theirs = tmp_path / "theirs.gguf"
    llama.quantize(src, theirs, mixes.MIXES[name].ftype, imatrix=vectors)
    assert (
        main(
            ["quantize", str(src), str(tmp_path / "ours.gguf"), "--scheme", name, "--importance", str(path), "--quiet"]
        )
        == 0
    )
    types = _compare(tmp_path / "ours.gguf", theirs)
    if name in ("Q4_0", "Q5_0"):  # with an imatrix the first eighth of ffn_down is Q4_1 / Q5_1
        assert types["blk.0.ffn_down.weight"] == ("Q4_1" if name == "Q4_0" else "Q5_1")


def test_tied_embeddings_and_options(llama: Any, tmp_path: Path) -> None:
    src = tmp_path / "f32.gguf"
    _model(src, tied=True, seed=2)
    cases = [
        {},
        {"pure": True},
        {"output_tensor_type": "q8_0", "token_embedding_type": "q5_k"},
        {"output_tensor_type": "f16"},
        {"tensor_types": [("attn_v", "q8_0"), (r"blk\.[0-3]\.ffn", "q6_k"), ("ffn_down", "f16")]},
    ]
    for i, options in enumerate(cases):
        theirs, ours = tmp_path / f"theirs{i}.gguf", tmp_path / f"ours{i}.gguf"
        llama.quantize(src, theirs, mixes.MIXES["Q4_K_M"].ftype, **options)
        aq.quantize_file(src, ours, "q4_k", **options)  # llama-quantize's alias of Q4_K_M
        types = _compare(ours, theirs)
        if not options:
            assert types["token_embd.weight"] == "Q6_K"  # no output.weight: the embedding is the output
        if options.get("pure"):  # every weight Q4_K, ffn_down (rows of 384) its fallback
            assert {v for k, v in types.items() if k.startswith("blk.") and not k.endswith("norm.weight")} == {
                "Q4_K",
                "Q5_0",
            }
            assert types["token_embd.weight"] == "Q4_K"


def test_the_files_run_in_llama_cpp(llama: Any, tmp_path: Path) -> None:
    """llama.cpp runs our Q4_K_M file and gives the logits of its own: the same bytes, the same graph."""
    src = tmp_path / "f32.gguf"
    _model(src, n_layer=4, seed=3)
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    llama.quantize(src, theirs, mixes.MIXES["Q4_K_M"].ftype)
    aq.quantize_file(src, ours, "Q4_K_M")
    tokens = [1, 17, 300, 42, 5, 511, 64, 99]
    want = llama.logits(src, tokens, N_VOCAB)
    a, b = llama.logits(ours, tokens, N_VOCAB), llama.logits(theirs, tokens, N_VOCAB)
    np.testing.assert_array_equal(a, b)  # so within llama.cpp's own file's cosine of the float model's: the same
    cos = float((a * want).sum() / np.sqrt((a * a).sum() * (want * want).sum()))
    assert cos > 0.9, cos  # random weights of 4 layers: 4-bit noise shows (0.96 here), but no garbage


# ---------------------------------------------------------------------------------------------
# the rules themselves, without the oracle (from llama-quant.cpp's text)
# ---------------------------------------------------------------------------------------------


def _names(n_layer: int, *, output: bool = True) -> list[tuple[str, tuple[int, ...], str]]:
    out = [("token_embd.weight", (32000, 4096), "F16")]
    for i in range(n_layer):
        for part, shape in (("attn_q", (4096, 4096)), ("attn_v", (1024, 4096)), ("ffn_down", (4096, 2880))):
            out.append((f"blk.{i}.{part}.weight", shape, "F16"))
        out.append((f"blk.{i}.attn_norm.weight", (4096,), "F32"))
    if output:
        out.append(("output.weight", (32000, 4096), "F16"))
    return out


def test_q4_k_m_bumps_the_layers_use_more_bits_picks() -> None:
    shape = mixes.ModelShape("llama", 32, 32, 8, 0)
    types = mixes.tensor_types(mixes.MIXES["Q4_K_M"], _names(32), shape)
    # use_more_bits: the first and last eighth (0-3, 28-31) and every third between (i - 4) % 3 == 2
    more = [i for i in range(32) if i < 4 or i >= 28 or (i - 4) % 3 == 2]
    assert [i for i in range(32) if types[f"blk.{i}.attn_v.weight"].type == "Q6_K"] == more
    assert [i for i in range(32) if types[f"blk.{i}.ffn_down.weight"].wanted == "Q6_K"] == more
    assert {types[f"blk.{i}.attn_q.weight"].type for i in range(32)} == {"Q4_K"}
    assert types["output.weight"].type == "Q6_K"
    assert types["token_embd.weight"].type == "Q4_K"  # not tied: the mix's default
    # 2880 is no multiple of 256: ffn_down falls back (Q4_K -> Q5_0, Q6_K -> Q8_0)
    assert types["blk.5.ffn_down.weight"] == mixes.Choice("Q5_0", "Q4_K")
    assert types["blk.0.ffn_down.weight"] == mixes.Choice("Q8_0", "Q6_K")
    assert types["blk.0.attn_norm.weight"].type == "F32"


def test_counters_follow_llama_cpp_s_order_not_the_file_s() -> None:
    shape = mixes.ModelShape("llama", 12, 32, 8, 0)
    names = _names(12)
    forward = mixes.tensor_types(mixes.MIXES["Q3_K_M"], names, shape)
    backward = mixes.tensor_types(mixes.MIXES["Q3_K_M"], names[::-1], shape)
    assert forward == backward
    # Q3_K_M: the first two attn_v in llama.cpp's order (blk.0, blk.1: by layer number, not by text) Q5_K
    assert [forward[f"blk.{i}.attn_v.weight"].type for i in (0, 1, 2, 10)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert mixes.llama_order(["blk.10.a", "blk.2.b", "x"]) == ["x", "blk.2.b", "blk.10.a"]


def test_model_shape_reads_the_key_values() -> None:
    fields = {
        "general.architecture": "llama",
        "llama.block_count": 80,
        "llama.attention.head_count": 64,
        "llama.attention.head_count_kv": [8] * 80,
    }
    shape = mixes.model_shape(fields)
    assert (shape.n_layer, shape.n_gqa, shape.n_expert, shape.is_70b) == (80, 8, 0, True)
    assert not mixes.model_shape({**fields, "llama.block_count": 32}).is_70b


def test_file_types_arrayquant_does_not_write_are_refused() -> None:
    with pytest.raises(SchemeError, match="llama-quantize's IQ2_XS picks IQ1, IQ2 or IQ3 vector-codebook types"):
        mixes.mix_of("iq2_xs")
    assert mixes.mix_of("Q5_K").name == "Q5_K_M"
    assert mixes.mix_of("mxfp4") is None  # a GGUF type, not a file type: one type for every weight


def test_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "f32.gguf"
    _model(src, n_layer=2)
    dst = tmp_path / "q.gguf"
    with pytest.raises(SchemeError, match="Q2_K_S needs an importance matrix for its Q2_K tensors"):
        aq.quantize_file(src, dst, "Q2_K_S")
    with pytest.raises(SchemeError, match=r"tensor type for 'attn_v' 'iq2_xxs' is no GGUF type arrayquant writes"):
        aq.quantize_file(src, dst, "Q4_K_M", tensor_types=[("attn_v", "iq2_xxs")])
    with pytest.raises(SchemeError, match=r"tensor type pattern '\(attn' is no regular expression"):
        aq.quantize_file(src, dst, "Q4_K_M", tensor_types=[("(attn", "q8_0")])
    with pytest.raises(SchemeError, match="output tensor type 'q9_9' is no GGUF type arrayquant writes"):
        aq.quantize_file(src, dst, "Q4_K_M", output_tensor_type="q9_9")
    with pytest.raises(SchemeError, match=r"name one of its file types as the scheme .* not mxfp4"):
        aq.quantize_file(src, dst, "mxfp4", output_tensor_type="q8_0")
    assert main(["quantize", str(src), str(dst), "--scheme", "q4_k_m", "--tensor-type", "attn_v", "--quiet"]) == 1
    assert "--tensor-type attn_v: it takes PATTERN=TYPE, e.g. attn_v=q8_0" in capsys.readouterr().err
    st = tmp_path / "w.safetensors"
    aq.save(st, {"w": np.ones((4, 256), np.float32)})
    assert main(["quantize", str(st), str(tmp_path / "o.safetensors"), "--scheme", "q8s", "--pure"]) == 1
    assert "apply to GGUF IN and OUT only" in capsys.readouterr().err


def test_cli_lists_the_types_it_picked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "f32.gguf"
    _model(src, n_layer=2)
    assert main(["quantize", str(src), str(tmp_path / "q.gguf"), "--scheme", "Q4_K_M", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "quantized 16 tensors as Q4_K_M (Q4_K x12, Q5_0 x1, Q6_K x2, Q8_0 x1)" in out
    # two layers: use_more_bits picks the last, whose ffn_down is Q6_K (-> Q8_0), the other Q4_K (-> Q5_0)
    assert "blk.0.ffn_down.weight: rows of the type llama-quantize picks do not fit, written as Q5_0" in out
    assert "blk.1.ffn_down.weight: rows of the type llama-quantize picks do not fit, written as Q8_0" in out
