"""Peak memory and time of the model-folder commands on a large model: ``python ci/model_memory.py``.

Builds a Llama-shaped bf16 model folder of about ``--gib`` GiB (random weights, three shards with
an index, a config.json) in a temporary folder, then runs, each in a fresh subprocess:

- ``aq.quantize_model`` for each scheme given (``--schemes``),
- ``aq.dequantize_model`` of the first scheme's output back to bf16,

and prints its peak RSS (``VmHWM``, Linux); the peak of the same command on a one-layer model of
a few MiB (the baseline: interpreter, libraries, code); the largest tensor of the model and the
largest quantized weight's encoded size; and the bound: 1.5 times the largest tensor plus that
output, above the baseline. Asserts nothing: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_PROBE = """
import sys, arrayquant as aq
from arrayquant.io.compressed_tensors.model import dequantize_model
what, src, dst, scheme = sys.argv[1:5]
if what == "quantize":  # the baseline runs this on a tiny model
    aq.quantize_model(src, dst, scheme)
elif what == "dequantize":
    dequantize_model(src, dst, "bfloat16")
status = open("/proc/self/status").read()
print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))  # KiB
"""

MIB = 2**20


def _layer_shapes(hidden: int, inter: int) -> dict[str, tuple[int, int]]:
    return {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (hidden, hidden),
        "self_attn.v_proj": (hidden, hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }


def build(folder: Path, gib: float, hidden: int, inter: int, vocab: int) -> tuple[int, int]:
    """Write the model; its size in bytes and its largest tensor's."""
    import ml_dtypes

    from arrayquant.io.arrayquant.checkpoint import save_stream

    per_layer = sum(r * c for r, c in _layer_shapes(hidden, inter).values()) * 2
    layers = max(1, round((gib * 2**30 - 2 * vocab * hidden * 2) / per_layer))
    rng = np.random.default_rng(0)
    names: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        names += [(f"model.layers.{i}.{m}.weight", s) for m, s in _layer_shapes(hidden, inter).items()]
        names += [(f"model.layers.{i}.input_layernorm.weight", (hidden,))]
    names += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    shards = np.array_split(np.arange(len(names)), 3)
    weight_map, total, largest = {}, 0, 0
    for k, idx in enumerate(shards, 1):
        shard = f"model-{k:05d}-of-{len(shards):05d}.safetensors"

        def items(idx: np.ndarray = idx) -> object:
            for i in idx:
                name, shape = names[i]
                yield name, (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)

        save_stream(folder / shard, items(), metadata={"format": "pt"})  # type: ignore[arg-type]
        for i in idx:
            name, shape = names[i]
            weight_map[name] = shard
            size = int(np.prod(shape)) * 2
            total += size
            largest = max(largest, size)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 128,
        "num_key_value_heads": hidden // 128,
        "vocab_size": vocab,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return total, largest


def _run(*args: str) -> tuple[float, float]:
    """Peak RSS (MiB) and seconds of one probe run."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[-1]) / 1024, time.perf_counter() - start


def _largest_output(folder: Path) -> tuple[str, float]:
    """The largest quantized weight's module and the MiB of its encoded entries."""
    from arrayquant.io.safetensors.reader import SafetensorsFile

    sizes: dict[str, int] = {}
    parts: dict[str, int] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with SafetensorsFile(shard) as st:
            for name, e in st.entries.items():
                module, _, part = name.rpartition(".")
                if part.startswith("weight"):
                    sizes[module] = sizes.get(module, 0) + e.nbytes
                    parts[module] = parts.get(module, 0) + (part == "weight_scale")
    sizes = {m: n for m, n in sizes.items() if parts[m]}  # quantized modules only
    module = max(sizes, key=lambda m: sizes[m])
    return module, sizes[module] / MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.1)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--inter", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--schemes", nargs="+", default=["nvfp4", "mxfp8", "mxfp4", "q4s:block128:bf16"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        src = Path(tmp) / "model"
        src.mkdir()
        total, largest = build(src, args.gib, args.hidden, args.inter, args.vocab)
        tiny = Path(tmp) / "tiny"
        tiny.mkdir()
        build(tiny, 0.0, 256, 512, 256)  # one small layer: the same code runs, on almost no data
        base, _ = _run("quantize", str(tiny), str(Path(tmp) / "tiny-q"), args.schemes[0])
        print(f"model: {total / 2**30:.2f} GiB bf16 in 3 shards; largest tensor {largest / MIB:.0f} MiB")
        small = sum(f.stat().st_size for f in tiny.iterdir()) / MIB
        print(f"baseline (quantize_model on a 1-layer model of {small:.1f} MiB): {base:.0f} MiB peak RSS")
        print(f"{'command':<34} {'peak MiB':>9} {'above base':>10} {'bound':>7} {'seconds':>8}")
        first = None
        for scheme in args.schemes:
            dst = Path(tmp) / f"q-{len(list(Path(tmp).iterdir()))}"
            peak, secs = _run("quantize", str(src), str(dst), scheme)
            _, out_mib = _largest_output(dst)
            bound = 1.5 * largest / MIB + out_mib
            print(f"{'quantize_model ' + scheme:<34} {peak:9.0f} {peak - base:10.0f} {bound:7.0f} {secs:8.1f}")
            first = first or dst
        if first is not None:
            peak, secs = _run("dequantize", str(first), str(Path(tmp) / "dq"), "-")
            bound = 1.5 * largest / MIB + largest / MIB
            name = "dequantize_model " + args.schemes[0]
            print(f"{name:<34} {peak:9.0f} {peak - base:10.0f} {bound:7.0f} {secs:8.1f}")


if __name__ == "__main__":
    main()
