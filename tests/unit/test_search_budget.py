"""QualityBudget: the three written forms, one-line errors, badness and pass/fail."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autoplan.errors import UserInputError
from autoplan.quality.evaluator import QualityResult
from autoplan.search import QualityBudget


def _q(*, kl: float = 0.0, ppl: float = 10.0, ppl_ref: float = 10.0,
       suite: float | None = None, suite_ref: float | None = None) -> QualityResult:
    return QualityResult(ppl=ppl, ppl_ref=ppl_ref, kl=kl, n_tokens=100, seconds=0.0,
                         suite_score=suite, suite_score_ref=suite_ref)


@pytest.fixture
def suite_file(tmp_path: Path) -> Path:
    path = tmp_path / "suite.jsonl"
    path.write_text('{"prompt": "2+2=", "reference": "4"}\n')
    return path


@pytest.mark.parametrize(("text", "limit"), [("kl<=0.05", 0.05), ("KL <= 0.05", 0.05),
                                             ("kl<=.01", 0.01), ("kl<=5e-3", 0.005),
                                             ("  kl<=1e-7 ", 1e-7)])
def test_kl_forms(text: str, limit: float) -> None:
    b = QualityBudget.parse(text)
    assert (b.metric, b.relative, b.suite_file) == ("kl", False, None)
    assert b.limit == pytest.approx(limit)
    assert b.text == text.strip()
    assert b.prior_slope == 1.5


@pytest.mark.parametrize(("text", "limit", "relative"), [
    ("ppl<=+2%", math.log1p(0.02), True), ("ppl<=2%", math.log1p(0.02), True),
    ("ppl <= +50 %", math.log1p(0.5), True), ("ppl<=+0.5", 0.5, False), ("PPL<=1", 1.0, False)])
def test_ppl_forms(text: str, limit: float, relative: bool) -> None:
    b = QualityBudget.parse(text)
    assert (b.metric, b.relative) == ("ppl", relative)
    assert b.limit == pytest.approx(limit)
    assert b.prior_slope == (1.5 if relative else 10.0)


def test_suite_form(suite_file: Path) -> None:
    b = QualityBudget.parse(f"suite:{suite_file}>=-1.5")
    assert (b.metric, b.limit, b.suite_file) == ("suite", 1.5, suite_file)
    assert QualityBudget.parse(f"suite:{suite_file} >= 0").limit == 0.0


@pytest.mark.parametrize("text", ["kl<0.05", "kl<=", "kl<=-0.1", "kl>=0.05", "ppl<=+2%%",
                                  "ppl<=-2%", "accuracy>=0.9", "", "kl<=0.05 and ppl<=+1%",
                                  "suite:>=-1"])
def test_bad_forms_are_one_line_user_errors(text: str) -> None:
    with pytest.raises(UserInputError) as err:
        QualityBudget.parse(text)
    msg = str(err.value)
    assert "\n" not in msg
    if not text.startswith("suite:"):
        assert "kl<=0.05" in msg and "ppl<=+2%" in msg and "suite:FILE>=-1.5" in msg


def test_missing_suite_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(UserInputError, match="not found") as err:
        QualityBudget.parse(f"suite:{missing}>=-1.5")
    assert str(missing) in str(err.value) and "\n" not in str(err.value)


def test_positive_suite_points_rejected(suite_file: Path) -> None:
    with pytest.raises(UserInputError, match=r"maximum drop.*>=-1\.5") as err:
        QualityBudget.parse(f"suite:{suite_file}>=1.5")
    assert "\n" not in str(err.value)


def test_kl_badness_and_passes() -> None:
    b = QualityBudget.parse("kl<=0.05")
    assert b.badness(_q(kl=0.03)) == 0.03
    assert b.passes(_q(kl=0.05)) and b.passes(_q(kl=0.0))
    assert not b.passes(_q(kl=0.0501))


def test_relative_ppl_badness_and_passes() -> None:
    b = QualityBudget.parse("ppl<=+2%")
    assert b.badness(_q(ppl=10.0, ppl_ref=10.0)) == 0.0
    assert b.badness(_q(ppl=11.0, ppl_ref=10.0)) == pytest.approx(math.log(1.1))
    assert b.passes(_q(ppl=10.19, ppl_ref=10.0))
    assert not b.passes(_q(ppl=10.21, ppl_ref=10.0))
    assert b.passes(_q(ppl=9.0, ppl_ref=10.0))  # better than the original passes


def test_absolute_ppl_badness_and_passes() -> None:
    b = QualityBudget.parse("ppl<=+0.5")
    assert b.badness(_q(ppl=20.3, ppl_ref=20.0)) == pytest.approx(0.3)
    assert b.passes(_q(ppl=20.49, ppl_ref=20.0))
    assert not b.passes(_q(ppl=20.51, ppl_ref=20.0))


def test_suite_badness_and_passes(suite_file: Path) -> None:
    b = QualityBudget.parse(f"suite:{suite_file}>=-1.5")
    assert b.badness(_q(suite=78.0, suite_ref=80.0)) == pytest.approx(2.0)
    assert not b.passes(_q(suite=78.0, suite_ref=80.0))
    assert b.passes(_q(suite=79.0, suite_ref=80.0))
    assert b.passes(_q(suite=81.0, suite_ref=80.0))
    with pytest.raises(UserInputError, match="suite"):
        b.badness(_q())  # no suite scores measured
