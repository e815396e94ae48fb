"""`autoplan targets`: the hardware catalog as a table (or JSON)."""

from __future__ import annotations

import click
from rich.table import Table

from autoplan.cli._output import console, emit_json, json_option
from autoplan.targets import Figure, Target, Vendor, load_catalog, measured_target_names

_DTYPES = ("fp32", "bf16", "fp8", "int8", "int4", "fp4")


def _cell(fig: Figure | None, fmt: str = "{:,.0f}") -> str:
    if fig is None:
        return "-"
    # "~" marks a figure hw-facts rates 🟡/⚠️ (derived, secondary or conflicting).
    return fmt.format(fig.value) + ("~" if fig.uncertain else "")


def _peaks(target: Target) -> str:
    return " ".join(
        f"{d}:{_cell(target.peak_tflops[d], '{:,.6g}')}" for d in _DTYPES if d in target.peak_tflops
    )


def _sparse(target: Target) -> str:
    return " ".join(f"{d}×{_cell(f, '{:g}')}" for d, f in target.sparse24.items()) or "-"


def _node(target: Target) -> str:
    """CPUs: sockets x cores x SMT and NUMA domains of a server node (figures per socket)."""
    n = target.node
    if n is None:
        return "-"
    return (f"{n.sockets}S x {target.cores or '?'}C x {n.threads_per_core}T, "
            f"{n.sockets * n.numa_per_socket} NUMA{'~' if n.uncertain else ''}")


def _table(targets: list[Target]) -> Table:
    table = Table(title="autoplan targets (dense peaks in TFLOPS/TOPS; ~ = uncertain; CPU "
                        "figures per socket, `node`: the server node they are sold in)")
    table.add_column("name", no_wrap=True)
    table.add_column("source", no_wrap=True)
    # "mem GB" is the nominal (marketed) size; "seen MiB" what nvidia-smi / rocm-smi report,
    # which the planner uses where the catalog cites it.
    for col in ("aliases", "family", "mem GB", "seen MiB", "BW GB/s", "dense peaks", "2:4",
                "TDP W", "$/h", "node"):
        table.add_column(col, overflow="fold")
    for t in targets:
        table.add_row(
            t.name,
            "measured" if t.measured else "catalog",
            ", ".join(t.aliases),
            t.family,
            _cell(t.memory_gb),
            _cell(t.visible_memory_mib),
            _cell(t.bandwidth_gbps, "{:,.4g}"),
            _peaks(t),
            _sparse(t),
            _cell(t.tdp_w),
            _cell(t.price_per_hour, "{:.2f}"),
            _node(t),
        )
    return table


@click.command("targets")
@click.option("--vendor", type=click.Choice(Vendor.values()), help="Only this vendor's targets.")
@json_option
def command(vendor: str | None, as_json: bool) -> None:
    """List the hardware catalog and the targets measured on this machine (`local`: probed
    now, or read from its cache; `autoplan probe --refresh` measures again)."""
    from autoplan.backends.registry import load_backends, resolve_target

    load_backends()
    targets = [*load_catalog().values(), *map(resolve_target, measured_target_names())]
    targets = [t for t in targets if vendor in (None, t.vendor)]
    if as_json:
        emit_json([t.model_dump(mode="json") for t in targets])
        return
    console.print(_table(targets))
