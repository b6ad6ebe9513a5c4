"""Ships the committed traces inside the package: `pip install .` (not editable) copies traces/ into
the built package as ddbench/_traces/, where ddbench.core.paths.data_root() finds it. An editable
install reads traces/ from the source tree instead. Everything else is in pyproject.toml."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class build_py_with_traces(build_py):
    def run(self):
        super().run()
        src = os.path.join(HERE, "traces")
        if getattr(self, "editable_mode", False) or not os.path.isdir(src):
            return
        dst = os.path.join(self.build_lib, "ddbench", "_traces")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


setup(cmdclass={"build_py": build_py_with_traces})
