"""The documentation runs: every ```python block of a page, in order, in one namespace per page.

A page's blocks share one namespace, as a reader typing them into one session would, so a later
block may use names an earlier one defined. Expected results are stated with ``assert`` in the
blocks themselves; a block that raises fails this test with a traceback whose line numbers are
those of the Markdown file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
# pages whose python blocks are executed; the guide must have some, the design page may have none
PAGES = {"guide.md": True, "design.md": False}
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, source)`` of every ```python block in ``text``, in order."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def test_python_blocks_extractor() -> None:
    text = "intro\n```python\na = 1\n```\n\n```bash\nls\n```\n```python\nb = a + 1\nassert b == 2\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (10, "b = a + 1\nassert b == 2\n")]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_runs(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = DOCS / page
    assert path.is_file(), f"{path} is missing"
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    if PAGES[page]:
        assert blocks, f"{page} has no ```python blocks"
    # run the page as a user would, whatever this process's backend choice; undone afterwards,
    # including any change a block makes to the variable itself
    monkeypatch.setenv("ARRAYQUANT_BACKEND", "")
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for first_line, source in blocks:
        # pad so that tracebacks point at the line of the Markdown file
        code = compile("\n" * (first_line - 1) + source, str(path), "exec")
        exec(code, namespace)
