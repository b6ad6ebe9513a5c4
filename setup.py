"""Packaging beyond pyproject.toml: the import names and the traces.

- Import names: the folders kernels/ and sim/ of the checkout install as ddbench.kernels and
  ddbench.sim (package_dir), so ddbench puts one top-level package, `ddbench`, into site-packages and
  never shadows, or is shadowed by, another distribution's `kernels` or `sim` (Hugging Face's
  `kernels` is one). In the checkout without an install (`PYTHONPATH=.`), ddbench/__init__.py maps
  the same two names onto the folders.
- Traces: `pip install .` (not editable) copies traces/ into the built package as ddbench/_traces/,
  where ddbench.core.paths.data_root() finds it. An editable install reads traces/ from the source tree.
"""

import os
import shutil

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SUBPACKAGES = ("kernels", "sim")       # folder -> ddbench.<folder>
PACKAGE_DIR = {f"ddbench.{s}": s for s in SUBPACKAGES}
PACKAGES = find_namespace_packages(where=HERE, include=["ddbench", "ddbench.*"]) + [
    f"ddbench.{p}" for p in find_namespace_packages(where=HERE, include=[x for s in SUBPACKAGES for x in (s, f"{s}.*")])]


class build_py_with_traces(build_py):
    def run(self):
        super().run()
        src = os.path.join(HERE, "traces")
        if getattr(self, "editable_mode", False) or not os.path.isdir(src):
            return
        dst = os.path.join(self.build_lib, "ddbench", "_traces")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


setup(packages=PACKAGES, package_dir=PACKAGE_DIR, cmdclass={"build_py": build_py_with_traces})
