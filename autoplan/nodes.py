"""Server nodes as they are sold, and how a runtime uses their memory domains.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import UnknownNameError
from autoplan.targets import Figure, Target

LAYOUTS = ("socket", "spanning", "interleaved")
# [LLAMA-11744]: Llama-3.1-70B f16 on dual EPYC 9175F, 2.4 t/s (pages where the prompt pass
# put them) vs 4.31 t/s (--numa distribute, weights local to the threads that read them).
INTERLEAVED_FACTOR = 2.4 / 4.31


@dataclass(frozen=True)
class NodeLayout:
    """How one node is used: its replicas, what each one runs on, and what to configure."""

    name: str  # "device" | "socket" | "spanning" | "interleaved"
    target: Target  # what one replica runs on (per-socket target, or the sockets joined)
    domains: int  # independent memory domains, each running its own replicas
    node_price_per_hour: float  # the whole node
    runtime_must: str  # what the runtime has to be told to get this layout
    source: str  # reference key of the layout's NUMA factor ("" for none)

    def to_json(self) -> dict[str, object]:
        return {"layout": self.name, "domains": self.domains,
                "replica_memory_gb": self.target.memory_gb.value,
                "replica_bandwidth_gbps": self.target.bandwidth_gbps.value,
                "node_price_per_hour": self.node_price_per_hour,
                "runtime_must": self.runtime_must, "source": self.source}


def _scaled(fig: Figure, factor: float, why: str) -> Figure:
    return Figure(value=fig.value * factor, source=fig.source, uncertain=True,
                  note=f"derived: {why}; {fig.note}".rstrip("; "))


def _joined(target: Target, sockets: int, bandwidth_factor: float, how: str) -> Target:
    """The sockets of a node seen as one device (for one replica spanning them)."""
    why = f"{sockets} sockets x the per-socket figure ({how})"
    return target.model_copy(update={
        "memory_gb": _scaled(target.memory_gb, sockets, why),
        "bandwidth_gbps": _scaled(target.bandwidth_gbps, sockets * bandwidth_factor,
                                  why + (f", x {bandwidth_factor:.2f} for remote reads"
                                         if bandwidth_factor != 1 else "")),
        "peak_tflops": {k: _scaled(f, sockets, why) for k, f in target.peak_tflops.items()},
        "tdp_w": _scaled(target.tdp_w, sockets, why),
        "price_per_hour": _scaled(target.price_per_hour, sockets, why),
        "cores": target.cores * sockets if target.cores else None,
        "description": f"{target.description}; {how} over {sockets} sockets",
    })


def node_layout(target: Target, layout: str | None = None) -> NodeLayout:
    """The layout of a node of this target (default: one replica per socket on CPUs).

    Raises:
        UnknownNameError: an unknown layout, or a CPU layout asked of a GPU.
    """
    node = target.node
    if node is None or node.sockets == 1:
        if layout not in (None, "device", "socket"):
            raise UnknownNameError("layout", layout, ["device"] if target.kind == "gpu"
                                   else ["socket"])
        name = "device" if target.kind == "gpu" else "socket"
        return NodeLayout(name, target, 1, target.price_per_hour.value,
                          "nothing: one memory domain" if target.kind == "cpu" else
                          "nothing: replicas on one device share it", "")
    layout = layout or "socket"
    if layout not in LAYOUTS:
        raise UnknownNameError("layout", layout, LAYOUTS)
    s, price = node.sockets, target.price_per_hour.value * node.sockets
    cores = target.cores or 0
    if layout == "socket":
        return NodeLayout(
            "socket", target, s, price,
            f"run one engine process per socket, each pinned to its own cores and memory "
            f"(numactl --cpunodebind=N --membind=N; {cores} threads each, one per physical "
            f"core: not the {cores * node.threads_per_core} SMT threads)", "")
    if layout == "spanning":
        return NodeLayout(
            "spanning", _joined(target, s, 1.0, "weights local to the threads reading them"),
            1, price, f"one process over all {s} sockets with each thread's weights in its own "
            "socket's memory (llama.cpp --numa distribute, model first touched by generation, "
            f"{cores * s} threads)", "LLAMA-11744")
    return NodeLayout(
        "interleaved", _joined(target, s, INTERLEAVED_FACTOR, "pages interleaved"), 1, price,
        f"one process with memory interleaved over the {s} sockets (numactl --interleave=all):"
        " about half the reads cross the socket link", "LLAMA-11744")


__all__ = ["INTERLEAVED_FACTOR", "LAYOUTS", "NodeLayout", "node_layout"]
