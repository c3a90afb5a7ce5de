"""The ``arrayquant`` command line's options: one subparser per command, each run by its module."""

from __future__ import annotations

import argparse

from .. import bench
from .._version import __version__
from ..io.arrayquant.requantize import NONFINITE
from ..io.formats import names
from . import backends as backends_command
from . import compare as compare_command
from . import demo as demo_command
from . import dequantize as dequantize_command
from . import inspect as inspect_command
from . import quantize as quantize_command
from .stats import QUALITY_FLOOR_DB

__all__ = ["build_parser", "quiet_default"]


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Show each option's default, except empty ones (None, False, no repeats) and ones the help gives."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if quiet_default(action):
            return action.help
        return super()._get_help_string(action)


def quiet_default(action: argparse.Action) -> bool:
    """Whether the help need not show ``action``'s default."""
    empty = action.default is None or action.default is False or action.default == []
    return empty or action.default is argparse.SUPPRESS or "default" in (action.help or "")


def _subparser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, **kwargs: object
) -> argparse.ArgumentParser:
    """A subcommand that shows defaults and takes ``--debug`` after its name too."""
    parser: argparse.ArgumentParser = sub.add_parser(name, formatter_class=_Help, **kwargs)  # type: ignore[arg-type]
    # SUPPRESS: given here it sets args.debug, absent it leaves the top level's value alone
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
    return parser


def _positive(text: str) -> int:
    n = _count(text)
    if n == 0:
        msg = "expected a whole number >= 1, got 0"
        raise argparse.ArgumentTypeError(msg)
    return n


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        msg = f"expected a whole number >= 0, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return n


_SCHEME_HELP = (
    "scheme text: a value, then options separated by ':', e.g. q8s, q4s:block32:f16, q4s:block16:ue4m3:tensor:f32, "
    "or a preset: nvfp4, mxfp8, mxfp4, nf4"
)


