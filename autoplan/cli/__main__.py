"""`python -m autoplan.cli` runs the CLI (used by benchmarks to time the real command)."""

from autoplan.cli import main

main()
