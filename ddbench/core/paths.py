"""Where ddbench's data lives, independent of the current folder.

The data root holds the committed traces (calibration bundles, accuracy profiles, kernel and
engine sweeps, the paper's numbers). It is, in this order:
  1. `DDBENCH_DATA` (set by `--data` on the CLI), which must be an existing folder;
  2. the source tree's `traces/` beside the package (a checkout or an editable install);
  3. the copy shipped inside the installed package (`pip install .`), `ddbench/_traces/`.
Nothing here looks at the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddbench.core.errors import DDBenchError

ENV = "DDBENCH_DATA"
_PACKAGE = Path(__file__).resolve().parent.parent          # .../ddbench
SOURCE_TRACES = _PACKAGE.parent / "traces"
PACKAGED_TRACES = _PACKAGE / "_traces"


def data_root() -> Path:
    """The traces root (see the module docstring); DDBenchError where DDBENCH_DATA is not a folder."""
    env = os.environ.get(ENV)
    if env is not None:
        root = Path(env).expanduser().resolve()
        if not root.is_dir():
            raise DDBenchError(f"data root {env!r} ({ENV} or --data) is not a folder")
        return root
    if SOURCE_TRACES.is_dir():
        return SOURCE_TRACES
    if PACKAGED_TRACES.is_dir():
        return PACKAGED_TRACES
    raise DDBenchError(f"no ddbench data found: neither {SOURCE_TRACES} nor {PACKAGED_TRACES} exists;"
                       f" set {ENV} or pass --data")


def traces_dir(*parts: str) -> Path:
    """A path under the data root, e.g. traces_dir("calibration", "h200")."""
    return data_root().joinpath(*parts)


def repo_root() -> Path | None:
    """The source checkout holding the package, or None for an installed copy (git provenance)."""
    return _PACKAGE.parent if (_PACKAGE.parent / ".git").exists() else None
