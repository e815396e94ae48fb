"""The cost model against published measurements (autoplan/data/measurements.toml)."""

from __future__ import annotations

from autoplan.cost.validate import load_measurements, validate


def test_measurements_are_complete() -> None:
    points = load_measurements()
    assert len(points) >= 15
    for p in points:
        assert p["source"] and p["published"] > 0 and p["metric"]
        assert p["candidate"]["target"] and p["baseline"]["target"]


def test_mape_within_bound() -> None:
    report = validate()
    evaluated = [p for p in report.points if p.predicted is not None]
    assert len(evaluated) >= 15
    assert report.mape <= 0.25, report.to_json()
