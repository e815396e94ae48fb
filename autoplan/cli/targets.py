"""`autoplan targets`: the hardware catalog as a table (or JSON)."""

from __future__ import annotations

import click
from rich.table import Table

from autoplan.cli._output import console, emit_json, json_option
from autoplan.targets import Figure, Target, load_catalog

_VENDORS = ("nvidia", "amd", "intel", "arm")
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


def _table(targets: list[Target]) -> Table:
    table = Table(title="autoplan targets (dense peaks in TFLOPS/TOPS; ~ = uncertain)")
    table.add_column("name", no_wrap=True)
    for col in ("aliases", "family", "mem GB", "BW GB/s", "dense peaks", "2:4", "TDP W", "$/h"):
        table.add_column(col, overflow="fold")
    for t in targets:
        table.add_row(
            t.name,
            ", ".join(t.aliases),
            t.family,
            _cell(t.memory_gb),
            _cell(t.bandwidth_gbps, "{:,.4g}"),
            _peaks(t),
            _sparse(t),
            _cell(t.tdp_w),
            _cell(t.price_per_hour, "{:.2f}"),
        )
    return table


@click.command("targets")
@click.option("--vendor", type=click.Choice(_VENDORS), help="Only this vendor's targets.")
@json_option
def command(vendor: str | None, as_json: bool) -> None:
    """List the hardware catalog (`local` is this machine: see `autoplan probe`)."""
    targets = [t for t in load_catalog().values() if vendor in (None, t.vendor)]
    if as_json:
        emit_json([t.model_dump(mode="json") for t in targets])
        return
    console.print(_table(targets))
    console.print("local: this machine, measured on first use (autoplan probe)")
