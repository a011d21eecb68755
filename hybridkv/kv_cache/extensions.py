"""Loading the package's optional C extensions, with the reason when one is missing.

A build that failed leaves `<module>.build-error.txt` next to the sources
(setup.py); that text is the reason given then.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_extension(name: str) -> tuple[Any, str | None]:
    """(the module `name`, None), or (None, why it is not there) for a dotted
    module name under `hybridkv`."""
    try:
        return importlib.import_module(name), None
    except ImportError as e:
        parts = name.split(".")
        error_file = os.path.join(_PACKAGE_ROOT, *parts[1:-1], parts[-1] + ".build-error.txt")
        try:
            with open(error_file) as f:
                return None, f"build failed: {f.read().strip()}"
        except OSError:
            pass
        if isinstance(e, ModuleNotFoundError) and e.name == name:
            return None, "no compiled module (the package was installed without building it)"
        return None, f"it does not load: {e}"
