"""Import hygiene: no optional backend on import, imports that flow one way, no private names shared.

Layers over the whole package, lowest first (a module imports from its own layer or a lower one):

===  ==========================================  ===============================================
  0  ``errors``, ``_version``                     the error types, the version
  1  ``scheme``                                   schemes, pure Python
  2  ``invariants``                               checks before any kernel runs
  3  ``kernels``                                  portable Array API kernels
  4  ``backends``                                 the shim choosing array libraries and devices
  5  ``storage``, ``blockwork``, ``affinework``,  stored values, block walks, slabs, conversion
     ``chunks``, ``convert``
  6  ``tensor``                                   :class:`QuantizedTensor`, the data type
  7  ``fused``                                    one-library fused kernels (Numba, CuPy)
  8  ``lazy``                                     out-of-core (Dask) drivers
  9  ``quantize``, ``dequantize``                 the codec
 10  ``metrics``, ``gptq``                        built on the codec
 11  ``ops``                                      operations on quantized tensors
 12  ``io``                                       files in every format
 13  ``bench``                                    the benchmark
 14  ``cli``                                      the command line
 15  the package root, ``__main__``               the public face
===  ==========================================  ===============================================

``tensor`` sits below the codec because every layer above returns its type; its operator methods
reach ``ops`` at call time through the one upward edge allowed (:data:`ALLOWED_EDGES`). Array
library names appear only in the host layers; ``scheme`` and ``errors`` import no array code.
A ``_private`` name is never imported from another module, nor read as ``module._name``: what two
modules share is public in the lower one (a private *module* such as ``io/_atomic.py`` is shared
inside its own package).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import arrayquant

PACKAGE = "arrayquant"
ROOT = Path(arrayquant.__file__).resolve().parent
LAYERS = {
    "errors": 0,
    "_version": 0,
    "scheme": 1,
    "invariants": 2,
    "kernels": 3,
    "backends": 4,
    "storage": 5,
    "blockwork": 5,
    "affinework": 5,
    "chunks": 5,
    "convert": 5,
    "tensor": 6,
    "fused": 7,
    "lazy": 8,
    "quantize": 9,
    "dequantize": 9,
    "metrics": 10,
    "gptq": 10,
    "ops": 11,
    "io": 12,
    "bench": 13,
    "cli": 14,
    "__main__": 15,
}
API_LAYER = 15  # the package root
# the one upward edge: QuantizedTensor's operator methods dispatch to ops at call time
ALLOWED_EDGES = frozenset({("arrayquant.tensor", "arrayquant.ops")})
LAYER_NAMES = {n: "/".join(k for k, v in LAYERS.items() if v == n) or "api" for n in range(API_LAYER + 1)}
ARRAY_LIBRARIES = ("numpy", "cupy", "torch", "jax", "dask", "array_api_strict", "ml_dtypes")
KERNEL_FORBIDDEN = ("numpy", "cupy", "torch", "jax", "dask")
# host-side I/O and the command line read and write NumPy buffers, the benchmark times the peers
# (ml_dtypes, torch, jax, cupy, imported inside its functions), and the fused kernels are written
# for one library each (Numba on NumPy arrays); the portable kernels never name one
HOST_LAYERS = ("backends", "io", "cli", "bench", "metrics", "fused")
PURE_FORBIDDEN = (*ARRAY_LIBRARIES, "array_api_compat")
OPTIONAL_BACKENDS = ("cupy", "torch", "jax", "dask", "array_api_strict", "ml_dtypes")


# ---------------------------------------------------------------------------------------------
# (a) importing arrayquant pulls in no optional backend
# ---------------------------------------------------------------------------------------------

_PROBE = """
import json, sys
import arrayquant as aq
after_import = sorted(sys.modules)
import numpy as np
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
qt = aq.quantize(x, "q8s:block16:f16")
y = aq.dequantize(qt)
assert y.shape == (2, 32)
print(json.dumps({"import": after_import, "use": sorted(sys.modules)}))
"""


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return sorted({m for m in modules for n in names if m == n or m.startswith(n + ".")})


def test_import_pulls_in_no_optional_backend() -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", _PROBE], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert _loaded(report["import"], OPTIONAL_BACKENDS) == [], "imported by `import arrayquant`"
    assert _loaded(report["use"], OPTIONAL_BACKENDS) == [], "imported by quantize/dequantize on numpy"


# ---------------------------------------------------------------------------------------------
# (b) the import-flow checker
# ---------------------------------------------------------------------------------------------


def layer_of(module: str) -> int:
    """The layer of ``arrayquant[.<top>[...]]``: by its first component below the package."""
    parts = module.split(".")
    assert parts[0] == PACKAGE, module
    if len(parts) == 1:
        return API_LAYER
    assert parts[1] in LAYERS, f"{module} has no layer: add its top-level module to LAYERS"
    return LAYERS[parts[1]]


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    if node.level - 1 > len(package) - 1:
        raise ValueError(f"relative import beyond the top of {PACKAGE} in {module}")
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every module ``source`` imports (absolute names), with line numbers.

    ``from . import x`` yields the package's submodule ``x``; ``__import__("m")`` and
    ``importlib.import_module("m")`` with a literal name count as imports of ``m``.
    """
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, is_package)
            if target == PACKAGE or (node.level and not node.module):
                out += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, target))
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if name in ("__import__", "import_module") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    out.append((node.lineno, arg.value))
    return out


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Imports in ``source`` (the text of ``module``) that break the layering rules."""
    here = layer_of(module)
    sub = module.split(".")[1] if "." in module else ""
    found = []
    for line, target in imported_modules(source, module, is_package):
        top = target.split(".")[0]
        if top == PACKAGE:
            there = layer_of(target)
            if there > here and not any(
                (module == a or module.startswith(a + ".")) and (target == b or target.startswith(b + "."))
                for a, b in ALLOWED_EDGES
            ):
                found.append(
                    f"{module}:{line} imports {target} ({LAYER_NAMES[there]}, layer {there}) "
                    f"from {LAYER_NAMES[here]} (layer {here})"
                )
        elif sub == "kernels" and top in KERNEL_FORBIDDEN:
            found.append(f"{module}:{line} imports the array library {target} inside kernels/")
        elif sub in ("scheme", "errors") and top in PURE_FORBIDDEN:
            found.append(f"{module}:{line} imports {target} in the pure-Python {sub} layer")
        elif sub not in HOST_LAYERS and top in ARRAY_LIBRARIES:
            found.append(f"{module}:{line} imports the array library {target} outside backends/")
    return found


def _is_module(name: str) -> bool:
    """Whether the dotted ``name`` is a module or package of the source tree."""
    path = ROOT.joinpath(*name.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str, module: str, is_package: bool = False) -> list[str]:
    """Private names ``source`` takes from other modules: ``from m import _x`` and ``m._x``.

    A private *module* may be imported from inside the package that holds it (``from . import
    _atomic`` in ``io/gguf/`` reaches ``io/_atomic.py``), never from outside it.
    """
    found = []
    aliases: dict[str, str] = {}  # local name -> the arrayquant module it is bound to
    tree = ast.parse(source)
    here_pkg = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, is_package)
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if _is_module(full):
                    aliases[alias.asname or alias.name] = full
                    if _private(alias.name) and not (here_pkg + ".").startswith(target + "."):
                        found.append(
                            f"{module}:{node.lineno} imports the private module {full} from outside its package"
                        )
                elif _private(alias.name):
                    found.append(f"{module}:{node.lineno} imports the private name {alias.name} from {target}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
            and not _is_module(f"{aliases[node.value.id]}.{node.attr}")
        ):
            found.append(f"{module}:{node.lineno} reads the private name {node.attr} of {aliases[node.value.id]}")
    return found


def _source_modules() -> list[tuple[str, Path, bool]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [PACKAGE, *rel.parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out.append((".".join(parts), path, is_package))
    return out


MODULES = _source_modules()


def test_every_source_module_is_checked() -> None:
    names = {m for m, _, _ in MODULES}
    assert {"arrayquant", "arrayquant.errors", "arrayquant.quantize"} <= names
    for layer in LAYERS:
        assert any(n == f"{PACKAGE}.{layer}" or n.startswith(f"{PACKAGE}.{layer}.") for n in names), layer


@pytest.mark.parametrize(("module", "path", "is_package"), MODULES, ids=[m for m, _, _ in MODULES])
def test_imports_flow_one_way(module: str, path: Path, is_package: bool) -> None:
    assert violations(path.read_text(encoding="utf-8"), module, is_package) == []


@pytest.mark.parametrize(("module", "path", "is_package"), MODULES, ids=[m for m, _, _ in MODULES])
def test_no_private_name_crosses_modules(module: str, path: Path, is_package: bool) -> None:
    assert private_uses(path.read_text(encoding="utf-8"), module, is_package) == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("arrayquant.cli.quantize", "from ..io import formats\nformats._BY_NAME\n", "private name _BY_NAME of"),
        ("arrayquant.cli.quantize", "from ..io.reader import _PLAIN\n", "private name _PLAIN from"),
        ("arrayquant.cli.quantize", "from ..io import _atomic\n", "private module arrayquant.io._atomic"),
        ("arrayquant.ops.linalg", "import arrayquant.fused.registry as r\nr._LOCK\n", "private name _LOCK"),
    ],
)
def test_private_checker_catches(module: str, source: str, expected: str) -> None:
    found = private_uses(source, module)
    assert len(found) == 1, found
    assert expected in found[0]


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("arrayquant.io.gguf.writer", "from .. import _atomic, _dtypes\n_atomic.publish\n"),
        ("arrayquant.io", "from . import _select\n"),
        ("arrayquant.cli.quantize", "from ..io import formats\nformats.detect\nobj._private\n"),
        ("arrayquant.quantize", "from .kernels import compute_range as _compute_range\n"),
    ],
)
def test_private_checker_accepts(module: str, source: str) -> None:
    assert private_uses(source, module, module == "arrayquant.io") == []


def test_layers() -> None:
    assert layer_of("arrayquant") == API_LAYER
    assert layer_of("arrayquant.errors") == 0
    assert layer_of("arrayquant.scheme.block") == 1
    assert layer_of("arrayquant.invariants") == 2
    assert layer_of("arrayquant.kernels.packing") == 3
    assert layer_of("arrayquant.backends.shim") == 4
    order = ["storage", "tensor", "fused", "lazy", "quantize", "metrics", "ops", "io", "bench", "cli"]
    assert [layer_of(f"arrayquant.{m}") for m in order] == sorted(layer_of(f"arrayquant.{m}") for m in order)
    assert layer_of("arrayquant.quantize") == layer_of("arrayquant.dequantize")
    with pytest.raises(AssertionError, match="has no layer"):
        layer_of("arrayquant.newthing")


def test_the_one_upward_edge_is_tensor_to_ops() -> None:
    assert violations("from . import ops\n", "arrayquant.tensor") == []
    assert violations("from .ops import manipulation\n", "arrayquant.tensor") == []
    found = violations("from . import io\n", "arrayquant.tensor")
    assert len(found) == 1
    assert "arrayquant.io" in found[0]
    assert len(violations("from .ops import matmul\n", "arrayquant.quantize")) == 1


# the checker's self-check: it must catch what it is there to catch ------------------------------


@pytest.mark.parametrize(
    ("module", "is_package", "source", "expected"),
    [
        (
            "arrayquant.kernels.blocks",
            False,
            "from ..backends import shim\n",
            "arrayquant.backends (backends, layer 4)",
        ),
        (
            "arrayquant.kernels.blocks",
            False,
            "from ..quantize import quantize\n",
            "arrayquant.quantize (quantize/dequantize, layer 9)",
        ),
        ("arrayquant.scheme.block", False, "from ..invariants import plan_for\n", "arrayquant.invariants"),
        ("arrayquant.scheme", True, "from ..kernels import absmax\n", "arrayquant.kernels"),
        ("arrayquant.errors", False, "from .scheme import QuantScheme\n", "arrayquant.scheme"),
        ("arrayquant.invariants.plan", False, "from .. import storage\n", "arrayquant.storage"),
        ("arrayquant.invariants.plan", False, "import arrayquant.tensor\n", "arrayquant.tensor"),
        ("arrayquant.backends.shim", False, "from arrayquant.quantize import quantize\n", "arrayquant.quantize"),
        ("arrayquant.quantize", False, "from .io import load\n", "arrayquant.io (io, layer 12)"),
        ("arrayquant.io.gguf.writer", False, "from ...cli import main\n", "arrayquant.cli (cli, layer 14)"),
        ("arrayquant.fused.registry", False, "from ..tensor import QuantizedTensor\nfrom ..lazy import x\n", "lazy"),
        ("arrayquant.kernels.blocks", False, "def f():\n    from ..backends.registry import get\n", "registry"),
        ("arrayquant.kernels.blocks", False, "import numpy as np\n", "array library numpy inside kernels/"),
        ("arrayquant.kernels.blocks", False, "import torch.nn\n", "array library torch.nn inside kernels/"),
        ("arrayquant.kernels.blocks", False, "from jax import numpy\n", "array library jax inside kernels/"),
        ("arrayquant.kernels.blocks", False, "import dask.array as da\n", "array library dask.array inside"),
        ("arrayquant.kernels.blocks", False, "lib = __import__('cupy')\n", "array library cupy inside kernels/"),
        ("arrayquant.kernels", True, "import importlib\nimportlib.import_module('numpy')\n", "numpy inside kernels/"),
        ("arrayquant.scheme.scales", False, "import numpy\n", "pure-Python scheme layer"),
        ("arrayquant.scheme.scales", False, "import array_api_compat\n", "pure-Python scheme layer"),
        ("arrayquant.quantize", False, "import torch\n", "array library torch outside backends/"),
        ("arrayquant.invariants.data", False, "import ml_dtypes\n", "outside backends/"),
    ],
)
def test_checker_catches_violations(module: str, is_package: bool, source: str, expected: str) -> None:
    found = violations(source, module, is_package)
    assert len(found) == 1, found
    assert expected in found[0]


@pytest.mark.parametrize(
    ("module", "is_package", "source"),
    [
        ("arrayquant", True, "from . import backends, errors\nfrom .quantize import quantize\n"),
        ("arrayquant.quantize", False, "from .kernels import absmax\nfrom .chunks import assemble\n"),
        ("arrayquant.kernels.blocks", False, "from ..invariants import Plan\nfrom . import packing\n"),
        ("arrayquant.kernels.blocks", False, "from array_api_compat import device\nimport math\n"),
        ("arrayquant.kernels", True, "from .blocks import as_blocks\n"),
        ("arrayquant.scheme", True, "from .block import BlockSize\nfrom ..errors import SchemeError\n"),
        ("arrayquant.backends.shim", False, "import numpy as np\nimport torch\nfrom ..errors import DeviceError\n"),
        ("arrayquant.invariants.plan", False, "from ..scheme import QuantScheme\nfrom .. import errors\n"),
    ],
)
def test_checker_accepts_allowed_imports(module: str, is_package: bool, source: str) -> None:
    assert violations(source, module, is_package) == []


def test_relative_imports_resolve() -> None:
    got = [t for _, t in imported_modules("from ..errors import X\nfrom . import a, b\n", "arrayquant.scheme.block")]
    assert got == ["arrayquant.errors", "arrayquant.scheme.a", "arrayquant.scheme.b"]
    got = [t for _, t in imported_modules("from .. import errors\n", "arrayquant.kernels", is_package=True)]
    assert got == ["arrayquant.errors"]
    got = [t for _, t in imported_modules("from .chunks import x\n", "arrayquant", is_package=True)]
    assert got == ["arrayquant.chunks"]
