"""Streamed (block-by-block) execution equals the in-memory one on tiny Llamas: profile
scores, KL and perplexity, the shared cache; device and execution choice; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.compress import CompressionSettings, collect_stats, compressed_copy
from autoplan.errors import AutoplanError, UserInputError
from autoplan.formats import Choice
from autoplan.modelspec import ModelSpec
from autoplan.quality.evaluator import QualityEvaluator
from autoplan.quality.text import load_text_dataset
from autoplan.search import build_space
from autoplan.sensitivity import build_profile, profile as profile_mod
from autoplan.streaming import ExecutionSettings, open_model, resolve_device
from autoplan.streaming import estimate
from autoplan.streaming.evaluate import StreamedEvaluator
from autoplan.streaming.profile import build_profile_streamed
from autoplan.streaming.skeleton import StreamedModel
from autoplan.targets import get_target
from tests.unit._tiny import one_torch_thread, tiny_config, tiny_llama, tiny_spec  # noqa: F401
from tests.unit.tiny_llama import tiny_tokenizer

CPU = torch.device("cpu")


def _folder(path: Path, tied: bool) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    if tied:
        torch.manual_seed(1)
        cfg = LlamaConfig(**{k: v for k, v in tiny_config().items()
                             if k not in ("model_type", "tie_word_embeddings")},
                          tie_word_embeddings=True, max_position_embeddings=256,
                          initializer_range=0.15, eos_token_id=1, bos_token_id=1, pad_token_id=0)
        model = LlamaForCausalLM(cfg).eval()
    else:
        model = tiny_llama()
    model.to(torch.bfloat16).save_pretrained(path)  # a bf16 checkpoint, as users have them
    tiny_tokenizer().save_pretrained(path)
    return path


class Case:
    def __init__(self, root: Path, tied: bool) -> None:
        from transformers import AutoModelForCausalLM

        self.folder = _folder(root / "model", tied)
        self.root = root
        self.memory = AutoModelForCausalLM.from_pretrained(self.folder, dtype=torch.float32).eval()
        self.streamed = StreamedModel(self.folder, device=CPU)
        data = load_text_dataset(None, tokenizer=tiny_tokenizer(), seq_len=64, n_calib=4,
                                 n_eval=3, seed=0)
        self.data = data
        self.calib = list(data.calib.split(2))
        self.space = build_space(ModelSpec.from_path(self.folder), get_target("h100-sxm"),
                                 "tensorrt-llm")
        # the space protects lm_head; profile it anyway so the head step is checked too
        self.layers = [la.name for u in self.space.units for la in u.layers] + ["lm_head"]
        self.choices = [c for c in self.space.all_choices if c != self.space.baseline]

    def profile(self, streamed: bool, cache: str, settings=CompressionSettings(), **kw):  # noqa: ANN001, ANN003, ANN201, B008
        args = dict(model_hash="tiny", calib_hash="c", settings=settings,
                    cache_dir=self.root / cache, seed=0, **kw)
        if streamed:
            return build_profile_streamed(self.streamed, self.layers, self.choices, self.calib,
                                          **args)
        return build_profile(self.memory, self.layers, self.choices, self.calib, **args)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    return Case(tmp_path_factory.mktemp("stream"), request.param)


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def test_streamed_profile_equals_in_memory(case: Case) -> None:
    mem = case.profile(False, "mem")
    st = case.profile(True, "st")
    assert st.tokens == mem.tokens == 4 * 64
    assert set(st.scores) == set(mem.scores) == set(case.layers)
    assert "lm_head" in st.scores  # the head is profiled from the head step
    for layer in case.layers:
        for key, ref in mem.scores[layer].items():
            assert _close(st.scores[layer][key], ref, 1e-5), (layer, key)
        assert _close(st.outliers[layer], mem.outliers[layer], 1e-5)
    assert max(v for s in st.scores.values() for v in s.values()) > 0


def test_streamed_profile_uses_and_resumes_the_same_cache(case: Case, monkeypatch) -> None:  # noqa: ANN001
    mem = case.profile(False, "shared")
    # the streamed run finds everything cached: it computes nothing
    monkeypatch.setattr(profile_mod, "score_task", lambda _t: pytest.fail("recomputed"))
    again = case.profile(True, "shared")
    assert again.scores == mem.scores


def test_boundary_states_on_disk_give_the_same_profile(case: Case, tmp_path: Path) -> None:
    on_disk = case.profile(True, "disk", offload_dir=tmp_path)
    in_ram = case.profile(True, "st2")
    assert on_disk.scores == in_ram.scores
    assert not list(tmp_path.iterdir())  # the state files are removed


@pytest.mark.parametrize("settings", [CompressionSettings(),
                                      CompressionSettings("sparsegpt", "gptq")],
                         ids=["wanda-rtn", "sparsegpt-gptq"])
def test_streamed_kl_equals_in_memory(case: Case, settings: CompressionSettings) -> None:
    base = case.space.baseline
    sparse, int4 = Choice.parse("2:4+bf16"), Choice.parse("dense+int4_g64")
    names = case.layers
    decisions = {n: (sparse if i % 3 == 0 else int4 if i % 3 == 1 else base)
                 for i, n in enumerate(names)}
    stats = collect_stats(case.memory, names, case.calib)
    ref = QualityEvaluator(case.memory, case.data.eval)
    compressed, _ = compressed_copy(case.memory, decisions, stats, settings, baseline=base)
    want = ref.evaluate(compressed)
    sev = StreamedEvaluator(case.streamed, case.data.eval, calib_batches=case.calib)
    assert _close(sev.ppl_ref, ref.ppl_ref, 1e-6)
    got, audit = sev.evaluate_decisions(decisions, settings, baseline=base, needs_stats=True)
    assert want.kl > 1e-4  # the decisions change the model measurably
    assert _close(got.kl, want.kl, 1e-4)
    assert _close(got.ppl, want.ppl, 1e-6)
    assert set(audit) == {n for n, c in decisions.items() if c != base}
    same, _ = sev.evaluate_decisions({}, settings)
    assert same.kl == 0.0


def test_candidates_measured_together_equal_each_measured_alone(case: Case) -> None:
    """evaluate_many shares block reads, Hessians and identical compressed layers between
    candidates: each result and audit equals that candidate measured on its own."""
    from autoplan.streaming.evaluate import StreamedCandidate

    base, settings = case.space.baseline, CompressionSettings("sparsegpt", "gptq")
    sparse, int4 = Choice.parse("2:4+bf16"), Choice.parse("dense+int4_g64")
    a = {n: (sparse if i % 2 else int4) for i, n in enumerate(case.layers)}
    b = {n: (int4 if i % 3 else base) for i, n in enumerate(case.layers)}  # shares int4 layers
    c = {n: int4 for n in case.layers}
    sev = StreamedEvaluator(case.streamed, case.data.eval, calib_batches=case.calib)
    cands = [StreamedCandidate(x, True) for x in (a, b, c)]
    together = sev.evaluate_many(cands, settings, baseline=base)
    alone = [sev.evaluate_decisions(x.decisions, settings, baseline=base, needs_stats=True)
             for x in cands]
    for (q1, audit1), (q2, audit2) in zip(together, alone):
        assert (q1.kl, q1.ppl) == (q2.kl, q2.ppl)
        assert audit1 == audit2
    assert len({q.kl for q, _ in together}) == 3  # three different models
    shared = [n for n in case.layers if b[n] == int4]
    assert shared and all(together[1][1][n] == together[2][1][n] for n in shared)


def test_streamed_model_keeps_one_block_resident(case: Case) -> None:
    sm = case.streamed
    on_meta = lambda i: all(p.device.type == "meta" for p in sm.blocks[i].parameters())  # noqa: E731
    assert on_meta(0) and on_meta(1)
    with sm.resident(1):
        assert on_meta(0) and not on_meta(1)
    assert on_meta(1)
    # embedding and lm_head are read from disk only while a pass holds them
    embed = lambda: sm.model.get_input_embeddings().weight  # noqa: E731
    assert embed().device.type == "meta" and sm.head.weight.device.type == "meta"
    with sm.head_resident():
        assert sm.head.weight.device.type == "cpu"
        with sm.embeddings():
            assert embed().device.type == "cpu"
            assert (sm.head.weight is embed()) == sm.tied
        assert sm.head.weight.device.type == "cpu"  # still held by the outer pass
        assert (embed().device.type == "meta") != sm.tied  # tied: the head holds it
    assert embed().device.type == "meta" and sm.head.weight.device.type == "meta"
    assert sm.model.base_model.norm.weight.device.type == "cpu"  # small: always resident


def test_auto_execution_follows_the_memory_estimate(case: Case, monkeypatch) -> None:  # noqa: ANN001
    from autoplan.streaming import runner

    assert open_model(str(case.folder)).execution == "memory"
    monkeypatch.setattr(runner, "host_memory", lambda: 10 * 2**20)  # 10 MiB free
    r = open_model(str(case.folder))
    assert r.execution == "stream" and isinstance(r.loaded.model, StreamedModel)


def test_auto_keeps_in_memory_what_cannot_stream_whenever_it_fits(case: Case) -> None:  # noqa: ANN001
    """--recover (or a gate) cannot stream: auto picks memory up to 90 % of the free RAM
    instead of the comfortable 25 %, and still streams (so the caller refuses) beyond it."""
    spec = open_model(str(case.folder)).loaded.spec
    need = estimate.plan(spec, "memory", "cpu").host
    assert estimate.choose(spec, "cpu", 2 * need, None)[0] == "stream"
    chosen, why = estimate.choose(spec, "cpu", 2 * need, None, needs_memory="--recover")
    assert chosen == "memory" and why.endswith("in memory for --recover")
    assert estimate.choose(spec, "cpu", need, None, needs_memory="--recover")[0] == "stream"


def test_out_of_memory_names_the_fix_and_leaves_a_valid_cache(case: Case, monkeypatch) -> None:  # noqa: ANN001
    r = open_model(str(case.folder), ExecutionSettings(execution="stream"))
    real, calls = profile_mod.score_task, []

    def flaky(task):  # noqa: ANN001, ANN202
        calls.append(task.layer)
        if len(calls) == 3:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(task)

    monkeypatch.setattr(profile_mod, "score_task", flaky)
    cache = case.root / "oom"
    with pytest.raises(AutoplanError) as err:
        r.build_profile(case.layers, case.choices, case.calib, model_hash="tiny",
                        calib_hash="c", settings=CompressionSettings(), cache_dir=cache)
    msg = str(err.value)
    assert "--device cpu" in msg and "256 calibration tokens" in msg and "--dry-run" in msg
    assert "\n" not in msg
    (path,) = cache.iterdir()
    assert len(json.loads(path.read_text())["scores"]) == 2  # resumable from here
    monkeypatch.setattr(profile_mod, "score_task", real)
    done = r.build_profile(case.layers, case.choices, case.calib, model_hash="tiny",
                           calib_hash="c", settings=CompressionSettings(), cache_dir=cache)
    assert set(done.scores) == set(case.layers)


def test_device_names() -> None:
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(UserInputError, match="not a device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserInputError, match="no CUDA/ROCm GPU"):
            resolve_device("cuda:1")


def test_the_cheap_gpu_check_agrees_with_torch(monkeypatch) -> None:
    """`check_device_cheaply` refuses a GPU only where no driver file says one may exist,
    with `resolve_device`'s own line; where one may, torch answers."""
    from autoplan.streaming import device as dev

    if not dev.gpu_may_exist():  # no driver file: torch must see no GPU either
        assert not torch.cuda.is_available()
    monkeypatch.setattr(dev, "gpu_may_exist", lambda: False)
    with pytest.raises(UserInputError) as cheap:
        dev.check_device_cheaply("cuda:3")
    if not torch.cuda.is_available():
        with pytest.raises(UserInputError) as full:
            resolve_device("cuda:3")
        assert str(cheap.value) == str(full.value)
    for name in ("cpu", "auto"):
        dev.check_device_cheaply(name)
    monkeypatch.setattr(dev, "gpu_may_exist", lambda: True)
    dev.check_device_cheaply("cuda:99")  # a driver is here: resolve_device asks torch
    with pytest.raises(UserInputError, match="not a device"):
        dev.check_device_cheaply("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cli_device_cuda_without_gpu_is_one_line_exit_2(case: Case) -> None:
    res = CliRunner().invoke(cli, ["profile", "--model", str(case.folder), "--device", "cuda"])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "--device cpu" in res.output


def _llama_config(path: Path, hidden: int, inter: int, layers: int, heads: int) -> Path:
    path.write_text(json.dumps({
        "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 8,
        "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False}))
    return path


def test_dry_run_plans_70b_on_one_80gb_gpu_from_config_alone(tmp_path: Path) -> None:
    cfg = _llama_config(tmp_path / "config.json", 8192, 28672, 80, 64)
    res = CliRunner().invoke(cli, ["profile", "--model", str(cfg), "--dry-run", "--device",
                                   "cuda", "--gpu-memory", "80", "--host-memory", "64", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    stream, memory = report["plans"]["stream"], report["plans"]["memory"]
    assert report["fits"] == {"memory": False, "stream": True}
    assert report["auto_choice"] == "stream"
    assert stream["device_bytes"] <= 80 * 2**30 and stream["host_bytes"] <= 64 * 2**30
    assert memory["device_bytes"] > 280e9  # fp32 weights alone
    text = CliRunner().invoke(cli, ["profile", "--model", str(cfg), "--dry-run", "--device",
                                    "cpu", "--host-memory", "24"])
    assert text.exit_code == 0 and "does NOT fit" in text.output and "peak" in text.output


def test_estimate_parts_grow_with_calibration_tokens() -> None:
    spec = tiny_spec()
    small = estimate.plan(spec, "stream", "cpu", estimate.Workload(calib_tokens=256))
    big = estimate.plan(spec, "stream", "cpu", estimate.Workload(calib_tokens=4096))
    assert big.host > small.host
    assert estimate.plan(spec, "memory", "cpu").host > 0


def test_in_memory_peak_is_the_larger_phase_not_every_part_at_once() -> None:
    """The profile's captures are freed before verification starts: the in-memory peak is
    the resident parts plus the larger phase, so SmolLM2-135M with --measure-kernels is kept
    in memory with 6.4 GiB free (the sum of every part, 5.9 GiB, was refused there although
    the whole search peaks at 4.0 GiB measured)."""
    from autoplan.cost.configs import resolve_config

    spec = resolve_config("smollm2-135m")
    mem = estimate.plan(spec, "memory", "cpu")
    parts = {**mem.host_parts, **mem.device_parts}
    phase: dict[str, int] = {}
    for part, name in mem.phases.items():
        phase[name] = phase.get(name, 0) + parts[part]
    resident = sum(b for part, b in parts.items() if part not in mem.phases)
    assert set(phase) == {"profile", "verification"}
    assert mem.host == resident + max(phase.values()) < sum(parts.values())
    free = int(6.4 * 2**30)
    chosen, why = estimate.choose(spec, "cpu", free, None, needs_memory="--measure-kernels")
    assert chosen == "memory", why
    assert estimate.choose(spec, "cpu", 3 * 2**30, None,
                           needs_memory="--measure-kernels")[0] == "stream"


def test_recovery_on_a_streamed_model_is_refused_before_measuring(
        case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """No streamed recovery pass exists: a verifier asked to recover streamed candidates
    refuses in one line before it measures anything (the search refuses earlier still)."""
    from autoplan.search import QualityBudget, Verifier

    class Stage:
        def measure(self, *_a: object) -> None:
            pytest.fail("a recovery pass ran on a streamed model")

    sev = StreamedEvaluator(case.streamed, case.data.eval, calib_batches=case.calib)
    monkeypatch.setattr(StreamedEvaluator, "evaluate_many",
                        lambda *_a, **_k: pytest.fail("measured before refusing"))
    verifier = Verifier(case.memory, case.space, None, sev, QualityBudget.parse("kl<=0.05"),
                        CompressionSettings(), case.calib, recovery=Stage())
    picks = (0,) * len(case.space.units)
    with pytest.raises(UserInputError, match="streamed recovery pass is not implemented"):
        verifier.measure_many([(picks, "c")], recover=True)
    with pytest.raises(UserInputError, match="pass --execution memory"):
        verifier.recover([picks])
    verifier.recovery = None  # without a stage, nothing to refuse
    verifier.recover([picks])


def test_streamed_plan_holds_one_block_or_the_embedding_never_both() -> None:
    """A streamed run holds one fp32 block, or the embedding / lm_head while a pass needs it,
    plus one tensor in the checkpoint's dtype while it is converted; counting the block, the
    embedding and a whole block read from disk at once overstated a streamed MoE profile by
    about 2 GiB (docs/moe.md)."""
    from autoplan.cost.configs import resolve_config

    for name in ("qwen3-30b-a3b", "llama-3.1-8b"):
        spec = resolve_config(name)
        plan = estimate.plan(spec, "stream", "cpu")
        block = estimate._block_dims(spec)[0] * 4
        embed = max(spec.embedding_params, spec.vocab * spec.hidden) * 6  # fp32 + bf16 read
        resident = plan.device_parts[estimate.RESIDENT]
        assert max(block, embed) <= resident < max(block, embed) + 0.05 * block, name
        assert not any("from disk" in part for part in plan.host_parts), name
        profile = plan.to_json()["host_bytes_by_phase"]["profile"]
        assert resident + estimate.PROCESS_BYTES <= profile <= plan.host, name
        # 128 routed experts outweigh Qwen3-30B-A3B's embedding; Llama's embedding its block
        assert (block > embed) == (name == "qwen3-30b-a3b"), name


def test_gguf_names_of_a_streamed_model_are_the_in_memory_ones(tmp_path: Path) -> None:
    """A GGUF-sourced model searched with streamed execution (as the peers benchmark's H100
    search runs it) still maps its tensors to llama.cpp's names: the "as is" candidate
    reads them."""
    from transformers import AutoModelForCausalLM

    from autoplan.models.gguf_convert import hf_to_gguf_names

    pytest.importorskip("gguf")
    folder = _folder(tmp_path / "model", tied=True)
    memory = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    streamed = StreamedModel(folder, device=CPU)
    n = memory.config.num_hidden_layers
    names = hf_to_gguf_names(streamed, n)
    assert names == hf_to_gguf_names(memory, n)
    assert names["model.layers.0.self_attn.q_proj.weight"] == "blk.0.attn_q.weight"


def test_verification_counts_full_hessians_only_for_the_methods_that_use_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """RTN holds each layer's Hessian diagonal, GPTQ / SparseGPT the full in x in matrix: the
    streamed verification phase of a Qwen3-30B-A3B block differs by their 4.4 GiB, and a
    search estimates with what its own settings need."""
    from autoplan.cost import resolve_config
    from autoplan.search import SearchRequest
    from autoplan.search.preparation import _prepare
    from autoplan.streaming.runner import workload_of

    spec = resolve_config("qwen3-30b-a3b")
    block = [la for la in spec.layers if la.block == 0]
    full, diag = (estimate.plan(spec, "stream", "cpu", workload_of(128, 2, 2, full_hessians=f))
                  for f in (True, False))
    gib = 2**30
    saved = sum(la.in_features ** 2 - la.in_features for la in block) * 4
    assert saved / gib == pytest.approx(4.39, abs=0.01)
    assert sum(full.device_parts.values()) - sum(diag.device_parts.values()) == saved
    seen: list[bool] = []

    def capture(*_a, workload, **_k):  # noqa: ANN002, ANN003, ANN202 - open_model's signature
        seen.append(workload.full_hessians)
        raise RuntimeError("stop after the estimate's workload")

    monkeypatch.setattr(_prepare, "open_model", capture)
    for settings, want in ((CompressionSettings(), False),
                           (CompressionSettings(quant_method="gptq"), True)):
        with pytest.raises(RuntimeError, match="stop after"):
            _prepare.open_model_work(SearchRequest(settings=settings), _Quiet())
        assert seen[-1] is want


class _Quiet:
    def stage(self, *_a: object) -> None: ...

    def note(self, *_a: object) -> None: ...
