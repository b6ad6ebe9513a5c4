"""dualdecoder-cache's fill term (sim/fit/cachefill.py, priced from sim/fitted.py): the committed fit is what
its sweep gives, the cost model prices it and says so, and a sweep without enough points is one clear error."""

import pytest

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.sim.costmodel import CostModel
from ddbench.sim.fit import cachefill
from ddbench.sim.fit.replay import FUSED, FUSED64, TORCH
from ddbench.sim.fit.fitfile import main as fit_main
from ddbench.sim.fitted import CACHE_FILL_TERMS, Fitted, fitted_path, load
from ddbench.sim.factory import cost_model

SWEEPS = {kind: [str(traces_dir("engine", f"h200-{it}")) for it in cachefill.SWEEPS[kind]] for kind in (FUSED, FUSED64, TORCH)}
FIELD = {FUSED: "cache_fill", FUSED64: "cache_fill_int64", TORCH: "cache_fill_torch"}
SWEEP = SWEEPS[TORCH]


def _fitting_cm():
    """The cost model the fill is fitted on: the committed engine and reuse terms, no fill."""
    cm = cost_model("llama-3-8b", "h200")
    f = load(fitted_path("h200"))
    return CostModel(cm.model, cm.gpu, cm.link, cm.bundle, fitted=Fitted(f.engine, f.reuse))


@pytest.mark.parametrize("kind", [FUSED, FUSED64, TORCH])
def test_committed_fit_is_the_sweeps(kind):
    f = load(fitted_path("h200"))
    committed = getattr(f, FIELD[kind])
    again = cachefill.fit(SWEEPS[kind], _fitting_cm(), committed.contexts, kind)
    for t in CACHE_FILL_TERMS:
        assert again.theta[t] == pytest.approx(committed.theta[t], rel=1e-6, abs=1e-12)
    assert again.points == committed.points >= len(CACHE_FILL_TERMS) + 1
    assert again.residuals_us == committed.residuals_us


def test_cost_model_prices_the_fill_and_names_it():
    cm = cost_model("llama-3-8b", "h200")
    one, many = cm.cache_fill_s(1, 1024), cm.cache_fill_s(64, 1024)
    assert 0 < one < many
    assert any(n.startswith("cache fill FITTED") for n in cm.notes)
    cm.cache_fill = None
    assert cm.cache_fill_s(8, 1024) == 0.0
    assert any("cache fill NOT MEASURED" in n for n in cm.notes)


def test_too_few_points_is_an_error():
    with pytest.raises(DDBenchError, match="overlap regime at 1024 tokens"):
        cachefill.fit(SWEEP, _fitting_cm(), 1024, TORCH)
    with pytest.raises(DDBenchError, match="no dualdecoder-cache points in the overlap regime at 1024 tokens"):
        cachefill.fit(SWEEPS[FUSED], _fitting_cm(), (65536, 1024), FUSED)      # one context of several missing


def test_a_sweep_of_the_other_fill_is_refused():
    """The torch fill's sweep (an older engine: traces/fit/engine-versions.json) cannot be fitted as the fused
    fill, nor back; nor the int64-key fill's as the engine's fill."""
    with pytest.raises(DDBenchError, match="ran the other fill"):
        cachefill.fit(SWEEPS[TORCH], _fitting_cm(), 65536, FUSED)
    with pytest.raises(DDBenchError, match="ran the other fill"):
        cachefill.fit(SWEEPS[FUSED], _fitting_cm(), 65536, TORCH)
    with pytest.raises(DDBenchError, match="ran the other fill"):
        cachefill.fit(SWEEPS[FUSED64], _fitting_cm(), 65536, FUSED)


def test_cli_bad_context_exits_2(capsys, tmp_path):
    assert fit_main(["--context", "1k", "--out", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "f").exists()
