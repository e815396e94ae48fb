"""Package mapping only; all metadata lives in pyproject.toml.

The design card keeps backends/ and search_spaces/ at the top level of the repository,
but a generic top-level module named `backends` must never land in site-packages, so both
folders are installed as `autoplan.backends` and `autoplan.search_spaces`.
"""

from setuptools import find_packages, setup

MAPPED = {"autoplan.backends": "backends", "autoplan.search_spaces": "search_spaces"}


def _mapped_packages() -> list[str]:
    packages = find_packages(include=["autoplan", "autoplan.*"])
    for prefix, folder in MAPPED.items():
        packages.append(prefix)
        packages += [f"{prefix}.{sub}" for sub in find_packages(folder)]
    return packages


setup(packages=_mapped_packages(), package_dir={"autoplan": "autoplan", **MAPPED})
