"""Sphinx configuration of the API reference, built from the numpydoc docstrings by ci/api-docs.sh.

Build it by hand with ``pip install -e ".[docs]"`` and
``sphinx-build -W --keep-going -b html docs/api <out>`` (it writes its generated pages under
docs/api/generated/, which git ignores).
"""

from __future__ import annotations

import sys
from pathlib import Path

import arrayquant

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _reference import data_comment, render  # noqa: E402  (docs/api/_reference.py, beside this file)

project = "arrayquant"
release = version = arrayquant.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "numpydoc"]
templates_path = ["_templates"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []

autosummary_generate = True
autosummary_ignore_module_all = False
autodoc_typehints = "none"  # the numpydoc sections say the types; signatures stay readable
autodoc_member_order = "bysource"
numpydoc_show_class_members = False  # methods are documented in place by autoclass :members:
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

nitpicky = True
# targets the reference does not document (internal or foreign types named in docstrings)
nitpick_ignore = [
    ("py:class", "enum.Enum"),  # the enums' base (no intersphinx: the build runs offline)
    # names in docstrings of src/arrayquant/io/ (edited elsewhere) that the reference leaves out:
    ("py:func", "detect"),  # io/formats.py, load
    ("py:mod", "arrayquant.io.compressed_tensors.fused_shards"),  # io/compressed_tensors/requantize.py, quantize_model
]


def _write_reference(app: object, config: object) -> None:
    out = HERE / "generated"
    out.mkdir(exist_ok=True)
    page = out / "reference.rst"
    text = render()
    if not page.is_file() or page.read_text(encoding="utf-8") != text:
        page.write_text(text, encoding="utf-8")


def _data_docstring(app: object, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
    # module-level data has no docstring of its own (autodoc would show tuple's or str's): use the
    # ``#:`` comment where the value is assigned (a submodule, for NF4)
    prefix = "arrayquant."
    if what == "data" and name.startswith(prefix) and "." not in name[len(prefix) :]:
        comment = data_comment(name[len(prefix) :])
        if comment:
            lines[:] = list(comment)


_TOP_LEVEL = {id(getattr(arrayquant, n)) for n in arrayquant.__all__}


def _skip_top_level(app: object, what: str, name: str, obj: object, skip: bool, options: object) -> bool | None:
    # a namespace's page (aq.io) leaves out what arrayquant.__all__ exports too: it has its own page
    if what == "module" and id(obj) in _TOP_LEVEL and not isinstance(obj, type(arrayquant)):
        return True
    return None


def setup(app: object) -> None:
    app.connect("config-inited", _write_reference)  # type: ignore[attr-defined]
    app.connect("autodoc-skip-member", _skip_top_level)  # type: ignore[attr-defined]
    app.connect("autodoc-process-docstring", _data_docstring)  # type: ignore[attr-defined]
