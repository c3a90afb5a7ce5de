"""The root conftest's skip summary: one line per distinct skip reason, with a count.

Each test runs pytest in-process on a small generated test folder whose conftest loads the
repository's root ``conftest.py`` by path, so the hook under test is the real one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

LOADER = f"""
import importlib.util

_spec = importlib.util.spec_from_file_location("_arrayquant_root_conftest", {str(ROOT_CONFTEST)!r})
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
pytest_terminal_summary = _root.pytest_terminal_summary
"""

TESTS = """
import pytest

def test_a():
    pytest.skip("no gpu here")

def test_b():
    pytest.skip("no gpu here")

@pytest.mark.parametrize("n", range(3))
def test_c(n):
    pytest.skip("no gpu here")

@pytest.mark.skip(reason="torch is not installed")
def test_d():
    pass

def test_e():
    pytest.importorskip("arrayquant_no_such_module")

def test_fails():
    assert 1 == 2, "the failure that must stay visible"

def test_passes():
    pass
"""


@pytest.fixture
def folder(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(LOADER)
    pytester.makepyfile(test_many_skips=TESTS)
    return pytester


def skipped_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("SKIPPED")]


def test_skips_fold_to_one_line_per_reason(folder: pytest.Pytester) -> None:
    result = folder.runpytest("-ra", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, skipped=7)
    lines = skipped_lines(result)
    # five skips at three different lines share one reason: one line, counted
    assert lines == [
        "SKIPPED [5] no gpu here",
        "SKIPPED [1] could not import 'arrayquant_no_such_module': No module named 'arrayquant_no_such_module'",
        "SKIPPED [1] torch is not installed",
    ]
    assert "test_many_skips.py:" not in "\n".join(lines)  # no per-location lines from -rs
    text = "\n".join(result.outlines)
    assert "7 skipped, by reason" in text
    # the failure is still listed, after the skip summary
    assert text.index("SKIPPED [5]") < text.index("FAILED test_many_skips.py::test_fails")


def test_summary_without_s_in_report_chars(folder: pytest.Pytester) -> None:
    # with -rfE the built-in summary shows no skips at all; the by-reason lines still do
    result = folder.runpytest("-rfE", "-p", "no:cacheprovider")
    assert skipped_lines(result)[0] == "SKIPPED [5] no gpu here"
    assert len(skipped_lines(result)) == 3
    result.stdout.fnmatch_lines(["FAILED test_many_skips.py::test_fails*"])


def test_no_fold_skipped_keeps_pytests_listing(folder: pytest.Pytester) -> None:
    result = folder.runpytest("-ra", "--no-fold-skipped", "-p", "no:cacheprovider")
    lines = skipped_lines(result)
    assert len(lines) == 7  # one per test, as pytest lists them
    assert all("::" in line for line in lines)


def test_no_skips_no_summary(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(LOADER)
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest("-ra", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "by reason" not in "\n".join(result.outlines)
