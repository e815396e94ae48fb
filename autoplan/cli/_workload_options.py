"""`--batch N|max`, `--input-len`, `--output-len`, `--ttft-ms`, `--tpot-ms`: the operating
point options shared by estimate, search, compare and fleet (autoplan/cost/operating.py)."""

from __future__ import annotations

from collections.abc import Callable

import click

from autoplan.cost.operating import OperatingRequest


def workload_options(default_batch: int, batch_help: str = "Concurrent sequences.", *,
                     lengths_from: str | None = None,
                     batch_default: str | None = None) -> Callable:
    """Add the five options; the command receives `batch`, `input_len`, `output_len`,
    `ttft_ms`, `tpot_ms` and builds an OperatingRequest with `operating_from`.

    With ``lengths_from`` (e.g. "the --measured workload's") the lengths default to None, so
    the command can take them from there, and the help says so; ``batch_default`` says in
    the help where a batch comes from when --batch is not given, if not `default_batch`."""
    def add(fn: Callable) -> Callable:
        fn = click.option("--tpot-ms", type=float, default=None,
                          help="SLO: time per output token at most this (with --ttft-ms: "
                               "both); the batch is the largest meeting it.")(fn)
        fn = click.option("--ttft-ms", type=float, default=None,
                          help="SLO: time to first token at most this; the batch is the "
                               "largest meeting it (and --tpot-ms).")(fn)
        for flag, default, what in (("--output-len", 128, "Output tokens per request."),
                                    ("--input-len", 512, "Prompt tokens per request.")):
            if lengths_from is None:
                fn = click.option(flag, type=int, default=default, show_default=True,
                                  help=what)(fn)
            else:
                fn = click.option(flag, type=int, default=None,
                                  help=f"{what} [default: {default}, or {lengths_from}]")(fn)
        return click.option("--batch", default=None,
                            help=f"{batch_help} An integer (default "
                                 f"{batch_default or default_batch}) or "
                                 "'max': the largest batch whose weights, KV cache and "
                                 "workspace fit the target's memory.")(fn)
    return add


def operating_from(batch: str | None, input_len: int, output_len: int, ttft_ms: float | None,
                   tpot_ms: float | None, default_batch: int) -> OperatingRequest:
    """The options as an OperatingRequest (UserInputError naming the bad flag)."""
    return OperatingRequest.parse(batch, input_len=input_len, output_len=output_len,
                                  ttft_ms=ttft_ms, tpot_ms=tpot_ms, default_batch=default_batch)


__all__ = ["operating_from", "workload_options"]
