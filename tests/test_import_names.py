"""ddbench claims one top-level import name, `ddbench` (issue 30, part 4): the checkout's kernels/ and sim/
folders are ddbench.kernels and ddbench.sim, so another distribution's top-level `kernels` or `sim`
(Hugging Face's `kernels` is one) neither shadows ours nor is shadowed. An install maps the folders
(setup.py package_dir; tests/test_install.py installs the wheel beside a package named `kernels`); the
checkout without an install (`PYTHONPATH=.`, as on the GPU machine) maps them in ddbench/__init__.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.cli import ROOT

PROBE = ("import json, kernels, sim, ddbench.kernels.attention as a, ddbench.sim.costmodel as c;"
         "print(json.dumps([kernels.WHO, sim.WHO, a.__file__, c.__file__]))")


def foreign_packages(where) -> str:
    """Top-level packages `kernels` and `sim` of another distribution, in `where`."""
    for name in ("kernels", "sim"):
        os.makedirs(os.path.join(where, name), exist_ok=True)
        with open(os.path.join(where, name, "__init__.py"), "w") as fh:
            fh.write(f"WHO = 'the other {name}'\n")
    return str(where)


def test_the_checkout_without_an_install_beside_foreign_kernels_and_sim(tmp_path):
    """No site-packages (-S: no editable finder either), the foreign packages first on the path: each name
    resolves to its own package, ours under ddbench."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([foreign_packages(tmp_path / "other"), ROOT]))
    r = subprocess.run([sys.executable, "-S", "-c", PROBE.replace("ddbench.kernels.attention", "ddbench.kernels")
                        .replace("ddbench.sim.costmodel", "ddbench.sim")], capture_output=True, text=True,
                       cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    who_k, who_s, ours_k, ours_s = json.loads(r.stdout)
    assert (who_k, who_s) == ("the other kernels", "the other sim")
    assert ours_k == os.path.join(ROOT, "kernels", "__init__.py") and ours_s == os.path.join(ROOT, "sim", "__init__.py")


def test_the_editable_install_beside_foreign_kernels_and_sim(tmp_path):
    """The development environment (editable install), run from another folder, the foreign packages on
    the path: ddbench's modules load with their dependencies (torch for the attention kernel)."""
    env = dict(os.environ, PYTHONPATH=foreign_packages(tmp_path / "other"))
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    who_k, who_s, att, cm = json.loads(r.stdout)
    assert (who_k, who_s) == ("the other kernels", "the other sim")
    assert att == os.path.join(ROOT, "kernels", "attention.py") and cm == os.path.join(ROOT, "sim", "costmodel.py")


def test_the_old_names_shadow_each_other(tmp_path):
    """Negative control: under the old top-level names, the foreign `kernels` first on the path hides ours."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([foreign_packages(tmp_path / "other"), ROOT]))
    r = subprocess.run([sys.executable, "-S", "-c", "import kernels.attention"], capture_output=True, text=True,
                       cwd=tmp_path, env=env)
    assert r.returncode != 0 and "No module named 'kernels.attention'" in r.stderr
