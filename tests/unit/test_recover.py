"""Recovery on the tiny in-process Llama: masks kept exactly, formats re-applied, KL to the
original lowered, seeded and resumable bit for bit, LoRA merged under the mask, divergence
stopped with one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.compress import CompressionSettings, collect_stats, compressed_copy, recompress_linear
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.models.graph import get_linear, set_module
from autoplan.prune import check_nm
from autoplan.quality.metrics import compare_pass, reference_pass
from autoplan.recover import RecoveryDiverged, RecoverySettings, recover
from autoplan.recover.checkpoint import STATE, TENSORS
from autoplan.recover.settings import RecoveryMethod
from autoplan.recover.weights import read_recovered, write_recovered
from tests.unit._tiny import one_torch_thread, tiny_llama  # noqa: F401

CHOICE = Choice.parse("2:4+fp8_e4m3")
SETTINGS = CompressionSettings("sparsegpt", "rtn")


@pytest.fixture(scope="module")
def setup():  # noqa: ANN201
    model = tiny_llama()
    names = [n for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    blocks = torch.randint(2, 256, (16, 32), generator=torch.Generator().manual_seed(0))
    stats = collect_stats(model, names, list(blocks[:4].split(2)))
    return model, names, blocks, stats


def _compressed(setup):  # noqa: ANN001, ANN202
    model, names, _, stats = setup
    return compressed_copy(model, {n: CHOICE for n in names}, stats, SETTINGS)


def _rs(**kw) -> RecoverySettings:  # noqa: ANN003
    return RecoverySettings(**({"steps": 12, "lr": 2e-3, "seq_len": 32, "batch": 2,
                                "checkpoint_every": 0} | kw))


def _requantized(setup, swapped, weights):  # noqa: ANN001, ANN202
    model, _, _, stats = setup
    out, _ = compressed_copy(model, {}, None, SETTINGS)
    sims = {}
    for name, w in weights.items():
        sims[name] = recompress_linear(get_linear(model, name), CHOICE, swapped[name].mask, w,
                                       stats[name], SETTINGS)
        set_module(out, name, sims[name])
    return out, sims


def test_distill_keeps_masks_requantizes_and_lowers_kl(setup) -> None:  # noqa: ANN001
    model, _, blocks, _ = setup
    compressed, swapped = _compressed(setup)
    masks = {n: s.mask.clone() for n, s in swapped.items()}
    ref = reference_pass(model, blocks)
    before = compare_pass(compressed, ref)[1]
    res = recover(compressed, model, swapped, blocks, _rs(), run_key="k")
    assert len(res.losses) == 12 and res.resumed_from == 0
    out, sims = _requantized(setup, swapped, res.weights)
    for name, sim in sims.items():
        assert torch.equal(sim.mask, masks[name]), name
        assert torch.all(res.weights[name][~masks[name]] == 0), name
        assert torch.all(sim.weight[~masks[name]] == 0), name
        check_nm(sim.mask, 2, 4)  # still 2:4
        assert sim.quantized.codes.dtype == torch.float8_e4m3fn  # the format re-applied
        # scales recomputed from the recovered weight, not the compressed one's
        assert not torch.equal(sim.quantized.scales["weight_scale"],
                               swapped[name].quantized.scales["weight_scale"])
    after = compare_pass(out, ref)[1]
    assert after < 0.9 * before, (before, after)


def test_seeded_and_resumed_bit_for_bit(setup, tmp_path: Path) -> None:  # noqa: ANN001
    model, _, blocks, _ = setup
    c1, s1 = _compressed(setup)
    full = recover(c1, model, s1, blocks, _rs(), run_key="k")

    class Stop(Exception):
        pass

    def stop_at(done: int, _total: int, _loss: float) -> None:
        if done == 7:
            raise Stop

    c2, s2 = _compressed(setup)
    with pytest.raises(Stop):
        recover(c2, model, s2, blocks, _rs(checkpoint_every=3), run_key="k",
                checkpoint_dir=tmp_path, on_step=stop_at)
    assert (tmp_path / STATE).is_file() and (tmp_path / TENSORS).is_file()
    c3, s3 = _compressed(setup)
    resumed = recover(c3, model, s3, blocks, _rs(checkpoint_every=3), run_key="k",
                      checkpoint_dir=tmp_path)
    assert resumed.resumed_from == 6
    assert resumed.losses == full.losses
    for name, w in full.weights.items():
        assert torch.equal(resumed.weights[name], w), name
    assert not (tmp_path / STATE).exists()  # a finished pass removes its checkpoint
    # another run's checkpoint is not resumed
    c4, s4 = _compressed(setup)
    with pytest.raises(Stop):
        recover(c4, model, s4, blocks, _rs(checkpoint_every=3), run_key="k",
                checkpoint_dir=tmp_path, on_step=stop_at)
    c5, s5 = _compressed(setup)
    other = recover(c5, model, s5, blocks, _rs(checkpoint_every=3), run_key="other",
                    checkpoint_dir=tmp_path)
    assert other.resumed_from == 0


def test_lora_merged_under_the_mask(setup) -> None:  # noqa: ANN001
    model, _, blocks, _ = setup
    compressed, swapped = _compressed(setup)
    masks = {n: s.mask.clone() for n, s in swapped.items()}
    res = recover(compressed, model, swapped, blocks, _rs(method="lora", rank=4), run_key="k")
    assert res.scaling == pytest.approx(2.0)  # alpha = 2 r
    assert res.adapter_model is not None
    for name, ad in res.adapters.items():
        assert ad["lora_A"].shape == (4, swapped[name].in_features)
        assert ad["lora_B"].shape == (swapped[name].out_features, 4)
        assert torch.all(res.weights[name][~masks[name]] == 0)
        assert bool((ad["lora_B"] != 0).any())  # the adapter trained
    _, sims = _requantized(setup, swapped, res.weights)
    for sim in sims.values():
        check_nm(sim.mask, 2, 4)


def test_diverging_pass_stops_with_one_line(setup, tmp_path: Path) -> None:  # noqa: ANN001
    model, _, blocks, _ = setup
    compressed, swapped = _compressed(setup)
    with pytest.raises(RecoveryDiverged) as err:
        recover(compressed, model, swapped, blocks, _rs(lr=0.9, steps=40, checkpoint_every=5),
                run_key="k", checkpoint_dir=tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "diverged at step" in msg and "--recover-lr" in msg
    assert not (tmp_path / STATE).exists()


def test_weights_file_round_trip_and_hash(tmp_path: Path) -> None:
    w = {"a.b": torch.randn(4, 8)}
    ad = {"a.b": {"lora_A": torch.randn(2, 8), "lora_B": torch.randn(4, 2)}}
    path = tmp_path / "p.recovered.safetensors"
    sha = write_recovered(path, w, ad, 2.0)
    back = read_recovered(path, sha)
    assert torch.equal(back.weights["a.b"], w["a.b"]) and back.scaling == 2.0
    assert torch.equal(back.adapters["a.b"]["lora_B"], ad["a.b"]["lora_B"])
    with pytest.raises(UserInputError, match="expects"):
        read_recovered(path, "0" * 64)
    with pytest.raises(UserInputError, match="not found"):
        read_recovered(tmp_path / "missing.safetensors", sha)


def test_settings_refuse_bad_values() -> None:
    with pytest.raises(UserInputError, match="--recover-steps"):
        RecoverySettings(steps=0)
    with pytest.raises(UserInputError, match="--recover-lr"):
        RecoverySettings(lr=float("nan"))
    with pytest.raises(UserInputError, match="recovery method"):
        RecoverySettings(method="sgd")
    assert RecoverySettings(method="lora").method is RecoveryMethod.LORA
    assert RecoverySettings().key() != RecoverySettings(steps=151).key()
    assert RecoverySettings().key() == RecoverySettings(checkpoint_every=1).key()


def test_straight_through_is_the_rounded_value_with_the_identity_gradient() -> None:
    from autoplan.recover.trainable import straight_through

    x = torch.randn(64, requires_grad=True)
    rounded = x.detach().to(torch.bfloat16).float()
    out = straight_through(x, rounded)
    assert torch.equal(out, rounded)  # exactly the format's value, not x + (r - x)
    (out * torch.arange(64.0)).sum().backward()
    assert torch.equal(x.grad, torch.arange(64.0))
    frozen = torch.randn(8)
    assert straight_through(frozen, frozen.round()) is not None
    assert not straight_through(frozen, frozen.round()).requires_grad
