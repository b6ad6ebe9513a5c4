"""Data is found from the package, never from the working directory; a missing bundle is an error."""

import json

import pytest

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import SOURCE_TRACES, data_root, traces_dir
from tests.cli import ROOT, assert_one_line_error, ddbench

SIM = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--batch", "4", "--steps", "3", "--json"]


def _ddbench(args, cwd):
    return ddbench(*args, cwd=cwd, env={"DDBENCH_DATA": None})


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
    line = assert_one_line_error(p, 2, "calibration")
    assert "--roofline" in line
    assert not (tmp_path / "o").exists()