def build_parser() -> argparse.ArgumentParser:
    """The ``arrayquant`` command line: its options and one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="arrayquant", description="Burn's tensor quantization on any Array API backend", formatter_class=_Help
    )
    parser.add_argument("--version", action="version", version=f"arrayquant {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = _subparser(sub, "demo", help="quantize built-in weight-like data with several schemes and report quality")
    demo.add_argument("--backend", help="array backend (default: aq.backends.default())")
    demo.add_argument("--device", help="device such as cpu, cuda, cuda:1 (default: the backend's)")
    demo.add_argument("--rows", type=_positive, default=1024, help="rows of the f32 demo data")
    demo.add_argument("--cols", type=_positive, default=1024, help="columns of the f32 demo data")
    demo.add_argument("--repeat", type=_positive, default=3, help="timing runs per scheme (best is reported)")
    demo.add_argument(
        "--scheme",
        dest="schemes",
        action="append",
        metavar="SCHEME",
        help=f"scheme text; repeat for several (default: {', '.join(demo_command.DEMO_SCHEMES)})",
    )
    demo.add_argument(
        "--calibration",
        dest="calibrations",
        action="append",
        default=[],
        metavar="TEXT",
        help="also quantize with this calibration (mse, percentile:99.5, 4over6, ...) and show its SQNR, gain "
        "and time beside minmax's, per scheme (repeat)",
    )
    demo.add_argument(
        "--write-checkpoint", metavar="PATH", help="write a small synthetic f32 model checkpoint to PATH and exit"
    )
    demo.set_defaults(func=demo_command.run)
    back = _subparser(sub, "backends", help="list array backends, whether they are usable, and their devices")
    back.set_defaults(func=backends_command.run)
    _file_parsers(sub)
    perf = _subparser(
        sub,
        "bench",
        help="measure quantize/dequantize GB/s on this machine beside copy, plain NumPy and installed peers",
        description=bench.__doc__.splitlines()[0] if bench.__doc__ else None,
    )
    bench.add_arguments(perf)
    perf.set_defaults(func=lambda a: bench.run_from_args(a, perf))
    return parser


def _file_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = _subparser(
        sub,
        "quantize",
        help="quantize the weights of a safetensors, GGUF, Burnpack or ONNX file or a model folder, tensor by tensor",
        description="Quantize the floating tensors that match (by default the 2-D weights, not norms or biases) "
        "and copy the rest unchanged. IN is a .safetensors file, a Hugging Face model folder, a .gguf, a .bpk or an "
        ".onnx file; OUT is written in the format --format says, and a suffix of OUT (.safetensors, .gguf, .bpk, "
        ".onnx) must "
        "name that format. The summary gives the sizes, the mean and worst SQNR, and warns about tensors below "
        f"{QUALITY_FLOOR_DB:g} dB.",
    )
    q.add_argument(
        "input",
        metavar="IN",
        help="a .safetensors file, a Hugging Face model folder (config.json and model.safetensors or its shards), "
        "a .gguf, a .bpk or an .onnx model (never changed)",
    )
    q.add_argument(
        "output",
        metavar="OUT",
        help="written atomically, never IN: a .safetensors or .bpk file from a .safetensors IN, a new folder "
        "from a model folder (compressed-tensors), a .gguf from a .gguf, a .bpk from a .bpk, an .onnx from an .onnx",
    )
    q.add_argument(
        "--format",
        choices=names(),
        help="arrayquant: one .safetensors file in arrayquant's layout; compressed-tensors: a model folder that "
        "transformers and vLLM load; gguf: a re-quantized GGUF (IN a .gguf); burnpack: a Burn .bpk file; onnx: "
        "the MatMul/Gemm weights of an .onnx IN as DequantizeLinear; matmulnbits: its MatMul nodes as "
        "onnxruntime's MatMulNBits (default: compressed-tensors for a folder, the input's own format for .gguf, "
        ".bpk and .onnx, burnpack for an OUT ending in .bpk, else arrayquant)",
    )
    q.add_argument("--scheme", required=True, help=_SCHEME_HELP)
    q.add_argument("--include", action="append", default=[], metavar="GLOB", help="quantize tensors named so (repeat)")
    q.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="never quantize these (repeat)")
    q.add_argument("--min-size", type=_count, default=0, metavar="N", help="only tensors of N elements or more")
    q.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        help="compressed-tensors: cut the weights into shards of at most SIZE, with a unit: 5GB, 500MB, 2GiB "
        "(B for bytes; a bare number is refused), named and indexed as save_pretrained does (default: the "
        "input's shards)",
    )
    q.add_argument(
        "--no-fused-shards",
        action="store_true",
        help="compressed-tensors: give each weight its own per-tensor scale, not the one shared by the weights "
        "vLLM and SGLang fuse into one layer (q/k/v, gate/up), which their nvfp4 and per-tensor fp8 layers need",
    )
    q.add_argument(
        "--requantize",
        action="store_true",
        help="GGUF and Burnpack: quantize weights that IN holds quantized already in another type, through "
        "float32 (as llama-quantize --allow-requantize; without it they are refused)",
    )
    q.add_argument(
        "--pure",
        action="store_true",
        help="GGUF with a llama-quantize file type (Q4_K_M, Q6_K, ...): every weight in its default type, as "
        "llama-quantize --pure, instead of the mix it picks per tensor",
    )
    q.add_argument(
        "--output-tensor-type",
        metavar="TYPE",
        help="GGUF with a llama-quantize file type: the type of output.weight (llama-quantize's option)",
    )
    q.add_argument(
        "--token-embedding-type",
        metavar="TYPE",
        help="GGUF with a llama-quantize file type: the type of token_embd.weight (llama-quantize's option)",
    )
    q.add_argument(
        "--tensor-type",
        action="append",
        default=[],
        metavar="PATTERN=TYPE",
        help="GGUF with a llama-quantize file type: tensors whose name PATTERN (a regular expression) is found in "
        "get TYPE, the first that matches winning (repeat; llama-quantize's option, e.g. attn_v=q8_0)",
    )
    q.add_argument("--backend", help="array backend (default: aq.backends.default())")
    q.add_argument("--device", help="device such as cpu, cuda, cuda:1 (default: the backend's)")
    q.add_argument(
        "--nonfinite",
        choices=NONFINITE,
        default="error",
        help="NaN or infinity in a tensor to quantize: error (refuse, naming the tensor), zero (set them to 0 "
        "first), saturate (infinities saturate to the range ends; NaN gives code 0, or the NaN code of e4m3/e5m2)",
    )
    q.add_argument(
        "--calibration",
        metavar="TEXT",
        help="how each block's scale is chosen: minmax (Burn's, the default), ggml (llama.cpp's own quantizer, "
        "the default for a .gguf OUT: llama-quantize's bytes), absmean, mse (a clip search for the "
        "smallest error; options as mse:grid=50,max_shrink=0.3,norm=2), percentile (percentile:99.5), 4over6 "
        "(nvfp4: map each block's max to 6 or to 4, whichever errs less)",
    )
    q.add_argument(
        "--importance",
        metavar="FILE",
        help="weight each input column's error by FILE's vector (with --calibration mse or 4over6): a safetensors "
        "file of 1-D vectors keyed by weight name (e.g. mean squared activations), or llama.cpp's imatrix.gguf",
    )
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(func=quantize_command.run)
    d = _subparser(
        sub,
        "dequantize",
        help="turn the quantized tensors of a safetensors file, model folder, GGUF or Burnpack file back into floats",
    )
    d.add_argument(
        "input",
        metavar="IN",
        help="quantized .safetensors file, compressed-tensors model folder, .gguf or .bpk file (never changed)",
    )
    d.add_argument(
        "output",
        metavar="OUT",
        help="written atomically, never IN, in the format its name says: a .safetensors file of floats from any "
        "file; a .gguf from a .gguf and a .bpk from a .bpk or .safetensors (every key/value, id and other "
        "tensor kept); a new folder from a folder. GGUF types without an arrayquant scheme are written as the "
        "float values gguf reads them as",
    )
    d.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        help="float dtype of the quantized tensors (default: each tensor's original; float32 for GGUF and Burnpack)",
    )
    d.set_defaults(func=dequantize_command.run)
    i = _subparser(sub, "inspect", help="list the tensors of a checkpoint: shape, scheme or dtype, bytes, scales")
    i.add_argument("file", metavar="FILE", help=".safetensors file, model folder, .gguf or .bpk file")
    i.set_defaults(func=lambda a: inspect_command.run(a.file))
    c = _subparser(sub, "compare", help="per-tensor SQNR and maximum error of a quantized checkpoint")
    c.add_argument(
        "original", metavar="ORIGINAL", help="the float model: a .safetensors file, model folder, .gguf or .bpk file"
    )
    c.add_argument("quantized", metavar="QUANTIZED", help="the quantized (or dequantized) checkpoint made from it")
    c.add_argument(
        "--plot", metavar="FILE.png", help="also draw a histogram of the errors (matplotlib: .png, .pdf, .svg, ...)"
    )
    c.add_argument(
        "--calibration",
        dest="calibrations",
        action="append",
        default=[],
        metavar="TEXT",
        help="also quantize each quantized tensor again from ORIGINAL with its scheme and this calibration "
        "(minmax, mse, percentile:99.5, 4over6, ...) and show the SQNR it gives beside QUANTIZED's (repeat)",
    )
    c.set_defaults(func=lambda a: compare_command.run(a.original, a.quantized, a.plot, a.calibrations))
