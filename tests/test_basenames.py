"""No two modules of ddbench/, kernels/ and sim/ share a file name (issue 30: a name says which module it is).
Left: the package files, and cachefill.py (kernels/cachefill.py, the Triton fill, beside sim/fit/cachefill.py,
its fit; the files that import the kernel are others' work now)."""

from __future__ import annotations

import os
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOWED = {"__init__.py", "__main__.py", "cachefill.py"}


def basenames() -> dict:
    seen = defaultdict(list)
    for top in ("ddbench", "kernels", "sim"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
            for f in files:
                if f.endswith(".py"):
                    seen[f].append(os.path.relpath(os.path.join(folder, f), ROOT))
    return seen


def test_no_module_basename_is_shared():
    shared = {name: paths for name, paths in basenames().items() if len(paths) > 1 and name not in ALLOWED}
    assert shared == {}
