"""Import hygiene: no optional backend on import, and imports that flow one way between layers.

Layers (imports flow one way): errors (0) < scheme (1) < invariants (2) < kernels (3) < backends (4)
< everything else at the top level: quantize, dequantize, storage, tensor, chunks, convert,
``__init__``, ... (5). A module may import from its own layer or a lower one only. Array library
names appear only under ``backends/``; ``scheme/`` and ``errors`` import no array code at all.
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
LAYERS = {"errors": 0, "scheme": 1, "invariants": 2, "kernels": 3, "backends": 4}
API_LAYER = 5
LAYER_NAMES = {0: "errors", 1: "scheme", 2: "invariants", 3: "kernels", 4: "backends", 5: "api"}
ARRAY_LIBRARIES = ("numpy", "cupy", "torch", "jax", "dask", "array_api_strict", "ml_dtypes")
KERNEL_FORBIDDEN = ("numpy", "cupy", "torch", "jax", "dask")
# host-side I/O and the command line read and write NumPy buffers, the benchmark times the peers
# (ml_dtypes, torch, jax, cupy, imported inside its functions), and the fused kernels are written
# for one library each (Numba on NumPy arrays); the portable kernels never name one
HOST_LAYERS = ("backends", "io", "cli", "cli_commands", "bench", "metrics", "fused")
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
    return LAYERS.get(parts[1], API_LAYER)


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
            if there > here:
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


def test_layers() -> None:
    assert layer_of("arrayquant") == 5
    assert layer_of("arrayquant.errors") == 0
    assert layer_of("arrayquant.scheme.block") == 1
    assert layer_of("arrayquant.invariants") == 2
    assert layer_of("arrayquant.kernels.packing") == 3
    assert layer_of("arrayquant.backends.shim") == 4
    for api in ["quantize", "dequantize", "storage", "tensor", "chunks", "convert", "cli", "demo", "io"]:
        assert layer_of(f"arrayquant.{api}") == 5


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
        ("arrayquant.kernels.blocks", False, "from ..quantize import quantize\n", "arrayquant.quantize (api, layer 5)"),
        ("arrayquant.scheme.block", False, "from ..invariants import plan_for\n", "arrayquant.invariants"),
        ("arrayquant.scheme", True, "from ..kernels import absmax\n", "arrayquant.kernels"),
        ("arrayquant.errors", False, "from .scheme import QuantScheme\n", "arrayquant.scheme"),
        ("arrayquant.invariants.plan", False, "from .. import storage\n", "arrayquant.storage"),
        ("arrayquant.invariants.plan", False, "import arrayquant.tensor\n", "arrayquant.tensor"),
        ("arrayquant.backends.shim", False, "from arrayquant.quantize import quantize\n", "arrayquant.quantize"),
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
