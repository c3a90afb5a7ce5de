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

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
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


# -- links ------------------------------------------------------------------------------------
# every page a reader of the repository sees: the README and docs/*.md
LINKED_PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
ANY_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def prose(text: str) -> str:
    """``text`` without fenced code blocks (whose ``#`` lines are comments, not headings)."""
    return ANY_FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: rendered text, lower case, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a page; a repeated heading gets ``-1``, ``-2``, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(prose(text)):
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """``"target: why"`` for every relative link or ``#anchor`` of ``page`` that does not resolve."""
    broken = []
    for match in LINK.finditer(INLINE_CODE.sub("", prose(text))):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: {dest} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading of {dest.name} has the anchor #{anchor}")
    return broken


def test_github_slug() -> None:
    assert github_slug("Dask: lazy, chunked, larger than memory, on a cluster") == (
        "dask-lazy-chunked-larger-than-memory-on-a-cluster"
    )
    assert github_slug("Burn's byte layout") == "burns-byte-layout"
    assert github_slug("Q8F or Q8S: full or symmetric range") == "q8f-or-q8s-full-or-symmetric-range"
    assert github_slug("The `round_up` rule") == "the-round_up-rule"
    assert github_slug("See [spec](spec.md) now") == "see-spec-now"


def test_anchors_skip_code_and_number_repeats() -> None:
    text = "# Top\n\n```python\n# not a heading\n```\n\n## Same\n\n## Same\n"
    assert anchors(text) == {"top", "same", "same-1"}


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Real heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    text = (
        "# Here\n[ok](other.md#real-heading) [self](#here) [web](https://example.com/x#y)\n"
        "[gone](missing.md) [bad](other.md#no-such) [bad self](#nowhere) `[code](ignored.md)`\n"
        "```bash\n[in a fence](fenced.md)\n```\n"
    )
    page.write_text(text, encoding="utf-8")
    found = broken_links(page, text)
    assert [entry.split(":")[0] for entry in found] == ["missing.md", "other.md#no-such", "#nowhere"]
    assert "no heading of other.md has the anchor #no-such" in found[1]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    """Every relative link and ``#anchor`` in the README and docs/ points at something that exists."""
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


MD_NAME = re.compile(r"[\w./-]*\w\.md\b")


def missing_md_files(page: Path, text: str) -> list[str]:
    """Every ``*.md`` file named in the prose of ``text`` (linked or not) that is not in the repository.

    Fenced blocks are left out: a command there may name a file it writes.
    """
    names = sorted(set(MD_NAME.findall(prose(text))))
    return [n for n in names if not any((base / n).is_file() for base in (page.parent, ROOT, DOCS))]


def test_missing_md_files(tmp_path: Path) -> None:
    (tmp_path / "here.md").write_text("", encoding="utf-8")
    page = tmp_path / "page.md"
    assert missing_md_files(page, "see `here.md`, docs/guide.md and CONTRACT.md, sec. 2") == ["CONTRACT.md"]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: p.name)
def test_docs_stand_alone(page: Path) -> None:
    """The docs name no Markdown file outside the repository (the contract is docs/spec.md)."""
    assert missing_md_files(page, page.read_text(encoding="utf-8")) == []
