"""`autoplan report` on a tiny-model compare folder and on one plan: the HTML is
self-contained (no URL outside itself), holds every plot as a decodable PNG, and in a real
headless Chromium (Debian's `chromium`) loads with no script error, decodes every plot and
screenshots as a non-blank page. Skipped with a reason where Chromium is absent."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.compare import CompareRequest, parse_entries, run_compare
from autoplan.errors import UserInputError
from autoplan.report import render_report, write_report
from autoplan.search import SearchRequest
from tests.unit._tiny import FAST, WORKLOAD, one_torch_thread, shared_dirs  # noqa: F401

matplotlib = pytest.importorskip("matplotlib", reason="autoplan[report] (matplotlib) not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed "
                                    "(apt-get install -y chromium)")


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder, cache = shared_dirs(tmp_path_factory)
    out = tmp_path_factory.mktemp("cmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOPLAN_CACHE", str(cache))
        base = SearchRequest(model=str(folder), budget="kl<=0.05", trials=40, workload=WORKLOAD,
                             **FAST)
        run_compare(CompareRequest(base, parse_entries("h100,xeon-8480"), out))
        yield out


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_compare_report_is_self_contained_with_every_plot(compare_dir: Path) -> None:
    page = render_report(compare_dir)
    plots = re.findall(r'data-plot="([a-z-]+)"', page)
    # the per-target bars, then per plan: Pareto front, choice map, cost breakdown
    assert plots == ["compare"] + ["pareto", "choice-map", "cost-breakdown"] * 2
    assert f"data-plots='{len(plots)}'" in page
    assert not re.search(r"(src|href)=[\"'](?!data:)", page)  # nothing loaded from elsewhere
    assert "http://" not in page and "https://" not in page
    from matplotlib.image import imread

    for png in _pngs(page):
        img = imread(io.BytesIO(png))
        assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0.01


def test_not_accelerated_is_a_summary_with_the_list_behind_it(compare_dir: Path) -> None:
    """Each row's refused formats: one line by family, every format and its reason in a
    details element (it listed up to 30 names in the cell)."""
    import json

    from autoplan.runtimes import summarize_refused

    page = render_report(compare_dir)
    rows = json.loads((compare_dir / "compare.json").read_text())["rows"]
    xeon = next(r for r in rows if r["target"] == "xeon-8480")
    summary = summarize_refused(xeon["not_accelerated"])
    assert summary.startswith(f"{len(xeon['not_accelerated'])} formats: ")
    assert "FP8 (" in summary  # what ONNX Runtime cannot accelerate, by family
    assert f"<details><summary>{summary}</summary>" in page
    for choice in xeon["not_accelerated"]:
        assert f"<li><code>{choice}</code>: " in page


def test_plan_report_and_cli(compare_dir: Path, tmp_path: Path) -> None:
    plan = next(compare_dir.glob("h100-sxm.*.json"))
    out = tmp_path / "plan.html"
    res = CliRunner().invoke(cli, ["report", str(plan), "--out", str(out)])
    assert res.exit_code == 0, res.output
    # the tiny model is no alias: its config is not found from the plan's model id alone
    assert re.findall(r'data-plot="([a-z-]+)"', out.read_text()) == ["pareto", "choice-map"]
    assert "pass --model" in out.read_text()
    model = __import__("json").loads((compare_dir / "compare.json").read_text())["model"]
    res = CliRunner().invoke(cli, ["report", str(plan), "--out", str(out), "--model", model])
    assert res.exit_code == 0, res.output
    assert re.findall(r'data-plot="([a-z-]+)"', out.read_text()) == [
        "pareto", "choice-map", "cost-breakdown"]
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "missing"), "--out", str(out)])
    assert res.exit_code == 2 and "does not exist" in res.output
    with pytest.raises(UserInputError, match="compare.json"):
        write_report(tmp_path, tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()


@needs_chromium
def test_report_renders_in_headless_chromium(compare_dir: Path, tmp_path: Path) -> None:
    page = write_report(compare_dir, tmp_path / "report.html")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--no-first-run", "--disable-extensions",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    body = re.search(r"<body([^>]*)>", dom).group(1)
    expected = re.search(r'data-plots="(\d+)"', body).group(1)
    assert int(expected) == 7
    assert f'data-plots-loaded="{expected}"' in body, body  # every PNG decoded
    assert "data-errors" not in body, body  # no script error
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    from matplotlib.image import imread

    img = imread(shot)
    assert img.shape[0] >= 2000 and img.shape[1] >= 1200
    # non-blank: plots put many non-white pixels on the page
    non_white = (img[..., :3] < 0.9).any(axis=-1).mean()
    assert non_white > 0.05, non_white


def test_a_local_plans_report_names_the_machine_it_was_searched_on(tmp_path: Path) -> None:
    from autoplan.plan.io import save_plan
    from tests.unit.test_plan_io import sample_plan

    plan = sample_plan()
    plan = plan.model_copy(update={"target": plan.target.model_copy(update={
        "name": "local", "machine": "AMD EPYC <7B13>, 2 cores, 2 threads"})})
    save_plan(plan, tmp_path / "plan.json")
    page = render_report(tmp_path / "plan.json")
    assert ("<h1>autoplan plan: tiny on local [AMD EPYC &lt;7B13&gt;, 2 cores, 2 threads]</h1>"
            in page)
