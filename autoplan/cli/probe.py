"""`autoplan probe`: what each backend finds on this machine, and why the rest is missing."""

from __future__ import annotations

import click
from rich.table import Table

from autoplan.backends.base import ProbeResult
from autoplan.backends.registry import backend_names, get_backend
from autoplan.cli._output import console, emit_json, err_console, json_option


def _devices(result: ProbeResult) -> str:
    return "\n".join(
        f"{d.get('name')} -> {d.get('target') or 'no catalog entry'}" for d in result.devices
    ) or "-"


@click.command("probe")
@click.option("--refresh", is_flag=True, help="Measure the local CPU again instead of using the cache.")
@json_option
def command(refresh: bool, as_json: bool) -> None:
    """Probe every backend (NVIDIA, AMD, CPU); unavailable ones say why."""
    if refresh:
        from autoplan.backends.cpu.local_target import local_target

        err_console.print("measuring this CPU (a few seconds)...")
        local_target(refresh=True)
    results = [get_backend(name).probe() for name in backend_names()]
    if as_json:
        emit_json([r.to_json() for r in results])
        return
    table = Table(title="autoplan probe")
    for col in ("backend", "available", "devices", "reason"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(r.backend, "yes" if r.available else "no", _devices(r), r.reason)
    console.print(table)
