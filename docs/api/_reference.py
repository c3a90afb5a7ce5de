"""The API reference's list of names: ``arrayquant.__all__``, grouped by kind, written as autosummary.

``conf.py`` writes :func:`render`'s page before Sphinx reads the sources, and
tests/test_public_api.py checks that it lists every name of ``arrayquant.__all__`` once, so the
reference and ``__all__`` cannot drift apart: there is no second, hand-kept list of names.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
import types

import arrayquant

# (title, kind) in page order; kind() puts every public name in exactly one
SECTIONS = [
    ("Schemes and the quantized tensor", "class"),
    ("Functions", "function"),
    ("Errors", "exception"),
    ("Namespaces", "module"),
    ("Constants", "data"),
]


def kind(obj: object) -> str:
    """Which section of the reference documents ``obj``."""
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if callable(obj):
        return "function"
    return "data"


def sections() -> list[tuple[str, list[str]]]:
    """``(title, names)`` for each section, the names in ``arrayquant.__all__`` order."""
    names = list(arrayquant.__all__)
    return [(title, [n for n in names if kind(getattr(arrayquant, n)) == k]) for title, k in SECTIONS]


def render() -> str:
    """The reference page: one autosummary table (with a generated page per name) for each section."""
    lines = [
        "Reference",
        "=========",
        "",
        "Every name of ``arrayquant.__all__`` (``import arrayquant as aq``), generated from the docstrings.",
        "",
        ".. currentmodule:: arrayquant",
        "",
    ]
    for title, names in sections():
        if not names:
            continue
        lines += [title, "-" * len(title), "", ".. autosummary::", "   :toctree: .", ""]
        lines += [f"   {name}" for name in names]
        lines.append("")
    return "\n".join(lines)


@functools.cache
def data_comment(name: str) -> tuple[str, ...]:
    """The ``#:`` comment documenting the value ``arrayquant.<name>``, where it is assigned.

    Module-level data has no docstring of its own (autodoc would show ``tuple``'s or ``str``'s), so
    it is documented the Sphinx way: ``#:`` lines above the assignment, or one after it on its line.
    """
    obj = getattr(arrayquant, name)
    modules = ["arrayquant"] + [m.name for m in pkgutil.walk_packages(arrayquant.__path__, "arrayquant.")]
    for modname in modules:
        module = importlib.import_module(modname)
        if getattr(module, name, None) is not obj:
            continue
        source = inspect.getsource(module)
        above = re.search(rf"^((?:#:.*\n)+){re.escape(name)}\b[^=\n]*=", source, re.MULTILINE)
        if above:
            return tuple(line[2:].strip() for line in above.group(1).splitlines())
        inline = re.search(rf"^{re.escape(name)}\b[^=\n]*=.*#:(.*)$", source, re.MULTILINE)
        if inline:
            return (inline.group(1).strip(),)
    return ()


def undocumented() -> list[str]:
    """The names of ``arrayquant.__all__`` with no documentation of their own for the reference."""
    missing = []
    for name in arrayquant.__all__:
        obj = getattr(arrayquant, name)
        if kind(obj) == "data":
            documented = bool(data_comment(name))
        elif inspect.isclass(obj):
            documented = bool((vars(obj).get("__doc__") or "").strip())  # not a base class's
        else:
            documented = bool((getattr(obj, "__doc__", None) or "").strip())
        if not documented:
            missing.append(name)
    return missing
