"""Config fields (autoplan/config_fields.py): each rule names its field, and a fuzz over every
numeric field of the tiny Llama's config (and every registered field) feeds boundary and
random values to `estimate`, `profile --dry-run` and the loaders: each answers, or refuses in
one line with exit 1/2, never a traceback."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.config_fields import (MOE, CrossRule, Field, FieldSet, check_config,
                                    field_sets, numeric_fields, register_field_set)
from autoplan.errors import AutoplanError, ModelConfigError
from autoplan.modelspec import ModelSpec
from tests.unit._tiny import one_torch_thread, shared_dirs  # noqa: F401 - fixture

_CFG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0}


@pytest.mark.parametrize(("change", "needle"), [
    ({"num_attention_heads": 0}, "num_attention_heads must be an integer from 1"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be an integer from 1"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    ({"head_dim": -16}, "head_dim must be an integer from 1"),
    ({"hidden_size": 66}, "hidden_size 66 is not divisible by num_attention_heads 4"),
    ({"hidden_size": 64.5}, "hidden_size must be an integer"),
    ({"hidden_size": True}, "hidden_size must be an integer, got True"),
    ({"hidden_size": "64"}, "hidden_size must be an integer, got '64'"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be an integer from 1"),
    ({"vocab_size": 2**40}, "vocab_size must be an integer from 1 to 16,777,216"),
    ({"intermediate_size": None}, "lacks required key 'intermediate_size'"),
    ({"rope_theta": 0.0}, "rope_theta must be a number > 0"),
    ({"rope_theta": math.inf}, "rope_theta must be a finite number"),
    ({"rms_norm_eps": math.nan}, "rms_norm_eps must be a finite number"),
    ({"head_dim": 15}, "rotary dimension (head_dim 15 x 1 = 15) must be an even number"),
    ({"partial_rotary_factor": 0.01}, "rotary dimension"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1}},
     "rope_parameters.rope_theta must be a number > 0"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling.factor"),
    ({"final_logit_softcapping": 0.0}, "final_logit_softcapping must be a number > 0"),
    ({"sliding_window": -1}, "sliding_window must be an integer from 0"),
])
def test_each_rule_names_its_field(change, needle):
    cfg = {**_CFG, **change}
    if change.get("intermediate_size", 0) is None:
        cfg.pop("intermediate_size")
    with pytest.raises(ModelConfigError, match=None) as info:
        ModelSpec.from_config(cfg)
    assert needle in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_null_optional_fields_are_absent():
    spec = ModelSpec.from_config({**_CFG, "head_dim": None, "num_key_value_heads": None,
                                  "sliding_window": None})
    assert (spec.head_dim, spec.n_kv_heads) == (16, 4)


def test_moe_fields_use_the_same_mechanism():
    """Routing fields are a registered set: checked whenever a config carries experts."""
    assert MOE in field_sets()
    moe = {**_CFG, "model_type": "qwen3_moe", "num_experts": 8, "moe_intermediate_size": 32}
    for change, needle in (({"num_experts_per_tok": 0}, "num_experts_per_tok must be"),
                           ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 is more than"),
                           ({"moe_intermediate_size": -1}, "moe_intermediate_size must be"),
                           ({"num_experts": 0}, "num_experts must be")):
        with pytest.raises(ModelConfigError, match=needle):
            check_config({**moe, **change})
    check_config({**moe, "num_experts_per_tok": 2})  # sound routing passes


def test_a_registered_set_is_checked():
    fields = FieldSet("test set", (Field("widgets", "counted"),),
                      (CrossRule("never", lambda cfg: "widgets clash" if cfg.get("widgets") == 3
                                 else None),), applies=lambda cfg: "widgets" in cfg)
    register_field_set(fields)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_field_set(fields)
        with pytest.raises(ModelConfigError, match="widgets must be an integer"):
            check_config({**_CFG, "widgets": 0})
        with pytest.raises(ModelConfigError, match="widgets clash"):
            check_config({**_CFG, "widgets": 3})
        check_config(_CFG)
    finally:
        import autoplan.config_fields as cf
        cf._SETS.remove(fields)


# ---- the fuzz ---------------------------------------------------------------------------
_BOUNDARY = (0, -1, 1, 2, 3, 2**31, 2**63, 1e308, math.nan, math.inf, -math.inf, 0.5, True,
             "12", [4], None)


def _numeric_keys(cfg: dict) -> list[str]:
    own = [k for k, v in cfg.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sorted(set(own) | {f.key for f in numeric_fields()})


def _cases(cfg: dict, seed: int, n_random: int) -> list[tuple[str, object]]:
    rng = random.Random(seed)
    cases = []
    for key in _numeric_keys(cfg):
        cases += [(key, v) for v in _BOUNDARY]
        cases += [(key, rng.choice([rng.randint(-2**20, 2**20), rng.randint(1, 512),
                                    rng.uniform(-1e6, 1e6), 10 ** rng.uniform(-8, 30)]))
                  for _ in range(n_random)]
    return cases


def _clean(result, what: str) -> None:
    assert result.exit_code in (0, 1, 2), f"{what}: exit {result.exit_code}\n{result.output}"
    assert isinstance(result.exception, (SystemExit, type(None))), (
        f"{what}: uncaught {type(result.exception).__name__}: {result.exception}")
    assert "Traceback" not in result.output, what
    if result.exit_code:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), (what, lines)


def _write(folder: Path, cfg: dict, key: str, value: object) -> dict:
    changed = dict(cfg)
    if value is None:
        changed.pop(key, None)
    else:
        changed[key] = value
    (folder / "config.json").write_text(json.dumps(changed))
    return changed


def test_fuzz_estimate_and_dry_run_answer_or_refuse_in_one_line(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    runner = CliRunner()
    for key, value in _cases(_CFG, seed=29, n_random=4):
        _write(folder, _CFG, key, value)
        what = f"{key}={value!r}"
        for args in (["estimate", "--model", str(folder), "--target", "h100"],
                     ["profile", "--model", str(folder), "--dry-run"]):
            _clean(runner.invoke(cli, args), f"{args[0]} {what}")


def test_fuzz_the_loaders_answer_or_refuse_in_one_line(tmp_path_factory):
    """The loaders on the tiny model's weights under a lying config: every size that
    disagrees with the checkpoint is refused from the headers (transformers would
    re-initialize those tensors, or add random blocks), the rest loads."""
    from autoplan.models.loader import check_loadable, load_model, load_spec, open_checkpoint

    tiny, _cache = shared_dirs(tmp_path_factory)
    cfg = json.loads((tiny / "config.json").read_text())
    folder = tmp_path_factory.mktemp("lying") / "m"
    shutil.copytree(tiny, folder)
    loaded = refused = 0
    for key, value in _cases(cfg, seed=26, n_random=2):
        changed = _write(folder, cfg, key, value)
        what = f"{key}={value!r}"
        try:
            check_loadable(str(folder))
            load_spec(str(folder))
            open_checkpoint(str(folder))
            model = load_model(str(folder)).model
        except AutoplanError as exc:
            assert "\n" not in str(exc), (what, str(exc))
            refused += 1
            continue
        # what loaded is the checkpoint as stored: the config's sizes are the tensors'
        assert model.config.hidden_size == cfg["hidden_size"], what
        assert model.config.num_hidden_layers == cfg["num_hidden_layers"], what
        assert changed.get("vocab_size") in (None, cfg["vocab_size"]), what
        loaded += 1
    assert loaded and refused


def test_a_lying_config_is_refused_before_loading(tmp_path_factory):
    from autoplan.models.loader import check_loadable

    tiny, _cache = shared_dirs(tmp_path_factory)
    cfg = json.loads((tiny / "config.json").read_text())
    root = tmp_path_factory.mktemp("lies")
    for change, needle in (({"num_hidden_layers": 3}, "describes 3 blocks"),
                           ({"num_hidden_layers": 1}, "the checkpoint has 2 blocks"),
                           ({"intermediate_size": 96}, "[intermediate_size, hidden_size]"),
                           ({"vocab_size": 300}, "[vocab_size, hidden_size]"),
                           ({"num_key_value_heads": 4}, "num_key_value_heads x head_dim")):
        folder = root / "-".join(f"{k}{v}" for k, v in change.items())
        shutil.copytree(tiny, folder)
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(AutoplanError) as info:
            check_loadable(str(folder))
        assert needle in str(info.value), str(info.value)
