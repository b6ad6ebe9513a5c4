"""dualdecoder-cache's fill term (sim/cachefill.py): the committed fit is what its sweep gives, the cost
model prices it and says so, and a sweep without enough points is one clear error."""

import json

import pytest

from ddbench.core.calibration import find_bundle
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from sim import cachefill
from sim.setup import cost_model


def test_committed_fit_is_the_sweeps():
    with open(f"{find_bundle('h200')}/{cachefill.FILE}", encoding="utf-8") as fh:
        committed = json.load(fh)
    again = cachefill.fit(str(traces_dir("engine", cachefill.DEFAULT_SWEEP)), committed["context"])
    for t in cachefill.TERMS:
        assert again["theta"][t] == pytest.approx(committed["theta"][t], rel=1e-6, abs=1e-12)
    assert again["points"] == committed["points"] >= len(cachefill.TERMS) + 1


def test_cost_model_prices_the_fill_and_names_it():
    cm = cost_model("llama-3-8b", "h200")
    one, many = cm.cache_fill_s(1, 1024), cm.cache_fill_s(64, 1024)
    assert 0 < one < many
    assert any(n.startswith("cache fill FITTED") for n in cm.notes)
    cm.cache_fill = None
    assert cm.cache_fill_s(8, 1024) == 0.0
    assert any("cache fill NOT MEASURED" in n for n in cm.notes)


def test_too_few_points_is_an_error():
    with pytest.raises(DDBenchError, match="overlap regime"):
        cachefill.fit(str(traces_dir("engine", cachefill.DEFAULT_SWEEP)), 1024)


def test_cli_bad_context_exits_2(capsys, tmp_path):
    assert cachefill.main(["--context", "1k", "--out", str(tmp_path / "f.json")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "f.json").exists()
