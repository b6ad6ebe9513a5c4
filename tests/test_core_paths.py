"""Data is found from the package, never from the working directory; a missing bundle is an error."""

import json
import os
import subprocess
import sys

import pytest

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import SOURCE_TRACES, data_root, traces_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--batch", "4", "--steps", "3", "--json"]


def _ddbench(args, cwd, **env):
    e = {k: v for k, v in os.environ.items() if k != "DDBENCH_DATA"}
    e.update(PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable, "-m", "ddbench", *args], capture_output=True, text=True, cwd=cwd, env=e)


def test_default_root_is_the_source_tree(monkeypatch):
    monkeypatch.delenv("DDBENCH_DATA", raising=False)
    assert data_root() == SOURCE_TRACES
    assert traces_dir("calibration", "h200").is_dir()


def test_env_root_must_exist(monkeypatch, tmp_path):
    monkeypatch.setenv("DDBENCH_DATA", str(tmp_path / "nope"))
    with pytest.raises(DDBenchError, match="is not a folder"):
        data_root()


def test_simulate_is_the_same_from_any_folder(tmp_path):
    here = _ddbench(SIM + ["--out", str(tmp_path / "a")], ROOT)
    there = _ddbench(SIM + ["--out", str(tmp_path / "b")], str(tmp_path))
    assert here.returncode == 0 and there.returncode == 0, here.stderr + there.stderr
    a, b = json.loads(here.stdout)["dualdecoder"], json.loads(there.stdout)["dualdecoder"]
    assert a["tokens_per_s"] == b["tokens_per_s"] and "roofline" not in json.dumps(a["cost_model"]).lower()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_missing_calibration_is_an_error(tmp_path, how):
    if how == "flag":
        p = _ddbench(SIM + ["--out", str(tmp_path / "o"), "--calibration", str(tmp_path / "none")], str(tmp_path))
    else:
        (tmp_path / "empty").mkdir()
        p = _ddbench(["--data", str(tmp_path / "empty")] + SIM + ["--out", str(tmp_path / "o")], str(tmp_path))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "calibration" in p.stderr and "--roofline" in p.stderr
    assert not (tmp_path / "o").exists()
