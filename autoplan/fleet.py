"""Fleet sizing: how many nodes serve a request rate under a p99 latency SLA, and what it costs.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from autoplan.errors import UserInputError

HOURS_PER_MONTH = 730
MAX_NODES = 1_000_000


@dataclass(frozen=True)
class Step:
    """One line of the shown arithmetic."""

    label: str
    formula: str
    value: float
    unit: str = ""


@dataclass(frozen=True)
class FleetSizing:
    """Result of size_fleet, with every step of the arithmetic."""

    replicas_per_node: int
    servers_per_node: int
    service_s: float
    node_throughput_tok_s: float
    nodes: int | None  # None: no node count meets the SLA (service time alone exceeds it)
    p99_s: float | None
    utilization: float | None
    usd_per_month: float | None
    usd_per_million_tokens: float | None
    steps: tuple[Step, ...] = field(repr=False)
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps"] = [asdict(s) for s in self.steps]
        return out


class ReplicaDoesNotFit(UserInputError):
    """One replica (weights + its batch's KV cache) needs more memory than a domain has."""

    def __init__(self, message: str, needed_bytes: float, usable_bytes: float) -> None:
        super().__init__(message)
        self.needed_bytes, self.usable_bytes = needed_bytes, usable_bytes


def does_not_fit(reason: str) -> FleetSizing:
    """The sizing of a side that cannot run on the node at all (no replica fits): no nodes,
    no figures, the reason."""
    return FleetSizing(0, 0, 0.0, 0.0, None, None, None, None, None, (),
                       reason=f"does not fit: {reason}")


def erlang_c(servers: int, offered: float) -> float:
    """Probability an arrival waits in M/M/k with `servers` and offered load a = lambda/mu.

    Uses the Erlang B recursion B_j = a B_{j-1} / (j + a B_{j-1}), stable for large k, then
    C = B / (1 - rho (1 - B)) with rho = a / k < 1.
    """
    if offered >= servers:
        return 1.0
    b = 1.0
    for j in range(1, servers + 1):
        b = offered * b / (j + offered * b)
    rho = offered / servers
    return b / (1 - rho * (1 - b))


def wait_quantile(servers: int, rate: float, arrivals: float, p: float) -> float:
    """p-quantile of the M/M/k queueing delay in seconds (0 when P(wait>0) <= 1 - p)."""
    c = erlang_c(servers, arrivals / rate)
    if c <= 1 - p:
        return 0.0
    return math.log(c / (1 - p)) / (servers * rate - arrivals)


def size_fleet(*, weight_bytes: float, kv_bytes_per_token: float, node_memory_bytes: float,
               batch: int, input_len: int, output_len: int, ttft_s: float, tpot_s: float,
               qps: float, p99_s: float, price_per_hour: float, usable_fraction: float = 0.9,
               max_replicas: int | None = 1, quantile: float = 0.99,
               domains: int = 1, workspace_bytes: float = 0.0) -> FleetSizing:
    """Size a fleet (docs/modules.md has the model); all figures in SI units.

    Args:
        weight_bytes: model weights as stored, bytes.
        kv_bytes_per_token: KV-cache bytes per token of context.
        node_memory_bytes: memory of one memory domain of a node (a GPU; a CPU socket);
            `usable_fraction` of it is planned with.
        batch: sequences one replica decodes together.
        input_len, output_len: tokens per request.
        ttft_s, tpot_s: one replica alone on the node at `batch` (from the cost model).
        qps: request arrival rate of the whole fleet.
        p99_s: the latency SLA at `quantile` (end-to-end request latency).
        price_per_hour: $ per node-hour.
        max_replicas: cap on model copies per memory domain (None: memory alone decides).
        domains: memory domains per node, each running its own replicas (sockets of a CPU
            node run one replica per socket; 1 for a GPU).
        workspace_bytes: one replica's activation workspace at `batch` (the cost model's
            Memory.workspace_bytes), which it holds beside its weights and KV cache.
    """
    named = {"qps": qps, "p99": p99_s, "TTFT": ttft_s, "weights": weight_bytes,
             "node memory": node_memory_bytes}
    for name, value in named.items():
        if not 0 < value < math.inf:  # also refuses NaN, which every comparison lets through
            raise UserInputError(f"fleet sizing needs a finite {name} > 0, got {value}")
    if not 0 <= tpot_s < math.inf:
        raise UserInputError(f"fleet sizing needs a finite TPOT >= 0, got {tpot_s}")
    if domains < 1:
        raise UserInputError(f"domains must be >= 1, got {domains}")
    if max_replicas is not None and max_replicas < 1:
        raise UserInputError(f"max_replicas must be >= 1 or None, got {max_replicas}")
    steps: list[Step] = []

    def step(label: str, formula: str, value: float, unit: str = "") -> float:
        steps.append(Step(label, formula, value, unit))
        return value

    if not 0 <= workspace_bytes < math.inf:
        raise UserInputError(f"fleet sizing needs a finite workspace >= 0, got {workspace_bytes}")
    space = f" + {workspace_bytes:.4g} B workspace" if workspace_bytes else ""
    per_replica = step("memory per replica", f"{weight_bytes:.4g} B + {batch} x "
                       f"({input_len}+{output_len}) x {kv_bytes_per_token:.4g} B{space}",
                       weight_bytes + batch * (input_len + output_len) * kv_bytes_per_token
                       + workspace_bytes, "B")
    where = "node" if domains == 1 else "memory domain"
    usable = step(f"usable memory per {where}", f"{usable_fraction} x {node_memory_bytes:.4g} B",
                  usable_fraction * node_memory_bytes, "B")
    by_memory = math.floor(usable / per_replica)
    if by_memory < 1:
        raise ReplicaDoesNotFit(f"one replica needs {per_replica / 1e9:.1f} GB but a {where} has "
                                f"{usable / 1e9:.1f} GB usable: choose a smaller plan or batch",
                                per_replica, usable)
    local = min(by_memory, max_replicas or by_memory)
    if domains > 1:
        step("replicas per memory domain", f"min(floor({usable:.4g} / {per_replica:.4g}) = "
             f"{by_memory}, cap {max_replicas})", local)
        replicas = int(step("replicas per node", f"{domains} domains x {local}", domains * local))
    else:
        replicas = int(step("replicas per node", f"min(floor({usable:.4g} / {per_replica:.4g}) "
                            f"= {by_memory}, cap {max_replicas})", local))
    ttft = step("TTFT per replica", f"{ttft_s:.4g} s x {local} replicas sharing the {where}",
                ttft_s * local, "s")
    tpot = step("TPOT per replica", f"{tpot_s:.4g} s x {local}", tpot_s * local, "s")
    service = step("service time S", f"{ttft:.4g} + ({output_len} - 1) x {tpot:.4g}",
                   ttft + (output_len - 1) * tpot, "s")
    servers = int(step("servers per node c", f"{replicas} x {batch}", replicas * batch))
    rate = 1 / service
    node_rps = step("node capacity", f"{servers} / {service:.4g} s", servers * rate, "req/s")
    node_tok = step("node throughput", f"{node_rps:.4g} x {output_len}", node_rps * output_len,
                    "tok/s")
    floor_nodes = step("nodes for stability", f"floor({qps} / {node_rps:.4g}) + 1",
                       math.floor(qps / node_rps) + 1)
    if service > p99_s:
        return FleetSizing(replicas, servers, service, node_tok, None, None, None, None, None,
                           tuple(steps), reason=f"service time {service:.3g} s alone exceeds "
                           f"the p99 SLA {p99_s:.3g} s: no node count meets it")
    nodes, wait = int(floor_nodes), 0.0
    while nodes <= MAX_NODES:
        wait = wait_quantile(nodes * servers, rate, qps, quantile)
        if service + wait <= p99_s:
            break
        nodes += 1
    else:
        raise UserInputError(f"more than {MAX_NODES} nodes would be needed: check --qps")
    k = nodes * servers
    step("Erlang C", f"C(k={k}, a={qps:.4g} x {service:.4g})", erlang_c(k, qps * service))
    step(f"p{quantile * 100:g} wait", f"ln(C / {1 - quantile:.2g}) / ({k} / {service:.4g} - "
         f"{qps}) if C > {1 - quantile:.2g}", wait, "s")
    p99 = step("p99 latency", f"{service:.4g} + {wait:.4g} <= SLA {p99_s}", service + wait, "s")
    step("nodes", "smallest count meeting stability and the SLA", nodes)
    util = step("utilization", f"{qps} x {service:.4g} / {k}", qps * service / k)
    month = step("$/month", f"{nodes} x ${price_per_hour}/h x {HOURS_PER_MONTH} h",
                 nodes * price_per_hour * HOURS_PER_MONTH, "$")
    per_m = step("$/1M tokens", f"{nodes} x ${price_per_hour}/h / ({qps} x {output_len} x "
                 "3600) x 1e6", nodes * price_per_hour / (qps * output_len * 3600) * 1e6, "$")
    return FleetSizing(replicas, servers, service, node_tok, nodes, p99, util, month, per_m,
                       tuple(steps))


__all__ = ["FleetSizing", "ReplicaDoesNotFit", "Step", "does_not_fit", "erlang_c", "size_fleet",
           "wait_quantile"]
