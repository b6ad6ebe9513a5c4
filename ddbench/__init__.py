"""ddbench: a replay and extension of DualDecoder (predictive sparse-KV prefetch).

This package imports nothing heavy at import time; GPU code lives in `ddbench.kernels` (the checkout's
kernels/ folder) and is imported lazily by the commands that need it.

Import names: the checkout's kernels/ and sim/ folders are the packages ddbench.kernels and ddbench.sim,
so nothing of ddbench claims a top-level name that another distribution may own (Hugging Face's
`kernels`). An install maps them (setup.py package_dir); in the checkout itself (`PYTHONPATH=.`, no
install: the GPU machine) the finder below does, for those two names only.
"""

import importlib.util
import os
import sys

__version__ = "0.1.0"

_SUBPACKAGES = ("kernels", "sim")


class _CheckoutFinder:
    """Finds ddbench.kernels and ddbench.sim in the checkout's sibling folders (meta path finder)."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        pkg, _, name = fullname.partition(".")
        if pkg != __name__ or name not in _SUBPACKAGES:
            return None
        where = os.path.join(self.root, name)
        return importlib.util.spec_from_file_location(fullname, os.path.join(where, "__init__.py"),
                                                      submodule_search_locations=[where])


def _map_checkout() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if all(os.path.isdir(os.path.join(here, s)) for s in _SUBPACKAGES):
        return                                  # installed: the subpackages are inside ddbench/
    if not all(os.path.isfile(os.path.join(root, s, "__init__.py")) for s in _SUBPACKAGES):
        return
    if not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder(root))   # before an editable install of another checkout


_map_checkout()
