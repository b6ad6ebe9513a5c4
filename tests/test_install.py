"""`pip install .` (not editable) gives a working `ddbench` with the traces inside the package, whose
results equal the source tree's, from any folder."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from tests.cli import ROOT, ddbench as run_source
from tests.test_import_names import PROBE, foreign_packages

IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                "figures", "sim-out", ".whl", ".gl")


def _source_copy(dst):
    """The checkout's files (tracked and untracked-but-not-ignored), without build outputs or the venv."""
    if os.path.isdir(os.path.join(ROOT, ".git")) and shutil.which("git"):
        files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, check=True).stdout.decode().split("\0")
        for f in filter(None, files):
            src = os.path.join(ROOT, f)
            if os.path.isfile(src):
                os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
                shutil.copy2(src, os.path.join(dst, f))
    else:
        shutil.copytree(ROOT, dst, ignore=IGNORE, dirs_exist_ok=True)


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDBENCH_DATA")}


SIM = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--system", "dualdecoder,shadowkv", "--context", "64k",
       "--output", "32", "--rate", "1", "--requests", "30", "--json"]
PLAN = ["plan", "--model", "qwen2.5-32b", "--gpu", "h100-80gb", "--context", "128k", "--system", "every", "--json"]


def _numbers(summaries: dict) -> dict:
    """What must be equal: everything but the wall time and the bundle's path in the notes."""
    out = {}
    for name, s in summaries.items():
        s = dict(s)
        s.pop("wall_s")
        s["cost_model"] = [n.split(" measured on ")[-1] for n in s["cost_model"]]
        out[name] = s
    return out


@pytest.mark.slow
def test_wheel_install_matches_the_source_tree(tmp_path):
    src, venv, run_dir = tmp_path / "src", tmp_path / "venv", tmp_path / "elsewhere"
    _source_copy(src)
    run_dir.mkdir()
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, capture_output=True, cwd=tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    # the dependencies (simpy, pandas, pydantic, pip...) come from this interpreter's site-packages: a path
    # entry (not a site dir, so the editable install's finder there is not loaded)
    vpy = str(venv / "bin" / "python")
    site = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "zz_deps.pth"), "w") as fh:
        fh.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([vpy, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
                    str(next(wheels.glob("ddbench-*.whl")))], check=True, capture_output=True, env=_clean_env())
    # another distribution whose top-level packages are `kernels` and `sim` (as Hugging Face's `kernels`),
    # installed beside ddbench: each keeps its own (issue 30, part 4; tests/test_import_names.py)
    other = tmp_path / "other"
    foreign_packages(other)
    (other / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
                                          '[project]\nname = "kernels"\nversion = "9.9"\n'
                                          '[tool.setuptools]\npackages = ["kernels", "sim"]\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(other), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, capture_output=True, cwd=tmp_path)
    subprocess.run([vpy, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
                    str(next(wheels.glob("kernels-*.whl")))], check=True, capture_output=True, env=_clean_env())
    env = _clean_env()
    probe = subprocess.run([vpy, "-c", PROBE], capture_output=True, text=True, cwd=run_dir, env=env)
    assert probe.returncode == 0, probe.stderr
    who_k, who_s, att, cm = json.loads(probe.stdout)
    assert (who_k, who_s) == ("the other kernels", "the other sim")
    assert att.startswith(str(venv)) and att.endswith(os.path.join("ddbench", "kernels", "attention.py"))
    assert cm.startswith(str(venv)) and cm.endswith(os.path.join("ddbench", "sim", "costmodel.py"))
    where = subprocess.run([vpy, "-c", "import ddbench.core.paths as p; print(p.data_root())"], capture_output=True,
                           text=True, cwd=run_dir, env=env, check=True).stdout.strip()
    assert where.startswith(str(venv)) and where.endswith(os.path.join("ddbench", "_traces")), where
    ddbench = str(venv / "bin" / "ddbench")
    installed = subprocess.run([ddbench, *SIM, "--out", str(tmp_path / "a")], capture_output=True, text=True,
                               cwd=run_dir, env=env)
    assert installed.returncode == 0, installed.stderr
    editable = run_source(*SIM, "--out", tmp_path / "b", env={"DDBENCH_DATA": None})
    assert editable.returncode == 0, editable.stderr
    a, b = json.loads(installed.stdout), json.loads(editable.stdout)
    # the installed copy read its own traces: outputs name a bundle relative to the data root only where it lies
    # under it (ddbench.core.calibration.shown_path), and that root is the venv's _traces (`where` above)
    assert a["dualdecoder"]["cost_model"][0].startswith("measured: calibration bundle traces/calibration/h200 ")
    assert _numbers(a) == _numbers(b) and a["dualdecoder"]["tokens_per_s"] > 0
    for f in ("requests.csv", "steps.csv", "memory.csv"):    # plain CSVs: no notes, no paths, equal as they are
        assert (tmp_path / "a" / "shadowkv" / f).read_text() == (tmp_path / "b" / "shadowkv" / f).read_text()
    plans = [subprocess.run([ddbench, *PLAN], capture_output=True, text=True, cwd=run_dir, env=env),
             run_source(*PLAN, cwd=run_dir, env={"DDBENCH_DATA": None})]
    assert json.loads(plans[0].stdout) == json.loads(plans[1].stdout)
