"""The root conftest's skip summary: one line per distinct skip reason, with a count.

Each test runs pytest in-process on a small generated test folder whose conftest loads the
repository's root ``conftest.py`` by path, so the hook under test is the real one.
"""

from __future__ import annotations

import importlib.util
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


# ---------------------------------------------------------------------------------------------
# ARRAYQUANT_REQUIRE: a skip for a missing module of a required group is a failure
# ---------------------------------------------------------------------------------------------

REQUIRE_LOADER = (
    LOADER
    + """
pytest_configure = _root.pytest_configure
pytest_unconfigure = _root.pytest_unconfigure
pytest_report_header = _root.pytest_report_header
# a group whose module does not exist anywhere (and one that does), as a missing install looks
_root.REQUIRE_GROUPS["nosuch"] = ("arrayquant_no_such_module", "json")
"""
)

REQUIRE_TESTS = """
import pytest

def test_missing():
    pytest.importorskip("arrayquant_no_such_module")

def test_missing_submodule_with_reason():
    pytest.importorskip("arrayquant_no_such_module.sub", reason="needs the no-such extra")

def test_other_missing():
    pytest.importorskip("arrayquant_other_missing_module")

def test_present():
    assert pytest.importorskip("json").dumps(1) == "1"
"""

MODULE_LEVEL_TESTS = """
import pytest

pytest.importorskip("arrayquant_no_such_module")

def test_never_collected():
    pass
"""


def _run_required(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: str | None) -> pytest.RunResult:
    if env is None:
        monkeypatch.delenv("ARRAYQUANT_REQUIRE", raising=False)
    else:
        monkeypatch.setenv("ARRAYQUANT_REQUIRE", env)
    pytester.makeconftest(REQUIRE_LOADER)
    return pytester.runpytest("-ra", "-p", "no:cacheprovider")


def test_required_module_missing_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_required=REQUIRE_TESTS)
    result = _run_required(pytester, monkeypatch, "nosuch")
    result.assert_outcomes(passed=1, failed=2, skipped=1)  # a module no group names still skips
    result.stdout.fnmatch_lines(
        [
            "ARRAYQUANT_REQUIRE: arrayquant_no_such_module, json must import (a skip for one missing is a failure)",
            "*_ test_missing _*",
            "ARRAYQUANT_REQUIRE names 'nosuch', but 'arrayquant_no_such_module' is not usable here: could not import*",
            "*_ test_missing_submodule_with_reason _*",
            "ARRAYQUANT_REQUIRE names 'nosuch', but 'arrayquant_no_such_module.sub' is not usable here:"
            " needs the no-such extra",
            "SKIPPED ?1? could not import 'arrayquant_other_missing_module'*",
            "FAILED test_required.py::test_missing - Failed: ARRAYQUANT_REQUIRE names*",
        ]
    )
    assert "During handling" not in result.stdout.str()  # the failure alone, not the skip it replaced


def test_without_require_it_skips(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_required=REQUIRE_TESTS)
    result = _run_required(pytester, monkeypatch, None)
    result.assert_outcomes(passed=1, skipped=3)
    assert "ARRAYQUANT_REQUIRE" not in result.stdout.str()


def test_empty_require_it_skips(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_required=REQUIRE_TESTS)
    result = _run_required(pytester, monkeypatch, " , ")  # empty entries name no group
    result.assert_outcomes(passed=1, skipped=3)


def test_required_module_missing_at_module_level_is_an_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_module_level=MODULE_LEVEL_TESTS)
    result = _run_required(pytester, monkeypatch, "nosuch")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*ARRAYQUANT_REQUIRE names 'nosuch', but 'arrayquant_no_such_module' is not usable*"])
    assert result.ret != 0

    monkeypatch.delenv("ARRAYQUANT_REQUIRE")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)


def test_unknown_group_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = _run_required(pytester, monkeypatch, "torch,pytorch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ARRAYQUANT_REQUIRE names unknown groups ?'pytorch'?; the groups are torch, jax,*"])


def test_importorskip_restored_after_the_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    before = pytest.importorskip
    pytester.makepyfile(test_required=REQUIRE_TESTS)
    _run_required(pytester, monkeypatch, "nosuch")
    assert pytest.importorskip is before


def test_the_groups_ci_requires() -> None:
    spec = importlib.util.spec_from_file_location("_arrayquant_root_conftest_groups", ROOT_CONFTEST)
    assert spec is not None
    assert spec.loader is not None
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    assert root.required_modules("") == {}
    assert root.required_modules("hf, burn") == {"transformers": "hf", "compressed_tensors": "hf", "cbor2": "burn"}
    everything = root.required_modules("torch,jax,hf,gguf,burn,numba,onnx")
    assert set(everything) == {
        "torch",
        "jax",
        "transformers",
        "compressed_tensors",
        "gguf",
        "cbor2",
        "numba",
        "onnx",
        "onnxruntime",
        "onnx_ir",
    }
    ci = (ROOT_CONFTEST.parent / "ci" / "test.sh").read_text(encoding="utf-8")
    assert "export ARRAYQUANT_REQUIRE=${ARRAYQUANT_REQUIRE-torch,jax,hf,gguf,burn,numba,onnx}" in ci
