"""`estimate --routing FILE`: an MoE's calibration routing from a plan or a profile, and the
one-line refusals of a file that cannot give it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.cost import resolve_config
from autoplan.cost.moe import Routing
from autoplan.cost.routing_file import read_routing
from autoplan.errors import UserInputError

HOT = [10_000, 10_000] + [0] * 6  # every token picks experts 0 and 1 (Mixtral: top-2 of 8)


def _profile(tmp_path: Path, counts: dict | None = None, tokens: int = 10_000) -> Path:
    spec = resolve_config("mixtral-8x7b")
    counts = {str(b): HOT for b in spec.moe.moe_blocks} if counts is None else counts
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 2, "model_hash": "x", "calib_hash": "y",
                                "tokens": tokens, "scores": {}, "routing": counts}))
    return path


def _plan(tmp_path: Path, routing: Routing | None) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema_version": 5, "decisions": {},
                                "routing": routing.to_json() if routing else None}))
    return path


def test_a_profile_and_a_plan_give_the_same_calibration_routing(tmp_path: Path) -> None:
    spec = resolve_config("mixtral-8x7b")
    from_profile = read_routing(spec, _profile(tmp_path))
    expected = Routing.from_counts(spec, {b: HOT for b in spec.moe.moe_blocks}, 10_000)
    assert from_profile == expected and from_profile.source.startswith("calibration routing")
    assert read_routing(spec, _plan(tmp_path, expected)) == expected


@pytest.mark.parametrize("case, message", [
    ("dense", "not a mixture-of-experts model; drop --routing"),
    ("missing", "no such file"),
    ("not json", "not readable JSON"),
    ("a list", "not a plan or profile"),
    ("dense plan", "the plan records no routing"),
    ("other model's plan", "its routing is for another model (2 blocks); mixtral-8x7b has 32 MoE "
                           "blocks of 8 experts"),
    ("another top_k's plan", "block 0's shares sum to 4, not mixtral-8x7b's top_k 2"),
    ("empty profile", "the profile records no routing"),
    ("other model's profile", "its routing is for another model"),
    ("wrong expert count", "do not match the model's 8 experts"),
    ("text counts", "block 0's routing counts must be whole numbers >= 0"),
    ("negative counts", "block 0's routing counts must be whole numbers >= 0"),
    ("boolean tokens", "its routing counts are malformed"),
    ("NaN shares", "block 0's routing shares must be numbers from 0 to 1"),
    ("negative shares", "block 0's routing shares must be numbers from 0 to 1"),
    ("boolean shares", "block 0's routing shares must be numbers from 0 to 1"),
    ("deep", "JSON nested too deeply"),
])
def test_a_file_that_cannot_give_the_routing_is_one_line(tmp_path: Path, case: str,
                                                          message: str) -> None:
    spec = resolve_config("llama-3.1-8b" if case == "dense" else "mixtral-8x7b")
    path = {
        "dense": lambda: _profile(tmp_path),
        "missing": lambda: tmp_path / "none.json",
        "not json": lambda: tmp_path / "bad.json",
        "a list": lambda: tmp_path / "list.json",
        "dense plan": lambda: _plan(tmp_path, None),
        "other model's plan": lambda: _plan(tmp_path, Routing({0: (0.25,) * 8, 1: (0.25,) * 8})),
        "another top_k's plan": lambda: _plan(tmp_path, Routing(
            {b: (0.5,) * 8 for b in spec.moe.moe_blocks})) if spec.moe else None,
        "empty profile": lambda: _profile(tmp_path, counts={}),
        "other model's profile": lambda: _profile(tmp_path, counts={"0": HOT}),
        "wrong expert count": lambda: _profile(tmp_path, counts={
            str(b): HOT[:4] for b in spec.moe.moe_blocks}) if spec.moe else None,
        "text counts": lambda: _profile(tmp_path, counts={
            str(b): ["a"] * 8 for b in spec.moe.moe_blocks}),
        "negative counts": lambda: _profile(tmp_path, counts={
            str(b): [-1, 3] + [0] * 6 for b in spec.moe.moe_blocks}),
        "boolean tokens": lambda: _profile(tmp_path, tokens=True),
        "NaN shares": lambda: _plan(tmp_path, Routing(
            {b: (float("nan"),) * 8 for b in spec.moe.moe_blocks})),
        "negative shares": lambda: _plan(tmp_path, Routing(
            {b: (-1.0, 3.0) + (0.0,) * 6 for b in spec.moe.moe_blocks})),
        "boolean shares": lambda: _plan(tmp_path, Routing(
            {b: (True, True) + (False,) * 6 for b in spec.moe.moe_blocks})),
        "deep": lambda: tmp_path / "deep.json",
    }[case]()
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserInputError) as err:
        read_routing(spec, path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_estimate_prices_decode_at_the_routing_it_is_given(tmp_path: Path) -> None:
    """Two hot experts of eight: a batch of 64 reads about 2 experts per block instead of 8,
    so decode is faster; memory (every expert) is the same. Without --routing the routing
    is uniform, and the output says so."""
    args = ["estimate", "--model", "mixtral-8x7b", "--target", "h200", "--precision", "fp8",
            "--batch", "64", "--json"]
    even = CliRunner().invoke(cli, args)
    hot = CliRunner().invoke(cli, [*args, "--routing", str(_profile(tmp_path))])
    assert even.exit_code == 0 and hot.exit_code == 0, even.output + hot.output
    even_doc, hot_doc = json.loads(even.stdout), json.loads(hot.stdout)
    assert even_doc["routing"] == "uniform"
    assert hot_doc["routing"] == "calibration routing (10000 tokens)"
    tpot = {side: doc["candidate"]["metrics"]["tpot_s"]
            for side, doc in (("even", even_doc), ("hot", hot_doc))}
    assert tpot["hot"] < 0.8 * tpot["even"]
    assert hot_doc["candidate"]["memory"] == even_doc["candidate"]["memory"]
    table = CliRunner().invoke(cli, args[:-1])
    assert "expert routing: uniform (top_k / E per expert" in table.stdout


def test_estimate_refuses_a_routing_file_for_a_dense_model_in_one_line(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["estimate", "--model", "llama-3.1-8b", "--target", "h100",
                                   "--routing", str(_profile(tmp_path))])
    assert out.exit_code != 0
    assert "not a mixture-of-experts model; drop --routing" in out.output
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1
