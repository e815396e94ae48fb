"""Loads autoplan_tiny_mc.jsonl (beside this file) as the test split, offline."""

from pathlib import Path


def load(**_kwargs):  # noqa: ANN003, ANN201 - lm-eval's custom_dataset signature
    import datasets

    path = Path(__file__).with_name("autoplan_tiny_mc.jsonl")
    return datasets.load_dataset("json", data_files={"test": str(path)})
