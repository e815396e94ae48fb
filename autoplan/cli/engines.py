"""`autoplan engines`: the serving engines' own venvs (list them, install one)."""

from __future__ import annotations

import click
from rich.table import Table

from autoplan.cli._output import console, emit_json, err_console, json_option


@click.group("engines", invoke_without_command=True)
@json_option
@click.pass_context
def command(ctx: click.Context, as_json: bool) -> None:
    """Serving engines autoplan checks exports against, each in its own venv.

    AUTOPLAN_ENGINE_<NAME>_PYTHON (e.g. AUTOPLAN_ENGINE_LLAMA_CPP_PYTHON) points autoplan at
    a Python that already has the engine instead."""
    if ctx.invoked_subcommand is not None:
        return
    from autoplan.engines import engine_names, engine_status, get_engine

    rows = [(get_engine(n), engine_status(n)) for n in engine_names()]
    if as_json:
        emit_json([{"name": s.name, "installed": s.installed, "python": str(s.python),
                    "source": s.source, "detail": s.detail, "install": spec.install_command}
                   for spec, s in rows])
        return
    table = Table(title="autoplan engines")
    for col in ("engine", "installed", "detail", "what it is"):
        table.add_column(col, overflow="fold")
    for spec, s in rows:
        table.add_row(spec.name, "yes" if s.installed else f"no: {spec.install_command}",
                      s.detail, spec.describe)
    console.print(table)


@command.command("install")
@click.argument("name")
@click.option("--force", is_flag=True, help="Rebuild the venv even if it is installed.")
def install(name: str, force: bool) -> None:
    """Build NAME's venv under the autoplan cache (vllm, llama.cpp, openvino)."""
    from autoplan.engines import get_engine, install_engine

    spec = get_engine(name)
    err_console.print(f"installing {spec.name} into {spec.venv_dir} (about {spec.minutes} min)")
    python = install_engine(spec.name, echo=lambda line: err_console.print(line, markup=False),
                            force=force)
    console.print(f"{spec.name}: {python}")
