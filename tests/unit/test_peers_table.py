"""The pure parts of benchmarks/peers.py: KL budgets from a peer's KL, peer-vs-autoplan pairs and
the table docs/peers.md is generated from (no engine, no model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from peers_table import (error_lines, floor_budget, goals_summary, pair,  # noqa: E402
                         section_markdown)


def test_floor_budget_never_exceeds_the_peers_kl() -> None:
    assert floor_budget(0.087149) == 0.0871
    assert floor_budget(0.0063) == 0.0063
    assert floor_budget(1.2345) == 1.23
    for kl in (0.00012345, 0.0099999, 0.5, 3.14159):
        assert floor_budget(kl) <= kl
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            floor_budget(bad)


def _row(name: str, tok_s: float, kl: float, **kw) -> dict:
    return {"name": name, "decode_tok_s": tok_s, "kl": kl, "command": f"run {name}", **kw}


def test_pair_meets_the_goal_only_at_equal_or_better_kl() -> None:
    peer = _row("q4_k_m", 100.0, 0.08, file_mb=110.0, linear_bits=5.5)
    good = pair(peer, _row("plan", 115.0, 0.05, file_mb=95.0, linear_bits=5.0), 1.1)
    assert good["met"] and good["why"] is None
    assert good["ratio"] == pytest.approx(1.15)
    assert good["peer_file_mb"] == 110.0 and good["autoplan_linear_bits"] == 5.0

    slow = pair(peer, _row("plan", 105.0, 0.05), 1.1)
    assert not slow["met"] and "short of the 1.10x goal" in slow["why"]

    worse = pair(peer, _row("plan", 150.0, 0.09), 1.1)
    assert not worse["met"] and "not equal quality" in worse["why"]
    assert not worse["kl_equal_or_better"]


def test_pair_on_another_metric_keeps_its_label() -> None:
    peer = {"name": "modelopt-e5", "tokens_per_s": 1000.0, "kl": 0.02, "speed_kind": "predicted"}
    ours = {"name": "autoplan", "tokens_per_s": 1200.0, "kl": 0.019}
    p = pair(peer, ours, 1.15, metric="tokens_per_s", label="tokens/s, batch 32")
    assert p["met"] and p["metric"] == "tokens/s, batch 32" and p["speed_kind"] == "predicted"


def test_section_markdown_shows_pairs_errors_and_commands() -> None:
    peer = _row("q6_k", 90.0, 0.0128, file_mb=161.0, linear_bits=8.3)
    ours = _row("autoplan-kl0.0128", 100.0, 0.004, file_mb=94.0, linear_bits=5.0)
    doc = {"command": "python benchmarks/peers.py llamacpp", "machine": {"cpu": "AMD EPYC"},
           "pairs": [pair(peer, ours, 1.1)],
           "errors": [{"peer": "AMD Quark", "error": "ImportError: no | module"}]}
    text = "\n".join(section_markdown("llamacpp", doc))
    assert "| q6_k | autoplan-kl0.0128 |" in text and "1.11x" in text
    assert "`run q6_k`" in text and "`run autoplan-kl0.0128`" in text
    assert "AMD Quark: not runnable here" in text and "no \\| module" in text
    # every table row has the header's number of cells
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len({line.count(" | ") for line in table}) == 1
    json.dumps(doc)  # results stay plain JSON


def test_empty_sections_and_summary_say_what_is_missing() -> None:
    assert "not been run" in "\n".join(section_markdown("quark", {}))
    lines = goals_summary({"nncf": {}, "quark": {"errors": [{"peer": "q", "error": "e"}]},
                           "llamacpp": {"pairs": [pair(_row("a", 100, 0.1), _row("b", 120, 0.1),
                                                       1.1)]}})
    assert lines == ["- nncf: not measured", "- quark: peer not runnable",
                     "- llamacpp: 1 of 1 pairs meet the goal; lowest ratio 1.20x (a vs b)"]
    stopped = goals_summary({"nncf": {"rows": [_row("r", 1, 0.1)], "errors": [
        {"peer": "nncf (whole section)", "error": "NotFinished: stopped"}]}})
    assert stopped[0].startswith("- nncf: 1 rows measured, none paired")
    assert "not runnable" not in stopped[0]
    early = goals_summary({"autoround": {"errors": [
        {"peer": "autoround (whole section)", "error": "NotFinished: stopped by SIGTERM"}]}})
    assert early == ["- autoround: not finished here (stopped before any row; its line below "
                     "says why)"]
    assert error_lines([{"peer": "p", "error": "e", "command": "c"}]) == [
        "- **p: not runnable here.** `e` (command: `c`)"]


def test_a_stopped_section_is_one_row_that_says_so(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import peers

    stopped = peers.not_finished("nncf", "stopped by SIGTERM", "timing 4 sides", 1500.0,
                                 "python benchmarks/peers.py nncf")
    (row,) = stopped["errors"]
    assert stopped["finished"] is False and not stopped["pairs"]
    assert "not finished here: stopped by SIGTERM after 25 min" in row["error"]
    assert "'timing 4 sides'" in row["error"] and row["command"].endswith("peers.py nncf")
    assert "nncf (whole section): not finished here" in "\n".join(
        section_markdown("nncf", stopped))

    # a stop during a run: the section's own handler-free code is interrupted, one row written
    def section_run(args, log):  # noqa: ANN001, ANN202
        log("searching kl<=0.05")
        raise peers.NotFinished("stopped by SIGTERM")

    monkeypatch.setattr(peers, "_section", lambda name: type("S", (), {"run": staticmethod(
        section_run)}))
    monkeypatch.setattr(peers, "start_run", lambda seed, argv: ({"cpu": "x"}, "cmd"))
    out = tmp_path / "peers_quark.json"
    assert peers.main(["quark", "--out", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert "while 'searching kl<=0.05'" in doc["errors"][0]["error"]

    # an earlier finished run is kept; the stop is added to its errors
    pairs = [pair(_row("a", 100, 0.1), _row("b", 120, 0.1), 1.1)]
    out.write_text(json.dumps({"pairs": pairs, "errors": []}))
    assert peers.main(["quark", "--out", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["pairs"] == pairs and "not finished here" in doc["errors"][0]["error"]


def test_rows_without_their_pair_are_listed_not_dropped() -> None:
    peer = _row("q4_k_m", 100.0, 0.06, file_mb=100.6, linear_bits=5.53)
    ours = _row("autoplan-kl0.06", 120.0, 0.05, file_mb=94.0, linear_bits=5.0)
    halfway = {"rows": [peer, ours, {"name": "q6_k", "side": "peer", "kl": 0.013,
                                     "file_mb": 132.0, "linear_bits": 8.02, "command": "q"}],
               "pairs": [pair(peer, ours, 1.1)]}
    text = "\n".join(section_markdown("llamacpp", halfway))
    assert "| q6_k | peer |" in text and "not measured (stopped before timing)" in text
    assert text.count("| q4_k_m |") == 1  # the paired row is in the pairs table only
    gpu = {"rows": [{"name": "modelopt-e7", "side": "peer", "workload": w, "kl": 0.2,
                     "tokens_per_s": 900.0, "effective_bits": 7.0} for w in ("1", "32")]}
    gpu["rows"].append({"name": "autoplan-b1", "side": "autoplan", "workload": "1", "kl": 0.19,
                        "tokens_per_s": 1200.0})
    gpu["pairs"] = [pair(gpu["rows"][0], gpu["rows"][2], 1.15, metric="tokens_per_s")]
    text = "\n".join(section_markdown("modelopt", gpu))
    assert "| modelopt-e7 | peer | 32 | 7.00 effective bits |" in text
    assert "| modelopt-e7 | peer | 1 |" not in text
